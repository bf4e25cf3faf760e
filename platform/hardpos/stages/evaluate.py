"""Evaluate any loadable model on REPLACE / SWAP / SugarCrepe / synthetic / custom triplet
benchmarks (the paper's exact metrics) and optional zero-shot retention; writes
summary.json, scores.parquet (per item), report.md (paper Table 1 layout),
missing_images.json and logs every figure to MLflow under stable names
(``replace/aug_acc``, ``swap/brittleness``, ``zeroshot/<name>/top1`` ...).

Beside the model, every benchmark and subset gets its blind baselines (``blind``): the
figures text-only models reach with no image (:mod:`hardpos.audit.baselines`: a word n-gram
classifier and a caption language model, cross-fitted by caption; the pair measure, and with
hard positives the augmented accuracy and brittleness, each with a 95% interval). They depend
on the benchmark's texts only, so they are computed once per benchmark in a process; they are
in summary.json (``blind``), report.md, scores.parquet (``blind_<model>_c/_n/_p``) and MLflow
(``blind/<benchmark>/<subset>/<model>/<figure>``, overall ``blind/<benchmark>/<model>/<figure>``).

Example:
    python jobs/evaluate.py model.pretrained=outputs/train/checkpoint \\
        world_dir=outputs/world output_dir=outputs/eval
    python jobs/evaluate.py --config jobs/configs/evaluate_paper.yaml \\
        'benchmarks=[{name: replace, kind: replace, path: /data/hard_positives, image_root: /data/vg}]'
"""
from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hardpos import preflight, storage, tracking
from hardpos.audit.config import BlindSettings
from hardpos.config import ConfigError, JobConfig, ModelConfig, TrackingConfig, require
from hardpos.config.paths import resolve_tracking_uri
from hardpos.rules.lexicon import SEEN_SUBSTITUTIONS_TAG
from hardpos.eval.items import BenchmarkError
from hardpos.eval.benchmarks import check_benchmarks
from hardpos.eval.model_eval import evaluate_model, resolve_device, resolve_specs
from hardpos.eval.spec import BenchmarkSpec, Precision, RayDataConfig, RetentionConfig
from hardpos.models import weights
from hardpos.models.uri import source_run_tags
from hardpos.runtime import JobContext, init_ray

if TYPE_CHECKING:
    from hardpos.eval.evaluator import EvalReport

# The CLI imports this module for its Config (--help, the checks before a job starts): torch,
# open_clip and Ray load inside the functions that use them (`# lazy:` below), once a job runs.

log = logging.getLogger(__name__)

