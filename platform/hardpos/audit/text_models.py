"""Text-only ("blind") models: how much a reader that never sees the image gets from the words.

The core of ``hardpos audit`` (:mod:`hardpos.audit.blind`), of the blind baselines beside every
evaluation and of ``hardpos debias`` (:mod:`hardpos.audit.baselines`), and of the calibration's
artefact probe (``python -m benchmarks.calibrate_artefacts``). No image, no pretrained text
model: what these models get right is certainly available without looking. Two kinds, as
SugarCrepe's refinement used two different kinds of text scorer (selecting against one kind
only fixes that kind):

* :class:`NgramClassifier` (``ngram_lr``), a classifier of *which captions are edits*: scikit-learn's
  ``LogisticRegression`` (lbfgs, L2 penalty) on the sparse counts of a caption's word n-grams
  1..``ngrams`` (:func:`hardpos.rules.textnorm.features`: lower case, punctuation split off,
  sentence boundaries ``<s>`` / ``</s>``). The penalty is given as ``l2``: the fit minimises the
  mean logistic loss plus ``l2 / 2 * ||w||^2`` (scikit-learn's ``C = 1 / (l2 * n)``; the
  bias is not penalised). ``steps`` caps the solver's iterations (``max_iter``).
* :class:`CaptionLM` (``caption_lm``), a model of *which captions are likely*: an n-gram
  language model (order ``order``, interpolated Kneser-Ney smoothing with one discount, an
  unknown word backed off to a uniform share) fitted on **original captions only**; a text's
  score is its log-probability (the sum over its tokens and ``</s>``). It has never seen an
  edit, so what it prefers is what ordinary captions look like. :class:`CharLM` is the same
  model over characters.

Cross-fitting (:func:`group_folds`): scikit-learn's ``GroupKFold`` with the groups shuffled by
``seed``, grouped by original caption (lower case, whitespace collapsed): a caption and every
edit of it fall in one fold, and every text is scored by a model fitted on the other folds
only, so no model is scored on a sentence whose twin it was trained on.

:func:`cross_validate` is the audit's measure for one set of (original, edit) pairs: the
one-caption accuracy per fold (each test fold holds every one of its pairs' originals and
edits: 50% is exactly chance) and, from the same fits, the **pair** verdict per pair (the
model scores the edit as more edit-like than its original: what a benchmark asks, which
caption of the pair is the right one; ties count against it). :func:`lm_pair_correct` is the
language model's pair verdict (the original more likely than the edit).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections import Counter
from collections.abc import Sequence

import numpy as np
from scipy import sparse
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold
from threadpoolctl import threadpool_limits

from hardpos.rules.textnorm import features


def caption_key(text: str) -> str:
    """The group of an original caption: lower case, whitespace collapsed."""
    return " ".join(text.lower().split())


# --------------------------------------------------------------------------- features
def vocabulary(texts: Sequence[str], ngrams: int) -> dict[str, int]:
    """Feature -> column, in order of first appearance (deterministic for a given ``texts``)."""
    vocab: dict[str, int] = {}
    for t in texts:
        for f in features(t, ngrams):
            vocab.setdefault(f, len(vocab))
    return vocab


def design(texts: Sequence[str], vocab: dict[str, int], ngrams: int) -> sparse.csr_matrix:
    """The sparse n-gram count matrix of ``texts`` over ``vocab`` (features outside it ignored)."""
    indptr, indices = [0], []
    for t in texts:
        indices.extend(j for j in map(vocab.get, features(t, ngrams)) if j is not None)
        indptr.append(len(indices))
    data = np.ones(len(indices), dtype=np.float64)
    x = sparse.csr_matrix((data, np.asarray(indices, dtype=np.int64), np.asarray(indptr, dtype=np.int64)),
                          shape=(len(texts), len(vocab)))
    x.sum_duplicates()  # repeated n-grams of one text become counts
    return x


def char_design(texts: Sequence[str], ngram_range: tuple[int, int] = (2, 5)) -> sparse.csr_matrix:
    """The sparse counts of the character n-grams of ``texts`` (lower case, within word
    boundaries: scikit-learn's ``char_wb``), vocabulary from ``texts`` themselves: the features
    of a third kind of classifier, which reads spelling and word pieces instead of words."""
    vec = CountVectorizer(analyzer="char_wb", ngram_range=ngram_range, lowercase=True, dtype=np.float64)
    return vec.fit_transform(list(texts)).tocsr()


# --------------------------------------------------------------------------- the classifier
def fit_design(x: sparse.spmatrix, labels: Sequence[int], *, l2: float = 1e-4, steps: int = 500) -> tuple[np.ndarray, float]:
    """(weights, bias) of the L2 logistic regression of ``labels`` (0/1) on the rows of ``x``
    (see the module doc for the penalty). A feature no row of ``x`` has keeps weight 0, so
    fitting on a design over a larger vocabulary equals fitting on the rows' own one. Raises
    ValueError for no rows, a length mismatch, a label other than 0/1, or one class only."""
    y = np.asarray(labels, dtype=np.int64)
    if x.shape[0] == 0 or x.shape[0] != len(y):
        raise ValueError(f"need as many labels as texts (> 0), got {x.shape[0]} texts and {len(y)} labels")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    if len(set(y.tolist())) < 2:
        raise ValueError("labels must hold both classes (0 and 1)")
    model = LogisticRegression(C=1.0 / (max(l2, 1e-12) * x.shape[0]), solver="lbfgs", max_iter=steps, tol=1e-6)
    # one BLAS thread: the fits are small and many, and BLAS threads spinning on a busy machine
    # made one fit 40x slower than on one thread
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)  # an iteration cap reached is the caller's setting
        model.fit(x, y)
    return model.coef_[0].astype(np.float64), float(model.intercept_[0])


@dataclasses.dataclass(frozen=True)
class NgramClassifier:
    """A fitted ``ngram_lr`` model: feature weights, bias, and the vocabulary that maps text to features."""

    vocab: dict[str, int]
    ngrams: int
    w: np.ndarray
    bias: float

    def scores(self, texts: Sequence[str]) -> np.ndarray:
        """The decision value of each text (> 0: called class 1)."""
        return design(texts, self.vocab, self.ngrams) @ self.w + self.bias


def fit_logistic(texts: Sequence[str], labels: Sequence[int], *, ngrams: int = 2, l2: float = 1e-4,
                 steps: int = 500) -> NgramClassifier:
    """The ``ngram_lr`` classifier of ``labels`` (0/1) on ``texts`` (vocabulary: the texts' own
    n-grams); the fit is :func:`fit_design`'s."""
    vocab = vocabulary(texts, ngrams)
    w, b = fit_design(design(texts, vocab, ngrams), labels, l2=l2, steps=steps)
    return NgramClassifier(vocab, ngrams, w, b)


# --------------------------------------------------------------------------- the language model
def lm_tokens(text: str, order: int) -> list[str]:
    """The tokens the language model reads: the classifier's words (its 1-gram features), with
    ``order - 1`` start marks and the end mark."""
    toks = features(text, 1)
    return ["<s>"] * (order - 2) + toks


class CaptionLM:
    """An interpolated Kneser-Ney word n-gram language model (see the module doc).

    ``order`` >= 1 (1: unigram counts), ``discount`` in (0, 1). Fitted by :meth:`fit` on
    captions; :meth:`logprob` is a text's natural-log probability (every token after the start
    marks, ``</s>`` included)."""

    def __init__(self, order: int = 2, discount: float = 0.75):
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if not 0.0 < discount < 1.0:
            raise ValueError(f"discount must be in (0, 1), got {discount}")
        self.order, self.discount = order, discount
        self.counts: list[dict[tuple[str, ...], float]] = []  # per order k (index k-1): k-gram -> (continuation) count
        self.context_total: list[dict[tuple[str, ...], float]] = []
        self.context_types: list[dict[tuple[str, ...], int]] = []
        self.vocab: set[str] = set()

    def tokens(self, text: str) -> list[str]:
        """What the model reads of ``text``: :func:`lm_tokens`, with ``max(order, 2) - 1`` start marks."""
        return lm_tokens(text, max(self.order, 2))

    def fit(self, texts: Sequence[str]) -> CaptionLM:
        """Count ``texts`` (original captions); returns self. Raises ValueError for no text."""
        if not texts:
            raise ValueError("a language model needs at least one caption")
        n = self.order
        top: Counter[tuple[str, ...]] = Counter()
        start = max(n, 2) - 1  # the first predicted token (after the start marks)
        for t in texts:
            toks = self.tokens(t)
            self.vocab.update(toks[start:])
            for i in range(start, len(toks)):
                top[tuple(toks[max(0, i - n + 1):i + 1])] += 1
        levels: list[dict[tuple[str, ...], float]] = [dict() for _ in range(n)]
        levels[n - 1] = dict(top)
        for k in range(n - 1, 0, -1):  # continuation counts: distinct words before each k-gram
            cont: Counter[tuple[str, ...]] = Counter()
            for gram in levels[k]:
                cont[gram[1:]] += 1
            levels[k - 1] = dict(cont)
        self.counts = levels
        self.context_total, self.context_types = [], []
        for level in levels:
            total: Counter[tuple[str, ...]] = Counter()
            types: Counter[tuple[str, ...]] = Counter()
            for gram, c in level.items():
                total[gram[:-1]] += c
                types[gram[:-1]] += 1
            self.context_total.append(dict(total))
            self.context_types.append(dict(types))
        return self

    def _prob(self, history: tuple[str, ...], word: str) -> float:
        d = self.discount
        p = 1.0 / (len(self.vocab) + 1)  # uniform, one share for an unknown word
        for k in range(1, len(history) + 2):  # from unigrams up to the full history
            ctx = history[len(history) - k + 1:] if k > 1 else ()
            total = self.context_total[k - 1].get(ctx, 0.0)
            if total <= 0:
                continue  # an unseen context: the lower order's estimate stands
            c = self.counts[k - 1].get(ctx + (word,), 0.0)
            p = max(c - d, 0.0) / total + d * self.context_types[k - 1][ctx] / total * p
        return p

    def logprob(self, texts: Sequence[str]) -> np.ndarray:
        """Each text's log-probability (natural log) under the model."""
        if not self.counts:
            raise ValueError("the language model is not fitted")
        n, start = self.order, max(self.order, 2) - 1
        out = np.empty(len(texts))
        for j, t in enumerate(texts):
            toks = self.tokens(t)
            out[j] = sum(math.log(self._prob(tuple(toks[max(0, i - n + 1):i]), toks[i])) for i in range(start, len(toks)))
        return out


class CharLM(CaptionLM):
    """The same interpolated Kneser-Ney model over the *characters* of a text (lower case,
    whitespace collapsed to one space, ``order - 1`` start marks and an end mark): a model of
    which spellings and word pieces a set of texts uses. ``hardpos debias`` fits one on true
    captions and one on edits and reads the ratio (``char_lm``, :mod:`hardpos.audit.baselines`)."""

    def tokens(self, text: str) -> list[str]:
        return ["<s>"] * (max(self.order, 2) - 1) + list(" ".join(text.lower().split())) + ["</s>"]


# --------------------------------------------------------------------------- cross-fitting
def group_folds(groups: Sequence[str], k: int, seed: int) -> list[int]:
    """The fold (0..k-1) of each item: scikit-learn's ``GroupKFold`` with the groups shuffled
    by ``seed``, so folds hold nearly equal numbers of items and a group never straddles two.
    Raises ValueError when there are fewer distinct groups than folds."""
    if k < 2:
        raise ValueError(f"folds must be >= 2, got {k}")
    n_groups = len(set(groups))
    if n_groups < k:
        raise ValueError(f"{n_groups} distinct original captions cannot fill {k} folds")
    fold = np.empty(len(groups), dtype=np.int64)
    splitter = GroupKFold(n_splits=k, shuffle=True, random_state=seed)
    for f, (_, test) in enumerate(splitter.split(np.zeros(len(groups)), groups=list(groups))):
        fold[test] = f
    return fold.tolist()


@dataclasses.dataclass(frozen=True)
class CrossValidation:
    """Held-out figures of one set of (original, edit) pairs.

    fold_accuracy: one-caption accuracy per fold (fractions); pair_correct: per pair, the
    held-out model scored the edit strictly more edit-like than its original; pairs / groups:
    what it was measured on."""

    fold_accuracy: list[float]
    pairs: int
    groups: int
    pair_correct: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def mean(self) -> float:
        return float(np.mean(self.fold_accuracy))

    @property
    def std(self) -> float:
        """Standard deviation over folds (population, ddof 0)."""
        return float(np.std(self.fold_accuracy))

    @property
    def pair_mean(self) -> float:
        return float(np.mean(self.pair_correct))


def _groups(originals: Sequence[str], groups: Sequence[str] | None) -> list[str]:
    return [caption_key(o) for o in originals] if groups is None else list(groups)


def cross_validate(originals: Sequence[str], edits: Sequence[str], *, groups: Sequence[str] | None = None,
                   folds: int = 5, seed: int = 0, ngrams: int = 2, l2: float = 1e-4, steps: int = 500) -> CrossValidation:
    """Grouped ``folds``-fold figures of the ``ngram_lr`` classifier telling ``edits[i]`` (1)
    from ``originals[i]`` (0): one-caption accuracy per fold and the pair verdict per pair.

    groups: the group of pair i (default: its original caption, :func:`caption_key`); pairs
        of one group always share a fold.
    Raises ValueError when the pair lists differ in length or there are fewer groups than folds."""
    if len(originals) != len(edits):
        raise ValueError(f"{len(originals)} originals but {len(edits)} edits")
    groups = _groups(originals, groups)
    fold_of = np.asarray(group_folds(groups, folds, seed))
    # one design over every text: features only test texts have get no weight in a fold's fit
    # (see fit_design), which is the same as building the vocabulary on the training folds
    x = design([*originals, *edits], vocabulary([*originals, *edits], ngrams), ngrams)
    n = len(originals)
    accs, pair = [], np.zeros(n, dtype=bool)
    for f in range(folds):
        train, test = np.flatnonzero(fold_of != f), np.flatnonzero(fold_of == f)
        w, b = fit_design(x[np.concatenate([train, n + train])], [0] * len(train) + [1] * len(train), l2=l2, steps=steps)
        s_orig, s_edit = x[test] @ w + b, x[n + test] @ w + b
        accs.append(float(np.concatenate([s_orig <= 0, s_edit > 0]).mean()))
        pair[test] = s_edit > s_orig
    return CrossValidation(accs, n, len(set(groups)), pair)


def lm_pair_correct(originals: Sequence[str], edits: Sequence[str], *, groups: Sequence[str] | None = None,
                    folds: int = 5, seed: int = 0, order: int = 2, discount: float = 0.75) -> np.ndarray:
    """Per pair: the ``caption_lm`` fitted on the other folds' distinct original captions finds
    the original strictly more likely than the edit (grouped folds as :func:`cross_validate`)."""
    if len(originals) != len(edits):
        raise ValueError(f"{len(originals)} originals but {len(edits)} edits")
    fold_of = np.asarray(group_folds(_groups(originals, groups), folds, seed))
    out = np.zeros(len(originals), dtype=bool)
    for f in range(folds):
        train = list(dict.fromkeys(originals[i] for i in np.flatnonzero(fold_of != f)))
        test = np.flatnonzero(fold_of == f)
        lm = CaptionLM(order, discount).fit(train)
        out[test] = lm.logprob([originals[i] for i in test]) > lm.logprob([edits[i] for i in test])
    return out
