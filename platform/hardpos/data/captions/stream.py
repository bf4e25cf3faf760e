"""A caption source at scale: files, folders or globs read by Ray Data on the workers.

Contract:

* :func:`resolve_source` turns ``input`` (one file, a folder, or a glob such as
  ``data/part-*.jsonl`` / ``s3://bucket/caps/*.parquet``; local or s3://) into its sorted
  file list and checks every file's head on the driver BEFORE any work: a glob that
  matches nothing, a file without a caption column, a non-UTF-8 jsonl/tsv head, files of
  different formats, or files whose caption / id / image / negatives columns differ
  (mixed schemas) each raise :class:`hardpos.data.captions.CaptionSourceError` naming the
  file(s). Only file heads are read (parquet footers, the first 64 KiB of text files).
* :func:`read_source` reads the files with Ray Data (``read_json(lines=True)`` for
  .jsonl, ``read_parquet`` for .parquet; .json / .tsv / .csv, whose whole file is one
  document or needs the NegCLIP header rules, are read whole by
  :func:`hardpos.data.captions.formats.read_captions` in a Ray Data task, one file per task),
  normalises every row to :data:`CAPTION_SCHEMA` on the workers, and materialises the
  result in the cluster's object store: the driver keeps block references and per-block
  row counts and content hashes, never the rows (:class:`CaptionBlocks`).
* A caption's ``index`` is its position in the source (files in sorted order, rows in
  file order), so shards (``index // shard_size``) and request ids are the same on every
  run, which is what makes resume exactly-once. A row without an id gets ``str(index)``.
* A row past the checked head that does not parse fails the read (nothing is written yet)
  with an error naming its file and line; a row without a caption becomes a row reject
  (``input/empty``), counted like any other.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from typing import Any, Sequence

import pyarrow as pa
import ray

from hardpos import storage
from hardpos.data.captions import CaptionSourceError
from hardpos.data.captions.files import decode_utf8, read_parquet_schema
from hardpos.data.captions.formats import ColumnMap, column_map, read_captions
from hardpos.data.triplets import resolve_image

STREAM_FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}  # split by Ray Data's own readers
FILE_FORMATS = {".json": "json", ".tsv": "tsv", ".csv": "csv"}  # one file per task, read whole
HEAD_BYTES = 64 * 1024
CAPTION_SCHEMA = pa.schema([("caption_id", pa.string()), ("caption", pa.string()), ("image", pa.string()),
                            ("negatives", pa.list_(pa.string()))])
# how Ray Data's errors read when a row does not parse (pyarrow's reader, then its python json fallback)
UNPARSEABLE = ("ArrowInvalid", "JSON parse error", "JSONDecodeError")
BLOCK_BYTES = 4 * 1024 * 1024  # small blocks: a shard task fetches only a little more than its rows


@dataclasses.dataclass(frozen=True)
class SourceFiles:
    """A resolved caption source: its files (sorted), their format and column map.

    fmt: "jsonl" / "parquet" (Ray Data readers) or "json" / "tsv" / "csv" / "sniff" (read
    whole per file); columns: the shared :class:`ColumnMap` of jsonl/parquet files (None
    for whole-file formats, whose reader decides per file).
    """

    uri: str
    files: tuple[str, ...]
    fmt: str
    columns: ColumnMap | None


def base_dir(path: str) -> str:
    """The folder relative image paths of the caption file ``path`` resolve against."""
    return path.rsplit("/", 1)[0] if storage.is_s3(path) else os.path.dirname(os.path.abspath(path))


def expand(uri: str) -> list[str]:
    """The files of ``uri``: itself, every caption file below a folder / prefix, or a glob's
    matches (sorted; :func:`hardpos.storage.expand`). Raises :class:`CaptionSourceError`
    when nothing matches."""
    uri = str(uri)
    known = (*STREAM_FORMATS, *FILE_FORMATS)
    try:
        files = storage.expand(uri, known)
    except FileNotFoundError:
        raise CaptionSourceError(f"caption source not found: {uri}") from None
    if not files:
        raise CaptionSourceError(f"caption source glob {uri} matches no file" if storage.has_glob(uri) else
                                 f"caption source folder {uri} holds no caption file ({', '.join(known)})")
    return files


def _format_of(path: str) -> str:
    low = path.lower()
    if low.endswith(".txt"):
        read_captions(path)  # raises the explanation of why .txt is not a caption source
    for ext, fmt in {**STREAM_FORMATS, **FILE_FORMATS}.items():
        if low.endswith(ext):
            return fmt
    return "sniff"


def _head(path: str) -> bytes:
    try:
        return storage.read_head(path, HEAD_BYTES)
    except (OSError, storage.StorageError) as exc:
        if not storage.is_s3(path):
            raise
        raise CaptionSourceError(f"caption source not readable: {path}: {exc}") from exc


def _head_text(path: str) -> str:
    data = _head(path)
    if len(data) == HEAD_BYTES and b"\n" in data:
        data = data[: data.rindex(b"\n")]  # only whole lines (a multibyte character may be cut)
    return decode_utf8(data, path, CaptionSourceError)


def _columns_of(path: str, fmt: str) -> list[str] | None:
    """The column names of a row-per-caption file from its head; None for an empty file."""
    if fmt == "parquet":
        return read_parquet_schema(path, CaptionSourceError).names
    text = _head_text(path)
    if fmt == "jsonl":
        # the first 100 lines' keys (the head holds whole lines only; see _head_text)
        records = storage.parse_jsonl("\n".join(text.splitlines()[:100]), path, CaptionSourceError)
        return list(dict.fromkeys(k for rec in records for k in rec)) if records else None
    return None


def resolve_source(uri: str) -> SourceFiles:
    """Expand and check ``uri`` (see the module docstring); reads file heads only."""
    files = expand(uri)
    fmts = {f: _format_of(f) for f in files}
    kinds = sorted(set(fmts.values()))
    if len(kinds) > 1:
        by_kind = {k: next(f for f, v in fmts.items() if v == k) for k in kinds}
        raise CaptionSourceError(f"caption source {uri} mixes file formats {by_kind}; give files of one format")
    fmt = kinds[0]
    if fmt in FILE_FORMATS.values() or fmt == "sniff":
        for f in files:  # header / UTF-8 checks the whole-file reader would make later, made now
            text = _head_text(f)
            if fmt in ("tsv", "csv") and text.strip():
                header = text.splitlines()[0].split("\t" if fmt == "tsv" else ",")
                column_map([h.strip('"') or "id" for h in header], f)
        return SourceFiles(str(uri), tuple(files), fmt, None)
    maps: dict[str, ColumnMap] = {}
    for f in files:
        cols = _columns_of(f, fmt)
        if cols is not None:
            maps[f] = column_map(cols, f)
    distinct = set(maps.values())
    if len(distinct) > 1:
        (f1, m1) = next(iter(maps.items()))
        f2, m2 = next((f, m) for f, m in maps.items() if m != m1)
        raise CaptionSourceError(
            f"caption source {uri} has mixed schemas: {f1} reads {dataclasses.asdict(m1)} but {f2} reads "
            f"{dataclasses.asdict(m2)}; give files with the same caption/id/image/negatives columns")
    if not distinct:
        return SourceFiles(str(uri), tuple(files), fmt, None)
    return SourceFiles(str(uri), tuple(files), fmt, distinct.pop())


# --------------------------------------------------------------------------- workers: normalising
def _resolved(image: str | None, base_dir: str, image_root: str | None) -> str | None:
    return resolve_image(image, base_dir, image_root) if image else None


def _path_uri(path: str, like: str) -> str:
    """Ray Data's ``path`` column drops the s3:// scheme; give it back."""
    return f"s3://{path}" if storage.is_s3(like) and not storage.is_s3(path) else path


