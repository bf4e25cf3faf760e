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
  kite"; see :mod:`hardpos.data.lexicon`), not for a noun that modifies another noun
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
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Iterable

from hardpos.data.lexicon import Context, Lexicon, Sense, load_lexicon

_TOKEN = re.compile(r"[A-Za-z]+(?:['\-][A-Za-z]+)*|\d+(?:\.\d+)?|[^\sA-Za-z\d]")
_BOUNDARY_PUNCT = {",", ".", ";", ":", "!", "?", "(", ")", '"'}
_COORD = {"and", "or", ","}
#: pronouns that stand for a whole noun phrase after a verb or preposition ("next to it")
_OBJECT_PRONOUNS = frozenset({"it", "them", "him", "her", "me", "us", "you", "each", "one", "something", "someone",
                              "other", "others"})
#: prepositions a head-noun search steps over ("resting on the side of a road" -> side)
_SURFACE_PREPS = frozenset({"on", "atop", "upon", "onto"})
#: attribute classes any visible thing can have (cross-class attribute swaps stay within these)
_VISUAL = frozenset({"color", "material", "size", "pattern"})
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
class _Tok:
    text: str
    low: str
    start: int
    end: int

    @property
    def alpha(self) -> bool:
        return self.text[:1].isalpha()


@dataclass(frozen=True)
class _Match:
    i: int  # first token
    j: int  # one past the last token
    form: str
    senses: tuple[Sense, ...]


