"""English: the word lists and the checks that say whether a caption is still good English.

The one place for English agreement. Its word lists are the closed classes below
(determiners, counts, containers, ...) and, for nouns, the shipped lexicon's ``number`` lists
(plural-only nouns, mass nouns, nouns that are both) with ``lemminflect`` (which word forms are
plural nouns, which words are English at all), loaded on first use and cached. Pure functions
over caption text. Three users:

* the rule engine: its phrase reading steps over :data:`DETERMINERS`, writes "a"/"an" by
  :func:`wants_an`, and offers no candidate with a new agreement fault (:func:`new_problems`);
* the validator, on every LLM or rule output in every mode (:func:`new_problems`,
  :func:`non_english`);
* the blind-text audit, which counts simple surface slips per edit (:data:`GRAMMAR_RULES`,
  :func:`grammar_hits`).

:func:`problems` lists the agreement faults of one caption, each as the phrase that shows it:

* a singular determiner ("a", "an", "another", "each", "every") before a plural noun:
  "a skis", "another glasses", "a leaf covered woods";
* "a" / "an" / "another" before a mass noun: "a broccoli", "a bread";
* "pair(s) of" before a singular count noun: "a pair of kite", "a pair of ski";
* a container or group "of" before a singular count noun: "a plate of carrot", "a group of man";
* "a type / kind / sort / piece / slice / bit of" before a plural: "a type of soups";
* a count above one before a singular count noun: "two lady".

The noun a determiner governs is found by skipping adjectives; a fault is reported only where
that noun ends the phrase, so a compound is never judged by its first word ("two tree
branches", "an ice bucket"). Only lexicon nouns (and the curated number lists) are judged: the
check is blind to what it cannot classify, and :func:`new_problems` compares a candidate with
its original, so a fault the original already has ("two woman") is never held against an edit.

:data:`GRAMMAR_RULES` are cruder on purpose: word-pair counts a reader can check by eye
(:func:`grammar_hits` charges an edit only with the slips its caption does not have), the same
for every source the audit reads, so their figures compare benchmarks with each other.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Callable

import lemminflect

from hardpos.rules.lexicon import load_lexicon
from hardpos.rules.textnorm import tokens

# ---------------------------------------------------------------------- word lists
#: words that open a noun phrase before its modifiers (articles, demonstratives, possessives,
#: quantifiers, small counts): what the rule engine steps over to find a phrase's words
DETERMINERS = frozenset({"a", "an", "the", "this", "that", "these", "those", "some", "two", "three", "four", "five",
                         "six", "several", "many", "his", "her", "their", "its", "my", "one", "another", "each",
                         "every", "few"})
#: determiners of one thing: never before a plural noun
SINGULAR_DETERMINERS = frozenset({"a", "an", "another", "each", "every"})
#: indefinite determiners: never before a mass noun
INDEFINITE = frozenset({"a", "an", "another"})
#: counts above one and plural determiners: never before a singular count noun
PLURAL_COUNTS = frozenset({"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
                           "several", "many", "multiple", "numerous", "these", "those", "both", "few"})
#: "<noun> of" that counts or holds things: a count noun after it is plural ("a plate of carrots")
CONTAINERS = frozenset({"plate", "plates", "bowl", "bowls", "box", "boxes", "basket", "baskets", "bunch", "bunches", "pile",
                        "piles", "lots", "variety", "plenty", "rows", "row", "stack", "stacks", "tray", "trays", "bag",
                        "bags", "group", "groups", "herd", "herds", "flock", "collection", "assortment", "bucket",
                        "buckets", "crate", "crates", "dozens", "handful", "number", "set", "sets", "full", "filled",
                        "bunch", "selection", "display", "couple"})
#: "a <noun> of" that takes one thing or a mass ("a slice of pizza", "a type of soup")
SINGLE_OF = frozenset({"type", "kind", "sort", "piece", "slice", "bit"})
PAIRS = frozenset({"pair", "pairs"})
#: singulars of things that come in pairs, which "pair of" never takes ("a pair of ski", "a pair of jean")
PAIR_SINGULARS = frozenset({"ski", "shoe", "sock", "boot", "glove", "sneaker", "skate", "scissor", "jean", "short",
                            "pant", "trouser", "sunglass", "goggle", "binocular", "headphone", "earring", "slipper",
                            "sandal", "legging", "plier"})
#: what may follow a noun that ends its noun phrase (so "two dog stands" is not read as "two dog")
PHRASE_END = frozenset({"and", "or", "with", "on", "in", "at", "by", "near", "under", "next", "is", "are", "was",
                        "were", "of", "to", "from", "for", "behind", "beside", "above", "below", "that", "which",
                        "while", "the", "a", "an", "sitting", "standing", "walking", "running", "lying", "laying", "holding", "looking",
                        "eating", "playing"})
#: "a few", "a lot of", "a couple of": quantifiers, not "a" before a noun
_AFTER_A = frozenset({"few", "lot", "lots", "couple", "dozen", "great", "good", "number", "bunch", "pair", "variety",
                      "group", "handful", "set", "herd", "flock", "total"})
_MAX_ADJECTIVES = 4


@functools.lru_cache(maxsize=1)
def _lex():
    return load_lexicon()


@functools.lru_cache(maxsize=65536)
def _lemmas(word: str) -> dict:
    return lemminflect.getAllLemmas(word)


def known_english(word: str) -> bool:
    """``word`` (lower case) is an English word ``lemminflect`` or the lexicon knows."""
    lex = _lex()
    return bool(_lemmas(word)) or word in lex.senses or word in lex.function_words or word in lex.adjectives or (
        word in lex.vocabulary)


@functools.lru_cache(maxsize=65536)
def noun_number(word: str) -> str | None:
    """"pl", "sg" (a count noun), "mass", "either" (mass or count: "pizza") or None (unknown,
    or not only a noun here)."""
    lex = _lex()
    if word in lex.plural_only:
        return "pl"
    if word in lex.mass:
        return "mass"
    if word in lex.mass_or_count:
        return "either"
    numbers = {s.number for s in lex.lookup(word) if s.pos == "noun"}
    if numbers == {"sg"}:
        return "sg"
    if numbers == {"pl"}:
        return "pl"
    if numbers:
        return None  # "sheep", "fish": either number
    nouns = _lemmas(word).get("NOUN")
    if not nouns:
        return None
    if word not in nouns:
        return "pl"  # "skis" -> ski, "shorts" -> short
    plurals = lemminflect.getInflection(word, tag="NNS")
    return "sg" if plurals and word not in plurals else None


def _is_adjective(word: str) -> bool:
    lex = _lex()
    if word in lex.adjectives and not lex.is_noun(word):
        return True
    lemmas = _lemmas(word)
    return "ADJ" in lemmas and "NOUN" not in lemmas


def _nominal(word: str | None) -> bool:
    """Could ``word`` be (part of) a noun: a lexicon noun or modifier, an English word with a noun
    reading, or a word no dictionary knows (a name, a rare noun)."""
    if word is None or not word.isalpha() or word in _lex().function_words:
        return False
    lex = _lex()
    return lex.is_noun(word) or word in lex.adjectives or "NOUN" in _lemmas(word) or not _lemmas(word)


def _head(toks: list[str], k: int) -> int | None:
    """Index of the noun the phrase starting at ``k`` is about: sure adjectives skipped ("a red",
    "clear handled"), then the first word with a noun reading; None when there is none. Callers
    decide what the word after the head may be (a compound goes on: "a ice bucket")."""
    skipped = 0
    while k < len(toks) and skipped < _MAX_ADJECTIVES and (
            (_is_adjective(toks[k]) and not _listed_head(toks, k)) or toks[k].isdigit() or toks[k] in ("-", "very")
            or (toks[k].endswith("ed") and k + 1 < len(toks) and _nominal(toks[k + 1]))):
        k += 1
        skipped += 1
    if k >= len(toks) or not toks[k].isalpha() or toks[k] in _lex().function_words:
        return None
    if not (_lex().is_noun(toks[k]) or "NOUN" in _lemmas(toks[k]) or toks[k] in _listed_nouns()):
        return None
    return k


@functools.lru_cache(maxsize=1)
def _listed_nouns() -> frozenset[str]:
    """The nouns the number lists name: the lexicon's plural-only and mass nouns and the
    singulars of pairs (:data:`PAIR_SINGULARS`)."""
    return _lex().plural_only | _lex().mass | PAIR_SINGULARS


def _listed_head(toks: list[str], k: int) -> bool:
    """Token ``k`` is a listed noun that ends its phrase: the head, though the lexicon also
    lists it as a noun modifier ("a police car", "a traffic light", "a ski slope")."""
    return toks[k] in _listed_nouns() and not _nominal(toks[k + 1] if k + 1 < len(toks) else None)


def _fault(toks: list[str], start: int, head: int) -> str:
    return " ".join(toks[start:head + 1])


def problems(text: str) -> list[str]:
    """The agreement faults of ``text`` (see the module docstring), each as its phrase.

    A fault is reported only where its noun ends the phrase (the next word has no noun
    reading), so a compound is never taken for its first word ("two tree branches", "an ice
    bucket"), and a singular determiner is never matched with a verb ("a cat sits")."""
    toks = tokens(text)
    lex = _lex()
    out = []

    def end_at(h: int) -> bool:
        return not _nominal(toks[h + 1] if h + 1 < len(toks) else None)

    for i, t in enumerate(toks):
        if t in SINGULAR_DETERMINERS:
            if i + 1 < len(toks) and toks[i + 1] in _AFTER_A:
                continue
            h = _head(toks, i + 1)
            if h is None or not end_at(h):
                continue
            n = noun_number(toks[h])
            if (n == "pl" and (lex.is_noun(toks[h]) or toks[h] in lex.plural_only)) or (n == "mass" and t in INDEFINITE):
                out.append(_fault(toks, i, h))
        elif t in PLURAL_COUNTS:
            h = _head(toks, i + 1)
            if h is not None and end_at(h) and noun_number(toks[h]) == "sg" and lex.is_noun(toks[h]):
                out.append(_fault(toks, i, h))
        elif t == "of" and i > 0:
            prev = toks[i - 1]
            h = _head(toks, i + 1) if (prev in PAIRS or prev in CONTAINERS or prev in SINGLE_OF) else None
            if h is None or not end_at(h):
                continue
            n = noun_number(toks[h])
            if prev in PAIRS and ((n == "sg" and lex.is_noun(toks[h])) or toks[h] in PAIR_SINGULARS):
                out.append(_fault(toks, i - 1, h))
            elif prev in CONTAINERS and n == "sg" and lex.is_noun(toks[h]):
                out.append(_fault(toks, i - 1, h))
            elif prev in SINGLE_OF and n == "pl" and lex.is_noun(toks[h]) and toks[h] not in lex.plural_only and (
                    i < 2 or toks[i - 2] in SINGULAR_DETERMINERS):
                out.append(_fault(toks, i - 1, h))
    return out


def new_problems(original: str, candidate: str) -> list[str]:
    """The faults of ``candidate`` that ``original`` does not have (a multiset difference)."""
    return list((Counter(problems(candidate)) - Counter(problems(original))).elements())


_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)


