"""Sharded, resumable output: shard files, their commit marker, the manifest and the merge.

Contract: a shard is finished iff its ``.done.json`` marker exists (:func:`write_shard`
writes it last, after checking that the results match the shard's requests exactly and
that ``inputs == accepted + rejected``); :func:`check_manifest` refuses to resume over a
run with different settings; :func:`merge_outputs` concatenates finished shards in shard
order; :func:`aggregate` sums per-shard counts. Works on local paths and s3:// through
:mod:`hardpos.storage`. :mod:`hardpos.generate.pipeline` commits shards through it.
"""
from __future__ import annotations

import collections
import io
import json
import os
import shutil
import tarfile
import tempfile
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.config import ConfigError
from hardpos.data.triplets import write_triplets
from hardpos.generate.planning import Shard, result_schema

ACCEPTED_COLUMNS = ("request_id", "shard", "caption_id", "caption", "kind", "polarity", "text", "raw_output", "source",
                    "prompt_tokens", "completion_tokens")
REJECT_COLUMNS = ("request_id", "shard", "caption_id", "caption", "kind", "polarity", "reason", "detail", "raw_output",
                  "source")
MANIFEST_KEYS = ("input_fingerprint", "num_captions", "shard_size", "prompts_fingerprint", "engine", "model", "seed",
                 "join")


def _parquet_bytes(rows: list[dict], columns: Iterable[str]) -> bytes:
    schema = result_schema()
    fields = [schema.field(c) for c in columns]
    table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows], schema=pa.schema(fields))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def shard_path(out_dir: str, index: int, what: str) -> str:
    return storage.join(out_dir, "shards", f"shard-{index:05d}.{what}")


def counts_of(results: list[dict]) -> dict[str, Any]:
    acc = [r for r in results if r["status"] == "accepted"]
    rej = [r for r in results if r["status"] != "accepted"]
    return {
        "inputs": len(results),
        "accepted": len(acc),
        "rejected": len(rej),
        "accepted_by_kind": dict(collections.Counter(r["kind"] for r in acc)),
        "rejected_by_kind": dict(collections.Counter(r["kind"] for r in rej)),
        "rejected_by_reason": dict(collections.Counter(r["reason"] for r in rej)),
        "rejected_by_kind_reason": dict(collections.Counter(f"{r['kind']}/{r['reason']}" for r in rej)),
        "prompt_tokens": sum(int(r.get("prompt_tokens") or 0) for r in results),
        "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in results),
    }


def write_shard(out_dir: str, shard: Shard, results: list[dict], triplets: list[dict] | None,
                join_stats: Mapping[str, Any] | None = None) -> dict:
    """Write one finished shard; the ``.done.json`` marker goes last (it is the commit).

    join_stats: the join's own counts (:func:`join_counts`), kept in the marker beside the
    row counts so the run's summary can add them up over shards."""
    expected = {r["request_id"] for r in shard.requests} | {r["request_id"] for r in shard.input_rejects}
    got = [r["request_id"] for r in results]
    if len(got) != len(set(got)) or set(got) != expected:
        missing, extra = expected - set(got), set(got) - expected
        raise RuntimeError(f"shard {shard.index}: results do not match its requests exactly "
                           f"(missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}, "
                           f"duplicates {len(got) - len(set(got))})")
    results = sorted(results, key=lambda r: (int(r["request_id"].split(":")[0]), r["request_id"]))
    accepted = [r for r in results if r["status"] == "accepted"]
    rejects = [r for r in results if r["status"] != "accepted"]
    storage.write_bytes(shard_path(out_dir, shard.index, "accepted.parquet"), _parquet_bytes(accepted, ACCEPTED_COLUMNS))
    storage.write_bytes(shard_path(out_dir, shard.index, "rejects.parquet"), _parquet_bytes(rejects, REJECT_COLUMNS))
    counts = counts_of(results)
    counts["captions"] = len(shard.captions)
    if triplets is not None:
        write_triplets(triplets, shard_path(out_dir, shard.index, "triplets.parquet")) if triplets else None
        counts["triplets"] = len(triplets)
        counts["triplets_with_positive"] = sum(1 for t in triplets if t["hard_positive"] is not None)
        counts["triplets_with_negative"] = sum(1 for t in triplets if t["hard_negative"] is not None)
    if join_stats:
        counts.update(join_stats)
    if counts["inputs"] != counts["accepted"] + counts["rejected"] or counts["inputs"] != shard.inputs:
        raise RuntimeError(f"shard {shard.index}: conservation violated: {counts}")
    storage.write_json(shard_path(out_dir, shard.index, "done.json"), counts)
    return counts


