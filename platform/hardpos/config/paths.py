"""Relative paths mean the directory the job started in.

A stage's work runs in other processes with other working directories: Ray Train workers,
Ray Data tasks, and Ray Tune trials (which run in their own trial folder). A relative
``data.train_path`` read there names a file that does not exist. So every local relative
path of a config is made absolute once, in the job's own process, before any worker or
trial starts (:func:`hardpos.runtime.execute` calls :func:`absolute_paths`; the sweep also
resolves the dotted train keys of its overrides and search space with :func:`absolute_value`).

What counts as a path is decided by the field's name (the last part of a dotted key):
``PATH_KEYS`` always hold a path or URI; ``MAYBE_PATH_KEYS`` hold a path *or* a name
(``model.pretrained: base:hardpos-base``, ``prompts: paper``) and are resolved only when the
relative path exists from the job's directory. URIs (``s3://``, ``hf://``, ``runs:/``,
``models:/``, ``base:``) and absolute paths are left as they are.

The tracking URI follows the same rule (:func:`resolve_tracking_uri`): a relative SQLite path
means the job's directory, resolved once in the process that reads the config.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Not ``output``: the generate stage's ``join.output`` is a file name inside ``output_dir``.
PATH_KEYS = frozenset({
    "output_dir", "input", "image_root", "train_path", "val_path", "storage_path", "path", "cache_dir",
    "resume_from", "world_dir", "root", "captions", "train_config", "ship_to",
})
MAYBE_PATH_KEYS = frozenset({"pretrained", "prompts", "classnames", "templates"})

# A scheme of two or more letters (s3://, hf://, runs:/, models:/, base:, hf-hub:); a single
# letter would be a Windows drive.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def is_local_relative(value: Any) -> bool:
    """True for a non-empty string that is a local path, relative or ``~/...`` (not a URI or a name:)."""
    return isinstance(value, str) and bool(value) and not _SCHEME.match(value) and not os.path.isabs(value)


def absolute_value(key: str, value: Any, cwd: str | None = None) -> Any:
    """``value`` of the field (or dotted key) ``key`` made absolute from ``cwd`` (default: the
    current directory) when it is a local relative path of a path field; else unchanged."""
    name = key.rsplit(".", 1)[-1]
    if name not in PATH_KEYS and name not in MAYBE_PATH_KEYS:
        return value
    if isinstance(value, list):
        return [absolute_value(key, v, cwd) for v in value]
    if not is_local_relative(value):
        return value
    cwd = cwd or os.getcwd()
    resolved = os.path.normpath(os.path.join(cwd, os.path.expanduser(value)))
    if name in MAYBE_PATH_KEYS and not os.path.exists(resolved):
        return value  # a name (base:..., a bundled prompt set, an open_clip tag), not a path
    return resolved


def absolute_paths(cfg: T, cwd: str | None = None) -> T:
    """A copy of the config dataclass ``cfg`` whose path fields (nested sections and lists of
    sections included) are absolute (see the module doc). Validation is not re-run: only
    relative paths change, to the same place."""
    cwd = cwd or os.getcwd()
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            new = absolute_paths(value, cwd)
        elif isinstance(value, list) and any(dataclasses.is_dataclass(v) for v in value):
            new = [absolute_paths(v, cwd) if dataclasses.is_dataclass(v) else v for v in value]
        else:
            new = absolute_value(field.name, value, cwd)
        if new is not value and new != value:
            changes[field.name] = new
    if not changes:
        return cfg
    return _replace_without_post_init(cfg, changes)


def _replace_without_post_init(cfg: T, changes: dict[str, Any]) -> T:
    """``dataclasses.replace`` re-runs ``__post_init__``, which some sections use to check the
    world (a file exists); a path moved to the same place needs no new check."""
    new = object.__new__(type(cfg))
    new.__dict__.update(cfg.__dict__)
    new.__dict__.update(changes)
    return new


# --------------------------------------------------------------------------- the tracking store
DEFAULT_DB = "mlflow.db"  # MLflow 3's default (`mlflow ui`, `mlflow server`)


def default_tracking_uri() -> str:
    return f"sqlite:///{Path.cwd().resolve() / DEFAULT_DB}"


def resolve_tracking_uri(uri: str | None = None) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else the local SQLite store.

    A relative SQLite path (``sqlite:///mlflow.db``) is made absolute against the current
    directory here, in the process that reads the config: Ray workers and Serve replicas
    get the resolved URI and run in other working directories.
    """
    return _absolute_sqlite(uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri())


def _absolute_sqlite(uri: str) -> str:
    if not uri.startswith("sqlite:///"):
        return uri
    path, sep, query = uri[len("sqlite:///"):].partition("?")
    if not path or path == ":memory:" or os.path.isabs(path):
        return uri
    return f"sqlite:///{(Path.cwd() / path).resolve()}{sep}{query}"
