"""CLIP finetuning on Ray Train (TorchTrainer, DDP) with the combined loss.

Driver (:func:`fit`): load the model once (validates the source early and gives the
open_clip transforms + tokenizer), build the Ray Datasets (:mod:`hardpos.train.data`),
work out the step schedule from the row count, and fit a ``TorchTrainer``.

Workers (:func:`train_loop_per_worker`), per step: one forward through the DDP-wrapped
:class:`TripletCLIP` (images + captions + valid negatives + valid positives; the text tower
runs once on all three, trimmed to the batch's longest text), masked cross-rank gather
with gradient (:func:`hardpos.train.loss.gather_features`), the combined loss, backward,
gradient clipping, AdamW step (decay on weight matrices only), warmup + cosine LR, and
``logit_scale`` clamped to [0, ln 100].

Checkpoints (``model/`` in the open_clip local-dir format + ``train_state.pt`` with the
optimiser/scheduler/step) are reported with ``ray.train.report`` at the end of every epoch
(and every ``checkpoint.every_steps``) to ``checkpoint.storage_path`` (local or s3://),
keeping ``checkpoint.num_to_keep``.  After a worker failure Ray Train restarts the group
(``max_failures``) and every worker resumes from the latest checkpoint, skipping the
batches of the current epoch it had already trained on, so the run ends with exactly
``epochs * steps_per_epoch`` steps.  ``resume_from=`` starts a new run from a saved
checkpoint (a checkpoint folder, or a Ray Train run folder: its latest checkpoint).

MLflow: rank 0 only, through the picklable ``RunLogger`` passed in the loop config
(per-step loss terms at the global step; per-epoch validation/eval metrics at the epoch).
Logging only queues the records (:mod:`hardpos.tracking_queue`): a slow or dead tracking
server never stalls or fails a step, and never spends ``fault.max_failures``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal, Sequence

from hardpos.config import JobConfig, TrackingConfig
from hardpos.eval.spec import BenchmarkSpec
from hardpos.model import ModelConfig
from hardpos.train.data import DataConfig
from hardpos.train.loss import LossConfig

log = logging.getLogger(__name__)

STATE_NAME = "train_state.pt"
MODEL_DIR = "model"


# --------------------------------------------------------------------------- config
@dataclasses.dataclass
class OptimConfig:
    """AdamW + warmup/cosine schedule (DESIGN section 4 defaults).

    lr: peak learning rate (the paper: 5e-6 for ViT-B-32 from OpenAI weights).
    weight_decay: applied to weight matrices only (not gains, biases, logit_scale).
    beta1, beta2, eps: AdamW parameters.
    warmup_steps: linear warmup from 0 to ``lr``; then cosine decay to 0 at the last step.
    grad_clip: max global gradient norm (0 disables clipping).
    fused: torch's fused AdamW kernel (CPU and CUDA) instead of a per-parameter loop; the
        same update up to float rounding (see :func:`build_optimizer`).
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
    fail_at_step: TESTS ONLY: the last worker raises once when this global step is
        reached (a marker file in output_dir stops the retry from failing again).
    """

    max_failures: int = 2
    fail_at_step: int | None = None


@dataclasses.dataclass
class TrainConfig(JobConfig):
    """Finetune an open_clip CLIP on triplets with the combined loss on Ray Train.

    output_dir: the stage writes summary.json, model/ (final checkpoint) and, unless
        checkpoint.storage_path is set, ray_train/ (Ray Train's checkpoints) here.
    model: the model to finetune (see hardpos.model.ModelConfig).
    data: triplet files and the validation split (see hardpos.train.data.DataConfig).
    loss: weights of the combined loss (DESIGN section 4).
    optim: AdamW and the LR schedule.
    scaling: Ray Train workers and resources.
    checkpoint: checkpoint storage and frequency.
    fault: max_failures (and a test-only fault injector).
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
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.scaling.num_workers < 1:
            raise ValueError(f"scaling.num_workers must be >= 1, got {self.scaling.num_workers}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or null, got {self.max_steps}")


# --------------------------------------------------------------------------- model pieces
def _triplet_module():
    import torch

    from hardpos.model import encode_image, encode_text

    class TripletCLIP(torch.nn.Module):
        """One forward for a whole step: image, caption, negative and positive features.

        The CLIP model is ``self.module`` so ``hardpos.model.unwrap`` reaches it through
        DDP and this wrapper alike. Only valid negatives/positives are encoded; the others
        come back as zero rows (masked in the loss).
        """

        def __init__(self, clip: torch.nn.Module) -> None:
            super().__init__()
            self.module = clip

        def forward(self, images, text_tokens, neg_tokens, pos_tokens, neg_mask, pos_mask):
            b = text_tokens.shape[0]
            image = encode_image(self.module, images)
            # One text-tower call for captions + valid negatives + valid positives.
            tokens = torch.cat([text_tokens, neg_tokens[neg_mask], pos_tokens[pos_mask]])
            feats = encode_text(self.module, tokens)
            k = int(neg_mask.sum())
            text = feats[:b]
            negative = feats.new_zeros(b, feats.shape[1]).masked_scatter(neg_mask.unsqueeze(1), feats[b:b + k])
            positive = feats.new_zeros(b, feats.shape[1]).masked_scatter(pos_mask.unsqueeze(1), feats[b + k:])
            return {"image": image, "text": text, "negative": negative, "positive": positive,
                    "logit_scale": self.module.logit_scale}

    return TripletCLIP


def param_groups(model, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on weight matrices (ndim >= 2); none on gains, biases, logit_scale."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "logit_scale" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model, cfg: OptimConfig):
    """AdamW over :func:`param_groups` of ``model`` (build it once the parameters are on
    their device: the fused kernel keeps its state there).

    Fused by default: one kernel per parameter group instead of a Python loop of ~10 ops
    per tensor. The optimiser step was 45% of a hardpos-tiny training step on CPU (the
    49k-token embedding dominates a tiny model); fused, the whole step ran 1.33-1.53x
    faster (hardpos-tiny, batch 32) and 1.08-1.24x (ViT-B-32, batch 16) on 2 CPU cores
    across runs: ``python jobs/benchmark.py suite=train_step`` reports it as its own row.
    """
    import torch

    fused = cfg.fused and all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.eps, fused=fused or None)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / span)))


