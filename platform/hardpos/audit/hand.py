"""Hand audits of rule hard positives: a repeatable sample, and the labelled file's rates.

An audit answers "how many REPLACE (or SWAP) hard positives that the rule engine would
write for real captions change the meaning?". :func:`sample_rule_positives` draws the sample the
way the generate stage does (one ``RulePerturber.pick(caption, "positive", "replace")``
per caption), from captions shuffled with a fixed seed, so the same command always
gives the same rows; a person then labels each row ``ok`` / ``wrong`` / ``doubtful``
with a short reason. :func:`read_audit` and :func:`audit_rates` read such a labelled
file back (tests use them to hold the after-fix audit to its bar).

Audit file (tab-separated, UTF-8, one header line): ``caption, positive, label, why``
plus ``slot`` (which lexicon rule made the positive) and ``sample`` (``same`` when the
caption was also in the previous audit's sample, ``fresh`` otherwise, ``""`` in a
first audit).
"""
from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from hardpos.rules.perturber import RulePerturber, pick_balanced, pick_triplet

LABELS = ("ok", "wrong", "doubtful")
COLUMNS = ("caption", "positive", "label", "why", "slot", "sample")


@dataclass(frozen=True)
class SampleStats:
    """How the sample was drawn.

    drawn: captions taken from the shuffled order before ``n`` positives were found.
    with_positive: of those, how many got a REPLACE positive.
    coverage_all: share of ALL unique captions that get a positive of the kind (not only the drawn ones).
    """

    drawn: int
    with_positive: int
    coverage_all: float


def unique_captions(captions: Iterable[str]) -> list[str]:
    """Non-empty captions, first occurrence kept, in input order (NegCLIP repeats a few)."""
    return list(dict.fromkeys(c for c in captions if c and c.strip()))


def sample_rule_positives(captions: Iterable[str], *, n: int = 320, seed: int = 15, rule_seed: int = 0,
                          perturber=None, skip: Iterable[str] = (), kind: str = "replace") -> tuple[list[dict], SampleStats]:
    """The first ``n`` captions, in an order shuffled by ``seed``, that get a picked ``kind``
    ("replace" or "swap") positive.

    Returns rows ``{"caption", "positive", "slot"}`` in sample order, and :class:`SampleStats`.
    The shuffle depends only on ``seed`` and the caption list, so re-running after a lexicon
    change walks the same captions first: the captions that still get a positive come back
    (with possibly a different positive), the ones that lost it are replaced by fresh captions
    further down the order.
    rule_seed: the perturber's seed (the generate stage's default is 0).
    skip: captions never sampled (those of earlier audits, for a held-out sample).
    kind: which rule positives: "replace" (synonyms) or "swap" (whole conjuncts exchanged).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if kind not in ("replace", "swap"):
        raise ValueError(f"kind must be 'replace' or 'swap', got {kind!r}")
    if perturber is None:
        perturber = RulePerturber(seed=rule_seed)
    caps = unique_captions(captions)
    order = list(caps)
    random.Random(seed).shuffle(order)
    skipped = set(skip)
    order = [c for c in order if c not in skipped]
    rows: list[dict] = []
    drawn = 0
    for caption in order:
        if len(rows) == n:
            break
        drawn += 1
        p = perturber.pick(caption, "positive", kind)
        if p is not None:
            rows.append({"caption": caption, "positive": p.text, "slot": p.slot})
    covered = sum(perturber.pick(c, "positive", kind) is not None for c in caps)
    return rows, SampleStats(drawn=drawn, with_positive=len(rows), coverage_all=covered / len(caps) if caps else 0.0)


def write_audit(path: str | Path, rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> None:
    """Write rows (missing columns left empty, others dropped) as an audit TSV of ``columns``."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns, delimiter="\t", lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})


