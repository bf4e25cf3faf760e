"""Adversarial refinement (``hardpos debias``): keep the items of a benchmark a text-only model cannot decide.

SugarCrepe removed the text shortcuts from its benchmark by selection: different kinds of text
scorer give every (caption, edit) pair a score gap, the gaps are binned on a grid, and items
are kept in equal numbers from each cell and its *mirror* cell (every gap's sign flipped), so
that each scorer prefers the caption exactly as often as the edit: all sit at chance. Selecting
against one kind of scorer only fixes that kind; several kinds carry over to another. This
module does the same with three kinds of blind model (:data:`SELECTION_MODELS`: the word n-gram
classifier ``ngram_lr``, the word language model ``caption_lm`` and the character language
model ratio ``char_lm``, :mod:`hardpos.audit.baselines`), per category (a benchmark's subset),
and checks the result on data and a model the selection never used.

Per category, per round (at most ``rounds``):

1. gaps: every item's ``s(caption) - s(edit)`` for each selection model and each balanced
   polarity (``negative``: the hard negative; ``positive``: the hard positive), the mean over
   ``fits`` cross-fits on the whole category (folds grouped by caption, new fold assignments
   each round);
2. cells: a gap's sign and its quantile bin of ``|gap|`` (``bins`` per column, over that
   column's non-zero gaps); a zero gap (a tie) is its own coordinate, which is its own mirror;
3. mirror balance (:func:`mirror_balance`): from every pair of mirror cells, ``min`` of the
   two counts from each; cells that are their own mirror keep every item. Which items the
   larger side keeps is not left to chance: each is the one that keeps the kept edits' word
   counts closest to their captions' (:class:`hardpos.rules.balance.NgramBalance`, word
   1-``balance_ngrams`` grams; ties to a seeded shuffle), so a substitution kept one way tends
   to be kept the other way too ("man -> woman" beside "woman -> man"). A reader of the edited
   words (the held-out character model among them) then finds both directions equally often.

Refinement stops when every selection model's pair accuracy on the kept items, the mean over
the round's ``fits`` fresh cross-fits of one cross-fit's accuracy (what the check below
measures), is within ``tolerance`` of chance or within the noise of those fits
(:func:`fold_noise`), or after ``rounds``. The first round balances every selection model; a
later one only those still off chance (:func:`off_chance`), so that one model's residue does not
cost a fresh cut on a grid of every model. The kept set is what is shipped, so the question is
how a model fitted on the category reads *these* items: the noise is the spread between fold
assignments, not item sampling. A 95% item interval that holds chance is no reason to stop:
on the 641 REPLACE relations a selection with two models kept, the language model's three
fits read 55.8, 52.3 and 52.2% (mean 53.4, fold noise 0.5 points) while the item interval,
[49.1, 57.7], held chance.

The result is then verified (:func:`verify`) by ``checks`` cross-fits with fold assignments no
round used, for the selection models and a held-out kind (``char_lr``, a logistic regression on
character 2-5 grams within words: a discriminative reader, never used to select), beside a
random subset of the same size per category. Each item counts the share of the check's fits
that get it right (a tie one half); one fold assignment alone moves a figure on a few hundred
items by several points (those 641 relations: 50.9 to 56.4 for the language model over five
assignments). The models are always fitted on the whole category, never on the kept
items alone: a classifier cross-fitted on a set balanced by construction learns, from the
other folds, the mirror of each held-out item and scores below chance, which says nothing
about the items.

Why REPLACE's positives cannot be balanced: a mirror pair needs items where the blind model
prefers the positive to the original as well as the reverse. Each REPLACE positive swaps one
word for a fixed, rarer synonym, so both kinds of model prefer the original nearly always and
the mirrored selection keeps almost nothing. :func:`debias` measures this per category and
names it (``unbalanceable``) when the joint selection keeps less than ``min_keep`` of a
category; only generation with several synonyms per word, picked by n-gram balance, fixes it.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from hardpos.audit.baselines import Z95, interval, text_scores
from hardpos.audit.config import HELDOUT_MODEL, POLARITIES, SELECTION_MODELS, BlindSettings, TextModelConfig
from hardpos.audit.text_models import caption_key
from hardpos.eval.items import Item
from hardpos.rules.balance import NgramBalance


@dataclasses.dataclass(frozen=True)
class DebiasSettings:
    """The refinement (see the module doc); ``blind`` are the text models' settings."""

    blind: BlindSettings = dataclasses.field(default_factory=BlindSettings)
    polarities: tuple[str, ...] = POLARITIES
    bins: int = 4
    rounds: int = 2
    fits: int = 3
    tolerance: float = 0.03
    min_keep: float = 0.1
    seed: int = 0
    #: the selection models (each balanced), in order
    models: tuple[str, ...] = SELECTION_MODELS
    #: word n-grams (1..) whose counts pick the larger mirror side's items; 0: a seeded random draw
    balance_ngrams: int = 1
    #: fresh cross-fits the check (:func:`verify`) averages over
    checks: int = 5


