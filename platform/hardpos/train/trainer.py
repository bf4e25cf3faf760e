"""The driver side of training: plan the steps, resolve paths, build the ``TorchTrainer``.

:func:`build_trainer` loads the model once on the driver (it validates the source early and
gives the open_clip transforms + tokenizer), builds the Ray Datasets
(:mod:`hardpos.train.data`), works out the step schedule from the row count
(:func:`plan_steps`) and returns a ``TorchTrainer`` running
:func:`hardpos.train.worker.train_loop_per_worker`. The caller fits it (the train stage,
:mod:`hardpos.train.stage`, is the one caller; a sweep trial runs that stage).

Metrics every worker reports (flat, stable names; a sweep ranks on them): ``loss/total``,
``loss/contrastive``, ``loss/hard_negative``, ``loss/hard_positive``, ``loss/pos_over_neg``,
``loss/kl`` (epoch means), ``val/loss`` (+ ``val/<term>``), eval metrics
(``replace/aug_acc`` ...), ``step``, ``epoch``, ``data/skipped_rows``,
``perf/samples_per_s`` and, after a resume, ``resumed_from_step``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import ray
import ray.train
from ray.train.torch import TorchConfig, TorchTrainer

from hardpos import logs, storage
from hardpos.config import ConfigError
from hardpos.config.paths import resolve_tracking_uri
from hardpos.models.clip import load_model
from hardpos.runtime import init_ray, resolve_output_dir
from hardpos.train.checkpoint import find_resume_checkpoint
from hardpos.train.config import TrainConfig
from hardpos.train.data import build_datasets
from hardpos.train.worker import StepHook, train_loop_per_worker

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Plan:
    """The step schedule the driver derives before starting workers."""

    train_rows: int
    val_rows: int
    steps_per_epoch: int
    total_steps: int
    global_batch: int


def plan_steps(train_rows: int, cfg: TrainConfig) -> tuple[int, int]:
    """(steps_per_epoch, total_steps): equal shards of ``rows // workers``, full batches only.

    Raises ConfigError when the rows do not fill one global batch.
    """
    per_worker = train_rows // cfg.scaling.num_workers
    spe = per_worker // cfg.batch_size
    if spe < 1:
        raise ConfigError(
            f"{train_rows} training rows are fewer than one global batch "
            f"({cfg.scaling.num_workers} workers x batch_size {cfg.batch_size}); lower batch_size")
    total = spe * cfg.epochs
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    return spe, total


def storage_location(cfg: TrainConfig) -> tuple[str, Any]:
    """(storage_path, storage_filesystem) for RunConfig (s3:// through pyarrow)."""
    uri = cfg.checkpoint.storage_path or storage.join(cfg.output_dir, "ray_train")
    if storage.is_s3(uri):
        # Ray Train's controller actor does not get the workers' runtime_env.
        fs, path = storage.arrow_filesystem(uri, for_workers=True)
        return path, fs
    Path(uri).mkdir(parents=True, exist_ok=True)
    return str(Path(uri).resolve()), None


def build_trainer(cfg: TrainConfig, *, callbacks: Sequence[Any] = (), run_logger=None,
                  step_hook: StepHook | None = None) -> tuple[TorchTrainer, Plan, TrainConfig]:
    """(TorchTrainer, Plan, resolved cfg) for ``cfg`` (starts Ray when needed; loads the
    model once on the driver).

    ``callbacks``: Ray Train callbacks (a sweep passes its Tune report callback).
    ``run_logger``: rank 0's picklable MLflow logger (None: no per-step tracking).
    ``step_hook``: picklable ``hook(step, rank, world_size)`` called on every worker after
    every step (tests inject faults with it; see :mod:`hardpos.train.worker`).
    """
    init_ray(cfg.ray)
    cfg = resolve_paths(cfg)
    lm = load_model(cfg.model, tracking_uri=cfg.tracking.tracking_uri)  # fail fast on a bad source
    image_size = lm.model.visual.image_size
    image_size = image_size[0] if isinstance(image_size, (tuple, list)) else int(image_size)
    datasets = build_datasets(cfg.data, lm.preprocess_train, lm.preprocess_val, lm.tokenizer, image_size,
                              batch_size=cfg.batch_size, env=storage.worker_env(include_tracking=False),
                              num_cpus=decode_task_cpus(cfg, ray.cluster_resources().get("CPU", 0.0)), seed=cfg.seed)
    spe, total = plan_steps(datasets.train_rows, cfg)
    plan = Plan(datasets.train_rows, datasets.val_rows, spe, total, cfg.batch_size * cfg.scaling.num_workers)
    storage_path, fs = storage_location(cfg)
    resources = {"CPU": cfg.scaling.cpus_per_worker, **cfg.scaling.resources_per_worker}
    if cfg.scaling.use_gpu:
        resources["GPU"] = 1
    env = storage.worker_env()
    run_config = ray.train.RunConfig(
        name=cfg.run_name or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
        storage_path=storage_path,
        storage_filesystem=fs,
        failure_config=ray.train.FailureConfig(max_failures=cfg.fault.max_failures),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.num_to_keep),
        callbacks=list(callbacks) or None,
        worker_runtime_env={"env_vars": env} if env else None,
        logging_config=ray.train.LoggingConfig(log_level=logs.train_log_level(cfg.log_level)),
    )
    ds_map = {"train": datasets.train}
    if datasets.val is not None:
        ds_map["val"] = datasets.val
    resume = find_resume_checkpoint(cfg.resume_from) if cfg.resume_from else None
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cfg": cfg, "run_logger": run_logger, "steps_per_epoch": spe, "total_steps": total,
                           "has_val": datasets.val is not None, "resume_from": resume, "step_hook": step_hook},
        torch_config=TorchConfig(backend="nccl" if cfg.scaling.use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.scaling.num_workers, use_gpu=cfg.scaling.use_gpu,
                                               resources_per_worker=resources),
        run_config=run_config,
        datasets=ds_map,
    )
    return trainer, plan, cfg


