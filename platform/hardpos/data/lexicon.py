"""Curated word classes and synonym tables for the rule engine.

The data lives in ``resources/lexicons/lexicon.json`` (hand-curated, with provenance)
and ``resources/lexicons/paper_replace_table.json`` (the paper's own REPLACE table,
recovered from its release by :mod:`hardpos.data.paper_table`).

Model (see the JSON's ``provenance.format``): a *class* (colour, size, spatial_vertical,
animal, ...) has a slot (attribute | relation | object), a part of speech (adj | verb |
prep | noun) and *groups* of surface forms that mean the same thing.

* REPLACE hard negative of a form: the canonical form of another group of its class
  (only the groups named in ``contrast`` when the class has one: "man" -> "woman", not
  "man" -> "baby").
* REPLACE hard positive of a form: another form of its own group, plus the paper's
  table entries that are not excluded in ``paper_excluded`` (with the reason there).
* Nouns get their plural forms (regular, or from ``plurals``) as a parallel class.

:func:`load_lexicon` builds the immutable :class:`Lexicon` the perturber uses;
``restrict_to`` keeps only the given forms (the synthetic world passes its vocabulary,
so negatives stay inside the world's words).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

LEXICON_DIR = Path(__file__).resolve().parent.parent / "resources" / "lexicons"
LEXICON_FILE = LEXICON_DIR / "lexicon.json"
PAPER_TABLE_FILE = LEXICON_DIR / "paper_replace_table.json"

POS = ("adj", "verb", "prep", "noun")
SLOTS = ("attribute", "relation", "object")


@dataclass(frozen=True)
class Sense:
    """One reading of a surface form: which class and group it belongs to."""

    form: str
    cls: str
    slot: str
    pos: str
    group: int
    number: str = "na"  # nouns: "sg" | "pl"
    kind: str | None = None  # nouns: SWAP compatibility ("animate", "vehicle", "thing", ...)
    needs_object_check: bool = False


@dataclass(frozen=True)
class Lexicon:
    """The rule engine's dictionary (immutable; build with :func:`load_lexicon`)."""

    senses: dict[str, tuple[Sense, ...]]
    negatives: dict[tuple[str, str], tuple[str, ...]]  # (form, cls) -> contrasting forms
    positives: dict[tuple[str, str], tuple[tuple[str, str], ...]]  # (form, cls) -> ((synonym, source), ...)
    function_words: frozenset[str]
    adjectives: frozenset[str]  # every adjective form (lexicon + extra modifiers)
    ing_not_verbs: frozenset[str]
    on_blocklist: frozenset[str]
    max_phrase: int
    vocabulary: frozenset[str] = field(default_factory=frozenset)

    def lookup(self, form: str) -> tuple[Sense, ...]:
        return self.senses.get(form, ())

    def is_noun(self, form: str) -> bool:
        return any(s.pos == "noun" for s in self.lookup(form))

    def is_adjective(self, form: str) -> bool:
        return form in self.adjectives


def plural(word: str, irregular: dict[str, str]) -> str:
    """English plural of a lexicon noun (irregulars from the lexicon, then the usual rules)."""
    if " " in word:  # "hot dog" -> "hot dogs"
        head, last = word.rsplit(" ", 1)
        return f"{head} {plural(last, irregular)}"
    if word in irregular:
        return irregular[word]
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


@functools.lru_cache(maxsize=8)
def _cached(use_paper: bool, restrict_to: frozenset[str] | None) -> Lexicon:
    return _build(_read(LEXICON_FILE), _read(PAPER_TABLE_FILE) if use_paper else None, restrict_to)


def load_lexicon(*, use_paper: bool = True, restrict_to: set[str] | frozenset[str] | None = None,
                 data: dict | None = None) -> Lexicon:
    """The lexicon; cached when built from the shipped files.

    use_paper: add the paper's REPLACE table (minus ``paper_excluded``) as hard-positive synonyms.
    restrict_to: keep only these surface forms (negatives, positives and senses alike).
    data: a lexicon mapping in the JSON's format instead of the shipped file (tests, users).
    """
    restrict = frozenset(restrict_to) if restrict_to is not None else None
    if data is None:
        return _cached(use_paper, restrict)
    return _build(data, _read(PAPER_TABLE_FILE) if use_paper else None, restrict)


