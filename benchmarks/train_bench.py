"""Training-step benchmarks (called by the benchmark harness; never timed in tests).

What is timed is THE training step, :func:`hardpos.train.step.train_step`, the function the
Ray Train workers run (and the calibration probe): zero grads, one forward through
:class:`~hardpos.train.step.TripletCLIP` (images + captions + negatives + positives, one
text-tower call), the feature gather (a no-op in one process), the combined loss, backward,
gradient clipping at the default ``optim.grad_clip`` (1.0), the fused AdamW step, the
warmup + cosine scheduler step and the ``logit_scale`` clamp. Not timed: data loading and
decoding, DDP's gradient all-reduce, logging and checkpoints (one process, one batch).
It times the training loop's own step (clipping, scheduler and clamp included), not a
cheaper copy of it.

:func:`bench_train_step` measures, on one model and one batch, alternating side by side
(:func:`benchmarks.harness.compare_alternating`, median of per-pair ratios):

* ``combined_vs_clip``: the HardPos training step (batch-length text) against a plain
  open_clip CLIP step (``model(images, 77-token captions)`` + ``ClipLoss``), given the same
  step bookkeeping as open_clip's trainer and ours (fused AdamW, clipping, scheduler,
  clamp), so the ratio is the cost of the combined forward + loss alone.
  Samples/s counts images; the combined step runs the text tower on up to 3x the texts.
* ``combined_padding``: the same training step with batch-length text vs text padded to
  the full context, i.e. what batch-length padding buys inside training.
* ``fused_adamw``: the same training step with the fused AdamW vs torch's default
  per-parameter AdamW (:func:`hardpos.train.step.build_optimizer`).
* ``text_tower_padding``: forward-only text features, batch-length vs full context.

:func:`bench_lora_step` times the same training step with LoRA adapters (TSVLC's placement)
against full finetuning of the same model, with both paths' trainable parameters and memory.

On CUDA every path runs under bf16 autocast (as the training loop does) and is timed to
``torch.cuda.synchronize()``. Every function returns a flat dict of numbers (and the case
names) for the harness.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
from typing import Any

import torch
from open_clip.loss import ClipLoss

import hardpos.train.step  # hardpos.train.step.train_step looked up per call: tests count the calls
from benchmarks.harness import compare_alternating
from benchmarks.tiny_step import synthetic_batch
from hardpos.config import ModelConfig
from hardpos.models.clip import encode_text, load_model
from hardpos.train import lora
from hardpos.train.config import LossConfig, OptimConfig
from hardpos.train.step import TripletCLIP, build_optimizer, build_scheduler, model_batch


def bench_train_step(arch: str = "hardpos-tiny", batch_size: int = 32, repeats: int = 5, warmup: int = 1,
                     device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """Samples/s of the training step vs a plain CLIP step, and batch-length padding gains."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch=arch), device=device)
    model = lm.model.train()
    net = TripletCLIP(model)
    optim = OptimConfig(lr=1e-6)
    # the training loop's optimiser (fused AdamW), and the per-parameter loop it replaced;
    # each with its own schedule (long enough to stay in warmup/cosine for the whole run)
    opt = build_optimizer(model, optim)
    opt_loop = build_optimizer(model, dataclasses.replace(optim, fused=False))
    schedulers = {id(o): build_scheduler(o, optim.warmup_steps, 1_000_000) for o in (opt, opt_loop)}
    images, t77, n77, p77, tb, nb, pb = (x.to(device) for x in synthetic_batch(lm, batch_size))
    loss_cfg = LossConfig()
    clip_loss = ClipLoss()
    cuda = torch.device(device).type == "cuda"

    def autocast():
        # as the training loop does on GPU (precision "auto"): bf16 autocast, fp32 weights
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def sync():
        if cuda:  # CUDA runs asynchronously: a step is timed to its end, not its launch
            torch.cuda.synchronize()

    def combined(text, neg, pos, optimizer=opt):
        batch = model_batch(images, text, neg, pos)

        def step():
            hardpos.train.step.train_step(net, batch, loss_cfg, optimizer, schedulers[id(optimizer)], grad_clip=optim.grad_clip,
                       autocast_ctx=autocast)
            sync()
        return step

    def plain_clip():
        # open_clip's train_one_epoch step: the same bookkeeping as train_step around CLIP's loss
        opt.zero_grad(set_to_none=True)
        with autocast():
            img, txt, scale = model(images, t77)
        loss = clip_loss(img, txt, scale)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        opt.step()
        schedulers[id(opt)].step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        sync()

    def text_only(tokens):
        def fwd():
            with torch.no_grad(), autocast():
                encode_text(model, tokens)
            sync()
        return fwd

    text_all_b = torch.cat([tb, nb, pb])
    text_all_77 = torch.cat([t77, n77, p77])
    rows = {
        "combined_vs_clip": compare_alternating(combined(tb, nb, pb), plain_clip, repeats=repeats, warmup=warmup,
                                                work_items=batch_size),
        "combined_padding": compare_alternating(combined(tb, nb, pb), combined(t77, n77, p77), repeats=repeats,
                                                warmup=warmup, work_items=batch_size),
        "fused_adamw": compare_alternating(combined(tb, nb, pb), combined(tb, nb, pb, opt_loop), repeats=repeats,
                                           warmup=warmup, work_items=batch_size),
        "text_tower_padding": compare_alternating(text_only(text_all_b), text_only(text_all_77), repeats=repeats,
                                                  warmup=warmup, work_items=3 * batch_size),
    }
    out: dict[str, Any] = {"arch": arch, "batch_size": batch_size, "device": device,
                           "text_tokens_batch": int(tb.shape[1]), "text_tokens_full": int(t77.shape[1])}
    for case, r in rows.items():
        for k, v in r.items():
            out[f"{case}/{k}"] = v
    # Plain-language summary figures (images per second of one training step).
    out["combined_samples_per_s"] = rows["combined_vs_clip"]["optimised_items_per_s"]
    out["clip_samples_per_s"] = rows["combined_vs_clip"]["baseline_items_per_s"]
    out["combined_77_samples_per_s"] = rows["combined_padding"]["baseline_items_per_s"]
    return out


