"""The paper's package: the demo's results in the Table-1 layout beside the paper's own figures,
and the mean ± std over seeds (pure, no Ray). The checks are tests/test_paper_confirm.py's."""
from __future__ import annotations

import pytest

from hardpos.paper import figures, table1


def _row(**cells) -> dict[str, float]:
    """A demo row: every REPLACE/SWAP/subset figure 0.5, then ``cells`` (double underscores for slashes)."""
    row = {c: 0.5 for c in table1.COLUMNS + table1.SUBSET_COLUMNS}
    row.update({k.replace("__", "/"): v for k, v in cells.items()})
    return row


def _rows() -> dict[str, dict[str, float]]:
    return {"pretrained": _row(replace__orig_acc=0.60), "captions-only": _row(), "hn-only": _row(swap__orig_acc=0.72),
            "w_neg=0": _row(), "w_neg=0.5": _row()}


def test_the_printed_table_keeps_the_papers_numbers_beside_the_testbeds():
    md = table1.markdown_table(_rows(), title="t")
    assert md.startswith("### t\n") and "| pretrained | 60.0 |" in md
    paper = md.split("The paper's numbers for these models")[1].split("Mean cosine")[0]
    assert "| CLIP ViT-B/32 | 61.6 | 46.8 | 23.2 | 60.5 | 49.6 | 21.7 |" in paper
    assert "| hn-only | 73.9 | 55.7 | 21.0 | 74.3 | 60.5 | 25.1 |" in paper
    assert "| w_neg=0.5 | 67.3 | 56.9 | 16.4 | 72.5 | 60.5 | 22.8 |" in paper  # Table 3 on both benchmarks
    assert "| w_neg=0 | 58.5 | 49.8 | 15.8 | 64.1 | 51.2 | 25.0 |" in paper
    assert "captions-only" not in paper  # the paper has no such row
    assert table1.paper_markdown({"mine": {}, "w_neg=x": {}}) == ""  # no paper row, and no crash on a non-grid name
    assert figures.paper_figures("HN-only", "swap") == (74.3, 60.5, 25.1)
    assert figures.paper_figures("w_neg=0.5", "swap") == (72.5, 60.5, 22.8)
    assert figures.paper_figures("captions-only", "swap") is None


def test_replace_with_the_seen_synonyms_is_a_row_figure_and_a_table_when_evaluated():
    metrics = {f"{p}/{f}": 0.5 for p in ("world_replace_attribute", "world_replace_relation", "world_swap")
               for f in table1.FIGURES}
    assert "replace_seen/aug_acc" not in table1.table_row(metrics)  # a world made without the seen subsets
    metrics.update({f"{p}/{f}": v for p, v in (("world_replace_attribute_seen", 0.8), ("world_replace_relation_seen", 0.6))
                    for f in table1.FIGURES})
    row = table1.table_row(metrics)
    assert row["replace_seen/aug_acc"] == pytest.approx(0.7) and row["replace/aug_acc"] == pytest.approx(0.5)
    md = table1.markdown_table({"m": row})
    assert "REPLACE with the synonyms finetuning saw" in md and "| m | 70.0 | 70.0 | 70.0 |" in md
    with pytest.raises(KeyError, match="world_swap/orig_acc"):
        table1.table_row({k: v for k, v in metrics.items() if k != "world_swap/orig_acc"})


def test_aggregate_is_the_mean_and_sample_std_over_seeds_of_models_every_seed_has():
    seeds = [{"a": {"x": 0.1, "y": 1.0}, "b": {"x": 0.0}}, {"a": {"x": 0.3, "y": 3.0}}]
    mean, std = figures.aggregate(seeds)
    assert list(mean) == ["a"] and mean["a"] == pytest.approx({"x": 0.2, "y": 2.0})
    assert std["a"]["x"] == pytest.approx(0.1414213, abs=1e-6)
    with pytest.raises(ValueError, match="no seeds"):
        figures.aggregate([])


def test_the_paired_test_needs_two_seeds_and_is_one_sided():
    with pytest.raises(ValueError, match="at least 2"):
        figures.paired_test([1.0])
    up, down = figures.paired_test([1.0, 2.0, 3.0]), figures.paired_test([-1.0, -2.0, -3.0])
    assert up.p == pytest.approx(1 - down.p) and up.p < 0.05 < down.p
