"""Param, metric and tag names MLflow accepts, made one way from whatever the user named.

Names come from user input: a config's mapping keys (``explorer.evaluations.HP+HN``), a
benchmark's name, a triplet file's ``kind`` values (per-subset metrics). MLflow refuses a
name with a character outside letters, digits, ``_ - . : /`` and space, a name that is not
a normalised relative path (``a//b``, ``/a``, ``a/../b``, ``./a``) and one over 250
characters; a refused record would be dropped. So every name :class:`RunLogger` sends goes
through :func:`mlflow_name` first:

1. every other character becomes ``_`` (``HP+HN`` -> ``HP_HN``, ``<b>`` -> ``_b_``);
2. empty path segments go, and a ``.`` or ``..`` segment becomes ``_`` / ``__`` (``a//b`` ->
   ``a/b``, ``/x/`` -> ``x``);
3. a name still over 250 characters keeps its first 241 and ends in ``_`` + 8 hex digits of
   the original's SHA-1.

When a changed name meets another name of the same call, it gets ``_`` + 6 hex digits of
its original's SHA-1 (a name MLflow accepted as it was keeps it), so neither overwrites the other
(:func:`mlflow_names`). Names MLflow already accepts are unchanged. ``summary.json`` keeps the
original names.
"""
from __future__ import annotations

import hashlib
import posixpath
import re
from typing import Any, Mapping

MAX_NAME_CHARS = 250  # MLflow's MAX_ENTITY_KEY_LENGTH
_REFUSED = re.compile(r"[^/\w.\- :]")  # MLflow's own rule (validate_param_and_metric_name), inverted


def _digest(name: str, n: int) -> str:
    return hashlib.sha1(name.encode("utf-8")).hexdigest()[:n]


def accepted(name: str) -> bool:
    """True when MLflow takes ``name`` as it is (the checks its server runs)."""
    return (bool(name) and not _REFUSED.search(name) and len(name) <= MAX_NAME_CHARS
            and posixpath.normpath(name) == name and not name.startswith(("/", "..")) and name != ".")


def mlflow_name(name: Any) -> str:
    """``name`` as a name MLflow accepts (see the module doc); unchanged when it already is."""
    text = str(name)
    if accepted(text):
        return text
    out = _REFUSED.sub("_", text)
    segments = [{".": "_", "..": "__"}.get(s, s) for s in out.split("/") if s]
    out = "/".join(segments) or "_"
    if len(out) > MAX_NAME_CHARS:
        out = f"{out[:MAX_NAME_CHARS - 9]}_{_digest(text, 8)}"
    return out


def mlflow_names(mapping: Mapping[Any, Any]) -> dict[str, Any]:
    """``mapping`` with every key through :func:`mlflow_name`; two keys that would meet are
    kept apart (module doc), so no value is lost."""
    taken = {str(k) for k in mapping if accepted(str(k))}  # names MLflow takes keep their name
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = mlflow_name(key)
        if name in out or (name != str(key) and name in taken):
            name = f"{name[:MAX_NAME_CHARS - 7]}_{_digest(str(key), 6)}"
        out[name] = value
    return out
