"""Fault tolerance on a multi-node Ray cluster simulated on one machine (benchmarks.resilience).

The scenario run starts its own cluster (``ray.cluster_utils.Cluster``), so it runs in a
subprocess: the test session's own Ray (``ray_session``) stays untouched. The scenarios
are slow (each starts several raylets and kills one), hence ``slow``; the accounting they
report on is unit-tested here in the default suite.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks import child_env
from benchmarks.resilience import duplicated_steps, exactly_once, failover_stats, missing_steps

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- pure accounting
def test_duplicated_and_missing_steps():
    assert duplicated_steps([1, 2, 3, 3, 4, 4, 4]) == [3, 4]
    assert duplicated_steps([]) == []
    assert missing_steps([1, 2, 4], total=5) == [3, 5]
    assert missing_steps([2, 4], total=4, every=2) == []
    assert missing_steps([2], total=5, every=2) == [4, 5]  # the last step is always logged


def test_exactly_once_counts_lost_duplicate_and_unexpected_rows():
    r = exactly_once(["a", "b", "c", "d"], accepted_ids=["a", "b", "b"], rejected_ids=["c", "x"])
    assert r == {"expected": 4, "written": 5, "rows_lost": 1, "duplicates": 1, "unexpected": 1}
    assert exactly_once(["a"], ["a"], [])["rows_lost"] == 0


def test_failover_stats_around_a_kill():
    events = [(0.0, True), (1.0, True), (2.0, False), (2.5, True), (3.0, False), (4.0, True), (5.0, True)]
    s = failover_stats(events, kill_t=1.5)
    assert s == {"requests": 7, "ok_before_kill": 2, "failed_before_kill": 0, "requests_after_kill": 5,
                 "failed_during_failover": 2, "ok_after_recovery": 2, "recovered_after_s": 2.5}
    never = failover_stats([(0.0, True), (2.0, False)], kill_t=1.0)
    assert never["recovered_after_s"] is None and never["failed_during_failover"] == 1
    clean = failover_stats([(0.0, True), (2.0, True)], kill_t=1.0)
    assert clean["failed_during_failover"] == 0 and clean["recovered_after_s"] == 1.0


def test_a_scenario_refuses_to_share_an_existing_ray(ray_session):
    from benchmarks.simcluster import SimCluster

    with pytest.raises(RuntimeError, match="process without Ray"):
        SimCluster()


def test_scoped_environ_restores_the_callers_environment(monkeypatch):
    from benchmarks.simcluster import scoped_environ

    monkeypatch.setenv("HP_KEEP", "1")
    monkeypatch.setenv("HP_CHANGE", "before")
    monkeypatch.delenv("HP_NEW", raising=False)
    with scoped_environ(HP_CHANGE="inside", HP_NEW="x"):
        assert os.environ["HP_CHANGE"] == "inside" and os.environ["HP_NEW"] == "x"
        del os.environ["HP_KEEP"]
        os.environ["HP_ADDED_INSIDE"] = "y"
    assert os.environ["HP_KEEP"] == "1" and os.environ["HP_CHANGE"] == "before"
    assert "HP_NEW" not in os.environ and "HP_ADDED_INSIDE" not in os.environ


# --------------------------------------------------------------------------- the real thing
def _run_scenarios(tmp_path: Path, *names: str, timeout: int) -> dict:
    # A short private RAY_TMPDIR: unix socket paths must stay short, and the cluster's
    # address file must not replace another local Ray's.
    ray_tmp = tempfile.mkdtemp(prefix="hpres-", dir="/tmp")
    env = child_env({"RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"})
    env.pop("RAY_ADDRESS", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    out = tmp_path / "resilience"
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.resilience", str(out), *names, "--quick"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    summary_path = out / "summary.json"
    assert summary_path.is_file(), f"no summary.json (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(summary_path.read_text())


@pytest.mark.slow
def test_generate_survives_a_node_kill_with_every_row_exactly_once(tmp_path):
    s = _run_scenarios(tmp_path, "generate", timeout=540)["scenarios"]["generate"]
    assert s["failures_injected"] == 1, s
    assert s["recovered"] and s["conservation_ok"], s
    assert s["rows_lost"] == 0 and s["duplicates"] == 0 and s["duplicate_caption_ids"] == 0, s
    assert s["inputs"] == s["accepted"] + s["rejected"] > 0


@pytest.mark.slow
def test_train_resumes_from_the_last_checkpoint_after_a_node_kill(tmp_path):
    s = _run_scenarios(tmp_path, "train", timeout=900)["scenarios"]["train"]
    assert s["failures_injected"] == 1, s
    assert s["recovered"] and s["steps"] == s["expected_steps"], s
    # Killed in epoch 2 just as a mid-epoch checkpoint was written: the run resumes from the
    # last checkpoint Ray Train had committed (that one, or the end of epoch 1), never step 0.
    spe = s["expected_steps"] // 2
    assert s["killed_after_checkpoint"] > spe, s
    assert s["resumed_from_step"] is not None and spe <= s["resumed_from_step"] <= s["killed_after_checkpoint"], s
    assert s["mlflow_missing_steps"] == 0, s


@pytest.mark.slow
def test_serve_keeps_answering_after_a_replica_node_dies(tmp_path):
    s = _run_scenarios(tmp_path, "serve", timeout=540)["scenarios"]["serve"]
    if "skipped" in s:
        pytest.skip(s["skipped"])
    assert s["failures_injected"] == 1 and s["replicas_before"] == 2, s
    assert s["recovered"] and s["ok_after_recovery"] >= 20, s
    assert s["failed_before_kill"] == 0, s
