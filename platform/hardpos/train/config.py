"""The train stage's configuration: :class:`TrainConfig` and its sections.

Pure dataclasses (no torch, no Ray): loading a config or printing ``--help`` imports nothing
heavy. Every field is documented in its class docstring; ``__post_init__`` rejects values
no run could use, with the field's name in the message.

Test-only fault injection is not configuration: tests pass a ``step_hook`` to
:func:`hardpos.train.trainer.build_trainer` (see :mod:`hardpos.train.worker`).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from hardpos.config import JobConfig, TrackingConfig, require
from hardpos.eval.spec import BenchmarkSpec
from hardpos.model import ModelConfig
from hardpos.train.data import DataConfig
from hardpos.train.loss import LossConfig
# OptimConfig lives beside build_optimizer, as LossConfig beside the loss: the GPU suite
# (hardpos.perf.gpu_standalone) builds the optimiser without importing the data pipeline.
from hardpos.train.step import OptimConfig


@dataclasses.dataclass
class ScalingSection:
    """Ray Train workers.

    num_workers: data-parallel workers (one process each; one GPU each when use_gpu).
    use_gpu: train on GPUs (NCCL, bf16 autocast) instead of CPUs (gloo, fp32).
    cpus_per_worker: CPUs reserved per worker. Keep it below the machine's CPUs divided by
        num_workers so Ray Data's decode tasks still get a CPU (0.5 on a 2-core laptop).
    resources_per_worker: extra custom resources per worker (e.g. {"accelerator_type:A100": 0.01}).
    """

    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 0.5
    resources_per_worker: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class CheckpointSection:
    """Where and how often checkpoints are written.

    storage_path: Ray Train storage (local folder or s3://bucket/prefix); None ->
        ``<output_dir>/ray_train``.
    num_to_keep: newest checkpoints kept (None: all).
    every_steps: also checkpoint every N steps inside an epoch (0: only at epoch ends).
    """

    storage_path: str | None = None
    num_to_keep: int | None = 2
    every_steps: int = 0


@dataclasses.dataclass
class FaultSection:
    """Failure handling.

    max_failures: worker-group restarts Ray Train may do; each resumes from the latest checkpoint.
    """

    max_failures: int = 2


@dataclasses.dataclass
class TrainConfig(JobConfig):
    """Finetune an open_clip CLIP on triplets with the combined loss on Ray Train.

    output_dir: the stage writes summary.json, model/ (final checkpoint) and, unless
        checkpoint.storage_path is set, ray_train/ (Ray Train's checkpoints) here.
    model: the model to finetune (see hardpos.model.ModelConfig).
    data: triplet files and the validation split (see hardpos.train.data.DataConfig).
    loss: weights of the combined loss (see hardpos.train.loss.LossConfig).
    optim: AdamW and the LR schedule.
    scaling: Ray Train workers and resources.
    checkpoint: checkpoint storage and frequency.
    fault: how many worker-group failures Ray Train recovers from.
    epochs: passes over the training split.
    batch_size: samples per worker per step (global batch = batch_size * num_workers).
    max_steps: stop after this many global steps (None: epochs * steps_per_epoch).
    precision: auto (bf16 autocast on GPU, fp32 on CPU), fp32 or bf16.
    log_every: log per-step loss terms to MLflow every N steps (rank 0).
    eval_benchmarks: benchmarks evaluated on rank 0 after every epoch (metrics like
        replace/aug_acc); a validation loss is computed every epoch regardless.
    eval_batch_size: batch size of the per-epoch benchmark evaluation.
    resume_from: start from this checkpoint (a checkpoint folder with train_state.pt, or
        a Ray Train run folder: its latest checkpoint); local or s3://.
    run_name: Ray Train run name (None: train-<timestamp>-<random>); reusing a name in the
        same storage_path makes Ray Train continue that run.
    """

    output_dir: str = "outputs/train"
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-train"))
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    scaling: ScalingSection = dataclasses.field(default_factory=ScalingSection)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    fault: FaultSection = dataclasses.field(default_factory=FaultSection)
    epochs: int = 2
    batch_size: int = 32
    max_steps: int | None = None
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    log_every: int = 10
    eval_benchmarks: list[BenchmarkSpec] = dataclasses.field(default_factory=list)
    eval_batch_size: int = 256
    resume_from: str | None = None
    run_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "log_every"):
            require(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        require(self.scaling.num_workers >= 1, "scaling.num_workers", "must be >= 1", self.scaling.num_workers)
        require(self.max_steps is None or self.max_steps >= 1, "max_steps", "must be >= 1 or null", self.max_steps)
