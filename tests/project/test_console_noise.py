"""Ray's own noise stays off the default console and comes back with --verbose."""
from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hardpos import logs


def test_raylet_worker_start_warnings_are_dropped_unless_verbose(monkeypatch):
    sink = io.StringIO()
    monkeypatch.setattr(sys, "stdout", sink)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    logs.quiet_raylet("info")
    print("(raylet) WARNING: 18 PYTHON worker processes have been started on node: abc with address: x, which is 9x")
    print("[hardpos] train finished")
    assert sink.getvalue() == "[hardpos] train finished\n"
    logs.quiet_raylet("info")  # idempotent: not wrapped twice
    assert sys.stdout._stream is sink

    loud = io.StringIO()
    monkeypatch.setattr(sys, "stdout", loud)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    logs.quiet_raylet("debug")
    print("(raylet) WARNING: 18 PYTHON worker processes have been started on node: abc")
    assert "worker processes" in loud.getvalue()


def test_the_gcs_successful_kill_error_is_dropped_and_other_kill_failures_are_not(monkeypatch):
    """Ray's log monitor prints the GCS's error lines to the driver's stderr; the one that
    reports a kill whose socket closed (the kill succeeding) is dropped unless verbose."""
    kill = ("[2026-11-26 18:43:28,127 E 12944 12944] (gcs_server) gcs_actor_scheduler.cc:538: Failed to kill actor "
            "bde8e325896f45c89f5053d101000000, return status: Invalid: KillActor RPC failed for actor "
            "bde8e325896f45c89f5053d101000000: RpcError: RPC error: Socket closed rpc_code: 14")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", err)
    logs.quiet_raylet("info")
    print(kill, file=sys.stderr)
    print(kill.replace("Socket closed", "Deadline Exceeded"), file=sys.stderr)
    print("[hardpos] evaluate finished", file=sys.stderr)
    assert err.getvalue().splitlines() == [kill.replace("Socket closed", "Deadline Exceeded"),
                                           "[hardpos] evaluate finished"]

    loud = io.StringIO()
    monkeypatch.setattr(sys, "stderr", loud)
    logs.quiet_raylet("debug")
    print(kill, file=sys.stderr)
    assert loud.getvalue() == kill + "\n"


def test_rays_exclude_resources_deprecation_is_filtered_in_ray_processes():
    """The PYTHONWARNINGS entry Ray's processes inherit really silences the warning Ray Train
    triggers (checked in a child interpreter with that environment), and only unless verbose."""
    env = logs.ray_env("info")
    assert logs.ray_env("debug") == {}
    code = ("import warnings; warnings.warn('`ExecutionOptions.exclude_resources` is deprecated and will be removed', "
            "FutureWarning); warnings.warn('other', FutureWarning)")
    proc = subprocess.run([sys.executable, "-c", code], env={"PYTHONWARNINGS": env["PYTHONWARNINGS"]},
                          capture_output=True, text=True)
    # the warnings' own lines (Python 3.13 also prints the -c source line under each warning,
    # and that line names both messages)
    assert "FutureWarning: `ExecutionOptions.exclude_resources`" not in proc.stderr
    assert "FutureWarning: other" in proc.stderr


def test_no_nan_for_a_figure_that_does_not_exist():
    """No validation split: the train stage's line has no val/loss, not ``val/loss nan``."""
    from hardpos.train.stage import result_line

    assert result_line(2, {"loss/total": 1.5}, "/m") == "trained 2 steps; final loss/total 1.5000; model: /m"
    assert result_line(2, {"loss/total": 1.5, "val/loss": 1.25}, "/m") == \
        "trained 2 steps; final loss/total 1.5000, val/loss 1.2500; model: /m"
    assert "nan" not in result_line(0, {}, "/m")


