"""Rule-based hard negatives and hard positives for free-form (COCO-style) captions.

:class:`RulePerturber` is deterministic: the same caption, seed and lexicon always give
the same perturbations in the same order, and :meth:`RulePerturber.pick` draws one with
a generator seeded by ``(seed, polarity, kind, caption)`` (a stable hash, not Python's
salted ``hash``), so a dataset can be regenerated exactly on any worker.

Hard negatives (CREPE / SugarCrepe style; the meaning changes):

* REPLACE an attribute (colour, material, size, state ...), a relation (spatial
  preposition, verb) or an object with the canonical form of another group of the same
  lexicon class ("red"->"blue", "above"->"below", "sitting"->"standing", "dog"->"cat").
* SWAP two attributes of one class between two different nouns ("Blue bathroom with two
  white towels" -> "White bathroom with two blue towels"), or two nouns of one kind
  (animate / vehicle / thing / place) that are not conjuncts of one "and"
  ("a dog chasing a cat" -> "a cat chasing a dog").

Hard positives (the meaning is kept):

* REPLACE one word/phrase with a synonym from its lexicon group or the paper's table
  ("walking"->"strolling", "next to"->"beside", "red"->"crimson"), only where the
  lexicon's sense rules allow it in this context ("flying a kite" is never "soaring a
  kite"; see :mod:`hardpos.rules.lexicon`), not for a noun that modifies another noun
  ("street signs" -> "road signs") and not for a capitalised word inside the caption
  (a name: "the Blue Angels").
* SWAP the two conjuncts around "and" with their modifiers: noun phrases ("a sink,
  toilet and shower" -> "a sink, shower and toilet"), verb phrases ("a man wearing
  glasses and holding a bottle" -> "a man holding a bottle and wearing glasses") and
  adjectives ("a black and white cat" -> "a white and black cat").

Whenever the structure is unclear (an unknown word where a boundary should be, a
predicate adjective with no noun, "on" before a surface like "the beach"), the rule is
skipped rather than emitting nonsense.  Articles a/an are fixed after an edit, and
sentence-initial capitals move with the edit.

Layout: this module holds :class:`RulePerturber` (the public API and its per-caption
cache) and the seeded picks. The rules are functions over a
:class:`~hardpos.rules.context.RuleContext` (the lexicon and the word sets derived from it,
built once per perturber): REPLACE in :mod:`hardpos.rules.replace`, SWAP in
:mod:`hardpos.rules.swap`, the token helpers and lexicon matching they share in
:mod:`hardpos.rules.context`; tokens, records and text edits in :mod:`hardpos.rules.text`.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Hashable

from hardpos.rules.balance import NgramBalance
from hardpos.rules.context import RuleContext, matches
from hardpos.rules.english import new_problems
from hardpos.rules.lexicon import Lexicon, load_lexicon
from hardpos.rules.replace import replace_edits
from hardpos.rules.swap import swap_attributes, swap_conjuncts, swap_objects
from hardpos.rules.text import KINDS, POLARITIES, Perturbation, dedupe, stable_seed, tokenize
from hardpos.rules.validate import validate

#: captions a perturber remembers; past it the cache starts afresh (a bound on memory, not a policy)
CACHE_SIZE = 4096


class RulePerturber:
    """Deterministic rule engine over a curated lexicon.

    seed:    seeds :meth:`pick` (together with the caption).
    lexicon: a :class:`~hardpos.rules.lexicon.Lexicon`; default: the shipped lexicon with
             the paper's replacement table.

    Holds the seed, the lexicon, its :class:`~hardpos.rules.context.RuleContext` (``ctx``)
    and a per-caption cache of both polarities' perturbations.
    """

    def __init__(self, seed: int = 0, lexicon: Lexicon | None = None):
        self.seed = int(seed)
        self.lexicon = lexicon if lexicon is not None else load_lexicon()
        self.ctx = RuleContext.of(self.lexicon)
        self._cache: dict[str, tuple[list[Perturbation], list[Perturbation]]] = {}

    def hard_negatives(self, caption: str) -> list[Perturbation]:
        """Every hard negative the rules can make for ``caption`` (deterministic order, no duplicates)."""
        return list(self._both(caption)[0])

    def hard_positives(self, caption: str) -> list[Perturbation]:
        """Every hard positive the rules can make for ``caption`` (deterministic order, no duplicates)."""
        return list(self._both(caption)[1])

    def pick(self, caption: str, polarity: str, kind: str | None = None) -> Perturbation | None:
        """One seeded choice among the perturbations of ``polarity`` ("negative" | "positive"),
        optionally restricted to ``kind`` ("replace" | "swap"); None when there is none.
        See :func:`draw`."""
        if polarity not in POLARITIES:
            raise ValueError(f"polarity must be one of {POLARITIES}, got {polarity!r}")
        options = self.hard_negatives(caption) if polarity == "negative" else self.hard_positives(caption)
        return draw(caption, options, self.seed, polarity, kind)

    def candidates(self, caption: str, kinds: list[str] | tuple[str, ...] = KINDS, negatives: bool = True,
                   positives: bool = True) -> tuple[list[Perturbation], list[Perturbation]]:
        """(hard negatives, hard positives) of ``kinds`` for ``caption``; an unwanted polarity is
        empty. What :func:`pick_triplet` picks from, and what the perturb stage makes in parallel."""
        return ([p for p in self.hard_negatives(caption) if p.kind in kinds] if negatives else [],
                [p for p in self.hard_positives(caption) if p.kind in kinds] if positives else [])

    def _both(self, caption: str) -> tuple[list[Perturbation], list[Perturbation]]:
        if not isinstance(caption, str):
            raise TypeError(f"caption must be a string, got {type(caption).__name__}")
        hit = self._cache.get(caption)
        if hit is not None:
            return hit
        both = perturbations(self.ctx, caption)
        if len(self._cache) > CACHE_SIZE:
            self._cache.clear()
        self._cache[caption] = both
        return both


def perturbations(ctx: RuleContext, caption: str) -> tuple[list[Perturbation], list[Perturbation]]:
    """(hard negatives, hard positives) of ``caption``: every rule family's output in a fixed
    order (REPLACE, SWAP attributes, SWAP objects; REPLACE, SWAP conjuncts), deduplicated by
    normalised text, and only candidates whose determiners agree with their nouns as far as
    the original's do (:func:`hardpos.rules.english.new_problems`)."""
    toks = tokenize(caption)
    found = matches(ctx, toks)
    neg = dedupe(caption, [*replace_edits(ctx, caption, toks, found, "negative"),
                           *swap_attributes(ctx, caption, toks, found),
                           *swap_objects(ctx, caption, toks, found)])
    pos = dedupe(caption, [*replace_edits(ctx, caption, toks, found, "positive"),
                           *swap_conjuncts(ctx, caption, toks)])
    # "a skateboard" -> "a skis", "a plate of pizza" -> "a plate of carrot" never leave here
    neg = [p for p in neg if not new_problems(caption, p.text)]
    pos = [p for p in pos if not new_problems(caption, p.text)]
    return neg, pos