def _latin(word: str) -> bool:
    return all("LATIN" in unicodedata.name(ch, "") for ch in word)


def non_english(original: str, candidate: str) -> bool:
    """``candidate`` brings words that are no English: a letter of another script the original
    does not use, or two or more new words of which at least half no English dictionary
    (``lemminflect``, the lexicon) knows ("Un perro marrón en la playa"). One unknown new word
    passes: it may be a rare English word or a name."""
    old = {w.lower() for w in _WORD.findall(original)}
    new = [w.lower() for w in _WORD.findall(candidate) if w.lower() not in old]
    if any(not _latin(w) for w in new):
        return True
    unknown = [w for w in new if not known_english(w)]
    return len(unknown) >= 2 and 2 * len(unknown) >= len(new)


# ---------------------------------------------------------------------- articles
def wants_an(word: str) -> bool:
    """Whether ``word`` takes "an" (by its first sound, with the usual exceptions): the one
    rule the perturber writes articles by and the blind audit counts article slips by."""
    w = word.lower()
    if w.startswith(("uni", "use", "usu", "uti", "eu", "one", "once", "ura", "ure", "uri")):
        return False  # "a unicorn", "a one-way street", "a urinal"; but "an urban area"
    if w.startswith(("hour", "honest", "honor", "heir")) or (w[:1] == "x" and w[1:2] not in "aeiou"):
        return True  # "an hour", "an Xbox"
    return w[:1] != "" and w[:1] in "aeiou"