def test_ray_datas_progress_bar_notice_is_dropped_by_the_quiet_config(tmp_path):
    """The quiet Ray Data logging config (read by every Ray process) drops the notice that
    progress bars are off, and keeps Ray Data's other warnings."""
    import logging
    import logging.config

    import yaml

    config = yaml.safe_load(logs.QUIET_RAY_DATA_CONFIG.read_text())
    config["handlers"]["console"] = {**config["handlers"]["console"], "class": "logging.StreamHandler",
                                     "stream": "ext://sys.stderr"}
    config["handlers"].pop("file")
    config["loggers"]["ray.data"]["handlers"] = ["console"]
    stream = io.StringIO()
    config["handlers"]["console"]["stream"] = stream
    config["handlers"]["console"].pop("stream")
    logging.config.dictConfig(config)
    logger = logging.getLogger("ray.data")
    handler = logger.handlers[0]
    handler.setStream(stream)
    try:
        logger.warning("Progress bars disabled. To enable, set `ray.data.DataContext...`")
        logger.warning("Progress bars for operators disabled. To enable, ...")
        logger.warning("a real problem")
    finally:
        logger.handlers.clear()
    assert stream.getvalue().splitlines()[-1].endswith("a real problem")
    assert "Progress bars" not in stream.getvalue()


def test_quiet_native_stderr_drops_only_ray_datas_actor_argument_line_at_the_fd():
    """Ray's C++ core worker writes past ``sys.stderr`` to fd 2: the filter sits on the fd,
    drops that one line (only for Ray Data's MapWorker actors) and keeps the rest in order."""
    noise = ("[2026-11-28 15:13:36,789 E 4462 4462] core_worker.cc:2465: Actor with class name: "
             "'MapWorker(MapBatches(HttpGenerate))' and ID: '299cf08ec195fc81000c1db001000000' has constructor "
             "arguments in the object store and max_restarts > 0. If the arguments in the object store go out of "
             "scope or are lost, the actor restart will fail.")
    other = noise.replace("MapWorker(MapBatches(HttpGenerate))", "Trainer")
    code = ("import os, sys\nfrom hardpos import logs\n"
            "with logs.quiet_native_stderr(sys.argv[1]):\n"
            "    os.write(2, (sys.argv[2] + '\\n').encode())\n"
            "    print('[generate] shard 0 done', file=sys.stderr, flush=True)\n"
            "    os.write(2, (sys.argv[3] + '\\n').encode())\n"
            "print('[hardpos] generate finished', file=sys.stderr)\n")
    quiet = subprocess.run([sys.executable, "-c", code, "info", noise, other], capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.splitlines() == ["[generate] shard 0 done", other, "[hardpos] generate finished"]
    loud = subprocess.run([sys.executable, "-c", code, "debug", noise, other], capture_output=True, text=True)
    assert loud.stderr.splitlines() == [noise, "[generate] shard 0 done", other, "[hardpos] generate finished"]


# A quiet console: no error-level line (Ray's C++ "E" lines, ERROR), no Python warning (Ray
# Data's UserWarnings), no Ray Data notice, no traceback.
NOISE = re.compile(r" E \d+ \d+\]|\bERROR\b|Warning\b|Progress bars disabled|Traceback")


@pytest.mark.integration  # a subprocess: the job as a user runs it, with its own local Ray
def test_the_http_engine_console_is_quiet_unless_verbose(tmp_path):
    """The generate job on the http engine prints its own lines only; --verbose brings
    Ray's back (the actor-argument line among them, so the quiet run's silence is the filter's)."""
    import json

    from tests.support.openai_stub import OpenAIStub

    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "caps.jsonl"
    src.write_text("".join(json.dumps({"caption": f"A man and a dog near a red car {i}."}) + "\n" for i in range(30)))
    consoles = {}
    with OpenAIStub() as stub:
        for mode in ("quiet", "verbose"):
            args = [f"input={src}", f"output_dir={tmp_path / mode}", "tracking.enabled=false", "engine.kind=http",
                    f"engine.http.url={stub.url}", "engine.http.model=stub-llm", "engine.http.retry_wait_s=0.01",
                    "prompts=chat", "shard_size=10", "ray.num_cpus=2", *(["--verbose"] if mode == "verbose" else [])]
            proc = subprocess.run([sys.executable, str(root / "jobs" / "generate.py"), *args], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=600)
            consoles[mode] = proc.stdout + proc.stderr
            assert proc.returncode == 0, consoles[mode][-4000:]
    lines = consoles["quiet"].splitlines()
    assert [line for line in lines if NOISE.search(line)] == [], consoles["quiet"][-4000:]
    assert any("[generate]" in line and "accepted" in line for line in lines)
    assert "has constructor arguments in the object store" in consoles["verbose"]
