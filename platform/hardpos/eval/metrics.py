"""The paper's metrics, as pure functions over score arrays.

Per item: ``s_c = s(c|i)`` (true caption), ``s_n = s(c_n|i)`` (hard negative),
``s_p = s(c_p|i)`` (hard positive); cosine similarities.

* original accuracy   ``mean[s_c > s_n]``
* augmented accuracy  ``mean[s_c > s_n and s_p > s_n]``
* brittleness         ``mean[(s_c > s_n > s_p) or (s_p > s_n > s_c)]``
* aug_drop            ``aug_acc - orig_acc`` (<= 0; how much the hard positive costs)
* mean_s_c / mean_s_n / mean_s_p

This module is the one definition of these figures: the evaluator aggregates with
:func:`summarize` / :func:`mean_of`, the demo's REPLACE column with :func:`mean_over`, and
the Serve app's per-item ``/v1/compare`` answer with :func:`verdicts`.

All comparisons are strict, so a tie always counts against the model (a tie is never
"correct" and never "brittle": brittleness needs the negative strictly in between).

Items without a hard positive (``s_p`` NaN; SugarCrepe has none at all) count in the
original accuracy and the means of ``s_c``/``s_n`` only; the positive-dependent figures
(aug_acc, brittleness, aug_drop, mean_s_p) are computed over the items that have one,
and are absent when no item has one. ``orig_acc`` in ``aug_drop`` is then taken over
the same items, so ``aug_drop`` is always a like-for-like difference.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

# The names every benchmark reports (``<benchmark>/<metric>``); stable: MLflow keys.
METRICS_WITH_POSITIVES = ("orig_acc", "aug_acc", "brittleness", "aug_drop", "mean_s_c", "mean_s_n", "mean_s_p", "n_items")
METRICS_WITHOUT_POSITIVES = ("orig_acc", "mean_s_c", "mean_s_n", "n_items")


def _arrays(s_c, s_n, s_p=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = np.asarray(s_c, dtype=np.float64).reshape(-1)
    n = np.asarray(s_n, dtype=np.float64).reshape(-1)
    p = np.full_like(c, np.nan) if s_p is None else np.asarray(s_p, dtype=np.float64).reshape(-1)
    if not (len(c) == len(n) == len(p)):
        raise ValueError(f"score arrays differ in length: s_c {len(c)}, s_n {len(n)}, s_p {len(p)}")
    if np.isnan(c).any() or np.isnan(n).any():
        raise ValueError("s_c and s_n must be finite for every scored item (exclude unscorable items first)")
    return c, n, p


def orig_correct(s_c, s_n) -> np.ndarray:
    """Per item: the true caption beats the hard negative (strictly)."""
    return np.asarray(s_c, dtype=np.float64) > np.asarray(s_n, dtype=np.float64)


def aug_correct(s_c, s_n, s_p) -> np.ndarray:
    """Per item: true caption AND hard positive both strictly beat the hard negative."""
    c, n, p = (np.asarray(x, dtype=np.float64) for x in (s_c, s_n, s_p))
    return (c > n) & (p > n)  # NaN compares False: no positive -> not augmented-correct


def brittle(s_c, s_n, s_p) -> np.ndarray:
    """Per item: the negative lies strictly between the caption and the positive."""
    c, n, p = (np.asarray(x, dtype=np.float64) for x in (s_c, s_n, s_p))
    return ((c > n) & (n > p)) | ((p > n) & (n > c))


def verdicts(s_c: float, s_n: float, s_p: float | None = None) -> dict[str, bool | None]:
    """One item's verdicts (what ``/v1/compare`` answers), by the same per-item functions
    the benchmark figures average: ``correct_original``, ``correct_augmented``, ``brittle``.
    Without a hard positive (``s_p`` None) the last two are None (unknown, not False)."""
    out: dict[str, bool | None] = {"correct_original": bool(orig_correct(s_c, s_n))}
    if s_p is None:
        out.update(correct_augmented=None, brittle=None)
    else:
        out["correct_augmented"] = bool(aug_correct(s_c, s_n, s_p))
        out["brittle"] = bool(brittle(s_c, s_n, s_p))
    return out


def summarize(s_c, s_n, s_p=None) -> dict[str, float]:
    """All figures for one set of items (fractions in [0, 1]; ``n_items`` a count).

    ``s_p`` may be None or contain NaN for items without a hard positive (see module doc).
    An empty set gives ``{"n_items": 0}`` only: no accuracy is invented for no data.
    """
    c, n, p = _arrays(s_c, s_n, s_p)
    out: dict[str, float] = {"n_items": int(len(c))}
    if len(c) == 0:
        return out
    out["orig_acc"] = float(orig_correct(c, n).mean())
    out["mean_s_c"] = float(c.mean())
    out["mean_s_n"] = float(n.mean())
    has_p = ~np.isnan(p)
    if has_p.any():
        cp, np_, pp = c[has_p], n[has_p], p[has_p]
        aug = float(aug_correct(cp, np_, pp).mean())
        out["aug_acc"] = aug
        out["brittleness"] = float(brittle(cp, np_, pp).mean())
        out["aug_drop"] = aug - float(orig_correct(cp, np_).mean())
        out["mean_s_p"] = float(pp.mean())
        if not has_p.all():
            out["n_with_positive"] = int(has_p.sum())
    return out


def mean_of(subsets: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Unweighted mean of several subsets' figures (REPLACE = mean of attributes and
    relations); ``n_items`` is summed. Only metrics present in every subset are averaged."""
    subsets = [s for s in subsets if s.get("n_items", 0) > 0]
    if not subsets:
        return {"n_items": 0}
    keys = set.intersection(*(set(s) for s in subsets)) - {"n_items", "n_with_positive"}
    out: dict[str, float] = {k: float(np.mean([s[k] for s in subsets])) for k in sorted(keys)}
    out["n_items"] = int(sum(s["n_items"] for s in subsets))
    return out