def step_forward(net, batch: dict[str, Any], loss_cfg: LossConfig, autocast_ctx) -> dict[str, Any]:
    """Forward + gather + loss for one model batch (from data.to_model_batch)."""
    from hardpos.train.loss import combined_loss, gather_features

    with autocast_ctx():
        out = net(batch["images"], batch["text_tokens"], batch["neg_tokens"], batch["pos_tokens"],
                  batch["neg_mask"], batch["pos_mask"])
    local = {k: out[k] for k in ("image", "text", "negative", "positive")}
    local.update(neg_mask=batch["neg_mask"], pos_mask=batch["pos_mask"], row_mask=batch["row_mask"])
    glob = gather_features(local)
    terms = combined_loss(glob["image"], glob["text"], glob["negative"], glob["positive"], glob["neg_mask"],
                          glob["pos_mask"], out["logit_scale"], loss_cfg, row_mask=glob["row_mask"])
    terms["_rows"] = glob["row_mask"].sum()
    return terms


# --------------------------------------------------------------------------- checkpoints
def save_train_checkpoint(directory: str | os.PathLike, clip, model_cfg: dict, meta: dict, state: dict) -> Path:
    """``model/`` (open_clip local-dir format) + ``train_state.pt`` into ``directory``."""
    import torch

    from hardpos.model import save_checkpoint

    directory = Path(directory)
    save_checkpoint(clip, model_cfg, directory / MODEL_DIR, meta)
    torch.save(state, directory / STATE_NAME)
    return directory


def load_train_state(directory: str | os.PathLike, clip) -> dict:
    """Load the weights of ``directory/model`` into ``clip``; return the training state."""
    import torch
    from safetensors.torch import load_file

    from hardpos.model import WEIGHTS_NAME

    directory = Path(directory)
    state_file = directory / STATE_NAME
    if not state_file.is_file():
        raise FileNotFoundError(f"{directory}: not a HardPos training checkpoint (no {STATE_NAME})")
    clip.load_state_dict(load_file(str(directory / MODEL_DIR / WEIGHTS_NAME)))
    # weights_only: a checkpoint may come from anywhere (s3, a colleague); no pickle code runs.
    return torch.load(state_file, map_location="cpu", weights_only=True)


