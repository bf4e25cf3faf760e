"""Where runs live: experiments, the reads that go to MLflow directly, and the check that the store answers.

Default store: ``sqlite:///<cwd>/mlflow.db`` with artifacts in ``<cwd>/mlartifacts``, the
same place MLflow 3's own default puts them, so a plain ``mlflow ui`` started in the same
directory opens HardPos's runs (MLflow 3 deprecates the plain file store). A store made by an
earlier HardPos (``mlruns.db``) stays readable with ``MLFLOW_TRACKING_URI=sqlite:///mlruns.db``.  ``$MLFLOW_TRACKING_URI`` or the config's
``tracking.tracking_uri`` point at a server instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from mlflow.tracking import MlflowClient

from hardpos import preflight
from hardpos.config import TrackingConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.tracking.transport import probe

#: URI schemes MLflow opens as a SQL database itself (SQLAlchemy), with or without a ``+driver``.
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def is_database_uri(uri: str) -> bool:
    """True for a tracking URI that MLflow opens as a database (not a server, not a folder)."""
    return uri.split("://", 1)[0].split("+", 1)[0].lower() in DATABASE_SCHEMES if "://" in uri else False


def missing_database_driver(uri: str) -> tuple[str, str] | None:
    """(problem, fix) when ``uri`` is a database URI whose driver -- the one SQLAlchemy picks
    for its scheme, e.g. psycopg 3 for ``postgresql://`` with SQLAlchemy 2.1 -- is not
    installed; None otherwise (also for servers and local stores)."""
    if not is_database_uri(uri) or uri.startswith("sqlite:"):
        return None
    # lazy: only a database URI needs SQLAlchemy's dialect registry
    from sqlalchemy.engine import make_url

    try:
        dialect = make_url(uri).get_dialect()
    except Exception as exc:  # noqa: BLE001 - an unknown dialect or a malformed URI
        return f"not a database URI SQLAlchemy can open ({type(exc).__name__}: {str(exc)[:200]})", \
            "use postgresql://user:password@host:5432/db (or an http(s):// MLflow server)"
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        extra = " (pip install 'hardpos[postgres]')" if dialect.name == "postgresql" else ""
        return (f"its database driver is not installed ({exc}; SQLAlchemy uses {dialect.driver} for "
                f"{uri.split('://', 1)[0]}://)", f"install it{extra}, or point tracking at an MLflow server")
    return None


def _local_artifact_root(tracking_uri: str) -> str | None:
    """For a database store opened directly: an absolute artifact root.

    SQLite: ``mlartifacts`` beside the database. Any other database (PostgreSQL, MySQL):
    ``<cwd>/mlartifacts`` made absolute here, where MLflow would otherwise record the relative
    ``./mlartifacts``, which every later process (a Ray worker, a Serve replica, ``mlflow ui``)
    resolves against its own working directory. (Several hosts sharing one database need a
    shared artifact store: run an ``mlflow server`` with ``--artifacts-destination s3://...``.)
    """
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        return (db.parent / "mlartifacts").resolve().as_uri()
    if is_database_uri(tracking_uri):
        return (Path.cwd() / "mlartifacts").resolve().as_uri()
    return None


# What MLflow's UI shows a HardPos experiment as: a model-development experiment (its training
# view: runs, metrics, datasets, models), not a GenAI one (traces), with a note saying what it holds.
EXPERIMENT_TAGS = {
    "mlflow.experimentKind": "custom_model_development",
    "mlflow.note.content": (
        "HardPos: CLIP finetuned with hard negatives and hard positives. Each run is one stage "
        "(world, generate, train, evaluate, sweep, ...; tag hardpos.stage), nested under the pipeline "
        "run that started it. Params are the stage's config; Datasets are the triplet files and "
        "benchmarks it read (with digests); Models are the checkpoints a train run logged."),
}


def ui_runs_url(ui: str, experiment_id: str | None) -> str:
    """The MLflow UI's runs table of an experiment in its model-training view (MLflow 3's UI
    opens every experiment in its GenAI view unless told ``workflowType=machine_learning``);
    the experiments list when the id is unknown."""
    where = f"experiments/{experiment_id}/runs" if experiment_id else "experiments"
    return f"{ui.rstrip('/')}/#/{where}?workflowType=machine_learning"


def experiment_id_of(tracking_uri: str, run_id: str) -> str | None:
    """The experiment of a run (None when the store does not answer)."""
    try:
        return MlflowClient(tracking_uri).get_run(run_id).info.experiment_id
    except Exception:  # noqa: BLE001 - only a printed link depends on it
        return None


def ensure_experiment(name: str, tracking_uri: str) -> str:
    """Experiment id for ``name``, creating it (with an absolute artifact root and
    :data:`EXPERIMENT_TAGS`) if needed; an existing experiment without a kind gets the tags."""
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        if "mlflow.experimentKind" not in (exp.tags or {}):
            for key, value in EXPERIMENT_TAGS.items():
                if key not in (exp.tags or {}):  # a note the user wrote is theirs
                    client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=_local_artifact_root(tracking_uri), tags=EXPERIMENT_TAGS)
    except Exception:  # noqa: BLE001 - created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def search_runs(tracking_uri: str, experiment: str, filter_string: str = "", order_by: Iterable[str] = ()):
    """Runs of one experiment as MLflow ``Run`` objects (newest first by default)."""
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, order_by=list(order_by) or None, max_results=5000)


def check_tracking(cfg: TrackingConfig, key: str = "tracking.tracking_uri") -> None:
    """A database tracking URI has its driver installed; a required, enabled http(s)
    tracking server answers (one probe, <= ~2 s). What every stage's ``check`` runs last but the
    weights: ``key=value: problem; fix`` (:func:`hardpos.preflight.fail`)."""
    if not cfg.enabled:
        return
    uri = resolve_tracking_uri(cfg.tracking_uri)
    problem = missing_database_driver(uri)
    if problem is not None:
        preflight.fail(key, uri, problem[0], problem[1])
    if not cfg.required:
        return
    if not uri.startswith(("http://", "https://")):
        return
    problem = probe(uri, min(preflight.PROBE_TIMEOUT_S, cfg.request_timeout_s))
    if problem is not None:
        preflight.fail(key, uri, f"the MLflow tracking server does not answer ({problem})",
                       "start it or fix the URI; tracking.required=false records the run locally for `hardpos track replay`, "
                       "tracking.enabled=false turns tracking off")
