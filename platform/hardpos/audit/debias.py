"""Adversarial refinement (``hardpos debias``): keep the items of a benchmark a text-only model cannot decide.

SugarCrepe removed the text shortcuts from its benchmark by selection: two different kinds of
text scorer give every (caption, edit) pair a score gap, the gaps are binned on a grid, and
items are kept in equal numbers from each cell and its *mirror* cell (every gap's sign
flipped), so that each scorer prefers the caption exactly as often as the edit: both sit at
chance. Selecting against one kind of scorer only fixes that kind; two kinds carry over to a
third. This module does the same with HardPos's two kinds of blind model
(:mod:`hardpos.audit.text_models`), per category (a benchmark's subset), and checks the result
on data and a model the selection never used.

Per category, per round (at most ``rounds``):

1. gaps: every item's ``s(caption) - s(edit)`` for each selection model (``ngram_lr``,
   ``caption_lm``) and each balanced polarity (``negative``: the hard negative; ``positive``:
   the hard positive), cross-fitted on the category's current items (folds grouped by caption,
   a new fold assignment each round);
2. cells: a gap's sign and its quantile bin of ``|gap|`` (``bins`` per column, over that
   column's non-zero gaps); a zero gap (a tie) is its own coordinate, which is its own mirror;
3. mirror balance (:func:`mirror_balance`): from every pair of mirror cells, ``min`` of the
   two counts from each, the larger side's items drawn at random (seeded); cells that are
   their own mirror keep every item.

The next round reads the kept items' gaps from a fresh cross-fit over the whole category (a
new fold assignment: the models are fitted on every item of the other folds, kept or not);
refinement stops when every selection model's pair accuracy on the kept items is within
``tolerance`` of chance or its 95% interval holds chance (selecting on noise again would only
shrink the set), or after ``rounds``. The result is then verified (:func:`verify`) by
a cross-fit with a fold assignment no round used, for the two selection models and a held-out
third kind (``char_lr``, character n-grams), beside a random subset of the same size per
category. The models are always fitted on the whole category, never on the kept items alone:
a classifier cross-fitted on a set balanced by construction learns, from the other folds, the
mirror of each held-out item and scores below chance, which says nothing about the items.

Why REPLACE's positives cannot be balanced: a mirror pair needs items where the blind model
prefers the positive to the original as well as the reverse. Each REPLACE positive swaps one
word for a fixed, rarer synonym, so both kinds of model prefer the original nearly always and
the mirrored selection keeps almost nothing. :func:`debias` measures this per category and
names it (``unbalanceable``) when the joint selection keeps less than ``min_keep`` of a
category; only generation with several synonyms per word, picked by n-gram balance, fixes it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from hardpos.audit.baselines import interval, text_scores
from hardpos.audit.config import HELDOUT_MODEL, MODELS, POLARITIES, BlindSettings, TextModelConfig
from hardpos.audit.text_models import caption_key
from hardpos.eval.items import Item


@dataclasses.dataclass(frozen=True)
class DebiasSettings:
    """The refinement (see the module doc); ``blind`` are the text models' settings."""

    blind: BlindSettings = dataclasses.field(default_factory=BlindSettings)
    polarities: tuple[str, ...] = POLARITIES
    bins: int = 10
    rounds: int = 3
    fits: int = 1
    tolerance: float = 0.03
    min_keep: float = 0.1
    seed: int = 0


def _edit(it: Item, polarity: str) -> str | None:
    return it.negative if polarity == "negative" else it.positive


def gaps(items: Sequence[Item], polarities: Sequence[str], models: Sequence[str], settings: TextModelConfig,
         seed: int, fits: int = 1) -> dict[tuple[str, str], np.ndarray]:
    """``(polarity, model) -> s(caption) - s(edit)`` per item, cross-fitted on ``items`` with
    fold assignment ``seed`` (NaN where an item has no edit of that polarity); with ``fits`` >
    1 the mean over fold assignments ``seed .. seed + fits - 1`` (a steadier estimate of each
    item's gap than one assignment's). Positive: the model prefers the caption (it gets the
    pair right). Each polarity is its own question: the classifiers learn captions against
    that polarity's edits only (a positive is not a true caption here, it is the edit to spot),
    on the items that have one."""
    out: dict[tuple[str, str], np.ndarray] = {}
    for polarity in polarities:
        has = np.array([_edit(it, polarity) is not None for it in items], dtype=bool)
        idx = np.flatnonzero(has)
        mine = [items[i] for i in idx]
        for model in models:
            total = np.full(len(items), np.nan)
            if len({caption_key(it.caption) for it in mine}) >= settings.folds:  # else too few to cross-fit
                acc = np.zeros(len(mine))
                for k in range(fits):
                    s_c, s_e, _ = text_scores([it.caption for it in mine], [_edit(it, polarity) for it in mine],
                                              [None] * len(mine), settings, seed + k, model)
                    acc += (s_c - s_e) / fits
                total[idx] = acc
            out[(polarity, model)] = total
    return out


