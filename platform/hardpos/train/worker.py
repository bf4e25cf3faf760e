"""The Ray Train worker: :func:`train_loop_per_worker` around :func:`hardpos.train.step.train_step`.

Per worker: load the model (weights from the latest checkpoint when resuming), wrap it in
DDP (``ray.train.torch.prepare_model``), then for each epoch iterate this worker's shard
of the training split and call the ONE training step (:mod:`hardpos.train.step`); every
step is followed by the optional ``step_hook``, per-step logging (rank 0) and, every
``checkpoint.every_steps``, a checkpoint. Each epoch ends with the validation loss (all
ranks), benchmarks (rank 0), the epoch metrics and a checkpoint reported with
``ray.train.report`` (rank 0 attaches it; folders ``checkpoint_<step:09d>``).

Contracts:

* Ranks stay in lock-step: a rank whose shard ran out tells the others
  (:func:`_all_true`), so no rank waits in a collective the others never reach.
* After a failure Ray Train restarts the group and every worker resumes from the latest
  checkpoint, skipping the batches of the current epoch already trained, so a run ends
  with exactly ``min(epochs * steps_per_epoch, max_steps)`` steps.
* Rank 0 alone logs to MLflow, through the picklable ``RunLogger`` in the loop config;
  logging only queues records (:mod:`hardpos.tracking`), and steps already logged
  before a restart are not logged again.
* Rank 0 prints one progress line per tenth of the run and at its last step: step/total,
  epoch, the step's loss terms, steps/s, samples/s (all workers) and the ETA
  (:class:`Progress`); ``perf/samples_per_s`` (all workers, per epoch) goes to MLflow.
* LoRA (``lora.rank > 0``, :mod:`hardpos.train.lora`): the adapters are put on the loaded
  model before a resume (a checkpoint holds the adapters, the frozen weights come from
  ``model.pretrained`` again), only they train, and every checkpoint's ``model/`` holds the
  merged weights. Rank 0 logs the trainable / total parameter counts (console,
  ``params/trainable`` and ``params/total`` in MLflow, ``params/trainable`` per epoch).
* ``step_hook`` (loop config key, default None): a picklable callable called after every
  step as ``hook(step, rank, world_size)`` with the global step just trained. Tests use it
  to inject a worker failure (``tests.support.faults.FailOnce``, a test helper); production
  configs carry no fault injector.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import tempfile
import time
from typing import Any, Callable

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from hardpos import logs, storage, tracking
from hardpos.eval.evaluator import run_benchmarks
from hardpos.models.clip import load_model, unwrap
from hardpos.train import lora
from hardpos.train.checkpoint import load_remote_train_state, save_train_checkpoint
from hardpos.train.config import TrainConfig
from hardpos.train.data import to_model_batch
from hardpos.train.loss import loss_metrics
from hardpos.train.step import TripletCLIP, build_optimizer, build_scheduler, forward_loss, train_step

log = logging.getLogger(__name__)

StepHook = Callable[[int, int, int], None]


@dataclasses.dataclass
class Progress:
    """Rank 0's console progress: a line every ``every`` steps and at the last step
    (loss terms that are exactly 0, i.e. off in this phase, are left out).

    Rates count from ``start_step`` at ``started`` (a resumed run measures only what it
    trains); the ETA is the remaining steps at that rate (validation and benchmarks between
    epochs included, so it stays honest)."""

    total: int
    start_step: int
    global_batch: int
    epochs: int
    every: int
    started: float = dataclasses.field(default_factory=time.perf_counter)

    @classmethod
    def for_run(cls, total: int, start_step: int, global_batch: int, epochs: int, lines: int = 10) -> "Progress":
        return cls(total, start_step, global_batch, epochs, every=max(1, math.ceil(total / max(1, lines))))

    def line(self, step: int, epoch: int, terms: dict[str, float], now: float | None = None) -> str | None:
        """The progress line after global ``step`` (in 0-based ``epoch``), or None between lines."""
        if step % self.every and step != self.total:
            return None
        elapsed = max(1e-9, (time.perf_counter() if now is None else now) - self.started)
        steps_s = (step - self.start_step) / elapsed
        eta = (self.total - step) / steps_s if steps_s > 0 else float("inf")
        # terms that are exactly 0 (their weight is 0 in this phase) would only widen the line
        loss = " ".join(f"{k.split('/', 1)[1]} {v:.4f}" for k, v in terms.items()
                        if k.startswith("loss/") and (v != 0.0 or k == "loss/total"))
        return (f"train step {step}/{self.total} ({100 * step / self.total:.0f}%) epoch {epoch + 1}/{self.epochs} | "
                + (f"loss {loss} | " if loss else "") + f"{steps_s:.2f} steps/s {steps_s * self.global_batch:.1f} samples/s | "
                f"ETA {logs.duration(eta) if math.isfinite(eta) else '?'}")


# --------------------------------------------------------------------------- collectives
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_true(flag: bool) -> bool:
    """True only if ``flag`` is true on every rank (keeps ranks in lock-step)."""
    if not _distributed():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _sum_across(values: dict[str, float]) -> dict[str, float]:
    """Every rank's ``values`` summed key by key (the same keys on every rank)."""
    if not values or not _distributed():
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return dict(zip(keys, t.cpu().tolist()))


