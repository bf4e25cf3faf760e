"""No secret in any record: URI passwords, secret query values and header values read ``***``
in params, tags, config.yaml, summary.json, the tracking journal and the console
(:mod:`hardpos.tracking.redact`). The integration test runs a real stage against a real
``mlflow server`` with a password in the tracking URI and greps every file and log line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hardpos.tracking.redact import MASK, is_redacted, redact, redact_text, secret_key

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "pw-Zq81-never-recorded"


@pytest.mark.parametrize("text, expected", [
    ("postgresql://mlflow:s3cr%40t@db:5432/mlflow", "postgresql://mlflow:***@db:5432/mlflow"),
    ("postgresql+psycopg://u:p@ss@h/db", "postgresql+psycopg://u:***@h/db"),  # an unencoded '@' in the password
    ("see http://u:p@h:5000/x?token=abc&a=1 there", "see http://u:***@h:5000/x?token=***&a=1 there"),
    ("https://b.s3/k?X-Amz-Signature=ff&X-Amz-Credential=AK%2F1&v=2", "https://b.s3/k?X-Amz-Signature=***&X-Amz-Credential=***&v=2"),
    ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
    ("http://127.0.0.1:5000/runs/a@b", "http://127.0.0.1:5000/runs/a@b"),  # '@' in a path is no user-info
    ("s3://bucket/key=value/x", "s3://bucket/key=value/x"),
])
def test_redact_text(text, expected):
    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # idempotent


def test_redact_structures_by_key_and_value():
    cfg = {"engine": {"http": {"base_url": f"http://svc:{PASSWORD}@llm:8000/v1", "api_key_env": "OPENAI_API_KEY",
                               "headers": {"Authorization": "Bearer abc", "X-Api-Key": "k", "Accept": "json"},
                               "max_tokens": 64}},
           "env": {"AWS_SECRET_ACCESS_KEY": "zz", "AWS_REGION": "us-east-1"},
           "serve": {"reload_token": "2"}, "list": [f"u:{PASSWORD}", ("http://a:b@h",)], "n": 3}
    out = redact(cfg)
    http = out["engine"]["http"]
    assert http["base_url"] == "http://svc:***@llm:8000/v1"
    assert http["headers"] == {"Authorization": MASK, "X-Api-Key": MASK, "Accept": "json"}
    assert http["api_key_env"] == "OPENAI_API_KEY" and http["max_tokens"] == 64  # names and counts stay
    assert out["env"] == {"AWS_SECRET_ACCESS_KEY": MASK, "AWS_REGION": "us-east-1"}
    assert out["serve"]["reload_token"] == "2" and out["n"] == 3
    assert out["list"] == [f"u:{PASSWORD}", ("http://a:***@h",)]  # not a URI: stays; a tuple stays a tuple
    assert cfg["engine"]["http"]["headers"]["Authorization"] == "Bearer abc"  # a copy: the job keeps the real value
    assert secret_key("db_password") and secret_key("Proxy-Authorization") and not secret_key("auth_token_env")
    assert is_redacted("postgresql://u:***@h/db") and not is_redacted("postgresql://u:p@h/db")


def test_run_logger_records_are_redacted(tmp_path, tracking_uri):
    """Every caller's params, tags and JSON artifacts (a sweep trial's train config, the
    demo's tags) go through the logger, which redacts them before the journal."""
    from hardpos import tracking
    from hardpos.config import TrackingConfig

    run = tracking.start_run(TrackingConfig(tracking_uri=tracking_uri, experiment="redact"), "r",
                             spill_dir=str(tmp_path / "spill"))
    run.log_params({"tracking": {"tracking_uri": f"postgresql://mlflow:{PASSWORD}@db/mlflow"}})
    run.set_tags({"hardpos.endpoint": f"http://k:{PASSWORD}@s3:9000"})
    run.log_json({"headers": {"Authorization": PASSWORD}}, "x.json")
    tracking.end_run(run)
    from mlflow.tracking import MlflowClient

    data = MlflowClient(tracking_uri).get_run(run.run_id).data
    assert data.params["tracking.tracking_uri"] == "postgresql://mlflow:***@db/mlflow"
    assert data.tags["hardpos.endpoint"] == "http://k:***@s3:9000"
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]


