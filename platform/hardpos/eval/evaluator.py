"""The efficient evaluator: encode every distinct image and caption once, score by index.

Contract used by the other stages:

* :func:`run_benchmarks` -- flat metrics (train's per-epoch evaluation, sweeps).
* :func:`evaluate_benchmarks` -- the full :class:`EvalReport` (per-item scores, missing
  images, rejected rows) that the ``evaluate`` stage writes out.
* :func:`score_pairs` / :func:`similarity_matrix` -- cosine similarities for PIL images and
  captions through exactly the same encoding path (Serve asserts equality with these).

How the work is done (why it is fast): a benchmark's items reference far fewer distinct
images than items (REPLACE: 11.7k images for 27.4k items) and each caption text often
repeats; each distinct ``(image, crop)`` and each distinct caption is encoded once, in
batches, under ``torch.no_grad``, then every item's three scores are dot products of rows
picked by index. Captions are sorted by token length before
batching so each batch is trimmed to its own longest caption (see
:func:`hardpos.models.clip.encode_text`). Image decoding + preprocessing runs in a small thread
pool one batch ahead of the model.

Precision: scoring runs in fp32 on every device by default (``precision="fp32"``; on CUDA
TF32 is switched off while scoring, since it rounds matmul/conv inputs to 10 mantissa bits).
Ties count against the model and the paper's differences are small (Table 3: 16.4 vs
16.6), so lower precision is opt-in: ``precision="bf16"`` / ``"fp16"`` run the encoders under
``torch.autocast`` on the model's device (CPU included); features are returned as float32.

Missing or corrupt images never crash an evaluation and are never scored: they are
listed (with the error and how many items used them) and their items are excluded from
every figure that needs an image; figures that need none (SugarCrepe++'s text-only task)
still cover them.

Layout: this module holds the results, the metrics and the benchmark loop; image/caption
encoding and precision live in :mod:`hardpos.eval.encoding`, the Serve pair scoring in
:mod:`hardpos.eval.pairs`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import torch

from hardpos.eval import sugarcrepe_pp
from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.encoding import ImageKey, check_precision, encode_captions, encode_image_keys, eval_mode
from hardpos.eval.items import Benchmark, Item
from hardpos.eval.metrics import TEXT_COLUMNS, benchmark_metrics, text_only_metrics
from hardpos.eval.spec import BenchmarkSpec, Precision

log = logging.getLogger(__name__)
progress = logging.getLogger("hardpos.eval")  # one throughput line per benchmark (INFO)


# --------------------------------------------------------------------------- results
@dataclasses.dataclass
class BenchmarkResult:
    """Everything measured on one benchmark.

    Per-item arrays cover the *scored* items only (items whose image failed are in
    ``excluded_items``). ``s_p`` is NaN where an item has no hard positive.
    ``metrics`` is flat and prefixed: ``<name>/orig_acc``, ``<name>/<subset>/aug_acc`` ...
    ``text_sims``: per-item text-only cosines ``t_cp, t_cn, t_pn`` of the scored items for a
    benchmark with a text-only task (SugarCrepe++, :mod:`hardpos.eval.sugarcrepe_pp`); empty
    otherwise. The text-only *metrics* need no image: they cover every item, scored or not
    (``<name>/text_only_n_items``), so a benchmark whose images are all missing still has them.
    ``has_positives``: the benchmark's items carry hard positives (even when none was scored).
    ``items``: every item of the benchmark as loaded (scored or not): what needs no image (the
    evaluate stage's blind baselines) reads their texts.
    ``blind_scores``: per scored item, text-only scores a stage attached (column name -> array
    in ``item_ids`` order; written to scores.parquet beside the model's scores).
    """

    name: str
    kind: str
    aggregate: str
    item_ids: list[str]
    subsets: list[str]
    s_c: np.ndarray
    s_n: np.ndarray
    s_p: np.ndarray
    metrics: dict[str, float]
    missing_images: list[dict[str, Any]]
    excluded_items: list[str]
    rejected_rows: list[dict[str, Any]]
    n_distinct_images: int = 0
    n_distinct_captions: int = 0
    text_sims: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    has_positives: bool = True
    items: list[Item] = dataclasses.field(default_factory=list)
    blind_scores: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class EvalReport:
    """The results of several benchmarks; ``metrics`` merges their flat metrics."""

    results: list[BenchmarkResult]
    precision: str = "fp32"

    @property
    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.results:
            out.update(r.metrics)
        return out

    def scores_table(self):
        """Per-item scores as a pyarrow Table: item_id, benchmark, subset, s_c, s_n, s_p (and
        t_cp, t_cn, t_pn when a benchmark has text-only cosines, and the blind baselines'
        columns when a stage attached them; null for the other benchmarks)."""
        cols: dict[str, list] = {k: [] for k in ("item_id", "benchmark", "subset", "s_c", "s_n", "s_p")}
        for r in self.results:
            cols["item_id"] += r.item_ids
            cols["benchmark"] += [r.name] * len(r.item_ids)
            cols["subset"] += r.subsets
            cols["s_c"] += r.s_c.tolist()
            cols["s_n"] += r.s_n.tolist()
            cols["s_p"] += [None if np.isnan(v) else v for v in r.s_p.tolist()]
        fields = [("item_id", pa.string()), ("benchmark", pa.string()), ("subset", pa.string()),
                  ("s_c", pa.float64()), ("s_n", pa.float64()), ("s_p", pa.float64())]
        if any(r.text_sims for r in self.results):  # only then: other files keep their six columns
            for k in TEXT_COLUMNS:
                cols[k] = [v for r in self.results
                           for v in (r.text_sims[k].tolist() if r.text_sims else [None] * len(r.item_ids))]
                fields.append((k, pa.float64()))
        blind_cols = list(dict.fromkeys(k for r in self.results for k in r.blind_scores))
        for k in blind_cols:
            cols[k] = [None if v is None or np.isnan(v) else v for r in self.results
                       for v in (r.blind_scores[k].tolist() if k in r.blind_scores else [None] * len(r.item_ids))]
            fields.append((k, pa.float64()))
        schema = pa.schema(fields,
                           metadata={b"hardpos.aggregate": json.dumps({r.name: r.aggregate for r in self.results}).encode(),
                                     b"hardpos.precision": self.precision.encode()})
        return pa.table(cols, schema=schema)



# --------------------------------------------------------------------------- benchmarks
def evaluate_loaded(model, preprocess: Callable, tokenizer: Callable, bench: Benchmark, *, device="cpu",
                    batch_size: int = 256, num_threads: int = 4, precision: Precision = "fp32",
                    image_encoder: Callable[[Sequence[ImageKey]], tuple[Any, dict[int, str]]] | None = None) -> BenchmarkResult:
    """Score one loaded benchmark (the core of :func:`evaluate_benchmarks`).

    ``image_encoder(keys) -> (features, failures)`` replaces the in-process image encoding
    (the Ray Data path plugs in here; it is built with its own ``precision``)."""
    items = bench.items
    key_index: dict[ImageKey, int] = {}
    cap_index: dict[str, int] = {}
    img_idx = np.empty(len(items), dtype=np.int64)
    c_idx = np.empty(len(items), dtype=np.int64)
    n_idx = np.empty(len(items), dtype=np.int64)
    p_idx = np.full(len(items), -1, dtype=np.int64)
    for j, it in enumerate(items):
        img_idx[j] = key_index.setdefault(it.image_key, len(key_index))
        c_idx[j] = cap_index.setdefault(it.caption, len(cap_index))
        n_idx[j] = cap_index.setdefault(it.negative, len(cap_index))
        if it.positive is not None:
            p_idx[j] = cap_index.setdefault(it.positive, len(cap_index))
    keys = list(key_index)
    with eval_mode(model):
        if image_encoder is not None:
            img_feats, failures = image_encoder(keys)
            img_feats = torch.as_tensor(np.asarray(img_feats), dtype=torch.float32)
        else:
            img_feats, failures = encode_image_keys(model, preprocess, keys, device=device, batch_size=batch_size,
                                                    num_threads=num_threads, precision=precision)
        txt_feats = encode_captions(model, tokenizer, list(cap_index), device=device, batch_size=batch_size,
                                    precision=precision)

    failed = np.zeros(len(keys), dtype=bool)
    failed[list(failures)] = True
    ok = ~failed[img_idx]
    I = img_feats[torch.as_tensor(img_idx[ok])]

    def sims(cap: np.ndarray) -> np.ndarray:
        return (I * txt_feats[torch.as_tensor(cap)]).sum(-1).double().numpy()

    s_c, s_n = sims(c_idx[ok]), sims(n_idx[ok])
    p_ok = p_idx[ok]
    has_p = p_ok >= 0
    s_p = np.full(int(ok.sum()), np.nan)
    if has_p.any():
        s_p[has_p] = (I[torch.as_tensor(has_p)] * txt_feats[torch.as_tensor(p_ok[has_p])]).sum(-1).double().numpy()
    item_ids = [it.item_id for it, keep in zip(items, ok) if keep]
    subsets = [it.subset for it, keep in zip(items, ok) if keep]
    uses = np.bincount(img_idx, minlength=len(keys))
    missing = [{"image": keys[i][0], "crop": list(keys[i][1]) if keys[i][1] else None, "error": err, "n_items": int(uses[i])}
               for i, err in sorted(failures.items())]
    result_metrics = benchmark_metrics(bench.name, subsets, s_c, s_n, s_p, bench.aggregate)
    text_sims: dict[str, np.ndarray] = {}
    if bench.kind == sugarcrepe_pp.KIND:
        # SugarCrepe++'s text-only task: cosines between the already-encoded captions. It needs
        # no image, so its figures cover every item, those whose image is missing included.
        all_sims = sugarcrepe_pp.text_similarities(txt_feats, c_idx, p_idx, n_idx)
        result_metrics.update(text_only_metrics(bench.name, [it.subset for it in items], all_sims, bench.aggregate))
        text_sims = {k: v[ok] for k, v in all_sims.items()}  # the scores file's rows: the scored items
    result_metrics[f"{bench.name}/n_missing_images"] = len(missing)
    result_metrics[f"{bench.name}/n_excluded_items"] = int((~ok).sum())
    return BenchmarkResult(
        name=bench.name, kind=bench.kind, aggregate=bench.aggregate, item_ids=item_ids, subsets=subsets,
        s_c=s_c, s_n=s_n, s_p=s_p, metrics=result_metrics, missing_images=missing,
        excluded_items=[it.item_id for it, keep in zip(items, ok) if not keep], rejected_rows=bench.rejected,
        n_distinct_images=len(keys), n_distinct_captions=len(cap_index), text_sims=text_sims,
        has_positives=bench.has_positives, items=list(items),
    )


def evaluate_benchmarks(model, preprocess: Callable, tokenizer: Callable, specs: Iterable[BenchmarkSpec], *,
                        device="cpu", batch_size: int = 256, num_threads: int = 4, precision: Precision = "fp32",
                        image_encoder: Callable | None = None) -> EvalReport:
    """Load and score every benchmark in ``specs``; returns the full :class:`EvalReport`.

    ``model`` is an open_clip model (DDP-wrapped is fine) already on ``device``; its
    train/eval mode is restored afterwards. ``preprocess`` is the validation transform.
    ``precision`` (fp32 by default, every device) is recorded on the report.
    Raises :class:`hardpos.eval.benchmarks.BenchmarkError` for unloadable benchmark files
    (before any encoding), never for unreadable images.
    """
    check_precision(precision)
    specs = list(specs)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"benchmark names must be unique (they prefix the metrics): {names}")
    loaded = [load_benchmark(s) for s in specs]  # fail on bad files before any encoding
    results = []
    for bench in loaded:
        started = time.perf_counter()
        res = evaluate_loaded(model, preprocess, tokenizer, bench, device=device, batch_size=batch_size,
                              num_threads=num_threads, precision=precision, image_encoder=image_encoder)
        seconds = time.perf_counter() - started
        progress.info("%s: %d items in %.1f s (%.1f items/s; %d distinct images, %d distinct captions)",
                      bench.name, len(bench.items), seconds, len(bench.items) / max(seconds, 1e-9),
                      res.n_distinct_images, res.n_distinct_captions)
        if res.missing_images:
            log.warning("%s: %d image(s) missing or corrupt, %d item(s) excluded", bench.name,
                        len(res.missing_images), len(res.excluded_items))
        results.append(res)
    return EvalReport(results, precision=precision)


def run_benchmarks(model, preprocess, tokenizer, specs: list[BenchmarkSpec], *, device="cpu", batch_size=256,
                   precision: Precision = "fp32") -> dict[str, float]:
    """Flat metrics for ``specs`` (the per-epoch evaluation API used by training).

    Keys: ``<name>/orig_acc``, ``<name>/aug_acc``, ``<name>/brittleness``, ``<name>/aug_drop``,
    ``<name>/mean_s_c``, ``<name>/mean_s_n``, ``<name>/mean_s_p``, ``<name>/n_items`` and per
    subset ``<name>/<subset>/...``; SugarCrepe has ``orig_acc`` and the means only. Values are
    fractions in [0, 1] (counts for ``n_*``).
    """
    return evaluate_benchmarks(model, preprocess, tokenizer, specs, device=device, batch_size=batch_size,
                               precision=precision).metrics
