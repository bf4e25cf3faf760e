"""Artefact strength: can a text-only classifier tell a finetuning caption from its hard negative?

Hard negatives make a model brittle when "perturbation detection" alone lowers the loss: the
negative is recognisable from its text (an unusual word, an odd combination), so the model
learns that any edit is wrong. This tool measures how detectable the negatives are without
looking at any image: a logistic regression on bag-of-n-gram features of a single caption,
trained to say "original" (0) or "negative" (1) on a share of the triplets and scored on the
rest (a triplet's caption, negative and positive always fall on the same side). Its held-out
accuracy is the artefact strength (50% = undetectable). It also reports the share of hard
positives the classifier calls "negative" (how much the positives look like edits)::

    python -m benchmarks.calibrate_artefacts triplets=outputs/demo/generate/triplets.parquet

The classifier is the product's ``ngram_lr`` (:mod:`hardpos.audit.text_models`: scikit-learn's
logistic regression on word n-gram counts, also behind ``hardpos audit``, which cross-fits it
per kind of edit); this tool keeps its single hash split. Deterministic by seed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence

import numpy as np
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.config import ConfigError, load_config
from hardpos.audit.text_models import fit_logistic


@dataclasses.dataclass
class ArtefactConfig:
    """The artefact probe.

    triplets: a triplet file (parquet: caption, hard_negative, hard_positive), e.g. the
        generate stage's output on the finetune split.
    ngrams: the largest word n-gram used as a feature (1: bag of words).
    test_fraction: share of triplets held out (split by a hash of the caption and the seed).
    steps / l2: the logistic regression's iteration limit and L2 penalty (on the mean
        logistic loss, as l2/2 * |w|^2). 1e-2, stronger than the audit's 1e-4: a world's
        captions have about 100 word 1-2 grams, and with the lighter penalty the fit chased
        splits that did not hold out (colour prior 0.8, bigrams: 66.0% held out against
        74.7% at 1e-2).
    seed: the split.
    output: also write the result as JSON here.
    """

    triplets: str = "outputs/demo/generate/triplets.parquet"
    ngrams: int = 2
    test_fraction: float = 0.2
    steps: int = 500
    l2: float = 1e-2
    seed: int = 0
    output: str | None = None

    def validate(self) -> None:
        if self.ngrams < 1:
            raise ConfigError(f"ngrams must be >= 1, got {self.ngrams}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.steps < 1 or self.l2 <= 0:
            raise ConfigError("steps must be >= 1 and l2 > 0")


def _held_out(caption: str, seed: int, fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(f"{seed}:{caption}".encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def artefact_strength(rows: Sequence[dict], cfg: ArtefactConfig | None = None) -> dict[str, float]:
    """Train on ``rows`` (dicts with caption, hard_negative, optional hard_positive) and return
    ``{"accuracy", "positives_called_negative", "n_train", "n_test", "n_features"}``: the
    held-out accuracy of original-vs-negative (fractions). Rows without a negative are skipped.
    Raises ValueError when either side of the split has no triplet."""
    cfg = cfg or ArtefactConfig()
    cfg.validate()
    rows = [r for r in rows if r.get("hard_negative")]
    train = [r for r in rows if not _held_out(r["caption"], cfg.seed, cfg.test_fraction)]
    test = [r for r in rows if _held_out(r["caption"], cfg.seed, cfg.test_fraction)]
    if not train or not test:
        raise ValueError(f"need triplets on both sides of the split, got {len(train)} train / {len(test)} test")
    texts = [r["caption"] for r in train] + [r["hard_negative"] for r in train]
    model = fit_logistic(texts, [0] * len(train) + [1] * len(train), ngrams=cfg.ngrams, l2=cfg.l2, steps=cfg.steps)

    def called_negative(batch: Sequence[str]) -> np.ndarray:
        return model.scores(batch) > 0

    right = np.concatenate([~called_negative([r["caption"] for r in test]),
                            called_negative([r["hard_negative"] for r in test])])
    positives = [r["hard_positive"] for r in test if r.get("hard_positive")]
    return {"accuracy": float(right.mean()),
            "positives_called_negative": float(called_negative(positives).mean()) if positives else float("nan"),
            "n_train": len(train), "n_test": len(test), "n_features": len(model.vocab)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cfg = load_config(ArtefactConfig, None, argv)
    cfg.validate()
    if not storage.exists(cfg.triplets):
        raise ConfigError(f"triplets={cfg.triplets}: no such file (run the generate stage first)")
    rows = pq.read_table(storage.local_copy(cfg.triplets), columns=["caption", "hard_negative", "hard_positive"]).to_pylist()
    result = artefact_strength(rows, cfg)
    print(f"artefact strength: {100 * result['accuracy']:.1f}% held-out original-vs-negative accuracy "
          f"({result['n_test']} test triplets, {result['n_features']} features); hard positives called negative: "
          f"{100 * result['positives_called_negative']:.1f}%")
    if cfg.output:
        storage.write_text(cfg.output, json.dumps({"config": dataclasses.asdict(cfg), **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
