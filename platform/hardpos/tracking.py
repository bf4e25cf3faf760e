"""MLflow tracking helpers shared by every stage.

Default store: ``sqlite:///<cwd>/mlruns.db`` with artifacts in ``<cwd>/mlartifacts``
(MLflow 3 deprecates the plain file store).  ``$MLFLOW_TRACKING_URI`` or the config's
``tracking.tracking_uri`` point at a server instead.

:class:`RunLogger` is a small picklable handle (tracking URI + run id) so Ray workers
(e.g. Ray Train rank 0) log into the driver's run through ``MlflowClient`` without
touching MLflow's global "active run" state.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from hardpos.config import TrackingConfig, flatten

# MLflow rejects param values over this many characters.
_MAX_PARAM_CHARS = 6000
DEFAULT_DB = "mlruns.db"


def default_tracking_uri() -> str:
    return f"sqlite:///{Path.cwd().resolve() / DEFAULT_DB}"


def resolve_tracking_uri(uri: str | None = None) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else the local SQLite store."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def _local_artifact_root(tracking_uri: str) -> str | None:
    """For a local sqlite store: an absolute artifact directory beside the database."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        return (db.parent / "mlartifacts").resolve().as_uri()
    return None


@contextlib.contextmanager
def use_tracking_uri(uri: str) -> Iterator[None]:
    """Point MLflow's process-global tracking URI at ``uri`` for a block.

    For the few MLflow APIs that only read global state (``log_model`` on the active run,
    ``models:/`` downloads, registry source resolution). ``mlflow.set_tracking_uri`` also
    writes ``$MLFLOW_TRACKING_URI`` (and *unsets* it when given None), so both the global
    and the environment variable are restored exactly afterwards.
    """
    import mlflow
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    saved_global, saved_env = mlflow_uri._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow_uri._tracking_uri = saved_global
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


def ensure_experiment(name: str, tracking_uri: str) -> str:
    """Experiment id for ``name``, creating it (with an absolute artifact root) if needed."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=_local_artifact_root(tracking_uri))
    except Exception:  # noqa: BLE001 - created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def clean_params(params: dict[str, Any]) -> dict[str, str]:
    """Flatten nested dicts and stringify values (truncated to MLflow's limit)."""
    out = {}
    for key, value in flatten(params).items():
        text = json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)
        out[key] = text[:_MAX_PARAM_CHARS]
    return out


def numeric_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Keep finite numbers (bools excluded), flattening nested dicts with '/'."""
    out = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(numeric_metrics(value, prefix=f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(float(value)):
                out[name] = float(value)
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            out[name] = float(value.item())
    return out


@dataclasses.dataclass(frozen=True)
class RunLogger:
    """Log into one MLflow run from any process. Picklable; holds no connections."""

    tracking_uri: str
    run_id: str

    def _client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.tracking_uri)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in clean_params(params).items()]
        client = self._client()
        for start in range(0, len(items), 100):
            client.log_batch(self.run_id, params=items[start:start + 100])

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step or 0) for k, v in numeric_metrics(metrics).items()]
        client = self._client()
        for start in range(0, len(items), 500):
            client.log_batch(self.run_id, metrics=items[start:start + 500])

    def last_step(self, metric: str) -> int:
        """The highest step logged for ``metric`` (0 when it was never logged).

        A worker that resumes after a failure uses it to skip steps it already logged,
        so a metric's history never holds the same step twice.
        """
        history = self._client().get_metric_history(self.run_id, metric)
        return max((m.step for m in history), default=0)

    def set_tags(self, tags: dict[str, Any]) -> None:
        client = self._client()
        for key, value in tags.items():
            client.set_tag(self.run_id, key, str(value))

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> None:
        path = Path(local_path)
        if path.is_dir():
            self._client().log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self._client().log_artifact(self.run_id, str(path), artifact_path)

    def log_json(self, obj: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(obj, indent=2, default=str))
            self.log_artifact(path)

    def log_text(self, text: str, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(text)
            self.log_artifact(path)


def start_run(
    cfg: TrackingConfig,
    run_name: str,
    *,
    tags: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
) -> RunLogger | None:
    """Create a run (status RUNNING) and return its logger; None when tracking is off."""
    if not cfg.enabled:
        return None
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(cfg.tracking_uri)
    exp_id = ensure_experiment(cfg.experiment, uri)
    all_tags = {"mlflow.runName": run_name, **{k: str(v) for k, v in (tags or {}).items()}}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = MlflowClient(uri).create_run(exp_id, tags=all_tags, run_name=run_name)
    return RunLogger(uri, run.info.run_id)


def end_run(logger: RunLogger | None, status: str = "FINISHED") -> None:
    if logger is not None:
        from mlflow.tracking import MlflowClient

        MlflowClient(logger.tracking_uri).set_terminated(logger.run_id, status=status)


def search_runs(tracking_uri: str, experiment: str, filter_string: str = "", order_by: Iterable[str] = ()):
    """Runs of one experiment as MLflow ``Run`` objects (newest first by default)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, order_by=list(order_by) or None, max_results=5000)