def decode_task_cpus(cfg: TrainConfig, cluster_cpus: float, reserved_cpus: float = 0.0) -> float:
    """CPUs per Ray Data decode task: ``data.decode_cpus`` when set; else 1, or what the
    training workers and ``reserved_cpus`` (a sweep's trial driver) leave of
    ``cluster_cpus`` when that is less. A decode task asking for more than is left is
    never scheduled: the workers then wait for data forever (seen in a sweep on 2 CPUs:
    0.5 driver + 2 x 0.5 workers left 0.5 for 1-CPU decode tasks). When nothing is left
    (an autoscaling cluster before its nodes join), 1 with a warning.
    """
    if cfg.data.decode_cpus is not None:
        return float(cfg.data.decode_cpus)
    workers = cfg.scaling.num_workers * cfg.scaling.cpus_per_worker
    free = cluster_cpus - reserved_cpus - workers
    if free >= 1.0:
        return 1.0
    if free >= 0.01:
        return math.floor(free * 100) / 100
    log.warning("the cluster's %.2f CPUs leave none for data decoding beside %d workers x %.2f CPUs%s: decode "
                "tasks wait for a node with a free CPU (lower scaling.cpus_per_worker or set data.decode_cpus)",
                cluster_cpus, cfg.scaling.num_workers, cfg.scaling.cpus_per_worker,
                f" and {reserved_cpus:g} reserved" if reserved_cpus else "")
    return 1.0


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """Absolute local paths and the resolved MLflow tracking URI (``models:/`` / ``runs:/``
    sources resolve there): Ray workers do not share the driver's working directory."""

    def absolute(p: str | None) -> str | None:
        if p is None or storage.is_s3(p) or "://" in p or ":/" in p:
            return p
        return str(Path(p).expanduser().resolve())

    pretrained = cfg.model.pretrained
    if pretrained and Path(pretrained).expanduser().exists():
        pretrained = absolute(pretrained)
    return dataclasses.replace(
        cfg,
        output_dir=resolve_output_dir(cfg.output_dir),
        model=dataclasses.replace(cfg.model, pretrained=pretrained),
        data=dataclasses.replace(cfg.data, train_path=absolute(cfg.data.train_path), val_path=absolute(cfg.data.val_path),
                                 image_root=absolute(cfg.data.image_root)),
        checkpoint=dataclasses.replace(cfg.checkpoint, storage_path=absolute(cfg.checkpoint.storage_path)),
        resume_from=absolute(cfg.resume_from),
        tracking=dataclasses.replace(cfg.tracking, tracking_uri=resolve_tracking_uri(cfg.tracking.tracking_uri)),
    )
