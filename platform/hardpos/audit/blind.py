"""The blind-text audit: can a model that reads only the text tell each kind of edit from its caption?

A hard negative a text-only model spots ("a man holding a skis") teaches a vision-language
model that *an edit is wrong*, not *what the image shows*; a benchmark whose edits it spots can
be passed on text alone. This module turns any caption/edit data the platform reads into
:class:`Edit` pairs, audits them per kind with the grouped cross-validated classifier of
:mod:`hardpos.audit.text_models`, counts simple grammar-rule hits, and renders the result as a
markdown table and JSON (``hardpos audit``, :mod:`hardpos.stages.audit`, is the stage).

Sources (:func:`read_edits`, ``format="auto"`` tells them apart):

* ``triplets``     a triplet file (parquet/jsonl; :func:`hardpos.data.triplets.read_triplets`):
                   ``hard_negative`` and ``hard_positive`` against ``caption``. The kind comes
                   from the row's ``subset`` (``replace_attribute`` ...) or its ``kind`` plus the
                   slot the rule engine records (``negative_slot`` / ``positive_slot`` / ``slot``:
                   ``attribute:``, ``relation:``, ``object:``, ``attributes:``, ``objects:``).
* ``captions``     a caption source with negatives (NegCLIP tsv, any file
                   :func:`hardpos.data.captions.formats.read_captions` reads with a negatives column):
                   every negative against its caption; kind ``swap`` when it reorders the
                   caption's words, else ``replace``.
* ``replace``, ``swap``, ``sugarcrepe``, ``sugarcrepe_pp``: any benchmark file or folder the
                   evaluate stage reads (:func:`hardpos.eval.benchmarks.load_benchmark`; the
                   release, one half of it such as ``swapped_data/``, or one file:
                   :mod:`hardpos.eval.formats`, the one list of formats), kinds from their
                   subsets; SugarCrepe++'s second caption is a ``paraphrase`` positive.

Kinds (:data:`KINDS`): ``replace_attribute``, ``replace_relation``, ``replace_object``,
``replace`` (which part is unknown), ``swap_attribute``, ``swap_object``, ``swap``,
``add_attribute``, ``add_object``, ``paraphrase``. Identical (caption, edit) pairs count once;
an edit equal to its caption (case, spacing and a final period aside) is no edit and is counted
apart.

Grammar-rule hits (:data:`hardpos.rules.english.GRAMMAR_RULES`,
:func:`hardpos.rules.english.grammar_hits`): a rule counts for an edit when the edit breaks it
more often than its caption does, so a caption's own slips are not charged to the edit. The
rules are deliberately simple surface checks with the lexicon's nouns; a hit is a strong hint,
not a verdict.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from hardpos import storage
from hardpos.audit.baselines import interval
from hardpos.audit.config import FORMATS, POLARITIES, BlindSettings, TextModelConfig
from hardpos.audit.text_models import CrossValidation, caption_key, cross_validate, lm_pair_correct
from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.formats import detect_kind
from hardpos.eval.items import BenchmarkError, Item
from hardpos.eval.spec import BenchmarkSpec
from hardpos.rules.english import grammar_hits
from hardpos.rules.textnorm import normalise, words

KINDS = ("replace_attribute", "replace_relation", "replace_object", "replace", "swap_attribute", "swap_object", "swap",
         "add_attribute", "add_object", "paraphrase")
#: benchmark subsets / SugarCrepe categories -> kinds
SUBSET_KINDS = {"attributes": "replace_attribute", "relations": "replace_relation", "replace_att": "replace_attribute",
                "replace_obj": "replace_object", "replace_rel": "replace_relation", "swap_att": "swap_attribute",
                "swap_obj": "swap_object", "add_att": "add_attribute", "add_obj": "add_object",
                "swap": "swap_attribute"}  # ARO VG-Attribution swaps two objects' attributes
#: the rule engine's slot prefixes (``attribute:color red->blue``) -> the part a kind names
SLOT_PARTS = {"attribute": "attribute", "relation": "relation", "object": "object", "attributes": "attribute",
              "objects": "object"}


class AuditError(ValueError):
    """A source cannot be audited: missing, malformed, or holding no edits (the message names it)."""


class NoEditsError(AuditError):
    """A readable source that holds no edit at all."""


@dataclasses.dataclass(frozen=True)
class Edit:
    """One edited caption: ``edited`` is a ``polarity`` edit of ``caption`` of kind ``kind``."""

    caption: str
    edited: str
    polarity: str
    kind: str


# --------------------------------------------------------------------------- reading
def edit_kind(kind: Any, slot: Any = None, subset: Any = None) -> str | None:
    """The audit kind of a triplet row's edit, from its ``subset``, else ``kind`` + ``slot``;
    None when the row's kind is neither REPLACE nor SWAP (nothing to audit by kind)."""
    for value in (subset, kind):
        if isinstance(value, str) and value in KINDS and value not in ("replace", "swap"):
            return value
        if isinstance(value, str) and value in SUBSET_KINDS and value != "swap":
            return SUBSET_KINDS[value]
    base = kind.lower() if isinstance(kind, str) else ""
    if base not in ("replace", "swap"):
        return None
    prefix = slot.split(":", 1)[0] if isinstance(slot, str) and ":" in slot else None
    part = SLOT_PARTS.get(prefix) if prefix else None
    if part is None or (base == "swap" and part == "relation"):
        return base
    return f"{base}_{part}"


