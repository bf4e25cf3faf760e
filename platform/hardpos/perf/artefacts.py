"""How detectable are hard negatives from their text alone? (the artefact strength of a triplet set)

    python -m hardpos.perf.artefacts TRIPLETS [--test-fraction 0.2] [--seed 0]

The paper's Section 4.3 explains why hard negatives alone make a model brittle: when a
negative can be told from a real caption by its text ("perturbation detection": an unusual
word, an odd combination), lowering its score needs no look at the image, and the model
learns that *any* edit is wrong. This measures how much of that shortcut a triplet set
offers: a text-only classifier (multinomial naive Bayes over word unigrams and bigrams,
Laplace-smoothed) is trained to tell ``caption`` (label 0) from ``hard_negative`` (label 1)
on most captions and scored on held-out ones (split by ``caption_id``, so a caption and its
own negative are never on both sides). 50% means the negatives carry no textual artefact;
SugarCrepe reported text-only models far above chance on earlier benchmarks.

Also reported: the same for ``hard_positive`` vs ``caption`` (positives that look like
edits are what a perturbation detector then rejects) and per ``kind``. Pure Python over the
rows (no Ray, no model): seconds for tens of thousands of triplets.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass

from hardpos.data.triplets import read_triplets

TOKEN = re.compile(r"[a-z]+")


def features(text: str) -> Counter:
    """Word unigrams and bigrams of ``text`` (lower case, letters only)."""
    words = TOKEN.findall(text.lower())
    return Counter(words + [f"{a}_{b}" for a, b in zip(words, words[1:])])


class NaiveBayes:
    """Multinomial naive Bayes over :func:`features`, two classes, Laplace smoothing ``alpha``."""

    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = alpha
        self.counts = [Counter(), Counter()]
        self.docs = [0, 0]

    def fit(self, texts: list[str], labels: list[int]) -> "NaiveBayes":
        for text, y in zip(texts, labels):
            self.counts[y].update(features(text))
            self.docs[y] += 1
        self.vocab = set(self.counts[0]) | set(self.counts[1])
        self.totals = [sum(c.values()) for c in self.counts]
        return self

    def log_odds(self, text: str) -> float:
        """log P(negative | text) - log P(original | text)."""
        v = len(self.vocab) or 1
        score = math.log(max(self.docs[1], 1) / max(self.docs[0], 1))
        for f, n in features(text).items():
            if f not in self.vocab:
                continue
            p1 = (self.counts[1][f] + self.alpha) / (self.totals[1] + self.alpha * v)
            p0 = (self.counts[0][f] + self.alpha) / (self.totals[0] + self.alpha * v)
            score += n * (math.log(p1) - math.log(p0))
        return score

    def predict(self, text: str) -> int:
        return int(self.log_odds(text) > 0)


def held_out(caption_id: str, test_fraction: float, seed: int) -> bool:
    h = int.from_bytes(hashlib.sha256(f"{seed}\x00{caption_id}".encode()).digest()[:8], "little")
    return h / 2**64 < test_fraction


@dataclass
class Strength:
    """Held-out accuracy (%) of telling ``column`` from the caption by text alone."""

    column: str
    kind: str
    train_pairs: int
    test_pairs: int
    accuracy: float


def artefact_strength(rows: list[dict], column: str = "hard_negative", *, kind: str | None = None,
                      test_fraction: float = 0.2, seed: int = 0) -> Strength:
    """Train on the pairs (caption, ``column``) of most captions, score on the held-out rest.

    Each pair gives two texts (the caption, label 0; the edit, label 1); accuracy is over
    both texts of every held-out pair. Rows without ``column`` (or of another ``kind``) are
    skipped. Raises ValueError when either side has no pair."""
    pairs = [(r["caption_id"], r["caption"], r[column]) for r in rows
             if r.get(column) and r.get("caption") and (kind is None or r.get("kind") == kind)]
    train = [p for p in pairs if not held_out(str(p[0]), test_fraction, seed)]
    test = [p for p in pairs if held_out(str(p[0]), test_fraction, seed)]
    if not train or not test:
        raise ValueError(f"{column} ({kind or 'all kinds'}): {len(train)} training and {len(test)} held-out pairs; "
                         "need both")
    model = NaiveBayes().fit([t for _, c, e in train for t in (c, e)], [y for _ in train for y in (0, 1)])
    right = sum((model.predict(c) == 0) + (model.predict(e) == 1) for _, c, e in test)
    return Strength(column, kind or "all", len(train), len(test), round(100 * right / (2 * len(test)), 1))


def report(rows: list[dict], test_fraction: float = 0.2, seed: int = 0) -> list[Strength]:
    """Negatives and positives, all kinds and each kind that has enough pairs."""
    out = []
    for column in ("hard_negative", "hard_positive"):
        for kind in [None, *sorted({r.get("kind") for r in rows if r.get(column) and r.get("kind")})]:
            try:
                out.append(artefact_strength(rows, column, kind=kind, test_fraction=test_fraction, seed=seed))
            except ValueError:
                continue
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("triplets", help="a triplet file (.parquet/.jsonl, local or s3://)")
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = read_triplets(args.triplets)
    results = report(rows, args.test_fraction, args.seed)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
        return 0
    print("| text-only classifier: caption vs | kind | train pairs | held-out pairs | accuracy % (50 = no artefact) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r.column} | {r.kind} | {r.train_pairs} | {r.test_pairs} | {r.accuracy} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
