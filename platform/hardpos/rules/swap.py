"""SWAP rules: two attributes, nouns or conjuncts of a caption exchanged.

Contract: :func:`swap_attributes` and :func:`swap_objects` yield SWAP hard negatives
(attributes or nouns exchanged between two nouns); :func:`swap_conjuncts` yields SWAP hard
positives (conjuncts around "and" exchanged with their modifiers), each accepted by
:func:`hardpos.rules.conjuncts.is_conjunct_swap`, with the whole-clause split
(:func:`clause_candidates`) as the fallback. Every rule takes the
:class:`~hardpos.rules.context.RuleContext` first, then the caption, its tokens and (the
negatives) its lexicon matches (:func:`hardpos.rules.context.matches`). Pure, deterministic.
"""
from __future__ import annotations

from typing import Iterable

from hardpos.rules.conjuncts import is_conjunct_swap
from hardpos.rules.context import RuleContext, is_content, is_ing_verb
from hardpos.rules.text import BOUNDARY_PUNCT, COORD, VISUAL, Match, Perturbation, Token, swap_spans


# ---------------------------------------------------------------------- SWAP negatives
def swap_attributes(ctx: RuleContext, caption: str, toks: list[Token], matches: list[Match]) -> Iterable[Perturbation]:
    """Two attribute adjectives of different nouns exchanged: of one class (not synonyms), or
    of two visual classes when each is its noun's only adjective."""
    adjs = []
    for m in matches:
        for s in m.senses:
            if s.pos == "adj" and s.slot == "attribute":
                head = _head_after(ctx, toks, m.j)
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
            elif not (sa.cls in VISUAL and sb.cls in VISUAL and _sole_adjective(ctx, toks, ma, ha)
                      and _sole_adjective(ctx, toks, mb, hb)):
                # "a large red circle": swapping size with another NP's colour gives "a blue red circle";
                # state words fit only their nouns ("a young girl on a wooden floor" -> "a wooden girl")
                continue
            ta = caption[toks[ma.i].start:toks[ma.j - 1].end]
            tb = caption[toks[mb.i].start:toks[mb.j - 1].end]
            text = swap_spans(caption, (toks[ma.i].start, toks[ma.j - 1].end), (toks[mb.i].start, toks[mb.j - 1].end), ta, tb)
            yield Perturbation(text, "swap", f"attributes:{sa.cls if sa.cls == sb.cls else sa.cls + '/' + sb.cls} {ma.form}<->{mb.form}")


def _head_after(ctx: RuleContext, toks: list[Token], j: int) -> int | None:
    """Index of the noun an adjective ending at ``j`` modifies (skipping further adjectives)."""
    lex = ctx.lexicon
    k = j
    while k < len(toks) and toks[k].low in lex.adjectives and not lex.is_noun(toks[k].low):
        k += 1
    if k < len(toks) and is_content(ctx, toks[k]) and not is_ing_verb(ctx, toks[k]):
        return k
    return None


def _sole_adjective(ctx: RuleContext, toks: list[Token], m: Match, head: int) -> bool:
    """The adjective sits right before its noun and no other adjective modifies that noun."""
    before = toks[m.i - 1] if m.i > 0 else None
    return head == m.j and not (before is not None and (before.low in ctx.lexicon.adjectives
                                                        or before.low in COORD))


def _coordinated(ctx: RuleContext, toks: list[Token], i: int, j: int) -> bool:
    """True when tokens strictly between i and j only join conjuncts ("a dog and a cat")."""
    between = toks[i + 1:j]
    if not any(t.low in COORD for t in between):
        return False
    return not any(t.low in ctx.linkers or is_ing_verb(ctx, t) for t in between)