def reordered(caption: str, edited: str) -> bool:
    """The edit uses the caption's words in another order (a SWAP)."""
    a, b = words(caption), words(edited)
    return Counter(a) == Counter(b) and a != b


def _dedupe(edits: list[Edit]) -> tuple[list[Edit], int]:
    """(distinct edits, how many were no edit at all: equal to their caption after normalising)."""
    out, seen, identical = [], set(), 0
    for e in edits:
        if normalise(e.caption) == normalise(e.edited):
            identical += 1
            continue
        key = (e.caption, e.edited, e.polarity, e.kind)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out, identical


def detect_format(path: str) -> str:
    """The format of ``path`` (see the module doc): the benchmark kind
    :func:`hardpos.eval.formats.detect_kind` tells, else ``captions`` for a .tsv / .csv / .json
    caption file; AuditError when it is none of them."""
    kind = detect_kind(path)
    if kind is not None:
        return kind
    if path.lower().endswith((".tsv", ".csv", ".json")):
        return "captions"
    raise AuditError(f"{path}: not a triplet file (.parquet/.jsonl), a caption file with negatives (.tsv/.csv/.json) "
                     "nor a benchmark file or folder (REPLACE / SWAP / SugarCrepe / SugarCrepe++: the release, one "
                     "half of it or one file); set format= to say which")


def _from_triplets(path: str) -> tuple[list[Edit], list[Item]]:
    # lazy: the triplet reader pulls in pyarrow's parquet module, only triplet sources need it
    from hardpos.data.triplets import TripletFileError, read_triplets

    try:
        rows = read_triplets(path)
    except TripletFileError as exc:
        raise AuditError(str(exc)) from exc
    edits, items = [], []
    for i, r in enumerate(rows):
        caption = r.get("caption")
        if not isinstance(caption, str) or not caption.strip():
            continue
        kinds: dict[str, str] = {}
        for polarity, column, slot_col in (("negative", "hard_negative", "negative_slot"),
                                           ("positive", "hard_positive", "positive_slot")):
            edited = r.get(column)
            if not isinstance(edited, str) or not edited.strip():
                continue
            slot = r.get(slot_col) or (r.get("slot") if polarity == "negative" else None)
            kind = edit_kind(r.get("kind"), slot, r.get("subset"))
            if kind is None:
                kind = "swap" if reordered(caption, edited) else "replace"
            kinds[polarity] = kind
            edits.append(Edit(caption, edited, polarity, kind))
        if "negative" in kinds:  # an item of the text-only triplet figures: its subset, else its negative's kind
            positive = r.get("hard_positive") if "positive" in kinds else None
            items.append(Item(str(i), str(r.get("subset") or kinds["negative"]), "", caption, r["hard_negative"],
                              positive))
    return edits, items


def _from_captions(path: str) -> tuple[list[Edit], list[Item]]:
    # lazy: caption sources are one of several formats; their reader loads only when one is audited
    from hardpos.data.captions import CaptionSourceError
    from hardpos.data.captions.formats import read_captions

    try:
        rows = read_captions(path)
    except CaptionSourceError as exc:
        raise AuditError(str(exc)) from exc
    edits = [Edit(r["caption"], neg, "negative", "swap" if reordered(r["caption"], neg) else "replace")
             for r in rows if r["caption"].strip() for neg in r["negatives"]]
    items = [Item(str(i), e.kind, "", e.caption, e.edited) for i, e in enumerate(edits)]
    return edits, items


def _from_benchmark(path: str, fmt: str) -> tuple[list[Edit], list[Item], str]:
    try:
        bench = load_benchmark(BenchmarkSpec(name=fmt, kind=fmt, path=path))  # type: ignore[arg-type]
    except BenchmarkError as exc:
        raise AuditError(str(exc)) from exc
    out = []
    for it in bench.items:
        kind = SUBSET_KINDS.get(it.subset, "replace")
        out.append(Edit(it.caption, it.negative, "negative", kind))
        if it.positive:
            out.append(Edit(it.caption, it.positive, "positive", "paraphrase" if fmt == "sugarcrepe_pp" else kind))
    return out, list(bench.items), bench.aggregate


