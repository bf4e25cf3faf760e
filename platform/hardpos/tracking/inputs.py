"""What a run read, as MLflow datasets (``mlflow.log_input``), so the runs table's Dataset
column says which triplets trained a model and which benchmarks scored it.

:func:`config_inputs` finds the inputs in any stage's config by field name: ``data.train_path``
(context ``training``), ``data.val_path`` (``validation``), the train stage's
``eval_benchmarks`` and the evaluate / interpolate stages' ``benchmarks`` (``evaluation``),
and the ``input`` of perturb / generate (``source``). Each becomes ``{name, digest,
source_type, source, context}`` (:func:`dataset_input`):

* name: a benchmark's name, else the file's (or folder's) name;
* digest: 12 hex digits of SHA-256 over the file's bytes; for a folder, over the relative
  names, sizes and bytes of its table files (``.json``, ``.jsonl``, ``.parquet``, ``.tsv``,
  ``.csv``; the first 200, images never); for an ``s3://`` or other remote URI, over the URI
  (its identity, not its content: nothing is downloaded to name a run's input);
* source_type / source: ``local`` / ``s3`` / ``uri`` and ``{"uri": ...}``, as MLflow's own
  dataset sources write them.

A file that is not there is left out (the stage itself reports it).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

TABLE_SUFFIXES = (".json", ".jsonl", ".parquet", ".tsv", ".csv")
MAX_FOLDER_FILES = 200
_CHUNK = 1 << 20


def _hash_file(h: Any, path: Path) -> None:
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)


def digest(uri: str) -> str | None:
    """The input's digest (module doc); None when a local path does not exist."""
    h = hashlib.sha256()
    if "://" in uri:
        h.update(uri.encode())
        return h.hexdigest()[:12]
    path = Path(uri)
    if path.is_file():
        _hash_file(h, path)
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)
        for p in files[:MAX_FOLDER_FILES]:
            h.update(f"{p.relative_to(path).as_posix()}\0{p.stat().st_size}\0".encode())
            _hash_file(h, p)
    else:
        return None
    return h.hexdigest()[:12]


def dataset_input(uri: str, context: str, name: str | None = None) -> dict[str, str] | None:
    """One input for :meth:`hardpos.tracking.RunLogger.log_inputs` (None: a missing local path)."""
    value = digest(uri)
    if value is None:
        return None
    source_type = "s3" if uri.startswith("s3://") else ("uri" if "://" in uri else "local")
    label = name or os.path.basename(uri.rstrip("/")) or uri
    return {"name": label, "digest": value, "source_type": source_type, "source": json.dumps({"uri": uri}),
            "context": context}


def config_inputs(cfg: Any) -> list[dict[str, str]]:
    """The inputs named by a stage's config (module doc), in config order, each once."""
    wanted: list[tuple[str, str, str | None]] = []
    data = getattr(cfg, "data", None)
    for field, context in (("train_path", "training"), ("val_path", "validation")):
        value = getattr(data, field, None) if data is not None else None
        if isinstance(value, str) and value:
            wanted.append((value, context, None))
    for field in ("eval_benchmarks", "benchmarks"):
        for spec in getattr(cfg, field, None) or []:
            if getattr(spec, "path", None):
                wanted.append((spec.path, "evaluation", spec.name))
    source = getattr(cfg, "input", None)
    if isinstance(source, str) and source and not any(ch in source for ch in "*?["):
        wanted.append((source, "source", None))
    out, seen = [], set()
    for uri, context, name in wanted:
        if (uri, context) in seen:
            continue
        seen.add((uri, context))
        item = dataset_input(uri, context, name)
        if item is not None:
            out.append(item)
    return out
