"""Ray's own noise stays off the default console and comes back with --verbose."""
from __future__ import annotations

import io
import subprocess
import sys

from hardpos import logs


def test_raylet_worker_start_warnings_are_dropped_unless_verbose(monkeypatch):
    sink = io.StringIO()
    monkeypatch.setattr(sys, "stdout", sink)
    logs.quiet_raylet("info")
    print("(raylet) WARNING: 18 PYTHON worker processes have been started on node: abc with address: x, which is 9x")
    print("[hardpos] train finished")
    assert sink.getvalue() == "[hardpos] train finished\n"
    logs.quiet_raylet("info")  # idempotent: not wrapped twice
    assert sys.stdout._stream is sink

    loud = io.StringIO()
    monkeypatch.setattr(sys, "stdout", loud)
    logs.quiet_raylet("debug")
    print("(raylet) WARNING: 18 PYTHON worker processes have been started on node: abc")
    assert "worker processes" in loud.getvalue()


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
