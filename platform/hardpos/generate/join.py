"""The join: a caption's accepted engine rows -> its training triplets.

Contract: one row per caption with the positive :func:`positive_choice` picks (seeded, never
dependent on answer order), or one per accepted positive with ``positives="all"``; its hard
negative from dataset > LLM > rule negative (:class:`NegativePicker`); dataset "negatives"
that only swap whole conjuncts keep the meaning and are left out (:func:`dataset_negatives`).
Pure apart from the rule engine the picker may run; :mod:`hardpos.generate.pipeline` joins
each shard with it.
"""
from __future__ import annotations

import collections
from typing import Any, Iterable, Mapping

from hardpos.rules.conjuncts import is_conjunct_swap
from hardpos.rules.perturber import RulePerturber
from hardpos.rules.validate import validate
from hardpos.data.triplets import make_triplet
from hardpos.generate import rules_engine
from hardpos.world.lexicon import rule_lexicon


def base_kind(kind: str) -> str:
    """"replace_positive" / "replace_negative" / "replace" -> "replace" (likewise swap)."""
    base = kind.split("_")[0]
    return base if base in ("replace", "swap") else "replace"


def rule_negative(rules, caption: str, kind: str) -> str | None:
    """The rule engine's hard negative for ``caption``: one of ``kind`` if the rules make one,
    else of any kind; vetted by the shared validator (as the perturb stage does); None when
    the rules make none or cannot parse the caption. Deterministic (seeded per caption), so
    workers and the driver agree on it.
    """
    if not isinstance(caption, str):
        return None
    try:
        p = rules.pick(caption, "negative", kind) or rules.pick(caption, "negative")
    except Exception:  # noqa: BLE001 - a caption the rules cannot parse has no rule negative
        return None
    if p is None or not validate(caption, p.text, f"{p.kind}_negative").accepted:
        return None
    return p.text


def rule_negatives_of(results: Iterable[dict]) -> dict[tuple[str, str], str | None]:
    """(caption index, base kind) -> the rule negative the workers attached to a result row
    (:func:`judge_batch` with ``rule_negatives``); rows without the column (input rejects,
    which never reach the workers) are skipped."""
    return {(r["request_id"].split(":", 1)[0], base_kind(r["kind"])): r["rule_negative"]
            for r in results if "rule_negative" in r}


def dataset_negatives(cap: dict) -> list[str]:
    """The source's own negatives of ``cap`` that really are negatives.

    Some datasets' "negatives" keep the meaning: NegCLIP's COCO swaps include 210 whole-
    conjunct swaps ("A dog and a cat ..." -> "A cat and a dog ..."), which are SWAP hard
    *positives*. Training on one as a negative teaches exactly the brittleness the paper is
    about, so they are left out here (and counted by :func:`meaning_kept_negatives`).
    """
    return [n for n in cap["negatives"] or [] if not is_conjunct_swap(cap["caption"], n)]


def meaning_kept_negatives(captions: Iterable[dict]) -> int:
    """How many dataset negatives of ``captions`` :func:`dataset_negatives` leaves out."""
    return sum(len(c["negatives"] or []) - len(dataset_negatives(c)) for c in captions)


class NegativePicker:
    """The hard negative for a (caption, kind): dataset > LLM > rules under mode "auto"."""

    def __init__(self, mode: str, seed: int, dataset: str, world_dir: str | None = None):
        self.mode, self.seed, self.dataset, self.world_dir = mode, seed, dataset, world_dir
        self._rules = None

    @property
    def wants_rule_negatives(self) -> bool:
        """Whether the join may fall back to rule negatives (worth computing on the workers)."""
        return self.mode in ("auto", "rules")

    def _rule(self, cap: dict, kind: str, known: Mapping[tuple[str, str], str | None]) -> str | None:
        key = (str(cap["index"]), kind)
        if key in known:
            return known[key]
        if self._rules is None:
            self._rules = RulePerturber(seed=self.seed, lexicon=rule_lexicon(self.world_dir))
        return rule_negative(self._rules, cap["caption"], kind)

    def pick(self, cap: dict, kind: str, llm_negatives: dict[str, str],
             known: Mapping[tuple[str, str], str | None] = {}) -> tuple[str | None, str | None]:  # noqa: B006 - read only
        """(negative text, its source) or (None, None).

        known: rule negatives already computed on the workers (:func:`rule_negatives_of`);
        anything not in it is computed here with the same :func:`rule_negative`.
        """
        if self.mode == "none":
            return None, None
        base = kind.split("_")[0]
        usable = dataset_negatives(cap) if self.mode in ("auto", "dataset") else []
        if usable:
            i = rules_engine.row_seed(self.seed, cap["caption_id"], "negative") % len(usable)
            return usable[i], f"dataset:{self.dataset}"
        if self.mode in ("auto", "llm"):
            others = [v for k, v in llm_negatives.items() if not k.startswith("__")]
            text = llm_negatives.get(f"{base}_negative") or next(iter(others), None)
            if text:
                return text, llm_negatives.get("__source__")
        if self.mode in ("auto", "rules"):
            text = self._rule(cap, base_kind(kind), known)
            if text:
                return text, "rule"
        return None, None


POSITIVES_MODES = ("one", "all")


def positive_choice(seed: int, caption_id: str, n: int) -> int:
    """Index of the hard positive a caption trains with under ``positives="one"``.

    The rule: ``sha256(f"{seed}\\x00{caption_id}\\x00positive")`` (its first 4 bytes,
    little-endian; :func:`hardpos.generate.rules_engine.row_seed`) modulo ``n``, over the
    caption's accepted positives sorted by kind ("replace" < "swap"). It depends only on
    the seed and the caption id, never on the order the engine answered in, so reruns,
    resumes and any sharding give the same row; another seed may pick another positive.
    """
    if n < 1:
        raise ValueError(f"positive_choice needs at least one positive, got n={n}")
    return rules_engine.row_seed(seed, caption_id, "positive") % n


