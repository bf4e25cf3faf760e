"""Benchmark: this evaluator vs a naive per-row evaluator, side by side on the same rows.

The naive evaluator follows the paper's script (``run_eval.py``): two passes over the
rows (original file, swapped file), DataLoader-style batches of ``naive_batch`` rows,
each row's image decoded, preprocessed and encoded once *per caption pair* and both
captions of the pair encoded at the full 77-token context. The efficient evaluator is
:func:`hardpos.eval.evaluator.evaluate_benchmarks` (each distinct image and caption once,
length-sorted, batch-trimmed text).

Rows: the first ``n_rows / 2`` items of each REPLACE subset from the real annotation files,
with stand-in JPEGs (``image_size``, random noise so decoding is not trivial) generated
in a temporary folder at the referenced relative paths. Both evaluators must produce the
same per-item scores (checked: ``max_abs_score_diff``) and the same metrics.

    python -m benchmarks.eval_bench n_rows=2000 data_dir=/path/to/reference/data

The reference files come from ``data_dir=`` or ``$HARDPOS_REFERENCE_DATA``
(:func:`benchmarks.harness.reference_data_dir`), never from a path guessed next to the
repository.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks.harness import compare_alternating, reference_data_dir
from hardpos.config import ModelConfig
from hardpos.data.images import load_image
from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.evaluator import evaluate_benchmarks
from hardpos.eval.metrics import benchmark_metrics
from hardpos.eval.spec import BenchmarkSpec
from hardpos.models.clip import load_model


def _stand_in_jpegs(root: Path, rel_paths, size: tuple[int, int], seed: int) -> int:
    rng = np.random.default_rng(seed)
    made = 0
    for rel in sorted(set(rel_paths)):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # low-frequency noise upsampled: JPEG-compressible like a photo, still non-trivial to decode
        small = rng.integers(0, 256, size=(size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize(size, Image.BILINEAR).save(path, quality=90)
        made += 1
    return made


def replace_source(data_dir: str | None, fallback: Path, n_rows: int) -> Path:
    """The real REPLACE folder (``<data_dir>/hard_positives``) when present, else a
    synthetic one in the paper's format with the real files' shape (~3 items per image)."""
    root = reference_data_dir(data_dir)
    hp = root / "hard_positives" if root is not None else None
    if hp is not None and hp.is_dir():
        return hp
    if data_dir:
        raise FileNotFoundError(f"{hp} not found: pass data_dir= (the folder holding hard_positives/)")
    words = ["red", "blue", "green", "wooden", "tall", "small", "sitting", "walking"]
    for sub in ("attributes", "relations"):
        orig, swapped = [], []
        for i in range(max(1, n_rows // 2)):
            img, a, b = str(i // 3), words[i % 8], words[(i + 3) % 8]
            base = {"image_id": img, "false_caption": f"{b} thing number {i % 3}", "image_path": f"data/VG_100K/{img}.jpg"}
            orig.append({**base, "true_caption": f"{a} thing number {i % 3}"})
            swapped.append({**base, "true_caption": f"thing number {i % 3} that is {a}"})
        for folder, rows in (("data", orig), ("swapped_data", swapped)):
            (fallback / folder).mkdir(parents=True, exist_ok=True)
            (fallback / folder / f"vl_checklist_{sub}.json").write_text(json.dumps(rows))
    return fallback


def naive_scores(model, preprocess, tokenizer, items, *, device="cpu", batch_rows: int = 16) -> np.ndarray:
    """[N, 3] (s_c, s_n, s_p) the paper's way: per pass, per batch of rows, every row's
    image encoded again and its two captions encoded at full context (77 tokens)."""
    out = np.zeros((len(items), 3))
    with torch.no_grad():
        for pass_, (first, second) in enumerate((("caption", "negative"), ("positive", "negative"))):
            for start in range(0, len(items), batch_rows):
                chunk = items[start:start + batch_rows]
                imgs = torch.stack([preprocess(load_image(it.image, it.crop)) for it in chunk]).to(device)
                i = model.encode_image(imgs, normalize=True)
                t = model.encode_text(tokenizer([getattr(it, first) for it in chunk] + [getattr(it, second) for it in chunk]).to(device),
                                      normalize=True)
                k = len(chunk)
                pos = (i * t[:k]).sum(-1).float().cpu().numpy()
                neg = (i * t[k:]).sum(-1).float().cpu().numpy()
                if pass_ == 0:
                    out[start:start + k, 0], out[start:start + k, 1] = pos, neg
                else:
                    out[start:start + k, 2] = pos  # the swapped pass's negative is the same caption
    return out


@contextlib.contextmanager
def stand_in_replace(*, arch: str, n_rows: int, data_dir: str | None, device: str, image_size: tuple[int, int],
                     seed: int = 0):
    """(loaded model, BenchmarkSpec, Benchmark, n stand-in images, seconds to write them) for
    ``n_rows`` REPLACE rows with stand-in JPEGs at their relative paths, in a temp folder that
    lives as long as the ``with`` block. Shared by :func:`run` and :func:`evaluate_bench`."""
    torch.manual_seed(seed)
    lm = load_model(ModelConfig(arch=arch), device=device)
    lm.model.eval()
    with tempfile.TemporaryDirectory(prefix="hardpos-evalbench-") as tmp:
        root = Path(tmp)
        hp = replace_source(data_dir, root / "synthetic_replace", n_rows)
        spec = BenchmarkSpec("replace", "replace", str(hp), image_root=str(root), limit=n_rows // 2)
        bench = load_benchmark(spec)
        t0 = time.perf_counter()
        n_images = _stand_in_jpegs(root, [it.image[len(str(root)) + 1:] for it in bench.items], image_size, seed)
        yield lm, spec, bench, n_images, time.perf_counter() - t0


def run(*, n_rows: int = 2000, arch: str = "ViT-B-32", data_dir: str | None = None, device: str = "cpu",
        batch_size: int = 256, naive_batch: int = 16, image_size: tuple[int, int] = (500, 375),
        num_threads: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Time the naive and the efficient evaluator once each on the same REPLACE rows and model.

    data_dir: folder holding ``hard_positives/`` (default ``$HARDPOS_REFERENCE_DATA``; a
    synthetic REPLACE folder when neither is set or the variable's folder lacks it).
    Returns the timings, their ratio, the dedup counts and the score agreement.
    """
    if num_threads:
        torch.set_num_threads(num_threads)
    with stand_in_replace(arch=arch, n_rows=n_rows, data_dir=data_dir, device=device, image_size=image_size,
                          seed=seed) as (lm, spec, bench, n_images, gen_s):
        model = lm.model
        # warm-up both paths on a few rows (first-call allocations, thread pools)
        naive_scores(model, lm.preprocess_val, lm.tokenizer, bench.items[:4], device=device, batch_rows=4)

        t0 = time.perf_counter()
        naive = naive_scores(model, lm.preprocess_val, lm.tokenizer, bench.items, device=device, batch_rows=naive_batch)
        naive_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = evaluate_benchmarks(model, lm.preprocess_val, lm.tokenizer, [spec], device=device, batch_size=batch_size)
        fast_s = time.perf_counter() - t0
    res = report.results[0]
    fast = np.stack([res.s_c, res.s_n, res.s_p], axis=1)
    naive_metrics = benchmark_metrics("replace", [it.subset for it in bench.items], naive[:, 0], naive[:, 1], naive[:, 2],
                                      "mean_of_subsets")
    accs = ("orig_acc", "aug_acc", "brittleness")
    return {
        "arch": arch, "device": device, "torch_threads": torch.get_num_threads(), "n_rows": len(bench.items),
        "n_distinct_images": res.n_distinct_images, "n_distinct_captions": res.n_distinct_captions,
        "image_size": list(image_size), "stand_in_images": n_images, "stand_in_seconds": round(gen_s, 2),
        "naive_seconds": round(naive_s, 3), "efficient_seconds": round(fast_s, 3),
        "speedup": round(naive_s / fast_s, 2),
        "naive_image_encodes": 2 * len(bench.items), "naive_text_encodes_at_77": 4 * len(bench.items),
        "max_abs_score_diff": float(np.abs(naive - fast).max()),
        "metrics_naive": {k: naive_metrics[f"replace/{k}"] for k in accs},
        "metrics_efficient": {k: report.metrics[f"replace/{k}"] for k in accs},
    }


