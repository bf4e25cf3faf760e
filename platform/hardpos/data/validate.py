"""Caption validator shared by the rule engine and the LLM generation stage.

``validate(original, candidate, kind)`` accepts or rejects one generated caption with a
machine-readable reason (one of :data:`REASONS`).  It is a pure function: no randomness,
no I/O beyond reading the shipped lexicon once, cheap enough to run on every generated row
(a SWAP candidate takes well under 1 ms).

Checks, in this order (the first failing one is the reason):

``non_text``        the candidate is not a string (bytes, numbers, dicts ...), or holds
                    control characters / U+FFFD, or has no letter at all.
``empty``           None, or nothing left after stripping whitespace/quotes.
``chatter``         the LLM talked instead of answering: several non-empty lines, a
                    leading "Sure"/"Here is"/"Output:"/"Caption:", quotes or backticks
                    around the answer, bullets/markdown, an explanation ("->",
                    "replaced", "(synonym ...)", "Note:") that the original does not have.
``identical``       equal to the original after normalisation (case, whitespace,
                    trailing period).
``length``          word-count ratio candidate/original outside
                    [:data:`MIN_LENGTH_RATIO`, :data:`MAX_LENGTH_RATIO`] (and more than
                    :data:`LENGTH_SLACK_WORDS` words apart, so 1-2 word captions may grow
                    by a word or two).
``too_many_edits``  REPLACE kinds: more than one contiguous word/phrase differs, or the
                    changed phrase is longer than :data:`MAX_REPLACE_SPAN` words.
``not_a_swap``      SWAP kinds: the multiset of words differs (a/an count as one word)
                    or the word order is unchanged.
``not_conjunct_swap``  SWAP positives ("swap" / "swap_positive") only: the words are a
                    permutation of the original's but not two whole coordinated phrases
                    exchanged (see :func:`is_conjunct_swap`).  Moving modifiers or nouns
                    between phrases ("blue bathroom with white towels" -> "white bathroom
                    with blue towels") is a hard *negative*.
``meaning_kept``    SWAP negatives ("swap_negative") only: the candidate IS a whole-conjunct
                    swap ("a cat and a dog" -> "a dog and a cat"), which keeps the meaning,
                    so it cannot be a hard negative.

Normalisation for comparison: lower case, whitespace collapsed, a trailing period
dropped, punctuation split off words.  The accepted ``text`` keeps the candidate's own
case and punctuation, with whitespace collapsed.

The SWAP-positive check takes its word classes (nouns, people and animals, adjectives,
function words) from the shipped lexicon, loaded on first use and cached.
"""
from __future__ import annotations

import difflib
import functools
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from hardpos.data.lexicon import load_lexicon

REASONS = ("empty", "identical", "chatter", "too_many_edits", "not_a_swap", "not_conjunct_swap", "meaning_kept",
           "length", "non_text")

#: kinds and the edit shape each one must have: a SWAP positive must exchange whole conjuncts,
#: a SWAP negative only has to permute the words (it is usually a binding swap)
KINDS = {
    "replace": "replace",
    "swap": "conjunct_swap",
    "replace_negative": "replace",
    "swap_negative": "swap",
    "replace_positive": "replace",
    "swap_positive": "conjunct_swap",
}

MIN_LENGTH_RATIO = 0.5
MAX_LENGTH_RATIO = 2.0
LENGTH_SLACK_WORDS = 2
#: longest phrase (in words, on either side) one REPLACE edit may change
MAX_REPLACE_SPAN = 4


@dataclass(frozen=True)
class Verdict:
    """The validator's answer.

    accepted: True when the candidate passes every check.
    reason:   one of :data:`REASONS` when rejected, None when accepted.
    text:     the cleaned candidate (whitespace collapsed) when accepted, else None.
    """

    accepted: bool
    reason: str | None
    text: str | None


