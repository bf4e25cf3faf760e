"""ONE training step, in pure torch (no Ray): the model wrapper, the optimiser, the LR
schedule and :func:`train_step`.

Everything that trains or times training calls :func:`train_step`: the Ray Train worker
(:mod:`hardpos.train.worker`), the repository's Ray-free calibration probe
(``python -m benchmarks.calibrate``) and its step benchmarks (``benchmarks.train_bench``,
``benchmarks.tracking_bench``), so what is timed is the step that trains, gradient
clipping, the scheduler and the ``logit_scale`` clamp included.

A step, in order: zero the gradients, one forward through :class:`TripletCLIP` (images +
captions + valid negatives + valid positives; the text tower runs once on all three),
the cross-rank feature gather (:func:`hardpos.train.loss.gather_features`: a no-op without
a process group), the combined loss, backward, gradient clipping (``grad_clip > 0``), the
AdamW step, the scheduler step, ``logit_scale`` clamped to [0, ln 100].

A *model batch* is the dict :func:`hardpos.train.data.to_model_batch` returns (or
:func:`model_batch` builds from tensors): ``images`` [B,3,H,W], ``text_tokens``,
``neg_tokens``, ``pos_tokens`` [B,L] (batch-length), ``neg_mask``, ``pos_mask``,
``row_mask`` [B] bool.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ContextManager

import torch

from hardpos.models.clip import encode_image, encode_text
from hardpos.train.config import LossConfig, OptimConfig
from hardpos.train.loss import clamp_logit_scale, combined_loss, gather_features, own_rows_only, weighted_total

AutocastFactory = Callable[[], ContextManager[Any]]




class TripletCLIP(torch.nn.Module):
    """One forward for a whole step: image, caption, negative and positive features.

    The CLIP model is ``self.module`` so ``hardpos.models.clip.unwrap`` reaches it through DDP and
    this wrapper alike. Only valid negatives/positives are encoded; the others come back as
    zero rows (masked in the loss).
    """

    def __init__(self, clip: torch.nn.Module) -> None:
        super().__init__()
        self.module = clip

    def forward(self, images, text_tokens, neg_tokens, pos_tokens, neg_mask, pos_mask) -> dict[str, torch.Tensor]:
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


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on weight matrices (ndim >= 2); none on gains, biases, logit_scale."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "logit_scale" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` of ``model`` (build it once the parameters are on
    their device: the fused kernel keeps its state there).

    Fused by default: one kernel per parameter group instead of a Python loop of ~10 ops
    per tensor. The optimiser step was 45% of a hardpos-tiny training step on CPU (the
    49k-token embedding dominates a tiny model); fused, the whole step ran 1.33-1.53x
    faster (hardpos-tiny, batch 32) and 1.08-1.24x (ViT-B-32, batch 16) on 2 CPU cores
    across runs: ``python -m benchmarks.suites suite=train_step`` reports it as its own row.
    """
    fused = cfg.fused and all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.eps, fused=fused or None)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / span)))


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step :func:`lr_factor` schedule (its state_dict is checkpointed with the optimiser's)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup_steps, total_steps))


def model_batch(images: torch.Tensor, text_tokens: torch.Tensor, neg_tokens: torch.Tensor,
                pos_tokens: torch.Tensor, neg_mask: torch.Tensor | None = None,
                pos_mask: torch.Tensor | None = None) -> dict[str, Any]:
    """A model batch from tensors (masks default to all-valid; every row is real)."""
    b = text_tokens.shape[0]
    ones = torch.ones(b, dtype=torch.bool, device=text_tokens.device)
    return {"images": images, "text_tokens": text_tokens, "neg_tokens": neg_tokens, "pos_tokens": pos_tokens,
            "neg_mask": ones if neg_mask is None else neg_mask, "pos_mask": ones if pos_mask is None else pos_mask,
            "row_mask": ones}


def forward_loss(net: torch.nn.Module, batch: dict[str, Any], loss_cfg: LossConfig,
                 autocast_ctx: AutocastFactory = contextlib.nullcontext) -> dict[str, torch.Tensor]:
    """Forward + cross-rank gather + combined loss for one model batch (no backward).

    Returns :func:`hardpos.train.loss.combined_loss`'s terms (``total`` and each term) and
    ``_rows``: the real rows of the global batch. Used by :func:`train_step` and by validation.
    """
    with autocast_ctx():
        out = net(batch["images"], batch["text_tokens"], batch["neg_tokens"], batch["pos_tokens"],
                  batch["neg_mask"], batch["pos_mask"])
    local = {k: out[k] for k in ("image", "text", "negative", "positive")}
    local.update(neg_mask=batch["neg_mask"], pos_mask=batch["pos_mask"], row_mask=batch["row_mask"])
    glob = gather_features(local)
    workers = glob["row_mask"].shape[0] // max(local["row_mask"].shape[0], 1)

    def loss_on(g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return combined_loss(g["image"], g["text"], g["negative"], g["positive"], g["neg_mask"], g["pos_mask"],
                             out["logit_scale"], loss_cfg, row_mask=g["row_mask"], workers=workers)

    terms = loss_on(glob)
    if workers > 1 and not loss_cfg.gather_with_grad:
        # TSVLC's weighting: the contrastive term from a gather where only this rank's rows
        # carry gradient (1/W of its full-batch gradient after DDP's average); the other
        # terms keep the exact gradient. Same values, so the logged terms do not change.
        own = loss_on(own_rows_only(glob, local))["contrastive"]
        terms["total"] = weighted_total({**terms, "contrastive": own}, loss_cfg)
    terms["_rows"] = glob["row_mask"].sum()
    return terms


def train_step(net: torch.nn.Module, batch: dict[str, Any], loss_cfg: LossConfig, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, *, grad_clip: float = 0.0,
               autocast_ctx: AutocastFactory = contextlib.nullcontext) -> dict[str, torch.Tensor]:
    """THE training step: zero grads, :func:`forward_loss`, backward, clip, optimiser step,
    scheduler step, ``logit_scale`` clamp. Updates ``net``, ``optimizer`` and ``scheduler``
    in place; returns the loss terms of this step (tensors; ``_rows`` = real global rows).

    ``net`` is a :class:`TripletCLIP` (possibly DDP-wrapped); ``grad_clip`` <= 0 skips
    clipping; ``scheduler`` None keeps the learning rate. Under DDP every rank must call it
    the same number of times (the gather and the gradient all-reduce are collectives).
    """
    optimizer.zero_grad(set_to_none=True)
    terms = forward_loss(net, batch, loss_cfg, autocast_ctx)
    terms["total"].backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    clamp_logit_scale(net)
    return terms