def _build(data: dict, paper: dict | None, restrict: frozenset[str] | None) -> Lexicon:
    classes = data.get("classes")
    if not isinstance(classes, dict) or not classes:
        raise ValueError("lexicon has no 'classes' mapping")
    irregular = data.get("plurals", {})
    senses: dict[str, list[Sense]] = {}
    negatives: dict[tuple[str, str], list[str]] = {}
    positives: dict[tuple[str, str], list[tuple[str, str]]] = {}
    adjectives: set[str] = set(data.get("adjectives", []))
    keep = (lambda form: True) if restrict is None else (lambda form: form in restrict)

    for cls, spec in classes.items():
        slot, pos = spec.get("slot"), spec.get("pos")
        if slot not in SLOTS or pos not in POS:
            raise ValueError(f"lexicon class {cls!r}: slot must be one of {SLOTS} and pos one of {POS}")
        groups = [[f.lower() for f in g] for g in spec["groups"]]
        variants = [("sg", groups)]
        if pos == "noun":
            variants.append(("pl", [[plural(f, irregular) for f in g] for g in groups]))
        contrast = spec.get("contrast")
        for number, gs in variants:
            number = number if pos == "noun" else "na"
            # the plural class's contrast maps plural forms of the singular keys
            if contrast is not None and number == "pl":
                contrast_map = {plural(k, irregular): [plural(v, irregular) for v in vs] for k, vs in contrast.items()}
            else:
                contrast_map = contrast
            for gi, group in enumerate(gs):
                for form in group:
                    if not keep(form):
                        continue
                    sense = Sense(form, cls, slot, pos, gi, number, spec.get("kind"), bool(spec.get("needs_object_check")))
                    senses.setdefault(form, []).append(sense)
                    if pos == "adj":
                        adjectives.add(form)
                    # hard positives: the other forms of the same group
                    syn = [(f, "lexicon") for f in group if f != form and keep(f)]
                    if syn:
                        positives.setdefault((form, cls), []).extend(syn)
                    # hard negatives: canonical forms of other groups (or the contrast list)
                    if contrast_map is not None:
                        targets = contrast_map.get(form, [])
                    else:
                        targets = [g[0] for j, g in enumerate(gs) if j != gi]
                    targets = [t for t in targets if keep(t) and t not in group]
                    if targets:
                        negatives.setdefault((form, cls), []).extend(targets)

    if paper is not None:
        excluded = set(data.get("paper_excluded", {}))
        for subset in ("attributes", "relations"):
            for row in paper.get(subset, []):
                src, dst = row["from"], row["to"]
                if f"{src}->{dst}" in excluded or not keep(src) or not keep(dst):
                    continue
                known = senses.get(src)
                if known:
                    for sense in known:
                        lst = positives.setdefault((src, sense.cls), [])
                        if all(f != dst for f, _ in lst):
                            lst.append((dst, "paper"))
                else:
                    cls = f"paper_{subset}"
                    pos = "adj" if subset == "attributes" else "prep"
                    slot = "attribute" if subset == "attributes" else "relation"
                    senses.setdefault(src, []).append(Sense(src, cls, slot, pos, 0))
                    positives.setdefault((src, cls), []).append((dst, "paper"))

    max_phrase = max(len(f.split()) for f in senses) if senses else 1
    vocabulary = frozenset(senses) | frozenset(f for v in negatives.values() for f in v) | frozenset(
        f for v in positives.values() for f, _ in v)
    return Lexicon(
        senses={k: tuple(v) for k, v in senses.items()},
        negatives={k: tuple(dict.fromkeys(v)) for k, v in negatives.items()},
        positives={k: tuple(dict.fromkeys(v)) for k, v in positives.items()},
        function_words=frozenset(w.lower() for w in data.get("function_words", [])),
        adjectives=frozenset(adjectives),
        ing_not_verbs=frozenset(data.get("ing_not_verbs", [])),
        on_blocklist=frozenset(data.get("on_blocklist_objects", [])),
        max_phrase=max_phrase,
        vocabulary=vocabulary,
    )