def bench_lora_step(arch: str = "hardpos-tiny", batch_size: int = 32, repeats: int = 5, warmup: int = 1,
                    device: str = "cpu", rank: int = 4, alpha: float = 1.0) -> dict[str, Any]:
    """LoRA (TSVLC's placement, :func:`hardpos.train.lora.apply_lora`) vs full finetuning: the
    same training step on two copies of one model and one batch, alternating
    (``ratio_median`` = full step time / LoRA step time), with each path's trainable
    parameters, the bytes its gradients + AdamW state take (exact: 3 float32 tensors per
    trainable parameter) and, on CUDA, its peak allocated memory over one step."""
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch=arch), device=device)
    full_model = lm.model.train()
    lora_model = load_model(ModelConfig(arch=arch), device=device).model.train()
    lora_model.load_state_dict(full_model.state_dict())
    counts = lora.apply_lora(lora_model, rank, alpha)
    optim = OptimConfig(lr=1e-6)
    images, _, _, _, tb, nb, pb = (x.to(device) for x in synthetic_batch(lm, batch_size))
    batch = model_batch(images, tb, nb, pb)
    loss_cfg = LossConfig()
    cuda = torch.device(device).type == "cuda"

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def stepper(model):
        net = TripletCLIP(model)
        opt = build_optimizer(model, optim)
        sched = build_scheduler(opt, optim.warmup_steps, 1_000_000)

        def step():
            hardpos.train.step.train_step(net, batch, loss_cfg, opt, sched, grad_clip=optim.grad_clip, autocast_ctx=autocast)
            if cuda:
                torch.cuda.synchronize()
        return step

    lora_step, full_step = stepper(lora_model), stepper(full_model)
    peak = {}
    if cuda:
        for name, fn in (("lora", lora_step), ("full", full_step)):
            fn()  # optimiser state exists before the measured step
            torch.cuda.reset_peak_memory_stats()
            fn()
            peak[name] = torch.cuda.max_memory_allocated()
    row = compare_alternating(lora_step, full_step, repeats=repeats, warmup=warmup, work_items=batch_size)
    full_params = sum(p.numel() for p in full_model.parameters() if p.requires_grad)
    out: dict[str, Any] = {"arch": arch, "batch_size": batch_size, "device": device, "rank": rank, **row,
                           "lora_trainable": counts.trainable, "full_trainable": full_params,
                           "lora_grad_optim_bytes": 12 * counts.trainable, "full_grad_optim_bytes": 12 * full_params}
    if peak:
        out.update(lora_peak_bytes=peak["lora"], full_peak_bytes=peak["full"], memory_ratio=peak["full"] / peak["lora"])
    return out


if __name__ == "__main__":  # python -m benchmarks.train_bench [arch] [batch_size]
    args = sys.argv[1:]
    result = bench_train_step(args[0] if args else "hardpos-tiny", int(args[1]) if len(args) > 1 else 32)
    print(json.dumps(result, indent=1))
