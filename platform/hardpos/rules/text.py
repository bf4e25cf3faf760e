"""Tokens, records and text edits shared by the rule perturber's parts.

Contract: the :class:`Perturbation` record (text, kind, slot), the tokenizer's regex and
word sets, the internal token / lexicon-match records, the stable seed hash, and pure
string edits (article fixing, span replacement, span swap, dedupe by normalised text).
No state; :mod:`hardpos.rules.perturber` and its REPLACE and SWAP rules build on these.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Iterable

from hardpos.rules.english import wants_an
from hardpos.rules.lexicon import Sense
from hardpos.rules.textnorm import normalise

TOKEN = re.compile(r"[A-Za-z]+(?:['\-][A-Za-z]+)*|\d+(?:\.\d+)?|[^\sA-Za-z\d]")
BOUNDARY_PUNCT = {",", ".", ";", ":", "!", "?", "(", ")", '"'}
COORD = {"and", "or", ","}
#: pronouns that stand for a whole noun phrase after a verb or preposition ("next to it")
OBJECT_PRONOUNS = frozenset({"it", "them", "him", "her", "me", "us", "you", "each", "one", "something", "someone",
                              "other", "others"})
#: pronouns that are a clause's subject: the word after one is its verb ("he skateboards")
SUBJECT_PRONOUNS = frozenset({"i", "he", "she", "we", "they", "who"})
#: prepositions a head-noun search steps over ("resting on the side of a road" -> side)
SURFACE_PREPS = frozenset({"on", "atop", "upon", "onto"})
#: attribute classes any visible thing can have (cross-class attribute swaps stay within these)
VISUAL = frozenset({"color", "material", "size", "pattern"})
KINDS = ("replace", "swap")
POLARITIES = ("negative", "positive")


@dataclass(frozen=True)
class Perturbation:
    """One perturbed caption.

    text:   the new caption.
    kind:   "replace" | "swap".
    slot:   what changed, e.g. "attribute:color red->blue", "relation:spatial_vertical above->below",
            "object:animal dog->cat", "attributes:color blue<->white", "objects:animate dog<->cat",
            "conjuncts:noun_phrases", "conjuncts:verb_phrases", "conjuncts:adjectives".
    source: "rule" (the LLM stage uses "llm:<model>").
    """

    text: str
    kind: str
    slot: str
    source: str = "rule"


@dataclass(frozen=True)
class Token:
    text: str
    low: str
    start: int
    end: int

    @property
    def alpha(self) -> bool:
        return self.text[:1].isalpha()


@dataclass(frozen=True)
class Match:
    i: int  # first token
    j: int  # one past the last token
    form: str
    senses: tuple[Sense, ...]


def tokenize(caption: str) -> list[Token]:
    """The caption's words, numbers and punctuation marks as :class:`Token` s, in order."""
    return [Token(m.group(0), m.group(0).lower(), m.start(), m.end()) for m in TOKEN.finditer(caption)]


def stable_seed(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def case_like(new: str, old: str) -> str:
    """Give ``new`` the casing pattern of ``old`` (ALL CAPS, Capitalised, lower)."""
    if len(old) > 2 and old.isupper():
        return new.upper()  # "letters ON hanging sign" (VL-checklist style emphasis)
    if old[:1].isupper() and old[1:] == old[1:].lower():
        return new[:1].upper() + new[1:]
    return new  # lower case, or an acronym like "TV" that the replacement does not inherit


def capitalised(word: str) -> bool:
    """"Blue", not "blue" or the acronym "TV"."""
    return len(word) > 1 and word[0].isupper() and word[1:].islower()


def _decapitalise(text: str) -> str:
    """Lower the first letter of a phrase that was capitalised only because it started the caption."""
    first = text.split(" ", 1)[0]
    if first == "I" or (len(first) > 1 and first.isupper()):
        return text
    return text[:1].lower() + text[1:]



# ---------------------------------------------------------------------- text edits
def _fix_article(text: str, pos: int) -> str:
    """Fix "a"/"an" right before character ``pos`` for the word that now starts there."""
    m = re.search(r"(?:^|(?<=\s))(a|an|A|An|AN)(\s+)$", text[:pos])
    if not m:
        return text
    word_m = re.match(r"[A-Za-z]+", text[pos:])
    if not word_m:
        return text
    art = m.group(1)
    want = "an" if wants_an(word_m.group(0)) else "a"
    if art.lower() == want:
        return text
    new = case_like(want, art) if art != "A" else want.capitalize()
    return text[:m.start(1)] + new + text[m.end(1):]


def apply_edits(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Apply non-overlapping (start, end, replacement) edits right to left, fixing articles."""
    for start, end, new in sorted(edits, reverse=True):
        if start == 0 and text[:1].isupper():
            new = new[:1].upper() + new[1:]
        text = text[:start] + new + text[end:]
        text = _fix_article(text, start)
    return text


def swap_spans(text: str, a: tuple[int, int], b: tuple[int, int], ta: str, tb: str) -> str:
    """Exchange spans a < b (non-overlapping); the caption's first capital stays first."""
    if a[0] == 0 and ta[:1].isupper():
        ta, tb = _decapitalise(ta), tb[:1].upper() + tb[1:]
    return apply_edits(text, [(a[0], a[1], tb), (b[0], b[1], ta)])


def dedupe(caption: str, items: Iterable[Perturbation]) -> list[Perturbation]:
    seen = {normalise(caption)}
    out = []
    for p in items:
        key = normalise(p.text)
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
    return out
