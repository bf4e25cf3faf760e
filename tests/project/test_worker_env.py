"""No secret reaches a Ray worker's runtime_env (which the dashboard and job metadata show):
one function, :func:`hardpos.storage.worker_env`, decides what a worker gets from the driver,
and every runtime_env the package builds takes its variables from it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hardpos import storage

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "hardpos"
SECRETS = {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_SESSION_TOKEN": "t0k3n", "AWS_ACCESS_KEY_ID": "AKIA123",
           "AWS_SECURITY_TOKEN": "t", "MLFLOW_TRACKING_TOKEN": "m", "MLFLOW_TRACKING_PASSWORD": "p",
           "HF_TOKEN": "h", "OPENAI_API_KEY": "o"}


@pytest.fixture
def driver_env(monkeypatch, tmp_path):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HARDPOS_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_worker_env_forwards_locations_never_secrets(driver_env, monkeypatch):
    env = storage.worker_env()
    assert env["HARDPOS_S3_ENDPOINT_URL"] == "http://127.0.0.1:9000" and env["AWS_REGION"] == "eu-west-1"
    assert "AWS_SHARED_CREDENTIALS_FILE" in env and env["HF_HUB_OFFLINE"] == "1"  # where, not what
    assert not set(SECRETS) & set(env) and not any(v in env.values() for v in SECRETS.values())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:pw@mlflow:5000")  # a password inside a URI
    assert "MLFLOW_TRACKING_URI" not in storage.worker_env()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert storage.worker_env()["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert "MLFLOW_TRACKING_URI" not in storage.worker_env(include_tracking=False)


def test_the_allow_list_holds_no_secret_name():
    assert not [k for k in storage.WORKER_ENV + storage.TRACKING_ENV if storage.SECRET_NAME.search(k)]
    assert all(storage.SECRET_NAME.search(k) for k in SECRETS)


def test_every_runtime_env_the_package_builds_comes_from_worker_env():
    """Every ``"env_vars": X`` in the package: X is a ``worker_env(...)`` call, the name
    ``env`` that the trainer fills from ``worker_env(...)``, or the Serve app's
    ``model_replica_env(...)`` (constant values of Ray Serve's own switches, checked below)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "env_vars":
                    text = ast.unparse(value)
                    if ("worker_env(" not in text and not text.startswith("model_replica_env(")
                            and not (isinstance(value, ast.Name) and value.id == "env")):
                        offenders.append(f"{path.name}:{node.lineno}: {text}")
    assert offenders == []
    # the two places that pass `env` get it from worker_env
    assert "env=storage.worker_env(include_tracking=False)" in (PACKAGE / "train" / "trainer.py").read_text()
    assert "env = storage.worker_env()" in (PACKAGE / "train" / "trainer.py").read_text()


def test_the_serve_replicas_environment_holds_nothing_of_the_drivers(driver_env):
    from hardpos.serve.app import model_replica_env
    from hardpos.serve.config import BatchingConfig

    for forward_thread in (True, False):
        env = model_replica_env(BatchingConfig(forward_thread=forward_thread))
        assert not set(SECRETS) & set(env) and not set(SECRETS.values()) & set(env.values())
        assert set(env) <= {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"}