def find_resume_checkpoint(uri: str) -> str:
    """The checkpoint folder ``uri`` names: itself, or the newest ``checkpoint_*`` below it."""
    from hardpos import storage

    if storage.exists(storage.join(uri, STATE_NAME)):
        return uri.rstrip("/")
    states = [f for f in storage.list_files(uri) if f.endswith("/" + STATE_NAME)]
    if not states:
        raise FileNotFoundError(f"resume_from={uri}: no {STATE_NAME} at or below it (not a HardPos training checkpoint)")
    # Checkpoint folders are named checkpoint_<zero-padded step>: the last sorts last.
    return sorted(states, key=lambda f: (f.rsplit("/", 2)[-2], f))[-1].rsplit("/", 1)[0]


def _ray_checkpoint(uri: str):
    import ray.train

    from hardpos.train.data import worker_filesystem

    fs, path = worker_filesystem(uri)
    return ray.train.Checkpoint(path=path, filesystem=fs)


# --------------------------------------------------------------------------- worker loop
def _all_true(flag: bool) -> bool:
    """True only if ``flag`` is true on every rank (keeps ranks in lock-step)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _sum_across(values: dict[str, float]) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    if not values or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return dict(zip(keys, t.cpu().tolist()))


def _maybe_inject_fault(cfg: TrainConfig, step: int, rank: int, world: int) -> None:
    from hardpos import storage

    if cfg.fault.fail_at_step is None or step != cfg.fault.fail_at_step or rank != world - 1:
        return
    marker = storage.join(cfg.output_dir, ".fault_injected")
    if storage.exists(marker):
        return
    storage.write_text(marker, f"failed once at step {step}\n")
    raise RuntimeError(f"injected fault at step {step} (fault.fail_at_step; tests only)")


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """The Ray Train worker function (config: cfg, run_logger, steps_per_epoch, total_steps).

    Rank 0's tracking records go through a non-blocking queue (a dead tracking server
    costs the loop nothing); when the loop ends this process's queue gets a bounded drain
    (``tracking.drain_timeout_s``, none while the server is unreachable: the driver waits
    instead), or, when the loop raised, none at all: what is left goes to a file that the
    restarted rank 0 (or the driver) adopts, so Ray Train's restart is not delayed and no
    record is lost or logged twice.
    """
    import ray.train

    try:
        _train_worker(config)
    except BaseException:
        _close_tracking(config, ray.train.get_context().get_world_rank(), timeout=0.0)
        raise
    _close_tracking(config, ray.train.get_context().get_world_rank(), timeout=config["cfg"].tracking.drain_timeout_s)


def _close_tracking(config: dict[str, Any], rank: int, timeout: float) -> None:
    from hardpos import tracking_queue

    logger = config.get("run_logger")
    if rank != 0 or logger is None:
        return
    q = tracking_queue.existing_queue(logger.tracking_uri, logger.run_id, logger.spill_dir)
    if q is not None:
        q.close(timeout, hand_off=True)


def _train_worker(config: dict[str, Any]) -> None:
    import contextlib

    import ray.train
    import ray.train.torch
    import torch

    from hardpos.model import load_model, unwrap
    from hardpos.train.data import to_model_batch
    from hardpos.train.loss import clamp_logit_scale, loss_metrics

    cfg: TrainConfig = config["cfg"]
    run_logger = config.get("run_logger")
    spe: int = config["steps_per_epoch"]
    total: int = config["total_steps"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    autocast_ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
    logger = run_logger if rank == 0 else None

    torch.manual_seed(cfg.seed)
    # cfg.tracking.tracking_uri was resolved on the driver (resolve_paths): this worker's
    # working directory and environment name no store of their own.
    lm = load_model(cfg.model, device="cpu", tracking_uri=cfg.tracking.tracking_uri)
    clip = lm.model

    # Resume: Ray Train's latest checkpoint (after a failure, or resume_from_checkpoint).
    step, resumed_from, state = 0, None, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and config.get("resume_from"):
        # Explicit resume_from (Ray Train V2 deprecates resume_from_checkpoint=: the
        # train function loads it). A restart after a failure prefers the run's own latest.
        checkpoint = _ray_checkpoint(config["resume_from"])
    if checkpoint is not None:
        with checkpoint.as_directory() as ckpt_dir:
            state = load_train_state(ckpt_dir, clip)
        step = resumed_from = int(state["step"])
        if rank == 0:
            log.warning("resuming from step %d (%s)", step, checkpoint.path)

    net = ray.train.torch.prepare_model(_triplet_module()(clip))
    # Built after prepare_model moved the parameters: loading its state then puts every
    # state tensor on the parameters' device (the fused kernel wants them all there).
    optimizer = build_optimizer(clip, cfg.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, cfg.optim.warmup_steps, total))
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val") if config.get("has_val") else None

    # After a restart the steps between the checkpoint and the failure are trained again;
    # their metrics were already logged, so rank 0 logs only steps beyond what was logged
    # (MLflow's history, or the run's local ledger while the server is down). Asked on every
    # start, not only on a resume: a restart before the first checkpoint retrains from step 0.
    logged_step = logger.last_step("loss/total") if logger is not None else 0
    logged_epoch = logger.last_step("epoch") if logger is not None else 0

    meta_base = {"arch": lm.arch, "source": cfg.model.pretrained or "random", "loss": dataclasses.asdict(cfg.loss)}
    skipped_total, warned = 0, 0
    train_time, train_rows = 0.0, 0.0
    start_epoch = step // spe
    last_metrics: dict[str, Any] = {}
    for epoch in range(start_epoch, cfg.epochs):
        if step >= total:
            break
        net.train()
        skip = step - epoch * spe  # batches of this epoch already trained before a restart
        sums: dict[str, float] = {}
        n_steps, skipped = 0, 0
        batches = train_shard.iter_batches(
            batch_size=cfg.batch_size, batch_format="numpy", drop_last=True,
            local_shuffle_buffer_size=cfg.data.shuffle_buffer or None,
            local_shuffle_seed=cfg.seed * 1000 + epoch if cfg.data.shuffle_buffer else None)
        it = iter(batches)
        index = 0
        t0 = time.perf_counter()
        while step < total and index < spe:
            raw = next(it, None)
            if not _all_true(raw is not None):
                break
            index += 1
            if index <= skip:
                continue
            batch = to_model_batch(raw, cfg.batch_size, device)
            skipped += batch["skipped"]
            if batch["skipped"] and rank == 0 and warned < 3:  # a few examples, not a flood
                warned += 1
                errs = [e for e in raw["error"] if e][:3]
                log.warning("skipping %d bad row(s) in a batch, e.g. %s", batch["skipped"], errs)
            terms = step_forward(net, batch, cfg.loss, autocast_ctx)
            optimizer.zero_grad(set_to_none=True)
            terms["total"].backward()
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.optim.grad_clip)
            optimizer.step()
            scheduler.step()
            clamp_logit_scale(net)
            step += 1
            n_steps += 1
            train_rows += float(terms["_rows"])
            values = loss_metrics({k: v for k, v in terms.items() if not k.startswith("_")})
            for k, v in values.items():
                sums[k] = sums.get(k, 0.0) + v
            if logger is not None and step > logged_step and (step % cfg.log_every == 0 or step == total):
                logger.log_metrics({**values, "lr": scheduler.get_last_lr()[0],
                                    "logit_scale": float(unwrap(net).logit_scale.exp())}, step=step)
            _maybe_inject_fault(cfg, step, rank, world)
            if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0 and index < spe:
                _report(cfg, net, lm, optimizer, scheduler, step, epoch, meta_base,
                        {**_means(sums, n_steps), "step": step, "epoch": epoch}, rank)
        if step < total:  # drain the epoch's tail so every split starts the next epoch together
            for _ in it:
                pass
        train_time += time.perf_counter() - t0
        skipped_total += skipped
        metrics: dict[str, Any] = {**_means(sums, n_steps), "step": step, "epoch": epoch + 1}
        counts = _sum_across({"skipped": float(skipped)})
        metrics["data/skipped_rows"] = int(counts["skipped"])
        if val_shard is not None:
            metrics.update(_validate(net, val_shard, cfg, device, autocast_ctx))
        if rank == 0 and cfg.eval_benchmarks:
            metrics.update(_evaluate(unwrap(net), lm, cfg, device))
        metrics["perf/samples_per_s"] = train_rows / train_time if train_time > 0 else 0.0
        if resumed_from is not None:
            metrics["resumed_from_step"] = resumed_from
        if logger is not None and epoch + 1 > logged_epoch:
            # Per-step loss/* histories use the global step; the epoch means go under
            # epoch/loss/* so the two x-axes never mix in one MLflow metric.
            logger.log_metrics({(f"epoch/{k}" if k.startswith("loss/") else k): v
                                for k, v in metrics.items() if k != "step"}, step=epoch + 1)
        _report(cfg, net, lm, optimizer, scheduler, step, epoch + 1, meta_base, metrics, rank)
        last_metrics = metrics
    if not last_metrics and rank == 0:
        log.warning("nothing left to train: checkpoint step %d >= total steps %d", step, total)


def _means(sums: dict[str, float], n: int) -> dict[str, float]:
    return {k: v / n for k, v in sums.items()} if n else {}


def _report(cfg, net, lm, optimizer, scheduler, step, epoch, meta_base, metrics, rank) -> None:
    """Every rank reports; rank 0 attaches the checkpoint (model/ + train_state.pt)."""
    import ray.train

    from hardpos.model import unwrap

    if rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="hardpos-ckpt-") as tmp:
        state = {"step": step, "epoch": epoch, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        save_train_checkpoint(tmp, unwrap(net), lm.model_cfg, {**meta_base, "step": step, "epoch": epoch}, state)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                         checkpoint_dir_name=f"checkpoint_{step:09d}")


def _validate(net, shard, cfg: TrainConfig, device, autocast_ctx) -> dict[str, float]:
    """The combined loss on the validation split (all ranks, same gather path, no grad)."""
    import torch

    from hardpos.train.data import to_model_batch

    net.eval()
    sums: dict[str, float] = {}
    weight = 0.0
    it = iter(shard.iter_batches(batch_size=cfg.batch_size, batch_format="numpy", drop_last=False))
    with torch.no_grad():
        while True:
            raw = next(it, None)
            if not _all_true(raw is not None):
                break
            batch = to_model_batch(raw, cfg.batch_size, device)
            terms = step_forward(net, batch, cfg.loss, autocast_ctx)
            rows = float(terms.pop("_rows"))
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(v) * rows
            weight += rows
    for _ in it:
        pass
    net.train()
    if weight == 0:
        return {}
    out = {"val/loss": sums["total"] / weight}
    out.update({f"val/{k}": v / weight for k, v in sums.items() if k != "total"})
    return out


def _evaluate(clip, lm, cfg: TrainConfig, device) -> dict[str, float]:
    """Benchmarks on rank 0 (hardpos.eval.evaluator.run_benchmarks)."""
    from hardpos.eval.evaluator import run_benchmarks

    was_training = clip.training
    clip.eval()
    try:
        return run_benchmarks(clip, lm.preprocess_val, lm.tokenizer, list(cfg.eval_benchmarks),
                              device=str(device), batch_size=cfg.eval_batch_size)
    finally:
        clip.train(was_training)


# --------------------------------------------------------------------------- driver
@dataclasses.dataclass
class Plan:
    """The step schedule the driver derives before starting workers."""

    train_rows: int
    val_rows: int
    steps_per_epoch: int
    total_steps: int
    global_batch: int


def plan_steps(train_rows: int, cfg: TrainConfig) -> tuple[int, int]:
    """(steps_per_epoch, total_steps): equal shards of ``rows // workers``, full batches only."""
    from hardpos.config import ConfigError

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
    from hardpos import storage

    uri = cfg.checkpoint.storage_path or storage.join(cfg.output_dir, "ray_train")
    if storage.is_s3(uri):
        from hardpos.train.data import worker_filesystem

        # Ray Train's controller actor does not get the workers' runtime_env.
        fs, path = worker_filesystem(uri)
        return path, fs
    Path(uri).mkdir(parents=True, exist_ok=True)
    return str(Path(uri).resolve()), None