# --------------------------------------------------------------------------- entry point
def train_loop_per_worker(config: dict[str, Any]) -> None:
    """The Ray Train worker function.

    ``config`` (built by :func:`hardpos.train.trainer.build_trainer`): ``cfg``
    (TrainConfig, paths resolved), ``run_logger`` (or None), ``steps_per_epoch``,
    ``total_steps``, ``has_val``, ``resume_from`` (a checkpoint URI or None) and
    ``step_hook`` (or None).

    Rank 0's tracking records go through a non-blocking queue (a dead tracking server
    costs the loop nothing); when the loop ends this process's queue gets a bounded drain
    (``tracking.drain_timeout_s``, none while the server is unreachable: the driver waits
    instead), or, when the loop raised, none at all: what is left goes to a file that the
    restarted rank 0 (or the driver) adopts, so Ray Train's restart is not delayed and no
    record is lost or logged twice.
    """
    rank = ray.train.get_context().get_world_rank()
    logs.setup(config["cfg"].log_level)  # this worker process's hardpos lines reach the console
    logs.quiet_worker(config["cfg"].log_level)
    try:
        _train_worker(config)
    except BaseException:
        _close_tracking(config, rank, timeout=0.0)
        raise
    _close_tracking(config, rank, timeout=config["cfg"].tracking.drain_timeout_s)


def _close_tracking(config: dict[str, Any], rank: int, timeout: float) -> None:
    logger = config.get("run_logger")
    if rank != 0 or logger is None:
        return
    q = tracking.existing_queue(logger.tracking_uri, logger.run_id, logger.spill_dir)
    if q is not None:
        q.close(timeout, hand_off=True)


def _ray_checkpoint(uri: str) -> ray.train.Checkpoint:
    fs, path = storage.arrow_filesystem(uri, for_workers=True)
    return ray.train.Checkpoint(path=path, filesystem=fs)


