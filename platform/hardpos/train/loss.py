"""The combined hard-negative + hard-positive loss (SVLC-style, as the paper's finetuning), pure torch.

Inputs are per-sample feature rows of one (global) batch of ``B`` slots:

* ``image`` I, ``text`` T           [B, D]  L2-normalised
* ``negative`` N, ``positive`` P    [B, D]  zero rows where the sample has none
* ``neg_mask`` n, ``pos_mask`` p    [B]     bool: the sample has a negative / positive
* ``row_mask`` r                    [B]     bool: the slot holds a real sample (False for
  padding: a worker's short batch, an image that failed to decode). Default: all True.
* ``logit_scale``                   scalar  the model's *log* scale; s = exp(logit_scale)

Every term is computed over fixed shapes with masks, so a batch gathered from several
workers (each padded to the same local size) gives exactly the value of the same samples
in one batch: masked columns get a -1e9 logit (weight exactly 0 in every float32 softmax)
and masked rows are left out of every mean.

Terms (each returned under its own name; ``loss/<name>`` when logged):

* ``contrastive``   CLIP + NegCLIP columns: mean of CE(s*I*[T ; N_valid]^T, i) and
                    CE(s*T*I^T, i).  The N columns are present only when hard negatives
                    are in use (``w_neg > 0``) and ``negclip_columns`` is True.
* ``hard_negative`` 2-way CE over s*[<I_i,T_i>, <I_i,N_i>], target 0; mean over rows with a
                    negative (0 when none).
* ``hard_positive`` over the valid positives only: mean of CE(s*I*P^T, own index) and
                    CE(s*T*P^T, own index) (0 when none).
* ``pos_over_neg``  2-way CE over s*[<I_i,P_i>, <I_i,N_i>], target 0; rows with both.
* ``kl``            KL(uniform || softmax(s*[<I_i,T_i>, <I_i,P_i>])); rows with a positive.
* ``total``         contrastive + w_pos*hard_positive + w_neg*hard_negative
                    + w_pos_over_neg*pos_over_neg + w_kl*kl.

A term whose weight is 0 is not added at all (not multiplied by 0), so it is removed
exactly: a NaN/inf in an unused term cannot leak into ``total`` or the gradients.

How ``w_neg`` and the NegCLIP columns relate (the paper's Table 3 grid). The paper's
Appendix D.1 names three terms: a contrastive loss across the batch as in CLIP, a hard
negative loss and a hard positive loss, on 4 GPUs. Its code base (TSVLC) also appends the
negatives as extra text columns of the contrastive term, but only in a single process: on
several GPUs its feature gather keeps the first B text rows of each rank and the negative
columns vanish. So what the paper ran is plain CLIP contrastive + the 2-way negative term +
the positive term, which is ``negclip_columns=False`` (the paper preset). The columns
(NegCLIP, unweighted) remain an option; with them on, ``w_neg`` = 0.25 is not a quarter of
``w_neg`` = 1, because the columns switch on at full weight as soon as ``w_neg > 0``.

The paper's ablation row "0 HN" is a model trained with *no* hard negatives at all (its
original accuracy falls below the base's), so ``w_neg = 0`` means exactly that: no columns,
no 2-way term, and the gradient of ``total`` with respect to the negative features is
exactly 0. ``pos_over_neg`` also reads the negatives, so it is refused together with
``w_neg = 0``.

Where the hard-positive term looks (``analogy_scope``): TSVLC computes it on each GPU's own
batch before the gather (B_local columns); ``"worker"`` reproduces that on the gathered
batch with a block-diagonal column mask (each row sees only its own worker's positives);
``"global"`` (default) lets every row see every worker's positives. The two agree exactly
on one worker. With several workers ``"worker"`` is the mean over rows of the per-worker
terms, which equals TSVLC's mean of per-GPU means when every worker holds the same number of
valid positives.

Why not ``open_clip.loss.ClipLoss`` directly: its B x B image/text matrix is exactly our
text->image half (and the image->text half without NegCLIP columns; the tests check we
match it), but the NegCLIP columns make image->text B x 2B and the masked positive/negative
terms need the gathered N and P anyway, so one masked gather of all four feature sets
(:func:`gather_features`) replaces ClipLoss's separate gather.

Multi-worker (:func:`gather_features`): every rank pads its local batch to the same size,
gathers I, T, N, P and the masks from all ranks *with gradient* and computes the loss of
the whole global batch.  The all-gather's backward sums the gradients of every rank's copy
of the loss into each rank's local features (``world_size`` x dL/dfeature), and DDP then
averages parameter gradients over ranks, so the update equals the single-worker update on
the same global batch.  Nothing is dropped: missing negatives travel as zero rows + mask.

``gather_with_grad=False`` (TSVLC's setting, the paper preset): the contrastive term is
computed on a gather in which only the rank's own rows carry gradient, so each rank's
contrastive gradient is dL_con/d(its own rows) once instead of ``world_size`` times, and
after DDP's average the contrastive term weighs 1/W of its full-batch gradient. TSVLC
computes its negative and positive terms per GPU, so they keep full weight: here they stay
on the with-gradient gather (:func:`hardpos.train.step.forward_loss` builds ``total`` from
both). tests/test_train_loss.py checks both settings' gradients on 2 gloo ranks against the
analytic expectation (the full gradient; 1/W of the contrastive part + the rest).
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hardpos.models.clip import unwrap
from hardpos.train.config import LossConfig

TERMS = ("contrastive", "hard_negative", "hard_positive", "pos_over_neg", "kl")
LOGIT_SCALE_MAX = math.log(100.0)
_MASKED = -1e9




def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask``; exactly 0 (still in the graph) when none."""
    mask = mask.to(values.dtype)
    # where() rather than multiply so an inf/NaN in a masked row cannot poison the sum.
    picked = torch.where(mask > 0, values, torch.zeros_like(values))
    return picked.sum() / mask.sum().clamp(min=1.0)


