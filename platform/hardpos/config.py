"""Typed job configuration: dataclasses + YAML files + dotted command-line overrides.

Contract (every stage):
    python jobs/<stage>.py [--config FILE.yaml] [dotted.key=value ...]

* A stage's configuration is a dataclass (fields with defaults and docstring-style
  comments).  Nested sections are nested dataclasses.
* YAML files hold any subset of the fields; overrides are applied on top, in order.
  Override values are parsed as YAML scalars/flow collections, so ``loss.w_neg=0.5``,
  ``benchmarks=[replace,swap]`` and ``model.pretrained=null`` all do what they say.
* Unknown keys, wrong types and bad choices raise :class:`ConfigError` naming the key,
  before any work starts.  ``int`` is accepted where ``float`` is declared, and so is
  scientific notation that YAML 1.1 leaves as text (``1e-3``); nothing else is coerced
  silently (``"3"`` is not an int).
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ConfigError(ValueError):
    """A configuration file or override is invalid (message names the key)."""


# --------------------------------------------------------------------------- sections
@dataclasses.dataclass
class TrackingConfig:
    """Where runs are tracked.

    tracking_uri: MLflow tracking URI; None -> $MLFLOW_TRACKING_URI, else
        ``sqlite:///<cwd>/mlruns.db`` (the file store is deprecated in MLflow 3).
    experiment: MLflow experiment name (one per stage or one per pipeline).
    run_name: MLflow run name; None -> "<stage>-<timestamp>".
    enabled: False disables MLflow entirely (summary.json is still written).
    required: True: a tracking server that cannot be reached when the job starts is an
        immediate error (before any compute). False: the job runs and records the run under
        ``<output_dir>/tracking`` for ``hardpos track replay``.
    drain_timeout_s: at the end of a job, how long to wait for queued records to reach
        the server; what is still queued then is saved for ``hardpos track replay`` and
        counted in summary.json (the job's exit code does not change).
    request_timeout_s: timeout of one request to the tracking server (no HTTP retries:
        the background sender retries with its own backoff).
    max_queued_records: records held in memory while the server is unreachable; beyond
        that they spill to a JSON-lines file under ``<output_dir>/tracking``.
    """

    tracking_uri: str | None = None
    experiment: str = "hardpos"
    run_name: str | None = None
    enabled: bool = True
    required: bool = True
    drain_timeout_s: float = 30.0
    request_timeout_s: float = 5.0
    max_queued_records: int = 10_000

    def __post_init__(self) -> None:
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.max_queued_records < 1:
            raise ValueError(f"max_queued_records must be >= 1, got {self.max_queued_records}")


@dataclasses.dataclass
class RayConfig:
    """How the job reaches Ray.

    address: a cluster address; None -> $RAY_ADDRESS, else a local Ray is started.
    num_cpus: CPUs of a *local* Ray (None: all cores). Ignored on a cluster.
    """

    address: str | None = None
    num_cpus: int | None = None


@dataclasses.dataclass
class JobConfig:
    """Fields every stage has.

    output_dir: local path or s3://bucket/prefix; the run writes summary.json there.
    seed: global seed for everything random in the stage.
    """

    output_dir: str = "outputs/run"
    seed: int = 0
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)


# --------------------------------------------------------------------------- loading
def load_config(cls: type[T], config_file: str | Path | None = None, overrides: list[str] | tuple = ()) -> T:
    """Build ``cls`` from an optional YAML file plus ``key=value`` overrides."""
    data: dict[str, Any] = {}
    if config_file is not None:
        data = read_yaml_mapping(config_file)
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(data, key, value)
    return from_dict(cls, data)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping (local path or s3:// URI)."""
    from hardpos import storage

    path = str(path)
    try:
        text = storage.read_text(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """``"a.b=1"`` -> ``("a.b", 1)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # e.g. "a: b" style strings: keep verbatim
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type[T], data: dict[str, Any], *, path: str = "") -> T:
    """Validate ``data`` against dataclass ``cls`` (recursively) and build it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"in section {path!r}" if path else "at top level"
        raise ConfigError(
            f"unknown config key(s) {', '.join(repr(_join(path, u)) for u in unknown)} {where}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, _join(path, name))
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{path or cls.__name__}: {exc}") from exc


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: must not be null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {tp}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return from_dict(tp, value if value is not None else {}, path=key)
    if origin in (list, tuple, typing.Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        k_tp, v_tp = get_args(tp) or (Any, Any)
        return {_convert(k_tp, k, key): _convert(v_tp, v, f"{key}.{k}") for k, v in value.items()}
    if value is None:
        raise ConfigError(f"{key}: must not be null")
    if tp is float:
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            # YAML 1.1 reads "1e-3" (no dot) as a string; for a float field it is a number.
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # `name=123` on a command line means the string "123".
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r}")
    return value


# --------------------------------------------------------------------------- export
def to_dict(cfg: Any) -> dict[str, Any]:
    """Dataclass -> plain dict (recursively), suitable for YAML/JSON."""
    return dataclasses.asdict(cfg)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = _join(prefix, str(key))
        if isinstance(value, dict) and value:
            out.update(flatten(value, full))
        else:
            out[full] = value
    return out


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