def swap_objects(ctx: RuleContext, caption: str, toks: list[Token], matches: list[Match]) -> Iterable[Perturbation]:
    """Two nouns of one kind and number exchanged (not synonyms, not part and whole, not
    conjuncts of one "and"), each standing alone: no compound, container or participle."""
    lex = ctx.lexicon
    nouns = []
    for m in matches:
        before = toks[m.i - 1] if m.i > 0 else None
        after = toks[m.j] if m.j < len(toks) else None
        if is_content(ctx, after) or (before is not None and is_content(ctx, before)
                                      and before.low not in ctx.attr_adjs):
            continue  # part of a compound ("street sign", "luggage bag", "serving dish", "teddy bear")
        if (after is not None and after.low == "of") or (m.i >= 2 and toks[m.i - 2].low == "of"
                                                             and toks[m.i - 1].low in ctx.determiners) \
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
            if not lex.contrasts(ma.form, mb.form) or not lex.contrasts(mb.form, ma.form):
                continue  # a part or companion: "in the sand on the beach" -> "in the beach on the sand"
            if mb.i - ma.j < 1 or _coordinated(ctx, toks, ma.j - 1, mb.i):
                continue
            ta = caption[toks[ma.i].start:toks[ma.j - 1].end]
            tb = caption[toks[mb.i].start:toks[mb.j - 1].end]
            text = swap_spans(caption, (toks[ma.i].start, toks[ma.j - 1].end), (toks[mb.i].start, toks[mb.j - 1].end), ta, tb)
            yield Perturbation(text, "swap", f"objects:{sa.kind} {ma.form}<->{mb.form}")


# ---------------------------------------------------------------------- SWAP positives
def swap_conjuncts(ctx: RuleContext, caption: str, toks: list[Token]) -> Iterable[Perturbation]:
    """Conjunct-swap hard positives: for each "and", the first candidate of :func:`conjunct_candidates`
    (then of :func:`clause_candidates`) that :func:`~hardpos.rules.conjuncts.is_conjunct_swap` accepts.

    The candidates come from local heuristics that cannot see a whole coordination; the validator's
    check is the contract, so a swap of parts ("a man with a hat and a woman" -> "a man with a woman
    and a hat", "a white hat and uniform" -> "uniform and a white hat") never leaves the engine.
    """
    done: set[int] = set()
    for k, p in [*conjunct_candidates(ctx, caption, toks), *clause_candidates(caption, toks)]:
        if k not in done and is_conjunct_swap(caption, p.text):
            done.add(k)
            yield p


def _modifier(ctx: RuleContext, tok: Token) -> bool:
    lex = ctx.lexicon
    return tok.alpha and (tok.low in lex.adjectives or lex.is_noun(tok.low)) and tok.low not in lex.function_words


def _boundary(ctx: RuleContext, tok: Token | None) -> bool:
    """A token that may end a conjunct: end of caption, punctuation, a linker/"and", an -ing verb."""
    if tok is None:
        return True
    if not tok.alpha:
        return tok.text in BOUNDARY_PUNCT
    return tok.low in ctx.lexicon.function_words or is_ing_verb(ctx, tok)


def _left_np(ctx: RuleContext, toks: list[Token], k: int) -> tuple[int, int] | None:
    lex = ctx.lexicon
    j = k - 1
    if j < 0 or not is_content(ctx, toks[j]) or is_ing_verb(ctx, toks[j]):
        return None
    if toks[j].low in lex.adjectives and not lex.is_noun(toks[j].low):
        return None  # "grassy and rocky hill": adjectives, not noun phrases
    i = j
    while i - 1 >= 0 and _modifier(ctx, toks[i - 1]) and not is_ing_verb(ctx, toks[i - 1]) and j - (i - 1) < 4:
        i -= 1
    if i - 1 >= 0 and toks[i - 1].low in ctx.determiners:
        i -= 1
        if i - 1 >= 0 and toks[i - 1].low in ctx.determiners:  # "the two"
            i -= 1
    before = toks[i - 1] if i - 1 >= 0 else None
    if before is not None and not _boundary(ctx, before):
        return None  # an unknown word (a verb? an adjective?) precedes: structure unclear
    if before is not None and before.low in ("and", "or", "of"):
        # "gray and black raccoon and ...": nested coordination; "a couple of goats and a goose",
        # "a body of water and mountains": the quantity/container noun does not move. Leave both.
        return None
    return i, k


def _right_np(ctx: RuleContext, toks: list[Token], k: int) -> tuple[int, int] | None:
    lex = ctx.lexicon
    i = k + 1
    j = i
    if j < len(toks) and toks[j].low in ctx.determiners:
        j += 1
        if j < len(toks) and toks[j].low in ctx.determiners:
            j += 1
    start_content = j
    while j < len(toks) and _modifier(ctx, toks[j]) and not is_ing_verb(ctx, toks[j]):
        j += 1
    if j < len(toks) and is_content(ctx, toks[j]) and not is_ing_verb(ctx, toks[j]) and not _modifier(ctx, toks[j]):
        if j > start_content and lex.is_noun(toks[j - 1].low):
            return None  # "sink side by side", "doughnuts available": the known noun was the head
        j += 1  # an unknown head noun ("utensils")
    if j == start_content or j - start_content > 4:
        return None
    after = toks[j] if j < len(toks) else None
    if not _boundary(ctx, after) or (after is not None and after.low == "of"):
        return None
    last = toks[j - 1]
    if not is_content(ctx, last) or (last.low in lex.adjectives and not lex.is_noun(last.low)):
        return None  # "sink side by side": the conjunct must end in a noun
    return i, j


