"""Log into an MLflow run from any process without ever waiting on the server.

:class:`RunLogger` is a small picklable handle (tracking URI + run id + spill folder) so
Ray workers (e.g. Ray Train rank 0) log into the driver's run without touching MLflow's
global "active run" state. Its records go to this process's journal of the run
(:mod:`hardpos.tracking.journal`: on disk first, shipped by one background thread; one per
run and process, kept here), which survives a tracking outage. :func:`start_run` / :func:`end_run` bracket a job's run.
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from hardpos import storage
from hardpos.config import TrackingConfig, flatten
from hardpos.config.paths import resolve_tracking_uri
from hardpos.tracking import TrackingUnavailableError
# The module, not its names: tests swap transport.transport_for for a switchable one.
from hardpos.tracking import transport
from hardpos.tracking.journal import LOCAL_PREFIX, DeliveryReport, QueueOptions, RunQueue, ledger_step, spill_folder
from hardpos.tracking.names import mlflow_names
from hardpos.tracking.redact import redact, redact_text
from hardpos.tracking.store import ensure_experiment
from hardpos.tracking.transport import fail_fast_mlflow, log_model_now, probe

log = logging.getLogger("hardpos.tracking")

# MLflow rejects param / tag values over this many characters.
_MAX_PARAM_CHARS = 6000
_MAX_TAG_CHARS = 8000


def clean_params(params: dict[str, Any]) -> dict[str, str]:
    """Flatten nested dicts, stringify values (truncated to MLflow's limit) and make the
    names ones MLflow accepts (:func:`hardpos.tracking.names.mlflow_names`)."""
    out = {}
    for key, value in flatten(params).items():
        text = json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)
        out[key] = text[:_MAX_PARAM_CHARS]
    return mlflow_names(out)


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
    """Log into one MLflow run from any process, without ever waiting on the server.

    Picklable (a Ray Train worker gets a copy) and holds no connections: every call appends
    its records to this process's journal of the run under ``spill_dir``
    (:mod:`hardpos.tracking.journal`, shipped by a background thread), so a slow or dead
    tracking server costs the caller a file append. :meth:`close` (or
    :func:`end_run`) waits a bounded time for delivery and reports what was not delivered.

    local: the server was unreachable when the run started and ``tracking.required`` was
        false: ``run_id`` is a placeholder (``local-...``) and everything is written to
        ``spill_dir`` for ``hardpos track replay``, which creates the real run.
    """

    tracking_uri: str
    run_id: str
    spill_dir: str | None = None
    local: bool = False
    options: QueueOptions = QueueOptions()

    def _queue(self):
        return queue_for(self.tracking_uri, self.run_id, self.spill_dir, self.options, local=self.local)

    # Params, tags and JSON/text artifacts are redacted here, for every caller (hardpos.tracking.redact).
    def log_params(self, params: dict[str, Any]) -> None:
        self._queue().put_many([{"kind": "param", "key": k, "value": v}
                                for k, v in clean_params(redact(params)).items()])

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        # The timestamp is fixed here, when the value is known: a resend after an
        # ambiguous failure is then an identical row, which MLflow's SQL store drops.
        now = int(time.time() * 1000)
        self._queue().put_many([{"kind": "metric", "key": k, "value": v, "timestamp": now, "step": step or 0}
                                for k, v in mlflow_names(numeric_metrics(metrics)).items()])

    def last_step(self, metric: str) -> int:
        """The highest step logged for ``metric`` (0 when it was never logged): in MLflow,
        or queued by any process of this run (its ledger), whichever is higher.

        A worker that resumes after a failure uses it to skip steps it already logged,
        so a metric's history never holds the same step twice, even when the tracking
        server is down at the restart.
        """
        return last_logged_step(self.tracking_uri, self.run_id, self.spill_dir, metric, self.options,
                                local=self.local)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._queue().put_many([{"kind": "tag", "key": k, "value": str(v)[:_MAX_TAG_CHARS]}
                                for k, v in mlflow_names(redact(tags)).items()])

    def log_inputs(self, datasets: list[dict[str, str]]) -> None:
        """Record the run's input datasets (``mlflow.log_input``: the runs table's Dataset
        column), each ``{name, digest, source_type, source, context}`` (context: ``training``,
        ``evaluation``...; see :func:`hardpos.tracking.inputs.dataset_input`). Journaled like
        every record, so an outage delays it, never loses it."""
        if datasets:
            self._queue().put({"kind": "input", "datasets": list(datasets)})

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Queue a file or folder (copied now, uploaded by the sender)."""
        self._queue().put_artifact(local_path, artifact_path)

    def log_json(self, obj: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(redact(obj), indent=2, default=str))
            self.log_artifact(path)

    def log_text(self, text: str, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(redact_text(text))
            self.log_artifact(path)

    def log_model(self, checkpoint_dir: str | os.PathLike, durable_dir: str | None = None) -> tuple[str | None, bool]:
        """Log a checkpoint folder as the run's MLflow model (``hardpos.models.pyfunc``, with the
        ``hardpos.model_uri`` tag the registry reads) -> (its ``runs:/<run_id>/model`` URI, deferred?).

        Logged now when the server answers; otherwise (or when the upload fails midway) deferred:
        logged when the run closes if the server is back by then, else by ``hardpos track
        replay`` (summary.json's ``tracking`` section says which), under the URI returned now.
        A deferred upload reads ``durable_dir`` (a local folder holding the same checkpoint that
        outlives the job); without one, or when it is ``s3://``, the checkpoint is copied into
        this run's journal folder first. A run recorded locally has no id yet: URI None.
        """
        if not self.local and self.reachable():
            try:
                return log_model_now(self.tracking_uri, self.run_id, str(checkpoint_dir),
                                     self.options.request_timeout_s), False
            except Exception as exc:  # noqa: BLE001 - the server went away mid-upload: defer, never fail the job
                log.warning("tracking: logging the model failed (%s); deferred", str(exc).splitlines()[0][:200])
        keep = durable_dir
        if keep is None or storage.is_s3(keep):
            keep = str(spill_folder(self.spill_dir) / "models" / self.run_id / Path(checkpoint_dir).name)
            shutil.copytree(checkpoint_dir, keep, dirs_exist_ok=True)
        self._queue().defer_model(str(keep))
        return (None if self.local else f"runs:/{self.run_id}/model"), True

    def reachable(self) -> bool:
        """True when the tracking server answers now (one short request)."""
        return not self.local and probe(self.tracking_uri, self.options.request_timeout_s) is None

    def close(self, timeout: float | None = None, *, hand_off: bool = False) -> DeliveryReport:
        """Wait up to ``timeout`` s (default ``drain_timeout_s``) for this process's records,
        then keep the rest on disk; see :meth:`hardpos.tracking.journal.RunQueue.close`."""
        q = existing_queue(self.tracking_uri, self.run_id, self.spill_dir) or self._queue()
        return q.close(timeout, hand_off=hand_off)


def queue_options(cfg: TrackingConfig) -> QueueOptions:
    return QueueOptions(request_timeout_s=cfg.request_timeout_s, drain_timeout_s=cfg.drain_timeout_s)


def spill_dir_for(output_dir: str) -> str:
    """Where a job's tracking queue keeps what it could not send: ``<output_dir>/tracking``,
    or a local folder named after an ``s3://`` output_dir (the queue writes local files)."""
    if storage.is_s3(output_dir):
        digest = hashlib.sha1(output_dir.encode()).hexdigest()[:12]
        return str(Path(tempfile.gettempdir()) / "hardpos-tracking" / digest)
    return str(Path(output_dir) / "tracking")


def start_run(
    cfg: TrackingConfig,
    run_name: str,
    *,
    tags: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
    spill_dir: str | None = None,
) -> RunLogger | None:
    """Create a run (status RUNNING) and return its logger; None when tracking is off.

    The server is asked first with short requests (``tracking.request_timeout_s``, three
    tries within seconds), so a server that is down fails the job here, before any compute, with
    :class:`TrackingUnavailableError` -- unless ``tracking.required`` is false: then the
    run is recorded locally under ``spill_dir`` (one warning line) for a later
    ``hardpos track replay``.
    """
    if not cfg.enabled:
        return None
    uri = resolve_tracking_uri(cfg.tracking_uri)
    options = queue_options(cfg)
    all_tags = {"mlflow.runName": run_name, **{k: str(v) for k, v in (tags or {}).items()}}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    fail_fast_mlflow()
    problem = probe(uri, cfg.request_timeout_s, attempts=3)
    if problem is None:
        try:
            exp_id = ensure_experiment(cfg.experiment, uri)
            run = MlflowClient(uri).create_run(exp_id, tags=all_tags, run_name=run_name)
            return RunLogger(uri, run.info.run_id, spill_dir, options=options)
        except Exception as exc:  # noqa: BLE001 - a store that fails here is as unavailable as a dead one
            if cfg.required:
                raise TrackingUnavailableError(redact_text(
                    f"cannot start an MLflow run in {uri} ({type(exc).__name__}: {str(exc)[:300]}); nothing was run. "
                    "Fix the tracking store or set tracking.required=false to record the run locally")) from exc
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
    if cfg.required:
        raise TrackingUnavailableError(redact_text(
            f"the MLflow tracking server {uri} is unreachable ({problem}); nothing was run. Start it, point "
            "tracking.tracking_uri at one that is up, or set tracking.required=false to record this run locally "
            "and send it later with `hardpos track replay <output_dir>/tracking`"))
    logger = RunLogger(uri, f"{LOCAL_PREFIX}{uuid.uuid4().hex}", spill_dir, local=True, options=options)
    log.warning("tracking: %s unreachable (%s); recording run %r locally in %s (tracking.required=false)", uri,
                problem[:200], run_name, logger._queue().spill_dir)
    logger._queue().put({"kind": "create", "experiment": cfg.experiment, "run_name": run_name, "tags": all_tags,
                         "start_time": int(time.time() * 1000)})
    return logger


def end_run(logger: RunLogger | None, status: str = "FINISHED", timeout: float | None = None) -> dict[str, Any] | None:
    """Queue the run's final status, wait up to ``timeout`` s (``tracking.drain_timeout_s``
    by default) for this process's records to reach the server, and return the delivery
    report (for summary.json): ``undelivered`` records and the files holding them. Never
    raises for an unreachable server: the job's result is not the tracker's health."""
    if logger is None:
        return None
    logger._queue().put({"kind": "end", "status": status, "end_time": int(time.time() * 1000)})
    return logger.close(timeout).to_dict()


# --------------------------------------------------------------------------- this process's queues
_QUEUES: dict[tuple[str, str, str], RunQueue] = {}
_REGISTRY_LOCK = threading.Lock()
_ATEXIT = False


def queue_for(tracking_uri: str, run_id: str, spill_dir: str | None, options: QueueOptions,
              local: bool = False) -> RunQueue:
    """This process's queue for the run (created, with its thread, on first use)."""
    global _ATEXIT
    key = (tracking_uri, run_id, str(spill_dir))
    with _REGISTRY_LOCK:
        q = _QUEUES.get(key)
        if q is None or q.pid != os.getpid():  # a forked child gets its own
            q = _QUEUES[key] = RunQueue(tracking_uri, run_id, spill_dir, options, local=local, on_close=_forget)
            if not _ATEXIT:
                atexit.register(close_all)
                _ATEXIT = True
        return q


def existing_queue(tracking_uri: str, run_id: str, spill_dir: str | None) -> RunQueue | None:
    """This process's open queue for the run, or None (never creates one)."""
    with _REGISTRY_LOCK:
        q = _QUEUES.get((tracking_uri, run_id, str(spill_dir)))
        return q if q is not None and q.pid == os.getpid() else None


def _forget(q: RunQueue) -> None:
    with _REGISTRY_LOCK:
        for key, value in list(_QUEUES.items()):
            if value is q:
                del _QUEUES[key]


def close_all(timeout: float | None = None) -> list[DeliveryReport]:
    """Close every queue of this process (at interpreter exit: nothing is silently lost)."""
    with _REGISTRY_LOCK:
        queues = list(_QUEUES.values())
    return [q.close(timeout) for q in queues if q.pid == os.getpid()]


def last_logged_step(tracking_uri: str, run_id: str, spill_dir: str | None, key: str, options: QueueOptions,
                     local: bool = False) -> int:
    """The highest step logged for ``key``: in MLflow (when it answers fast) or queued by any
    process of this run (ledgers, adopted files). A resumed worker skips steps up to it."""
    q = queue_for(tracking_uri, run_id, spill_dir, options, local=local)  # adopts leftovers first
    best = max(ledger_step(spill_dir, run_id, key), q.high_water.get(key, 0))
    if local:
        return best
    if probe(tracking_uri, options.request_timeout_s) is None:
        try:
            steps = transport.transport_for(tracking_uri, options.request_timeout_s).metric_history(run_id, key)
            best = max(best, max(steps, default=0))
        except Exception as exc:  # noqa: BLE001 - the ledger is the fallback
            log.warning("tracking: could not read %s's history from %s (%s); using the local ledger", key,
                        tracking_uri, str(exc)[:200])
    return best
