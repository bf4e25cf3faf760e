"""The triplet row, the training/evaluation unit (the contract every stage reads and writes).

A row holds ``image`` (absolute path, s3:// URI, or a path relative to an image root /
the triplet file's own folder), ``caption``, ``hard_negative`` and ``hard_positive``
(nullable: a missing one is None, never ""), ``kind`` (replace | swap | ...), ``source``
(rule | llm:<model> | dataset:<name> | world) and ``caption_id``.  Extra columns (e.g.
``slot``, ``split``, ``scene_id``) are kept as they are.

Files are parquet or jsonl, chosen by extension, local or s3://. A file a user brings needs
only :data:`REQUIRED_COLUMNS` (``image``, ``caption``); :func:`read_triplets` fills the rest
(:func:`with_defaults`): ``hard_negative``, ``hard_positive`` and ``kind`` null, ``source``
``dataset:<file name without extension>``, ``caption_id`` the row number. What the platform
writes (:func:`write_triplets`) always has every column.
"""
from __future__ import annotations

import io
import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hardpos import storage

TRIPLET_COLUMNS = ("image", "caption", "hard_negative", "hard_positive", "kind", "source", "caption_id")
NULLABLE = ("image", "hard_negative", "hard_positive")
REQUIRED_COLUMNS = ("image", "caption")  # what a user's file must have; read_triplets fills the rest


class TripletFileError(ValueError):
    """A triplet file is missing, unreadable or lacks required columns (message names it)."""


def _none_if_empty(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, float) and value != value:  # NaN from pandas
        return None
    if isinstance(value, str) and not value.strip():
        return None
    return value


def make_triplet(*, image, caption, hard_negative=None, hard_positive=None, kind, source, caption_id, **extra) -> dict:
    """One triplet row with the standard columns first; empty strings become None."""
    row = {
        "image": _none_if_empty(image),
        "caption": caption,
        "hard_negative": _none_if_empty(hard_negative),
        "hard_positive": _none_if_empty(hard_positive),
        "kind": kind,
        "source": source,
        "caption_id": None if caption_id is None else str(caption_id),
    }
    for key, value in extra.items():
        row[key] = _none_if_empty(value) if isinstance(value, str) else value
    return row


def _format(uri: str) -> str:
    low = str(uri).lower()
    if low.endswith(".parquet"):
        return "parquet"
    if low.endswith(".jsonl") or low.endswith(".json"):
        return "jsonl"
    raise TripletFileError(f"{uri}: triplet files must end in .parquet or .jsonl")


def _check_rows(rows: list[dict], where: str, columns: tuple[str, ...] = TRIPLET_COLUMNS) -> None:
    for i, row in enumerate(rows):
        missing = [c for c in columns if c not in row]
        if missing:
            raise TripletFileError(f"{where}: row {i} lacks column(s) {missing}; triplet rows need {list(columns)}")


def with_defaults(rows: list[dict], uri: str) -> list[dict]:
    """``rows`` of the file ``uri`` with every :data:`TRIPLET_COLUMNS` column: a column the
    file does not have gets its default (module doc); a value the file has is kept, null too."""
    name = str(uri).rstrip("/").rsplit("/", 1)[-1]
    stem = name.rsplit(".", 1)[0] if "." in name else name
    defaults = {"hard_negative": None, "hard_positive": None, "kind": None, "source": f"dataset:{stem}"}
    for i, row in enumerate(rows):
        for col, value in defaults.items():
            row.setdefault(col, value)
        if "caption_id" not in row:
            row["caption_id"] = str(i)
    return rows


def write_triplets(rows: list[dict], uri: str) -> str:
    """Write rows to ``uri`` (.parquet or .jsonl; local or s3://); returns the URI.

    Every row must have the :data:`TRIPLET_COLUMNS`; empty strings in nullable columns
    are written as null.  Extra columns are written too (the union over rows).
    """
    uri = str(uri)
    fmt = _format(uri)
    _check_rows(rows, uri)
    clean = []
    for row in rows:
        row = dict(row)
        for col in NULLABLE:
            row[col] = _none_if_empty(row[col])
        if row["caption_id"] is not None:
            row["caption_id"] = str(row["caption_id"])
        clean.append(row)
    columns = list(TRIPLET_COLUMNS) + sorted({k for r in clean for k in r} - set(TRIPLET_COLUMNS))
    if fmt == "jsonl":
        text = "".join(json.dumps({c: r.get(c) for c in columns}, ensure_ascii=False) + "\n" for r in clean)
        return storage.write_text(uri, text)

    data = {c: [r.get(c) for r in clean] for c in columns}
    fields = []
    for c in columns:
        if c in TRIPLET_COLUMNS:
            fields.append(pa.field(c, pa.string()))
        else:
            fields.append(pa.field(c, pa.array(data[c]).type if data[c] else pa.string()))
    table = pa.table({c: pa.array(data[c], type=f.type) for c, f in zip(columns, fields)}, schema=pa.schema(fields))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return storage.write_bytes(uri, buf.getvalue())


def read_triplets(uri: str) -> list[dict]:
    """Read a triplet file (.parquet / .jsonl, local or s3://) into row dicts with every
    :data:`TRIPLET_COLUMNS` column (:func:`with_defaults` fills what the file lacks).

    Raises :class:`TripletFileError` naming the file for a missing file, a bad format or a
    missing :data:`REQUIRED_COLUMNS` column.  Empty strings in nullable columns come back as None.
    """
    uri = str(uri)
    fmt = _format(uri)
    try:
        data = storage.read_bytes(uri)
    except FileNotFoundError as exc:
        raise TripletFileError(f"triplet file not found: {uri}") from exc
    if fmt == "jsonl":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TripletFileError(f"{uri}: not UTF-8 text") from exc
        rows = storage.parse_jsonl(text, uri, TripletFileError)
    else:
        try:
            table = pq.read_table(io.BytesIO(data))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
            raise TripletFileError(f"{uri}: not a readable parquet file: {exc}") from exc
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise TripletFileError(f"{uri}: lacks column(s) {missing}; has {table.column_names}")
        rows = table.to_pylist()
    _check_rows(rows, uri, REQUIRED_COLUMNS)
    with_defaults(rows, uri)
    for row in rows:
        for col in NULLABLE:
            row[col] = _none_if_empty(row[col])
    return rows


def resolve_image(image: str, base_dir: str, image_root: str | None = None) -> str:
    """Where an image named by a row (triplets, benchmarks, caption sources) lives: the one
    resolver of the package.

    Absolute paths and URIs with a scheme (``s3://``, ``http(s)://``, ...) are returned as
    they are; relative paths are joined to ``image_root`` when given, else to ``base_dir``
    (the file's own folder), which may itself be a URI. Results are normalised (``a/../b``
    -> ``b``) so files can be opened directly.
    """
    if image is None or not str(image).strip():
        raise ValueError("row has no image path")
    image = str(image)
    if "://" in image or os.path.isabs(image):
        return image
    base = image_root if image_root else base_dir
    if "://" in base:
        scheme, rest = base.split("://", 1)
        parts: list[str] = []
        for part in f"{rest.rstrip('/')}/{image}".split("/"):
            if part == "..":
                if len(parts) > 1:  # never above the bucket / host
                    parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        return f"{scheme}://" + "/".join(parts)
    return os.path.normpath(os.path.join(base, image))