def normalise_batch(batch: pa.Table, columns: ColumnMap, like: str, image_root: str | None) -> pa.Table:
    """``map_batches`` function: source rows (with Ray Data's ``path``) -> :data:`CAPTION_SCHEMA`.
    Ids stay null where the source has none (the row's index fills them in later)."""
    out = []
    for rec in batch.to_pylist():
        row = columns.row(rec, None)
        path = _path_uri(rec.get("path") or like, like)
        out.append({"caption_id": row["caption_id"], "caption": row["caption"],
                    "image": _resolved(row["image"], base_dir(path), image_root), "negatives": row["negatives"]})
    return pa.Table.from_pylist(out, schema=CAPTION_SCHEMA)


def read_whole_file(item: dict, image_root: str | None) -> list[dict]:
    """``flat_map`` function: every caption row of one whole-file source (json/tsv/csv)."""
    path = item["path"]
    base = base_dir(path)
    return [{"caption_id": r["caption_id"], "caption": r["caption"], "image": _resolved(r["image"], base, image_root),
             "negatives": r["negatives"]} for r in read_captions(path)]


def _row_hash(caption_id: str | None, caption: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{caption_id}\x00{caption}".encode("utf-8", "replace"),
                                          digest_size=8).digest(), "little")


@ray.remote(num_cpus=0.25)
def _block_stats(block: pa.Table) -> tuple[int, int]:
    """(rows, sum of the rows' content hashes mod 2**64) of one block: an order-free
    fingerprint that does not depend on where blocks split."""
    ids, caps = block.column("caption_id").to_pylist(), block.column("caption").to_pylist()
    return len(caps), sum(_row_hash(i, c) for i, c in zip(ids, caps)) % (1 << 64)