def build_trainer(cfg: TrainConfig, *, callbacks: Sequence[Any] = (), run_logger=None):
    """(TorchTrainer, Plan, resolved cfg) for ``cfg`` (loads the model once on the driver)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from hardpos.model import load_model
    from hardpos.runtime import init_ray
    from hardpos.train.data import build_datasets

    init_ray(cfg.ray)
    cfg = resolve_paths(cfg)
    lm = load_model(cfg.model, tracking_uri=cfg.tracking.tracking_uri)  # fail fast on a bad source; gives transforms + tokenizer
    image_size = lm.model.visual.image_size
    image_size = image_size[0] if isinstance(image_size, (tuple, list)) else int(image_size)
    datasets = build_datasets(cfg.data, lm.preprocess_train, lm.preprocess_val, lm.tokenizer, image_size,
                              batch_size=cfg.batch_size, env=forwarded_env(include_tracking=False),
                              num_cpus=decode_task_cpus(cfg, ray.cluster_resources().get("CPU", 0.0)))
    spe, total = plan_steps(datasets.train_rows, cfg)
    plan = Plan(datasets.train_rows, datasets.val_rows, spe, total, cfg.batch_size * cfg.scaling.num_workers)
    storage_path, fs = storage_location(cfg)
    resources = {"CPU": cfg.scaling.cpus_per_worker, **cfg.scaling.resources_per_worker}
    if cfg.scaling.use_gpu:
        resources["GPU"] = 1
    run_config = ray.train.RunConfig(
        name=cfg.run_name or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
        storage_path=storage_path,
        storage_filesystem=fs,
        failure_config=ray.train.FailureConfig(max_failures=cfg.fault.max_failures),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.num_to_keep),
        callbacks=list(callbacks) or None,
        worker_runtime_env={"env_vars": forwarded_env()} if forwarded_env() else None,
    )
    ds_map = {"train": datasets.train}
    if datasets.val is not None:
        ds_map["val"] = datasets.val
    resume = find_resume_checkpoint(cfg.resume_from) if cfg.resume_from else None
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cfg": cfg, "run_logger": run_logger, "steps_per_epoch": spe, "total_steps": total,
                           "has_val": datasets.val is not None, "resume_from": resume},
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


def fit(cfg: TrainConfig, *, callbacks: Sequence[Any] = (), run_logger=None):
    """Build and fit the TorchTrainer for ``cfg``; returns the ``ray.train.Result``.

    For Ray Tune: call inside a Tune function with
    ``callbacks=[ray.tune.integration.ray_train.TuneReportCallback()]``.  Reported metric
    names are flat and stable: ``loss/total``, ``loss/contrastive``, ``loss/hard_negative``,
    ``loss/hard_positive``, ``loss/pos_over_neg``, ``loss/kl`` (epoch means), ``val/loss``
    (+ ``val/<term>``), eval metrics (``replace/aug_acc`` ...), ``step``, ``epoch``,
    ``data/skipped_rows``, ``perf/samples_per_s``.
    """
    trainer, plan, _ = build_trainer(cfg, callbacks=callbacks, run_logger=run_logger)
    log.info("training plan: %s", plan)
    return trainer.fit()


# Environment the workers need to reach the same S3 endpoint / MLflow store as the driver.
_S3_ENV = ("HARDPOS_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")
_CRED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def forwarded_env(include_tracking: bool = True) -> dict[str, str]:
    """Driver environment variables Ray workers need (for a runtime_env).

    S3 endpoint/region always; credentials only together with an endpoint override (a
    MinIO/moto-style dev setup): on AWS the nodes' own credential chain is used, and
    secrets are not copied into Ray's runtime environment.
    """
    names = list(_S3_ENV) + (["MLFLOW_TRACKING_URI", "HARDPOS_CACHE_DIR"] if include_tracking else [])
    env = {k: os.environ[k] for k in names if os.environ.get(k)}
    if any(k in env for k in _S3_ENV[:3]):
        env.update({k: os.environ[k] for k in _CRED_ENV if os.environ.get(k)})
    return env


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """Absolute local paths and the resolved MLflow tracking URI (``models:/`` / ``runs:/``
    sources resolve there): Ray workers do not share the driver's working directory."""
    from hardpos import storage, tracking
    from hardpos.runtime import resolve_output_dir

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
        tracking=dataclasses.replace(cfg.tracking, tracking_uri=tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)),
    )
