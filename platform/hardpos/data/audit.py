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
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from hardpos.data.rules.perturber import RulePerturber

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


def write_audit(path: str | Path, rows: list[dict]) -> None:
    """Write rows (missing columns left empty) as an audit TSV."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, delimiter="\t", lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})


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