# ---------------------------------------------------------------------- the audit's surface rules
_GRAMMAR_TOKEN = re.compile(r"[a-z]+(?:['\-][a-z]+)*|[^\sa-z]")


@functools.lru_cache(maxsize=1)
def _one_number_nouns() -> tuple[frozenset[str], frozenset[str]]:
    """(one-word lexicon nouns known only as singular, only as plural)."""
    sg, pl = set(), set()
    for form, senses in _lex().senses.items():
        numbers = {s.number for s in senses if s.pos == "noun"}
        if " " in form or not numbers:
            continue
        if numbers == {"sg"}:
            sg.add(form)
        elif numbers == {"pl"}:
            pl.add(form)
    return frozenset(sg), frozenset(pl)


def _ends_phrase(toks: list[str], i: int) -> bool:
    """Token ``i`` is the last word of its noun phrase: the caption ends, punctuation or a
    function word follows (a following noun would make token ``i`` a modifier)."""
    return i + 1 >= len(toks) or not toks[i + 1][:1].isalpha() or toks[i + 1] in PHRASE_END


def _article(toks: list[str]) -> int:
    return sum(1 for a, w in zip(toks, toks[1:]) if w[:1].isalpha() and len(w) > 1 and (
        (a == "a" and wants_an(w)) or (a == "an" and not wants_an(w) and not w.startswith("h"))))