@dataclasses.dataclass
class Config(JobConfig):
    """Evaluation job.

    model: which model (arch + pretrained: open_clip tag, checkpoint path, s3://, models:/, runs:/).
    model_name: label of the model in report.md (None: the pretrained source or "random <arch>").
    benchmarks: list of {name, kind: replace|swap|sugarcrepe|sugarcrepe_pp|triplets, path, image_root, limit,
        cache_dir}; a triplets path may also be webdataset .tar shards or parquet with inline
        image bytes (a file, folder or glob; read by Ray Data).
    world_dir: a synthetic world folder; adds
        world_replace_attribute, world_replace_relation and world_swap from
        <world_dir>/benchmark/*.parquet (files that are absent are an error), and the same
        REPLACE items with the synonyms finetuning saw as world_replace_*_seen (where the
        folder has them).
    device: "auto" (CUDA when available), "cpu", "cuda", "cuda:1" ...
    precision: the encoders' arithmetic: "fp32" (default, on every device; no TF32 on CUDA)
        or "bf16" / "fp16" autocast (faster on GPUs; scores move by ~1e-3, which flipped 1% of
        REPLACE decisions for a random ViT-B-32, and ties count against the model);
        recorded in summary.json, report.md, scores.parquet metadata and the MLflow params.
    batch_size: images / captions per forward pass.
    num_threads: image decoding threads (local engine).
    engine: "local" (this process) or "ray_data" (image encoding as Ray Data map_batches over
        model actors; see ray_data).
    ray_data: actors for engine=ray_data (concurrency, batch_size, num_cpus, num_gpus).
    retention: zero-shot classification / retrieval datasets.
    max_missing_fraction: fail the job when more than this fraction of a benchmark's items
        had to be excluded for missing/corrupt images (1.0: never fail, only report).
    blind: the blind baselines beside every benchmark (text-only models, no image; enabled,
        models, seed, min_items, and ``text_models``: the models' settings and folds, the same
        section as in ``hardpos audit`` and ``hardpos debias``).
    """

    output_dir: str = "outputs/evaluate"
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-evaluate"))
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    model_name: str | None = None
    benchmarks: list[BenchmarkSpec] = dataclasses.field(default_factory=list)
    world_dir: str | None = None
    device: str = "auto"
    precision: Precision = "fp32"
    batch_size: int = 256
    num_threads: int = 4
    engine: Literal["local", "ray_data"] = "local"
    ray_data: RayDataConfig = dataclasses.field(default_factory=RayDataConfig)
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    max_missing_fraction: float = 1.0
    blind: BlindSettings = dataclasses.field(default_factory=BlindSettings)

    def __post_init__(self) -> None:
        require(self.batch_size >= 1, "batch_size", "must be >= 1", self.batch_size)
        require(self.num_threads >= 1, "num_threads", "must be >= 1", self.num_threads)
        require(0.0 <= self.max_missing_fraction <= 1.0, "max_missing_fraction", "must be in [0, 1]",
                self.max_missing_fraction)


def needs_ray_reader(specs: list[BenchmarkSpec]) -> bool:
    """True when a benchmark is read by Ray Data (webdataset shards, inline-image parquet)."""
    from hardpos.eval.inline import is_inline_source  # lazy: imports Ray (see the module's imports)

    try:
        return any(s.kind == "triplets" and is_inline_source(s.path) for s in specs)
    except BenchmarkError as exc:
        raise ConfigError(str(exc)) from exc


def blind_baselines(report: EvalReport, settings: BlindSettings) -> dict[str, Any] | None:
    """The blind baselines of every benchmark in ``report`` (None when ``settings`` turn them
    off): ``{"models": {name: how it was fit}, "rows": [...], "metrics": {blind/...: value}}``.
    Each result gets its scored items' text-only scores (``blind_scores``, the scores.parquet
    columns). Every item of a benchmark counts, its image read or not (no image is used)."""
    # lazy: see the module's imports; the text models load scikit-learn
    import numpy as np

    from hardpos.audit.baselines import blind_baseline, flat_metrics
    from hardpos.eval.outputs import blind_columns

    if not settings.enabled:
        return None
    rows: list[dict[str, Any]] = []
    models: dict[str, str] = {}
    metrics: dict[str, float] = {}
    for r in report.results:
        if not r.items:
            continue
        started = time.perf_counter()
        base = blind_baseline(r.name, r.items, r.aggregate, settings)
        log.info("%s: blind baselines in %.1f s", r.name, time.perf_counter() - started)
        rows += base.rows()
        models.update(base.models)
        metrics.update(flat_metrics(base))
        where = {item_id: k for k, item_id in enumerate(base.item_ids)}
        idx = np.asarray([where[i] for i in r.item_ids], dtype=np.int64)
        for model, scores in base.scores.items():
            r.blind_scores.update({col: s[idx] for col, s in zip(blind_columns(model), scores)})
    return {"models": models, "rows": rows, "metrics": metrics}


def check(cfg: Config) -> None:
    """Before any work, cheapest first: the S3 endpoint, the world folder and benchmark files,
    the tracking server, then the model's weights."""
    specs = list(cfg.benchmarks)
    preflight.check_s3_endpoint([s.path for s in specs] + [cfg.model.pretrained, cfg.world_dir, cfg.output_dir])
    check_benchmarks(specs, cfg.world_dir, cfg.allow_empty)
    tracking.check_tracking(cfg.tracking)
    weights.check_model("model", cfg.model.arch, cfg.model.pretrained)


