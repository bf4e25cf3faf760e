"""Curated word classes and synonym tables for the rule engine.

The data lives in ``resources/lexicons/lexicon.json`` (hand-curated, with provenance)
and ``resources/lexicons/paper_replace_table.json`` (the paper's own REPLACE table,
recovered from its release by :mod:`hardpos.rules.paper_table`).

Model (see the JSON's ``provenance.format``): a *class* (colour, size, spatial_vertical,
animal, ...) has a slot (attribute | relation | object), a part of speech (adj | verb |
prep | noun) and *groups* of surface forms that mean the same thing.

* REPLACE hard negative of a form: the canonical form of another group of its class
  (only the groups named in ``contrast`` when the class has one: "man" -> "woman", not
  "man" -> "baby").
* REPLACE hard positive of a form: another form of its own group, minus the pairs in
  ``positive_excluded`` (each with its reason: a change of intensity, "large"->"huge"; a
  narrower category, "dog"->"puppy"; another sense), and minus every pair of the REPLACE
  benchmark's own substitution table (:func:`benchmark_pairs`: "white"->"ivory",
  "holding"->"grasping", ...), which 16 curated groups share with it. Training on those
  would teach the test's invariances: a model finetuned on them reports contaminated REPLACE
  numbers. ``include_benchmark_pairs=True`` adds the whole table instead (an explicit
  opt-in that the stages record in the run and the reports flag as "seen substitutions").
  An exclusion is one-way: "dog"->"puppy" is out, "puppy"->"dog" (broader, still true) stays.
* Nouns get their plural forms (regular, or from ``plurals``) as a parallel class; an
  exclusion of singular forms also excludes their plurals.
* Colour shades (``colour_shades``): basic colour -> shade ("blue" -> "azure") and shade ->
  another shade are never curated hard positives of the full lexicon (a shade is narrower);
  shade -> basic and spelling variants are. A restricted (synthetic world) lexicon keeps them:
  there a shade is defined as the colour. ``include_benchmark_pairs=True`` adds the REPLACE
  benchmark's table as the paper wrote it, its shades included ("red" -> "crimson"), flagged.
* Number (``number``): plural-only nouns ("skis", "glasses", "scissors") have no singular
  sense, so "a skateboard" never becomes "a skis"; mass nouns ("bread", "broccoli") have no
  plural sense ("a type of meat" never becomes "a type of soups"). :mod:`hardpos.rules.english`
  reads the same lists to check every candidate's determiners, and the blind audit's grammar
  rules through it: they are the one list of such nouns.
* ``not_contrasting``: a word -> words that may be its kind, its part or worn with it
  (room/kitchen, computer/monitor, shirt/tie): never a hard negative of each other, either way.
* ``negative_rules``: sense constraints on hard negatives, in the format of ``positive_rules``
  (``"only"`` keeps a contrast only in that context, ``"block"`` drops it there: posture
  contrasts only for people and animals, a verb's particle stays with it: "holding up" is never
  "throwing up").
* ``positive_rules``: the curated block list of sense constraints. Each rule names forms
  (and optionally the synonyms it governs) and a context; ``"only"`` keeps the synonym
  only in that context, ``"block"`` drops it there ("flying" -> "soaring" is blocked when
  an object follows: "flying a kite"). See :class:`Context` for what a context can test.

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


#: token classes a context may name in ``next`` / ``prev`` (besides plain words)
TOKEN_CLASSES = ("<end>", "<det>", "<np>", "<noun>", "<known-noun>", "<adj>")
_CONTEXT_KEYS = ("next", "prev", "head", "governor", "subject", "before", "caption", "phrase")


@dataclass(frozen=True)
class Context:
    """Where a sense rule applies; it holds when EVERY non-empty field matches.

    next / prev: the token right after / before the matched form is one of these words or
        token classes: ``<end>`` (none, or punctuation), ``<det>`` (a determiner or
        possessive), ``<np>`` (a noun phrase starts: determiner, number, object pronoun,
        or adjectives then a noun), ``<noun>`` (a lexicon noun, or an unknown content word
        that is not an -ing form or a listed adverb), ``<known-noun>`` (a lexicon noun only:
        before a word, an unknown word is as likely a verb), ``<adj>`` (a known adjective that is not also a noun).
    head: the first noun after the form, skipping determiners, numbers and adjectives, and
        a first "on" / "atop" / "upon" / "onto" (the noun an adjective modifies, a verb's or
        preposition's object: "sitting on the side of" -> side) is one of these.
    governor: the word that opens the form's noun phrase, found by stepping back over
        determiners, numbers and modifiers (at most four words), is one of these ("standing
        on a lush green field" -> on; "in the field" -> in).
    subject: the nearest noun before the form (a ``<noun>`` token, or a word of this list)
        is in this list ("a man sitting" -> man; "pieces of luggage sitting" -> luggage).
    before: one of these words occurs anywhere before the form (a likely subject, more
        forgiving than ``subject``: "a man in a red shirt holding").
    caption: one of these words occurs anywhere in the caption (the topic: "baseball").
    phrase: the form lies inside one of these multi-word phrases ("black and white").
    Word lists are lower case; nouns include their plurals; ``@name`` in the JSON expands
    to a lexicon class's forms or to a list in ``word_lists``.
    """

    next: frozenset[str] = frozenset()
    prev: frozenset[str] = frozenset()
    head: frozenset[str] = frozenset()
    governor: frozenset[str] = frozenset()
    subject: frozenset[str] = frozenset()
    before: frozenset[str] = frozenset()
    caption: frozenset[str] = frozenset()
    phrase: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class SenseRule:
    """One block-list entry: where a form's synonyms must (``only``) or must not (``block``) be used.

    targets: the synonyms the rule governs; None = all of the form's synonyms.
    """

    id: str
    forms: frozenset[str]
    targets: frozenset[str] | None
    mode: str  # "only" | "block"
    when: Context
    why: str


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
    rules: dict[str, tuple[SenseRule, ...]] = field(default_factory=dict)  # form -> its sense rules
    adverbs: frozenset[str] = field(default_factory=frozenset)  # content words that are never nouns
    negative_rules: dict[str, tuple[SenseRule, ...]] = field(default_factory=dict)  # form -> its negative rules
    plural_only: frozenset[str] = field(default_factory=frozenset)  # "skis", "glasses", "scissors"
    mass: frozenset[str] = field(default_factory=frozenset)  # never after "a": "bread", "broccoli"
    mass_or_count: frozenset[str] = field(default_factory=frozenset)  # "pizza", "cake": bare or counted
    related: dict[str, frozenset[str]] = field(default_factory=dict)  # form -> words it never contrasts with

    def rules_for(self, form: str, target: str, polarity: str = "positive") -> tuple[SenseRule, ...]:
        """The sense rules that govern rewriting ``form`` as ``target`` (a hard positive, or with
        ``polarity="negative"`` a hard negative)."""
        rules = self.rules if polarity == "positive" else self.negative_rules
        return tuple(r for r in rules.get(form, ()) if r.targets is None or target in r.targets)

    def contrasts(self, form: str, target: str) -> bool:
        """False when ``target`` may be true together with ``form`` (``not_contrasting``)."""
        return target not in self.related.get(form, frozenset())

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


@functools.lru_cache(maxsize=1)
def benchmark_pairs() -> frozenset[tuple[str, str]]:
    """Every (original, replacement) pair of the REPLACE benchmark's hard-positive table
    (attributes and relations; ``resources/lexicons/paper_replace_table.json``)."""
    table = _read(PAPER_TABLE_FILE)
    return frozenset((row["from"], row["to"]) for subset in ("attributes", "relations") for row in table[subset])


#: The run tag that marks data made with the REPLACE benchmark's own substitutions (and,
#: through the train stage, models trained on it): their REPLACE numbers are contaminated.
SEEN_SUBSTITUTIONS_TAG = "hardpos.seen_substitutions"


def seen_substitutions_tag(include_benchmark_pairs: bool) -> dict[str, str]:
    """``{SEEN_SUBSTITUTIONS_TAG: "replace"}`` when the benchmark's pairs were included, else ``{}``."""
    return {SEEN_SUBSTITUTIONS_TAG: "replace"} if include_benchmark_pairs else {}


def _tokens(text: str) -> list[str]:
    # "an" -> "a": a substitution also fixes the article ("a white dog" -> "an ivory dog")
    return ["a" if w == "an" else w for w in (t.strip(".,;:!?\"'") for t in text.lower().split())]


def _edit(a: list[str], b: list[str]) -> list[tuple[str, str]]:
    """The replaced phrase of ``a`` -> ``b`` (common leading and trailing words stripped) and,
    for an insertion/deletion, the same widened by the word before it (as the benchmark's
    table was derived: "on top of" -> "on")."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1
    src, dst = a[start:len(a) - end], b[start:len(b) - end]
    out = [(" ".join(src), " ".join(dst))] if src and dst else []
    if start and (not src or not dst):
        out.append((" ".join([a[start - 1], *src]), " ".join([b[start - 1], *dst])))
    return out


def benchmark_substitution(caption: str, positive: str) -> tuple[str, str] | None:
    """The (original, replacement) pair when ``positive`` is ``caption`` with one contiguous
    phrase replaced by a pair of the REPLACE benchmark's table (case-insensitive, punctuation
    aside), else None. Engine-agnostic: it reads the text, so it catches an LLM that writes
    the benchmark's own substitutions as well as a rule."""
    pairs = benchmark_pairs()
    return next((e for e in _edit(_tokens(caption), _tokens(positive)) if e in pairs), None)


@functools.lru_cache(maxsize=8)
def _cached(include_benchmark_pairs: bool, restrict_to: frozenset[str] | None) -> Lexicon:
    return _build(_read(LEXICON_FILE), include_benchmark_pairs, restrict_to)


def load_lexicon(*, include_benchmark_pairs: bool = False, restrict_to: set[str] | frozenset[str] | None = None,
                 data: dict | None = None) -> Lexicon:
    """The lexicon; cached when built from the shipped files.

    include_benchmark_pairs: False (default): no hard positive is a pair of the REPLACE
        benchmark's substitution table (:func:`benchmark_pairs`), curated or not. True: the
        whole table is added as hard-positive synonyms (minus ``positive_excluded``).
    restrict_to: keep only these surface forms (negatives, positives and senses alike).
    data: a lexicon mapping in the JSON's format instead of the shipped file (tests, users).
    """
    restrict = frozenset(restrict_to) if restrict_to is not None else None
    if data is None:
        return _cached(include_benchmark_pairs, restrict)
    return _build(data, include_benchmark_pairs, restrict)


def _build(data: dict, include_benchmark_pairs: bool, restrict: frozenset[str] | None) -> Lexicon:
    paper = _read(PAPER_TABLE_FILE)
    held_out = frozenset() if include_benchmark_pairs else benchmark_pairs()
    classes = data.get("classes")
    if not isinstance(classes, dict) or not classes:
        raise ValueError("lexicon has no 'classes' mapping")
    irregular = data.get("plurals", {})
    senses: dict[str, list[Sense]] = {}
    negatives: dict[tuple[str, str], list[str]] = {}
    positives: dict[tuple[str, str], list[tuple[str, str]]] = {}
    adjectives: set[str] = set(data.get("adjectives", []))
    keep = (lambda form: True) if restrict is None else (lambda form: form in restrict)
    excluded = data.get("positive_excluded", {})
    if not isinstance(excluded, dict) or any("->" not in k for k in excluded):
        raise ValueError("lexicon 'positive_excluded' must map 'form->synonym' to the reason")
    # the colour policy holds for the curated groups of the full lexicon; the REPLACE benchmark's
    # own table, added only on request (and then flagged), keeps its shades as the paper wrote it
    shades = data.get("colour_shades", {})
    shade_excluded: frozenset[str] = frozenset()
    if restrict is None:  # a world's lexicon defines each shade as its colour; real captions do not
        names = shades.get("shades", {})
        shade_excluded = frozenset({f"{basic}->{shade}" for basic, ns in names.items() for shade in ns}
                                   | {f"{a}->{b}" for ns in names.values() for a in ns for b in ns if a != b})
    numbers = data.get("number", {})
    plural_only = frozenset(numbers.get("plural_only", []))
    mass = frozenset(numbers.get("mass", []))

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
            # plural-only nouns have no singular sense (and stand for themselves as plurals);
            # mass nouns have no plural sense ("meat" is never "soups")
            gs = [[f if groups[gi][fi] not in plural_only else (None if number == "sg" else groups[gi][fi])
                   for fi, f in enumerate(g)] for gi, g in enumerate(gs)] if pos == "noun" else gs
            if pos == "noun" and number == "pl":
                gs = [[None if groups[gi][fi] in mass else f for fi, f in enumerate(g)] for gi, g in enumerate(gs)]
            for gi, group in enumerate(gs):
                for fi, form in enumerate(group):
                    if form is None or not keep(form):
                        continue
                    sense = Sense(form, cls, slot, pos, gi, number, spec.get("kind"), bool(spec.get("needs_object_check")))
                    senses.setdefault(form, []).append(sense)
                    if pos == "adj":
                        adjectives.add(form)
                    # hard positives: the other forms of the same group, less the excluded pairs
                    # (a plural pair is excluded when its singular pair is: "dogs"->"puppies")
                    sg = groups[gi]
                    syn = [(f, "lexicon") for k, f in enumerate(group)
                           if f is not None and f != form and keep(f) and f"{sg[fi]}->{sg[k]}" not in excluded
                           and f"{sg[fi]}->{sg[k]}" not in shade_excluded
                           and not any(e in held_out for e in _edit(form.split(), f.split()))]
                    if syn:
                        positives.setdefault((form, cls), []).extend(syn)
                    # hard negatives: canonical forms of other groups (or the contrast list)
                    if contrast_map is not None:
                        targets = contrast_map.get(form, [])
                    else:
                        targets = [g[0] for j, g in enumerate(gs) if j != gi]
                    targets = [t for t in targets if t is not None and keep(t) and t not in group]
                    if targets:
                        negatives.setdefault((form, cls), []).extend(targets)

    # The table's words are known words either way (a word class is no leak: "wet" is an
    # adjective); its pairs become hard positives only when asked for.
    for subset in ("attributes", "relations"):
        for row in paper.get(subset, []):
            src, dst = row["from"], row["to"]
            if f"{src}->{dst}" in excluded or not keep(src) or not keep(dst):
                continue
            known = senses.get(src)
            if known:
                if include_benchmark_pairs:
                    for sense in known:
                        lst = positives.setdefault((src, sense.cls), [])
                        if all(f != dst for f, _ in lst):
                            lst.append((dst, "paper"))
            else:
                cls = f"paper_{subset}"
                pos = "adj" if subset == "attributes" else "prep"
                slot = "attribute" if subset == "attributes" else "relation"
                senses.setdefault(src, []).append(Sense(src, cls, slot, pos, 0))
                if include_benchmark_pairs:
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
        rules=_rules(data, classes, irregular),
        adverbs=frozenset(w.lower() for w in data.get("adverbs", [])),
        negative_rules=_rules(data, classes, irregular, key="negative_rules"),
        plural_only=plural_only,
        mass=mass,
        mass_or_count=frozenset(numbers.get("mass_or_count", [])),
        related=_related(data.get("not_contrasting", {}), irregular),
    )