def _stable_seed(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def _wants_an(word: str) -> bool:
    w = word.lower()
    if w.startswith(("uni", "use", "usu", "eu", "one", "once", "ur")):
        return False
    if w.startswith(("hour", "honest", "honor", "heir")):
        return True
    return w[:1] in "aeiou" and w[:1] != ""


def _case_like(new: str, old: str) -> str:
    """Give ``new`` the casing pattern of ``old`` (ALL CAPS, Capitalised, lower)."""
    if len(old) > 2 and old.isupper():
        return new.upper()  # "letters ON hanging sign" (VL-checklist style emphasis)
    if old[:1].isupper() and old[1:] == old[1:].lower():
        return new[:1].upper() + new[1:]
    return new  # lower case, or an acronym like "TV" that the replacement does not inherit


def _capitalised(word: str) -> bool:
    """"Blue", not "blue" or the acronym "TV"."""
    return len(word) > 1 and word[0].isupper() and word[1:].islower()


def _decapitalise(text: str) -> str:
    """Lower the first letter of a phrase that was capitalised only because it started the caption."""
    first = text.split(" ", 1)[0]
    if first == "I" or (len(first) > 1 and first.isupper()):
        return text
    return text[:1].lower() + text[1:]


class RulePerturber:
    """Deterministic rule engine over a curated lexicon.

    seed:    seeds :meth:`pick` (together with the caption).
    lexicon: a :class:`~hardpos.data.lexicon.Lexicon`; default: the shipped lexicon with
             the paper's replacement table.
    """

    def __init__(self, seed: int = 0, lexicon: Lexicon | None = None):
        self.seed = int(seed)
        self.lexicon = lexicon if lexicon is not None else load_lexicon()
        lex = self.lexicon
        self._determiners = frozenset({"a", "an", "the", "this", "that", "these", "those", "some", "two", "three", "four",
                                       "five", "six", "several", "many", "his", "her", "their", "its", "my", "one",
                                       "another", "each", "every", "few"})
        self._linkers = lex.function_words - self._determiners - {"and", "or", "but"}
        # adjectives proper (lexicon attribute classes), as opposed to noun modifiers like "tennis", "teddy"
        self._attr_adjs = frozenset(f for f, ss in lex.senses.items() if any(x.pos == "adj" for x in ss))
        self._cache: dict[str, tuple[list[Perturbation], list[Perturbation]]] = {}
        # first word of every lexicon form -> the longest form starting with it (cheap phrase matching)
        self._starts: dict[str, int] = {}
        for form in lex.senses:
            words = form.split(" ")
            self._starts[words[0]] = max(self._starts.get(words[0], 0), len(words))

    # ------------------------------------------------------------------ public API
    def hard_negatives(self, caption: str) -> list[Perturbation]:
        """Every hard negative the rules can make for ``caption`` (deterministic order, no duplicates)."""
        return list(self._both(caption)[0])

    def hard_positives(self, caption: str) -> list[Perturbation]:
        """Every hard positive the rules can make for ``caption`` (deterministic order, no duplicates)."""
        return list(self._both(caption)[1])

    def pick(self, caption: str, polarity: str, kind: str | None = None) -> Perturbation | None:
        """One seeded choice among the perturbations of ``polarity`` ("negative" | "positive"),
        optionally restricted to ``kind`` ("replace" | "swap"); None when there is none.

        The choice first draws a slot family (attribute / relation / object / conjuncts ...)
        uniformly, then a perturbation inside it, so frequent families (colours) do not
        crowd out rare ones.
        """
        if polarity not in POLARITIES:
            raise ValueError(f"polarity must be one of {POLARITIES}, got {polarity!r}")
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} or None, got {kind!r}")
        options = self.hard_negatives(caption) if polarity == "negative" else self.hard_positives(caption)
        if kind is not None:
            options = [p for p in options if p.kind == kind]
        if not options:
            return None
        families: dict[str, list[Perturbation]] = {}
        for p in options:
            families.setdefault(p.slot.split(" ", 1)[0].split(":", 1)[0] + "/" + p.kind, []).append(p)
        rng = random.Random(_stable_seed(self.seed, polarity, kind, caption))
        family = rng.choice(sorted(families))
        return rng.choice(families[family])

    # ------------------------------------------------------------------ internals
    def _both(self, caption: str) -> tuple[list[Perturbation], list[Perturbation]]:
        if not isinstance(caption, str):
            raise TypeError(f"caption must be a string, got {type(caption).__name__}")
        hit = self._cache.get(caption)
        if hit is not None:
            return hit
        toks = [_Tok(m.group(0), m.group(0).lower(), m.start(), m.end()) for m in _TOKEN.finditer(caption)]
        matches = self._matches(toks)
        neg = _dedupe(caption, [*self._replace(caption, toks, matches, "negative"),
                                *self._swap_attributes(caption, toks, matches),
                                *self._swap_objects(caption, toks, matches)])
        pos = _dedupe(caption, [*self._replace(caption, toks, matches, "positive"),
                                *self._swap_conjuncts(caption, toks, matches)])
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[caption] = (neg, pos)
        return neg, pos

    def _matches(self, toks: list[_Tok]) -> list[_Match]:
        """Longest-first, non-overlapping lexicon matches, with the reading decided from context."""
        lex = self.lexicon
        out: list[_Match] = []
        i = 0
        while i < len(toks):
            found = None
            longest = self._starts.get(toks[i].low, 0)
            for n in range(min(longest, len(toks) - i), 0, -1):
                if n > 1 and not all(t.alpha for t in toks[i:i + n]):
                    continue
                form = " ".join(t.low for t in toks[i:i + n]) if n > 1 else toks[i].low
                senses = lex.lookup(form)
                if senses:
                    found = (n, form, senses)
                    break
            if found is None:
                i += 1
                continue
            n, form, senses = found
            senses = self._reading(toks, i, i + n, senses)
            if senses:
                out.append(_Match(i, i + n, form, senses))
            i += n
        return out

    def _is_content(self, tok: _Tok | None) -> bool:
        return tok is not None and tok.alpha and tok.low not in self.lexicon.function_words and tok.low not in self._determiners

    def _is_ing_verb(self, tok: _Tok | None) -> bool:
        if tok is None or not tok.alpha or len(tok.low) < 5 or not tok.low.endswith("ing"):
            return False
        if tok.low in self.lexicon.ing_not_verbs:
            return False
        return not any(s.pos == "noun" for s in self.lexicon.lookup(tok.low))

    def _reading(self, toks: list[_Tok], i: int, j: int, senses: tuple[Sense, ...]) -> tuple[Sense, ...]:
        nxt = toks[j] if j < len(toks) else None
        has_adj = any(s.pos == "adj" for s in senses)
        has_noun = any(s.pos == "noun" for s in senses)
        if has_adj and has_noun:
            # "an orange cat" (colour) vs "an orange on a plate" (fruit)
            want = "adj" if self._is_content(nxt) and not self._is_ing_verb(nxt) else "noun"  # "an orange sitting on"
            senses = tuple(s for s in senses if s.pos == want or s.pos not in ("adj", "noun"))
        prev = toks[i - 1] if i > 0 else None
        kept = []
        for s in senses:
            if s.pos == "noun" and self._is_content(nxt) and not self.lexicon.is_noun(nxt.low) \
                    and nxt.low not in self.lexicon.adjectives and not self._is_ing_verb(nxt):
                # noun used as a modifier of an unknown noun ("dog food", "bus stop"): leave it alone;
                # an -ing verb after it is the noun's predicate, not its head ("a man sitting")
                continue
            if s.pos == "noun" and self._is_content(prev) and prev.low not in self._attr_adjs:
                # head of a compound ("bath tub", "park bench", "dog cake"): replacing it makes nonsense
                continue
            if s.needs_object_check and not self._object_ok(toks, j):
                continue
            kept.append(s)
        return tuple(kept)

    def _object_ok(self, toks: list[_Tok], j: int) -> bool:
        """For "on"->"under": there is an object and it is not a surface/medium ("on the beach")."""
        k = j
        while k < len(toks) and (toks[k].low in self._determiners or toks[k].low in self.lexicon.adjectives):
            k += 1
        if k >= len(toks) or not self._is_content(toks[k]):
            return False
        block = self.lexicon.on_blocklist
        while k < len(toks) and self._is_content(toks[k]):  # the whole compound: "a sport field"
            if toks[k].low in block or toks[k].low.rstrip("s") in block:
                return False
            k += 1
        return True

    # -------------------------------------------------------------- REPLACE
    def _replace(self, caption: str, toks: list[_Tok], matches: list[_Match], polarity: str) -> Iterable[Perturbation]:
        lex = self.lexicon
        present = " " + " ".join(t.low for t in toks) + " "
        shouting = caption.isupper()  # "A FULL PLATE OF FOOD": capitals carry no name information
        for m in matches:
            old = caption[toks[m.i].start:toks[m.j - 1].end]
            for s in m.senses:
                if polarity == "negative":
                    targets = [(t, "lexicon") for t in lex.negatives.get((m.form, s.cls), ())]
                else:
                    targets = list(lex.positives.get((m.form, s.cls), ()))
                    if s.pos == "noun" and m.j < len(toks) and lex.is_noun(toks[m.j].low):
                        # a noun modifying another noun ("street signs", "baby shower"): its synonyms
                        # often do not fit the compound ("road signs" are traffic signs)
                        targets = []
                    if m.i > 0 and _capitalised(toks[m.i].text) and not shouting:
                        targets = []  # a name inside the caption ("the Blue Angels", "Green Lake Drive")
                for target, _src in targets:
                    if polarity == "negative" and f" {target} " in present:
                        continue  # "a red and blue car" -> "a blue and blue car" is nonsense
                    words = target.split()
                    if (m.j < len(toks) and toks[m.j].low == words[-1]) or (m.i > 0 and toks[m.i - 1].low == words[0]):
                        continue  # "laptop computer" -> "notebook computer computer"
                    if polarity == "positive" and not self._sense_allows(toks, m, target):
                        continue  # the synonym belongs to another sense here ("flying a kite" -> "soaring")
                    text = _apply(caption, [(toks[m.i].start, toks[m.j - 1].end, _case_like(target, old))])
                    yield Perturbation(text, "replace", f"{s.slot}:{s.cls} {m.form}->{target}")

    def _sense_allows(self, toks: list[_Tok], m: _Match, target: str) -> bool:
        """The lexicon's sense rules for ``m.form -> target``: every "only" context holds, no "block" one does."""
        for rule in self.lexicon.rules_for(m.form, target):
            if self._context_holds(rule.when, toks, m) != (rule.mode == "only"):
                return False
        return True

    def _context_holds(self, ctx: Context, toks: list[_Tok], m: _Match) -> bool:
        """Whether every non-empty field of ``ctx`` matches around match ``m`` (see lexicon.Context)."""
        if ctx.next and not self._token_in(ctx.next, toks, m.j):
            return False
        if ctx.prev and not self._token_in(ctx.prev, toks, m.i - 1):
            return False
        if ctx.head:
            head = self._head_noun(toks, m.j)
            if head is None or toks[head].low not in ctx.head:
                return False
        if ctx.subject:
            k = m.i - 1
            while k >= 0 and toks[k].low not in ctx.subject and not self._nounish(toks[k]):
                k -= 1
            if k < 0 or toks[k].low not in ctx.subject:
                return False
        if ctx.before and not any(t.low in ctx.before for t in toks[:m.i]):
            return False
        if ctx.caption and not any(t.low in ctx.caption for t in toks):
            return False
        if ctx.phrase:
            lows = [t.low for t in toks]
            inside = any(lows[a:a + len(ph)] == list(ph)
                         for ph in ctx.phrase for a in range(max(0, m.j - len(ph)), m.i + 1))
            if not inside:
                return False
        return True

    def _token_in(self, wanted: frozenset[str], toks: list[_Tok], k: int) -> bool:
        """Token ``k`` is one of the ``wanted`` words or token classes (see lexicon.Context)."""
        tok = toks[k] if 0 <= k < len(toks) else None
        if tok is None or not (tok.alpha or tok.text[:1].isdigit()):
            return "<end>" in wanted or (tok is not None and tok.text in wanted)
        if tok.low in wanted:
            return True
        if "<det>" in wanted and tok.low in self._determiners:
            return True
        if "<adj>" in wanted and tok.low in self.lexicon.adjectives and not self.lexicon.is_noun(tok.low):
            return True  # "kitchen" in "a bright kitchen" is the noun, not a second adjective
        if "<noun>" in wanted and self._nounish(tok):
            return True
        if "<known-noun>" in wanted and self.lexicon.is_noun(tok.low):
            return True
        if "<np>" in wanted:
            if tok.low in self._determiners or tok.text[:1].isdigit() or tok.low in _OBJECT_PRONOUNS:
                return True
            while k < len(toks) and toks[k].low in self.lexicon.adjectives and not self.lexicon.is_noun(toks[k].low):
                k += 1  # "flying colorful kites"
            return k < len(toks) and self._nounish(toks[k])
        return False

    def _nounish(self, tok: _Tok) -> bool:
        """A lexicon noun, or an unknown content word that is not an -ing form, adjective or adverb."""
        if self.lexicon.is_noun(tok.low):
            return True
        return (self._is_content(tok) and not self._is_ing_verb(tok) and tok.low not in self.lexicon.adverbs
                and tok.low not in self.lexicon.adjectives)

    def _head_noun(self, toks: list[_Tok], j: int) -> int | None:
        """The first noun from ``j`` on, past determiners, numbers and adjectives ("a bright yellow bus" -> bus),
        and past a leading "on"-like preposition ("sitting on the side" -> side)."""
        k = j + 1 if j < len(toks) and toks[j].low in _SURFACE_PREPS else j
        while k < len(toks):
            t = toks[k]
            if t.low in self._determiners or t.text[:1].isdigit() or (
                    t.low in self.lexicon.adjectives and not self.lexicon.is_noun(t.low)
                    and k + 1 < len(toks) and self._is_content(toks[k + 1])):
                k += 1  # an adjective before another content word; "the side of" keeps "side" as the head
            elif t.low in ("and", ",") and k + 1 < len(toks) and toks[k + 1].low in self.lexicon.adjectives:
                k += 1  # "a black and white cat"
            else:
                break
        return k if k < len(toks) and self._is_content(toks[k]) else None

    # -------------------------------------------------------------- SWAP negatives
    def _head_after(self, toks: list[_Tok], j: int) -> int | None:
        """Index of the noun an adjective ending at ``j`` modifies (skipping further adjectives)."""
        k = j
        while k < len(toks) and toks[k].low in self.lexicon.adjectives and not self.lexicon.is_noun(toks[k].low):
            k += 1
        if k < len(toks) and self._is_content(toks[k]) and not self._is_ing_verb(toks[k]):
            return k
        return None

    def _swap_attributes(self, caption: str, toks: list[_Tok], matches: list[_Match]) -> Iterable[Perturbation]:
        adjs = []
        for m in matches:
            for s in m.senses:
                if s.pos == "adj" and s.slot == "attribute":
                    head = self._head_after(toks, m.j)
                    if head is not None:
                        adjs.append((m, s, head))
                    break
        for a in range(len(adjs)):
            for b in range(a + 1, len(adjs)):
                (ma, sa, ha), (mb, sb, hb) = adjs[a], adjs[b]
                if ha == hb or toks[ha].low == toks[hb].low:
                    continue
                if sa.cls == sb.cls:
                    if sa.group == sb.group:
                        continue  # synonyms
                elif not (sa.cls in _VISUAL and sb.cls in _VISUAL and self._sole_adjective(toks, ma, ha)
                          and self._sole_adjective(toks, mb, hb)):
                    # "a large red circle": swapping size with another NP's colour gives "a blue red circle";
                    # state words fit only their nouns ("a young girl on a wooden floor" -> "a wooden girl")
                    continue
                ta = caption[toks[ma.i].start:toks[ma.j - 1].end]
                tb = caption[toks[mb.i].start:toks[mb.j - 1].end]
                text = _swap(caption, (toks[ma.i].start, toks[ma.j - 1].end), (toks[mb.i].start, toks[mb.j - 1].end), ta, tb)
                yield Perturbation(text, "swap", f"attributes:{sa.cls if sa.cls == sb.cls else sa.cls + '/' + sb.cls} {ma.form}<->{mb.form}")

    def _sole_adjective(self, toks: list[_Tok], m: _Match, head: int) -> bool:
        """The adjective sits right before its noun and no other adjective modifies that noun."""
        before = toks[m.i - 1] if m.i > 0 else None
        return head == m.j and not (before is not None and (before.low in self.lexicon.adjectives
                                                            or before.low in _COORD))

    def _coordinated(self, toks: list[_Tok], i: int, j: int) -> bool:
        """True when tokens strictly between i and j only join conjuncts ("a dog and a cat")."""
        between = toks[i + 1:j]
        if not any(t.low in _COORD for t in between):
            return False
        return not any(t.low in self._linkers or self._is_ing_verb(t) for t in between)

    def _swap_objects(self, caption: str, toks: list[_Tok], matches: list[_Match]) -> Iterable[Perturbation]:
        nouns = []
        for m in matches:
            before = toks[m.i - 1] if m.i > 0 else None
            after = toks[m.j] if m.j < len(toks) else None
            if self._is_content(after) or (before is not None and self._is_content(before)
                                           and before.low not in self._attr_adjs):
                continue  # part of a compound ("street sign", "luggage bag", "serving dish", "teddy bear")
            if (after is not None and after.low == "of") or (m.i >= 2 and toks[m.i - 2].low == "of"
                                                                 and toks[m.i - 1].low in self._determiners) \
                    or (before is not None and before.low == "of"):
                continue  # containers and contents stay put ("a cup of coffee" -> "a cup of laptop" is absurd)
            if after is not None and after.alpha and after.low.endswith("ed"):
                continue  # "snow covered field": the noun modifies a participle
            if len({s.number for s in m.senses if s.pos == "noun"}) > 1:
                continue  # "glasses" (drinking glasses or spectacles): number unknown, agreement would break
            for s in m.senses:
                if s.pos == "noun" and s.kind:
                    nouns.append((m, s))
                    break
        for a in range(len(nouns)):
            for b in range(a + 1, len(nouns)):
                (ma, sa), (mb, sb) = nouns[a], nouns[b]
                if sa.kind != sb.kind or sa.number != sb.number or ma.form == mb.form:
                    continue
                if sa.cls == sb.cls and sa.group == sb.group:
                    continue  # synonyms: swapping them changes nothing
                if mb.i - ma.j < 1 or self._coordinated(toks, ma.j - 1, mb.i):
                    continue
                ta = caption[toks[ma.i].start:toks[ma.j - 1].end]
                tb = caption[toks[mb.i].start:toks[mb.j - 1].end]
                text = _swap(caption, (toks[ma.i].start, toks[ma.j - 1].end), (toks[mb.i].start, toks[mb.j - 1].end), ta, tb)
                yield Perturbation(text, "swap", f"objects:{sa.kind} {ma.form}<->{mb.form}")

    # -------------------------------------------------------------- SWAP positives
    def _modifier(self, tok: _Tok) -> bool:
        return tok.alpha and (tok.low in self.lexicon.adjectives or self.lexicon.is_noun(tok.low)) \
            and tok.low not in self.lexicon.function_words

    def _boundary(self, tok: _Tok | None) -> bool:
        """A token that may end a conjunct: end of caption, punctuation, a linker/"and", an -ing verb."""
        if tok is None:
            return True
        if not tok.alpha:
            return tok.text in _BOUNDARY_PUNCT
        return tok.low in self.lexicon.function_words or self._is_ing_verb(tok)

    def _left_np(self, toks: list[_Tok], k: int) -> tuple[int, int] | None:
        j = k - 1
        if j < 0 or not self._is_content(toks[j]) or self._is_ing_verb(toks[j]):
            return None
        if toks[j].low in self.lexicon.adjectives and not self.lexicon.is_noun(toks[j].low):
            return None  # "grassy and rocky hill": adjectives, not noun phrases
        i = j
        while i - 1 >= 0 and self._modifier(toks[i - 1]) and not self._is_ing_verb(toks[i - 1]) and j - (i - 1) < 4:
            i -= 1
        if i - 1 >= 0 and toks[i - 1].low in self._determiners:
            i -= 1
            if i - 1 >= 0 and toks[i - 1].low in self._determiners:  # "the two"
                i -= 1
        before = toks[i - 1] if i - 1 >= 0 else None
        if before is not None and not self._boundary(before):
            return None  # an unknown word (a verb? an adjective?) precedes: structure unclear
        if before is not None and before.low in ("and", "or", "of"):
            # "gray and black raccoon and ...": nested coordination; "a couple of goats and a goose",
            # "a body of water and mountains": the quantity/container noun does not move. Leave both.
            return None
        return i, k

    def _right_np(self, toks: list[_Tok], k: int) -> tuple[int, int] | None:
        i = k + 1
        j = i
        if j < len(toks) and toks[j].low in self._determiners:
            j += 1
            if j < len(toks) and toks[j].low in self._determiners:
                j += 1
        start_content = j
        while j < len(toks) and self._modifier(toks[j]) and not self._is_ing_verb(toks[j]):
            j += 1
        if j < len(toks) and self._is_content(toks[j]) and not self._is_ing_verb(toks[j]) and not self._modifier(toks[j]):
            if j > start_content and self.lexicon.is_noun(toks[j - 1].low):
                return None  # "sink side by side", "doughnuts available": the known noun was the head
            j += 1  # an unknown head noun ("utensils")
        if j == start_content or j - start_content > 4:
            return None
        after = toks[j] if j < len(toks) else None
        if not self._boundary(after) or (after is not None and after.low == "of"):
            return None
        last = toks[j - 1]
        if not self._is_content(last) or (last.low in self.lexicon.adjectives and not self.lexicon.is_noun(last.low)):
            return None  # "sink side by side": the conjunct must end in a noun
        return i, j

    def _swap_conjuncts(self, caption: str, toks: list[_Tok], matches: list[_Match]) -> Iterable[Perturbation]:
        """Conjunct-swap hard positives: for each "and", the first candidate of :meth:`_conjunct_candidates`
        that :func:`~hardpos.data.validate.is_conjunct_swap` accepts.

        The candidates come from local heuristics that cannot see a whole coordination; the validator's
        check is the contract, so a swap of parts ("a man with a hat and a woman" -> "a man with a woman
        and a hat", "a white hat and uniform" -> "uniform and a white hat") never leaves the engine.
        """
        from hardpos.data.validate import is_conjunct_swap

        done: set[int] = set()
        for k, p in [*self._conjunct_candidates(caption, toks), *_clause_candidates(caption, toks)]:
            if k not in done and is_conjunct_swap(caption, p.text):
                done.add(k)
                yield p

    def _conjunct_candidates(self, caption: str, toks: list[_Tok]) -> Iterable[tuple[int, Perturbation]]:
        """(index of the "and", candidate swap) pairs, the preferred candidate for one "and" first."""
        for k, tok in enumerate(toks):
            if tok.low != "and" or k == 0 or k == len(toks) - 1:
                continue
            prev, nxt = toks[k - 1], toks[k + 1]
            # adjectives: "a black and white cat"
            adj_prev, adj_next = prev.low in self.lexicon.adjectives, nxt.low in self.lexicon.adjectives
            pure = not self.lexicon.is_noun(prev.low) and not self.lexicon.is_noun(nxt.low)
            if adj_prev and adj_next and prev.low != nxt.low:
                after = toks[k + 2] if k + 2 < len(toks) else None
                if self._is_content(after) and (pure or not self.lexicon.is_noun(nxt.low)):
                    # "an orange and white fish": colour words before a noun, even when one is also a noun
                    yield k, Perturbation(_swap(caption, (prev.start, prev.end), (nxt.start, nxt.end), prev.text,
                                                nxt.text), "swap", "conjuncts:adjectives")
                    continue
                if pure:
                    continue  # predicate adjectives ("is black and white."): nothing to swap as noun phrases
            # verb phrases: "wearing glasses and holding a bottle"
            if self._is_ing_verb(nxt):
                p = k - 1
                while p >= 0 and not self._is_ing_verb(toks[p]) and toks[p].low not in ("and", ";", ".") \
                        and not (toks[p].text == "," and p != k - 1):
                    p -= 1
                if p < 0 or not self._is_ing_verb(toks[p]):
                    continue
                if p >= k - 2 and (p == k - 1 or toks[k - 1].text == ","):
                    continue  # "holding and dialing a phone": the object is shared, not swappable
                left_end = k - 1 if toks[k - 1].text == "," else k
                end = k + 1
                while end < len(toks) and toks[end].text not in (",", ".", ";", "!", "?") and toks[end].low != "and":
                    end += 1
                if end < len(toks) and toks[end].low == "and":
                    continue  # a third conjunct: leave lists of verb phrases alone
                a = (toks[p].start, toks[left_end - 1].end)
                b = (toks[k + 1].start, toks[end - 1].end)
                if caption[a[0]:a[1]].lower() == caption[b[0]:b[1]].lower():
                    continue
                yield k, Perturbation(_swap(caption, a, b, caption[a[0]:a[1]], caption[b[0]:b[1]]), "swap",
                                      "conjuncts:verb_phrases")
                continue
            # noun phrases: "a sink, toilet and shower", "a red circle and a blue square"
            left = self._left_np(toks, k)
            right = self._right_np(toks, k)
            if left is None or right is None:
                continue
            before = toks[left[0] - 1] if left[0] > 0 else None
            after = toks[right[1]] if right[1] < len(toks) else None
            if self._is_ing_verb(after) and before is not None and before.alpha:
                continue  # "side of a road and a car travelling ...": the verb may belong to the right conjunct only
            a = (toks[left[0]].start, toks[left[1] - 1].end)
            b = (toks[right[0]].start, toks[right[1] - 1].end)
            ta, tb = caption[a[0]:a[1]], caption[b[0]:b[1]]
            if ta.lower() == tb.lower() or toks[left[1] - 1].low == toks[right[1] - 1].low:
                continue
            if toks[left[0]].low in ("a", "an", "the") and left[1] - left[0] > 1 \
                    and toks[right[0]].low not in self._determiners:
                # "a keyboard and monitor": the article is shared, so it stays ("a monitor and keyboard")
                a_head = (toks[left[0] + 1].start, a[1])
                yield k, Perturbation(_swap(caption, a_head, b, caption[a_head[0]:a_head[1]], tb), "swap",
                                      "conjuncts:noun_phrases")
            yield k, Perturbation(_swap(caption, a, b, ta, tb), "swap", "conjuncts:noun_phrases")