def _edit(it: Item, polarity: str) -> str | None:
    return it.negative if polarity == "negative" else it.positive


def fit_gaps(items: Sequence[Item], polarities: Sequence[str], models: Sequence[str], settings: TextModelConfig,
             seed: int, fits: int = 1) -> dict[tuple[str, str], np.ndarray]:
    """``(polarity, model) -> `` the gaps ``s(caption) - s(edit)`` of every item (columns) under
    each of ``fits`` cross-fits (rows) on ``items``, fold assignments ``seed .. seed + fits - 1``
    (NaN where an item has no edit of that polarity or the polarity has too few captions to
    cross-fit). Positive: the model prefers the caption (it gets the pair right). Each polarity
    is its own question: the classifiers learn captions against that polarity's edits only (a
    positive is not a true caption here, it is the edit to spot), on the items that have one."""
    out: dict[tuple[str, str], np.ndarray] = {}
    for polarity in polarities:
        has = np.array([_edit(it, polarity) is not None for it in items], dtype=bool)
        idx = np.flatnonzero(has)
        mine = [items[i] for i in idx]
        for model in models:
            total = np.full((fits, len(items)), np.nan)
            if len({caption_key(it.caption) for it in mine}) >= settings.folds:  # else too few to cross-fit
                for k in range(fits):
                    s_c, s_e, _ = text_scores([it.caption for it in mine], [_edit(it, polarity) for it in mine],
                                              [None] * len(mine), settings, seed + k, model)
                    total[k, idx] = s_c - s_e
            out[(polarity, model)] = total
    return out


def gaps(items: Sequence[Item], polarities: Sequence[str], models: Sequence[str], settings: TextModelConfig,
         seed: int, fits: int = 1) -> dict[tuple[str, str], np.ndarray]:
    """``(polarity, model) -> `` each item's gap, the mean over the ``fits`` cross-fits of
    :func:`fit_gaps` (a steadier estimate of each item's gap than one assignment's)."""
    return {k: v.mean(axis=0) for k, v in fit_gaps(items, polarities, models, settings, seed, fits).items()}


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


def edit_counts(items: Sequence[Item], polarities: Sequence[str], ngrams: int) -> list[Counter[str]]:
    """Per item, the signed word n-gram counts (1..``ngrams``) its edits of ``polarities`` add
    over its caption (:meth:`hardpos.rules.balance.NgramBalance.delta`, summed over polarities)."""
    bal = NgramBalance(ngrams)
    out = []
    for it in items:
        d: Counter[str] = Counter()
        for p in polarities:
            e = _edit(it, p)
            if e is not None:
                d.update(bal.delta(it.caption, e))
        out.append(Counter({f: v for f, v in d.items() if v}))
    return out


def _pick_balanced(pool: list[int], n: int, deltas: Sequence[Counter[str]], diff: Counter[str]) -> list[int]:
    """``n`` rows of ``pool`` picked one at a time, each the one whose counts grow the L1 norm
    of ``diff`` (updated in place) least; ties go to the order of ``pool``."""
    pool, picked = list(pool), []
    for _ in range(n):
        best = min(range(len(pool)),
                   key=lambda j: sum(abs(diff[f] + v) - abs(diff[f]) for f, v in deltas[pool[j]].items()))
        row = pool.pop(best)
        picked.append(row)
        for f, v in deltas[row].items():
            diff[f] += v
    return picked


