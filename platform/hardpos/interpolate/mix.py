"""Weight-space ensembling (WiSE-FT; Wortsman et al., "Robust fine-tuning of zero-shot
models", CVPR 2022): mix a base and a finetuned model of the same architecture,

    theta(alpha) = (1 - alpha) * theta_base + alpha * theta_ft,

so alpha = 0 is the base, alpha = 1 the finetuned model, and the values between trade the
finetuned model's compositionality for the base's retention without training again.

Pure and Ray-free: two state dicts in, one out (:func:`interpolate_state`); the checks that
two models *can* be mixed (:func:`check_compatible`); and :func:`load_pair`, which loads
both endpoints from any source :func:`hardpos.models.clip.load_model` accepts (an open_clip tag,
a local checkpoint, ``s3://``, ``runs:/<id>/model``, ``models:/<name>@<alias>``) and
checks them.  The ``interpolate`` stage (:mod:`hardpos.interpolate.stage`) evaluates the
mixes and tracks them.

Exactness at the ends: the mix is computed as ``(1 - a) * base + a * ft`` in float32 and
cast back to the tensor's dtype, *not* as ``torch.lerp`` (``base + a * (ft - base)``):
with a = 1 the latter rounds ``base + (ft - base)``, which is not always ``ft``; the former
multiplies by exactly 0 and 1, so alpha = 0 and alpha = 1 give the endpoints' weights bit
for bit (and therefore their scores).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from hardpos.config import ModelConfig

if TYPE_CHECKING:  # tensors are only handled through their methods here: torch loads with the models
    import torch

    from hardpos.models.clip import LoadedModel


class ArchitectureMismatch(ValueError):
    """The two models cannot be mixed: different architectures, configs or weight shapes
    (the message names the first difference)."""


def check_alphas(alphas: Iterable[float]) -> list[float]:
    """``alphas`` as a list of floats, each in [0, 1], no duplicates, at least one.

    Values outside [0, 1] would extrapolate beyond either model, which is a different
    method (task arithmetic) than the one this stage reports.
    """
    out = [float(a) for a in alphas]
    if not out:
        raise ValueError("alphas: give at least one mixing weight in [0, 1]")
    bad = [a for a in out if not (math.isfinite(a) and 0.0 <= a <= 1.0)]
    if bad:
        raise ValueError(f"alphas must lie in [0, 1] (0 = base, 1 = finetuned), got {bad}")
    if len(set(out)) != len(out):
        raise ValueError(f"alphas must be unique, got {out}")
    return out


def _first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The dotted path of the first difference between two JSON-like values, or None."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return f"{where} (only in the {'finetuned' if key not in a else 'base'} config)"
            found = _first_difference(a[key], b[key], where)
            if found:
                return found
        return None
    return None if a == b else f"{path or '<root>'} ({a!r} vs {b!r})"


def check_compatible(base: Mapping[str, torch.Tensor], ft: Mapping[str, torch.Tensor], *,
                     base_arch: str | None = None, ft_arch: str | None = None,
                     base_cfg: Mapping[str, Any] | None = None, ft_cfg: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ArchitectureMismatch` unless the two models can be mixed key by key.

    Checked in this order, and the error names the first failure: the architecture names
    (when both are given), the model configs (the first differing key, e.g.
    ``vision_cfg.width (64 vs 128)``), the state dicts' keys (the first key only one has)
    and shapes (the first key whose shapes differ, with both shapes).
    """
    if base_arch is not None and ft_arch is not None and base_arch != ft_arch:
        raise ArchitectureMismatch(f"cannot interpolate: the base is a {base_arch!r} model, the finetuned a {ft_arch!r} model")
    if base_cfg is not None and ft_cfg is not None:
        diff = _first_difference(dict(base_cfg), dict(ft_cfg))
        if diff:
            raise ArchitectureMismatch(f"cannot interpolate: the model configs differ at {diff}")
    only_base = [k for k in base if k not in ft]
    only_ft = [k for k in ft if k not in base]
    if only_base or only_ft:
        key, side = (only_base[0], "base") if only_base else (only_ft[0], "finetuned")
        n = len(only_base) + len(only_ft)
        raise ArchitectureMismatch(f"cannot interpolate: weight {key!r} exists only in the {side} model "
                                   f"({n} key(s) differ)")
    for key, value in base.items():
        if tuple(value.shape) != tuple(ft[key].shape):
            raise ArchitectureMismatch(f"cannot interpolate: weight {key!r} has shape {tuple(value.shape)} in the base "
                                       f"and {tuple(ft[key].shape)} in the finetuned model")


def interpolate_state(base: Mapping[str, torch.Tensor], ft: Mapping[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """theta(alpha) = (1 - alpha) * base + alpha * ft over the floating-point tensors.

    Each mix is computed in float32 (bf16/fp16 weights would otherwise lose the small
    differences being mixed) and returned in the finetuned tensor's dtype. Non-floating
    tensors (integer buffers: BatchNorm's ``num_batches_tracked``, position-id tables) are
    counters and indices, not learnt weights: a weighted mean of them is meaningless (and
    would need rounding), so they are taken from the finetuned model, the model whose
    training state the mix continues. Neither input is modified. Call
    :func:`check_compatible` first; a missing key raises KeyError here.
    """
    alpha = check_alphas([alpha])[0]
    out: dict[str, torch.Tensor] = {}
    for key, f in ft.items():
        b = base[key]
        if f.is_floating_point() and b.is_floating_point():
            # (1 - a) * b + a * f, not lerp: exact endpoints (see the module docstring)
            mixed = (1.0 - alpha) * b.detach().float() + alpha * f.detach().float()
            out[key] = mixed.to(dtype=f.dtype, device=f.device)
        else:
            out[key] = f.detach().clone()
    return out


def state_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of ``model``'s state dict (so later in-place loads leave it intact)."""
    # lazy: the interpolate stage's Config validates with this module (check_alphas) at config load
    from hardpos.models.clip import unwrap

    return {k: v.detach().clone() for k, v in unwrap(model).state_dict().items()}


def load_pair(base: ModelConfig, ft: ModelConfig, *, device: str = "cpu",
              tracking_uri: str | None = None) -> tuple[LoadedModel, LoadedModel]:
    """Load both endpoints (any :func:`hardpos.models.clip.load_model` source; MLflow URIs looked up
    in ``tracking_uri``) and check that they can be mixed (:func:`check_compatible`, with
    their architecture names and model configs). Returns (base, finetuned)."""
    from hardpos.models.clip import load_model, unwrap  # lazy: see state_of

    lb = load_model(base, device=device, tracking_uri=tracking_uri)
    lf = load_model(ft, device=device, tracking_uri=tracking_uri)
    check_compatible(unwrap(lb.model).state_dict(), unwrap(lf.model).state_dict(), base_arch=lb.arch, ft_arch=lf.arch,
                     base_cfg=lb.model_cfg, ft_cfg=lf.model_cfg)
    return lb, lf