def done_shards(out_dir: str) -> set[int]:
    """Indices of the shards whose ``.done.json`` marker exists."""
    prefix = storage.join(out_dir, "shards")
    out = set()
    for path in storage.list_files(prefix, suffix=".done.json"):
        name = str(path).rsplit("/", 1)[-1]
        try:
            out.add(int(name.split(".")[0].split("-")[1]))
        except (IndexError, ValueError):
            continue
    return out


def check_manifest(out_dir: str, manifest: dict) -> None:
    """Write the manifest on the first run; on reruns refuse to mix different settings."""
    path = storage.join(out_dir, "manifest.json")
    if storage.exists(path):
        old = storage.read_json(path)
        diff = {k: (old.get(k), manifest.get(k)) for k in MANIFEST_KEYS if old.get(k) != manifest.get(k)}
        if diff:
            raise ConfigError(f"{out_dir} holds shards of a run with different settings {diff}; resume needs the "
                              "same input, shard_size, prompts, engine, model and seed: use a new output_dir "
                              "(or overwrite=true to start over)")
        return
    storage.write_json(path, manifest)


MERGED = ("manifest.json", "accepted.parquet", "rejects.parquet", "samples.json")
WEBDATASET_DIR = "webdataset"


def clear_output(out_dir: str, extra: Iterable[str] = ()) -> None:
    """Remove shard files, the manifest, merged outputs and the previous run's summary.json
    (``overwrite=true``): a run that then fails must not leave the old summary claiming a
    complete output over files that are gone (the job writes summary.json only on success)."""
    names = [*MERGED, "summary.json", *extra]
    if storage.is_s3(out_dir):
        for uri in [*storage.list_files(storage.join(out_dir, "shards")),
                    *storage.list_files(storage.join(out_dir, WEBDATASET_DIR)), *(storage.join(out_dir, n) for n in names)]:
            storage.delete(uri)  # deleting a missing key is a no-op
        return

    shutil.rmtree(storage.join(out_dir, "shards"), ignore_errors=True)
    shutil.rmtree(storage.join(out_dir, WEBDATASET_DIR), ignore_errors=True)
    for name in names:
        try:
            os.remove(storage.join(out_dir, name))
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- merge
def read_parquet_rows(uri: str) -> list[dict]:
    return pq.read_table(io.BytesIO(storage.read_bytes(uri))).to_pylist()


def _fixed_schema(columns: Iterable[str]) -> pa.Schema:
    schema = result_schema()
    return pa.schema([schema.field(c) for c in columns])


class _StreamedFile:
    """A file written piece by piece to a local temp file, then moved (local) or uploaded
    (s3://) in one step, so a half-merged output never sits under its final name."""

    def __init__(self, uri: str):
        self.uri = uri
        folder = None if storage.is_s3(uri) else os.path.dirname(os.path.abspath(uri))
        if folder:
            os.makedirs(folder, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=".merge-", suffix=".tmp", dir=folder)
        os.close(fd)

    def publish(self) -> str:
        if storage.is_s3(self.uri):
            storage.upload_file(self.tmp, self.uri)  # multipart: never whole in memory
            os.remove(self.tmp)
        else:
            os.replace(self.tmp, self.uri)
        return self.uri

    def discard(self) -> None:
        if os.path.exists(self.tmp):
            os.remove(self.tmp)


def _merge_parquet(parts: Iterable[str], uri: str, schema: pa.Schema | None) -> str:
    """Concatenate parquet files into ``uri`` one part at a time (memory: one part).
    schema: the output schema (None: the parts' schemas unified, missing columns null)."""
    parts = list(parts)
    if schema is None:
        schemas = [pq.read_schema(io.BytesIO(storage.read_bytes(p))) if storage.is_s3(p) else pq.read_schema(p)
                   for p in parts]
        schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
    out = _StreamedFile(uri)
    try:
        with pq.ParquetWriter(out.tmp, schema) as writer:
            for p in parts:
                table = pq.read_table(io.BytesIO(storage.read_bytes(p)))
                cols = [table.column(f.name).cast(f.type) if f.name in table.column_names
                        else pa.nulls(table.num_rows, f.type) for f in schema]
                writer.write_table(pa.Table.from_arrays(cols, schema=schema))
        return out.publish()
    except BaseException:
        out.discard()
        raise


def _merge_jsonl(parts: Iterable[str], uri: str) -> str:
    out = _StreamedFile(uri)
    try:
        with open(out.tmp, "w", encoding="utf-8") as fh:
            for p in parts:
                for row in pq.read_table(io.BytesIO(storage.read_bytes(p))).to_pylist():
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        return out.publish()
    except BaseException:
        out.discard()
        raise


