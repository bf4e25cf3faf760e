"""Shared fixtures: one local Ray per test session, a moto S3 server on 127.0.0.1, a real
``mlflow server``, a throwaway MLflow SQLite store, and the real reference data.

Unit vs integration: a test that uses Ray, a server or a subprocess is an integration test.
Tests that use one of :data:`INTEGRATION_FIXTURES` (directly or through another fixture)
are marked ``integration`` here; the few that start one themselves carry the mark in their
file. ``make test-unit`` (``-m "not integration and not slow and not gpu"``) runs the rest.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.support import free_port
from tests.support.mlflow_server import LocalMlflowServer

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("HARDPOS_SHARED_DATA", REPO.parent / "shared" / "data"))
# Fixtures that start Ray, a server or a subprocess: their users are integration tests.
INTEGRATION_FIXTURES = frozenset({"ray_session", "s3_server", "s3_env", "mlflow_server"})


def pytest_configure(config):
    """The ``browser`` mark: tests that drive a real headless Chromium (tests/test_explorer.py).

    Also the S3 credentials of moto's server, as a cluster provides them: a credentials file
    named by ``AWS_SHARED_CREDENTIALS_FILE`` in the environment every Ray process starts
    with (HardPos never copies secrets into a worker's runtime_env, so a worker finds them
    through the standard AWS chain, as on a real cluster)."""
    if not os.environ.get("AWS_SHARED_CREDENTIALS_FILE"):
        creds = Path(tempfile.mkdtemp(prefix="hardpos-aws-")) / "credentials"
        creds.write_text("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
    # Ray Data reads each Parquet file's footer on a pool of FooterReader actors, 32 by default
    # (for listing many files on a large cluster): every read of the suite's one small file would
    # start 32 actor processes on the 2-CPU session, about 3 s of each Ray Train run's start-up.
    # One actor reads the footers the same way. Set here so every Ray the tests start inherits it.
    os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
    # Ray Train's controller polls its workers every 2 s, so a run's start and end each wait up
    # to a poll: a quarter second makes a short two-worker run 1.5-3 s faster (about 10%, side by
    # side on an idle 2-core machine) and changes nothing a test checks.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
    config.addinivalue_line("markers", "browser: drives a real headless Chromium (skips without one unless "
                                       "HARDPOS_REQUIRE_BROWSER is set, then fails)")


def pytest_collection_modifyitems(config, items):
    """Mark every test that needs Ray, a server or a subprocess through a fixture ``integration``."""
    for item in items:
        if INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (the team's copy of the public benchmark files)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data folder {SHARED_DATA} is absent (team-only; set HARDPOS_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray shared by the whole session (starting one costs ~5 s). Never `ray stop`."""
    import ray

    started = False
    if not ray.is_initialized():
        # Idle worker processes are kept (up to 6, for 10 min) instead of Ray's default (as many
        # as CPUs, 1 s): the suite's many short runs then find workers that have imported torch and
        # open_clip already; a short two-worker Ray Train run after the first: 14 s instead of
        # 19 s (side by side on an idle 2-core machine).
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _system_config={"num_workers_soft_limit": 6, "idle_worker_killing_time_threshold_ms": 600_000})
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a real HTTP endpoint, not in-process patching)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Point the storage layer at moto; returns a fresh bucket name.

    Credentials come from the credentials file :func:`pytest_configure` set up, not from
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``."""
    import uuid

    import boto3

    from hardpos import storage

    monkeypatch.setenv("HARDPOS_S3_ENDPOINT_URL", s3_server)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    storage._s3_filesystem.cache_clear()
    bucket = f"hardpos-{uuid.uuid4().hex[:10]}"
    # the product never creates buckets (an operator does); the test does, as that operator
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield bucket
    storage._s3_filesystem.cache_clear()


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    """A private MLflow SQLite store for one test (also exported as MLFLOW_TRACKING_URI)."""
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # MLflow's process-global tracking URI beats the env var once anything sets it; start
    # each test unset (so the env var rules) and undo whatever the test sets.
    monkeypatch.setattr(mlflow_uri, "_tracking_uri", None)
    return uri


@pytest.fixture
def mlflow_server(tmp_path, monkeypatch):
    """A real ``mlflow server`` on 127.0.0.1 (sqlite store under tmp_path), also exported as
    $MLFLOW_TRACKING_URI; the test may crash and restart it by PID. Killed afterwards."""
    srv = LocalMlflowServer(tmp_path / "mlflow")
    srv.start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", srv.url)
    yield srv
    srv.kill()