def join_caption(cap: dict, rows: list[dict], picker: NegativePicker, positives: str = "one",
                 keep_unmatched: bool = True, rule_negatives: Mapping[tuple[str, str], str | None] = {}  # noqa: B006
                 ) -> list[dict]:
    """The triplet rows of one caption from its accepted engine rows (any order). Pure
    apart from the rule engine the picker may run.

    positives: "one" gives at most one row: the positive :func:`positive_choice` picks
    (seeded with ``picker.seed``, the stage's seed) over the caption's accepted positives
    sorted by kind, as the paper pairs each training caption with one hard positive and
    one hard negative; "all" gives one row per accepted positive, in kind order.
    Each row's hard negative is picked for that row's positive kind (``picker.pick``).
    A caption with no accepted positive gives one row with a null positive (when
    ``keep_unmatched`` and a negative exists), so hard-negative-only training sees it.

    Every row records the choice: ``n_positives`` (the caption's accepted positives),
    ``positive_kinds`` (their kinds, comma-joined, in the order the index counts) and
    ``positive_index`` (0-based index of this row's positive in that order; null on a
    negative-only row). ``kind``/``source`` are the chosen positive's.
    """
    if positives not in POSITIVES_MODES:
        raise ValueError(f"positives must be one of {POSITIVES_MODES}, got {positives!r}")
    rows = sorted(rows, key=lambda r: r["kind"])  # a stable order, whatever order the engine answered in
    pos = [r for r in rows if r["polarity"] == "positive"]
    llm_neg = {r["kind"]: r["text"] for r in rows if r["polarity"] == "negative"}
    if llm_neg:
        llm_neg["__source__"] = next(r["source"] for r in rows if r["polarity"] == "negative")
    common = {"image": cap["image"], "caption": cap["caption"], "caption_id": cap["caption_id"],
              "n_positives": len(pos), "positive_kinds": ",".join(r["kind"] for r in pos) or None}
    if pos:
        chosen = range(len(pos)) if positives == "all" else [positive_choice(picker.seed, cap["caption_id"], len(pos))]
        out = []
        for i in chosen:
            p = pos[i]
            neg, neg_source = picker.pick(cap, p["kind"], llm_neg, rule_negatives)
            out.append(make_triplet(**common, hard_negative=neg, hard_positive=p["text"], kind=p["kind"],
                                    source=p["source"], negative_source=neg_source, positive_index=i))
        return out
    if keep_unmatched and isinstance(cap["caption"], str) and cap["caption"].strip():
        neg, neg_source = picker.pick(cap, "replace", llm_neg, rule_negatives)
        if neg is not None:
            return [make_triplet(**common, hard_negative=neg, hard_positive=None, kind="replace", source=neg_source,
                                 negative_source=neg_source, positive_index=None)]
    return []


def join_by_caption(captions: list[dict], accepted: list[dict], picker: NegativePicker, positives: str = "one",
                    keep_unmatched: bool = True, rule_negatives: Mapping[tuple[str, str], str | None] = {}  # noqa: B006
                    ) -> list[list[dict]]:
    """:func:`join_caption` for every caption of a shard: one list of rows per caption, in
    caption order (what :func:`join_counts` counts).

    rule_negatives: the workers' rule negatives (:func:`rule_negatives_of` over the shard's
    results); the same values are computed here for whatever it lacks, so it changes the
    speed of the join, never its output."""
    by_caption: dict[str, list[dict]] = collections.defaultdict(list)
    for row in accepted:
        by_caption[row["request_id"].split(":", 1)[0]].append(row)
    return [join_caption(cap, by_caption.get(str(cap["index"]), []), picker, positives, keep_unmatched,
                         rule_negatives) for cap in captions]


def join_triplets(captions: list[dict], accepted: list[dict], picker: NegativePicker,
                  keep_unmatched: bool = True, rule_negatives: Mapping[tuple[str, str], str | None] = {},  # noqa: B006
                  positives: str = "one") -> list[dict]:
    """Training triplets for one shard, flat in caption order (see :func:`join_caption`):
    with ``positives="one"`` (the default) at most one row per caption."""
    return [t for rows in join_by_caption(captions, accepted, picker, positives, keep_unmatched, rule_negatives)
            for t in rows]


def join_counts(per_caption: list[list[dict]]) -> dict[str, Any]:
    """What the join made of a shard's captions (summed over shards by :func:`aggregate`):

    ``triplets_per_caption`` / ``positives_per_caption``: histograms ``{"n": captions}``
    of rows written and accepted positives per caption; ``captions_with_positive`` and
    ``captions_with_several_positives`` (> 1 accepted positive: under "one" only one of
    them trains); ``positives_unused``: accepted positives in no row.
    """
    n_pos = [rows[0]["n_positives"] if rows else 0 for rows in per_caption]
    used = sum(1 for rows in per_caption for t in rows if t["hard_positive"] is not None)
    return {
        "triplets_per_caption": {str(k): v for k, v in sorted(collections.Counter(map(len, per_caption)).items())},
        "positives_per_caption": {str(k): v for k, v in sorted(collections.Counter(n_pos).items())},
        "captions_with_positive": sum(1 for n in n_pos if n > 0),
        "captions_with_several_positives": sum(1 for n in n_pos if n > 1),
        "positives_unused": sum(n_pos) - used,
    }
