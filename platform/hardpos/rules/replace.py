"""REPLACE rules: one word or phrase of a caption exchanged for another of its lexicon class.

Contract: :func:`replace_edits` yields a caption's REPLACE perturbations of one polarity
(negatives: the canonical form of another group of the same lexicon class; positives: a
synonym the lexicon's sense rules allow in this context), given its tokens and lexicon
matches (:func:`hardpos.rules.context.matches`). Every function here takes the
:class:`~hardpos.rules.context.RuleContext` first and reads nothing else; the rest are the
context checks it applies. Pure, deterministic.
"""
from __future__ import annotations

from typing import Iterable

from hardpos.rules.context import RuleContext, is_content, is_ing_verb
from hardpos.rules.lexicon import Context, Sense
from hardpos.rules.text import (
    OBJECT_PRONOUNS,
    SURFACE_PREPS,
    Match,
    Perturbation,
    Token,
    apply_edits,
    capitalised,
    case_like,
)


def replace_edits(ctx: RuleContext, caption: str, toks: list[Token], matches: list[Match],
                  polarity: str) -> Iterable[Perturbation]:
    """The REPLACE perturbations of ``caption`` ("negative" | "positive"), in match order."""
    lex = ctx.lexicon
    shouting = caption.isupper()  # "A FULL PLATE OF FOOD": capitals carry no name information
    for m in matches:
        old = caption[toks[m.i].start:toks[m.j - 1].end]
        for s in m.senses:
            if polarity == "negative":
                targets = [(t, "lexicon") for t in lex.negatives.get((m.form, s.cls), ())]
            else:
                targets = list(lex.positives.get((m.form, s.cls), ()))
            if s.pos == "noun" and m.j < len(toks) and lex.is_noun(toks[m.j].low):
                # a noun modifying another noun ("street signs", "clock tower"): its synonyms often
                # do not fit the compound ("road signs" are traffic signs), other nouns make
                # nonsense ("field signs", "laptop tower")
                targets = []
            if m.i > 0 and capitalised(toks[m.i].text) and not shouting:
                targets = []  # a name inside the caption ("the Blue Angels", "Reel Big Fish")
            if s.pos == "noun" and polarity == "negative":
                targets = [(t, src) for t, src in targets if _noun_target_fits(ctx, toks, m, t)]
            outside = " " + " ".join(t.low for k, t in enumerate(toks) if not m.i <= k < m.j) + " "
            for target, _src in targets:
                if f" {target} " in outside:
                    continue  # "a red and blue car" -> "a blue and blue car"; "a prop plane and a jet" -> "and a plane"
                if polarity == "positive" and s.pos == "noun" and _group_elsewhere(ctx, toks, m, s):
                    continue  # "a pro plane and a jet" -> "... and an aeroplane": the same thing twice
                words = target.split()
                if (m.j < len(toks) and toks[m.j].low == words[-1]) or (m.i > 0 and toks[m.i - 1].low == words[0]):
                    continue  # "laptop computer" -> "notebook computer computer"
                if not _sense_allows(ctx, toks, m, target, polarity):
                    continue  # another sense here ("flying a kite" -> "soaring"; "holding up" -> "throwing up")
                text = apply_edits(caption, [(toks[m.i].start, toks[m.j - 1].end, case_like(target, old))])
                yield Perturbation(text, "replace", f"{s.slot}:{s.cls} {m.form}->{target}")


def _sense_allows(ctx: RuleContext, toks: list[Token], m: Match, target: str, polarity: str = "positive") -> bool:
    """The lexicon's sense rules for ``m.form -> target`` (its ``positive_rules`` or
    ``negative_rules``): every "only" context holds, no "block" one does."""
    for rule in ctx.lexicon.rules_for(m.form, target, polarity):
        if _context_holds(ctx, rule.when, toks, m) != (rule.mode == "only"):
            return False
    return True


def _group_elsewhere(ctx: RuleContext, toks: list[Token], m: Match, s: Sense) -> bool:
    """Another form of the noun's own group (either number) is in the caption outside the match."""
    forms = ctx.group_forms.get((s.cls, s.group), frozenset())
    return any(t.low in forms for k, t in enumerate(toks) if not m.i <= k < m.j)


def _noun_target_fits(ctx: RuleContext, toks: list[Token], m: Match, target: str) -> bool:
    """May ``target`` replace the noun ``m`` as a hard negative?

    * it contrasts with the noun and the caption's other nouns: not a kind, part or companion
      of any ("room" -> "kitchen", "computers and camera" -> "computers and monitor"; the
      lexicon's ``not_contrasting``);
    * no "and other ..." follows the noun and no "other" comes right before it ("a bus and
      other cars" -> "a bicycle and other cars", "... and other trains");
    * no form of its group is in the caption already, in either number ("two monitors and a
      laptop" -> "two monitors and a monitor");
    * a noun used as a mass (no determiner: "eating pizza", "a plate of pizza") is replaced by
      one that can be a mass ("eating broccoli"), not by a count noun ("eating carrot").
    """
    lex = ctx.lexicon
    lows = {t.low for t in toks}
    if not all(lex.contrasts(w, target) for w in lows | {m.form}):
        return False  # related to the noun it replaces or to another one ("computers and keyboard")
    if [t.low for t in toks[m.j:m.j + 2]] in (["and", "other"], [",", "other"]) or (
            m.i > 0 and toks[m.i - 1].low in ("other", "another")):
        return False  # "a bus and other cars" -> "a bicycle and other cars": "other" says it is a car
    if any(lows & ctx.group_forms.get((x.cls, x.group), frozenset()) for x in lex.lookup(target) if x.pos == "noun"):
        return False
    k = m.i - 1
    while k >= 0 and toks[k].low in lex.adjectives and not lex.is_noun(toks[k].low):
        k -= 1
    bare = k < 0 or (toks[k].low not in ctx.determiners and not toks[k].text[:1].isdigit())
    if bare and (m.form in lex.mass or m.form in lex.mass_or_count):
        return target in lex.mass or target in lex.mass_or_count
    return True


