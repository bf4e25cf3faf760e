"""A blind text classifier: how well can a caption's text alone tell an edit from its original?

The core of ``hardpos audit`` (:mod:`hardpos.audit.blind`) and of the calibration's
artefact probe (``python -m benchmarks.calibrate_artefacts``). Pure numpy, deterministic,
no image and no pretrained text model: a model that only sees words is the weakest "blind"
reader, so what it detects is certainly detectable without the image.

* Features (:func:`features`): the word n-grams 1..``ngrams`` of one lower-cased caption, with
  the caption's boundaries (``"<s> a"``, ``"dog </s>"``), punctuation split off words, as
  counts. An artefact at either end of a caption ("... a pair of ski") or a word the originals
  never use shows up as a feature.
* Model (:func:`fit_logistic`): logistic regression, the mean logistic loss plus
  ``l2 / 2 * ||w||^2`` (the bias is not penalised), minimised by full-batch gradient descent
  on a sparse design (:class:`Design`). ``lr=None`` takes steps of ``1 / L`` (``L`` bounds the
  loss's curvature, from a power iteration) with Nesterov momentum restarted whenever it
  overshoots: converged in a few hundred steps on 30,000 captions. A fixed ``lr`` runs plain
  gradient descent at that rate (the calibration tool's documented setting).
* Evaluation (:func:`cross_validate`): ``k``-fold cross-validation *grouped* by original
  caption: a caption and every edit of it fall in the same fold, so the classifier is never
  scored on a sentence whose twin it was trained on. Each test fold holds every one of its
  pairs' originals (label 0) and edits (label 1): 50% is exactly blind chance. The vocabulary
  is built on the training folds only.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from hardpos.rules.textnorm import features

def vocabulary(texts: Sequence[str], ngrams: int) -> dict[str, int]:
    """Feature -> column, in order of first appearance (deterministic for a given ``texts``)."""
    vocab: dict[str, int] = {}
    for t in texts:
        for f in features(t, ngrams):
            vocab.setdefault(f, len(vocab))
    return vocab


@dataclasses.dataclass(frozen=True)
class Design:
    """A sparse count matrix (coordinate form) plus an implicit bias column.

    rows / cols / vals: one entry per (text, feature) with its count; n_rows texts,
    n_cols features (the bias is not among them)."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    n_rows: int
    n_cols: int

    @classmethod
    def of(cls, texts: Sequence[str], vocab: dict[str, int], ngrams: int) -> "Design":
        """The design of ``texts`` over ``vocab``; features outside it are ignored."""
        rows: list[int] = []
        cols: list[int] = []
        for r, t in enumerate(texts):
            js = [j for j in map(vocab.get, features(t, ngrams)) if j is not None]
            rows.extend([r] * len(js))
            cols.extend(js)
        if not rows:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, np.zeros(0), len(texts), len(vocab))
        # merge repeated (row, col) entries into counts
        key = np.asarray(rows, dtype=np.int64) * max(len(vocab), 1) + np.asarray(cols, dtype=np.int64)
        uniq, counts = np.unique(key, return_counts=True)
        n = max(len(vocab), 1)
        return cls(uniq // n, uniq % n, counts.astype(np.float64), len(texts), len(vocab))

    def take(self, keep: Sequence[int]) -> "Design":
        """The rows ``keep`` (in that order) as a design of their own."""
        new = np.full(self.n_rows, -1, dtype=np.int64)
        new[np.asarray(keep, dtype=np.int64)] = np.arange(len(keep))
        sel = new[self.rows] >= 0
        return Design(new[self.rows[sel]], self.cols[sel], self.vals[sel], len(keep), self.n_cols)

    def dot(self, w: np.ndarray, bias: float) -> np.ndarray:
        """``X @ w + bias`` (one score per text)."""
        return np.bincount(self.rows, weights=self.vals * w[self.cols], minlength=self.n_rows) + bias

    def tdot(self, r: np.ndarray) -> np.ndarray:
        """``X.T @ r`` (one value per feature)."""
        return np.bincount(self.cols, weights=self.vals * r[self.rows], minlength=self.n_cols)


@dataclasses.dataclass(frozen=True)
class Logistic:
    """A fitted model: feature weights, bias, and the vocabulary that maps text to features."""

    vocab: dict[str, int]
    ngrams: int
    w: np.ndarray
    bias: float

    def scores(self, texts: Sequence[str]) -> np.ndarray:
        """The decision value of each text (> 0: called an edit)."""
        return Design.of(texts, self.vocab, self.ngrams).dot(self.w, self.bias)


def _curvature(x: Design, iters: int = 30) -> float:
    """An upper estimate of the largest eigenvalue of ``[X 1]^T [X 1] / n`` (power iteration,
    with a margin: the estimate approaches the true value from below)."""
    v = np.ones(x.n_cols + 1) / np.sqrt(x.n_cols + 1)
    lam = 1.0
    for _ in range(iters):
        xv = x.dot(v[:-1], v[-1])
        u = np.append(x.tdot(xv), xv.sum()) / x.n_rows
        lam = float(np.sqrt((u * u).sum()))  # not np.linalg.norm: BLAS threads spin on a busy machine
        if lam == 0.0:
            return 1.0
        v = u / lam
    return 1.2 * lam


def fit_design(x: Design, labels: Sequence[int], *, l2: float = 1e-4, steps: int = 300,
               lr: float | None = None) -> tuple[np.ndarray, float]:
    """(weights, bias) of the logistic regression of ``labels`` (0/1) on the design ``x``.

    Minimises the mean logistic loss + ``l2 / 2 * ||w||^2`` by full-batch gradient descent,
    ``steps`` steps from zero: ``lr=None`` -> accelerated steps of ``1 / L`` (see the module
    doc); a number -> plain steps of that size. A feature no row of ``x`` has keeps weight 0,
    so fitting on a design over a larger vocabulary equals fitting on the rows' own one.
    Raises ValueError for no rows, a length mismatch or a label other than 0/1."""
    y = np.asarray(labels, dtype=np.float64)
    if x.n_rows == 0 or x.n_rows != len(y):
        raise ValueError(f"need as many labels as texts (> 0), got {x.n_rows} texts and {len(y)} labels")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("labels must be 0 or 1")
    n = x.n_rows

    def grad(w: np.ndarray, b: float) -> tuple[np.ndarray, float]:
        p = 1.0 / (1.0 + np.exp(-x.dot(w, b)))
        r = (p - y) / n
        return x.tdot(r) + l2 * w, float(r.sum())

    w, b = np.zeros(x.n_cols), 0.0
    if lr is not None:
        for _ in range(steps):
            gw, gb = grad(w, b)
            w, b = w - lr * gw, b - lr * gb
        return w, b
    step = 1.0 / (0.25 * _curvature(x) + l2)
    yw, yb, t = w.copy(), b, 1.0  # the look-ahead point of Nesterov's method
    for _ in range(steps):
        gw, gb = grad(yw, yb)
        w_new, b_new = yw - step * gw, yb - step * gb
        if float((gw * (w_new - w)).sum()) + gb * (b_new - b) > 0:  # moving uphill: drop the momentum
            t = 1.0
        t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
        mom = (t - 1.0) / t_new
        yw, yb = w_new + mom * (w_new - w), b_new + mom * (b_new - b)
        w, b, t = w_new, b_new, t_new
    return w, b


def fit_logistic(texts: Sequence[str], labels: Sequence[int], *, ngrams: int = 2, l2: float = 1e-4,
                 steps: int = 300, lr: float | None = None) -> Logistic:
    """Logistic regression of ``labels`` (0/1) on the n-gram counts of ``texts`` (vocabulary:
    the texts' own features); the fit is :func:`fit_design`'s."""
    vocab = vocabulary(texts, ngrams)
    w, b = fit_design(Design.of(texts, vocab, ngrams), labels, l2=l2, steps=steps, lr=lr)
    return Logistic(vocab, ngrams, w, b)


def group_folds(groups: Sequence[str], k: int, seed: int) -> list[int]:
    """The fold (0..k-1) of each item: its group's, groups shuffled by ``seed`` and dealt out
    in turn, so folds hold nearly equal numbers of groups and a group never straddles two."""
    keys = sorted(set(groups))
    random.Random(seed).shuffle(keys)
    fold = {g: i % k for i, g in enumerate(keys)}
    return [fold[g] for g in groups]


@dataclasses.dataclass(frozen=True)
class CrossValidation:
    """Held-out accuracy per fold (fractions) and what it was measured on."""

    fold_accuracy: list[float]
    pairs: int
    groups: int

    @property
    def mean(self) -> float:
        return float(np.mean(self.fold_accuracy))

    @property
    def std(self) -> float:
        """Standard deviation over folds (population, ddof 0)."""
        return float(np.std(self.fold_accuracy))


def cross_validate(originals: Sequence[str], edits: Sequence[str], *, groups: Sequence[str] | None = None,
                   folds: int = 5, seed: int = 0, ngrams: int = 2, l2: float = 1e-4, steps: int = 300,
                   lr: float | None = None) -> CrossValidation:
    """Grouped ``folds``-fold accuracy of telling ``edits[i]`` (1) from ``originals[i]`` (0).

    groups: the group of pair i (default: its original caption, lower case, whitespace
        collapsed); pairs of one group always share a fold.
    Raises ValueError when the pair lists differ in length or there are fewer groups than folds."""
    if len(originals) != len(edits):
        raise ValueError(f"{len(originals)} originals but {len(edits)} edits")
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    if groups is None:
        groups = [" ".join(o.lower().split()) for o in originals]
    n_groups = len(set(groups))
    if n_groups < folds:
        raise ValueError(f"{n_groups} distinct original captions cannot fill {folds} folds")
    fold_of = group_folds(groups, folds, seed)
    # one design over every text: features only test texts have get no weight in a fold's fit
    # (see fit_design), which is the same as building the vocabulary on the training folds
    x = Design.of([*originals, *edits], vocabulary([*originals, *edits], ngrams), ngrams)
    n = len(originals)
    accs = []
    for f in range(folds):
        train = [i for i, g in enumerate(fold_of) if g != f]
        test = [i for i, g in enumerate(fold_of) if g == f]
        w, b = fit_design(x.take(train + [n + i for i in train]), [0] * len(train) + [1] * len(train),
                          l2=l2, steps=steps, lr=lr)
        s = x.take(test + [n + i for i in test]).dot(w, b)
        right = np.concatenate([s[:len(test)] <= 0, s[len(test):] > 0])
        accs.append(float(right.mean()))
    return CrossValidation(accs, len(originals), n_groups)