# --------------------------------------------------------------------------- driver: materialising
@dataclasses.dataclass
class CaptionBlocks:
    """The normalised captions in the object store, in source order.

    refs[i] is an ``ObjectRef[pa.Table]`` of :data:`CAPTION_SCHEMA`; rows[i] its row count;
    fingerprint: a hash of the content (ids and captions) and the row count.
    """

    refs: list[Any]
    rows: list[int]
    fingerprint: str

    @property
    def num_captions(self) -> int:
        return sum(self.rows)

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """(block, lo, hi) slices covering captions [start, stop), in order."""
        out, offset = [], 0
        for i, n in enumerate(self.rows):
            lo, hi = max(start, offset), min(stop, offset + n)
            if lo < hi:
                out.append((i, lo - offset, hi - offset))
            offset += n
            if offset >= stop:
                break
        return out


def read_source(src: SourceFiles, *, limit: int | None = None, image_root: str | None = None) -> CaptionBlocks:
    """Read and normalise ``src`` with Ray Data and keep it in the cluster (see the module
    docstring). Raises :class:`CaptionSourceError` for a file the workers cannot read; for
    JSON lines, it names the file and the first line that does not parse."""
    if src.fmt == "jsonl":
        ds = ray.data.read_json(list(src.files), include_paths=True, **_fs(src))  # pyarrow reads JSON lines
    elif src.fmt == "parquet":
        cols = [c for c in dataclasses.astuple(src.columns) if c] if src.columns else None
        ds = ray.data.read_parquet(list(src.files), include_paths=True, columns=cols, **_fs(src))
    else:
        ds = None
    ds = _ordered(ds if ds is not None else ray.data.from_items([{"path": f} for f in src.files],
                                                                 override_num_blocks=len(src.files)))
    if src.fmt in ("jsonl", "parquet"):
        if src.columns is None:  # only empty files
            return CaptionBlocks([], [], hashlib.sha256(b"empty").hexdigest()[:16])
        ds = ds.map_batches(normalise_batch, fn_kwargs={"columns": src.columns, "like": src.files[0],
                                                         "image_root": image_root}, batch_format="pyarrow",
                            batch_size=4096, **_task_args(src))
    else:
        ds = ds.flat_map(read_whole_file, fn_kwargs={"image_root": image_root}, **_task_args(src))
    if limit is not None:
        ds = ds.limit(limit)
    try:
        mat = ds.materialize()
        refs = [ref for ref in mat.to_arrow_refs()]
        stats = ray.get([_block_stats.remote(ref) for ref in refs])
    except Exception as exc:  # a worker's CaptionSourceError arrives wrapped in Ray's task error
        cause = _source_error(exc)
        if cause is not None:
            raise cause from exc
        text = str(exc)
        if any(m in text for m in UNPARSEABLE):  # rows the reader cannot parse
            # Ray Data's error names neither the file nor the line: find them (error path only)
            where = first_bad_json_line(src.files) if src.fmt == "jsonl" else None
            line = next((ln for ln in text.splitlines() if any(m in ln for m in UNPARSEABLE)), text)
            raise CaptionSourceError(where or f"{src.uri}: unreadable rows: {line.strip()[:500]}") from exc
        raise
    total = sum(n for n, _ in stats)
    digest = hashlib.sha256(f"{total}:{sum(s for _, s in stats) % (1 << 64)}".encode()).hexdigest()[:16]
    keep = [(r, n) for r, (n, _) in zip(refs, stats) if n]
    return CaptionBlocks([r for r, _ in keep], [n for _, n in keep], digest)


