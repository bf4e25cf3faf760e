"""Word classes for the SWAP-positive check (:mod:`hardpos.rules.conjuncts`).

Contract: closed classes (coordinators, determiners, prepositions, ...) are hard-coded here;
open classes (nouns, people and animals, adjectives, function words) come from the shipped
lexicon, loaded on first use and cached (:func:`word_classes`). :class:`Classify` answers
token predicates ("is this a linker", "what shapes can this span have") over both. Pure,
no I/O beyond the one lexicon read. Package-internal: the names keep their leading
underscore; the public entry point is :func:`hardpos.rules.conjuncts.is_conjunct_swap`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from hardpos.rules.lexicon import load_lexicon

CLAUSE_PUNCT = frozenset({",", ";", ":", "(", ")", "!", "?", '"', "."})
COORDINATORS = frozenset({"and", "or", "&"})
#: what may join two adjacent conjuncts (longest first)
SEPARATORS = ((",", "and"), (",", "or"), (",",), ("and",), ("or",), ("&",))
NUMERALS = frozenset({"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                       "twelve", "dozen", "dozens", "hundreds", "both"})
#: articles, demonstratives, possessives, quantifiers (a closed class); with numerals: a phrase may start here
DETERMINERS = frozenset({"a", "the", "this", "that", "these", "those", "some", "several", "many", "his", "her",
                          "their", "its", "my", "our", "your", "another", "each", "every", "few", "lots", "any",
                          "various", "other", "all", "no", "more", "most", "multiple", "numerous"}) | NUMERALS
#: prepositions and verbs that the lexicon's function words do not list
_EXTRA_LINKERS = frozenset({"beneath", "underneath", "atop", "toward", "towards", "without", "within", "among",
                            "amongst", "beyond", "past", "upon", "alongside", "throughout", "via", "whose", "whom",
                            "am", "can", "could", "would", "should", "does", "do", "did", "features", "contains",
                            "include", "includes", "including", "has", "have"})
#: lexicon function words that modify a noun rather than link two phrases
_NOT_LINKERS = frozenset({"different", "very", "just", "only", "not", "together", "full", "here", "it", "they", "he",
                          "she", "there", "what", "but", "then", "so", "if", "than"})
#: bare verb forms that are as often nouns ("a shaded walk [way]"): a verb after a coordination
#: ("a man and a boy [play]"), but no phrase boundary before a conjunct
_NOUN_LIKE_VERBS = frozenset({"walk", "run", "play", "ride", "look", "show", "use", "set", "lie", "lay", "fly", "wait",
                              "hold", "sit", "stand", "eat", "take", "make", "get", "go"})
#: prepositions: after Y they may start Y's own modifier (a finite verb after Y takes the whole coordination)
PREPOSITIONS = frozenset({"with", "without", "on", "in", "at", "by", "near", "under", "above", "below", "from", "to",
                           "into", "onto", "over", "beside", "inside", "outside", "behind", "through", "across",
                           "around", "along", "against", "down", "up", "for", "of", "off", "out", "between", "during",
                           "after", "before", "about", "like", "beneath", "underneath", "atop", "toward", "towards",
                           "within", "among", "amongst", "beyond", "past", "upon", "alongside", "throughout",
                           "via", "next", "while", "as"})
#: past participles the lexicon lists among its function words ("a pizza [topped] with cheese")
_PARTICIPLES = frozenset({"seen", "shown", "made", "set"})
_PARTICLES = frozenset({"up", "down", "out", "off", "around", "away", "back", "over"})
#: words after the right conjunct that may belong to it alone ("a man and a woman with a dog",
#: "a bed and a window to the patio"):
#: the right conjunct is not known to end there, so no swap is accepted at that split
BINDS_RIGHT = frozenset({"with", "without", "of", "to", "wearing", "holding", "carrying", "having", "dressed", "that",
                          "who", "which", "whose", "whom"})
#: ... and these when that conjunct is a person or animal ("a man and a woman in red dresses")
BINDS_RIGHT_ANIMATE = frozenset({"in"})
#: after a coordination of noun phrases these float over the whole ("apples and pears all in a bowl")
AFTER_COORDINATION = frozenset({"all", "both", "together", "each"})
#: words that point back to something named before them ("a woman and [her child]", "playing with
#: a seat and [putting a chair over it]"): moved in front of what they point to, they lose it
ANAPHORS = frozenset({"it", "its", "her", "his", "him", "them", "their", "theirs", "itself", "himself", "herself",
                       "themselves"})
#: ... of those, the ones a verb phrase may hold for its subject ("kneeling by [his] skateboard")
POSSESSIVES = frozenset({"its", "his", "their"})
#: finite verbs: "[a kitchen has a stove] and [microwave]" is no reading, so Y cannot be the subject's partner
FINITE = frozenset({"is", "are", "was", "were", "has", "have", "had", "holds", "hold", "shows", "show", "features",
                     "contains", "includes", "include", "including", "depicting", "showing", "reflecting"})
#: places that two bare verbs may share ("sitting and standing [on a bench]"); any other word after
#: them may be the second verb's own complement ("standing and talking [to each other]")
LOCATIVE = frozenset({"on", "in", "near", "by", "under", "behind", "beside", "inside", "outside", "along", "around",
                       "next", "across", "through", "over", "above", "below", "beneath", "underneath", "atop",
                       "between", "among", "together"})
#: nouns inside compound prepositions ("on top of", "in front of")
PREP_NOUNS = frozenset({"top", "front", "back", "middle", "side", "edge", "end", "bottom", "center", "left", "right"})
#: nouns whose "of" takes a whole coordination ("a group of [people] and [elephants]", "a photo of
#: [a man] and [a woman]"); after any other "of" the second conjunct may be the noun's partner
#: ("a body of water and mountains", "a piece of cake and fork")
OF_COLLECTIONS = frozenset({"group", "groups", "bunch", "lots", "lot", "pile", "piles", "collection", "variety",
                             "mixture", "combination", "medley",
                             "assortment", "couple", "pair", "set", "kind", "kinds", "type", "types", "mix", "full",
                             "consisting", "made", "plate", "plates", "bowl", "bowls", "tray", "box", "basket",
                             "picture", "photo", "photograph", "image", "view", "closeup", "shot", "painting",
                             "drawing", "display", "selection", "array", "row", "rows", "stack", "crowd", "herd",
                             "flock", "team", "family"})


@dataclass(frozen=True)
class _WordClasses:
    nouns: frozenset[str]
    animate: dict[str, str]  # person/animal noun -> its lexicon class ("woman" -> "person")
    adjectives: frozenset[str]  # attributes and noun modifiers ("white", "wooden", "tennis")
    pure_adjectives: frozenset[str]  # attributes that cannot head a noun phrase ("white"; not "glass")
    linkers: frozenset[str]  # prepositions and finite verbs ("with", "on", "is", "holds")
    ing_not_verbs: frozenset[str]


@functools.lru_cache(maxsize=1)
def word_classes() -> _WordClasses:
    lex = load_lexicon()
    nouns = frozenset(f for f, ss in lex.senses.items() if " " not in f and any(s.pos == "noun" for s in ss))
    animate = {f: s.cls for f, ss in lex.senses.items() for s in ss if s.kind == "animate"}
    adj_sense = frozenset(f for f, ss in lex.senses.items() if any(s.pos == "adj" for s in ss))
    # "tennis", "kitchen" are in the adjective list as noun modifiers; "orange" is a colour and a fruit
    adjectives = frozenset(a for a in lex.adjectives if a in adj_sense or a not in nouns)
    pure = frozenset(f for f, ss in lex.senses.items()
                     if f not in nouns and any(s.pos == "adj" and s.cls != "material" for s in ss))
    linkers = (lex.function_words | _EXTRA_LINKERS) - DETERMINERS - _NOT_LINKERS - COORDINATORS - {"an"}
    return _WordClasses(nouns, animate, adjectives, pure, frozenset(linkers), lex.ing_not_verbs)


class Classify:
    """Token predicates over the lexicon's word classes (closed classes hard-coded above)."""

    def __init__(self, wc: _WordClasses):
        self.wc = wc

    def ing_verb(self, t: str) -> bool:
        # "dining", "living" are noun modifiers ("dining room table"), listed among the adjectives
        return (len(t) >= 5 and t.endswith("ing") and t not in self.wc.ing_not_verbs and t not in self.wc.nouns
                and t not in self.wc.adjectives)

    def linker(self, t: str | None) -> bool:
        return t is not None and (t in self.wc.linkers or self.ing_verb(t))

    def finite_verb(self, t: str, nxt: str | None) -> bool:
        """"is", "holds", "has", "hold [a knife]": a verb that is neither a preposition, an -ing form
        nor a participle, so a phrase holding it is a clause, not a noun phrase ("a shaded walk way"
        is one: a noun-like verb counts only before a determiner)."""
        if t in _NOUN_LIKE_VERBS:
            return nxt in DETERMINERS
        return (t in self.wc.linkers and t not in PREPOSITIONS and not self.ing_verb(t)
                and not self.participle(t) and t not in _PARTICIPLES)

    def opens_at(self, toks: list[str], i: int) -> bool:
        """A conjunct may start at ``i``: the caption's start, after punctuation or a linker
        (not a noun-like verb, nor an -ing word that modifies a noun: "a feeding [dish]")."""
        t = toks[i - 1] if i > 0 else None
        if self.boundary(t):
            return True
        if not self.linker(t) or t in _NOUN_LIKE_VERBS:
            return False
        return not (self.ing_verb(t) and i >= 2 and (toks[i - 2] in DETERMINERS or self.adjective(toks[i - 2])))

    def boundary(self, t: str | None) -> bool:
        """Nothing of a phrase continues across ``t``: the caption's edge or clause punctuation."""
        return t is None or t in CLAUSE_PUNCT

    def content(self, t: str | None) -> bool:
        return (t is not None and t[:1].isalnum() and t not in DETERMINERS and t not in COORDINATORS
                and not self.linker(t))

    def adjective(self, t: str) -> bool:
        return t in self.wc.adjectives

    def participle(self, t: str) -> bool:
        """"dressed", "parked": a verb form, not the head of a noun phrase ("bed" is a noun)."""
        return len(t) > 4 and t.endswith("ed") and t not in self.wc.nouns

    def shapes(self, span: list[str]) -> frozenset[str]:
        """What ``span`` can be as one whole conjunct: "adj" ("black", "light blue"), "vp"
        ("holding a bottle"), "noun" ("a red car", "toilet", "cooking utensils"); empty when
        it cannot be one ("a black", "a man with", "cat and dog")."""
        if any(t in CLAUSE_PUNCT or t in COORDINATORS for t in span):
            return frozenset()
        first, last = span[0], span[-1]
        out = set()
        if all(self.adjective(t) or t == "-" for t in span) and self.adjective(last) and (
                len(span) == 1 or all(t in self.wc.pure_adjectives for t in span)):
            out.add("adj")  # "large purple" is two attributes; "red passenger" a noun modifier
        if self.ing_verb(first):
            if len(span) == 1 or self.content(last) or last in _PARTICLES:
                out.add("vp")  # "rearing up", "sitting down"
        elif self.content(last) and last not in self.wc.pure_adjectives and not self.participle(last) and (
                first in DETERMINERS or self.content(first)) and not any(
                    self.finite_verb(t, n) for t, n in zip(span, [*span[1:], None])) and not any(
                    t in DETERMINERS and self.content(p) for p, t in zip(span, span[1:])) and not (
                    len(span) > 1 and span[-2] in self.wc.animate and last not in self.wc.nouns):
            # "a pony trot": an unknown word after a person/animal is its verb, not a compound's head
            out.add("noun")  # "white paper": a material word may head a noun phrase; "a hand a cellphone" is two
        return frozenset(out)


def is_plural(word: str) -> bool:
    return word.endswith("s") and not word.endswith("ss")
