"""The paper's metrics (original / augmented accuracy, brittleness) on hand-built score triples: every strict
ordering of (s_c, s_n, s_p), every tie, NaN positives, and subset averaging."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hardpos.eval import metrics
from hardpos.eval.metrics import benchmark_metrics

# (s_c, s_n, s_p) -> (orig correct, aug correct, brittle)
CASES = [
    # the six strict orderings
    ((0.9, 0.1, 0.5), (1, 1, 0)),  # c > p > n
    ((0.5, 0.1, 0.9), (1, 1, 0)),  # p > c > n
    ((0.9, 0.5, 0.1), (1, 0, 1)),  # c > n > p   brittle: the positive lost to the negative
    ((0.1, 0.5, 0.9), (0, 0, 1)),  # p > n > c   brittle the other way
    ((0.5, 0.9, 0.1), (0, 0, 0)),  # n > c > p
    ((0.1, 0.9, 0.5), (0, 0, 0)),  # n > p > c
    # ties count against the model and are never "brittle" (the negative is not strictly between)
    ((0.5, 0.5, 0.1), (0, 0, 0)),  # c == n > p
    ((0.5, 0.5, 0.9), (0, 0, 0)),  # c == n < p
    ((0.9, 0.5, 0.5), (1, 0, 0)),  # p == n < c
    ((0.1, 0.5, 0.5), (0, 0, 0)),  # p == n > c
    ((0.9, 0.1, 0.9), (1, 1, 0)),  # c == p > n
    ((0.1, 0.9, 0.1), (0, 0, 0)),  # c == p < n
    ((0.5, 0.5, 0.5), (0, 0, 0)),  # all equal
]


@pytest.mark.parametrize("triple,expected", CASES)
def test_each_ordering_and_tie(triple, expected):
    c, n, p = ([v] for v in triple)
    assert (int(metrics.orig_correct(c, n)[0]), int(metrics.aug_correct(c, n, p)[0]), int(metrics.brittle(c, n, p)[0])) == expected
    figs = metrics.summarize(c, n, p)
    assert (figs["orig_acc"], figs["aug_acc"], figs["brittleness"]) == tuple(float(e) for e in expected)
    assert figs["aug_drop"] == figs["aug_acc"] - figs["orig_acc"]


def test_summary_over_all_cases_counts_exactly():
    c, n, p = (np.array([t[0][k] for t in CASES]) for k in range(3))
    figs = metrics.summarize(c, n, p)
    exp = np.array([e for _, e in CASES])
    assert figs["n_items"] == len(CASES)
    assert figs["orig_acc"] == pytest.approx(exp[:, 0].sum() / len(CASES))  # 5 / 13
    assert figs["aug_acc"] == pytest.approx(3 / 13)
    assert figs["brittleness"] == pytest.approx(2 / 13)
    assert figs["aug_drop"] == pytest.approx(3 / 13 - 5 / 13)
    assert figs["mean_s_c"] == pytest.approx(c.mean())
    assert figs["mean_s_n"] == pytest.approx(n.mean())
    assert figs["mean_s_p"] == pytest.approx(p.mean())


def test_no_positives_gives_original_figures_only():
    figs = metrics.summarize([0.9, 0.2], [0.1, 0.3])
    assert figs == {"n_items": 2, "orig_acc": 0.5, "mean_s_c": pytest.approx(0.55), "mean_s_n": pytest.approx(0.2)}


def test_partial_positives_use_like_for_like_items():
    # item 0: c>p>n (aug ok); item 1: c>n, no positive; item 2: n>c, no positive
    figs = metrics.summarize([0.9, 0.9, 0.1], [0.1, 0.1, 0.9], [0.5, math.nan, math.nan])
    assert figs["orig_acc"] == pytest.approx(2 / 3)
    assert figs["aug_acc"] == 1.0 and figs["brittleness"] == 0.0 and figs["aug_drop"] == 0.0
    assert figs["mean_s_p"] == 0.5 and figs["n_with_positive"] == 1


def test_empty_and_bad_inputs():
    assert metrics.summarize([], [], []) == {"n_items": 0}
    with pytest.raises(ValueError, match="differ in length"):
        metrics.summarize([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="finite"):
        metrics.summarize([math.nan], [0.1])


def test_mean_of_subsets_is_unweighted():
    a = metrics.summarize([0.9], [0.1], [0.5])                 # 1 item: all correct
    b = metrics.summarize([0.1, 0.1, 0.1], [0.9, 0.9, 0.9], [0.5, 0.5, 0.5])  # 3 items: all wrong
    avg = metrics.mean_of([a, b])
    assert avg["orig_acc"] == 0.5 and avg["aug_acc"] == 0.5  # not 1/4: subsets weigh equally
    assert avg["n_items"] == 4
    assert metrics.mean_of([]) == {"n_items": 0}


def test_benchmark_metrics_names_and_aggregation():
    subsets = ["attributes", "attributes", "relations"]
    s_c, s_n, s_p = [0.9, 0.1, 0.9], [0.1, 0.9, 0.5], [0.5, 0.5, 0.1]
    out = benchmark_metrics("replace", subsets, s_c, s_n, s_p, "mean_of_subsets")
    assert out["replace/attributes/orig_acc"] == 0.5 and out["replace/relations/orig_acc"] == 1.0
    assert out["replace/orig_acc"] == 0.75  # unweighted mean of 0.5 and 1.0
    assert out["replace/relations/brittleness"] == 1.0 and out["replace/brittleness"] == 0.5
    assert out["replace/n_items"] == 3
    for key in metrics.METRICS_WITH_POSITIVES:
        assert f"replace/{key}" in out
    pooled = benchmark_metrics("custom", subsets, s_c, s_n, s_p, "pooled")
    assert pooled["custom/orig_acc"] == pytest.approx(2 / 3)
    single = benchmark_metrics("swap", ["swap"] * 3, s_c, s_n, s_p, "pooled")
    assert not any(k.startswith("swap/swap/") for k in single)  # no redundant one-subset copy


def test_mean_over_flat_benchmarks_is_the_evaluators_replace():
    """The demo's REPLACE (flat per-benchmark keys) equals the evaluator's mean_of_subsets."""
    subsets = ["attributes", "attributes", "relations"]
    s_c, s_n, s_p = [0.9, 0.1, 0.9], [0.1, 0.9, 0.5], [0.5, 0.5, 0.1]
    nested = benchmark_metrics("replace", subsets, s_c, s_n, s_p, "mean_of_subsets")
    flat = {**benchmark_metrics("a", subsets[:2], s_c[:2], s_n[:2], s_p[:2], "pooled"),
            **benchmark_metrics("r", subsets[2:], s_c[2:], s_n[2:], s_p[2:], "pooled")}
    got = metrics.mean_over(flat, ["a", "r"])
    for key in ("orig_acc", "aug_acc", "brittleness", "mean_s_c", "mean_s_n", "mean_s_p", "n_items"):
        assert got[key] == pytest.approx(nested[f"replace/{key}"]), key
    # without counts every subset still counts (and no count is invented)
    got = metrics.mean_over({"a/orig_acc": 0.5, "r/orig_acc": 1.0, "a/x/orig_acc": 0.0}, ["a", "r"])
    assert got == {"orig_acc": 0.75}
    with pytest.raises(KeyError, match="'r/...'"):
        metrics.mean_over({"a/orig_acc": 0.5}, ["a", "r"])


@pytest.mark.parametrize("s_c, s_n, s_p, want", [
    (0.9, 0.5, 0.8, (True, True, False)),
    (0.9, 0.5, 0.4, (True, False, True)),
    (0.5, 0.5, 0.9, (False, False, False)),   # a tie counts against the model
    (0.9, 0.5, None, (True, None, None)),     # no positive: unknown, not False
])
def test_item_verdicts(s_c, s_n, s_p, want):
    got = metrics.verdicts(s_c, s_n, s_p)
    assert (got["correct_original"], got["correct_augmented"], got["brittle"]) == want
    assert all(v is None or type(v) is bool for v in got.values())