# --------------------------------------------------------------------------- the loop
def _train_worker(config: dict[str, Any]) -> None:
    cfg: TrainConfig = config["cfg"]
    spe: int = config["steps_per_epoch"]
    total: int = config["total_steps"]
    step_hook: StepHook | None = config.get("step_hook")
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    autocast_ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
    logger = config.get("run_logger") if rank == 0 else None

    torch.manual_seed(cfg.seed)
    # cfg.tracking.tracking_uri was resolved on the driver (resolve_paths): this worker's
    # working directory and environment name no store of their own.
    lm = load_model(cfg.model, device="cpu", tracking_uri=cfg.tracking.tracking_uri)
    clip = lm.model
    if cfg.lora.enabled:  # before the resume: a LoRA checkpoint holds the adapters, not the frozen weights
        counts = lora.apply_lora(clip, cfg.lora.rank, cfg.lora.alpha, cfg.lora.targets, cfg.lora.towers)
    else:
        counts = lora.trainable_counts(clip)

    # Resume: Ray Train's latest checkpoint (after a failure), else an explicit resume_from
    # (Ray Train V2 deprecates resume_from_checkpoint=: the train function loads it).
    step, resumed_from, state = 0, None, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and config.get("resume_from"):
        checkpoint = _ray_checkpoint(config["resume_from"])
    if checkpoint is not None:
        state = load_remote_train_state(checkpoint.filesystem, checkpoint.path, clip)
        step = resumed_from = int(state["step"])
        if rank == 0:
            log.warning("resuming from step %d (%s)", step, checkpoint.path)

    net = ray.train.torch.prepare_model(TripletCLIP(clip))
    # Built after prepare_model moved the parameters: loading its state then puts every
    # state tensor on the parameters' device (the fused kernel wants them all there).
    optimizer = build_optimizer(clip, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim.warmup_steps, total)
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
    if rank == 0:
        log.info("training %s parameters of %s (%.2f%%)%s", f"{counts.trainable:,}", f"{counts.total:,}",
                 100 * counts.fraction, f"; LoRA rank {cfg.lora.rank} on {counts.adapted} weights"
                 if cfg.lora.enabled else "; full finetuning")
        if logger is not None and logged_step == 0:
            logger.log_metrics({"params/trainable": counts.trainable, "params/total": counts.total}, step=0)

    meta_base = {"arch": lm.arch, "source": cfg.model.pretrained or "random", "loss": dataclasses.asdict(cfg.loss),
                 "lora": dataclasses.asdict(cfg.lora) if cfg.lora.enabled else None,
                 "params": {"trainable": counts.trainable, "total": counts.total}}
    if "hub_revision" in lm.meta:  # an hf-hub: source: which snapshot of the repo was finetuned
        meta_base["hub_revision"] = lm.meta["hub_revision"]

    def report(step_: int, epoch_: int, metrics: dict[str, Any]) -> None:
        _report(net, lm, optimizer, scheduler, step_, epoch_, meta_base, metrics, rank)

    progress = Progress.for_run(total, step, cfg.batch_size * world, cfg.epochs) if rank == 0 else None
    warned = 0
    train_time, train_rows = 0.0, 0.0
    last_metrics: dict[str, Any] = {}
    for epoch in range(step // spe, cfg.epochs):
        if step >= total:
            break
        net.train()
        skip = step - epoch * spe  # batches of this epoch already trained before a restart
        sums: dict[str, float] = {}
        n_steps, skipped = 0, 0
        it = iter(train_shard.iter_batches(
            batch_size=cfg.batch_size, batch_format="numpy", drop_last=True,
            local_shuffle_buffer_size=cfg.data.shuffle_buffer or None,
            local_shuffle_seed=cfg.seed * 1000 + epoch if cfg.data.shuffle_buffer else None))
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
                log.warning("skipping %d bad row(s) in a batch, e.g. %s", batch["skipped"],
                            [e for e in raw["error"] if e][:3])
            terms = train_step(net, batch, cfg.loss, optimizer, scheduler, grad_clip=cfg.optim.grad_clip,
                               autocast_ctx=autocast_ctx)
            step += 1
            n_steps += 1
            train_rows += float(terms["_rows"])
            values = loss_metrics({k: v for k, v in terms.items() if not k.startswith("_")})
            for k, v in values.items():
                sums[k] = sums.get(k, 0.0) + v
            if logger is not None and step > logged_step and (step % cfg.log_every == 0 or step == total):
                logger.log_metrics({**values, "lr": scheduler.get_last_lr()[0],
                                    "logit_scale": float(unwrap(net).logit_scale.detach().exp())}, step=step)
            if progress is not None and (line := progress.line(step, epoch, values)):
                log.info(line)
            if step_hook is not None:
                step_hook(step, rank, world)
            if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0 and index < spe:
                report(step, epoch, {**_means(sums, n_steps), "step": step, "epoch": epoch})
        if step < total:  # drain the epoch's tail so every split starts the next epoch together
            for _ in it:
                pass
        train_time += time.perf_counter() - t0
        metrics: dict[str, Any] = {**_means(sums, n_steps), "step": step, "epoch": epoch + 1}
        metrics["data/skipped_rows"] = int(_sum_across({"skipped": float(skipped)})["skipped"])
        metrics["params/trainable"] = counts.trainable
        if val_shard is not None:
            metrics.update(_validate(net, val_shard, cfg, device, autocast_ctx))
        if rank == 0 and cfg.eval_benchmarks:
            metrics.update(_evaluate(unwrap(net), lm, cfg, device))
        # Every worker trains the same number of full batches: rank 0's rate x world size.
        metrics["perf/samples_per_s"] = world * train_rows / train_time if train_time > 0 else 0.0
        if resumed_from is not None:
            metrics["resumed_from_step"] = resumed_from
        if logger is not None and epoch + 1 > logged_epoch:
            # Per-step loss/* histories use the global step; the epoch means go under
            # epoch/loss/* so the two x-axes never mix in one MLflow metric.
            logger.log_metrics({(f"epoch/{k}" if k.startswith("loss/") else k): v
                                for k, v in metrics.items() if k != "step"}, step=epoch + 1)
        report(step, epoch + 1, metrics)
        last_metrics = metrics
    if not last_metrics and rank == 0:
        log.warning("nothing left to train: checkpoint step %d >= total steps %d", step, total)


def _means(sums: dict[str, float], n: int) -> dict[str, float]:
    return {k: v / n for k, v in sums.items()} if n else {}


def _report(net, lm, optimizer, scheduler, step: int, epoch: int, meta_base: dict, metrics: dict, rank: int) -> None:
    """Every rank reports; rank 0 attaches the checkpoint (model/ + train_state.pt)."""
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
    net.eval()
    sums: dict[str, float] = {}
    weight = 0.0
    it = iter(shard.iter_batches(batch_size=cfg.batch_size, batch_format="numpy", drop_last=False))
    with torch.no_grad():
        while True:
            raw = next(it, None)
            if not _all_true(raw is not None):
                break
            terms = forward_loss(net, to_model_batch(raw, cfg.batch_size, device), cfg.loss, autocast_ctx)
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
    was_training = clip.training
    clip.eval()
    try:
        return run_benchmarks(clip, lm.preprocess_val, lm.tokenizer, list(cfg.eval_benchmarks),
                              device=str(device), batch_size=cfg.eval_batch_size)
    finally:
        clip.train(was_training)
