"""The properties every rule output must have, measured over a caption set (tests/test_rules_perturber_properties.py).

:func:`tally` runs the rule engine on every caption and checks each candidate it offers, and
the stage's picks, against what the validator and the lexicon define; it counts what holds and
keeps the outputs that break a property (so a failing test names them). The checks read the
lexicon's data (its groups, contrasts, ``positive_excluded``, colour shades), not the rules'
code, so a rule change that keeps them passes whatever rows it now picks.

:data:`FIXTURE_CAPTIONS`: the repository's own COCO-style captions (original sentences, one a
line, written for these tests), so the properties run without the reference data.
"""
from __future__ import annotations

import functools
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from hardpos.rules.context import RuleContext, matches
from hardpos.rules.english import grammar_hits, non_english, problems
from hardpos.rules.lexicon import LEXICON_FILE, Lexicon, benchmark_substitution, load_lexicon, plural
from hardpos.rules.perturber import RulePerturber, pick_balanced
from hardpos.rules.text import tokenize
from hardpos.rules.validate import validate

FIXTURE_CAPTIONS = Path(__file__).resolve().parent / "captions_coco_style.txt"
POLARITIES = ("negative", "positive")
KINDS = ("replace", "swap")
_REPLACE_SLOT = re.compile(r"(attribute|relation|object):(\w+) (.+)->(.+)")
_SWAP_SLOT = re.compile(r"(attributes|objects):(\S+) (.+)<->(.+)")
_WORD = re.compile(r"[a-z]+(?:['\-][a-z]+)*|\d+")


def fixture_captions() -> list[str]:
    """The fixture's captions, one a line, in file order (blank lines skipped)."""
    return [line for line in FIXTURE_CAPTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]


def words(text: str) -> list[str]:
    """Lower-case words and numbers, "an" read as "a" (an edit may fix the article)."""
    return ["a" if w == "an" else w for w in _WORD.findall(text.lower())]


def replaced_once(original: str, edited: str, old: str, new: str) -> bool:
    """``edited`` is ``original`` with one occurrence of the phrase ``old`` replaced by ``new``
    and nothing else changed (articles and case aside)."""
    o, e, a, b = words(original), words(edited), words(old), words(new)
    return any(o[i:i + len(a)] == a and o[:i] + b + o[i + len(a):] == e for i in range(len(o)))


def swapped_once(original: str, edited: str, a: str, b: str) -> bool:
    """``edited`` is ``original`` with one occurrence of ``a`` and one of ``b`` exchanged and
    nothing else changed (articles and case aside)."""
    o, e, wa, wb = words(original), words(edited), words(a), words(b)
    at = [i for i in range(len(o)) if o[i:i + len(wa)] == wa]
    bt = [j for j in range(len(o)) if o[j:j + len(wb)] == wb]
    for i in at:
        for j in bt:
            (p, lp, tp), (q, lq, tq) = sorted([(i, len(wa), wb), (j, len(wb), wa)])
            if p + lp <= q and o[:p] + tp + o[p + lp:q] + tq + o[q + lq:] == e:
                return True
    return False


@dataclass(frozen=True)
class LexiconFacts:
    """What the shipped lexicon says an edit may be, whatever engine made it: its parsed form
    (groups, contrasts, ``not_contrasting``) and, read from the JSON itself, the pairs it
    excludes as positives and its colour shades."""

    lexicon: Lexicon                  # the shipped lexicon (default: the benchmark's pairs held out)
    ctx: RuleContext                  # its group forms
    singular: dict[str, str]          # every noun form (plural too) -> its singular form
    excluded: frozenset[str]          # "form->synonym" pairs never a hard positive
    shade_pairs: frozenset[str]       # basic colour -> shade, shade -> shade
    classes: frozenset[str]

    @classmethod
    def load(cls) -> LexiconFacts:
        data = json.loads(LEXICON_FILE.read_text())
        singular: dict[str, str] = {}
        for spec in data["classes"].values():
            for group in spec["groups"]:
                for form in group:
                    singular[form.lower()] = form.lower()
                    if spec["pos"] == "noun":
                        singular.setdefault(plural(form.lower(), data["plurals"]), form.lower())
        shades = data["colour_shades"]["shades"]
        pairs = {f"{basic}->{s}" for basic, ss in shades.items() for s in ss}
        pairs |= {f"{a}->{b}" for ss in shades.values() for a in ss for b in ss if a != b}
        lexicon = load_lexicon()
        return cls(lexicon, RuleContext.of(lexicon), singular, frozenset(data["positive_excluded"]), frozenset(pairs),
                   frozenset(data["classes"]))

    def pair(self, form: str, target: str) -> str:
        return f"{self.singular.get(form, form)}->{self.singular.get(target, target)}"