def _related(hubs: dict, irregular: dict[str, str]) -> dict[str, frozenset[str]]:
    """``not_contrasting`` (a word -> the words that may be its kind, its part or worn with it)
    as form -> every word it never contrasts with, both ways, plurals included."""
    if not isinstance(hubs, dict) or not all(isinstance(v, list) for v in hubs.values()):
        raise ValueError("lexicon 'not_contrasting' must map a word to a list of words")
    out: dict[str, set[str]] = {}
    for hub, words in hubs.items():
        for a in (hub.lower(), plural(hub.lower(), irregular)):
            for w in words:
                for b in (w.lower(), plural(w.lower(), irregular)):
                    out.setdefault(a, set()).add(b)
                    out.setdefault(b, set()).add(a)
    return {k: frozenset(v) for k, v in out.items()}


@dataclass(frozen=True)
class _Vocab:
    """What ``@name`` and plural expansion need while the rules are parsed."""

    classes: dict
    lists: dict
    irregular: dict[str, str]
    nouns: frozenset[str]


def _words(values: list, where: str, voc: _Vocab) -> frozenset[str]:
    """A context's word list: lower-cased, ``@name`` expanded, lexicon nouns with their plurals."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}: expected a list of words")
    out: set[str] = set()
    for v in values:
        v = v.lower()
        if v.startswith("@"):
            name = v[1:]
            if name in voc.lists:
                out |= _words(voc.lists[name], f"{where} -> word_lists.{name}", voc)
            elif name in voc.classes:
                out |= _words([f for g in voc.classes[name]["groups"] for f in g], where, voc)
            else:
                raise ValueError(f"{where}: {v!r} names no word list or lexicon class")
        elif v.startswith("<"):
            if v not in TOKEN_CLASSES:
                raise ValueError(f"{where}: unknown token class {v!r} (known: {TOKEN_CLASSES})")
            out.add(v)
        else:
            out.add(v)
            if v in voc.nouns:
                out.add(plural(v, voc.irregular))
    return frozenset(out)


def _rules(data: dict, classes: dict, irregular: dict[str, str],
           key: str = "positive_rules") -> dict[str, tuple[SenseRule, ...]]:
    """``positive_rules`` (or ``negative_rules``) parsed and checked, indexed by form (ValueError
    names the bad entry)."""
    nouns = frozenset(f.lower() for spec in classes.values() if spec.get("pos") == "noun"
                      for g in spec["groups"] for f in g)
    voc = _Vocab(classes, data.get("word_lists", {}), irregular, nouns)
    by_form: dict[str, list[SenseRule]] = {}
    seen: set[str] = set()
    for n, spec in enumerate(data.get(key, [])):
        rid = spec.get("id") if isinstance(spec, dict) else None
        where = f"{key}[{n}] ({rid or 'no id'})"
        if not rid or rid in seen:
            raise ValueError(f"{where}: every rule needs a unique 'id'")
        seen.add(rid)
        unknown = set(spec) - {"id", "forms", "targets", "only", "block", "why"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        modes = [m for m in ("only", "block") if m in spec]
        if len(modes) != 1:
            raise ValueError(f"{where}: give exactly one of 'only' or 'block'")
        if not spec.get("why"):
            raise ValueError(f"{where}: say 'why' the rule exists")
        when = spec[modes[0]]
        if not isinstance(when, dict) or not when or set(when) - set(_CONTEXT_KEYS):
            raise ValueError(f"{where}: the context must be a non-empty mapping with keys from {_CONTEXT_KEYS}")
        fields = {k: _words(v, f"{where}.{k}", voc) for k, v in when.items() if k != "phrase"}
        if any(c.startswith("<") for k, ws in fields.items() if k not in ("next", "prev") for c in ws):
            raise ValueError(f"{where}: token classes like <np> only apply to 'next' and 'prev'")
        phrases = tuple(tuple(p.lower().split()) for p in when.get("phrase", []))
        forms = _words(spec.get("forms", []), f"{where}.forms", voc)
        if not forms:
            raise ValueError(f"{where}: 'forms' is empty")
        targets = _words(spec["targets"], f"{where}.targets", voc) if "targets" in spec else None
        rule = SenseRule(rid, forms, targets, modes[0], Context(**fields, phrase=phrases), spec["why"])
        for form in forms:
            by_form.setdefault(form, []).append(rule)
    return {k: tuple(v) for k, v in by_form.items()}
