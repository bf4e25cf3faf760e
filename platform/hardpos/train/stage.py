"""Finetune an open_clip CLIP on triplets with the combined hard-negative + hard-positive
loss, on Ray Train (TorchTrainer, DDP; gloo on CPU, NCCL on GPU).

Writes <output_dir>/model (the final checkpoint, open_clip local-dir format), Ray Train's
checkpoints under checkpoint.storage_path (default <output_dir>/ray_train), logs per-step
loss terms and per-epoch validation/benchmark metrics to MLflow, and logs the final model
as the MLflow model `model` of this run (load it with pretrained=runs:/<run_id>/model).
A `models:/` or `runs:/` model.pretrained is looked up in tracking.tracking_uri, on the
driver and on every Ray Train worker (the resolved URI travels in the config).
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from hardpos import preflight, storage, tracking
from hardpos.eval.benchmarks import check_spec
from hardpos.rules.lexicon import SEEN_SUBSTITUTIONS_TAG
from hardpos.models import weights
from hardpos.runtime import JobContext
from hardpos.train.config import TrainConfig as Config

if TYPE_CHECKING:
    from hardpos.train.worker import StepHook

log = logging.getLogger(__name__)


def _numeric(metrics: dict[str, Any] | None) -> dict[str, float]:
    return tracking.numeric_metrics(metrics or {})


def _checkpoint_uri(checkpoint) -> str:
    """A Ray Checkpoint's location as a URI (pyarrow S3 paths carry no scheme)."""
    fs = getattr(checkpoint, "filesystem", None)
    if fs is not None and getattr(fs, "type_name", "") == "s3":
        return f"s3://{checkpoint.path}"
    return str(checkpoint.path)


def seen_substitutions(train_path: str) -> str | None:
    """"replace" when the triplets were made with the REPLACE benchmark's own substitutions,
    read from the ``summary.json`` the generate / perturb stage wrote beside them (None when
    there is none, e.g. a user's own file: nothing is known then)."""
    if not train_path or storage.has_glob(train_path):
        return None
    path = train_path.rstrip("/")
    folder = path.rsplit("/", 1)[0] if "/" in path else "."
    # beside a triplet file, or inside a folder of them
    candidates = [storage.join(folder, "summary.json")] + ([storage.join(path, "summary.json")] if "." not in path.rsplit("/", 1)[-1] else [])
    for uri in candidates:
        try:
            summary = storage.read_json(uri) if storage.exists(uri) else None
        except Exception:  # noqa: BLE001 - a summary that cannot be read says nothing about the data
            summary = None
        if isinstance(summary, dict) and "include_benchmark_pairs" in summary:
            return "replace" if summary["include_benchmark_pairs"] else None
    return None


def result_line(steps: int, metrics: dict[str, float], final_dir: str) -> str:
    """The stage's console line: the losses it has (no validation split: no val/loss, never
    a ``nan`` standing in for a figure that does not exist)."""
    figures = [f"{label} {metrics[key]:.4f}" for key, label in (("loss/total", "final loss/total"), ("val/loss", "val/loss"))
               if key in metrics]
    return f"trained {steps} steps" + (f"; {', '.join(figures)}" if figures else "") + f"; model: {final_dir}"


def check_data(cfg: Config, *, allow_empty: bool, key_prefix: str = "") -> None:
    """What the workers read: the triplet files (exist, not empty unless ``allow_empty``, the
    triplet columns, a first image that opens) and the per-epoch benchmarks. The sweep checks its
    trials' shared train config with this once (``key_prefix="train_overrides."``)."""
    data = cfg.data
    preflight.check_table(f"{key_prefix}data.train_path", data.train_path, columns=preflight.TRIPLET_COLUMNS,
                          what="triplet file", allow_empty=allow_empty, image_root=data.image_root)
    if data.val_path:
        preflight.check_table(f"{key_prefix}data.val_path", data.val_path, columns=preflight.TRIPLET_COLUMNS,
                              what="triplet file", allow_empty=True, image_root=data.image_root)
    for i, spec in enumerate(cfg.eval_benchmarks):
        check_spec(f"{key_prefix}eval_benchmarks.{i}", spec, allow_empty=allow_empty)


def check(cfg: Config) -> None:
    """Before any work, cheapest first: the S3 endpoint, the triplet files and benchmarks, the
    tracking server, then the model's weights."""
    preflight.check_s3_endpoint([cfg.data.train_path, cfg.data.val_path, cfg.model.pretrained, cfg.output_dir])
    check_data(cfg, allow_empty=cfg.allow_empty)
    tracking.check_tracking(cfg.tracking)
    weights.check_model("model", cfg.model.arch, cfg.model.pretrained)


def run(cfg: Config, ctx: JobContext, callbacks: Sequence[Any] = (), step_hook: StepHook | None = None) -> dict:
    """Train, export the final checkpoint to <output_dir>/model, log it as an MLflow model.

    ``callbacks``: extra Ray Train callbacks (the sweep passes its Tune report callback, so a
    sweep trial is this exact function, not a copy of it).
    ``step_hook``: called on every worker after every step (tests inject faults with it;
    see :func:`hardpos.train.trainer.build_trainer`).
    """
    # lazy: the CLI imports this module for its Config (--help, checks) before anything runs;
    # torch and Ray Train load here, once the job starts
    from hardpos.train.checkpoint import MODEL_DIR
    from hardpos.train.trainer import build_trainer

    trainer, plan, cfg = build_trainer(cfg, callbacks=callbacks, run_logger=ctx.run, step_hook=step_hook)
    seen = seen_substitutions(cfg.data.train_path)
    if ctx.run is not None:
        ctx.run.log_params({"plan": vars(plan)})
        if seen:
            ctx.run.set_tags({SEEN_SUBSTITUTIONS_TAG: seen})
    result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(f"training failed: {result.error}") from result.error
    if result.checkpoint is None:
        raise RuntimeError("training finished without a checkpoint (no step was trained?)")
    final_dir = ctx.path(MODEL_DIR)
    model_uri, model_deferred = None, False
    with result.checkpoint.as_directory() as ckpt_dir:
        src = Path(ckpt_dir) / MODEL_DIR
        with tempfile.TemporaryDirectory(prefix="hardpos-final-") as tmp:
            local = Path(tmp) / MODEL_DIR
            shutil.copytree(src, local)
            if storage.is_s3(final_dir) or Path(final_dir).resolve() != local.resolve():
                if not storage.is_s3(final_dir) and Path(final_dir).exists():
                    shutil.rmtree(final_dir)
                storage.upload_dir(local, final_dir)
            if ctx.run is not None:
                model_uri, model_deferred = ctx.run.log_model(local, durable_dir=final_dir)
    metrics = _numeric(result.metrics)
    steps = int(metrics.get("step", 0))
    summary = {
        "final_metrics": {k: v for k, v in metrics.items() if k not in ("step", "epoch")},
        "checkpoint": final_dir,
        "ray_checkpoint": _checkpoint_uri(result.checkpoint),
        "model_uri": model_uri,
        "model_deferred": model_deferred,
        "steps": steps,
        "epochs": int(metrics.get("epoch", 0)),
        "steps_per_epoch": plan.steps_per_epoch,
        "total_steps": plan.total_steps,
        "global_batch": plan.global_batch,
        "train_rows": plan.train_rows,
        "val_rows": plan.val_rows,
        "samples_per_s": metrics.get("perf/samples_per_s", 0.0),
        "seen_substitutions": seen,
    }
    print(result_line(steps, metrics, final_dir))
    return summary