@dataclass
class Tally:
    """Counts of a caption set's rule outputs and of the properties they break.

    captions: unique captions; outputs[(polarity, kind)]: candidates offered;
    covered[(polarity, kind)]: captions with at least one such candidate (kind "any": of either kind);
    picked[polarity]: captions the stage's balanced picks give one (``picked["both"]``: both);
    broken[name]: outputs breaking the named property, with ``examples[name]`` (the first ones);
    classes: lexicon classes some caption's words match.
    """

    captions: int = 0
    outputs: Counter = field(default_factory=Counter)
    covered: Counter = field(default_factory=Counter)
    picked: Counter = field(default_factory=Counter)
    broken: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=lambda: defaultdict(list))
    classes: set = field(default_factory=set)

    def breaks(self, name: str, *example) -> None:
        self.broken[name] += 1
        if len(self.examples[name]) < 5:
            self.examples[name].append(example)

    def share(self, polarity: str, kind: str) -> float:
        return self.covered[(polarity, kind)] / self.captions

    @property
    def total_outputs(self) -> int:
        return sum(self.outputs.values())


def tally(captions: list[str], rules: RulePerturber, facts: LexiconFacts | None = None) -> Tally:
    """Every candidate ``rules`` offer for every caption, checked against ``facts`` (default: the
    shipped lexicon's; see the test module for what each property means), and the stage's
    balanced picks (seed 0) counted."""
    facts = facts or LexiconFacts.load()
    lex, ctx = facts.lexicon, facts.ctx
    t = Tally(captions=len(captions))
    made = []
    for cap in captions:
        t.classes |= {s.cls for m in matches(rules.ctx, tokenize(cap)) for s in m.senses}
        negs, poss = rules.candidates(cap)
        made.append((negs, poss))
        for polarity, options in zip(POLARITIES, (negs, poss)):
            t.covered[(polarity, "any")] += bool(options)
            for kind in KINDS:
                if any(p.kind == kind for p in options):
                    t.covered[(polarity, kind)] += 1
            for p in options:
                t.outputs[(polarity, p.kind)] += 1
                _check(t, lex, ctx, facts, cap, polarity, p)
    picks, _ = pick_balanced(captions, made, 0, rules.seed)
    for r in picks:
        t.picked["negative"] += r["neg"] is not None
        t.picked["positive"] += r["pos"] is not None
        t.picked["both"] += r["neg"] is not None and r["pos"] is not None
    return t


@functools.lru_cache(maxsize=4096)
def _own_problems(caption: str) -> Counter:
    return Counter(problems(caption))


def _check(t: Tally, lex, ctx, facts: LexiconFacts, cap: str, polarity: str, p) -> None:
    if Counter(problems(p.text)) - _own_problems(cap):  # english.new_problems, the caption's side once
        t.breaks("agreement", cap, p.text)
    slips = grammar_hits(cap, p.text)
    if slips:
        t.breaks("grammar", cap, p.text, slips)
    if non_english(cap, p.text):
        t.breaks("non_english", cap, p.text)
    verdict = validate(cap, p.text, p.kind + ("_negative" if polarity == "negative" else ""))
    if not verdict.accepted:
        t.breaks(f"validator:{polarity}", cap, p.text, verdict.reason)
    if p.kind == "replace":
        m = _REPLACE_SLOT.fullmatch(p.slot)
        if m is None:
            t.breaks("slot_named", p.slot)
            return
        slot, cls, form, target = m.groups()
        senses = [s for s in lex.lookup(form) if s.cls == cls and s.slot == slot]
        if not senses:
            t.breaks("slot_named", cap, p.slot)
            return
        if not replaced_once(cap, p.text, form, target):
            t.breaks("one_edit_in_slot", cap, p.text, p.slot)
        own_group = any(target in ctx.group_forms.get((cls, s.group), ()) for s in senses)
        if polarity == "negative":
            if own_group or target not in lex.negatives.get((form, cls), ()):
                t.breaks("negative_contrasts", cap, p.text, p.slot)  # another group's word, of its class
            if not lex.contrasts(form, target):
                t.breaks("negative_not_related", cap, p.text, p.slot)
        else:
            if not own_group:
                t.breaks("positive_own_group", cap, p.text, p.slot)
            if facts.pair(form, target) in facts.excluded:
                t.breaks("positive_not_excluded", cap, p.text, p.slot)
            if facts.pair(form, target) in facts.shade_pairs:
                t.breaks("positive_no_shade", cap, p.text, p.slot)
            if benchmark_substitution(cap, p.text) is not None:
                t.breaks("positive_no_benchmark_pair", cap, p.text)
    elif polarity == "negative":
        m = _SWAP_SLOT.fullmatch(p.slot)
        if m is None:
            t.breaks("slot_named", cap, p.slot)
            return
        _, _, a, b = m.groups()
        if not swapped_once(cap, p.text, a, b):
            t.breaks("one_swap_in_slot", cap, p.text, p.slot)
        if a == b or not (lex.contrasts(a, b) and lex.contrasts(b, a)):
            t.breaks("negative_not_related", cap, p.text, p.slot)
    elif not p.slot.startswith("conjuncts:"):
        t.breaks("slot_named", cap, p.slot)