def run(cfg: Config, ctx: JobContext) -> dict:
    # lazy: see the module's imports
    import torch

    from hardpos.eval import outputs
    from hardpos.eval.distributed import ray_image_encoder
    from hardpos.models.clip import load_model

    specs = resolve_specs(cfg.benchmarks, cfg.world_dir, cfg.retention)
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)  # random-weight models are reproducible from the seed
    lm = load_model(cfg.model, device=device, tracking_uri=cfg.tracking.tracking_uri)  # MLflow sources: this job's store
    model_name = cfg.model_name or (cfg.model.pretrained or f"random {lm.arch}")
    # a model trained on REPLACE's own substitutions: its REPLACE numbers are contaminated
    seen = source_run_tags(cfg.model.pretrained or "", resolve_tracking_uri(cfg.tracking.tracking_uri)).get(
        SEEN_SUBSTITUTIONS_TAG)
    if seen:
        model_name += " [seen substitutions: REPLACE numbers contaminated]"
        if ctx.run is not None:
            ctx.run.set_tags({SEEN_SUBSTITUTIONS_TAG: seen})

    image_encoder = None
    if cfg.engine == "ray_data" or needs_ray_reader(specs):
        init_ray(cfg.ray)  # this job's Ray settings, not a default local Ray started by Ray Data
    if cfg.engine == "ray_data":
        image_encoder = ray_image_encoder(lm.model, lm.arch, lm.model_cfg, cfg.ray_data, device=cfg.device,
                                          precision=cfg.precision)

    started = time.time()
    report, retention = evaluate_model(lm.model, lm, specs, device=device, batch_size=cfg.batch_size,
                                       num_threads=cfg.num_threads, precision=cfg.precision, retention=cfg.retention,
                                       image_encoder=image_encoder)
    bench_s = time.time() - started  # benchmarks and retention

    metrics = {**report.metrics, **retention}
    blind = blind_baselines(report, cfg.blind)
    paths = outputs.write_outputs(report, ctx.output_dir, model_name=model_name, retention=retention, device=device,
                                  blind=blind)
    ctx.log_metrics({**metrics, **(blind["metrics"] if blind else {})})
    if ctx.run is not None:
        with tempfile.TemporaryDirectory() as tmp:  # artifacts from local copies (output_dir may be s3://)
            for uri in paths.values():
                local = Path(tmp) / uri.rsplit("/", 1)[-1]
                local.write_bytes(storage.read_bytes(uri))
                ctx.log_artifact(local)

    benchmarks = {}
    for r in report.results:
        n_total = len(r.item_ids) + len(r.excluded_items)
        benchmarks[r.name] = {
            "kind": r.kind, "aggregate": r.aggregate, "n_items": len(r.item_ids), "n_excluded_items": len(r.excluded_items),
            "n_missing_images": len(r.missing_images), "n_rejected_rows": len(r.rejected_rows),
            "n_distinct_images": r.n_distinct_images, "n_distinct_captions": r.n_distinct_captions,
        }
        if n_total and len(r.excluded_items) / n_total > cfg.max_missing_fraction:
            raise RuntimeError(f"{r.name}: {len(r.excluded_items)} of {n_total} items lost their image "
                               f"(> max_missing_fraction={cfg.max_missing_fraction}); see {paths['missing_images']}")
    print(outputs.markdown_report(report, model_name, retention, device=device, blind=blind).split("## Missing")[0])
    return {"model": model_name, "seen_substitutions": seen, "device": device, "precision": cfg.precision, "engine": cfg.engine,
            "benchmark_seconds": round(bench_s, 3),
            "metrics": metrics, "blind": blind, "benchmarks": benchmarks, "files": paths}
