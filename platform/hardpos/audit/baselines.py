"""Blind baselines: the figures a text-only model reaches on a benchmark without the image.

A benchmark asks about a pair (does the model prefer the original to the edit?), and a model
that reads only the two captions can often answer it: an edit may use a word ordinary captions
rarely use, or make an unlikely combination. A CLIP score on such a benchmark mixes what the
image teaches with what the text alone gives. :func:`blind_baseline` measures the second part
so that it can be reported beside every model (the evaluate stage, ``hardpos audit``) and
selected away (``hardpos debias``).

Per subset of the benchmark (REPLACE's attributes / relations, a SugarCrepe category, a triplet
file's subset) and per text model (:mod:`hardpos.audit.text_models`), every text of every item
gets a score from a model fitted on the other folds (grouped by original caption):

* ``ngram_lr``: the n-gram classifier of *true captions* (the original and, where the
  benchmark has them, the hard positive) against hard negatives; the score is minus its
  decision value (higher: more like a true caption);
* ``caption_lm``: the log-probability under the n-gram language model of the other folds'
  original captions (higher: more like an ordinary caption);
* ``char_lm`` (not a baseline: ``hardpos debias``'s third selection model): two character
  3-gram language models (interpolated Kneser-Ney), one of the other folds' true captions and
  one of their hard negatives; the score is the log-likelihood ratio (higher: spelled more like
  a true caption). A generative reader of spelling, where ``caption_lm`` reads words;
* ``char_lr`` (not a baseline by default: ``hardpos debias`` keeps it out of its selection to
  verify on): the same classifier as ``ngram_lr`` on character 2-5 grams.

Then the paper's figures on those scores, by the same per-item functions as a model's
(:mod:`hardpos.eval.metrics`; strict, ties count against): ``orig_acc`` = mean[s_c > s_n], the
**pair measure** (chance 50); with positives ``aug_acc`` = mean[s_c > s_n and s_p > s_n] and
``brittleness`` = mean[(s_c > s_n > s_p) or (s_p > s_n > s_c)] (chance 33.3 each for scores
in random order). Each comes with a 95% interval (:func:`interval`): a Wilson interval at the
effective sample size of the cluster-robust variance, since items that share an original
caption are not independent. A benchmark's overall figure combines its subsets as its model
figures do (the unweighted mean of subsets for REPLACE and SugarCrepe, all items pooled for a
triplet file), its interval from the subsets' standard errors.

The baseline depends on the benchmark's texts and the settings only, never on a model: it is
computed once per benchmark and process (a cache keyed by a digest of both).

Metric names (:func:`flat_metrics`): ``blind/<benchmark>/<subset>/<model>/<figure>`` with
``.../<figure>_lo`` and ``_hi`` (per subset, where the benchmark reports subsets) and
``blind/<benchmark>/<model>/<figure>`` overall; ``blind/<benchmark>/<subset>/n_items``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from hardpos.audit.config import CHAR_LM, CHAR_LM_ORDER, HELDOUT_MODEL, MODELS, BlindSettings, TextModelConfig
from hardpos.audit.text_models import CaptionLM, CharLM, caption_key, char_design, design, fit_design, group_folds, vocabulary
from hardpos.eval.items import Item
from hardpos.eval.metrics import aug_correct, brittle, orig_correct

#: the figures of a blind baseline, in table order (orig_acc is the pair measure)
FIGURES = ("orig_acc", "aug_acc", "brittleness")
#: the figures' chance levels (scores in random order)
CHANCE = {"orig_acc": 0.5, "aug_acc": 1 / 3, "brittleness": 1 / 3}
Z95 = 1.959963984540054


# --------------------------------------------------------------------------- statistics
def standard_error(correct: np.ndarray, groups: Sequence[str]) -> float:
    """The cluster-robust standard error of the mean of ``correct`` (0/1 per item), items of
    one group (original caption) counted as one cluster."""
    x = np.asarray(correct, dtype=np.float64)
    n = len(x)
    if n == 0:
        return float("nan")
    m = x.mean()
    _, inverse = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    sums = np.bincount(inverse, weights=x - m)
    g = len(sums)
    if g < 2:
        return math.sqrt(m * (1 - m) / n)
    return math.sqrt(g / (g - 1) * float((sums ** 2).sum())) / n


def interval(correct: np.ndarray, groups: Sequence[str]) -> tuple[float, float]:
    """95% interval of the mean of ``correct``: Wilson's, at the effective sample size
    ``n / design effect`` of the cluster-robust variance (:func:`standard_error`; the design
    effect is at least 1, so clustering can only widen the interval)."""
    x = np.asarray(correct, dtype=np.float64)
    n = len(x)
    if n == 0:
        return float("nan"), float("nan")
    m = float(x.mean())
    iid = m * (1 - m) / max(n - 1, 1)  # the cluster-robust variance of singleton clusters, for a like design effect
    se = standard_error(x, groups)
    deff = max(1.0, se * se / iid) if iid > 0 else 1.0
    n_eff = n / deff
    z2 = Z95 * Z95
    centre = (m + z2 / (2 * n_eff)) / (1 + z2 / n_eff)
    half = Z95 * math.sqrt(m * (1 - m) / n_eff + z2 / (4 * n_eff * n_eff)) / (1 + z2 / n_eff)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float], ses: Sequence[float]) -> tuple[float, float]:
    """95% normal interval of the unweighted mean of independent subsets' figures."""
    mean = float(np.mean(values))
    se = math.sqrt(sum(s * s for s in ses)) / len(ses)
    return max(0.0, mean - Z95 * se), min(1.0, mean + Z95 * se)


