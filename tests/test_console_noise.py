"""Ray's own noise stays off the default console and comes back with --verbose."""
from __future__ import annotations

import io
import subprocess
import sys

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
