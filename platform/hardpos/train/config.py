"""The train stage's configuration: :class:`TrainConfig` and its sections.

Pure dataclasses (no torch, no Ray): loading a config or printing ``--help`` imports nothing
heavy. Every field is documented in its class docstring; ``__post_init__`` rejects values
no run could use, with the field's name in the message.

Test-only fault injection is not configuration: tests pass a ``step_hook`` to
:func:`hardpos.train.trainer.build_trainer` (see :mod:`hardpos.train.worker`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

from hardpos.config import JobConfig, ModelConfig, TrackingConfig, require
from hardpos.eval.spec import BenchmarkSpec


@dataclasses.dataclass
class DataConfig:
    """Where the triplets come from and how they are split and shuffled.

    train_path: triplet file (.parquet / .jsonl; image paths, or the image bytes inline in a
        binary column), webdataset .tar shards, a folder of such files or a glob
        (``shards/*.tar``); local or s3://.
    val_path: a separate validation triplet file; None -> hold out ``val_fraction`` of
        ``train_path`` (by a stable hash of the image path).
    val_fraction: share of ``train_path`` held out for the per-epoch validation loss when
        ``val_path`` is None (0 disables validation).
    image_root: folder relative image paths are resolved against (None: the triplet
        file's own folder).
    limit: use only the first N rows of ``train_path`` (None: all); for smoke runs.
    shuffle_buffer: rows in each worker's local shuffle buffer (0: no shuffling).
    decode_cpus: CPUs each Ray Data decode/preprocess task asks for; None: 1, or the CPUs
        the training workers (and a sweep's trial driver) leave free when that is less, so
        a decode task can always be scheduled (see ``hardpos.train.trainer.decode_task_cpus``).
    fetch_threads: threads per decode task fetching the images rows name (local, s3://,
        http(s)://) concurrently.
    positive_kinds: train with the hard positives of these kinds only (the triplet's ``kind``:
        ``replace``, ``swap``); a row whose positive is of another kind keeps its caption and
        hard negative and loses its positive (masked, as a row without one). None: every
        positive. The paper's Table 1(d): ``[replace]`` or ``[swap]``.
    """

    train_path: str = "outputs/world/finetune.parquet"
    val_path: str | None = None
    val_fraction: float = 0.05
    image_root: str | None = None
    limit: int | None = None
    shuffle_buffer: int = 512
    decode_cpus: float | None = None
    fetch_threads: int = 16
    positive_kinds: list[str] | None = None

    def __post_init__(self) -> None:
        require(self.positive_kinds is None or (len(self.positive_kinds) > 0 and all(
            isinstance(k, str) and k.strip() for k in self.positive_kinds)), "positive_kinds",
            "must be null (every positive) or a non-empty list of kinds, e.g. [replace] or [swap]", self.positive_kinds)
        require(self.fetch_threads >= 1, "fetch_threads", "must be >= 1", self.fetch_threads)
        require(self.decode_cpus is None or self.decode_cpus > 0, "decode_cpus",
                "must be > 0 (or null for automatic)", self.decode_cpus)
        require(0.0 <= self.val_fraction < 1.0, "val_fraction", "must be in [0, 1)", self.val_fraction)
        require(self.shuffle_buffer >= 0, "shuffle_buffer", "must be >= 0", self.shuffle_buffer)


@dataclasses.dataclass
class LossConfig:
    """Weights and switches of the combined loss (see the module docstring).

    w_pos: weight of the hard-positive (analogy) term; the paper fixes 1 (0 = "HN-only").
    w_neg: weight of the hard-negative 2-way term; the paper sweeps {0, .25, .5, .75, 1}.
        0 = no hard negatives at all: no 2-way term AND no NegCLIP columns (the paper's
        "0 HN" row is trained on hard positives only).
    w_pos_over_neg: weight of the optional positive-over-negative 2-way term (default off;
        needs hard negatives, so it must stay 0 when w_neg is 0).
    w_kl: weight of SVLC's optional KL(uniform || softmax[<I,T>, <I,P>]) term (default off).
    negclip_columns: when w_neg > 0, also add the valid hard negatives as extra text columns
        of the contrastive image->text term (NegCLIP, unweighted; TSVLC does this only in a
        single process). False = plain CLIP contrastive whatever w_neg is, which is what the
        paper ran on 4 GPUs. Ignored when w_neg is 0.
    analogy_scope: which positives the hard-positive term's rows are scored against:
        ``global`` (the whole gathered batch) or ``worker`` (only the row's own worker's
        batch, as TSVLC computes it per GPU). Identical on one worker.
    gather_with_grad: how the features of several workers are gathered for the batch-wide
        terms. True (default): with gradient, so the update is exactly the full global
        batch's loss. False: as TSVLC (open_clip's ``gather_with_grad=False``): each worker's
        contrastive gradient reaches only its own rows, so after DDP averages the gradients
        the contrastive term weighs 1/W of its full-batch gradient (W workers) while the
        hard-negative, hard-positive and other terms keep their full weight. The loss values
        are the same either way; only the gradient differs. Identical on one worker.
    """

    w_pos: float = 1.0
    w_neg: float = 1.0
    w_pos_over_neg: float = 0.0
    w_kl: float = 0.0
    negclip_columns: bool = True
    analogy_scope: Literal["global", "worker"] = "global"
    gather_with_grad: bool = True

    def __post_init__(self) -> None:
        require(self.analogy_scope in ("global", "worker"), "analogy_scope",
                "must be 'global' (the whole batch) or 'worker' (each worker's own rows, as TSVLC)",
                self.analogy_scope)
        for name in ("w_pos", "w_neg", "w_pos_over_neg", "w_kl"):
            value = getattr(self, name)
            require(math.isfinite(value) and value >= 0, name, "must be a finite number >= 0", value)
        require(not (self.w_neg == 0 and self.w_pos_over_neg != 0), "w_pos_over_neg",
                "must be 0 when w_neg is 0 (it reads the hard negatives, and w_neg=0 means training without "
                "them; set w_neg > 0 or w_pos_over_neg=0)", self.w_pos_over_neg)

    @property
    def uses_negatives(self) -> bool:
        """True when hard negatives reach the loss at all (``w_neg > 0``)."""
        return self.w_neg > 0

    @property
    def negative_columns(self) -> bool:
        """True when the contrastive term gets the NegCLIP columns (negatives in use and switched on)."""
        return self.negclip_columns and self.uses_negatives


@dataclasses.dataclass
class LoraSection:
    """LoRA finetuning (:mod:`hardpos.train.lora`): low-rank adapters on the chosen weights,
    everything else frozen; the saved model has them merged (a plain open_clip checkpoint).

    rank: the adapters' rank r; 0 = full finetuning (every parameter trains). TSVLC, the
        paper's training code, ran ``--lora 4``.
    alpha: the update is ``(alpha / rank) * B @ A``; TSVLC's loralib default is 1.
    targets: which weights get an adapter: ``attn`` (each block's packed q/k/v input
        projection and its output projection), ``mlp`` (``c_fc``, ``c_proj``), ``patch``
        (the image tower's patch embedding). TSVLC: all three.
    towers: ``visual`` and/or ``text``. TSVLC: both.
    """

    rank: int = 0
    alpha: float = 1.0
    targets: list[str] = dataclasses.field(default_factory=lambda: ["attn", "mlp", "patch"])
    towers: list[str] = dataclasses.field(default_factory=lambda: ["visual", "text"])

    def __post_init__(self) -> None:
        require(self.rank >= 0, "rank", "must be >= 0 (0: full finetuning)", self.rank)
        require(math.isfinite(self.alpha) and self.alpha > 0, "alpha", "must be a finite number > 0", self.alpha)
        known_t, known_w = ("attn", "mlp", "patch"), ("visual", "text")
        require(bool(self.targets) and all(t in known_t for t in self.targets), "targets",
                f"must be a non-empty list of {list(known_t)}", self.targets)
        require(bool(self.towers) and all(t in known_w for t in self.towers), "towers",
                f"must be a non-empty list of {list(known_w)}", self.towers)

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclasses.dataclass
class OptimConfig:
    """AdamW + warmup/cosine schedule.

    lr: peak learning rate (the paper: 5e-6 for ViT-B-32 from OpenAI weights).
    weight_decay: applied to weight matrices only (not gains, biases, logit_scale).
    beta1, beta2, eps: AdamW parameters.
    warmup_steps: linear warmup from 0 to ``lr``; then cosine decay to 0 at the last step.
    grad_clip: max global gradient norm (0 disables clipping).
    fused: torch's fused AdamW kernel (CPU and CUDA) instead of a per-parameter loop; the
        same update up to float rounding (see :func:`hardpos.train.step.build_optimizer`).
    """

    lr: float = 1e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    warmup_steps: int = 10
    grad_clip: float = 1.0
    fused: bool = True


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
    model: the model to finetune (see hardpos.config.ModelConfig).
    data: triplet files and the validation split (see DataConfig above).
    loss: weights of the combined loss (see LossConfig above; the loss itself: hardpos.train.loss).
    lora: LoRA finetuning (rank 0, the default: full finetuning; see LoraSection above).
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
    lora: LoraSection = dataclasses.field(default_factory=LoraSection)
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