# --------------------------------------------------------------------------- the scores
def _nan_scores(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)


def _log_likelihood_ratio(true: CaptionLM, edits: CaptionLM):
    """texts -> log P(text | true) - log P(text | edits)."""
    return lambda texts: true.logprob(texts) - edits.logprob(texts)


def text_scores(captions: Sequence[str], negatives: Sequence[str], positives: Sequence[str | None],
                settings: TextModelConfig, seed: int, model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cross-fitted text-only scores ``(s_c, s_n, s_p)`` of ``model`` for items (caption,
    negative, positive or None), fitted with ``settings`` on folds assigned by ``seed``; higher
    means more like a true caption. ``s_p`` is NaN where an item has no positive. Folds are
    grouped by caption (see the module doc). Raises ValueError when there are fewer distinct
    captions than folds."""
    n = len(captions)
    groups = [caption_key(c) for c in captions]
    fold_of = np.asarray(group_folds(groups, settings.folds, seed))
    has_p = np.array([p is not None for p in positives], dtype=bool)
    pos = [p if p is not None else "" for p in positives]
    s_c, s_n, s_p = _nan_scores(n)
    if model in ("ngram_lr", HELDOUT_MODEL):
        texts = [*captions, *negatives, *pos]
        x = design(texts, vocabulary(texts, settings.ngrams), settings.ngrams) if model == "ngram_lr" else char_design(texts)
        for f in range(settings.folds):
            train, test = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
            rows = np.concatenate([train, n + train, 2 * n + train[has_p[train]]])
            labels = [0] * len(train) + [1] * len(train) + [0] * int(has_p[train].sum())
            w, b = fit_design(x[rows], labels, l2=settings.l2, steps=settings.steps)
            s_c[test], s_n[test] = -(x[test] @ w + b), -(x[n + test] @ w + b)
            tp = test[has_p[test]]
            s_p[tp] = -(x[2 * n + tp] @ w + b)
        return s_c, s_n, s_p
    if model in ("caption_lm", CHAR_LM):
        for f in range(settings.folds):
            train, test = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
            if model == "caption_lm":  # originals only: it has never seen an edit
                score = CaptionLM(settings.order, settings.discount).fit(
                    list(dict.fromkeys(captions[i] for i in train))).logprob
            else:  # true captions (and positives) against the edits
                score = _log_likelihood_ratio(
                    CharLM(CHAR_LM_ORDER, settings.discount).fit(
                        list(dict.fromkeys([*(captions[i] for i in train), *(pos[i] for i in train if has_p[i])]))),
                    CharLM(CHAR_LM_ORDER, settings.discount).fit(list(dict.fromkeys(negatives[i] for i in train))))
            s_c[test] = score([captions[i] for i in test])
            s_n[test] = score([negatives[i] for i in test])
            tp = test[has_p[test]]
            s_p[tp] = score([pos[i] for i in tp])
        return s_c, s_n, s_p
    raise ValueError(f"unknown text model {model!r}; models: {[*MODELS, CHAR_LM, HELDOUT_MODEL]}")


# --------------------------------------------------------------------------- one benchmark
@dataclasses.dataclass
class SubsetBaseline:
    """One subset's blind figures per model: ``figures[model][figure] = (value, lo, hi)``;
    ``se[model][figure]`` the standard errors; ``skipped`` says why it was not measured."""

    subset: str
    n_items: int
    n_captions: int
    figures: dict[str, dict[str, tuple[float, float, float]]] = dataclasses.field(default_factory=dict)
    se: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    skipped: str | None = None


@dataclasses.dataclass
class BlindResult:
    """A benchmark's blind baseline: per-item scores (``scores[model] = (s_c, s_n, s_p)``
    over ``item_ids``, NaN for items of unmeasured subsets), per-subset figures, the overall
    figures (``overall[model][figure] = (value, lo, hi)``), and what each model is."""

    name: str
    aggregate: str
    item_ids: list[str]
    subsets: list[str]
    scores: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    per_subset: list[SubsetBaseline]
    overall: dict[str, dict[str, tuple[float, float, float]]]
    models: dict[str, str]

    def rows(self) -> list[dict[str, Any]]:
        """One plain row per subset (and ``all`` overall) and model, for tables and JSON:
        ``{benchmark, subset, model, n_items, skipped, <figure>, <figure>_lo, <figure>_hi}``."""
        out = []
        subs = self.per_subset if (len(self.per_subset) > 1 or self.aggregate == "mean_of_subsets") else []
        for sub in subs:
            for model in self.models:
                row: dict[str, Any] = {"benchmark": self.name, "subset": sub.subset, "model": model,
                                       "n_items": sub.n_items, "skipped": sub.skipped}
                for fig, (v, lo, hi) in sub.figures.get(model, {}).items():
                    row.update({fig: v, f"{fig}_lo": lo, f"{fig}_hi": hi})
                out.append(row)
        for model in self.models:
            row = {"benchmark": self.name, "subset": "all", "model": model,
                   "n_items": sum(s.n_items for s in self.per_subset if s.skipped is None),
                   "skipped": None if self.overall.get(model) else "no subset measured"}
            for fig, (v, lo, hi) in self.overall.get(model, {}).items():
                row.update({fig: v, f"{fig}_lo": lo, f"{fig}_hi": hi})
            out.append(row)
        return out

    def correct(self, model: str) -> dict[str, bool | None]:
        """item id -> the blind model gets the item right (``orig_acc``'s verdict: the caption
        beats the negative); None for items of unmeasured subsets."""
        s_c, s_n, _ = self.scores[model]
        return {i: (None if np.isnan(c) else bool(c > n)) for i, c, n in zip(self.item_ids, s_c, s_n)}


def _subset_figures(s_c: np.ndarray, s_n: np.ndarray, s_p: np.ndarray, groups: list[str]
                    ) -> tuple[dict[str, tuple[float, float, float]], dict[str, float]]:
    verdicts = {"orig_acc": orig_correct(s_c, s_n)}
    has_p = ~np.isnan(s_p)
    if has_p.any():
        verdicts["aug_acc"] = aug_correct(s_c[has_p], s_n[has_p], s_p[has_p])
        verdicts["brittleness"] = brittle(s_c[has_p], s_n[has_p], s_p[has_p])
    figs, ses = {}, {}
    for fig, v in verdicts.items():
        g = groups if fig == "orig_acc" else [x for x, keep in zip(groups, has_p) if keep]
        lo, hi = interval(v, g)
        figs[fig] = (float(v.mean()), lo, hi)
        ses[fig] = standard_error(v, g)
    return figs, ses


_CACHE: dict[str, BlindResult] = {}


def _digest(name: str, items: Sequence[Item], aggregate: str, settings: BlindSettings) -> str:
    h = hashlib.sha256(json.dumps([name, aggregate, dataclasses.asdict(settings)], sort_keys=True).encode())
    for it in items:
        h.update(json.dumps([it.item_id, it.subset, it.caption, it.negative, it.positive]).encode())
    return h.hexdigest()


def blind_baseline(name: str, items: Sequence[Item], aggregate: str, settings: BlindSettings | None = None) -> BlindResult:
    """The blind baseline of the benchmark ``name`` from its items (every item, whether or not
    its image could be read: no image is used), combined over subsets as ``aggregate``
    (``mean_of_subsets`` or ``pooled``). Computed once per benchmark texts and settings in a
    process (later calls return the cached result)."""
    settings = settings or BlindSettings()
    key = _digest(name, items, aggregate, settings)
    if key in _CACHE:
        return _CACHE[key]
    ids = [it.item_id for it in items]
    subsets = [it.subset for it in items]
    n = len(items)
    scores = {m: _nan_scores(n) for m in settings.models}
    per_subset: list[SubsetBaseline] = []
    sub_arr = np.asarray(subsets, dtype=object)
    names = list(dict.fromkeys(subsets))
    for sub in names:
        idx = np.flatnonzero(sub_arr == sub)
        mine = [items[i] for i in idx]
        groups = [caption_key(it.caption) for it in mine]
        base = SubsetBaseline(sub, len(mine), len(set(groups)))
        if len(mine) < settings.min_items or base.n_captions < settings.text_models.folds:
            base.skipped = (f"{len(mine)} items from {base.n_captions} captions: fewer than min_items={settings.min_items} "
                            f"items or fewer captions than folds={settings.text_models.folds}")
            per_subset.append(base)
            continue
        for model in settings.models:
            s = text_scores([it.caption for it in mine], [it.negative for it in mine], [it.positive for it in mine],
                            settings.text_models, settings.seed, model)
            for k in range(3):
                scores[model][k][idx] = s[k]
            base.figures[model], base.se[model] = _subset_figures(*s, groups)
        per_subset.append(base)
    overall: dict[str, dict[str, tuple[float, float, float]]] = {}
    measured = [b for b in per_subset if b.skipped is None]
    for model in settings.models:
        if not measured:
            continue
        if aggregate == "mean_of_subsets" or len(names) == 1:
            figs = {}
            for fig in FIGURES:
                have = [b for b in measured if fig in b.figures[model]]
                if len(have) != len(measured):
                    continue  # a figure some subset lacks (no positives there) is not averaged
                if len(have) == 1:
                    figs[fig] = have[0].figures[model][fig]
                    continue
                values = [b.figures[model][fig][0] for b in have]
                figs[fig] = (float(np.mean(values)), *mean_interval(values, [b.se[model][fig] for b in have]))
            overall[model] = figs
        else:  # pooled over the measured subsets' items
            idx = np.flatnonzero(np.isin(sub_arr, [b.subset for b in measured]))
            groups = [caption_key(items[i].caption) for i in idx]
            overall[model] = _subset_figures(*(a[idx] for a in scores[model]), groups)[0]
    result = BlindResult(name, aggregate, ids, subsets, scores, per_subset, overall,
                         {m: settings.text_models.describe(m) for m in settings.models})
    _CACHE[key] = result
    return result


def flat_metrics(result: BlindResult) -> dict[str, float]:
    """The MLflow metrics of a blind baseline (names in the module doc)."""
    out: dict[str, float] = {}
    for row in result.rows():
        where = [result.name] if row["subset"] == "all" else [result.name, row["subset"]]
        if row["subset"] != "all":
            out["/".join(["blind", *where, "n_items"])] = float(row["n_items"])
        for fig in FIGURES:
            if fig in row:
                for suffix in ("", "_lo", "_hi"):
                    out["/".join(["blind", *where, row["model"], fig + suffix])] = float(row[fig + suffix])
    return out
