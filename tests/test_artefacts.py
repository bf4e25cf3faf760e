"""The artefact-strength probe: a text-only classifier finds an artefact that is there, and
finds none (chance) where original and edit are drawn from the same text distribution."""
from __future__ import annotations

import random

import pytest

from hardpos.perf.artefacts import NaiveBayes, artefact_strength, report

COLOURS = ["red", "blue", "green", "yellow", "white", "black"]
SHAPES = ["circle", "square", "star", "triangle"]


def _rows(n: int, negative, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        caption = f"a {rng.choice(COLOURS)} {rng.choice(SHAPES)} and a {rng.choice(COLOURS)} {rng.choice(SHAPES)}"
        rows.append({"caption_id": str(i), "caption": caption, "hard_negative": negative(caption, rng),
                     "hard_positive": None, "kind": "replace"})
    return rows


def test_an_edit_that_leaves_a_mark_is_detected():
    # every negative says "crimson", a word no caption uses: trivially detectable
    rows = _rows(600, lambda c, rng: c.replace(c.split()[1], "crimson", 1))
    s = artefact_strength(rows)
    assert s.accuracy > 95 and s.test_pairs > 80 and s.train_pairs + s.test_pairs == 600


def test_an_edit_from_the_same_distribution_is_at_chance():
    # the negative is just another caption of the same grammar: nothing marks it
    rows = _rows(1500, lambda c, rng: f"a {rng.choice(COLOURS)} {rng.choice(SHAPES)} and a "
                                      f"{rng.choice(COLOURS)} {rng.choice(SHAPES)}")
    assert abs(artefact_strength(rows).accuracy - 50) < 6


def test_held_out_split_is_by_caption_and_errors_are_named():
    rows = _rows(200, lambda c, rng: c + " again")
    a, b = artefact_strength(rows, seed=1), artefact_strength(rows, seed=1)
    assert a == b and artefact_strength(rows, seed=2).test_pairs != a.test_pairs
    with pytest.raises(ValueError, match="hard_positive"):
        artefact_strength(rows, "hard_positive")
    assert [r.column for r in report(rows)] == ["hard_negative", "hard_negative"]  # all kinds, then "replace"


def test_naive_bayes_log_odds_follow_the_counts():
    nb = NaiveBayes().fit(["a red circle", "a blue circle"], [0, 1])
    assert nb.log_odds("blue") > 0 > nb.log_odds("red") and nb.log_odds("circle") == pytest.approx(0.0)
