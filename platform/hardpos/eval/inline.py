"""Benchmarks whose images travel inside the data: webdataset shards and parquet with image bytes.

``kind: triplets`` reads these too (:func:`is_inline_source` decides): the rows are read by
Ray Data (:func:`hardpos.data.captions.training.read_rows`, the training reader), and each image's
bytes are written, in the Ray Data tasks and in parallel, to a content-addressed cache
folder (``spec.cache_dir``; default ``$HARDPOS_IMAGE_CACHE`` or ``<tmp>/hardpos-image-cache``;
a file named by the hash of its bytes is written once and reused).  Items then point at
those files, so the evaluator's encoding (local threads or the Ray Data engine on the same
host) is unchanged.

Item ids are row numbers in file order, as for triplet files.  A corrupt sample (caption
not UTF-8, ``json`` not JSON, no image member) becomes a rejected row with its reason;
image bytes that do not decode are reported by the evaluator as a corrupt image (its
items excluded), never an error.  ``spec.limit`` reads only the first N rows.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any

import pyarrow as pa

from hardpos import storage
from hardpos.data.captions import SourceError
from hardpos.data.captions.training import inline_column, layout_of, parquet_schema, read_rows, resolve_files
from hardpos.eval.items import Benchmark, BenchmarkError, Item
from hardpos.eval.spec import BenchmarkSpec


def default_cache_dir() -> str:
    return os.environ.get("HARDPOS_IMAGE_CACHE") or os.path.join(tempfile.gettempdir(), "hardpos-image-cache")


def is_inline_source(path: str) -> bool:
    """True for webdataset shards and parquet with an image-bytes column (a file, folder or
    glob); False for triplet files naming their images.  Raises :class:`BenchmarkError` for
    a source that cannot be resolved (no match, mixed layouts or schemas).  A single
    .jsonl file, or a single file that does not exist, is left to the triplet-file reader
    (whose messages name it)."""
    single = not storage.has_glob(path)
    if single and (path.lower().endswith((".jsonl", ".json")) or not storage.exists(path)):
        return False
    try:
        files = resolve_files(path)
        layout = layout_of(files)
        return layout == "webdataset" or (layout == "parquet" and inline_column(parquet_schema(files)) is not None)
    except SourceError as exc:
        raise BenchmarkError(str(exc)) from exc


def extract_images(batch: pa.Table, cache_dir: str) -> pa.Table:
    """Ray Data batch UDF: write each row's image bytes to ``cache_dir/<key>.img`` (once) and
    replace the bytes column by that path (``image_file``)."""
    os.makedirs(cache_dir, exist_ok=True)
    files: list[str | None] = []
    for key, blob in zip(batch.column("key").to_pylist(), batch.column("image_bytes").to_pylist()):
        if blob is None:
            files.append(None)
            continue
        path = os.path.join(cache_dir, key.replace(":", "_") + ".img")
        if not os.path.exists(path):
            tmp = f"{path}.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        files.append(path)
    return batch.drop_columns(["image_bytes"]).append_column("image_file", pa.array(files, pa.string()))


def load_inline_triplets(spec: BenchmarkSpec) -> Benchmark:
    """A :class:`Benchmark` from webdataset shards or inline-image parquet (see module doc)."""
    try:
        ds, _ = read_rows(spec.path, limit=spec.limit)
    except SourceError as exc:
        raise BenchmarkError(str(exc)) from exc
    ds.context.execution_options.preserve_order = True  # row numbers are the item ids
    cache = spec.cache_dir or default_cache_dir()
    rows: list[dict[str, Any]] = ds.map_batches(extract_images, fn_kwargs={"cache_dir": cache},
                                                batch_format="pyarrow").take_all()
    items, rejected = [], []
    for i, row in enumerate(rows):
        reason = row["error"] or (None if row["image_file"] else "no_image")
        if reason is None and not row["hard_negative"]:
            reason = "no_negative"
        if reason:
            rejected.append({"row": i, "reason": reason, "caption": row["caption"], "image": row["image"]})
            continue
        items.append(Item(str(i), row["kind"] or "all", row["image_file"], row["caption"], row["hard_negative"],
                          row["hard_positive"] or None))
    has_pos = any(it.positive is not None for it in items)
    return Benchmark(spec.name, "triplets", items, has_positives=has_pos, rejected=rejected)