def _clause_candidates(caption: str, toks: list[_Tok]) -> Iterable[tuple[int, Perturbation]]:
    """Whole-clause conjuncts: everything from the clause's start to "and", and from "and" to the
    clause's end ("A man with a hat and a woman with a dog" -> "A woman with a dog and a man with a
    hat").  A fallback behind the phrase rules; the validator decides whether the split is sound."""
    ends = [i for i, t in enumerate(toks) if t.text in _BOUNDARY_PUNCT]
    for k, tok in enumerate(toks):
        if tok.low != "and":
            continue
        start = max([i + 1 for i in ends if i < k], default=0)
        end = min([i for i in ends if i > k], default=len(toks))
        if start >= k or k + 1 >= end:
            continue
        a = (toks[start].start, toks[k - 1].end)
        b = (toks[k + 1].start, toks[end - 1].end)
        ta, tb = caption[a[0]:a[1]], caption[b[0]:b[1]]
        if ta.lower() != tb.lower():
            slot = "conjuncts:verb_phrases" if toks[k + 1].low.endswith("ing") else "conjuncts:noun_phrases"
            yield k, Perturbation(_swap(caption, a, b, ta, tb), "swap", slot)


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
    want = "an" if _wants_an(word_m.group(0)) else "a"
    if art.lower() == want:
        return text
    new = _case_like(want, art) if art != "A" else want.capitalize()
    return text[:m.start(1)] + new + text[m.end(1):]


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Apply non-overlapping (start, end, replacement) edits right to left, fixing articles."""
    for start, end, new in sorted(edits, reverse=True):
        if start == 0 and text[:1].isupper():
            new = new[:1].upper() + new[1:]
        text = text[:start] + new + text[end:]
        text = _fix_article(text, start)
    return text


def _swap(text: str, a: tuple[int, int], b: tuple[int, int], ta: str, tb: str) -> str:
    """Exchange spans a < b (non-overlapping); the caption's first capital stays first."""
    if a[0] == 0 and ta[:1].isupper():
        ta, tb = _decapitalise(ta), tb[:1].upper() + tb[1:]
    return _apply(text, [(a[0], a[1], tb), (b[0], b[1], ta)])


def _dedupe(caption: str, items: Iterable[Perturbation]) -> list[Perturbation]:
    from hardpos.data.validate import normalise

    seen = {normalise(caption)}
    out = []
    for p in items:
        key = normalise(p.text)
        if key in seen:
            continue
        seen.add(key)
        out.append(p)
    return out
