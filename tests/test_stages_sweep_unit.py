"""Search-space parsing, grid expansion, objective, Pareto front, the comparison table and
the one ranking of "best model" (no Ray)."""
import math
from types import SimpleNamespace

import pytest

from hardpos.config import ConfigError
from hardpos.models import registry
from hardpos.paper import table3
from hardpos.stages import compare, sweep

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
    assert compare.pareto_front(rows, {"aug": "max", "brittle": "min"}) == [1, 2, 3]


def test_comparison_table_shows_percentages():
    table = table3.comparison_table([{"loss.w_neg": 0.25, "replace/aug_acc": 0.555}],
                                    columns=[("w_neg", "loss.w_neg"), ("aug", "replace/aug_acc")])
    assert table.splitlines()[-1] == "| 0.25 | 55.5 |"


def test_comparison_of_runs_marks_the_pareto_front():
    rows = [{"run_name": "a", "param:loss.w_neg": 0.0, "objective": 0.5, "replace/brittleness": 0.2},
            {"run_name": "b", "param:loss.w_neg": 1.0, "objective": 0.6, "replace/brittleness": 0.1}]
    table, front = compare.compare_rows(rows, {"objective": "max", "replace/brittleness": "min"})
    assert front == [1]
    assert table.splitlines()[0] == "| run | w_neg | objective | REPLACE brittle | Pareto |"
    assert table.splitlines()[2:] == ["| a | 0 | 50.0 | 20.0 |  |", "| b | 1 | 60.0 | 10.0 | yes |"]


def _run(run_id, **metrics):
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id), data=SimpleNamespace(metrics=metrics))


def test_rank_best_first_ties_keep_the_given_order():
    rows = [{"run_id": "old", "objective": 0.5}, {"run_id": "best", "objective": 0.7}, {"run_id": "new", "objective": 0.5}]
    assert [r["run_id"] for r in registry.rank(rows, "objective")] == ["best", "old", "new"]
    assert [r["run_id"] for r in registry.rank(rows, "objective", "min")] == ["old", "new", "best"]
    # MLflow runs rank the same way as rows
    runs = [_run("old", objective=0.5), _run("new", objective=0.5)]
    assert [r.info.run_id for r in registry.rank(runs, "objective")] == ["old", "new"]


def test_rank_leaves_out_missing_nan_and_non_numbers():
    rows = [{"run_id": "nan", "objective": math.nan}, {"run_id": "none"}, {"run_id": "inf", "objective": math.inf},
            {"run_id": "text", "objective": "0.9"}, {"run_id": "flag", "objective": True},
            {"run_id": "ok", "objective": 0.1}, {"run_id": "int", "objective": 0}]
    assert [r["run_id"] for r in registry.rank(rows, "objective")] == ["ok", "int"]
    assert registry.rank([], "objective") == []
    with pytest.raises(ValueError, match="mode"):
        registry.rank(rows, "objective", "best")


def test_rank_by_name_is_the_demos_champion():
    table = {"pretrained": {"objective": 0.9}, "hn-only": {"objective": 0.6}, "hp+hn": {"objective": 0.6}}
    assert registry.rank(["hn-only", "hp+hn"], "objective", metrics_of=table.__getitem__)[0] == "hn-only"


def test_register_ranked_registers_champion_and_challenger(monkeypatch):
    calls = []
    monkeypatch.setattr(registry, "register", lambda client, run, name, alias, metric=None: calls.append(
        (run.info.run_id, name, alias)) or registry.Registered(name, str(len(calls)), run.info.run_id, alias, "u", None))
    client = SimpleNamespace(get_run=lambda run_id: _run(run_id))
    out = registry.register_ranked(client, [{"run_id": "a"}, {"run_id": "b"}, {"run_id": "c"}], "m", "champion", "challenger")
    assert calls == [("a", "m", "champion"), ("b", "m", "challenger")]
    assert out["model_uri"] == "models:/m@champion" and out["challenger"]["run_id"] == "b"
    calls.clear()
    out = registry.register_ranked(client, [_run("a"), _run("b")], "m", "champion", "")
    assert calls == [("a", "m", "champion")] and "challenger" not in out
    with pytest.raises(ValueError, match="no ranked run"):
        registry.register_ranked(client, [], "m")


def test_the_sweep_seed_and_log_level_reach_every_trial(monkeypatch):
    from pathlib import Path

    from hardpos import runtime
    from hardpos.config import load_config

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    module = runtime.stage_module("sweep")
    base = module.trial_base(load_config(module.Config, None, ["seed=7", "log_level=debug"]))
    assert base["seed"] == 7 and base["log_level"] == "debug"
    assert module.trial_train_config(base, {"loss.w_neg": 0.5}).seed == 7
    pinned = module.trial_base(load_config(module.Config, None, ["seed=7", 'train_overrides={"seed": 3}']))
    assert pinned["seed"] == 3  # an explicit train override wins
    assert module.trial_train_config(pinned, {"seed": 11}).seed == 11  # and a search-space seed per trial


def _train_base(workers: int = 1, cpus_per_worker: float = 0.5, decode_cpus=None):
    return SimpleNamespace(scaling=SimpleNamespace(num_workers=workers, cpus_per_worker=cpus_per_worker),
                           data=SimpleNamespace(decode_cpus=decode_cpus))


@pytest.mark.parametrize("cpus, driver, base, fit", [
    (2.0, 0.5, _train_base(), 1),                    # 0.5 + 0.5 leaves 1: a second trial would leave its decode 0
    (4.0, 0.5, _train_base(), 3),                    # 3 x 1.01
    (2.0, 0.25, _train_base(cpus_per_worker=0.25), 3),  # 3 x 0.51
    (2.0, 0.5, _train_base(decode_cpus=0.5), 1),     # set decode CPUs count in full
    (16.0, 0.5, _train_base(workers=2, cpus_per_worker=2.0), 3),
    (1.0, 0.5, _train_base(workers=2), 0),           # not even one (an autoscaling cluster before its nodes)
])
def test_trials_that_fit_leave_each_trial_cpu_for_its_decode_tasks(cpus, driver, base, fit):
    assert sweep.trials_that_fit(cpus, driver, base) == fit


def test_too_many_concurrent_trials_are_capped_and_said(capsys):
    cfg = SimpleNamespace(max_concurrent_trials=2, trial_driver_cpus=0.5)
    assert sweep.concurrent_trials(cfg, _train_base(), 2.0) == 1
    assert "max_concurrent_trials=2: the cluster's 2 CPUs hold 1 trial(s) at once (1 CPU each" in capsys.readouterr().err
    assert sweep.concurrent_trials(cfg, _train_base(), 4.0) == 2
    assert sweep.concurrent_trials(SimpleNamespace(max_concurrent_trials=3, trial_driver_cpus=0.5),
                                   _train_base(workers=2), 1.0) == 1  # none fits: one, decode waits for a node
    err = capsys.readouterr().err
    assert "hold no trial (its decode tasks wait" in err and err.count("running 1 at a time") == 1
