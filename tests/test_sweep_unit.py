"""Search-space parsing, grid expansion, objective and Pareto front (no Ray)."""
import pytest

from hardpos import sweep
from hardpos.config import ConfigError

PAPER_SPACE = {"loss.w_neg": {"grid_search": [0.0, 0.25, 0.5, 0.75, 1.0]}, "loss.w_pos": 1.0}
HN_ONLY = [{"loss.w_pos": 0.0, "loss.w_neg": 1.0}]


def test_paper_grid_plus_hn_only_control():
    grid, sampled, constant = sweep.split_search_space(PAPER_SPACE)
    points = sweep.grid_points(grid, constant, HN_ONLY)
    assert points == [
        {"loss.w_pos": 1.0, "loss.w_neg": 0.0},
        {"loss.w_pos": 1.0, "loss.w_neg": 0.25},
        {"loss.w_pos": 1.0, "loss.w_neg": 0.5},
        {"loss.w_pos": 1.0, "loss.w_neg": 0.75},
        {"loss.w_pos": 1.0, "loss.w_neg": 1.0},
        {"loss.w_pos": 0.0, "loss.w_neg": 1.0},
    ]
    assert sampled == {}


def test_grid_product_and_samplers():
    space = {"a": {"grid_search": [1, 2]}, "b": {"grid_search": ["x", "y"]}, "lr": {"loguniform": [1e-6, 1e-4]}, "bs": {"choice": [8, 16]}}
    grid, sampled, constant = sweep.split_search_space(space)
    assert len(sweep.grid_points(grid, constant, [])) == 4
    assert sampled == {"lr": ("loguniform", [1e-6, 1e-4]), "bs": ("choice", [8, 16])}
    tune_space = sweep.to_tune_space(space, [])
    assert set(tune_space) == {"overrides", "lr", "bs"}
    assert sweep.trial_overrides({"overrides": {"a": 1}, "lr": 3e-5}) == {"a": 1, "lr": 3e-5}


@pytest.mark.parametrize("space, message", [
    ({"a": {"grid_search": []}}, "non-empty list"),
    ({"a": {"loguniform": [0, 1]}}, "must be > 0"),
    ({"a": {"uniform": [1]}}, "needs [low, high]"),
    ({"a": {"normal": [0, 1]}}, "unknown search kind 'normal'"),
])
def test_bad_search_spaces(space, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sweep.split_search_space(space)


def test_objective_needs_every_term():
    assert sweep.objective({"replace/aug_acc": 0.5, "swap/aug_acc": 0.7}, ["replace/aug_acc", "swap/aug_acc"]) == pytest.approx(0.6)
    assert sweep.objective({"replace/aug_acc": 0.5}, ["replace/aug_acc", "swap/aug_acc"]) is None
    assert sweep.objective({"a": float("nan")}, ["a"]) is None


def test_pareto_front_max_aug_min_brittleness():
    rows = [
        {"aug": 0.60, "brittle": 0.10},  # dominated by row 2
        {"aug": 0.70, "brittle": 0.20},  # best aug
        {"aug": 0.65, "brittle": 0.05},  # best brittleness
        {"aug": 0.65, "brittle": 0.05},  # a tie is not domination
        {"aug": None, "brittle": 0.0},   # incomplete: left out
    ]
    assert sweep.pareto_front(rows, {"aug": "max", "brittle": "min"}) == [1, 2, 3]


def test_comparison_table_shows_percentages():
    table = sweep.comparison_table([{"loss.w_neg": 0.25, "replace/aug_acc": 0.555}], [("w_neg", "loss.w_neg"), ("aug", "replace/aug_acc")])
    assert table.splitlines()[-1] == "| 0.25 | 55.5 |"