def merge_outputs(out_dir: str, num_shards: int, join: bool, triplets_name: str) -> dict[str, str]:
    """Concatenate every shard's files into the run's merged outputs (shard order), one
    shard at a time, so the driver's memory does not grow with the run."""
    outputs = {}
    for what, columns in (("accepted", ACCEPTED_COLUMNS), ("rejects", REJECT_COLUMNS)):
        parts = [shard_path(out_dir, i, f"{what}.parquet") for i in range(num_shards)]
        outputs[what] = _merge_parquet(parts, storage.join(out_dir, f"{what}.parquet"), _fixed_schema(columns))
    if join:
        parts = [p for p in (shard_path(out_dir, i, "triplets.parquet") for i in range(num_shards)) if storage.exists(p)]
        uri = storage.join(out_dir, triplets_name)
        if not parts:
            outputs["triplets"] = write_triplets([], uri)
        elif uri.lower().endswith(".parquet"):
            outputs["triplets"] = _merge_parquet(parts, uri, None)
        else:
            outputs["triplets"] = _merge_jsonl(parts, uri)
    return outputs


# --------------------------------------------------------------------------- webdataset
def webdataset_path(out_dir: str, index: int) -> str:
    return storage.join(out_dir, WEBDATASET_DIR, f"shard-{index:05d}.tar")


def write_webdataset(out_dir: str, index: int, triplets: list[dict]) -> tuple[int, int]:
    """Write one shard's triplets as a webdataset tar (``webdataset/shard-NNNNN.tar``),
    before the shard's marker; returns (samples written, samples skipped).

    Layout (Ray Data's ``read_webdataset`` conventions: a sample is the files sharing a
    key, the key is the name up to the first dot, the rest is the column):

    * ``<key>.jpg`` / ``<key>.png`` (or the image's own extension, lower case, ``jpeg``
      written as ``jpg``): the image file's bytes, as they are on disk;
    * ``<key>.txt``: the caption (UTF-8);
    * ``<key>.json``: ``{"caption_id", "caption", "hard_negative", "hard_positive", "kind",
      "source", "negative_source"}`` (hard_negative / hard_positive null when absent).

    ``<key>`` is ``<shard:05d>-<row:06d>`` (no dots). A triplet whose image is missing or
    unreadable is skipped and counted (``webdataset_skipped`` in the shard's counts).
    """
    buf = io.BytesIO()
    written = skipped = 0
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for row, t in enumerate(triplets):
            image = t.get("image")
            try:
                data = storage.read_bytes(image) if image else None
            except (FileNotFoundError, OSError, storage.StorageError):
                data = None
            if data is None:
                skipped += 1
                continue
            ext = image.rsplit(".", 1)[-1].lower() if "." in image.rsplit("/", 1)[-1] else "jpg"
            ext = "jpg" if ext == "jpeg" else ext
            key = f"{index:05d}-{row:06d}"
            meta = {k: t.get(k) for k in ("caption_id", "caption", "hard_negative", "hard_positive", "kind", "source",
                                          "negative_source")}
            for name, payload in ((f"{key}.{ext}", data), (f"{key}.txt", t["caption"].encode("utf-8")),
                                  (f"{key}.json", json.dumps(meta, ensure_ascii=False).encode("utf-8"))):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            written += 1
    storage.write_bytes(webdataset_path(out_dir, index), buf.getvalue())
    return written, skipped


def sample_rows(out_dir: str, indices: list[int], n: int) -> dict[str, Any]:
    """Up to ``n`` accepted pairs and up to ``n`` rejects per reason, from the first finished shards."""
    accepted: list[dict] = []
    rejects: dict[str, list[dict]] = collections.defaultdict(list)
    for i in indices[:8]:
        for r in read_parquet_rows(shard_path(out_dir, i, "accepted.parquet")):
            if len(accepted) < n:
                accepted.append({k: r[k] for k in ("kind", "caption", "text", "source")})
        for r in read_parquet_rows(shard_path(out_dir, i, "rejects.parquet")):
            if len(rejects[r["reason"]]) < n:
                rejects[r["reason"]].append({k: r[k] for k in ("kind", "caption", "raw_output", "reason", "detail")})
    return {"accepted": accepted, "rejected": dict(rejects)}


def aggregate(counts: list[dict]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for c in counts:
        for k, v in c.items():
            if isinstance(v, dict):
                bucket = total.setdefault(k, {})
                for kk, vv in v.items():
                    bucket[kk] = bucket.get(kk, 0) + vv
            else:
                total[k] = total.get(k, 0) + v
    return total
