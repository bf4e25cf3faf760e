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
* ``captions``     a caption source with negatives (NegCLIP tsv, SugarCrepe json, any file
                   :func:`hardpos.data.captions.formats.read_captions` reads with a negatives column):
                   every negative against its caption; kind ``swap`` when it reorders the
                   caption's words, else ``replace``.
* ``replace``, ``swap``, ``sugarcrepe``, ``sugarcrepe_pp``: the benchmark folders the evaluate
                   stage reads (:func:`hardpos.eval.benchmarks.load_benchmark`), kinds from
                   their subsets; SugarCrepe++'s second caption is a ``paraphrase`` positive.

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
from hardpos.audit.text_models import CrossValidation, cross_validate
from hardpos.rules.english import grammar_hits
from hardpos.rules.textnorm import normalise, words

KINDS = ("replace_attribute", "replace_relation", "replace_object", "replace", "swap_attribute", "swap_object", "swap",
         "add_attribute", "add_object", "paraphrase")
POLARITIES = ("negative", "positive")
FORMATS = ("auto", "triplets", "captions", "replace", "swap", "sugarcrepe", "sugarcrepe_pp")
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
    """The format of ``path`` (see the module doc); AuditError when it is none of them."""
    if path.lower().endswith((".parquet", ".jsonl")):
        return "triplets"
    if path.lower().endswith((".tsv", ".csv", ".json")):
        return "captions"
    if storage.exists(storage.join(path, "data", "vl_checklist_attributes.json")):
        return "replace"
    if storage.exists(storage.join(path, "data", "visual_genome_attribution.json")):
        return "swap"
    if storage.exists(storage.join(path, "replace_att.json")):
        return "sugarcrepe" if storage.exists(storage.join(path, "add_att.json")) else "sugarcrepe_pp"
    raise AuditError(f"{path}: not a triplet file (.parquet/.jsonl), a caption file with negatives (.tsv/.csv/.json) "
                     "nor a REPLACE / SWAP / SugarCrepe / SugarCrepe++ folder; set format= to say which")


def _from_triplets(path: str) -> list[Edit]:
    # lazy: the triplet reader pulls in pyarrow's parquet module, only triplet sources need it
    from hardpos.data.triplets import TripletFileError, read_triplets

    try:
        rows = read_triplets(path)
    except TripletFileError as exc:
        raise AuditError(str(exc)) from exc
    out = []
    for r in rows:
        caption = r.get("caption")
        if not isinstance(caption, str) or not caption.strip():
            continue
        for polarity, column, slot_col in (("negative", "hard_negative", "negative_slot"),
                                           ("positive", "hard_positive", "positive_slot")):
            edited = r.get(column)
            if not isinstance(edited, str) or not edited.strip():
                continue
            slot = r.get(slot_col) or (r.get("slot") if polarity == "negative" else None)
            kind = edit_kind(r.get("kind"), slot, r.get("subset"))
            if kind is None:
                kind = "swap" if reordered(caption, edited) else "replace"
            out.append(Edit(caption, edited, polarity, kind))
    return out


def _from_captions(path: str) -> list[Edit]:
    # lazy: caption sources are one of several formats; their reader loads only when one is audited
    from hardpos.data.captions import CaptionSourceError
    from hardpos.data.captions.formats import read_captions

    try:
        rows = read_captions(path)
    except CaptionSourceError as exc:
        raise AuditError(str(exc)) from exc
    return [Edit(r["caption"], neg, "negative", "swap" if reordered(r["caption"], neg) else "replace")
            for r in rows if r["caption"].strip() for neg in r["negatives"]]


def _from_benchmark(path: str, fmt: str) -> list[Edit]:
    # lazy: the evaluate stage's loaders (hardpos.eval) are needed for benchmark folders only
    from hardpos.eval.benchmarks import load_benchmark
    from hardpos.eval.items import BenchmarkError
    from hardpos.eval.spec import BenchmarkSpec

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
    return out


def read_edits(path: str, fmt: str = "auto") -> tuple[list[Edit], dict[str, Any]]:
    """The distinct edits of the source ``path`` (local or s3://) and how they were read:
    ``{"format", "edits", "identical"}``. Raises AuditError naming the source when it is
    missing, unreadable, of an unknown format, or holds no edit at all."""
    if fmt not in FORMATS:
        raise AuditError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    if not path:
        raise AuditError("no source path given")
    if not storage.exists(path):
        raise AuditError(f"{path}: not found")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "triplets":
        raw = _from_triplets(path)
    elif fmt == "captions":
        raw = _from_captions(path)
    else:
        raw = _from_benchmark(path, fmt)
    edits, identical = _dedupe(raw)
    if not edits:
        what = ("no hard_negative or hard_positive filled" if fmt == "triplets" else
                "no negative column (a caption file without edits: run `hardpos perturb` on it and audit its "
                "triplets)" if fmt == "captions" else "no items")
        raise NoEditsError(f"{path}: no edits to audit ({what}; {identical} edits equal to their caption)")
    return edits, {"format": fmt, "edits": len(edits), "identical": identical}


# --------------------------------------------------------------------------- the audit
@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """The classifier and the cross-validation (see :func:`hardpos.audit.text_models.cross_validate`).

    min_pairs: a kind with fewer distinct pairs is reported, not measured (a handful of pairs
        gives a fold accuracy of noise)."""

    folds: int = 5
    ngrams: int = 2
    l2: float = 1e-4
    steps: int = 500
    seed: int = 0
    min_pairs: int = 20


#: edits kept per grammar rule and row as examples (in audit.json)
EXAMPLES = 3


def audit_group(edits: Sequence[Edit], settings: AuditSettings) -> dict[str, Any]:
    """The audit of one set of edits (one source, polarity and kind): pairs, distinct
    captions, the blind accuracy (mean and std over folds, in %) or why it was not measured,
    and the grammar-rule hits (how many edits have any, the count per rule, the first
    :data:`EXAMPLES` edits of each rule)."""
    captions = {" ".join(e.caption.lower().split()) for e in edits}
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
                           "accuracy_pct": None, "std_pct": None, "fold_accuracy_pct": [], "skipped": None}
    if len(edits) < settings.min_pairs or len(captions) < settings.folds:
        row["skipped"] = (f"{len(edits)} pairs from {len(captions)} captions: fewer than min_pairs={settings.min_pairs} "
                          f"pairs or fewer captions than folds={settings.folds}")
        return row
    cv: CrossValidation = cross_validate([e.caption for e in edits], [e.edited for e in edits], folds=settings.folds,
                                         seed=settings.seed, ngrams=settings.ngrams, l2=settings.l2, steps=settings.steps)
    row.update(accuracy_pct=round(100 * cv.mean, 1), std_pct=round(100 * cv.std, 1),
               fold_accuracy_pct=[round(100 * a, 2) for a in cv.fold_accuracy])
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


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """The audit as one markdown table: one line per source, polarity and kind."""
    lines = ["| source | edits | kind | pairs | captions | blind accuracy (%, mean ± std over folds) | grammar hits |",
             "|---|---|---|---|---|---|---|"]
    for src in results:
        for r in src["rows"]:
            acc = (f"{r['accuracy_pct']:.1f} ± {r['std_pct']:.1f}" if r["skipped"] is None
                   else f"not measured ({r['pairs']} pairs)")
            lines.append(f"| {src['name']} | {r['polarity']}s | {r['kind']} | {r['pairs']} | {r['captions']} | {acc} | "
                         f"{r['grammar_hits']} ({r['grammar_hit_pct']:.1f}%) |")
    return "\n".join(lines) + "\n"
