"""What every rule reads: the lexicon with its derived word sets, and the token helpers over them.

Contract: :class:`RuleContext` is immutable and built once per lexicon
(:meth:`RuleContext.of`); every rule family (:mod:`hardpos.rules.replace`,
:mod:`hardpos.rules.swap`) is a set of module-level functions taking it first, so a rule's
inputs are its arguments and nothing else. The helpers here are the ones several families
share: which token is a content word or an -ing verb (:func:`is_content`,
:func:`is_ing_verb`), and the lexicon matches of a caption with the reading context decides
(:func:`matches`, :func:`reading`). Pure functions, no I/O.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hardpos.rules.english import DETERMINERS
from hardpos.rules.lexicon import Lexicon, Sense
from hardpos.rules.text import SUBJECT_PRONOUNS, Match, Token


@dataclass(frozen=True)
class RuleContext:
    """The lexicon and the word sets the rules derive from it (build with :meth:`of`).

    lexicon:     the rule lexicon.
    determiners: words that open a noun phrase before its modifiers
                 (:data:`hardpos.rules.english.DETERMINERS`).
    linkers:     the lexicon's function words that link two phrases (prepositions, verbs):
                 its function words less the determiners and "and" / "or" / "but".
    attr_adjs:   adjectives proper (forms with an adjective sense), as opposed to noun
                 modifiers the lexicon also lists as adjectives ("tennis", "teddy").
    group_forms: (class, group) -> every form of that lexicon group, both numbers
                 ("monitor", "monitors").
    starts:      first word of a lexicon form -> the word count of the longest form starting
                 with it (phrase matching looks no further).
    """

    lexicon: Lexicon
    determiners: frozenset[str]
    linkers: frozenset[str]
    attr_adjs: frozenset[str]
    group_forms: Mapping[tuple[str, int], frozenset[str]]
    starts: Mapping[str, int]

    @classmethod
    def of(cls, lexicon: Lexicon) -> RuleContext:
        """The context of ``lexicon``: its derived sets computed once."""
        group_forms: dict[tuple[str, int], frozenset[str]] = {}
        for form, senses in lexicon.senses.items():
            for x in senses:
                group_forms[(x.cls, x.group)] = group_forms.get((x.cls, x.group), frozenset()) | {form}
        starts: dict[str, int] = {}
        for form in lexicon.senses:
            words = form.split(" ")
            starts[words[0]] = max(starts.get(words[0], 0), len(words))
        return cls(
            lexicon=lexicon,
            determiners=DETERMINERS,
            linkers=lexicon.function_words - DETERMINERS - {"and", "or", "but"},
            attr_adjs=frozenset(f for f, ss in lexicon.senses.items() if any(x.pos == "adj" for x in ss)),
            group_forms=group_forms,
            starts=starts,
        )


def is_content(ctx: RuleContext, tok: Token | None) -> bool:
    """A word that is neither a lexicon function word nor a determiner."""
    return tok is not None and tok.alpha and tok.low not in ctx.lexicon.function_words and tok.low not in ctx.determiners


def is_ing_verb(ctx: RuleContext, tok: Token | None) -> bool:
    """An -ing form (five letters or more) that is neither listed as no verb ("dining",
    "ceiling") nor a lexicon noun."""
    if tok is None or not tok.alpha or len(tok.low) < 5 or not tok.low.endswith("ing"):
        return False
    if tok.low in ctx.lexicon.ing_not_verbs:
        return False
    return not any(s.pos == "noun" for s in ctx.lexicon.lookup(tok.low))


def matches(ctx: RuleContext, toks: list[Token]) -> list[Match]:
    """Longest-first, non-overlapping lexicon matches, with the reading decided from context
    (:func:`reading`); a form no reading survives for is not a match."""
    lex = ctx.lexicon
    out: list[Match] = []
    i = 0
    while i < len(toks):
        found = None
        longest = ctx.starts.get(toks[i].low, 0)
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
        senses = reading(ctx, toks, i, i + n, senses)
        if senses:
            out.append(Match(i, i + n, form, senses))
        i += n
    return out


def reading(ctx: RuleContext, toks: list[Token], i: int, j: int, senses: tuple[Sense, ...]) -> tuple[Sense, ...]:
    """The senses of the form at tokens ``i:j`` that fit its context: adjective or noun by
    the next word, no noun that modifies or heads a compound, no noun after a subject
    pronoun, no verb form used as a modifier, no "on" without a fitting object."""
    lex = ctx.lexicon
    nxt = toks[j] if j < len(toks) else None
    has_adj = any(s.pos == "adj" for s in senses)
    has_noun = any(s.pos == "noun" for s in senses)
    if has_adj and has_noun:
        # "an orange cat" (colour) vs "an orange on a plate" (fruit)
        want = "adj" if is_content(ctx, nxt) and not is_ing_verb(ctx, nxt) else "noun"  # "an orange sitting on"
        senses = tuple(s for s in senses if s.pos == want or s.pos not in ("adj", "noun"))
    prev = toks[i - 1] if i > 0 else None
    kept = []
    for s in senses:
        if s.pos == "noun" and is_content(ctx, nxt) and not lex.is_noun(nxt.low) \
                and nxt.low not in lex.adjectives and not is_ing_verb(ctx, nxt):
            # noun used as a modifier of an unknown noun ("dog food", "bus stop"): leave it alone;
            # an -ing verb after it is the noun's predicate, not its head ("a man sitting")
            continue
        if s.pos == "noun" and is_content(ctx, prev) and prev.low not in ctx.attr_adjs:
            # head of a compound ("bath tub", "park bench", "dog cake"): replacing it makes nonsense
            continue
        if s.pos == "noun" and prev is not None and prev.low in SUBJECT_PRONOUNS:
            continue  # after "he" / "they" the word is a verb: "as he skateboards on the ramp"
        if s.pos == "verb" and prev is not None and (prev.low in ctx.determiners or prev.low in ctx.attr_adjs) \
                and _modifies_a_noun(ctx, toks, j):
            # a verb form between an article or adjective and a noun modifies it: "a sitting room",
            # "a red flying disc", "the walking path", "a parked silver van"; replacing it breaks it
            continue
        if s.needs_object_check and not _object_ok(ctx, toks, j):
            continue
        kept.append(s)
    return tuple(kept)


def _modifies_a_noun(ctx: RuleContext, toks: list[Token], j: int) -> bool:
    """Whether the words from ``j`` on, past attribute adjectives ("a parked [silver] van"),
    start with a noun: a lexicon noun, or a content word that is neither an -ing verb nor an
    attribute adjective."""
    head = next((t for t in toks[j:] if t.low not in ctx.attr_adjs), None)
    return head is not None and (ctx.lexicon.is_noun(head.low) or (
        is_content(ctx, head) and not is_ing_verb(ctx, head) and head.low not in ctx.attr_adjs))


def _object_ok(ctx: RuleContext, toks: list[Token], j: int) -> bool:
    """For "on"->"under": there is an object and it is not a surface/medium ("on the beach")."""
    k = j
    while k < len(toks) and (toks[k].low in ctx.determiners or toks[k].low in ctx.lexicon.adjectives):
        k += 1
    if k < len(toks) and toks[k].low in ("it", "them", "him", "her"):
        return True  # "on top of it"
    if k >= len(toks) or not is_content(ctx, toks[k]):
        return False
    if k == j and is_ing_verb(ctx, toks[k]):
        # "on" without an object, a verb right after it: "a train with lights on traveling on
        # tracks"; after an article the -ing word modifies a noun ("on a dining table")
        return False
    block = ctx.lexicon.on_blocklist
    while k < len(toks) and is_content(ctx, toks[k]):  # the whole compound: "a sport field"
        if toks[k].low in block or toks[k].low.rstrip("s") in block:
            return False
        k += 1
    return True