@dataclasses.dataclass
class Source:
    """What an audit reads from one source: its distinct edits, its items as a benchmark sees
    them (caption, hard negative, hard positive or None, subset: every item, for the text-only
    pair and triplet figures of :mod:`hardpos.audit.baselines`), and how it was read
    (``{"format", "edits", "identical"}``)."""

    edits: list[Edit]
    items: list[Item]
    info: dict[str, Any]
    aggregate: str = "pooled"


def read_source(path: str, fmt: str = "auto") -> Source:
    """The source ``path`` (local or s3://) read for the audit. Raises AuditError naming the
    source when it is missing, unreadable, of an unknown format, or holds no edit at all."""
    if fmt not in FORMATS:
        raise AuditError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    if not path:
        raise AuditError("no source path given")
    if not storage.exists(path) and not storage.has_glob(path):
        raise AuditError(f"{path}: not found")
    fmt = detect_format(path) if fmt == "auto" else fmt
    aggregate = "pooled"
    if fmt == "triplets":
        raw, items = _from_triplets(path)
    elif fmt == "captions":
        raw, items = _from_captions(path)
    else:
        raw, items, aggregate = _from_benchmark(path, fmt)
    edits, identical = _dedupe(raw)
    if not edits:
        what = ("no hard_negative or hard_positive filled" if fmt == "triplets" else
                "no negative column (a caption file without edits: run `hardpos perturb` on it and audit its "
                "triplets)" if fmt == "captions" else "no items")
        raise NoEditsError(f"{path}: no edits to audit ({what}; {identical} edits equal to their caption)")
    return Source(edits, items, {"format": fmt, "edits": len(edits), "identical": identical}, aggregate)


def read_edits(path: str, fmt: str = "auto") -> tuple[list[Edit], dict[str, Any]]:
    """The distinct edits of the source ``path`` and how they were read (:func:`read_source`)."""
    src = read_source(path, fmt)
    return src.edits, src.info


# --------------------------------------------------------------------------- the audit
@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """The text models and the cross-fitting (:mod:`hardpos.audit.text_models`).

    text_models: the models' settings and their folds, grouped by original caption.
    seed: the fold assignment.
    min_pairs: a kind with fewer distinct pairs is reported, not measured (a handful of pairs
        gives a fold accuracy of noise); also the least items of a subset's triplet figures."""

    text_models: TextModelConfig = dataclasses.field(default_factory=TextModelConfig)
    seed: int = 0
    min_pairs: int = 20

    def blind(self) -> BlindSettings:
        """The same settings for the benchmark-style figures of :mod:`hardpos.audit.baselines`."""
        return BlindSettings(text_models=self.text_models, seed=self.seed, min_items=self.min_pairs)


#: edits kept per grammar rule and row as examples (in audit.json)
EXAMPLES = 3


def audit_group(edits: Sequence[Edit], settings: AuditSettings) -> dict[str, Any]:
    """The audit of one set of edits (one source, polarity and kind): pairs, distinct
    captions, the blind measures or why they were not measured, and the grammar-rule hits (how
    many edits have any, the count per rule, the first :data:`EXAMPLES` edits of each rule).

    The blind measures, in %: the ``ngram_lr`` classifier's one-caption accuracy (mean and std
    over folds: ``accuracy_pct``, ``std_pct``) and, from the same fits, its pair measure (it
    scores the edit more edit-like than its original: ``pair_pct`` with its 95% interval
    ``pair_lo_pct`` / ``pair_hi_pct``); the ``caption_lm`` pair measure (the original more
    likely than the edit: ``lm_pair_pct`` and its interval). 50 is chance for each."""
    captions = {caption_key(e.caption) for e in edits}
    hits: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    any_hit = 0
    for e in edits:
        found = grammar_hits(e.caption, e.edited)
        hits.update(found)
        any_hit += bool(found)
        for name in found:
            if len(examples.setdefault(name, [])) < EXAMPLES:
                examples[name].append(e.edited)
    row: dict[str, Any] = {"pairs": len(edits), "captions": len(captions),
                           "grammar_hits": any_hit, "grammar_hit_pct": round(100 * any_hit / len(edits), 1),
                           "grammar_rules": dict(sorted(hits.items())), "grammar_examples": examples,
                           "accuracy_pct": None, "std_pct": None, "fold_accuracy_pct": [], "pair_pct": None,
                           "pair_lo_pct": None, "pair_hi_pct": None, "lm_pair_pct": None, "lm_pair_lo_pct": None,
                           "lm_pair_hi_pct": None, "skipped": None}
    tm = settings.text_models
    if len(edits) < settings.min_pairs or len(captions) < tm.folds:
        row["skipped"] = (f"{len(edits)} pairs from {len(captions)} captions: fewer than min_pairs={settings.min_pairs} "
                          f"pairs or fewer captions than folds={tm.folds}")
        return row
    originals, edited = [e.caption for e in edits], [e.edited for e in edits]
    groups = [caption_key(c) for c in originals]
    cv: CrossValidation = cross_validate(originals, edited, groups=groups, folds=tm.folds, seed=settings.seed,
                                         ngrams=tm.ngrams, l2=tm.l2, steps=tm.steps)
    lm = lm_pair_correct(originals, edited, groups=groups, folds=tm.folds, seed=settings.seed, order=tm.order,
                         discount=tm.discount)
    row.update(accuracy_pct=round(100 * cv.mean, 1), std_pct=round(100 * cv.std, 1),
               fold_accuracy_pct=[round(100 * a, 2) for a in cv.fold_accuracy])
    for key, correct in (("pair", cv.pair_correct), ("lm_pair", lm)):
        lo, hi = interval(correct, groups)
        row.update({f"{key}_pct": round(100 * float(correct.mean()), 1), f"{key}_lo_pct": round(100 * lo, 1),
                    f"{key}_hi_pct": round(100 * hi, 1)})
    return row