_PERTURBERS: dict[tuple[int, Hashable], RulePerturber] = {}


def cached_perturber(seed: int, lexicon_key: Hashable, make_lexicon: Callable[[], Lexicon]) -> RulePerturber:
    """One :class:`RulePerturber` per (seed, lexicon) per process, reused across Ray tasks and
    stages (its per-caption cache then serves them all). ``lexicon_key`` names the lexicon
    ``make_lexicon`` builds; it is called only on the first request for that key."""
    key = (int(seed), lexicon_key)
    if key not in _PERTURBERS:
        _PERTURBERS[key] = RulePerturber(seed=seed, lexicon=make_lexicon())
    return _PERTURBERS[key]


def draw(caption: str, options: list[Perturbation], seed: int, polarity: str, kind: str | None = None,
         balance: NgramBalance | None = None) -> Perturbation | None:
    """One choice among ``options`` (a caption's perturbations of ``polarity``), optionally
    restricted to ``kind`` ("replace" | "swap"); None when there is none.

    The choice first draws a slot family (attribute / relation / object / conjuncts ...)
    uniformly, then a perturbation inside it, so frequent families (colours) do not crowd out
    rare ones; both draws are seeded by ``(seed, polarity, kind, caption)``. With ``balance``
    the perturbation inside the family is the one that keeps the picks' n-gram counts closest
    to their captions' (:meth:`NgramBalance.best`; the seeded draw wins ties); the family draw
    is the same either way.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} or None, got {kind!r}")
    if kind is not None:
        options = [p for p in options if p.kind == kind]
    if not options:
        return None
    families: dict[str, list[Perturbation]] = {}
    for p in options:
        families.setdefault(p.slot.split(" ", 1)[0].split(":", 1)[0] + "/" + p.kind, []).append(p)
    rng = random.Random(stable_seed(seed, polarity, kind, caption))
    family = families[rng.choice(sorted(families))]
    drawn = rng.choice(family)
    if balance is None or len(family) == 1:
        return drawn
    best = balance.best(caption, [p.text for p in family], drawn.text)
    return next(p for p in family if p.text == best)


def pick_triplet(rules: RulePerturber, caption: str, seed: int, kinds: list[str] | tuple[str, ...] = KINDS,
                 negatives: bool = True, positives: bool = True,
                 balance: tuple[NgramBalance, NgramBalance] | None = None) -> dict:
    """The hard negative and hard positive the ``perturb`` stage writes for ``caption``.

    One kind per row, so both members of the triplet come from the same REPLACE/SWAP family:
    a kind is drawn (seeded by ``(seed, "kind", caption)``) among those with both a negative and
    a positive (or, when none has both, either), then :func:`draw` picks inside it (seeded by
    the rules' seed). A picked output the shared validator rejects is never returned (defence
    in depth). ``balance``: the (negatives', positives') n-gram balances of the picks so far,
    which the picks use and are added to (:mod:`hardpos.rules.balance`).

    Returns ``{"kind", "neg", "neg_slot", "pos", "pos_slot", "cov"}``: texts and slots are None
    where nothing was picked; ``cov`` maps ``neg_<kind>`` / ``pos_<kind>`` to whether the rules
    make any of that kind for the caption.
    """
    negs, poss = rules.candidates(caption, kinds, negatives, positives)
    return pick_from(caption, negs, poss, seed, rules.seed, kinds, negatives, positives, balance)


def pick_from(caption: str, negs: list[Perturbation], poss: list[Perturbation], seed: int, rules_seed: int,
              kinds: list[str] | tuple[str, ...] = KINDS, negatives: bool = True, positives: bool = True,
              balance: tuple[NgramBalance, NgramBalance] | None = None) -> dict:
    """:func:`pick_triplet` on a caption's candidates already made (``negs`` / ``poss``, of
    ``kinds`` only): the perturb stage makes them in parallel and picks in one process, in
    order, when the picks are balanced."""
    cov = {f"neg_{k}": any(p.kind == k for p in negs) for k in kinds}
    cov.update({f"pos_{k}": any(p.kind == k for p in poss) for k in kinds})
    both = [k for k in kinds if (not negatives or cov[f"neg_{k}"]) and (not positives or cov[f"pos_{k}"])]
    either = [k for k in kinds if cov.get(f"neg_{k}") or cov.get(f"pos_{k}")]
    pool = both or either
    kind = None
    neg = pos = None
    if pool:
        kind = random.Random(stable_seed(seed, "kind", caption)).choice(pool)
        neg_balance, pos_balance = balance if balance is not None else (None, None)
        neg = draw(caption, negs, rules_seed, "negative", kind, neg_balance) \
            if negatives and cov.get(f"neg_{kind}") else None
        pos = draw(caption, poss, rules_seed, "positive", kind, pos_balance) \
            if positives and cov.get(f"pos_{kind}") else None
        if neg is not None and not validate(caption, neg.text, kind + "_negative").accepted:
            neg = None
        if pos is not None and not validate(caption, pos.text, kind).accepted:
            pos = None
        if neg is not None and neg_balance is not None:
            neg_balance.add(caption, neg.text)
        if pos is not None and pos_balance is not None:
            pos_balance.add(caption, pos.text)
    return {"kind": kind, "neg": neg.text if neg else None, "neg_slot": neg.slot if neg else None,
            "pos": pos.text if pos else None, "pos_slot": pos.slot if pos else None, "cov": cov}


def pick_balanced(captions: list[str], candidates: list[tuple[list[Perturbation], list[Perturbation]]],
                  seed: int, rules_seed: int, kinds: list[str] | tuple[str, ...] = KINDS, negatives: bool = True,
                  positives: bool = True) -> tuple[list[dict], dict]:
    """:func:`pick_from` for a whole caption set with balanced picks: every caption's picks
    (in the order of ``captions``; ``candidates[i]`` are caption i's negatives and positives of
    ``kinds``), made in one order shuffled by ``seed``, with one n-gram balance per polarity
    (:mod:`hardpos.rules.balance`). What the ``perturb`` stage writes by default.

    Also returns ``{"ngram_imbalance_per_pick": {polarity: {"balanced", "seeded_random"}}}``:
    the picks' imbalance beside that of the seeded-random picks from the same candidates."""
    order = list(range(len(captions)))
    random.Random(stable_seed(seed, "balanced-picks")).shuffle(order)
    balanced = (NgramBalance(), NgramBalance())
    unbalanced = (NgramBalance(), NgramBalance())  # what the seeded-random picks would leave: the comparison
    results: list[dict] = [{}] * len(captions)
    for i in order:
        negs, poss = candidates[i]
        args = (captions[i], negs, poss, seed, rules_seed, kinds, negatives, positives)
        results[i] = pick_from(*args, balance=balanced)
        plain = pick_from(*args)
        for bal, key in zip(unbalanced, ("neg", "pos")):
            if plain[key] is not None:
                bal.add(captions[i], plain[key])
    info = {"ngram_imbalance_per_pick": {
        polarity: {"balanced": round(b.imbalance, 3), "seeded_random": round(u.imbalance, 3)}
        for polarity, b, u in zip(("negatives", "positives"), balanced, unbalanced)}}
    return results, info


