"""The documented ``serve run serve/config.yaml``, then ``serve status`` and ``serve shutdown``
against it, for real: three ``serve`` CLI subprocesses with free ports, stopped by PID.

Ray turns token authentication on for a local cluster when ``RAY_AUTH_MODE`` is unset, but
the ``serve status`` / ``serve shutdown`` processes then run with it disabled and are refused
("Authentication required ... RAY_AUTH_MODE is currently 'disabled'"). The documented
commands set ``RAY_AUTH_MODE=token`` in the shell that runs them all; the token is the one
Ray writes to ``~/.ray/auth_token`` (HOME is a temporary folder here).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from tests.support import free_port

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 420  # a fresh local Ray + Serve + one replica on a busy 2-core machine
DASHBOARD = re.compile(r"dashboard at \S*?(?:127\.0\.0\.1|localhost):(\d+)", re.IGNORECASE)


def _serve_cli() -> str:
    exe = Path(sys.executable).parent / "serve"
    return str(exe) if exe.exists() else "serve"


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C (serve run shuts Serve and its local Ray down), then harder, only our own child."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session serve run started in: its own processes only
            proc.wait(timeout=30)


def test_serve_status_and_shutdown_work_against_the_documented_serve_run(tmp_path):
    import requests

    config = yaml.safe_load((REPO / "serve" / "config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    args.update(model="random", arch="hardpos-tiny", reload_poll_s=0, auth_token_env="")
    args["model_deployment"]["num_cpus"] = 0.5
    deploy = tmp_path / "config.yaml"
    deploy.write_text(yaml.safe_dump(config))
    home = tmp_path / "home"
    home.mkdir()
    # Ray's own folder: short (its socket paths must fit 107 bytes), and this test's alone
    ray_tmp = tempfile.mkdtemp(prefix="hp-serve-")
    env = {**os.environ, "HOME": str(home), "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "token", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "serve-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([_serve_cli(), "run", str(deploy)], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, up = time.monotonic() + START_TIMEOUT_S, False
        while time.monotonic() < deadline and proc.poll() is None and not up:
            try:
                up = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
            except requests.RequestException:
                time.sleep(1)
        text = log.read_text(errors="replace")
        assert up, f"serve run did not come up (exit {proc.poll()}):\n{text[-3000:]}"
        found = DASHBOARD.search(text)
        assert found, f"no dashboard address in serve run's output:\n{text[-3000:]}"
        address = f"http://127.0.0.1:{found.group(1)}"
        assert (home / ".ray" / "auth_token").is_file()  # token auth is on, with Ray's own token

        status = subprocess.run([_serve_cli(), "status", "--address", address], env=env, capture_output=True,
                                text=True, timeout=180)
        assert status.returncode == 0, status.stdout + status.stderr
        apps = yaml.safe_load(status.stdout)["applications"]
        assert apps["hardpos"]["status"] == "RUNNING", status.stdout

        down = subprocess.run([_serve_cli(), "shutdown", "--address", address, "-y"], env=env, capture_output=True,
                              text=True, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "Authentication required" not in down.stdout + down.stderr
        deadline, gone = time.monotonic() + 120, False
        while time.monotonic() < deadline and not gone:
            try:
                gone = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code != 200
            except requests.RequestException:
                gone = True
            if not gone:
                time.sleep(1)
        assert gone, "the app still answers after serve shutdown"
    finally:
        _stop(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)
