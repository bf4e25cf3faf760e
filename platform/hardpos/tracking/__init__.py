"""MLflow tracking as a side channel: a slow or dead tracking server never stalls or fails a job.

One module per job (read in this order):

* :mod:`~hardpos.tracking.store`: the tracking URI, experiments, run searches;
* :mod:`~hardpos.tracking.logger`: :class:`RunLogger` (log from any process, never wait),
  :func:`start_run` / :func:`end_run`, this process's queue per run;
* :mod:`~hardpos.tracking.queue`: the bounded, spilling queue and its background sender;
* :mod:`~hardpos.tracking.transport`: one request to the store, and why a resend is harmless;
* :mod:`~hardpos.tracking.files`: the spill, undelivered and ledger files on disk;
* :mod:`~hardpos.tracking.replay`: ``hardpos track replay``, sending those files later.

Everything a stage, a test or a user needs is importable from ``hardpos.tracking``. (A test
that swaps the transport patches ``hardpos.tracking.transport.transport_for``: the queue
and replay look it up there on every use.)
"""
from __future__ import annotations

from hardpos.tracking import transport
from hardpos.tracking.files import LOCAL_PREFIX, read_jsonl, undelivered_files
from hardpos.tracking.logger import (RunLogger, clean_params, close_all, end_run, existing_queue, last_logged_step,
                                     numeric_metrics, queue_for, queue_options, spill_dir_for, start_run)
from hardpos.tracking.queue import DeliveryReport, QueueOptions, RunQueue
from hardpos.tracking.replay import ReplayReport, replay
from hardpos.tracking.store import (DEFAULT_DB, default_tracking_uri, ensure_experiment, resolve_tracking_uri,
                                    search_runs, use_tracking_uri)
from hardpos.tracking.transport import (ClientTransport, HttpTransport, Rejected, TrackingUnavailableError,
                                        Transient, fail_fast_http, log_model_now, next_unit, probe)

__all__ = [
    "DEFAULT_DB", "LOCAL_PREFIX", "ClientTransport", "DeliveryReport", "HttpTransport", "QueueOptions", "Rejected",
    "ReplayReport", "RunLogger", "RunQueue", "TrackingUnavailableError", "Transient", "clean_params", "close_all",
    "default_tracking_uri", "end_run", "ensure_experiment", "existing_queue", "fail_fast_http", "last_logged_step",
    "log_model_now", "next_unit", "numeric_metrics", "probe", "queue_for", "queue_options", "read_jsonl", "replay",
    "resolve_tracking_uri", "search_runs", "spill_dir_for", "start_run", "transport", "undelivered_files",
    "use_tracking_uri",
]
