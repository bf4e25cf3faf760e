"""Stages submitted the way users run them on a cluster: the real ``ray job submit`` CLI
against a real local Ray with its job server (dashboard) on 127.0.0.1.

Two entrypoints are checked in one cluster: ``python jobs/<stage>.py`` with ``--working-dir``
(the source tree's fallback finds the package), and ``python -m hardpos <stage>`` with the
package shipped through ``runtime_env.py_modules``, where the job's ``hardpos`` is the
uploaded copy, not an installed one.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support import free_port

pytestmark = pytest.mark.integration  # a Ray cluster and its job server in a subprocess

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).parent / "ray"


def _wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {seconds:.0f} s")


def _submit(address: str, working_dir: Path, entrypoint: list[str], env: dict, runtime_env: dict | None = None):
    cmd = [str(RAY), "job", "submit", "--address", address, "--working-dir", str(working_dir)]
    if runtime_env:
        cmd += ["--runtime-env-json", json.dumps(runtime_env)]
    deadline = time.monotonic() + 120
    while True:
        res = subprocess.run([*cmd, "--", *entrypoint], env=env, capture_output=True, text=True, timeout=240)
        # the job server answers before its node agent is up (seconds on a loaded machine): Ray says "try again later"
        if "No available agent to submit job" not in res.stderr + res.stdout or time.monotonic() > deadline:
            return res
        time.sleep(3)


@pytest.fixture
def job_cluster(tmp_path):
    """A local Ray head (``ray start --head --block``) with its job server on 127.0.0.1,
    stopped by SIGTERM to that one process, which stops what it started (never ``ray stop``).

    Every port is a free one: the suite's own Ray runs beside it, and a second Ray on a default
    port (the dashboard agent's 52365 above all) has no agent, so every submission would be
    answered "No available agent to submit job"."""
    port, gcs_port, agent_port, client_port = free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    temp = Path(env.get("RAY_TMPDIR", "/tmp")) / f"hp-jobs-{port}"  # short: Unix socket paths
    cmd = [str(RAY), "start", "--head", "--block", f"--port={gcs_port}", "--num-cpus=1", "--include-dashboard=true",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={port}", f"--dashboard-agent-listen-port={agent_port}",
           f"--ray-client-server-port={client_port}", f"--temp-dir={temp}", "--disable-usage-stats"]
    log = tmp_path / "ray-start.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            _wait_for(f"http://127.0.0.1:{port}/api/version", 90)
        except TimeoutError:
            raise RuntimeError(f"ray start did not bring up the job server:\n{log.read_text()[-3000:]}") from None
        yield f"http://127.0.0.1:{port}", env
    finally:
        proc.terminate()  # SIGTERM: `ray start --block` stops the processes it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what this fixture started
            proc.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_job_submit_runs_a_stage_both_ways(job_cluster, tmp_path):
    address, env = job_cluster
    # what a user's checkout uploads: the job entrypoints and the package source
    work = tmp_path / "checkout"
    shutil.copytree(REPO / "jobs", work / "jobs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "platform", work / "platform", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (work / "where.py").write_text("import hardpos\nprint('HARDPOS_FROM', hardpos.__file__)\n")
    small = ["n_pretrain=12", "n_finetune=6", "n_benchmark=6"]

    out1 = tmp_path / "via-jobs"
    res = _submit(address, work, ["python", "jobs/world.py", *small, f"output_dir={out1}"], env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads((out1 / "summary.json").read_text())["status"] == "ok"

    modules = {"py_modules": [str(work / "platform" / "hardpos")]}
    out2 = tmp_path / "via-module"
    res = _submit(address, work, ["python", "-m", "hardpos", "world", *small, f"output_dir={out2}"], env, modules)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((out2 / "summary.json").read_text())
    assert summary["status"] == "ok"
    # the same world from the same config, whichever entrypoint made it
    assert json.loads((out1 / "world.json").read_text())["config"] == json.loads((out2 / "world.json").read_text())["config"]
    assert pq.read_table(out1 / "pretrain.parquet").equals(pq.read_table(out2 / "pretrain.parquet"))

    res = _submit(address, work, ["python", "where.py"], env, modules)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    where = next(line for line in res.stdout.splitlines() if line.startswith("HARDPOS_FROM"))
    assert "runtime_resources" in where and str(REPO) not in where, where  # the uploaded copy ran