def _zero_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.unsqueeze(1), x, torch.zeros_like(x))


def _row_ce(logits: torch.Tensor, col_mask: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-row cross-entropy with invalid columns excluded (``col_mask``: [cols] for every
    row alike, or [rows, cols] per row).

    Invalid columns get the logit ``_MASKED`` (not -inf): exp() of it underflows to exactly
    0 next to any real logit (|s * cos| <= 100), and a row whose columns are all invalid
    (no positives in the batch) stays finite, so its zero weight in the mean cannot turn
    into 0 * NaN in the backward pass.
    """
    logits = logits.masked_fill(~(col_mask if col_mask.dim() == 2 else col_mask.unsqueeze(0)), _MASKED)
    return F.cross_entropy(logits, target, reduction="none")


def _two_way(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row 2-way CE over [a, b] with target 0: log(1 + exp(b - a))."""
    return F.softplus(b - a)


def combined_loss(
    image: torch.Tensor,
    text: torch.Tensor,
    negative: torch.Tensor,
    positive: torch.Tensor,
    neg_mask: torch.Tensor,
    pos_mask: torch.Tensor,
    logit_scale: torch.Tensor,
    cfg: LossConfig | None = None,
    row_mask: torch.Tensor | None = None,
    workers: int = 1,
) -> dict[str, torch.Tensor]:
    """All loss terms and ``total`` (0-dim float32 tensors); see the module docstring.

    ``workers``: how many equal, contiguous blocks of rows the batch is made of (the ranks
    of a gathered batch, rank 0 first); only ``analogy_scope="worker"`` reads it.
    Raises ValueError for mismatched shapes or a batch that does not split into ``workers``. Works in float32 whatever the feature dtype
    (bf16 autocast features are upcast: softmax over a few thousand logits in bf16 is not
    accurate enough to compare terms).
    """
    cfg = cfg or LossConfig()
    b, d = image.shape
    for name, t in (("text", text), ("negative", negative), ("positive", positive)):
        if t.shape != (b, d):
            raise ValueError(f"combined_loss: {name} has shape {tuple(t.shape)}, expected {(b, d)}")
    for name, m in (("neg_mask", neg_mask), ("pos_mask", pos_mask)):
        if m.shape != (b,):
            raise ValueError(f"combined_loss: {name} has shape {tuple(m.shape)}, expected {(b,)}")
    if workers < 1 or b % workers:
        raise ValueError(f"combined_loss: {b} rows do not split into {workers} equal worker blocks")
    rows = torch.ones(b, dtype=torch.bool, device=image.device) if row_mask is None else row_mask.bool()
    n = neg_mask.bool() & rows
    p = pos_mask.bool() & rows
    # Masked rows are replaced by zeros (where(), not multiply): whatever a padded slot
    # holds, even NaN, then contributes exactly nothing to the values or the gradients.
    image, text = (_zero_rows(t.float(), rows) for t in (image, text))
    negative, positive = _zero_rows(negative.float(), n), _zero_rows(positive.float(), p)
    s = logit_scale.float().exp()
    target = torch.arange(b, device=image.device)

    # Contrastive: image -> [T ; N] columns (N only where valid), text -> image.
    i_t = s * image @ text.T
    if cfg.negative_columns:
        i_cols = torch.cat([i_t, s * image @ negative.T], dim=1)
        col_mask = torch.cat([rows, n])
    else:
        i_cols, col_mask = i_t, rows
    l_i2t = _row_ce(i_cols, col_mask, target)
    l_t2i = _row_ce(s * text @ image.T, rows, target)
    contrastive = (_masked_mean(l_i2t, rows) + _masked_mean(l_t2i, rows)) / 2

    sim_it = s * (image * text).sum(-1)
    sim_in = s * (image * negative).sum(-1)
    sim_ip = s * (image * positive).sum(-1)

    hard_negative = _masked_mean(_two_way(sim_it, sim_in), n)

    # Analogy: rows and columns restricted to the batch's valid positives (and, per worker,
    # to the row's own worker block).
    pos_cols = p
    if cfg.analogy_scope == "worker" and workers > 1:
        block = torch.arange(b, device=image.device) // (b // workers)
        pos_cols = p.unsqueeze(0) & (block.unsqueeze(0) == block.unsqueeze(1))
    l_ip = _row_ce(s * image @ positive.T, pos_cols, target)
    l_tp = _row_ce(s * text @ positive.T, pos_cols, target)
    hard_positive = (_masked_mean(l_ip, p) + _masked_mean(l_tp, p)) / 2

    pos_over_neg = _masked_mean(_two_way(sim_ip, sim_in), n & p)

    # KL(u || q) with u = (1/2, 1/2), q = softmax([<I,T>, <I,P>]): -log 2 - mean(log q).
    log_q = torch.stack([sim_it, sim_ip], dim=1).log_softmax(dim=1)
    kl = _masked_mean(-math.log(2.0) - log_q.mean(dim=1), p)

    terms = {
        "contrastive": contrastive,
        "hard_negative": hard_negative,
        "hard_positive": hard_positive,
        "pos_over_neg": pos_over_neg,
        "kl": kl,
    }
    return {"total": weighted_total(terms, cfg), **terms}


def weighted_total(terms: Mapping[str, torch.Tensor], cfg: LossConfig) -> torch.Tensor:
    """``contrastive + w_pos*hard_positive + w_neg*hard_negative + ...``; a term whose weight
    is 0 is not added at all (see the module docstring)."""
    total = terms["contrastive"]
    for name, weight in (("hard_positive", cfg.w_pos), ("hard_negative", cfg.w_neg),
                         ("pos_over_neg", cfg.w_pos_over_neg), ("kl", cfg.w_kl)):
        if weight != 0:
            total = total + weight * terms[name]
    return total


def loss_metrics(terms: Mapping[str, torch.Tensor], prefix: str = "loss/") -> dict[str, float]:
    """``{"loss/total": float, "loss/contrastive": ...}`` for logging and ray.train.report."""
    return {f"{prefix}{k}": float(v.detach()) for k, v in terms.items()}


# --------------------------------------------------------------------------- multi-worker
FEATURE_KEYS = ("image", "text", "negative", "positive")
MASK_KEYS = ("neg_mask", "pos_mask", "row_mask")


class GatherWithGrad(torch.autograd.Function):
    """``dist.all_gather`` that passes gradients back: every rank's tensor, in rank order.

    Backward sums each part's gradient over the ranks (every rank's loss used this rank's rows)
    and returns this rank's part -- what ``torch.distributed.nn.functional.all_gather`` did, on
    public collectives only (that function is deprecated).
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor)
        return tuple(parts)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        stacked = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return stacked[dist.get_rank()]


def gather_features(local: Mapping[str, torch.Tensor], with_grad: bool = True) -> dict[str, torch.Tensor]:
    """Concatenate every rank's features and masks (masks without gradient).

    ``local`` holds :data:`FEATURE_KEYS` ([B_local, D], the same B_local on every rank:
    pad short batches and set ``row_mask``) and :data:`MASK_KEYS` ([B_local] bool).
    ``with_grad``: the gathered features pass gradients back to the rank that made them
    (:class:`GatherWithGrad`); False: the other ranks' rows are constants and only this
    rank's own rows (its live ``local`` tensors, put back in its slot) carry gradient, as
    open_clip's ``gather_with_grad=False`` (TSVLC). The values are the same either way.
    Without an initialised process group (or world size 1) it returns ``local`` unchanged.
    Rows are ordered rank 0 first, so the global batch is the ranks' batches in order.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return dict(local)
    out: dict[str, torch.Tensor] = {}
    world = dist.get_world_size()
    for key in FEATURE_KEYS:
        if with_grad:
            out[key] = torch.cat(GatherWithGrad.apply(local[key].contiguous()), dim=0)
        else:
            mine = local[key].contiguous()
            parts = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(parts, mine.detach())
            parts[dist.get_rank()] = mine
            out[key] = torch.cat(parts, dim=0)
    for key in MASK_KEYS:
        # gloo cannot all_gather bool tensors: travel as uint8.
        m = local[key].to(torch.uint8).contiguous()
        parts = [torch.empty_like(m) for _ in range(world)]
        dist.all_gather(parts, m)
        out[key] = torch.cat(parts).bool()
    return out


def own_rows_only(glob: Mapping[str, torch.Tensor], local: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``glob`` (a with-gradient :func:`gather_features`) as ``gather_features(local,
    with_grad=False)`` would give it, without another collective: every other rank's rows
    detached, this rank's slot replaced by its live ``local`` features."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return dict(glob)
    out = dict(glob)
    for key in FEATURE_KEYS:
        b = local[key].shape[0]
        start = dist.get_rank() * b
        frozen = glob[key].detach()
        out[key] = torch.cat([frozen[:start], local[key], frozen[start + b:]], dim=0)
    return out


def clamp_logit_scale(model: torch.nn.Module) -> None:
    """Clamp ``logit_scale`` to [0, ln 100] in place (call after every optimiser step)."""
    m = unwrap(model)
    with torch.no_grad():
        m.logit_scale.clamp_(0, LOGIT_SCALE_MAX)