def mean_over(metrics: Mapping[str, float], prefixes: Iterable[str]) -> dict[str, float]:
    """:func:`mean_of` over benchmarks logged flat (``<prefix>/<figure>`` keys), e.g. the
    demo's REPLACE = ``mean_over(m, ["world_replace_attribute", "world_replace_relation"])``.

    Returns figure -> unweighted mean, for the figures every prefix has (``n_items``
    summed when every prefix logged it). Raises KeyError naming a prefix with no figures.
    """
    prefixes = list(prefixes)
    subsets = []
    for prefix in prefixes:
        sub = {k[len(prefix) + 1:]: float(v) for k, v in metrics.items()
               if k.startswith(prefix + "/") and "/" not in k[len(prefix) + 1:]}
        if not sub:
            raise KeyError(f"no '{prefix}/...' figures in the metrics (have {sorted(metrics)[:8]}...)")
        subsets.append(sub)
    counted = all("n_items" in s for s in subsets)
    # mean_of leaves out empty subsets; a subset logged without its count is not empty.
    out = mean_of([s if counted else {**s, "n_items": 1} for s in subsets])
    if not counted:
        out.pop("n_items", None)
    return out


def benchmark_metrics(name: str, subsets: Sequence[str], s_c, s_n, s_p, aggregate: str,
                      text_sims: dict[str, Any] | None = None) -> dict[str, float]:
    """Flat metrics for one benchmark from its per-item scores (pure; the per-item file
    recomputes to the summary through this function).

    Per subset ``<name>/<subset>/<metric>`` (when there is more than one subset, or the
    benchmark averages subsets); overall ``<name>/<metric>``: the unweighted mean of the
    subsets for ``mean_of_subsets`` (REPLACE, SugarCrepe), all items pooled otherwise.
    ``text_sims`` (per-item ``t_cp, t_cn, t_pn``; SugarCrepe++) adds ``text_only_acc`` by
    the same rule (:func:`text_only_metrics`).
    """
    subsets_arr = np.asarray(list(subsets), dtype=object)
    s_c, s_n, s_p = (np.asarray(x, dtype=np.float64) for x in (s_c, s_n, s_p))
    names = list(dict.fromkeys(subsets_arr.tolist()))
    per_subset = {sub: summarize(s_c[subsets_arr == sub], s_n[subsets_arr == sub], s_p[subsets_arr == sub]) for sub in names}
    out: dict[str, float] = {}
    if len(names) > 1 or aggregate == "mean_of_subsets":
        for sub, figs in per_subset.items():
            out.update({f"{name}/{sub}/{k}": v for k, v in figs.items()})
    overall = mean_of(per_subset.values()) if aggregate == "mean_of_subsets" else summarize(s_c, s_n, s_p)
    out.update({f"{name}/{k}": v for k, v in overall.items()})
    if text_sims:
        out.update(text_only_metrics(name, subsets_arr.tolist(), text_sims, aggregate))
    return out


# --------------------------------------------------------------------------- SugarCrepe++'s text-only task
# Per-item text-only cosines (EvalReport.scores_table columns when a benchmark has them).
TEXT_COLUMNS = ("t_cp", "t_cn", "t_pn")
TEXT_ONLY_METRIC = "text_only_acc"
TEXT_ONLY_ITEMS = "text_only_n_items"  # the items the text-only figures cover (images or not)


def text_only_correct(t_cp, t_cn, t_pn) -> np.ndarray:
    """Per item: the two positives are strictly closer to each other than either is to the
    negative (SugarCrepe++'s TOT; a tie is not correct)."""
    cp, cn, pn = (np.asarray(x, dtype=np.float64) for x in (t_cp, t_cn, t_pn))
    return (cp > cn) & (cp > pn)


def text_only_metrics(name: str, subsets: Sequence[str], text_sims: Mapping[str, Any], aggregate: str) -> dict[str, float]:
    """``<name>/<subset>/text_only_acc`` per subset (when there is more than one, or the
    benchmark averages subsets) and ``<name>/text_only_acc`` overall: the unweighted mean of
    the subsets for ``mean_of_subsets``, all items pooled otherwise (the same rule as the
    image figures in :func:`benchmark_metrics`), and ``<name>/text_only_n_items``, the items
    covered. Empty subsets give no figure (no accuracy is invented for no data)."""
    sub = np.asarray(list(subsets), dtype=object)
    arrays = [np.asarray(text_sims[k], dtype=np.float64).reshape(-1) for k in TEXT_COLUMNS]
    if not all(len(a) == len(sub) for a in arrays):
        raise ValueError(f"text-only scores and subsets differ in length: {[len(a) for a in arrays]} vs {len(sub)}")
    if any(np.isnan(a).any() for a in arrays):
        raise ValueError("text-only scores must be finite for every item")
    correct = text_only_correct(*arrays)
    names = list(dict.fromkeys(sub.tolist()))
    per = {s: float(correct[sub == s].mean()) for s in names if (sub == s).any()}
    out: dict[str, float] = {}
    if len(names) > 1 or aggregate == "mean_of_subsets":
        out.update({f"{name}/{s}/{TEXT_ONLY_METRIC}": v for s, v in per.items()})
    if per:
        overall = float(np.mean(list(per.values()))) if aggregate == "mean_of_subsets" else float(correct.mean())
        out[f"{name}/{TEXT_ONLY_METRIC}"] = overall
        out[f"{name}/{TEXT_ONLY_ITEMS}"] = int(len(sub))
    return out