def _grep(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_a_stage_with_a_password_in_its_tracking_uri_records_none(tmp_path, mlflow_server):
    """A real `world` job against a real `mlflow server` whose URI carries user:password (the
    server ignores the basic-auth header): params, config.yaml, summary.json, the MLflow store
    and artifacts, and the console show ***. Then the same with the server down and
    tracking.required=false: the journal left for replay names the server without the
    password, and `hardpos track replay` with $MLFLOW_TRACKING_URI delivers it."""
    host = mlflow_server.url.split("://", 1)[1]
    uri = f"http://hardpos:{PASSWORD}@{host}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)])}
    env.pop("MLFLOW_TRACKING_URI", None)
    small = ["n_pretrain=12", "n_finetune=4", "n_benchmark=8", "tracking.experiment=redact", "tracking.drain_timeout_s=2"]
    out = tmp_path / "out"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.url)
    client.search_experiments()  # a cold server's first answer can take longer than the job's 2 s pre-flight probe
    res = subprocess.run([sys.executable, "-m", "hardpos", "world", *small, f"output_dir={out}",
                          f"tracking.tracking_uri={uri}", "--verbose"],
                         env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert PASSWORD not in res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["tracking.tracking_uri"] == f"http://hardpos:***@{host}"
    config = Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "dl"))).read_text()
    assert f"tracking_uri: http://hardpos:***@{host}" in config
    assert summary["tracking"]["tracking_uri"] == f"http://hardpos:***@{host}"

    # A server down at the start (nothing listens on `dead`): the run is recorded locally, for a replay.
    from tests.support import free_port

    dead = f"http://hardpos:{PASSWORD}@127.0.0.1:{free_port()}"
    out2 = tmp_path / "out2"
    res2 = subprocess.run([sys.executable, "-m", "hardpos", "world", *small, f"output_dir={out2}",
                           f"tracking.tracking_uri={dead}", "tracking.required=false", "tracking.request_timeout_s=0.5"],
                          env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert res2.returncode == 0, res2.stderr[-2000:]
    assert PASSWORD not in res2.stdout + res2.stderr and "hardpos:***@127.0.0.1" in res2.stderr
    assert list((out2 / "tracking").glob("*.jsonl")), "the undelivered journal is left for replay"
    assert not _grep(tmp_path, PASSWORD.encode()), "no file under the outputs, the store or the artifacts holds it"
    # Replay: the file's URI lost its password, so a bare replay says how to give it ...
    replay = [sys.executable, "-m", "hardpos", "track", "replay", str(out2 / "tracking")]
    bare = subprocess.run(replay, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bare.returncode == 1 and "--tracking-uri or $MLFLOW_TRACKING_URI" in bare.stderr, bare.stderr[-1000:]
    # ... and --tracking-uri (the server moved: here, to the live one) delivers it.
    sent = subprocess.run([*replay, "--tracking-uri", uri], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert sent.returncode == 0, sent.stderr[-1000:]
    assert PASSWORD not in bare.stdout + bare.stderr + sent.stdout + sent.stderr
    runs = client.search_runs([run.info.experiment_id])
    assert len(runs) == 2 and all(r.data.params["tracking.tracking_uri"] in (f"http://hardpos:***@{host}",
                                                                             redact_text(dead)) for r in runs)
    assert not _grep(tmp_path, PASSWORD.encode())


def test_replay_takes_the_password_from_the_environment_for_the_same_server(monkeypatch):
    from hardpos.tracking.resend import _usable_uri

    real = f"postgresql://mlflow:{PASSWORD}@db:5432/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", real)
    assert _usable_uri(redact_text(real)) == real
    assert _usable_uri("postgresql://mlflow:***@other:5432/mlflow") is None  # another server: not guessed
    assert _usable_uri("sqlite:////tmp/m.db") == "sqlite:////tmp/m.db"