def mirror_balance(columns: np.ndarray, bins: int, rng: np.random.Generator,
                   deltas: Sequence[Counter[str]] | None = None) -> np.ndarray:
    """Which rows to keep (bool per row of ``columns``, items x gaps): from each pair of
    mirror cells (:func:`cells`; the mirror flips every sign) as many items as the smaller of
    the two holds, from both; a cell that is its own mirror (every gap zero) keeps all.

    deltas: per row, the signed word counts its edit adds over its caption (:func:`edit_counts`).
    Given, the larger side of each pair keeps the rows that bring the kept rows' summed counts
    closest to zero (:func:`_pick_balanced`, after every row kept without a choice is counted;
    pairs in cell order, each side's rows in a seeded shuffle); without, a seeded random draw."""
    where: dict[tuple[int, ...], list[int]] = {}
    for i, cell in enumerate(cells(columns, bins)):
        where.setdefault(cell, []).append(i)
    keep = np.zeros(len(columns), dtype=bool)
    choices: list[tuple[list[int], int]] = []
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
            if len(side) == n:
                keep[side] = True
            elif deltas is None:
                keep[sorted(rng.choice(side, n, replace=False).tolist())] = True
            else:
                choices.append((side, n))
    if choices:
        diff: Counter[str] = Counter()
        for i in np.flatnonzero(keep):
            diff.update(deltas[i])  # type: ignore[index]
        for side, n in choices:
            keep[_pick_balanced(rng.permutation(side).tolist(), n, deltas, diff)] = True  # type: ignore[arg-type]
    return keep