def audit_edits(edits: Sequence[Edit], settings: AuditSettings, *, polarities: Sequence[str] = POLARITIES,
                pooled: bool = True, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per (polarity, kind) present, in :data:`POLARITIES` x :data:`KINDS` order, plus
    (``pooled``) an ``all`` row per polarity when it has more than one kind (its kinds together)."""
    rows = []
    for polarity in polarities:
        mine = [e for e in edits if e.polarity == polarity]
        kinds = [k for k in KINDS if any(e.kind == k for e in mine)]
        groups = ([("all", mine)] if pooled and len(kinds) > 1 else []) + [
            (k, [e for e in mine if e.kind == k]) for k in kinds]
        for kind, group in groups:
            if progress:
                progress(f"{polarity}/{kind}: {len(group)} pairs")
            rows.append({"polarity": polarity, "kind": kind, **audit_group(group, settings)})
    return rows


def _pct_ci(value: float | None, lo: float | None, hi: float | None) -> str:
    return "" if value is None else f"{value:.1f} [{lo:.1f}, {hi:.1f}]"


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """The audit as markdown: one line per source, polarity and kind (one caption and pair
    measures), then the text-only triplet figures per source and subset where measured."""
    lines = ["| source | edits | kind | pairs | captions | one caption: ngram_lr (%, mean ± std over folds) | "
             "pair: ngram_lr (%, 95% CI) | pair: caption_lm (%, 95% CI) | grammar hits |",
             "|---|---|---|---|---|---|---|---|---|"]
    for src in results:
        for r in src["rows"]:
            if r["skipped"] is None:
                acc = f"{r['accuracy_pct']:.1f} ± {r['std_pct']:.1f}"
                pair = _pct_ci(r.get("pair_pct"), r.get("pair_lo_pct"), r.get("pair_hi_pct"))
                lm = _pct_ci(r.get("lm_pair_pct"), r.get("lm_pair_lo_pct"), r.get("lm_pair_hi_pct"))
            else:
                acc, pair, lm = f"not measured ({r['pairs']} pairs)", "", ""
            lines.append(f"| {src['name']} | {r['polarity']}s | {r['kind']} | {r['pairs']} | {r['captions']} | {acc} | "
                         f"{pair} | {lm} | {r['grammar_hits']} ({r['grammar_hit_pct']:.1f}%) |")
    triplet = [(src["name"], row) for src in results for row in src.get("triplet_rows", [])]
    if triplet:
        lines += ["", "Text-only figures as a benchmark reads the items (%, 95% CI; the caption against its hard "
                  "negative, and with a hard positive the augmented accuracy and brittleness; chance 50 / 33.3 / 33.3):",
                  "", "| source | subset | model | items | orig (pair) | aug | brittle |", "|---|---|---|---|---|---|---|"]
        for name, row in triplet:
            cells = [(_pct_ci(100 * row[f], 100 * row[f"{f}_lo"], 100 * row[f"{f}_hi"]) if f in row else "")
                     for f in ("orig_acc", "aug_acc", "brittleness")]
            if row.get("skipped"):
                cells = [f"not measured ({row['skipped']})", "", ""]
            lines.append(f"| {name} | {row['subset']} | {row['model']} | {row['n_items']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
