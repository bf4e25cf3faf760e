"""benchmarks.serve_overhead: Serve's own cost per request against plain uvicorn, the same echo handler."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import requests

from benchmarks import REPO
from benchmarks.serve_overhead import (
    OverheadConfig,
    format_overhead,
    main,
    overhead_report,
    start_plain_echo,
)
from benchmarks.serve_compare import mean_ci, stop_plain
from hardpos.config import ConfigError, load_config


def test_the_config_refuses_what_cannot_be_measured(capsys):
    for bad in (["rounds=0"], ["seconds_per_round=0"], ["seconds_per_round=301"], ["warmup_requests=-1"],
                ["work_ms=-1"], ["work_ms=1001"], ["wait_ms=-1"]):
        with pytest.raises(ConfigError, match=bad[0].split("=")[0]):
            load_config(OverheadConfig, None, bad)
    assert main(["rounds=0"]) == 2 and "rounds must be >= 1" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "seconds_per_round" in capsys.readouterr().out
    assert load_config(OverheadConfig, None, ["rounds=3"]).rounds == 3
    assert OverheadConfig().path == "/echo" and OverheadConfig(work_ms=2.5).path == "/echo?work_ms=2.5"
    assert OverheadConfig(work_ms=1, wait_ms=5).path == "/echo?work_ms=1&wait_ms=5"


def test_the_plain_echo_answers_the_body_length_and_stops_by_its_pid(tmp_path):
    proc, url = start_plain_echo(None, tmp_path / "plain.log")
    try:
        assert url.startswith("http://127.0.0.1:")
        got = requests.post(f"{url}/echo", data=b'{"captions": ["a red circle"]}', timeout=10)
        assert got.status_code == 200 and got.json() == {"bytes": 30}
        assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
        # the handler's work: at least that much time before the answer; beyond the bound, 422
        started = time.perf_counter()
        assert requests.post(f"{url}/echo?work_ms=60", data=b"{}", timeout=10).json() == {"bytes": 2}
        assert time.perf_counter() - started >= 0.06
        started = time.perf_counter()
        assert requests.post(f"{url}/echo?wait_ms=60", data=b"{}", timeout=10).json() == {"bytes": 2}
        assert time.perf_counter() - started >= 0.06
        assert requests.post(f"{url}/echo?work_ms=1001", data=b"{}", timeout=10).status_code == 422
    finally:
        stop_plain(proc)
    assert proc.returncode is not None


def test_a_server_that_exits_at_start_is_named_with_its_output(tmp_path):
    from benchmarks.serve_compare import start_http_child

    args = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="the echo exited with 3: no such model"):
        start_http_child(args, 9, tmp_path / "echo.log", "the echo")


def _round(rps, p50, cpu):
    return {"requests_per_s": rps, "p50_ms": p50, "p99_ms": 2 * p50, "server_cpu_ms": cpu, "requests": 100,
            "errors": 0}


def test_the_report_pairs_the_rounds_and_says_what_serve_adds():
    rounds = {"serve": [_round(3000, 0.30, 0.25), _round(2800, 0.32, 0.27)],
              "plain": [_round(4000, 0.20, 0.10), _round(4200, 0.21, 0.11)]}
    out = overhead_report(rounds)
    assert out["serve"] == {"requests_per_s": 2900.0, "p50_ms": 0.31, "p99_ms": 0.62, "server_cpu_ms": 0.26,
                            "requests": 200, "errors": 0}
    assert out["cpu_ms_added"]["mean"] == pytest.approx(0.155)  # (0.15 + 0.16) / 2, paired round by round
    assert out["p50_ms_added"]["mean"] == pytest.approx(0.105)
    lo, hi = out["cpu_ms_added"]["ci95"]
    assert lo < 0.155 < hi and out["cpu_ms_added"]["std"] == pytest.approx(0.0071, abs=1e-4)
    assert out["serve_vs_plain"]["throughput_ratio"] == pytest.approx((0.75 + 2800 / 4200) / 2, abs=1e-3)
    text = format_overhead(out)
    assert "| serve | 2900.0 | 0.31 | 0.62 | 0.26 | 200 | 0 |" in text
    assert "+0.155 ± 0.007 (" in text and "0.71x [0.67, 0.75]" in text


def test_mean_ci_of_one_round_is_its_value_alone_and_rounds_as_asked():
    assert mean_ci([0.2]) == {"mean": 0.2} and mean_ci([]) == {"mean": None}
    assert mean_ci([1.0, 3.0])["ci95"][0] < 0 < 2.0 < mean_ci([1.0, 3.0])["ci95"][1]
    # two rounds: t(0.975, 1) = 12.706, so the half-width is 12.706 x 0.1414 / 1.414 = 1.271
    assert mean_ci([0.1, 0.3], digits=2) == {"mean": 0.2, "std": 0.14, "ci95": [-1.07, 1.47]}


@pytest.mark.slow
@pytest.mark.integration
def test_serve_overhead_measures_both_servers_side_by_side():
    """The script in a fresh process (its own local Ray with direct ingress): every request to
    both servers succeeds, each server's process CPU is measured, and Serve's cost is paired."""
    ray_tmp = tempfile.mkdtemp(prefix="hp-overhead-", dir="/tmp")  # short: AF_UNIX socket paths
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "benchmarks.serve_overhead", "rounds=2", "seconds_per_round=1", "warmup_requests=5"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(REPO))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| serve |" in done.stdout and "| plain |" in done.stdout
    result = json.loads(done.stdout[done.stdout.index("\n{") + 1:])
    for target in ("serve", "plain"):
        assert result[target]["errors"] == 0 and result[target]["requests"] > 10, result[target]
        assert all(r["server_cpu_ms"] > 0 for r in result["rounds"][target])
    assert len(result["rounds"]["serve"]) == 2 and result["cpu_ms_added"]["mean"] is not None
    assert 0 < result["serve_vs_plain"]["throughput_ratio"] < 10