def read_audit(path: str | Path, *, labelled: bool = True) -> list[dict]:
    """An audit TSV; when ``labelled``, every row must carry a label in :data:`LABELS` and a reason."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = [c for c in ("caption", "positive", "label", "why") if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    if not labelled:
        return rows
    for i, r in enumerate(rows, start=2):
        if r["label"] not in LABELS:
            raise ValueError(f"{path}:{i}: label must be one of {LABELS}, got {r['label']!r}")
        if not (r["why"] or "").strip():
            raise ValueError(f"{path}:{i}: a label needs its reason in 'why'")
    return rows


def audit_rates(rows: list[dict]) -> dict[str, float]:
    """Share of each label, plus ``n``."""
    n = len(rows)
    out: dict[str, float] = {"n": n}
    for label in LABELS:
        out[label] = sum(r["label"] == label for r in rows) / n if n else 0.0
    return out


# ---------------------------------------------------------------------- blind audit of stage picks
#: verdicts of a blind audit row, per polarity
BLIND_LABELS = {"negative": ("ok", "ungrammatical", "not_different", "doubtful"),
                "positive": ("ok", "changes_meaning", "doubtful")}
BLIND_COLUMNS = ("polarity", "caption", "edit", "label", "why", "kind", "slot", "sample")


#: SugarCrepe++'s five files, in the order the blind audit reads them
SUGARCREPE_PP_FILES = ("replace_att.json", "replace_obj.json", "replace_rel.json", "swap_att.json", "swap_obj.json")


def sugarcrepe_pp_captions(sources: Iterable[str | Path]) -> list[str]:
    """The original ``caption`` of every SugarCrepe++ item (a list of ``{id, filename, caption,
    caption2, negative_caption}``), file by file; a folder stands for its five files."""
    paths: list[Path] = []
    for src in sources:
        p = Path(src)
        paths += [p / f for f in SUGARCREPE_PP_FILES] if p.is_dir() else [p]
    out = []
    for p in paths:
        items = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(items, list) or not all(isinstance(i, dict) and "caption" in i for i in items):
            raise ValueError(f"{p}: not a SugarCrepe++ file (a list of items with a 'caption')")
        out += [i["caption"] for i in items]
    return out


def audit_captions(paths: Iterable[str | Path]) -> set[str]:
    """The ``caption`` column of audit TSVs (to leave them out of a new draw)."""
    out: set[str] = set()
    for path in paths:
        with open(path, newline="", encoding="utf-8") as f:
            out |= {r["caption"] for r in csv.DictReader(f, delimiter="\t")}
    return out


def sample_stage_picks(captions: Iterable[str], *, n: int = 200, seed: int = 36, rule_seed: int = 0,
                       perturber=None, skip: Iterable[str] = (), balanced: bool = True) -> tuple[list[dict], int]:
    """The hard negatives and positives the ``perturb`` stage would write for ``captions`` as its
    input (both kinds; ``balanced``: its default balanced picks over the whole list,
    :func:`pick_balanced`, else the seeded-random :func:`pick_triplet`), for captions in an
    order shuffled by ``seed``: the first ``n`` captions that get a negative give the negative
    rows, the first ``n`` that get a positive the positive rows.

    Returns (rows, captions drawn). Rows ``{"polarity", "caption", "edit", "kind", "slot"}``:
    negatives first, then positives, each in draw order. The shuffle depends only on ``seed``
    and the caption list, so the same command after a rule change walks the same captions
    first; a caption that lost its pick is replaced by the next one in the order.
    skip: captions never sampled (those of earlier audits).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if perturber is None:
        perturber = RulePerturber(seed=rule_seed)
    captions = list(captions)
    picks: dict[str, dict] = {}
    if balanced:
        kept = [c for c in captions if isinstance(c, str) and c.strip()]  # what the stage perturbs
        made = [perturber.candidates(c) for c in kept]
        results, _ = pick_balanced(kept, made, rule_seed, perturber.seed)
        for c, r in zip(kept, results):
            picks.setdefault(c, r)  # a repeated caption: its first row, as the stage writes it first
    order = unique_captions(captions)
    random.Random(seed).shuffle(order)
    skipped = set(skip)
    negs: list[dict] = []
    poss: list[dict] = []
    drawn = 0
    for caption in order:
        if len(negs) >= n and len(poss) >= n:
            break
        if caption in skipped:
            continue
        drawn += 1
        t = picks[caption] if balanced else pick_triplet(perturber, caption, rule_seed)
        if t["neg"] is not None and len(negs) < n:
            negs.append({"polarity": "negative", "caption": caption, "edit": t["neg"], "kind": t["kind"],
                         "slot": t["neg_slot"]})
        if t["pos"] is not None and len(poss) < n:
            poss.append({"polarity": "positive", "caption": caption, "edit": t["pos"], "kind": t["kind"],
                         "slot": t["pos_slot"]})
    return negs + poss, drawn


def write_blind_audit(path: str | Path, rows: list[dict]) -> None:
    """Write rows (missing columns left empty) as a blind-audit TSV (:data:`BLIND_COLUMNS`)."""
    write_audit(path, rows, BLIND_COLUMNS)


def read_blind_audit(path: str | Path, *, labelled: bool = True) -> list[dict]:
    """A blind-audit TSV; when ``labelled``, every row must carry a verdict of its polarity
    (:data:`BLIND_LABELS`) and a reason."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = [c for c in BLIND_COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    for i, r in enumerate(rows, start=2):
        if r["polarity"] not in BLIND_LABELS:
            raise ValueError(f"{path}:{i}: polarity must be 'negative' or 'positive', got {r['polarity']!r}")
        if not labelled:
            continue
        if r["label"] not in BLIND_LABELS[r["polarity"]]:
            raise ValueError(f"{path}:{i}: a {r['polarity']}'s label must be one of {BLIND_LABELS[r['polarity']]}, "
                             f"got {r['label']!r}")
        if not (r["why"] or "").strip():
            raise ValueError(f"{path}:{i}: a label needs its reason in 'why'")
    return rows


def blind_counts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per polarity: ``n`` and the count of each label."""
    out: dict[str, dict[str, int]] = {}
    for pol, labels in BLIND_LABELS.items():
        mine = [r for r in rows if r["polarity"] == pol]
        out[pol] = {"n": len(mine), **{lab: sum(r["label"] == lab for r in mine) for lab in labels}}
    return out
