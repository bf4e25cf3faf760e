"""MLflow on PostgreSQL as a first-class backend, against a real PostgreSQL server.

The compose stack's exact ``--backend-store-uri`` (infra/compose/docker-compose.yaml, its
variables filled in, the host pointed at a local server) runs a real ``mlflow server`` with the
driver the ``postgres`` extra installs, and a stage logs to it; a stage pointed straight at the
database gets an absolute artifact root; a missing driver is one clear line naming the extra.
Skips with the reason when the PostgreSQL binaries are absent (CI installs them: .ci/run)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.support.mlflow_server import LocalMlflowServer
from tests.support.postgres import LocalPostgres, binaries

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "pg-Secret-77x"


def compose_backend_uri(port: int) -> str:
    """The compose MLflow service's backend URI with .env's variables filled in and the
    ``postgres`` service's host replaced by this machine's server."""
    services = yaml.safe_load((REPO / "infra" / "compose" / "docker-compose.yaml").read_text())["services"]
    cmd = services["mlflow"]["command"]
    uri = cmd[cmd.index("--backend-store-uri") + 1]
    values = {"POSTGRES_USER": "mlflow", "POSTGRES_PASSWORD": PASSWORD, "POSTGRES_DB": "mlflow"}
    uri = re.sub(r"\$\{(\w+)(?::[-?][^}]*)?\}", lambda m: values[m[1]], uri)
    return uri.replace("@postgres:5432/", f"@127.0.0.1:{port}/")


def test_missing_driver_is_one_line_naming_the_extra():
    from hardpos.config import ConfigError, TrackingConfig
    from hardpos.tracking import check_tracking, is_database_uri, missing_database_driver

    assert is_database_uri("postgresql+psycopg://u:p@h/db") and not is_database_uri("http://h:5000")
    assert missing_database_driver("http://127.0.0.1:5000") is None
    # psycopg2 is not a HardPos requirement: a URI naming it says so, with the fix.
    problem = missing_database_driver(f"postgresql+psycopg2://mlflow:{PASSWORD}@127.0.0.1:1/mlflow")
    if problem is None:
        pytest.skip("psycopg2 happens to be installed here")
    with pytest.raises(ConfigError) as err:
        check_tracking(TrackingConfig(tracking_uri=f"postgresql+psycopg2://mlflow:{PASSWORD}@127.0.0.1:1/mlflow"))
    assert "database driver is not installed" in str(err.value) and "psycopg2" in str(err.value)


@pytest.fixture
def postgres():
    folder, why = binaries()
    if folder is None:
        pytest.skip(why)
    pytest.importorskip("psycopg", reason="the postgres extra's driver (pip install 'hardpos[postgres]')")
    server = LocalPostgres(password=PASSWORD)
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.mark.integration
def test_compose_uri_serves_mlflow_and_a_stage_logs_to_it(tmp_path, postgres, monkeypatch):
    from mlflow.tracking import MlflowClient

    from hardpos import runtime, tracking
    from hardpos.config import TrackingConfig
    from hardpos.stages.world import Config

    uri = compose_backend_uri(postgres.port)
    assert uri.startswith("postgresql+psycopg://mlflow:") and PASSWORD in uri
    server = LocalMlflowServer(tmp_path / "mlflow", backend_store_uri=uri)
    server.start()
    try:
        client = MlflowClient(server.url)
        client.search_experiments()
        small = dict(n_pretrain=12, n_finetune=4, n_benchmark=8)
        tracked = TrackingConfig(tracking_uri=server.url, experiment="pg")
        summary = runtime.execute("world", Config(output_dir=str(tmp_path / "w"), **small, tracking=tracked), quiet=True)
        run = client.get_run(summary["mlflow_run_id"])
        assert run.info.status == "FINISHED" and run.data.params["n_pretrain"] == "12"
        assert "summary.json" in {a.path for a in client.list_artifacts(run.info.run_id)}

        # Straight at the database (the plain postgresql:// a user writes): SQLAlchemy 2.1's
        # psycopg 3, an absolute artifact root, and no password in any record.
        monkeypatch.chdir(tmp_path)
        direct = postgres.uri()
        tracked = TrackingConfig(tracking_uri=direct, experiment="pg-direct")
        summary = runtime.execute("world", Config(output_dir=str(tmp_path / "d"), **small, tracking=tracked), quiet=True)
        exp = MlflowClient(direct).get_experiment_by_name("pg-direct")
        assert exp.artifact_location == (tmp_path / "mlartifacts").resolve().as_uri()
        run = MlflowClient(direct).get_run(summary["mlflow_run_id"])
        assert run.data.params["tracking.tracking_uri"] == tracking.redact.redact_text(direct) != direct
        leaked = [p for p in tmp_path.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
        assert not leaked
    finally:
        server.kill()