def cells(columns: np.ndarray, bins: int) -> list[tuple[int, ...]]:
    """The grid cell of every row of ``columns`` (items x gaps): per gap its sign times its
    quantile bin (1..``bins``) of ``|gap|`` among the column's non-zero gaps; 0 for a zero gap."""
    coords = np.zeros(columns.shape, dtype=np.int64)
    for j in range(columns.shape[1]):
        g = columns[:, j]
        nz = g[g != 0]
        if not len(nz):
            continue
        edges = np.quantile(np.abs(nz), np.linspace(0, 1, bins + 1)[1:-1])
        b = np.searchsorted(edges, np.abs(g), side="right") + 1
        coords[:, j] = np.sign(g).astype(np.int64) * b
    return [tuple(r) for r in coords.tolist()]


def mirror_balance(columns: np.ndarray, bins: int, rng: np.random.Generator) -> np.ndarray:
    """Which rows to keep (bool per row of ``columns``, items x gaps): from each pair of
    mirror cells (:func:`cells`; the mirror flips every sign) as many items as the smaller of
    the two holds, from both; a cell that is its own mirror (every gap zero) keeps all."""
    where: dict[tuple[int, ...], list[int]] = {}
    for i, cell in enumerate(cells(columns, bins)):
        where.setdefault(cell, []).append(i)
    keep = np.zeros(len(columns), dtype=bool)
    for cell, rows in sorted(where.items()):
        mirror = tuple(-c for c in cell)
        if cell == mirror:
            keep[rows] = True
            continue
        if cell > mirror or mirror not in where:
            continue  # each pair once (from its smaller key), and an unmatched cell keeps nothing
        other = where[mirror]
        n = min(len(rows), len(other))
        for side in (rows, other):
            keep[side if len(side) == n else sorted(rng.choice(side, n, replace=False).tolist())] = True
    return keep


