"""The documented ``serve run serve/config.yaml``, then ``serve status`` and ``serve shutdown``
against it, for real, behind each of Serve's ingresses (:mod:`tests.support.serve_run_check`).

Ray turns token authentication on for a local cluster when ``RAY_AUTH_MODE`` is unset, but
the ``serve status`` / ``serve shutdown`` processes then run with it disabled and are refused
("Authentication required ... RAY_AUTH_MODE is currently 'disabled'"). The documented
commands set ``RAY_AUTH_MODE=token`` in the shell that runs them all; the token is the one
Ray writes to ``~/.ray/auth_token`` (HOME is a temporary folder here).

Serve's HAProxy ingress (the documented default) binds HAProxy's stats and metrics ports on
every interface, so its run happens in a network namespace whose only interface is loopback
(``unshare --net``, root; CI runs as root).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

from tests.support.serve_run_check import check_documented_serve_run, loopback_namespace_unavailable

pytestmark = pytest.mark.integration


def test_serve_status_and_shutdown_work_against_the_documented_serve_run(tmp_path):
    report = check_documented_serve_run(tmp_path, ingress="proxy")
    assert report["ingress"] == "proxy" and report["status"] == "RUNNING" and report["shutdown"] == "app gone"
    assert len(report["scores"]) == 2 and all(-1.0 <= s <= 1.0 for s in report["scores"])
    assert report["bad_request"][0] == 400 and "image_b64" in report["bad_request"][1]


# slow: about 50 s, 30 of them `serve shutdown` waiting on HAProxy; the commands are the test
# above's, and HAProxy's ingress is in the default suite (test_serve_app's load generator behind it)
@pytest.mark.slow
@pytest.mark.skipif(loopback_namespace_unavailable() is not None,
                    reason=loopback_namespace_unavailable() or "")
def test_the_documented_serve_run_behind_haproxy_scores_and_shuts_down(tmp_path):
    """The same commands with ``RAY_SERVE_ENABLE_HA_PROXY=1``: HAProxy takes every request
    (its own count says so), the replica reports the ingress, the error bodies pass through
    unchanged, and ``serve shutdown`` takes HAProxy down with the app."""
    script = f"ip link set lo up && exec {sys.executable} -m tests.support.serve_run_check haproxy {tmp_path}"
    done = subprocess.run(["unshare", "--net", "sh", "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:] + (tmp_path / "serve-run.log").read_text(errors="replace")[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ingress"] == "haproxy" and report["status"] == "RUNNING" and report["shutdown"] == "app gone"
    assert len(report["scores"]) == 2 and all(-1.0 <= s <= 1.0 for s in report["scores"])
    assert report["bad_request"][0] == 400 and "image_b64" in report["bad_request"][1]
    # /healthz polls, the score, the bad request and /v1/model all crossed HAProxy's frontend
    assert report["haproxy_frontend_requests"] >= 4, report
    assert report["haproxy_after_shutdown"] == "gone", report
