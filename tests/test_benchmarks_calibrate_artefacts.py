"""The artefact-strength probe: a text-only original-vs-negative classifier's held-out accuracy."""
from __future__ import annotations

import random

import pytest

from benchmarks.calibrate_artefacts import ArtefactConfig, artefact_strength
from hardpos.config import ConfigError
from hardpos.audit.text_models import features

COLORS, SHAPES = ["red", "blue", "green", "yellow"], ["circle", "square", "star"]


def _rows(n: int, marked: bool) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        c1, c2 = rng.sample(COLORS, 2)
        s1, s2 = rng.sample(SHAPES, 2)
        cap = f"a {c1} {s1} and a {c2} {s2}"
        # marked: every negative uses a word no caption uses (a detectable artefact);
        # unmarked: the negative swaps the colours, as likely a caption as the caption itself
        neg = f"a crimson {s1} and a {c2} {s2}" if marked else f"a {c2} {s1} and a {c1} {s2}"
        rows.append({"caption": cap, "hard_negative": neg, "hard_positive": f"a {c2} {s2} and a {c1} {s1}"})
    return rows


def test_a_marked_negative_is_detected_and_an_unmarked_one_is_not():
    marked = artefact_strength(_rows(400, marked=True))
    plain = artefact_strength(_rows(400, marked=False))
    assert marked["accuracy"] > 0.95
    assert 0.35 < plain["accuracy"] < 0.65
    assert marked["positives_called_negative"] < 0.2  # the positives carry no marker
    assert marked["n_train"] + marked["n_test"] == 400 and marked["n_test"] > 40


def test_features_and_bad_config():
    assert "a red" in features("A red circle", 2) and "<s>" in features("x", 1)
    with pytest.raises(ConfigError, match="test_fraction"):
        artefact_strength(_rows(10, True), ArtefactConfig(test_fraction=1.0))
    with pytest.raises(ValueError, match="both sides"):
        artefact_strength(_rows(1, True), ArtefactConfig(test_fraction=0.01))


def test_calibrate_seeds_reports_each_seeds_artefact_strength_under_its_table(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.calibrate import artefact_line, seed_artefacts

    for seed, marked in ((0, True), (1, True)):
        (tmp_path / f"seed{seed}" / "generate").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(_rows(400, marked)), tmp_path / f"seed{seed}" / "generate" / "triplets.parquet")
    found = [seed_artefacts(tmp_path / "seed0"), seed_artefacts(tmp_path / "seed1")]
    assert seed_artefacts(tmp_path / "absent") is None
    assert found[0]["words"]["accuracy"] > 0.95 and found[0]["bigrams"]["accuracy"] > 0.95
    line = artefact_line(found)
    assert line.startswith("Artefact strength of the finetuning negatives") and "words + bigrams: " in line
    assert f"words: {100 * found[0]['words']['accuracy']:.1f} ± 0.0%" in line  # same rows: no spread