def pair_accuracy(gap: np.ndarray, groups: Sequence[str]) -> dict[str, float]:
    """The pair measure of gaps with its 95% interval, over the items that have the gap: a
    positive gap is right, a negative one wrong, and a tie (the model cannot tell the two
    captions apart) counts one half, the chance of a guess: what a blind model can get right
    is the question here, and a reordering gives a bag of words the very same features."""
    ok = ~np.isnan(gap)
    right = (gap[ok] > 0) + 0.5 * (gap[ok] == 0)
    if not len(right):
        return {"acc": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    lo, hi = interval(right, [g for g, k in zip(groups, ok) if k])
    return {"acc": float(right.mean()), "lo": lo, "hi": hi, "n": int(len(right))}


@dataclasses.dataclass
class Category:
    """One category's refinement: its items before and after, the rounds' kept counts, the
    round-0 gaps of every item (``keep.jsonl``), and why it was left as it is or a polarity
    could not be balanced."""

    name: str
    item_ids: list[str]
    kept: np.ndarray
    gaps: dict[tuple[str, str], np.ndarray]
    rounds: list[int] = dataclasses.field(default_factory=list)
    skipped: str | None = None
    unbalanceable: dict[str, str] = dataclasses.field(default_factory=dict)


def _measurable(items: Sequence[Item], blind: BlindSettings) -> str | None:
    n_caps = len({caption_key(it.caption) for it in items})
    if len(items) < blind.min_items or n_caps < blind.text_models.folds:
        return (f"{len(items)} items from {n_caps} captions: fewer than min_items={blind.min_items} or fewer captions "
                f"than folds={blind.text_models.folds}; kept as it is")
    return None


def _at_chance(g: dict[tuple[str, str], np.ndarray], groups: Sequence[str], polarities: Sequence[str],
               tolerance: float) -> bool:
    """Every selection model's pair accuracy is within ``tolerance`` of chance, or its 95%
    interval holds chance (what is left is noise: selecting on it again would only shrink the set)."""
    for p in polarities:
        for m in MODELS:
            if not (~np.isnan(g[(p, m)])).any():
                continue
            acc = pair_accuracy(g[(p, m)], groups)
            if abs(acc["acc"] - 0.5) > tolerance and not acc["lo"] <= 0.5 <= acc["hi"]:
                return False
    return True


def refine_category(name: str, items: Sequence[Item], settings: DebiasSettings) -> Category:
    """The refinement of one category's ``items`` (module doc). ``unbalanceable`` names each
    asked polarity whose joint balance with the others keeps less than ``min_keep`` of the
    category, with the counts that say why; the category is then refined on the negatives."""
    ids = [it.item_id for it in items]
    reason = _measurable(items, settings.blind)
    if reason:
        return Category(name, ids, np.ones(len(items), dtype=bool), {}, skipped=reason)
    has_pos = any(it.positive is not None for it in items)
    polarities = [p for p in settings.polarities if p == "negative" or has_pos]
    rng = np.random.default_rng(settings.seed)
    g0 = gaps(items, [p for p in POLARITIES if p == "negative" or has_pos], MODELS, settings.blind.text_models,
              settings.seed, settings.fits)
    cat = Category(name, ids, np.ones(len(items), dtype=bool), g0)
    if "positive" in polarities:
        both = np.stack([g0[(p, m)] for p in polarities for m in MODELS], axis=1)
        joint = mirror_balance(np.nan_to_num(both), settings.bins, np.random.default_rng(settings.seed))
        if joint.sum() < settings.min_keep * len(items):
            prefer = {m: float(np.mean(g0[("positive", m)][~np.isnan(g0[("positive", m)])] < 0)) for m in MODELS}
            cat.unbalanceable["positive"] = (
                f"balancing the positives with the negatives keeps {int(joint.sum())} of {len(items)} items "
                f"(< min_keep={settings.min_keep:g}): a mirror pair needs items where a blind model prefers the positive "
                f"to the original, and only " + ", ".join(f"{100 * v:.1f}% ({m})" for m, v in prefer.items())
                + " do; the positives are fixed rarer rewordings of their originals, which only generating several "
                "rewordings per word, picked by n-gram balance, can fix")
            polarities = ["negative"]
    current = np.arange(len(items))
    g = g0
    for r in range(settings.rounds):
        if r > 0:  # a fresh fold assignment over the whole category, read on what is kept
            g = gaps(items, polarities, MODELS, settings.blind.text_models, settings.seed + r * settings.fits, settings.fits)
        mine = {k: v[current] for k, v in g.items() if k[0] in polarities}
        if _at_chance(mine, [caption_key(items[i].caption) for i in current], polarities, settings.tolerance):
            break  # every selection model at chance on what is kept
        cols = np.stack([mine[(p, m)] for p in polarities for m in MODELS], axis=1)
        current = current[mirror_balance(np.nan_to_num(cols), settings.bins, rng)]
        cat.rounds.append(int(len(current)))
    cat.kept = np.zeros(len(items), dtype=bool)
    cat.kept[current] = True
    if len(current) < settings.min_keep * len(items):
        prefer = {m: float(np.mean(g0[("negative", m)] < 0)) for m in MODELS}
        cat.unbalanceable["negative"] = (
            f"the negatives' balance keeps {len(current)} of {len(items)} items (< min_keep={settings.min_keep:g}): a "
            "mirror pair needs items where a blind model prefers the negative to the caption, and only "
            + ", ".join(f"{100 * v:.1f}% ({m})" for m, v in prefer.items()) + " do")
    return cat


def verify(items: Sequence[Item], keep: np.ndarray, settings: DebiasSettings, seed: int) -> dict[str, Any]:
    """The pair measure, per polarity and model (the two selection models and the held-out
    ``char_lr``) with 95% intervals, from one fresh cross-fit over every item of the category
    (fold assignment ``seed``, which no selection round used: each item is scored by models
    fitted on the other folds of the whole category), read on every item (``before``), on the
    kept ones (``after``) and on a random subset of the same size (``random``)."""
    has_pos = any(it.positive is not None for it in items)
    polarities = [p for p in POLARITIES if p == "negative" or has_pos]
    models = [*MODELS, HELDOUT_MODEL]
    rng = np.random.default_rng(seed)
    random_keep = np.zeros(len(items), dtype=bool)
    random_keep[rng.choice(len(items), int(keep.sum()), replace=False)] = True
    reason = _measurable(items, settings.blind)
    if reason:
        return {"skipped": reason}
    g = gaps(items, polarities, models, settings.blind.text_models, seed)
    groups = np.asarray([caption_key(it.caption) for it in items], dtype=object)
    out: dict[str, Any] = {}
    for label, mask in (("before", np.ones(len(items), dtype=bool)), ("after", keep), ("random", random_keep)):
        out[label] = {"items": int(mask.sum()),
                      **{p: {m: pair_accuracy(g[(p, m)][mask], groups[mask].tolist()) for m in models} for p in polarities}}
    return out


def debias(items: Sequence[Item], settings: DebiasSettings) -> list[Category]:
    """Every category (item subset, in order) refined by :func:`refine_category`."""
    names = list(dict.fromkeys(it.subset for it in items))
    return [refine_category(name, [it for it in items if it.subset == name], settings) for name in names]
