"""Typed job configuration: dataclasses + YAML files + dotted command-line overrides.

Contract (every stage):
    python jobs/<stage>.py [--config FILE.yaml] [dotted.key=value ...] [--help] [--print-config]

* A stage's configuration is a dataclass whose docstring documents its fields, one
  ``name: doc`` line each (continuation lines indented; ``a / b: doc`` documents both), as
  litgpt's configs carry their own docs.  Nested sections are nested dataclasses.
  ``--help`` prints every key with its type, the stage's real default (a section's
  ``default_factory`` wins over the section class's defaults; ``--config``/overrides given
  with ``--help`` are applied first), the choices of a ``Literal`` and the field's doc.
* YAML files hold any subset of the fields; overrides are applied on top, in order.
  Override values are parsed as YAML scalars/flow collections, so ``loss.w_neg=0.5``,
  ``benchmarks=[replace,swap]`` and ``model.pretrained=null`` all do what they say.
* Overriding one key of a section keeps the section's other keys at the stage's defaults
  (``pretrain.steps=5`` in the demo keeps its ``lr=5e-4``), and list items are addressed by
  index: ``variants.1.w_neg=0.5``, ``benchmarks.0.image_root=/data/vg`` (the list is the
  YAML file's, else the stage's default; an index outside it is an error naming the list
  and its length).  A mapping-typed field (``search_space``) is replaced as a whole.
* Validation has ONE style.  Types, unknown keys and ``Literal`` choices are checked here;
  each dataclass checks its own invariants in ``__post_init__`` and raises
  :class:`ConfigError` (a ``ValueError``) whose message starts with the key relative to the
  dataclass (``require(ok, "val_fraction", "must be in [0, 1)", value)``); loading prefixes
  the section's path, so the user reads ``data.val_fraction must be in [0, 1), got 2.0``.
  Checks that need the outside world (a file exists, a server answers) stay in the stage's
  ``run`` and raise :class:`ConfigError` too (the CLI exits 2 for either, before any compute).
  ``int`` is accepted where ``float`` is declared, and so is scientific notation that YAML
  1.1 leaves as text (``1e-3``); nothing else is coerced silently (``"3"`` is not an int).
* "world", for a user: ``world.<key>`` is a setting of the synthetic world's generation
  (:class:`hardpos.world.scene.WorldConfig`: ``world.seed``, ``world.n_pretrain`` ...; the
  demo's section) and ``world_dir`` is the folder of a generated world (evaluate, interpolate,
  the compare stage's explorer, the demo). The world stage's own config *is* a WorldConfig:
  its keys are top-level (``n_pretrain=``) and its folder is its ``output_dir``. perturb and
  generate read a world folder as their ``input`` (which may also be a caption file). Every key
  has one spelling.

Layout: this module holds the shared sections and loading (:func:`load_config`,
:func:`from_dict`); ``errors`` the :class:`ConfigError` and :func:`require`; ``overrides``
the ``key=value`` parsing and setting; ``help`` the ``--help`` text; ``fields`` what they
share about a dataclass's fields.  Import everything from ``hardpos.config``.

Why not OmegaConf or jsonargparse: both were tried on these dataclasses. OmegaConf's
structured configs build every stage's Config, but its dot-list overrides do not address
list items by index (``variants.1.w_neg=0.5`` needs one ``OmegaConf.update`` call per key),
it does not run the dataclasses' ``__post_init__`` checks (``data.val_fraction=2`` would
load), and it has no ``--help`` with the fields' docs and no ``--print-config``: only the type
checks here would go, while the override and help code stayed. jsonargparse (litgpt's
choice) brings ``--help`` and ``--print_config``, but its command line is
``--data.val_fraction 0.1``, not ``key=value``, which would change every documented command.
So the dataclasses stay the schema, ``__post_init__`` the validation, and this package the
one place that maps YAML files and ``key=value`` onto them.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from hardpos import storage
from hardpos.config.errors import ConfigError, require
from hardpos.config.fields import field_default as _field_default
from hardpos.config.help import describe_config, field_docs, type_name
from hardpos.config.overrides import parse_override, set_dotted

__all__ = ["ConfigError", "JobConfig", "ModelConfig", "RayConfig", "TrackingConfig", "describe_config", "dump_yaml", "field_docs",
           "flatten", "from_dict", "load_config", "parse_override", "read_yaml_mapping", "require", "set_dotted",
           "to_dict", "type_name"]

T = TypeVar("T")
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


# --------------------------------------------------------------------------- sections
@dataclasses.dataclass
class TrackingConfig:
    """Where runs are tracked.

    tracking_uri: MLflow tracking URI; None -> $MLFLOW_TRACKING_URI, else
        ``sqlite:///<cwd>/mlflow.db`` (the file store is deprecated in MLflow 3).
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
        the background shipper retries with its own backoff). Every record is written to a
        journal under ``<output_dir>/tracking`` first, so an outage holds nothing in memory.
    """

    tracking_uri: str | None = None
    experiment: str = "hardpos"
    run_name: str | None = None
    enabled: bool = True
    required: bool = True
    drain_timeout_s: float = 30.0
    request_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        require(self.drain_timeout_s >= 0, "drain_timeout_s", "must be >= 0", self.drain_timeout_s)
        require(self.request_timeout_s > 0, "request_timeout_s", "must be > 0", self.request_timeout_s)


@dataclasses.dataclass
class RayConfig:
    """How the job reaches Ray.

    address: a cluster address; None -> $RAY_ADDRESS, else a local Ray is started.
    num_cpus: CPUs of a *local* Ray (None: all cores). Ignored on a cluster.
    include_dashboard: start the local Ray's dashboard (on 127.0.0.1) and print its address.
        Ignored on a cluster (its head node decides).
    """

    address: str | None = None
    num_cpus: int | None = None
    include_dashboard: bool = False


@dataclasses.dataclass
class ModelConfig:
    """Which model to build and where its weights come from.

    arch: open_clip architecture (``ViT-B-32``, ``ViT-B-32-quickgelu``), a HardPos tiny
        config (``hardpos-tiny``, ``hardpos-small``), or ``hf-hub:org/name`` (the
        architecture in that hub repo's ``open_clip_config.json``; its weights only when
        ``pretrained`` names them too). Ignored when ``pretrained`` is a HardPos checkpoint
        or ``hf-hub:`` (both carry their own architecture).
    pretrained: None (random), an open_clip tag, a local path, s3:// URI, MLflow URI or
        ``hf-hub:org/name``.
    force_quick_gelu: None = automatic (True for ``openai`` weights).
    grad_checkpointing: trade compute for memory in training.
    """

    arch: str = "hardpos-tiny"
    pretrained: str | None = None
    force_quick_gelu: bool | None = None
    grad_checkpointing: bool = False


@dataclasses.dataclass
class JobConfig:
    """Fields every stage has.

    output_dir: local path or s3://bucket/prefix; the run writes summary.json there.
    seed: global seed for everything random in the stage.
    tracking: where the run is tracked (MLflow).
    ray: how the job reaches Ray (a local Ray or a cluster).
    log_level: console detail. info: HardPos's stage, progress and result lines, Ray's own
        logs and progress bars off; debug (the CLI's --verbose): Ray's output back too;
        warning / error: only problems.
    allow_empty: False: an input with nothing in it (no captions, no triplets, no benchmark
        items) is an error before any work (exit 2 naming the input); True: the stage runs
        on nothing and reports zero counts.
    """

    output_dir: str = "outputs/run"
    seed: int = 0
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    allow_empty: bool = False


# --------------------------------------------------------------------------- loading
def load_config(cls: type[T], config_file: str | Path | None = None, overrides: list[str] | tuple = ()) -> T:
    """Build ``cls`` from an optional YAML file plus ``key=value`` overrides (applied in order)."""
    data: dict[str, Any] = {}
    if config_file is not None:
        data = read_yaml_mapping(config_file)
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(data, key, value, cls=cls)
    return from_dict(cls, data)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping (local path or s3:// URI)."""
    path = str(path)
    try:
        text = storage.read_text(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # one line: where, and what the parser expected
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}; fix the file's syntax") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys, got {type(data).__name__}")
    return data


def from_dict(cls: type[T], data: dict[str, Any], *, path: str = "", base: Any = None) -> T:
    """Validate ``data`` against dataclass ``cls`` (recursively) and build it.

    Keys ``data`` leaves out take their value from ``base`` (an instance of ``cls``: the
    stage's default of this section) when given, else the field's default; a nested section
    given in part keeps the rest of its defaults the same way.  Errors raised while building
    (``__post_init__``) come back as :class:`ConfigError` with ``path`` in front.
    """
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
    if base is not None and isinstance(base, cls):
        kwargs = {name: getattr(base, name) for name in fields if name not in data}
    for name, value in data.items():
        sub_base = _field_default(cls, base if isinstance(base, cls) else None, name)
        kwargs[name] = _convert(hints[name], value, _join(path, name), base=sub_base)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.key is not None:
            raise ConfigError(exc.reason, key=_join(path, exc.key)) from exc
        if not path or str(exc).startswith(path):
            raise
        raise ConfigError(f"{path}: {exc}") from exc
    except (TypeError, ValueError) as exc:
        message = str(exc)
        raise ConfigError(message if not path or message.startswith(path) else f"{path}: {message}") from exc


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _convert(tp: Any, value: Any, key: str, *, base: Any = None) -> Any:
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
                return _convert(arg, value, key, base=base)
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
        return from_dict(tp, value if value is not None else {}, path=key, base=base if isinstance(base, tp) else None)
    if origin in (list, tuple, typing.Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp, *_) = get_args(tp) or (Any,)
        # item paths as the override syntax spells them: ``variants.1.w_neg``
        items = [_convert(item_tp, v, f"{key}.{i}") for i, v in enumerate(value)]
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
    """A config (dataclass, or its dict) as YAML."""
    return yaml.safe_dump(cfg if isinstance(cfg, dict) else to_dict(cfg), sort_keys=False)