_QUOTES = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb"
_LEADING_CHATTER = re.compile(
    r"^\s*(sure|certainly|of course|okay|ok|absolutely|here\s+is|here's|here\s+are|"
    r"i\s+(have|replaced|swapped|changed|would|will|can|cannot|can't|am|'m)|i'm|as an ai|sorry|"
    r"output|answer|result|response|rewritten|rephrased|paraphrase[ds]?|new caption|modified caption|"
    r"caption|sentence|hard (positive|negative)|positive|negative|swapped|replaced)\b",
    re.IGNORECASE,
)
# prefixes like "Output:", "A:", "Caption 1:" even when the word is not in the list above
_LABEL_PREFIX = re.compile(r"^\s*[A-Za-z][A-Za-z ]{0,24}\d*\s*:\s")
_EXPLANATION = re.compile(
    r"(->|=>|\u2192|\*\*|^\s*[-*#]\s|^\s*\d+[.)]\s|\b(replaced|replacing|synonym|swapped|swapping|"
    r"explanation|original caption|note that|note:|because|meaning-preserving|i changed)\b)",
    re.IGNORECASE,
)
_TOKEN = re.compile(r"[\w']+|[^\w\s]", re.UNICODE)
_WORD = re.compile(r"[\w']+", re.UNICODE)


def normalise(text: str) -> str:
    """Lower case, whitespace collapsed, one trailing period dropped, space before final punctuation."""
    text = " ".join(text.split()).lower()
    text = re.sub(r"\s*\.+$", "", text)
    return text.strip()


def tokens(text: str) -> list[str]:
    """Normalised tokens: words and punctuation marks, lower case, trailing period dropped."""
    return _TOKEN.findall(normalise(text))


def words(text: str) -> list[str]:
    """Normalised words only (punctuation dropped); "an" is folded to "a"."""
    return ["a" if w == "an" else w for w in _WORD.findall(normalise(text))]


def _reject(reason: str) -> Verdict:
    assert reason in REASONS
    return Verdict(False, reason, None)


def _is_chatter(original: str, cand: str) -> bool:
    lines = [line for line in cand.splitlines() if line.strip()]
    if len(lines) > 1:
        return True
    stripped = cand.strip()
    orig = original.strip()
    # a quoted answer ('"a man strolling."'); quotes the original itself has are fine
    if stripped[:1] in _QUOTES and orig[:1] not in _QUOTES:
        return True
    if stripped.rstrip(".")[-1:] in _QUOTES and orig.rstrip(".")[-1:] not in _QUOTES:
        return True
    orig_low = original.lower()
    if _LEADING_CHATTER.match(stripped) and not _LEADING_CHATTER.match(original.strip()):
        return True
    if _LABEL_PREFIX.match(stripped) and ":" not in original:
        return True
    for match in _EXPLANATION.finditer(stripped):
        if match.group(0).strip().lower() not in orig_low:
            return True
    if "(" in stripped and "(" not in original:
        return True
    return False