def _doubled_word(toks: list[str]) -> int:
    return sum(1 for a, b in zip(toks, toks[1:]) if a == b and a[:1].isalpha() and a not in ("that", "had"))


def _singular_det_plural_noun(toks: list[str]) -> int:
    pl = _one_number_nouns()[1] | _lex().plural_only
    return sum(1 for i in range(1, len(toks))
               if toks[i - 1] in SINGULAR_DETERMINERS and toks[i] in pl and _ends_phrase(toks, i))


def _article_mass_noun(toks: list[str]) -> int:
    mass = _lex().mass
    return sum(1 for i in range(1, len(toks)) if toks[i - 1] in INDEFINITE and toks[i] in mass and _ends_phrase(toks, i))


def _count_singular_noun(toks: list[str]) -> int:
    sg = _one_number_nouns()[0]
    return sum(1 for i in range(1, len(toks)) if toks[i - 1] in PLURAL_COUNTS and toks[i] in sg and _ends_phrase(toks, i))


def _pair_of_singular(toks: list[str]) -> int:
    sg = _one_number_nouns()[0] | PAIR_SINGULARS
    hits = 0
    for i in range(len(toks) - 2):
        if toks[i] in PAIRS and toks[i + 1] == "of":
            j = i + 2
            while j < len(toks) - 1 and toks[j] not in sg and toks[j][:1].isalpha() and not _ends_phrase(toks, j):
                j += 1  # adjectives before the head: "a pair of red ski"
            hits += toks[j] in sg and _ends_phrase(toks, j)
    return hits


#: name -> (how often a text breaks the rule, what it checks): the blind audit's grammar rules
GRAMMAR_RULES: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "article": (_article, '"a" before a vowel sound or "an" before a consonant ("a umbrella")'),
    "doubled_word": (_doubled_word, 'a word twice in a row ("on on the table")'),
    "singular_det_plural_noun": (_singular_det_plural_noun,
                                 '"a" / "another" / "each" + a plural noun ("a skis", "a jeans")'),
    "article_mass_noun": (_article_mass_noun, '"a" + a mass noun that ends its phrase ("a broccoli")'),
    "count_singular_noun": (_count_singular_noun, 'a count or "these" + a noun the lexicon knows only as singular '
                                                  '("two dog")'),
    "pair_of_singular": (_pair_of_singular, '"pair of" + a singular noun ("a pair of ski")'),
}


def grammar_hits(caption: str, edited: str) -> list[str]:
    """The rules of :data:`GRAMMAR_RULES` that ``edited`` breaks more often than ``caption``
    (lower-cased word and punctuation tokens), in the table's order."""
    a, b = _GRAMMAR_TOKEN.findall(caption.lower()), _GRAMMAR_TOKEN.findall(edited.lower())
    return [name for name, (count, _) in GRAMMAR_RULES.items() if count(b) > count(a)]