def conjunct_candidates(ctx: RuleContext, caption: str, toks: list[Token]) -> Iterable[tuple[int, Perturbation]]:
    """(index of the "and", candidate swap) pairs, the preferred candidate for one "and" first:
    adjectives ("a black and white cat"), verb phrases ("wearing glasses and holding a bottle"),
    noun phrases ("a sink, toilet and shower")."""
    lex = ctx.lexicon
    for k, tok in enumerate(toks):
        if tok.low != "and" or k == 0 or k == len(toks) - 1:
            continue
        prev, nxt = toks[k - 1], toks[k + 1]
        # adjectives: "a black and white cat"
        adj_prev, adj_next = prev.low in lex.adjectives, nxt.low in lex.adjectives
        pure = not lex.is_noun(prev.low) and not lex.is_noun(nxt.low)
        if adj_prev and adj_next and prev.low != nxt.low:
            after = toks[k + 2] if k + 2 < len(toks) else None
            if is_content(ctx, after) and (pure or not lex.is_noun(nxt.low)):
                # "an orange and white fish": colour words before a noun, even when one is also a noun
                yield k, Perturbation(swap_spans(caption, (prev.start, prev.end), (nxt.start, nxt.end), prev.text,
                                                 nxt.text), "swap", "conjuncts:adjectives")
                continue
            if pure:
                continue  # predicate adjectives ("is black and white."): nothing to swap as noun phrases
        # verb phrases: "wearing glasses and holding a bottle"
        if is_ing_verb(ctx, nxt):
            p = k - 1
            while p >= 0 and not is_ing_verb(ctx, toks[p]) and toks[p].low not in ("and", ";", ".") \
                    and not (toks[p].text == "," and p != k - 1):
                p -= 1
            if p < 0 or not is_ing_verb(ctx, toks[p]):
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
            yield k, Perturbation(swap_spans(caption, a, b, caption[a[0]:a[1]], caption[b[0]:b[1]]), "swap",
                                  "conjuncts:verb_phrases")
            continue
        # noun phrases: "a sink, toilet and shower", "a red circle and a blue square"
        left = _left_np(ctx, toks, k)
        right = _right_np(ctx, toks, k)
        if left is None or right is None:
            continue
        before = toks[left[0] - 1] if left[0] > 0 else None
        after = toks[right[1]] if right[1] < len(toks) else None
        if is_ing_verb(ctx, after) and before is not None and before.alpha:
            continue  # "side of a road and a car travelling ...": the verb may belong to the right conjunct only
        a = (toks[left[0]].start, toks[left[1] - 1].end)
        b = (toks[right[0]].start, toks[right[1] - 1].end)
        ta, tb = caption[a[0]:a[1]], caption[b[0]:b[1]]
        if ta.lower() == tb.lower() or toks[left[1] - 1].low == toks[right[1] - 1].low:
            continue
        if toks[left[0]].low in ("a", "an", "the") and left[1] - left[0] > 1 \
                and toks[right[0]].low not in ctx.determiners:
            # "a keyboard and monitor": the article is shared, so it stays ("a monitor and keyboard")
            a_head = (toks[left[0] + 1].start, a[1])
            yield k, Perturbation(swap_spans(caption, a_head, b, caption[a_head[0]:a_head[1]], tb), "swap",
                                  "conjuncts:noun_phrases")
        yield k, Perturbation(swap_spans(caption, a, b, ta, tb), "swap", "conjuncts:noun_phrases")


def clause_candidates(caption: str, toks: list[Token]) -> Iterable[tuple[int, Perturbation]]:
    """Whole-clause conjuncts: everything from the clause's start to "and", and from "and" to the
    clause's end ("A man with a hat and a woman with a dog" -> "A woman with a dog and a man with a
    hat").  A fallback behind the phrase rules; the validator decides whether the split is sound."""
    ends = [i for i, t in enumerate(toks) if t.text in BOUNDARY_PUNCT]
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
            yield k, Perturbation(swap_spans(caption, a, b, ta, tb), "swap", slot)
