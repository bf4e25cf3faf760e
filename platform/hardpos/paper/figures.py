"""The paper's own figures and the mean ± std over seeds of the demo's rows.

The paper (Kamath et al., ECCV 2024) reports, for CLIP ViT-B/32 finetuned on COCO, Table 1
(the base, HN-only and HP+HN on REPLACE and SWAP) and Table 3 (the w_neg grid at w_pos = 1):
:data:`PAPER_TABLE1`, :data:`PAPER_TABLE3` and :func:`paper_figures` give them by the demo's
model names, so every table the testbed prints can set the paper's numbers beside its own.
:func:`aggregate` is the mean and sample std over seeds of every cell, and
:func:`paired_test` the one-sided paired t-test (``scipy.stats.t``) the seed comparisons use.
What the testbed claims is decided by the preregistered checks (:mod:`hardpos.paper.confirm`),
not here. Pure functions.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Mapping, Sequence

from scipy import stats

Rows = Mapping[str, Mapping[str, float]]

#: the grid's rows are named ``w_neg=<value>`` (the demo's ``--full`` sweep, w_pos = 1)
GRID_PREFIX = "w_neg="


def p_text(p: float) -> str:
    """A p-value as a table prints it: three decimals, and "p < 0.001" below that."""
    return "p < 0.001" if p < 0.0005 else f"p = {p:.3f}"


#: The paper's Table 1 (CLIP ViT-B/32 finetuned on COCO): per model, per benchmark,
#: (original acc., augmented acc., brittleness) in %. Keys are the demo's model names.
PAPER_TABLE1: dict[str, dict[str, tuple[float, float, float]]] = {
    "pretrained": {"replace": (61.6, 46.8, 23.2), "swap": (60.5, 49.6, 21.7)},
    "hn-only": {"replace": (73.9, 55.7, 21.0), "swap": (74.3, 60.5, 25.1)},
    "hp+hn": {"replace": (69.0, 58.0, 16.9), "swap": (73.2, 61.1, 22.9)},
}
#: The paper's Table 3 (w_pos = 1): benchmark -> w_neg -> (original acc., augmented acc.,
#: brittleness) in %; w_neg = 1 is Table 1's HP+HN.
PAPER_TABLE3: dict[str, dict[float, tuple[float, float, float]]] = {
    "replace": {0.0: (58.5, 49.8, 15.8), 0.25: (66.0, 55.5, 16.6), 0.5: (67.3, 56.9, 16.4), 0.75: (68.2, 57.6, 16.6),
                1.0: PAPER_TABLE1["hp+hn"]["replace"]},
    "swap": {0.0: (64.1, 51.2, 25.0), 0.25: (71.6, 59.8, 22.8), 0.5: (72.5, 60.5, 22.8), 0.75: (72.9, 61.0, 22.7),
             1.0: PAPER_TABLE1["hp+hn"]["swap"]},
}


def paper_figures(model: str, group: str) -> tuple[float, float, float] | None:
    """The paper's (original acc., augmented acc., brittleness) in % for one of the demo's models
    (case-insensitive; ``w_neg=<v>`` from Table 3) on ``group`` ("replace" | "swap"), None
    where the paper reports none."""
    key = model.lower()
    if key in PAPER_TABLE1:
        return PAPER_TABLE1[key][group]
    if key.startswith(GRID_PREFIX):
        try:
            return PAPER_TABLE3[group].get(float(key[len(GRID_PREFIX):]))
        except ValueError:  # not a grid row after all ("w_neg=x")
            return None
    return None


# --------------------------------------------------------------------------- statistics
def aggregate(per_seed: Sequence[Mapping[str, Mapping[str, float]]]) -> tuple[dict, dict]:
    """Mean and (sample) standard deviation over seeds: (model -> col -> mean, model -> col -> std).

    Models present in every seed only; std is 0.0 for a single seed."""
    if not per_seed:
        raise ValueError("no seeds to aggregate")
    models = [m for m in per_seed[0] if all(m in s for s in per_seed)]
    mean: dict[str, dict[str, float]] = {}
    std: dict[str, dict[str, float]] = {}
    for m in models:
        cols = [c for c in per_seed[0][m] if all(c in s[m] for s in per_seed)]
        mean[m], std[m] = {}, {}
        for c in cols:
            vals = [float(s[m][c]) for s in per_seed]
            mu = sum(vals) / len(vals)
            mean[m][c] = mu
            std[m][c] = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return mean, std


@dataclasses.dataclass(frozen=True)
class Paired:
    """A one-sided paired t-test of per-seed differences (H1: mean > 0): n, mean, std, t, p."""

    n: int
    mean: float
    sd: float
    t: float
    p: float


def paired_test(diffs: Sequence[float]) -> Paired:
    """One-sided paired t-test that the mean of ``diffs`` is above 0 (needs n >= 2). Zero
    spread: p is 0 for a positive mean and 1 otherwise."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"paired_test needs at least 2 differences, got {n}")
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    if sd == 0:
        return Paired(n, mean, 0.0, math.copysign(math.inf, mean) if mean else 0.0, 0.0 if mean > 0 else 1.0)
    t = mean / (sd / math.sqrt(n))
    return Paired(n, mean, sd, t, float(stats.t.sf(t, n - 1)))