def _edit_shape_replace(orig_words: list[str], cand_words: list[str]) -> str | None:
    """None when the candidate differs from the original by one contiguous phrase.

    Works on words (punctuation dropped), so "red, shiny" -> "blue" is one phrase.
    """
    ops = [op for op in difflib.SequenceMatcher(a=orig_words, b=cand_words, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if not ops:
        return "identical"  # only punctuation differs: no word was replaced
    if len(ops) > 1:
        return "too_many_edits"
    _, a0, a1, b0, b1 = ops[0]
    if a1 - a0 > MAX_REPLACE_SPAN or b1 - b0 > MAX_REPLACE_SPAN:
        return "too_many_edits"
    return None


# ---------------------------------------------------------------------- SWAP positives
_CLAUSE_PUNCT = frozenset({",", ";", ":", "(", ")", "!", "?", '"', "."})
_COORDINATORS = frozenset({"and", "or", "&"})
#: what may join two adjacent conjuncts (longest first)
_SEPARATORS = ((",", "and"), (",", "or"), (",",), ("and",), ("or",), ("&",))
_NUMERALS = frozenset({"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                       "twelve", "dozen", "dozens", "hundreds", "both"})
#: articles, demonstratives, possessives, quantifiers (a closed class); with numerals: a phrase may start here
_DETERMINERS = frozenset({"a", "the", "this", "that", "these", "those", "some", "several", "many", "his", "her",
                          "their", "its", "my", "our", "your", "another", "each", "every", "few", "lots", "any",
                          "various", "other", "all", "no", "more", "most", "multiple", "numerous"}) | _NUMERALS
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
_PREPOSITIONS = frozenset({"with", "without", "on", "in", "at", "by", "near", "under", "above", "below", "from", "to",
                           "into", "onto", "over", "beside", "inside", "outside", "behind", "through", "across",
                           "around", "along", "against", "down", "up", "for", "of", "off", "out", "between", "during",
                           "after", "before", "about", "like", "beneath", "underneath", "atop", "toward", "towards",
                           "within", "among", "amongst", "beyond", "past", "upon", "alongside", "throughout",
                           "via", "next", "while", "as"})
#: past participles the lexicon lists among its function words ("a pizza [topped] with cheese")
_PARTICIPLES = frozenset({"seen", "shown", "made", "set"})
_PARTICLES = frozenset({"up", "down", "out", "off", "around", "away", "back", "over"})
#: words after the right conjunct that may belong to it alone ("a man and a woman with a dog"):
#: the right conjunct is not known to end there, so no swap is accepted at that split
_BINDS_RIGHT = frozenset({"with", "without", "of", "wearing", "holding", "carrying", "having", "dressed", "that",
                          "who", "which", "whose", "whom"})
#: ... and these when that conjunct is a person or animal ("a man and a woman in red dresses")
_BINDS_RIGHT_ANIMATE = frozenset({"in"})
#: after a coordination of noun phrases these float over the whole ("apples and pears all in a bowl")
_AFTER_COORDINATION = frozenset({"all", "both", "together", "each"})
#: finite verbs: "[a kitchen has a stove] and [microwave]" is no reading, so Y cannot be the subject's partner
_FINITE = frozenset({"is", "are", "was", "were", "has", "have", "had", "holds", "hold", "shows", "show", "features",
                     "contains", "includes", "include", "including", "depicting", "showing", "reflecting"})
#: places that two bare verbs may share ("sitting and standing [on a bench]"); any other word after
#: them may be the second verb's own complement ("standing and talking [to each other]")
_LOCATIVE = frozenset({"on", "in", "near", "by", "under", "behind", "beside", "inside", "outside", "along", "around",
                       "next", "across", "through", "over", "above", "below", "beneath", "underneath", "atop",
                       "between", "among", "together"})
#: nouns inside compound prepositions ("on top of", "in front of")
_PREP_NOUNS = frozenset({"top", "front", "back", "middle", "side", "edge", "end", "bottom", "center", "left", "right"})
#: nouns whose "of" takes a whole coordination ("a group of [people] and [elephants]", "a photo of
#: [a man] and [a woman]"); after any other "of" the second conjunct may be the noun's partner
#: ("a body of water and mountains", "a piece of cake and fork")
_OF_COLLECTIONS = frozenset({"group", "groups", "bunch", "lots", "lot", "pile", "piles", "collection", "variety",
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
def _word_classes() -> _WordClasses:
    lex = load_lexicon()
    nouns = frozenset(f for f, ss in lex.senses.items() if " " not in f and any(s.pos == "noun" for s in ss))
    animate = {f: s.cls for f, ss in lex.senses.items() for s in ss if s.kind == "animate"}
    adj_sense = frozenset(f for f, ss in lex.senses.items() if any(s.pos == "adj" for s in ss))
    # "tennis", "kitchen" are in the adjective list as noun modifiers; "orange" is a colour and a fruit
    adjectives = frozenset(a for a in lex.adjectives if a in adj_sense or a not in nouns)
    pure = frozenset(f for f, ss in lex.senses.items()
                     if f not in nouns and any(s.pos == "adj" and s.cls != "material" for s in ss))
    linkers = (lex.function_words | _EXTRA_LINKERS) - _DETERMINERS - _NOT_LINKERS - _COORDINATORS - {"an"}
    return _WordClasses(nouns, animate, adjectives, pure, frozenset(linkers), lex.ing_not_verbs)


def _swap_tokens(text: str) -> list[str]:
    return ["a" if t == "an" else t for t in tokens(text)]


class _Classify:
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
            return nxt in _DETERMINERS
        return (t in self.wc.linkers and t not in _PREPOSITIONS and not self.ing_verb(t)
                and not self.participle(t) and t not in _PARTICIPLES)

    def opens_at(self, toks: list[str], i: int) -> bool:
        """A conjunct may start at ``i``: the caption's start, after punctuation or a linker
        (not a noun-like verb, nor an -ing word that modifies a noun: "a feeding [dish]")."""
        t = toks[i - 1] if i > 0 else None
        if self.boundary(t):
            return True
        if not self.linker(t) or t in _NOUN_LIKE_VERBS:
            return False
        return not (self.ing_verb(t) and i >= 2 and (toks[i - 2] in _DETERMINERS or self.adjective(toks[i - 2])))

    def boundary(self, t: str | None) -> bool:
        """Nothing of a phrase continues across ``t``: the caption's edge or clause punctuation."""
        return t is None or t in _CLAUSE_PUNCT

    def content(self, t: str | None) -> bool:
        return (t is not None and t[:1].isalnum() and t not in _DETERMINERS and t not in _COORDINATORS
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
        if any(t in _CLAUSE_PUNCT or t in _COORDINATORS for t in span):
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
                first in _DETERMINERS or self.content(first)) and not any(
                    self.finite_verb(t, n) for t, n in zip(span, [*span[1:], None])) and not any(
                    t in _DETERMINERS and self.content(p) for p, t in zip(span, span[1:])) and not (
                    len(span) > 1 and span[-2] in self.wc.animate and last not in self.wc.nouns):
            # "a pony trot": an unknown word after a person/animal is its verb, not a compound's head
            out.add("noun")  # "white paper": a material word may head a noun phrase; "a hand a cellphone" is two
        return frozenset(out)


def _plural(word: str) -> bool:
    return word.endswith("s") and not word.endswith("ss")


def _separator_at(toks: list[str], k: int) -> int:
    """Length of the separator starting at ``k`` (0 when none)."""
    for sep in _SEPARATORS:
        if tuple(toks[k:k + len(sep)]) == sep:
            return len(sep)
    return 0


def _runs_after(toks: list[str], a: int) -> list[tuple[int, list[tuple[int, int]], bool]]:
    """Where a later conjunct may start, given the left conjunct ends at ``a``.

    Returns (start, middle conjuncts skipped on the way, whether a coordinating word was
    crossed) for each start reachable over separators and whole middle conjuncts:
    "A, B and C" gives B (nothing skipped) and C (B skipped)."""
    out = []
    middles: list[tuple[int, int]] = []
    crossed = False
    t = a
    while True:
        n = _separator_at(toks, t)
        if not n:
            return out
        crossed = crossed or any(x in _COORDINATORS for x in toks[t:t + n])
        t += n
        if t >= len(toks):
            return out
        out.append((t, list(middles), crossed))
        m = t
        while m < len(toks) and not _separator_at(toks, m) and toks[m] not in _CLAUSE_PUNCT:
            m += 1
        if m == t:
            return out
        middles.append((t, m))
        t = m


def _list_opener(toks: list[str], i: int, cls: _Classify) -> int:
    """Index of the token before the whole list the conjunct starting at ``i`` belongs to
    (-1 at the caption's start): "with a hat, a scarf and a dog" -> the index of "with"."""
    t = i - 1
    while t >= 0 and toks[t] == ",":
        m = t - 1
        while m >= 0 and toks[m] not in _CLAUSE_PUNCT and toks[m] not in _COORDINATORS and not cls.linker(toks[m]):
            m -= 1
        if m == t - 1:
            break
        t = m
    return t


def _whole_conjuncts(toks: list[str], i: int, a: int, y0: int, j: int, middles: list[tuple[int, int]],
                     crossed: bool, cls: _Classify) -> bool:
    """Are X = toks[i:a] and Y = toks[y0:j] whole, parallel conjuncts of one coordination?

    Each rule guards against one way a swap of *parts* moves a modifier to another thing (the
    tests name a real caption for each):

    * Shape: X, Y (and list members between them) are all adjectives, all verb phrases or
      all noun phrases, with no coordinator or clause punctuation inside; a noun phrase holds
      no finite verb ("a woman ... hold a knife" is a clause) and no second determiner after a
      noun ("a hand a cellphone" is two phrases).  Members skipped in a non-adjacent swap come
      from one comma list ("A, B, C and D") and hold no preposition.
    * A comma alone joins list members only: the list must go on to an "and"/"or"; and the
      member before a comma has X's shape ("a snowy, icy, [empty street]" lists adjectives).
    * Nothing starts right after another "and" (nested coordination: "a black and [white cat]
      and [dog]").
    * Adjectives share the noun after them ("a [black] and [white] cat") or are predicates
      after a verb ("is [black] and [white]").
    * Verb phrases follow their subject ("a man [wearing glasses] and [holding a bottle]"); one
      with an object ends the clause; two bare verbs share only a place ("sitting and standing
      on a bench"), not an object or complement ("smiling and taking a picture").
    * Noun phrases, left edge: the caption's start, clause punctuation or a preposition/verb;
      or a shared article before two known nouns ("a [dog] and [cat]"), never a shared number
      or attribute ("two [cats] and [dogs]", "cooked [noodles] and [broccoli]").
    * Noun phrases, right edge: the caption's end, clause punctuation, a coordinator, a floating
      "all"/"both"/"together", or a preposition/verb that may attach to the whole coordination;
      never a noun ("a [cane] and [a roller] bag") or a word that may belong to Y alone ("with",
      "wearing", "of", "that", and "in" after a person or animal, unless "in front of").
    * Attribute scope (:func:`_may_share_modifiers`): prenominal modifiers of one conjunct may
      cover a bare other one ("a white [hat] and [uniform]", "[noodle] and [vegetable dish]").
    * Modifiers after a head (:func:`_post_modifiers_ok`): Y's may cover both ("a man and [a
      woman on a motorcycle]"); the coordination may sit inside X's ("[a white plate containing
      fried food] and [various greens]"); and X with one forbids a preposition right after Y
      ("[a man with a hat] and [a woman] on a bench": Y stops early there).
    * Embedded coordination (after a preposition/verb that follows a noun: "a man with [a hat]
      and [a woman] ..."): Y may instead be the partner of that noun, so reject when the linker
      repeats after Y ("... with a dog"); when X and Y differ in animacy; when Y is a person or
      animal anywhere but after "of"; after "of" unless the noun is a collection or a picture
      ("a group of", "a photo of"; not "a body of water and mountains"); and when only one
      conjunct has a determiner, after "of" always, elsewhere unless the bare one is a known
      thing or the linker is a finite verb ("a kitchen has [a stove] and [microwave]"); and when
      the linker's noun is itself inside a prepositional phrase ("with a frame on [wall] and
      [sink]": the sink may be the frame's partner).
    """
    common = cls.shapes(toks[i:a]) & cls.shapes(toks[y0:j])
    if middles:
        seps = [t for t in toks[a:y0] if t in _COORDINATORS or t == ","]
        if any(t != "," for t in seps[:-1]) or any(cls.linker(t) for s, e in middles for t in toks[s:e]):
            return False
    for s, e in middles:
        common &= cls.shapes(toks[s:e])
    if not crossed:  # "A, B and C" swapping A and B: the list must carry on to its "and"
        rest = toks[j:]
        if not rest or rest[0] not in (",", "and", "or", "&") or not (_COORDINATORS & set(rest)):
            return False
    if i > 0 and toks[i - 1] in _COORDINATORS:
        return False
    if i > 0 and toks[i - 1] == ",":  # X continues a list: its previous member has X's shape
        m = i - 2
        while m >= 0 and toks[m] not in _CLAUSE_PUNCT and toks[m] not in _COORDINATORS and not cls.linker(toks[m]):
            m -= 1
        if m == i - 2:
            return False
        prev = toks[m + 1:i - 1]
        bare = [t for t in prev if t not in _DETERMINERS] or prev  # "a blue, [white] and red": "a" is shared
        common &= cls.shapes(prev) | cls.shapes(bare)  # "a snowy, icy, [empty city street]" lists adjectives
    return any(_EDGE_RULES[shape](toks, i, a, y0, j, cls) for shape in sorted(common))


def _adjectives_ok(toks: list[str], i: int, a: int, y0: int, j: int, cls: _Classify) -> bool:
    left = toks[i - 1] if i > 0 else None
    right = toks[j] if j < len(toks) else None
    if cls.content(right):
        return True  # a shared head noun ("a brown and gold fire hydrant")
    if (left in _DETERMINERS or cls.content(left)) and cls.ing_verb(right or "") and cls.content(
            toks[j + 1] if j + 1 < len(toks) else None):
        return True  # "a black and white sitting room": prenominal, the head comes later
    return (cls.boundary(right) or right in _COORDINATORS or cls.linker(right)) and cls.opens_at(toks, i)


def _verb_phrases_ok(toks: list[str], i: int, a: int, y0: int, j: int, cls: _Classify) -> bool:
    left = toks[i - 1] if i > 0 else None
    right = toks[j] if j < len(toks) else None
    if left in _DETERMINERS:
        return False
    if a - i == 1 and j - y0 == 1:
        return cls.boundary(right) or right in _COORDINATORS or right in _LOCATIVE
    if a - i == 1 and any(t in _PREPOSITIONS for t in toks[y0:j]):
        return False  # "grazing and [eating in the pasture]": the place may cover both
    return cls.boundary(right) or right in _COORDINATORS


def _noun_phrases_ok(toks: list[str], i: int, a: int, y0: int, j: int, cls: _Classify) -> bool:
    wc = cls.wc
    x, y = toks[i:a], toks[y0:j]
    left = toks[i - 1] if i > 0 else None
    right = toks[j] if j < len(toks) else None
    x_det, y_det = x[0] in _DETERMINERS, y[0] in _DETERMINERS
    if not cls.opens_at(toks, i):  # X starts after an article it shares with Y
        if x_det or y_det or left in _NUMERALS or left not in _DETERMINERS:
            return False
        if x[-1] not in wc.nouns or y[-1] not in wc.nouns:
            return False  # "stand in a [field] and [graze]"
        if left == "a" and (_plural(x[-1]) or _plural(y[-1])):
            return False  # "a [bright window] and [house plants]": no article shared with a plural
    if x_det and len(x) == 2 and x[1] not in wc.nouns and not y_det and y[0] in wc.pure_adjectives:
        return False  # "a [grown] and [white dog]": two adjectives sharing "dog"
    if not (cls.boundary(right) or right in _COORDINATORS or cls.linker(right) or right in _AFTER_COORDINATION):
        return False
    y_animate = y[-1] in wc.animate
    in_front = right == "in" and j + 1 < len(toks) and toks[j + 1] == "front"
    if right in _BINDS_RIGHT or (right in _BINDS_RIGHT_ANIMATE and y_animate and not in_front):
        return False
    if (right in _PREPOSITIONS or cls.ing_verb(right or "")) and any(cls.linker(t) for t in x[1:]):
        return False  # "[a man with a hat] and [a woman] on a bench": Y may go on
    if not _post_modifiers_ok(x, y, cls):
        return False
    if _may_share_modifiers(x, y, cls) or _may_share_modifiers(y, x, cls):
        return False
    opener = _list_opener(toks, i, cls)
    if opener >= 0 and cls.linker(toks[opener]) and any(cls.content(t) for t in toks[:opener]):
        link = toks[opener]
        if right == link or (x[-1] in wc.animate) != y_animate:
            return False
        if y_animate and (link != "of" or any(t in wc.animate for t in toks[:opener])):
            return False
        if link == "of" and toks[opener - 1] not in _OF_COLLECTIONS:
            return False
        if link in _PREPOSITIONS and _nested_in_prepositional_phrase(toks, opener, cls):
            return False  # "with a coat on [his shoulder] and [a suitcase] by his foot"
        if x_det != y_det:
            bare = y if x_det else x
            if link == "of" or (link not in _FINITE and (bare[-1] not in wc.nouns or bare[-1] in wc.animate)):
                return False  # "a bowl of [soup] and [a sandwich]", "in [a black dress] and [fans]"
    return True


def _nested_in_prepositional_phrase(toks: list[str], opener: int, cls: _Classify) -> bool:
    """The noun before the preposition at ``opener`` is itself a preposition's object ("a bathroom
    with [a frame] on ..."): Y may then be that noun's partner ("with [a frame on wall] and [sink]")."""
    q = opener - 1
    while q >= 0 and (toks[q] in _DETERMINERS or (cls.content(toks[q]) and toks[q] not in _PREP_NOUNS)):
        q -= 1
    if q == opener - 1 or q < 1 or toks[q] not in _PREPOSITIONS or toks[q] == "of":
        return False
    return any(cls.content(t) for t in toks[:q])


def _post_modifiers_ok(x: list[str], y: list[str], cls: _Classify) -> bool:
    """Conjuncts with a modifier after their head ("a man [with a hat]").

    * Only Y has one: it may cover both ("a man and a woman [on a motorcycle]"); an "of"
      complement stays with its noun ("two toothbrushes and a tube [of toothpaste]").
    * Only X has one: the coordination may sit inside it ("a white plate containing [fried food
      and various greens]"); clear only when Y is the same kind of person/animal as X's head and
      X's inner noun is neither ("[a man with a hat] and [a woman]").
    * Both: the same linking words, and both heads people/animals ("[a man in a white shirt] and
      [a woman in a white dress]"); "[night scene with clock tower] and [buildings with lights]"
      is no such pair.
    """
    x_links = [k for k, t in enumerate(x) if k and cls.linker(t)]
    y_links = [k for k, t in enumerate(y) if k and cls.linker(t) and t != "of"]
    if not x_links and not y_links:
        return True
    if not x_links:
        return False
    animate = cls.wc.animate
    x_head = x[x_links[0] - 1]
    if not y_links:
        return y[-1] in animate and animate.get(x_head) == animate[y[-1]] and x[-1] not in animate
    y_head = y[y_links[0] - 1]
    return [x[k] for k in x_links] == [y[k] for k in y_links] and x_head in animate and y_head in animate


def _may_share_modifiers(first: list[str], second: list[str], cls: _Classify) -> bool:
    """In "first and second", may first's prenominal modifiers also cover a bare second?

    "a white [hat] and [uniform]", "a tennis [racket] and [ball]", "a brown [couch] and [foot
    stool]"; and, with the conjuncts the other way round, "[noodle] and [vegetable dish]".
    Either order of such a pair changes which things the modifiers describe.
    """
    if second[0] in _DETERMINERS or any(cls.linker(t) for t in first):
        return False
    mods = [t for t in first[:-1] if t not in _DETERMINERS]
    if not mods:
        return False
    pure = cls.wc.pure_adjectives
    return len(second) == 1 or (any(t in pure for t in mods) and not any(t in pure for t in second))


_EDGE_RULES = {"adj": _adjectives_ok, "vp": _verb_phrases_ok, "noun": _noun_phrases_ok}


def is_conjunct_swap(original: str, candidate: str) -> bool:
    """True when ``candidate`` is ``original`` with two whole coordinated phrases exchanged.

    That is: for some split ``original = P + X + S + Y + Q`` the candidate reads
    ``P + Y + S + X + Q``, where S joins conjuncts ("and", "or", ",", ", and"; in a list
    "A, B and C" it may also hold the members between X and Y) and X, Y pass the rules of
    :func:`_whole_conjuncts`.  Comparison is on :func:`tokens` (case, whitespace and a final
    period ignored) with "an" folded to "a", so articles may follow the new order.

    Accepted: "a cat and a dog" -> "a dog and a cat"; "a sink, toilet and shower" -> "a sink,
    shower and toilet"; "A black and white cat" -> "A white and black cat"; "a man wearing
    glasses and holding a bottle" -> "a man holding a bottle and wearing glasses"; "a man
    with a hat and a woman with a dog" -> "a woman with a dog and a man with a hat".

    Rejected (binding swaps, hard negatives): "Blue bathroom with white towels" -> "White
    bathroom with blue towels" (no coordination); "a man with a hat and a woman with a dog" ->
    "a man with a woman and a hat with a dog"; "a person with a cane and a roller bag" -> "a
    person with a roller and a cane bag"; "a train and phone booth" -> "a phone and train booth".
    Doubtful splits are rejected: a wrong reject costs coverage, a wrong accept teaches the
    model that a binding change keeps the meaning.
    """
    o, c = _swap_tokens(original), _swap_tokens(candidate)
    n = len(o)
    if len(c) != n or o == c:
        return False
    first = next(k for k in range(n) if o[k] != c[k])
    last = max(k for k in range(n) if o[k] != c[k]) + 1
    cls = _Classify(_word_classes())
    for a in range(1, n):
        if not _separator_at(o, a):
            continue
        for i in range(min(first, a - 1), -1, -1):  # X = o[i:a], longest last
            if o[i] in _COORDINATORS or o[i] in _CLAUSE_PUNCT:
                break
            for y0, middles, crossed in _runs_after(o, a):
                for j in range(max(last, y0 + 1), n + 1):
                    if o[j - 1] in _COORDINATORS or o[j - 1] in _CLAUSE_PUNCT:
                        break
                    if c[i:j] == o[y0:j] + o[a:y0] + o[i:a] and _whole_conjuncts(
                            o, i, a, y0, j, middles, crossed, cls):
                        return True
    return False


def validate(original: str, candidate: object, kind: str) -> Verdict:
    """Accept or reject ``candidate`` as a ``kind`` edit of ``original``.

    kind: "replace" | "swap" (hard positives); "replace_negative" | "swap_negative" (LLM
    hard negatives, same edit-shape rules); "replace_positive"/"swap_positive" are aliases.
    Raises ValueError for an unknown kind or a non-string original (caller bugs, not rows).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown validation kind {kind!r}; expected one of {sorted(KINDS)}")
    if not isinstance(original, str):
        raise ValueError(f"original caption must be a string, got {type(original).__name__}")
    shape = KINDS[kind]
    if candidate is None:
        return _reject("empty")
    if not isinstance(candidate, str):
        return _reject("non_text")
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Co") and ch not in "\n\r\t" for ch in candidate) or "\ufffd" in candidate:
        return _reject("non_text")
    if not candidate.strip().strip(_QUOTES).strip():
        return _reject("empty")
    if not any(ch.isalpha() for ch in candidate):
        return _reject("non_text")
    if _is_chatter(original, candidate):
        return _reject("chatter")
    text = " ".join(candidate.split())
    if normalise(text) == normalise(original):
        return _reject("identical")
    n_orig, n_cand = len(words(original)), len(words(text))
    if n_orig and abs(n_cand - n_orig) > LENGTH_SLACK_WORDS and not (
        MIN_LENGTH_RATIO <= n_cand / n_orig <= MAX_LENGTH_RATIO
    ):
        return _reject("length")
    if shape in ("swap", "conjunct_swap"):
        wo, wc = words(original), words(text)
        if Counter(wo) != Counter(wc) or wo == wc:
            return _reject("not_a_swap")
        if shape == "conjunct_swap" and not is_conjunct_swap(original, text):
            return _reject("not_conjunct_swap")
        if shape == "swap" and is_conjunct_swap(original, text):
            # exchanging two whole conjuncts keeps the meaning: a hard positive, never a negative
            return _reject("meaning_kept")
    else:
        problem = _edit_shape_replace(words(original), words(text))
        if problem:
            return _reject(problem)
    return Verdict(True, None, text)
