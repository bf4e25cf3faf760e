"""Captions with their images for training and evaluation: one reader for three layouts, rows in Ray.

Layouts (chosen from the files' extensions; one layout per source):

* **triplet files** -- ``.parquet`` / ``.jsonl`` with one image *path* per row (``image``:
  relative, absolute, ``s3://`` or ``http(s)://``), the triplet row contract.
* **parquet with inline images** -- ``.parquet`` whose image is a binary column: ``image``
  (binary, or a ``{bytes, path}`` struct as Hugging Face datasets write it), ``image_bytes``,
  ``jpg`` or ``png``.
* **webdataset shards** -- ``.tar`` files read by ``ray.data.read_webdataset``: a sample's image
  is its ``jpg`` / ``png`` / ``webp`` / ... member (:data:`IMAGE_MEMBERS`), the caption its ``txt`` member, and an
  optional ``json`` member may carry ``hard_negative``, ``hard_positive`` and ``kind`` (the
  layout ``hardpos generate`` writes).

``path`` is a file, a folder (its files of the layout's extension) or a glob
(``shards/train-*.tar``, ``s3://bucket/shards/*.tar``).  Bad input is a
:class:`hardpos.data.captions.SourceError` naming the file before any rows are read: a glob
matching nothing, extensions of two
layouts, parquet files with different schemas, a file without a caption column, a shard
whose first sample has no caption (``txt``) or image member.

Every layout comes out of :func:`read_rows` as one row schema, :data:`ROW_COLUMNS`:
``key`` (the image's stable identity: its path, or a hash of its bytes), ``image`` (path/URI,
or ``<shard>#<sample key>`` for a shard sample), ``image_bytes`` (inline bytes or null),
``caption``, ``hard_negative``, ``hard_positive``, ``kind`` and ``error`` ("" when the row is
usable).  A corrupt sample (caption not UTF-8, ``json`` not JSON, no image member) keeps its
slot with ``error`` set: consumers count and skip it, it never fails a run.

Images are fetched (:func:`fetch_bytes`: local, ``s3://``, ``http(s)://``) by a thread pool
inside the Ray Data task that decodes them (:func:`fetch_all`), so a batch's GETs overlap.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import tarfile
import zlib
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import ray.data
from PIL import Image

from hardpos import storage
from hardpos.data.captions import SourceError
from hardpos.data.captions.files import read_parquet_schema
from hardpos.data.images import decode_rgb, fetch_bytes

ROW_COLUMNS = ("key", "image", "image_bytes", "caption", "hard_negative", "hard_positive", "kind", "error")
TEXT_COLUMNS = ("caption", "hard_negative", "hard_positive")
IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")  # webdataset image members, first present wins
INLINE_COLUMNS = ("image_bytes", "image", "jpg", "png")  # parquet binary image columns, first present wins
LAYOUT_OF_SUFFIX = {".tar": "webdataset", ".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}


# --------------------------------------------------------------------------- resolving files
def _layout(path: str) -> str | None:
    low = path.lower()
    for suffix, layout in LAYOUT_OF_SUFFIX.items():
        if low.endswith(suffix):
            return layout
    return None


def resolve_files(path: str) -> list[str]:
    """The files ``path`` names (a file, a folder, or a glob; local or s3://), sorted
    (:func:`hardpos.storage.expand`).

    Raises :class:`SourceError` when nothing matches or the path does not exist."""
    path = str(path)
    try:
        files = storage.expand(path, tuple(LAYOUT_OF_SUFFIX))
    except FileNotFoundError:
        raise SourceError(f"training data not found: {path}") from None
    if storage.has_glob(path):
        if not files:
            raise SourceError(f"{path}: the glob matches no files")
        return files
    if files == [path] and _layout(path) is None:
        raise SourceError(f"{path}: not a .parquet, .jsonl or .tar file")
    if not files:
        raise SourceError(f"{path}: folder holds no .parquet, .jsonl or .tar files")
    return files


def layout_of(files: Sequence[str]) -> str:
    """``"webdataset" | "parquet" | "jsonl"`` for ``files``; a SourceError names two files of
    different layouts (or a file of none)."""
    layouts: dict[str, str] = {}
    for f in files:
        kind = _layout(f)
        if kind is None:
            raise SourceError(f"{f}: unknown input format (expected .parquet, .jsonl or .tar webdataset shards)")
        layouts.setdefault(kind, f)
    if len(layouts) > 1:
        (a, fa), (b, fb) = list(layouts.items())[:2]
        raise SourceError(f"mixed input layouts: {fa} is {a} but {fb} is {b}; give one layout per source")
    return next(iter(layouts))


def _open(uri: str):
    fs, fs_path = storage.arrow_filesystem(uri)
    return fs.open_input_stream(fs_path)


def parquet_schema(files: Sequence[str]) -> pa.Schema:
    """The one schema of ``files`` (footers only); a SourceError names two files that differ."""
    first: pa.Schema | None = None
    for f in files:
        schema = read_parquet_schema(f).remove_metadata()
        if first is None:
            first, first_file = schema, f
        elif not schema.equals(first):
            a = {fld.name: str(fld.type) for fld in first}
            b = {fld.name: str(fld.type) for fld in schema}
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            raise SourceError(f"mixed schemas: {f} differs from {first_file} in column(s) {diff} "
                              f"({[a.get(k) for k in diff]} vs {[b.get(k) for k in diff]})")
    assert first is not None
    return first


def inline_column(schema: pa.Schema) -> str | None:
    """The parquet column holding image bytes (binary, or a struct with a ``bytes`` field), if any."""
    for name in INLINE_COLUMNS:
        if name not in schema.names:
            continue
        t = schema.field(name).type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return name
        if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:
            return name
    return None


def first_sample_members(shard: str) -> list[str]:
    """Member suffixes of the first sample of a tar shard (reads only that sample's bytes)."""
    with _open(shard) as stream:
        try:
            tar = tarfile.open(fileobj=stream, mode="r|*")
            key, members = None, []
            for info in tar:
                if not info.isreg():
                    continue
                base = info.name.rsplit("/", 1)[-1]
                stem, _, suffix = base.partition(".")
                if key is None:
                    key = info.name[: len(info.name) - len(base)] + stem
                elif info.name[: len(info.name) - len(base)] + stem != key:
                    break
                members.append(suffix.lower())
        except tarfile.TarError as exc:
            raise SourceError(f"{shard}: not a readable tar shard: {exc}") from exc
    return members


def check_shards(shards: Sequence[str], threads: int = 16) -> None:
    """Every shard's first sample has a caption (``txt``) and an image member, else SourceError."""
    with cf.ThreadPoolExecutor(max_workers=max(1, min(threads, len(shards)))) as pool:
        for shard, members in zip(shards, pool.map(first_sample_members, shards)):
            if not members:
                raise SourceError(f"{shard}: shard holds no samples")
            if "txt" not in members:
                raise SourceError(f"{shard}: shard without the caption field: its first sample has "
                                  f"members {members}, no 'txt'")
            if not any(m in members for m in IMAGE_MEMBERS):
                raise SourceError(f"{shard}: its first sample has members {members}, no image "
                                  f"({'/'.join(IMAGE_MEMBERS)})")


# --------------------------------------------------------------------------- normalising rows
def bytes_key(data: bytes) -> str:
    """A stable identity for image bytes (same bytes -> same key on every host)."""
    return f"crc:{zlib.crc32(data):08x}:{len(data)}"


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8")  # UnicodeDecodeError: the caller marks the row
    text = str(value)
    return text if text.strip() else None


def _blob(value: Any) -> bytes | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if isinstance(value, dict):  # Hugging Face {bytes, path}
        value = value.get("bytes")
    return bytes(value) if value is not None and len(value) else None


def _table(rows: list[dict]) -> pa.Table:
    schema = pa.schema([("key", pa.string()), ("image", pa.string()), ("image_bytes", pa.binary()),
                        ("caption", pa.string()), ("hard_negative", pa.string()), ("hard_positive", pa.string()),
                        ("kind", pa.string()), ("error", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def normalize_webdataset(batch: dict[str, np.ndarray]) -> pa.Table:
    """Ray Data batch UDF: raw webdataset samples (bytes members) -> :data:`ROW_COLUMNS`."""
    n = len(batch["__key__"])
    rows = []
    for i in range(n):
        key = str(batch["__key__"][i])
        where = f"{batch['__url__'][i] if '__url__' in batch else ''}#{key}"
        row = {"key": key, "image": where, "image_bytes": None, "caption": None, "hard_negative": None,
               "hard_positive": None, "kind": None, "error": ""}
        try:
            for member in IMAGE_MEMBERS:
                if member in batch and _blob(batch[member][i]) is not None:
                    row["image_bytes"] = _blob(batch[member][i])
                    break
            row["caption"] = _text(batch["txt"][i]) if "txt" in batch else None
            meta = _blob(batch["json"][i]) if "json" in batch else None
            if meta is not None:
                fields = json.loads(meta.decode("utf-8"))
                if not isinstance(fields, dict):
                    raise ValueError("json member is not an object")
                for col in ("hard_negative", "hard_positive", "kind"):
                    row[col] = _text(fields.get(col))
            if row["image_bytes"] is None:
                row["error"] = "no image member"
            elif row["caption"] is None:
                row["error"] = "no caption"
            else:
                row["key"] = bytes_key(row["image_bytes"])
        except Exception as exc:  # noqa: BLE001 - a corrupt sample is counted and skipped, never fatal
            row.update(image_bytes=None, error=f"corrupt sample {where}: {type(exc).__name__}: {exc}"[:300])
        rows.append(row)
    return _table(rows)


def _normalize_table(batch: pa.Table, inline: str | None) -> pa.Table:
    """Triplet/inline parquet or jsonl rows -> :data:`ROW_COLUMNS`."""
    data = batch.to_pydict()
    n = batch.num_rows
    rows = []
    for i in range(n):
        row = {"key": "", "image": None, "image_bytes": None, "caption": None, "hard_negative": None,
               "hard_positive": None, "kind": None, "error": ""}
        try:
            for col in (*TEXT_COLUMNS, "kind"):
                row[col] = _text(data[col][i]) if col in data else None
            if inline is not None:
                cell = data[inline][i]
                row["image_bytes"] = _blob(cell)
                path = cell.get("path") if isinstance(cell, dict) else None
                row["image"] = _text(path) or (_text(data["image"][i]) if inline != "image" and "image" in data else None)
                if row["image_bytes"] is None:
                    row["error"] = "no image bytes"
                else:
                    row["key"] = bytes_key(row["image_bytes"])
            else:
                row["image"] = _text(data["image"][i]) if "image" in data else None
                row["key"] = row["image"] or ""
        except Exception as exc:  # noqa: BLE001 - e.g. a caption that is not text: counted, never fatal
            row["error"] = f"corrupt row: {type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    return _table(rows)


def read_rows(path: str, *, limit: int | None = None, filesystem_for=None) -> tuple[Any, str]:
    """(Ray Dataset of :data:`ROW_COLUMNS` rows, layout) for ``path`` (see the module doc).

    ``layout`` is ``"files"`` (one image path per row; rows are small) or ``"inline"``
    (image bytes in the rows: parquet-inline or webdataset).  ``filesystem_for(uri) ->
    (pyarrow filesystem, path)`` (default ``storage.arrow_filesystem``) builds the
    filesystem the Ray Data read tasks use.  Raises :class:`SourceError` before reading
    rows for the bad inputs listed in the module doc.
    """
    files = resolve_files(path)
    layout = layout_of(files)
    fs_for = filesystem_for or storage.arrow_filesystem
    fs = fs_for(files[0])[0]
    fs_paths = [fs_for(f)[1] for f in files]
    if layout == "webdataset":
        check_shards(files)
        ds = ray.data.read_webdataset(fs_paths, filesystem=fs, decoder=None)
        if limit is not None:
            ds = ds.limit(limit)
        return ds.map_batches(normalize_webdataset, batch_format="numpy", zero_copy_batch=True), "inline"
    inline = None
    try:
        if layout == "parquet":
            schema = parquet_schema(files)
            columns = list(schema.names)
            inline = inline_column(schema)
            ds = ray.data.read_parquet(fs_paths, filesystem=fs)
        else:
            ds = ray.data.read_json(fs_paths, filesystem=fs)
            columns = ds.columns() or []
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow/Ray raise many types
        raise SourceError(f"{path}: not a readable triplet file: {exc}") from exc
    need = ("caption",) if inline is not None else ("image", "caption")
    missing = [c for c in need if c not in columns]
    if missing:
        raise SourceError(f"{path}: lacks column(s) {missing}; has {columns}")
    if limit is not None:
        ds = ds.limit(limit)
    keep = [c for c in (*TEXT_COLUMNS, "image", "kind", inline) if c is not None and c in columns]
    ds = ds.select_columns(list(dict.fromkeys(keep)))
    out = ds.map_batches(_normalize_table, fn_kwargs={"inline": inline}, batch_format="pyarrow")
    return out, ("inline" if inline is not None else "files")


# --------------------------------------------------------------------------- fetching images
def _fetch_decode(uri: str | None, data: bytes | None) -> Image.Image:
    if data is None:
        if uri is None:
            raise ValueError("no image path")
        data = fetch_bytes(uri)
    return decode_rgb(data)


def fetch_all(uris: Sequence[str | None], blobs: Sequence[bytes | None], pool: cf.Executor | None,
              ) -> list[Image.Image | Exception]:
    """Fetch (where ``blobs[i]`` is None) and decode every image of a batch, ``pool``'s
    threads overlapping the GETs; one decoded image or the exception per row, in order."""
    def one(i: int) -> Image.Image | Exception:
        try:
            return _fetch_decode(uris[i], blobs[i])
        except Exception as exc:  # noqa: BLE001 - per-row failure: the caller counts it
            return exc

    idx = range(len(uris))
    return list(pool.map(one, idx)) if pool is not None else [one(i) for i in idx]