def first_bad_json_line(files: Sequence[str]) -> str | None:
    """``"<file>: line N is not JSON: ..."`` for the first line of the JSON-lines ``files``
    that is not a JSON object, or None when every line parses.

    Streams each file a line at a time (local or s3://), so it costs one pass and no more
    memory than a line; :func:`read_source` calls it only after Ray Data failed to parse a
    source, whose error names neither the file nor the line."""
    for path in files:
        fs, inner = storage.arrow_filesystem(path)
        with fs.open_input_stream(inner) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    return f"{path}: line {n} is not JSON: {exc}"
                if not isinstance(record, dict):
                    return f"{path}: line {n} is not a JSON object"
    return None


def _fs(src: SourceFiles) -> dict:
    """Reader arguments for s3:// sources: the filesystem, and the driver's S3 settings for
    the read tasks (Ray's workers do not see variables set after they started)."""
    if storage.is_s3(src.files[0]):
        return {"filesystem": storage.arrow_filesystem(src.files[0])[0],
                "ray_remote_args": {"runtime_env": {"env_vars": storage.worker_env(include_tracking=False)}}}
    return {}


def _task_args(src: SourceFiles) -> dict:
    return {"runtime_env": {"env_vars": storage.worker_env(include_tracking=False)}} if storage.is_s3(src.files[0]) else {}


def _ordered(ds):
    # rows must come out in file order: a caption's index (its shard, its request ids) is its position
    ds.context.execution_options.preserve_order = True
    ds.context.target_max_block_size = BLOCK_BYTES
    return ds


def _source_error(exc: BaseException) -> CaptionSourceError | None:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, CaptionSourceError):
            return CaptionSourceError(str(exc).splitlines()[0] if str(exc) else "caption source error")
        cause = getattr(exc, "cause", None)
        if isinstance(cause, CaptionSourceError):
            return cause
        text = str(exc)
        if "CaptionSourceError" in text:
            line = next((ln for ln in text.splitlines() if "CaptionSourceError:" in ln), text)
            return CaptionSourceError(line.split("CaptionSourceError:", 1)[-1].strip())
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def caption_rows(tables: Sequence[pa.Table], pieces: Sequence[tuple[int, int, int]], start: int) -> list[dict]:
    """The caption rows of one shard from its block slices: ``index`` (from ``start``),
    ``caption_id`` (``str(index)`` where the source has none), caption, image, negatives."""
    rows: list[dict] = []
    for table, (_, lo, hi) in zip(tables, pieces):
        rows.extend(table.slice(lo, hi - lo).to_pylist())
    for i, row in enumerate(rows):
        row["index"] = start + i
        if row["caption_id"] is None:
            row["caption_id"] = str(start + i)
        row["negatives"] = row["negatives"] or []
    return rows


__all__ = ["CAPTION_SCHEMA", "CaptionBlocks", "SourceFiles", "caption_rows", "expand", "first_bad_json_line",
           "normalise_batch", "read_source", "read_whole_file", "resolve_source"]
