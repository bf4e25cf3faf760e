"""The caption formats and their columns: one file read whole into normalised caption rows.

``read_captions(uri)`` returns rows ``{"caption_id": str, "caption": str, "image": str | None,
"negatives": list[str]}`` from any supported format, detected from the extension and then
the content. ``negatives`` are the hard negatives the source itself carries (NegCLIP
``neg_caption``, a Python list literal; SugarCrepe ``negative_caption``; triplet files'
``hard_negative``), ``[]`` where it has none:

========================  =========================================================
COCO captions json        ``{"images": [...], "annotations": [...]}``; caption_id is the
                          annotation id, image the image's ``file_name``
SugarCrepe json           ``{idx: {"filename", "caption", "negative_caption"}}``
json list / jsonl         objects with a caption column (``caption``, ``title``, ``text``,
                          ``true_caption``), optional id (``caption_id``, ``id``) and image
                          (``image``, ``filepath``, ``image_path``, ``filename``,
                          ``file_name``) columns; triplet files are read this way too
parquet                   the same columns
NegCLIP tsv / csv         ``title, filepath, neg_caption, neg_image`` (first unnamed column
                          is the row id); any tsv/csv with a caption column
========================  =========================================================

The paper's released positives ``.txt`` (one hard positive per line, ``None`` where
absent) is *not* a caption source: it is refused with a clear message.

Missing files, unknown formats, no caption column and non-UTF-8 bytes raise
:class:`hardpos.data.captions.CaptionSourceError` naming the file, before any work.  Rows
whose caption is empty are kept (as ``""``) so the caller can count them as rejects ("empty").
"""
from __future__ import annotations

import ast
import csv
import dataclasses
import io
import json
from typing import Any, Iterable

import pyarrow.parquet as pq

from hardpos import storage
from hardpos.data.captions import CaptionSourceError
from hardpos.data.captions.files import decode_utf8

CAPTION_COLUMNS = ("caption", "title", "text", "true_caption", "sentence")
ID_COLUMNS = ("caption_id", "id", "idx", "image_id")
IMAGE_COLUMNS = ("image", "filepath", "image_path", "filename", "file_name", "image_file")
NEGATIVE_COLUMNS = ("hard_negative", "neg_caption", "negative_caption")


def _row(caption_id: Any, caption: Any, image: Any, negatives: Any = None) -> dict:
    if caption is None or (isinstance(caption, float) and caption != caption):
        caption = ""
    elif not isinstance(caption, str):
        caption = str(caption)
    image = None if image is None or (isinstance(image, str) and not image.strip()) else str(image)
    return {"caption_id": str(caption_id), "caption": caption, "image": image, "negatives": negative_list(negatives)}


