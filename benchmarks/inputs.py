"""Decode throughput of the three training input layouts: image files named by a
triplet parquet, parquet with the image bytes inline, webdataset tar shards.

Writes ``n`` synthetic JPEGs (``size`` px) in each layout under ``workdir``, then times
:func:`hardpos.train.data.read_triplets_dataset` + :class:`hardpos.train.data.Preprocess`
(open_clip's 224 px validation transform, the model's tokenizer) through Ray Data to the last
batch, and prints one JSON line per layout: rows/s and wall seconds (the read included).
Beside them, the baseline the issue names (``files_serial``): the same files layout and the
same :class:`Preprocess` called in this process, one batch after another with one fetch at a
time (no Ray Data, no fetch threads), and the Ray Data files layout's speed-up over it.

    python -m benchmarks.inputs --n 2000 --workdir /tmp/inputs-bench
"""
from __future__ import annotations

import argparse
import io
import json
import tarfile
import time
from pathlib import Path

import numpy as np
import open_clip
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from PIL import Image

from hardpos.data.triplets import write_triplets
from hardpos.train.data import Preprocess, read_triplets_dataset


def _jpeg(i: int, size: int) -> bytes:
    rng = np.random.default_rng(i)
    arr = (rng.random((size // 8, size // 8, 3)) * 255).astype(np.uint8)
    img = Image.fromarray(arr).resize((size, size), Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_layouts(workdir: Path, n: int, size: int, shard_rows: int = 500) -> dict[str, str]:
    """The same ``n`` images and captions as files + triplet parquet, inline parquet, and shards."""
    blobs = [_jpeg(i, size) for i in range(n)]
    caps = [f"a photo number {i}" for i in range(n)]
    files = workdir / "files"
    (files / "img").mkdir(parents=True, exist_ok=True)
    for i, b in enumerate(blobs):
        (files / "img" / f"{i:06d}.jpg").write_bytes(b)
    write_triplets([{"image": f"img/{i:06d}.jpg", "caption": c, "hard_negative": c + " not", "hard_positive": None,
                     "kind": "replace", "source": "bench", "caption_id": str(i)} for i, c in enumerate(caps)],
                   str(files / "triplets.parquet"))
    inline = workdir / "inline"
    inline.mkdir(exist_ok=True)
    for s in range(0, n, shard_rows):
        pq.write_table(pa.table({"image_bytes": pa.array(blobs[s:s + shard_rows], pa.binary()),
                                 "caption": caps[s:s + shard_rows],
                                 "hard_negative": [c + " not" for c in caps[s:s + shard_rows]]}),
                       inline / f"part-{s // shard_rows:05d}.parquet")
    wds = workdir / "wds"
    wds.mkdir(exist_ok=True)
    for s in range(0, n, shard_rows):
        with tarfile.open(wds / f"shard-{s // shard_rows:05d}.tar", "w") as tar:
            for i in range(s, min(n, s + shard_rows)):
                meta = json.dumps({"hard_negative": caps[i] + " not"}).encode()
                for name, data in ((f"{i:06d}.jpg", blobs[i]), (f"{i:06d}.txt", caps[i].encode()), (f"{i:06d}.json", meta)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return {"files": str(files / "triplets.parquet"), "parquet_inline": str(inline), "webdataset": str(wds / "*.tar")}


def time_layout(path: str, base_dir: str, batch_size: int = 64, limit: int | None = None) -> dict:
    """Wall seconds and rows/s for reading + decoding + preprocessing every row of ``path``
    (its first ``limit`` rows when given)."""
    transform = open_clip.image_transform(224, is_train=False)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    started = time.perf_counter()
    ds = read_triplets_dataset(path, limit=limit).map_batches(Preprocess(transform, tokenizer, 224, base_dir),
                                                 batch_size=batch_size, batch_format="numpy")
    rows = ok = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        rows += len(batch["ok"])
        ok += int(batch["ok"].sum())
    seconds = time.perf_counter() - started
    return {"rows": rows, "ok": ok, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds, 1)}


def time_serial(path: str, base_dir: str, batch_size: int = 64) -> dict:
    """The plain loop: the triplet parquet's rows through :class:`Preprocess` in this process,
    one batch at a time and one image fetch at a time (``fetch_threads=1``)."""
    transform = open_clip.image_transform(224, is_train=False)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    preprocess = Preprocess(transform, tokenizer, 224, base_dir, fetch_threads=1)
    started = time.perf_counter()
    table = pq.read_table(path, columns=["image", "caption", "hard_negative", "hard_positive"])
    rows = ok = 0
    for start in range(0, table.num_rows, batch_size):
        part = table.slice(start, batch_size)
        out = preprocess({name: np.array(part.column(name).to_pylist(), dtype=object) for name in part.column_names})
        rows += len(out["ok"])
        ok += int(out["ok"].sum())
    seconds = time.perf_counter() - started
    return {"rows": rows, "ok": ok, "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--size", type=int, default=256, help="image side in pixels")
    parser.add_argument("--workdir", default="/tmp/hardpos-inputs-bench")
    parser.add_argument("--num-cpus", type=int, default=None)
    args = parser.parse_args(argv)
    work = Path(args.workdir)
    layouts = write_layouts(work, args.n, args.size)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        # warm-up, not reported: Ray Data's first pipeline starts workers that import torch and
        # open_clip (tens of seconds here), which would otherwise be charged to the first layout
        time_layout(layouts["files"], str(work / "files"), limit=2 * 64)
        results = {}
        for name, path in layouts.items():
            results[name] = time_layout(path, str(work / "files"))
            print(json.dumps({"layout": name, "n": args.n, "size": args.size, **results[name]}), flush=True)
        serial = time_serial(layouts["files"], str(work / "files"))
        print(json.dumps({"layout": "files_serial", "n": args.n, "size": args.size, **serial,
                          "ray_data_files_speedup": round(results["files"]["rows_per_s"] / serial["rows_per_s"], 2)}),
              flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
