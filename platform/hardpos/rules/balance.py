"""Picks whose words give nothing away: n-gram balance between a caption set and its edits.

A hard negative teaches an image-text model something only if the image is needed to reject
it. A text-only reader spots an edit from words that are more frequent among edits than among
captions: if the rules pick "white" as a replacement colour more often than the captions use
it, "white" itself becomes a sign of an edited caption. ``hardpos audit`` measures this with a
logistic regression on word 1-2 grams; SugarCrepe removed such shortcuts from its benchmark by
adversarial refinement.

:class:`NgramBalance` removes them from the rule engine's picks by construction. It keeps the
running difference, per word n-gram (the audit reader's features: :func:`hardpos.rules.textnorm.features`),
between the counts in the picked edits and in their captions. Each pick, inside the REPLACE /
SWAP family the perturber drew, takes the candidate that moves that difference closest to zero
(the smallest increase of its L1 norm; ties go to the seeded draw). Over a caption set the
edits then carry the captions' own n-gram counts: a colour is inserted about as often as it is
removed, an unlikely preposition is not preferred, and no linear reader of n-gram counts finds
a direction in which edits and captions differ on average.

Why not simply pick the candidate a fitted blind reader scores least edited-looking: tried on
the 4,839 NegCLIP captions, that concentrated the picks on a few common words (the attribute
negatives then got *easier* to spot, 73.8% -> 77.8%), a new artefact. Balancing the counts
cannot concentrate: a word picked too often turns its own balance against it.

Contract: deterministic for a given sequence of picks; a caption set's picks depend on the
order the captions are picked in, which the perturb stage fixes by a seeded shuffle.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from hardpos.rules.textnorm import features


class NgramBalance:
    """Running ``sum over picks of counts(edit) - counts(caption)`` per word n-gram (1..``ngrams``)."""

    def __init__(self, ngrams: int = 2):
        if ngrams < 1:
            raise ValueError(f"ngrams must be >= 1, got {ngrams}")
        self.ngrams = ngrams
        self.diff: Counter[str] = Counter()
        self.picks = 0

    def delta(self, caption: str, edit: str) -> Counter[str]:
        """The signed n-gram counts ``edit`` adds over ``caption`` (zeros dropped)."""
        d = Counter(features(edit, self.ngrams))
        d.subtract(features(caption, self.ngrams))
        return Counter({f: v for f, v in d.items() if v})

    def cost(self, caption: str, edit: str) -> int:
        """How much picking ``edit`` would grow the imbalance (the L1 norm's change; can be < 0)."""
        diff = self.diff
        return sum(abs(diff[f] + v) - abs(diff[f]) for f, v in self.delta(caption, edit).items())

    def add(self, caption: str, edit: str) -> None:
        """Count ``edit`` as picked for ``caption``."""
        for f, v in self.delta(caption, edit).items():
            self.diff[f] += v
            if not self.diff[f]:
                del self.diff[f]
        self.picks += 1

    def best(self, caption: str, edits: Iterable[str], default: str) -> str:
        """The edit among ``edits`` with the lowest :meth:`cost`; ``default`` (the seeded draw)
        wins ties, then the order of ``edits``."""
        options = list(edits)
        return min(options, key=lambda e: (self.cost(caption, e), e != default))

    @property
    def imbalance(self) -> float:
        """The L1 norm of the running difference per pick (0 when nothing was picked)."""
        return sum(abs(v) for v in self.diff.values()) / self.picks if self.picks else 0.0
