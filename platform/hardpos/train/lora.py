"""LoRA finetuning of an open_clip CLIP, placed as TSVLC (the paper's training code) places it.

TSVLC builds every model with ``--lora 4``: in BOTH towers, every residual block's attention
(one low-rank pair on the packed q/k/v input projection and one on the output projection) and
its MLP (``c_fc``, ``c_proj``), plus the image tower's patch embedding (``conv1``), get a
rank-r update ``W + (alpha / r) * B @ A``; every other parameter (LayerNorms, embeddings,
projections, ``logit_scale``) is frozen. :func:`apply_lora` does the same to a stock open_clip
model with ``torch.nn.utils.parametrize``: the update is a parametrization of the weight
itself, so ``nn.MultiheadAttention`` (whose forward reads ``in_proj_weight`` directly, which
rules out wrapping a Linear) needs no code of its own and merging is exact.

Contracts:

* Right after :func:`apply_lora` the model computes exactly what it computed before
  (``B`` starts at 0; A is Kaiming-uniform as in loralib's Linear). TSVLC's attention pair
  starts with both A and B Xavier-random, i.e. at a random perturbation of the pretrained
  weights; HardPos starts at the pretrained model (docs/paper-recipe.md lists this).
* Only the adapters train (:func:`trainable_counts` says how many parameters that is).
* :func:`merged_state_dict` is the plain open_clip state dict of ``W + (alpha / r) B A``:
  what the checkpoint's ``model/`` holds, so evaluate, interpolate, the MLflow pyfunc and
  Serve load a LoRA-trained model like any other. :func:`adapter_state` /
  :func:`load_adapter_state` carry the adapters through a training checkpoint (the frozen
  weights come from ``model.pretrained`` again on resume).

Pure torch, no Ray.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import torch
import torch.nn.utils.parametrize as P
from torch import nn

#: the layer groups an adapter can sit on (TSVLC: all three)
TARGETS = ("attn", "mlp", "patch")
#: the towers: "visual" (image) and "text"
TOWERS = ("visual", "text")


class LoraDelta(nn.Module):
    """The parametrization ``W -> W + scale * B @ A`` (reshaped to W's shape).

    For a weight [out, in]: A [r, in], B [out, r]. For a square-kernel conv weight
    [out, in, k, k]: loralib's Conv2d layout, A [r*k, in*k], B [out*k, r*k].
    """

    def __init__(self, weight: torch.Tensor, rank: int, alpha: float) -> None:
        super().__init__()
        if weight.dim() == 2:
            out_f, in_f = weight.shape
            a_shape, b_shape = (rank, in_f), (out_f, rank)
        elif weight.dim() == 4 and weight.shape[2] == weight.shape[3]:
            out_c, in_c, k, _ = weight.shape
            a_shape, b_shape = (rank * k, in_c * k), (out_c * k, rank * k)
        else:
            raise ValueError(f"LoRA: cannot adapt a weight of shape {tuple(weight.shape)} (2-D or square conv only)")
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(a_shape, dtype=weight.dtype, device=weight.device))
        self.lora_B = nn.Parameter(torch.zeros(b_shape, dtype=weight.dtype, device=weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def delta(self) -> torch.Tensor:
        return (self.lora_B @ self.lora_A) * self.scale

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.delta().view(weight.shape).to(weight.dtype)


@dataclasses.dataclass(frozen=True)
class LoraCounts:
    """Parameter counts after :func:`apply_lora`: ``trainable`` (the adapters), ``total``
    (frozen base + adapters), ``adapted`` (weights that carry an adapter)."""

    trainable: int
    total: int
    adapted: int

    @property
    def fraction(self) -> float:
        return self.trainable / self.total if self.total else 0.0


def _targets(clip: nn.Module, targets: tuple[str, ...] | list[str], towers: tuple[str, ...] | list[str]
             ) -> Iterator[tuple[nn.Module, str, str]]:
    """(module, parameter name, dotted name) of every weight the settings adapt."""
    roots = []
    if "visual" in towers:
        roots.append(("visual", clip.visual))
    if "text" in towers:
        text = getattr(clip, "transformer", None) or getattr(getattr(clip, "text", None), "transformer", None)
        if text is None:
            raise ValueError("LoRA: this model has no open_clip text transformer (towers: drop 'text')")
        roots.append(("text", text))
    for tower, root in roots:
        for name, mod in root.named_modules():
            full = f"{tower}.{name}" if name else tower
            if isinstance(mod, nn.MultiheadAttention) and "attn" in targets:
                if mod.in_proj_weight is None:
                    raise ValueError(f"LoRA: {full} has separate q/k/v weights (not supported)")
                yield mod, "in_proj_weight", full
                yield mod.out_proj, "weight", f"{full}.out_proj"
            elif "mlp" in targets and isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in ("c_fc", "c_proj") \
                    and ".mlp." in f".{name}":
                yield mod, "weight", full
        if tower == "visual" and "patch" in targets:
            conv = getattr(root, "conv1", None)
            if isinstance(conv, nn.Conv2d):
                yield conv, "weight", "visual.conv1"


def apply_lora(clip: nn.Module, rank: int, alpha: float = 1.0, targets=TARGETS, towers=TOWERS) -> LoraCounts:
    """Put a rank-``rank`` adapter on every ``targets`` weight of ``towers`` and freeze every
    other parameter of ``clip`` (in place). Raises ValueError for rank < 1, unknown targets or
    towers, a model already adapted, or settings that adapt nothing."""
    if rank < 1:
        raise ValueError(f"LoRA: rank must be >= 1, got {rank}")
    bad = [t for t in targets if t not in TARGETS] + [t for t in towers if t not in TOWERS]
    if bad:
        raise ValueError(f"LoRA: unknown target(s)/tower(s) {bad}; targets are {TARGETS}, towers {TOWERS}")
    if has_lora(clip):
        raise ValueError("LoRA: the model already carries adapters")
    found = list(_targets(clip, tuple(targets), tuple(towers)))
    if not found:
        raise ValueError(f"LoRA: targets={list(targets)} towers={list(towers)} match no weight of this model")
    for p in clip.parameters():
        p.requires_grad_(False)
    for mod, pname, _ in found:
        P.register_parametrization(mod, pname, LoraDelta(getattr(mod, pname).detach(), rank, alpha))
    return trainable_counts(clip)


def has_lora(clip: nn.Module) -> bool:
    """True when ``clip`` carries adapters from :func:`apply_lora`."""
    return any(isinstance(m, LoraDelta) for m in clip.modules())


def trainable_counts(clip: nn.Module) -> LoraCounts:
    """Trainable / total parameters (each tensor once) and how many weights carry an adapter."""
    seen: set[int] = set()
    trainable = total = 0
    for p in clip.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return LoraCounts(trainable, total, sum(isinstance(m, LoraDelta) for m in clip.modules()))


def _plain_key(key: str) -> str | None:
    """The plain open_clip key of a parametrized state-dict key (None for an adapter tensor)."""
    if ".parametrizations." not in key and not key.startswith("parametrizations."):
        return key
    head, _, rest = key.partition("parametrizations.")
    name, _, tail = rest.partition(".")
    return f"{head}{name}" if tail == "original" else None


def merged_state_dict(clip: nn.Module) -> dict[str, torch.Tensor]:
    """The plain open_clip state dict (adapters merged: ``W + scale * B @ A``), detached, in
    the model's own key order; for a model without adapters, its state dict."""
    if not has_lora(clip):
        return {k: v.detach() for k, v in clip.state_dict().items()}
    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, value in clip.state_dict().items():
            plain = _plain_key(key)
            if plain is None:
                continue
            if plain != key:  # the parametrized weight: read it through the module (base + delta)
                owner, _, pname = plain.rpartition(".")
                value = getattr(clip.get_submodule(owner) if owner else clip, pname)
            merged[plain] = value.detach()
    return merged


def adapter_state(clip: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors (``...parametrizations.<w>.0.lora_A`` / ``lora_B``), on CPU."""
    return {k: v.detach().cpu().clone() for k, v in clip.state_dict().items() if k.endswith((".lora_A", ".lora_B"))}


def load_adapter_state(clip: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`adapter_state` into an adapted ``clip``; raises ValueError naming the keys
    when the adapters do not match (another rank, targets or model)."""
    own = {k: v for k, v in clip.state_dict().items() if k.endswith((".lora_A", ".lora_B"))}
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    shapes = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or extra or shapes:
        raise ValueError(f"LoRA: the checkpoint's adapters do not match this model's (missing {missing[:3]}, "
                         f"unexpected {extra[:3]}, other shape {shapes[:3]}): same lora.rank / targets / towers?")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(state[k])