def substitution(slot: str) -> tuple[str, str] | None:
    """The ``(old, new)`` words of a REPLACE perturbation's slot (``"attribute:color red->crimson"``,
    lower case), None for a slot that names no substitution."""
    _, _, edit = slot.partition(" ")
    old, sep, new = edit.partition("->")
    return (old.strip().lower(), new.strip().lower()) if sep and old.strip() and new.strip() else None


def mirror_positives(captions: list[str], candidates: list[tuple[list[Perturbation], list[Perturbation]]],
                     results: list[dict], seed: int) -> dict:
    """REPLACE positives a text-only reader cannot tell from their captions: every substitution
    ``x -> y`` kept beside another caption's ``y -> x``, so each substituted word is added
    exactly as often as it is removed (the mirror balance ``hardpos debias`` applies to a
    benchmark, applied at generation).

    For every caption whose pick (``results[i]``, :func:`pick_balanced`'s) is of kind
    ``replace``, any of its REPLACE positive candidates may serve; word pairs are matched
    scarcest first, the captions of each direction in an order shuffled by ``seed``, a caption
    used once. The REPLACE positives of ``results`` are replaced in place by the matched ones
    (None where no mirror was found: the row keeps its negative); SWAP positives are untouched.
    Returns ``{"replace_positives": {"balanced", "mirrored"}}``."""
    by: dict[tuple[str, str], list[tuple[int, Perturbation]]] = {}
    for i, res in enumerate(results):
        if res.get("kind") != "replace":
            continue
        for p in candidates[i][1]:
            sub = substitution(p.slot) if p.kind == "replace" else None
            if sub is not None and validate(captions[i], p.text, "replace").accepted:
                by.setdefault(sub, []).append((i, p))
    rng = random.Random(stable_seed(seed, "mirrored-positives"))
    pairs = sorted({tuple(sorted(k)) for k in by if (k[1], k[0]) in by and k[0] != k[1]},
                   key=lambda k: (min(len(by[k]), len(by[(k[1], k[0])])), k))
    chosen: dict[int, Perturbation] = {}
    for x, y in pairs:
        there, back = list(by[(x, y)]), list(by[(y, x)])
        rng.shuffle(there)
        rng.shuffle(back)
        back = [e for e in back if e[0] not in chosen]
        for i, p in there:
            if i in chosen:
                continue
            while back and (back[-1][0] in chosen or back[-1][0] == i):
                back.pop()
            if not back:
                break
            j, q = back.pop()
            chosen[i], chosen[j] = p, q
    before = sum(1 for r in results if r.get("kind") == "replace" and r.get("pos"))
    for i, res in enumerate(results):
        if res.get("kind") == "replace":
            p = chosen.get(i)
            res["pos"], res["pos_slot"] = (p.text, p.slot) if p else (None, None)
    return {"replace_positives": {"balanced": before, "mirrored": len(chosen)}}