def evaluate_bench(*, quick: bool = False, repeats: int = 1, n_rows: int | None = None, arch: str | None = None,
                   data_dir: str | None = None, device: str = "cpu") -> list[dict[str, Any]]:
    """The benchmark harness's ``evaluate`` suite (``python -m benchmarks.suites suite=evaluate``):
    naive vs efficient evaluator alternated ``repeats`` times on the same rows
    (:func:`benchmarks.harness.compare_alternating`); ``quick`` = tiny model, 16 rows."""
    arch = arch or ("hardpos-tiny" if quick else "ViT-B-32")
    n_rows = n_rows or (16 if quick else 400)
    image_size = (40, 30) if quick else (500, 375)
    with stand_in_replace(arch=arch, n_rows=n_rows, data_dir=data_dir, device=device,
                          image_size=image_size) as (lm, spec, bench, _, _):
        model = lm.model
        out: dict[str, Any] = {}

        def optimised():
            out["fast"] = evaluate_benchmarks(model, lm.preprocess_val, lm.tokenizer, [spec], device=device).results[0]

        def baseline():
            out["naive"] = naive_scores(model, lm.preprocess_val, lm.tokenizer, bench.items, device=device)

        naive_scores(model, lm.preprocess_val, lm.tokenizer, bench.items[:4], device=device, batch_rows=4)  # warm-up
        row = compare_alternating(optimised, baseline, repeats=repeats, warmup=0, work_items=len(bench.items))
    fast = out["fast"]
    diff = float(np.abs(out["naive"] - np.stack([fast.s_c, fast.s_n, fast.s_p], axis=1)).max())
    if diff > 1e-3:
        raise AssertionError(f"naive and efficient evaluators disagree (max score difference {diff})")
    row.update(suite="evaluate", max_abs_score_diff=diff,
               case=(f"{arch} REPLACE {len(bench.items)} rows, {fast.n_distinct_images} distinct images, "
                     f"{fast.n_distinct_captions} captions: dedup+index vs image per pair + 77-token text"))
    return [row]


if __name__ == "__main__":  # pragma: no cover - a measurement, not a test
    import json
    import sys

    kwargs = dict(arg.split("=", 1) for arg in sys.argv[1:])
    typed = {k: (int(v) if v.isdigit() else v) for k, v in kwargs.items()}
    print(json.dumps(run(**typed), indent=2))