def _context_holds(ctx: RuleContext, when: Context, toks: list[Token], m: Match) -> bool:
    """Whether every non-empty field of ``when`` matches around match ``m`` (see lexicon.Context)."""
    if when.next and not _token_in(ctx, when.next, toks, m.j):
        return False
    if when.prev and not _token_in(ctx, when.prev, toks, m.i - 1):
        return False
    if when.head:
        head = _head_noun(ctx, toks, m.j)
        if head is None or toks[head].low not in when.head:
            return False
    if when.governor and _governor(ctx, toks, m.i) not in when.governor:
        return False
    if when.subject:
        k = m.i - 1
        while k >= 0 and toks[k].low not in when.subject and not _nounish(ctx, toks[k]):
            k -= 1
        if k < 0 or toks[k].low not in when.subject:
            return False
    if when.before and not any(t.low in when.before for t in toks[:m.i]):
        return False
    if when.caption and not any(t.low in when.caption for t in toks):
        return False
    if when.phrase:
        lows = [t.low for t in toks]
        inside = any(lows[a:a + len(ph)] == list(ph)
                     for ph in when.phrase for a in range(max(0, m.j - len(ph)), m.i + 1))
        if not inside:
            return False
    return True


def _governor(ctx: RuleContext, toks: list[Token], i: int) -> str | None:
    """The word opening the noun phrase that ends at token ``i``: back over determiners,
    numbers and modifiers (words that are neither lexicon nouns nor function words), at most
    four; None at the caption's start or punctuation."""
    lex = ctx.lexicon

    def in_phrase(tok: Token) -> bool:
        if tok.text[:1].isdigit() or tok.low in ctx.determiners or tok.low in lex.adjectives:
            return True
        return tok.alpha and not (lex.is_noun(tok.low) or tok.low in lex.function_words)

    k = i - 1
    while k >= 0 and i - k <= 4 and in_phrase(toks[k]):
        k -= 1
    return toks[k].low if k >= 0 and toks[k].alpha else None


def _token_in(ctx: RuleContext, wanted: frozenset[str], toks: list[Token], k: int) -> bool:
    """Token ``k`` is one of the ``wanted`` words or token classes (see lexicon.Context)."""
    lex = ctx.lexicon
    tok = toks[k] if 0 <= k < len(toks) else None
    if tok is None or not (tok.alpha or tok.text[:1].isdigit()):
        return "<end>" in wanted or (tok is not None and tok.text in wanted)
    if tok.low in wanted:
        return True
    if "<det>" in wanted and tok.low in ctx.determiners:
        return True
    if "<adj>" in wanted and tok.low in lex.adjectives and not lex.is_noun(tok.low):
        return True  # "kitchen" in "a bright kitchen" is the noun, not a second adjective
    if "<noun>" in wanted and _nounish(ctx, tok):
        return True
    if "<known-noun>" in wanted and lex.is_noun(tok.low):
        return True
    if "<np>" in wanted:
        if tok.low in ctx.determiners or tok.text[:1].isdigit() or tok.low in OBJECT_PRONOUNS:
            return True
        while k < len(toks) and toks[k].low in lex.adjectives and not lex.is_noun(toks[k].low):
            k += 1  # "flying colorful kites"
        return k < len(toks) and _nounish(ctx, toks[k])
    return False


def _nounish(ctx: RuleContext, tok: Token) -> bool:
    """A lexicon noun, or an unknown content word that is not an -ing form, adjective or adverb."""
    lex = ctx.lexicon
    if lex.is_noun(tok.low):
        return True
    return (is_content(ctx, tok) and not is_ing_verb(ctx, tok) and tok.low not in lex.adverbs
            and tok.low not in lex.adjectives)


def _head_noun(ctx: RuleContext, toks: list[Token], j: int) -> int | None:
    """The first noun from ``j`` on, past determiners, numbers and adjectives ("a bright yellow bus" -> bus),
    and past a leading "on"-like preposition ("sitting on the side" -> side)."""
    lex = ctx.lexicon
    k = j + 1 if j < len(toks) and toks[j].low in SURFACE_PREPS else j
    while k < len(toks):
        t = toks[k]
        if t.low in ctx.determiners or t.text[:1].isdigit() or (
                t.low in lex.adjectives and not lex.is_noun(t.low)
                and k + 1 < len(toks) and is_content(ctx, toks[k + 1])):
            k += 1  # an adjective before another content word; "the side of" keeps "side" as the head
        elif t.low in ("and", ",") and k + 1 < len(toks) and toks[k + 1].low in lex.adjectives:
            k += 1  # "a black and white cat"
        else:
            break
    return k if k < len(toks) and is_content(ctx, toks[k]) else None