def pair_accuracy(gap: np.ndarray, groups: Sequence[str]) -> dict[str, Any]:
    """The pair measure of gaps with its 95% interval, over the items that have the gap: a
    positive gap is right, a negative one wrong, and a tie (the model cannot tell the two
    captions apart) counts one half, the chance of a guess: what a blind model can get right
    is the question here, and a reordering gives a bag of words the very same features.

    ``gap`` is one gap per item, or one row per cross-fit (fits x items): then each item counts
    the share of fits that get it right, the figure is the mean of the fits' figures, and
    ``fits`` lists them."""
    rows = np.atleast_2d(gap)
    ok = ~np.isnan(rows).any(axis=0)
    per_fit = (rows[:, ok] > 0) + 0.5 * (rows[:, ok] == 0)
    right = per_fit.mean(axis=0)
    if not len(right):
        return {"acc": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    lo, hi = interval(right, [g for g, k in zip(groups, ok) if k])
    out: dict[str, Any] = {"acc": float(right.mean()), "lo": lo, "hi": hi, "n": int(len(right))}
    if gap.ndim == 2:
        out["fits"] = [float(x) for x in per_fit.mean(axis=1)]
    return out


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


def fold_noise(per_fit: np.ndarray) -> float:
    """The standard error of the mean over cross-fits (rows of ``per_fit``: fits x items) of
    one cross-fit's pair accuracy on a fixed set of items, from the fits alone: each item is
    right in a fresh fit with its own chance ``p_i``, estimated by the share of the fits that
    get it right (corrected for the few fits; with one fit, the largest ``p_i (1 - p_i)``, 1/4)."""
    ok = ~np.isnan(per_fit).any(axis=0)
    right = (per_fit[:, ok] > 0) + 0.5 * (per_fit[:, ok] == 0)
    k, n = right.shape
    if not n:
        return float("nan")
    if k == 1:
        var = np.full(n, 0.25)
    else:
        p = right.mean(axis=0)
        var = np.minimum(0.25, p * (1 - p) * k / (k - 1))
    return float(np.sqrt(var.sum() / k) / n)


def off_chance(per_fit: dict[tuple[str, str], np.ndarray], groups: Sequence[str], polarities: Sequence[str],
               models: Sequence[str], tolerance: float) -> list[tuple[str, str]]:
    """The (polarity, model) pairs whose pair accuracy on the items, the mean over the model's
    cross-fits (rows of ``per_fit``: fits x items) of one cross-fit's accuracy, is further from
    chance than ``tolerance`` and than the fits' own noise (:func:`fold_noise`, 95%: selecting
    on that noise would only shrink the set). Item sampling is not the noise here (module doc)."""
    out = []
    for p in polarities:
        for m in models:
            g = per_fit[(p, m)]
            if np.isnan(g).all():
                continue
            off = abs(pair_accuracy(g, groups)["acc"] - 0.5)
            if off > tolerance and off > Z95 * fold_noise(g):
                out.append((p, m))
    return out


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
    models = list(settings.models)
    rng = np.random.default_rng(settings.seed)
    f0 = fit_gaps(items, [p for p in POLARITIES if p == "negative" or has_pos], models, settings.blind.text_models,
                  settings.seed, settings.fits)
    g0 = {k: v.mean(axis=0) for k, v in f0.items()}
    cat = Category(name, ids, np.ones(len(items), dtype=bool), g0)
    if "positive" in polarities:
        both = np.stack([g0[(p, m)] for p in polarities for m in models], axis=1)
        joint = mirror_balance(np.nan_to_num(both), settings.bins, np.random.default_rng(settings.seed))
        if joint.sum() < settings.min_keep * len(items):
            prefer = {m: float(np.mean(g0[("positive", m)][~np.isnan(g0[("positive", m)])] < 0)) for m in models}
            cat.unbalanceable["positive"] = (
                f"balancing the positives with the negatives keeps {int(joint.sum())} of {len(items)} items "
                f"(< min_keep={settings.min_keep:g}): a mirror pair needs items where a blind model prefers the positive "
                f"to the original, and only " + ", ".join(f"{100 * v:.1f}% ({m})" for m, v in prefer.items())
                + " do; the positives are fixed rarer rewordings of their originals, which only generating several "
                "rewordings per word, picked by n-gram balance, can fix")
            polarities = ["negative"]
    deltas = edit_counts(items, polarities, settings.balance_ngrams) if settings.balance_ngrams else None
    current = np.arange(len(items))
    f = f0
    for r in range(settings.rounds):
        if r > 0:  # fresh fold assignments over the whole category, read on what is kept
            f = fit_gaps(items, polarities, models, settings.blind.text_models, settings.seed + r * settings.fits,
                         settings.fits)
        mine = {k: v[:, current] for k, v in f.items() if k[0] in polarities}
        off = off_chance(mine, [caption_key(items[i].caption) for i in current], polarities, models, settings.tolerance)
        if not off:
            break  # every selection model at chance on what is kept
        # the first round balances every model; a later one those still off chance (balancing
        # the others again on a set they already read at chance would only shrink it)
        cols = np.stack([mine[k].mean(axis=0) for k in (off if r else [(p, m) for p in polarities for m in models])],
                        axis=1)
        chosen = mirror_balance(np.nan_to_num(cols), settings.bins, rng,
                                None if deltas is None else [deltas[i] for i in current])
        current = current[chosen]
        cat.rounds.append(int(len(current)))
    cat.kept = np.zeros(len(items), dtype=bool)
    cat.kept[current] = True
    if len(current) < settings.min_keep * len(items):
        prefer = {m: float(np.mean(g0[("negative", m)] < 0)) for m in models}
        cat.unbalanceable["negative"] = (
            f"the negatives' balance keeps {len(current)} of {len(items)} items (< min_keep={settings.min_keep:g}): a "
            "mirror pair needs items where a blind model prefers the negative to the caption, and only "
            + ", ".join(f"{100 * v:.1f}% ({m})" for m, v in prefer.items()) + " do")
    return cat


def verify(items: Sequence[Item], keep: np.ndarray, settings: DebiasSettings, seed: int) -> dict[str, Any]:
    """The pair measure, per polarity and model (the selection models and the held-out
    ``char_lr``) with 95% intervals, from ``checks`` fresh cross-fits over every item of the
    category (fold assignments ``seed ..``, which no selection round used: each item is scored
    by models fitted on the other folds of the whole category, and counts the share of the
    fits that get it right; ``fits`` lists each fit's figure), read on every item
    (``before``), on the kept ones (``after``) and on a random subset of the same size
    (``random``)."""
    has_pos = any(it.positive is not None for it in items)
    polarities = [p for p in POLARITIES if p == "negative" or has_pos]
    models = [*settings.models, HELDOUT_MODEL]
    rng = np.random.default_rng(seed)
    random_keep = np.zeros(len(items), dtype=bool)
    random_keep[rng.choice(len(items), int(keep.sum()), replace=False)] = True
    reason = _measurable(items, settings.blind)
    if reason:
        return {"skipped": reason}
    g = fit_gaps(items, polarities, models, settings.blind.text_models, seed, settings.checks)
    groups = np.asarray([caption_key(it.caption) for it in items], dtype=object)
    out: dict[str, Any] = {}
    for label, mask in (("before", np.ones(len(items), dtype=bool)), ("after", keep), ("random", random_keep)):
        out[label] = {"items": int(mask.sum()),
                      **{p: {m: pair_accuracy(g[(p, m)][:, mask], groups[mask].tolist()) for m in models}
                         for p in polarities}}
    return out


def debias(items: Sequence[Item], settings: DebiasSettings) -> list[Category]:
    """Every category (item subset, in order) refined by :func:`refine_category`."""
    names = list(dict.fromkeys(it.subset for it in items))
    return [refine_category(name, [it for it in items if it.subset == name], settings) for name in names]
