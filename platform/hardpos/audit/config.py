"""The audit's configuration and names, free of the models themselves: what a stage's Config
needs (the CLI imports every stage's Config, and a mistake on the command line should not wait
for scikit-learn to load).

* :data:`MODELS`: the two kinds of text model (:mod:`hardpos.audit.text_models`);
  :data:`CHAR_LM`, the third that ``hardpos debias`` selects with; :data:`HELDOUT_MODEL`, the
  one it checks on.
* :data:`POLARITIES`, :data:`FORMATS`: the edits and the sources ``hardpos audit`` reads
  (its formats: the benchmark kinds of :data:`hardpos.eval.spec.BENCHMARK_KINDS`, the one
  list, and caption files with negatives).
* :class:`TextModelConfig`: the text models' settings and their cross-fitting, the one section
  (``text_models``) every stage that fits them takes: ``hardpos audit``, ``hardpos debias`` and
  the evaluate stage's blind baselines (``blind.text_models``).
* :class:`BlindSettings`: the blind baselines' settings (:mod:`hardpos.audit.baselines`).
"""
from __future__ import annotations

import dataclasses

from hardpos.config import require
from hardpos.eval.spec import BENCHMARK_KINDS

#: the two kinds of text model, by the names results carry: an n-gram classifier of which
#: captions are edits, and an n-gram language model of which captions are likely
MODELS = ("ngram_lr", "caption_lm")
#: the third kind ``hardpos debias`` selects with (not a blind baseline): the likelihood ratio of
#: two character n-gram language models, of true captions and of edits (a generative reader of
#: spelling, where the word models miss what a rare word's pieces give away)
CHAR_LM = "char_lm"
#: its n-gram order (characters)
CHAR_LM_ORDER = 3
#: the kinds ``hardpos debias`` balances, in order
SELECTION_MODELS = (*MODELS, CHAR_LM)
#: a kind kept out of any selection so that a selection can be checked on it: the
#: n-gram classifier on character n-grams instead of words
HELDOUT_MODEL = "char_lr"
POLARITIES = ("negative", "positive")
#: the sources the audit reads: any benchmark kind the evaluate stage reads, and caption files with negatives
FORMATS = ("auto", "captions", *BENCHMARK_KINDS)


@dataclasses.dataclass
class TextModelConfig:
    """The text-only models (:mod:`hardpos.audit.text_models`) and their cross-fitting: one
    section, so every stage that fits them has the same keys and defaults.

    folds: cross-fitting folds, grouped by original caption (every text is scored by models
        fitted on the other folds only).
    ngrams: the longest word n-gram the classifier reads (1: words only; 2: words and bigrams).
    l2: the classifier's L2 penalty (on the mean logistic loss, as l2/2 * |w|^2).
    steps: the classifier solver's iteration limit (scikit-learn's max_iter).
    order: the caption language model's n-gram order (2: bigrams).
    discount: the caption language model's Kneser-Ney discount, in (0, 1).
    """

    folds: int = 5
    ngrams: int = 2
    l2: float = 1e-4
    steps: int = 500
    order: int = 2
    discount: float = 0.75

    def __post_init__(self) -> None:
        require(self.folds >= 2, "folds", "must be >= 2", self.folds)
        require(self.ngrams >= 1, "ngrams", "must be >= 1", self.ngrams)
        require(self.l2 > 0, "l2", "must be > 0", self.l2)
        require(self.steps >= 1, "steps", "must be >= 1", self.steps)
        require(self.order >= 1, "order", "must be >= 1", self.order)
        require(0.0 < self.discount < 1.0, "discount", "must be in (0, 1)", self.discount)

    def describe(self, model: str) -> str:
        """What ``model`` is and how it was fit with these settings, in one line (results carry it)."""
        if model == "ngram_lr":
            return (f"word 1-{self.ngrams} gram logistic regression of true captions against hard negatives "
                    f"(scikit-learn lbfgs, l2={self.l2:g}), fitted on the other {self.folds - 1} of {self.folds} folds "
                    "grouped by original caption")
        if model == "caption_lm":
            return (f"word {self.order}-gram language model of the original captions (interpolated Kneser-Ney, "
                    f"discount {self.discount:g}), fitted on the other {self.folds - 1} of {self.folds} folds grouped by "
                    "original caption")
        if model == CHAR_LM:
            return (f"character {CHAR_LM_ORDER}-gram language models of the true captions and of the hard negatives "
                    f"(interpolated Kneser-Ney, discount {self.discount:g}), the log-likelihood ratio, fitted on the other "
                    f"{self.folds - 1} of {self.folds} folds grouped by original caption")
        if model == HELDOUT_MODEL:
            return (f"character 2-5 gram logistic regression of true captions against hard negatives (scikit-learn "
                    f"lbfgs, l2={self.l2:g}), fitted on the other {self.folds - 1} of {self.folds} folds grouped by "
                    "original caption")
        raise ValueError(f"unknown text model {model!r}; models: {[*MODELS, CHAR_LM, HELDOUT_MODEL]}")


@dataclasses.dataclass
class BlindSettings:
    """The blind baselines (text-only models, no image) computed beside a benchmark's figures.

    enabled: compute them (False: the stage reports none).
    models: which text models: "ngram_lr" (word n-gram logistic regression of true captions
        against hard negatives) and/or "caption_lm" (n-gram language model of the original
        captions).
    text_models: the models' settings and their cross-fitting folds (as in ``hardpos audit``
        and ``hardpos debias``).
    seed: the fold assignment.
    min_items: a subset with fewer items (or fewer distinct captions than folds) is listed,
        not measured.
    """

    enabled: bool = True
    models: list[str] = dataclasses.field(default_factory=lambda: list(MODELS))
    text_models: TextModelConfig = dataclasses.field(default_factory=TextModelConfig)
    seed: int = 0
    min_items: int = 20

    def __post_init__(self) -> None:
        require(bool(self.models) and set(self.models) <= set(MODELS), "models",
                f"must be a non-empty subset of {list(MODELS)}", self.models)
        require(self.min_items >= self.text_models.folds, "min_items",
                f"must be >= text_models.folds ({self.text_models.folds})", self.min_items)