def negative_list(value: Any) -> list[str]:
    """A source's negatives cell as a list of non-empty strings: a list, one string, or a
    list literal in a string (NegCLIP's ``"['a', 'b']"``); anything else is ``[]``."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v.strip() for v in value if isinstance(v, str) and v.strip()]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return [text]
            return negative_list(parsed if isinstance(parsed, (list, tuple)) else [])
        return [text] if text else []
    return []


def _pick(columns: Iterable[str], wanted: tuple[str, ...]) -> str | None:
    cols = list(columns)
    for name in wanted:
        if name in cols:
            return name
    return None


@dataclasses.dataclass(frozen=True)
class ColumnMap:
    """Which column of a row-per-caption source holds what (:func:`column_map`)."""

    caption: str
    caption_id: str | None = None
    image: str | None = None
    negatives: str | None = None

    def row(self, rec: dict, default_id: Any) -> dict:
        """One source record -> the normalised caption row; ``default_id`` when it has no id
        (``caption_id`` stays None when both are None)."""
        cid = rec.get(self.caption_id) if self.caption_id else None
        cid = default_id if cid is None or cid == "" else cid
        out = _row(cid, rec.get(self.caption), rec.get(self.image) if self.image else None,
                   rec.get(self.negatives) if self.negatives else None)
        if cid is None:  # no id and no default: the caller fills it in later
            out["caption_id"] = None
        return out


def column_map(columns: Iterable[str], uri: str) -> ColumnMap:
    """The :class:`ColumnMap` of a source with these columns (first match of each list of
    known names); raises :class:`CaptionSourceError` naming ``uri`` when none is a caption."""
    columns = list(columns)
    cap = _pick(columns, CAPTION_COLUMNS)
    if cap is None:
        raise CaptionSourceError(
            f"{uri}: no caption column; expected one of {list(CAPTION_COLUMNS)}, found {columns[:20]}")
    # image_id is only an id fallback when nothing better exists; never use it as the image
    return ColumnMap(cap, _pick(columns, ID_COLUMNS), _pick(columns, IMAGE_COLUMNS), _pick(columns, NEGATIVE_COLUMNS))


def _from_records(records: list[dict], uri: str, columns: Iterable[str] | None = None) -> list[dict]:
    columns = list(columns) if columns is not None else list(dict.fromkeys(k for r in records[:100] for k in r))
    cm = column_map(columns, uri)
    return [cm.row(rec, i) for i, rec in enumerate(records)]


def _json(text: str, uri: str) -> list[dict]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CaptionSourceError(f"{uri}: not valid JSON: {exc}") from exc
    if isinstance(obj, dict) and "annotations" in obj:
        anns = obj["annotations"]
        if not isinstance(anns, list):
            raise CaptionSourceError(f"{uri}: COCO 'annotations' must be a list")
        files = {img.get("id"): img.get("file_name") for img in obj.get("images", []) if isinstance(img, dict)}
        out = []
        for i, ann in enumerate(anns):
            if not isinstance(ann, dict) or "caption" not in ann:
                raise CaptionSourceError(f"{uri}: COCO annotation {i} has no 'caption'")
            out.append(_row(ann.get("id", i), ann.get("caption"), files.get(ann.get("image_id"))))
        return out
    if isinstance(obj, dict):
        values = list(obj.values())
        if values and all(isinstance(v, dict) for v in values[:50]) and any("caption" in v for v in values[:50]):
            # SugarCrepe: {idx: {filename, caption, negative_caption}}
            return [_row(k, v.get("caption"), v.get("filename"), v.get("negative_caption")) for k, v in obj.items()]
        for key in ("data", "rows", "captions"):
            if isinstance(obj.get(key), list):
                obj = obj[key]
                break
        else:
            raise CaptionSourceError(
                f"{uri}: JSON object is neither COCO captions (images/annotations), SugarCrepe "
                f"({{idx: {{filename, caption, ...}}}}) nor a list of caption rows; keys: {list(obj)[:10]}")
    if not isinstance(obj, list):
        raise CaptionSourceError(f"{uri}: expected a JSON list of caption rows, got {type(obj).__name__}")
    if obj and all(isinstance(x, str) for x in obj[:50]):
        return [_row(i, x, None) for i, x in enumerate(obj)]
    if not all(isinstance(x, dict) for x in obj):
        raise CaptionSourceError(f"{uri}: every element of the JSON list must be an object with a caption")
    return _from_records(obj, uri) if obj else []


def _jsonl(text: str, uri: str) -> list[dict]:
    records = storage.parse_jsonl(text, uri, CaptionSourceError)
    return _from_records(records, uri) if records else []


def _delimited(text: str, uri: str, delimiter: str) -> list[dict]:
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        return []
    if header and header[0] == "":
        header[0] = "id"  # NegCLIP's unnamed pandas index column
    records = [dict(zip(header, row)) for row in reader if row]
    return _from_records(records, uri, header)


def _parquet(data: bytes, uri: str) -> list[dict]:
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001
        raise CaptionSourceError(f"{uri}: not a readable parquet file: {exc}") from exc
    if _pick(table.column_names, CAPTION_COLUMNS) is None:
        raise CaptionSourceError(
            f"{uri}: no caption column; expected one of {list(CAPTION_COLUMNS)}, found {table.column_names}")
    return _from_records(table.to_pylist(), uri, table.column_names)


def read_captions(uri: str, *, limit: int | None = None) -> list[dict]:
    """Read caption rows from ``uri`` (local or s3://); see the module docstring for formats.

    ``limit`` keeps the first N rows.  Raises :class:`CaptionSourceError` for anything
    that is not a caption source.
    """
    uri = str(uri)
    if limit is not None and limit < 0:
        raise CaptionSourceError(f"{uri}: limit must be >= 0, got {limit}")
    try:
        data = storage.read_bytes(uri)
    except FileNotFoundError as exc:
        raise CaptionSourceError(f"caption source not found: {uri}") from exc
    except IsADirectoryError as exc:
        raise CaptionSourceError(f"{uri} is a directory, not a caption file") from exc
    low = uri.lower()
    if low.endswith(".parquet"):
        rows = _parquet(data, uri)
    elif low.endswith(".txt"):
        raise CaptionSourceError(
            f"{uri}: .txt files are not a caption source (the paper's released positives file has one "
            "hard positive per line and no captions or images); give COCO json, jsonl, json, parquet or tsv")
    else:
        text = decode_utf8(data, uri, CaptionSourceError)
        if low.endswith(".jsonl"):
            rows = _jsonl(text, uri)
        elif low.endswith(".json"):
            rows = _json(text, uri)
        elif low.endswith(".tsv"):
            rows = _delimited(text, uri, "\t")
        elif low.endswith(".csv"):
            rows = _delimited(text, uri, ",")
        else:
            stripped = text.lstrip()
            if stripped.startswith("{") and "\n{" in stripped:
                rows = _jsonl(text, uri)
            elif stripped.startswith(("{", "[")):
                rows = _json(text, uri)
            else:
                raise CaptionSourceError(
                    f"{uri}: unknown caption format; use .json (COCO/SugarCrepe/list), .jsonl, .parquet, .tsv or .csv")
    return rows[:limit] if limit is not None else rows
