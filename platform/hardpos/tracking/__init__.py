"""MLflow tracking as a side channel: a slow or dead tracking server never stalls or fails a job.

One module per job (read in this order):

* :mod:`~hardpos.tracking.store`: the tracking URI, experiments, run searches;
* :mod:`~hardpos.tracking.logger`: :class:`RunLogger` (log from any process, never wait),
  :func:`start_run` / :func:`end_run`, this process's journal per run;
* :mod:`~hardpos.tracking.journal`: every record on disk first, one shipper sends it (the
  files, the background thread, close and what is left);
* :mod:`~hardpos.tracking.transport`: one request to the store, and why a resend is harmless;
* :mod:`~hardpos.tracking.resend`: ``hardpos track replay``, the same shipper on left-over files;
* :mod:`~hardpos.tracking.names`: the one way a user's name becomes one MLflow accepts;
* :mod:`~hardpos.tracking.inputs`: the datasets a run read (``mlflow.log_input``), with digests.

Everything a stage, a test or a user needs is importable from ``hardpos.tracking``. The
names load on first use (PEP 562 ``__getattr__``), because importing MLflow takes seconds
and ``hardpos.cli`` imports this package: ``hardpos --help`` or a bad command line should
answer at once. The submodules import what they need at their top. (A test that swaps the
transport patches ``hardpos.tracking.transport.transport_for``: the queue and replay look
it up there on every use.)
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class TrackingUnavailableError(RuntimeError):
    """The tracking server cannot be reached when a run starts (``tracking.required=true``).

    Defined here, not in a submodule, so that the CLI can catch it without importing MLflow."""


# public name -> the submodule that defines it
_EXPORTS = {
    **dict.fromkeys(["check_tracking", "ensure_experiment", "experiment_id_of", "is_database_uri",
                     "missing_database_driver", "search_runs", "ui_runs_url"], "store"),
    **dict.fromkeys(["RunLogger", "clean_params", "close_all", "end_run", "existing_queue", "last_logged_step",
                     "numeric_metrics", "queue_for", "queue_options", "spill_dir_for", "start_run"], "logger"),
    **dict.fromkeys(["DeliveryReport", "LOCAL_PREFIX", "QueueOptions", "RunQueue", "read_jsonl",
                     "undelivered_files"], "journal"),
    **dict.fromkeys(["ClientTransport", "HttpTransport", "Rejected", "Transient", "fail_fast_mlflow",
                     "next_unit", "probe"], "transport"),
    **dict.fromkeys(["ReplayReport", "replay"], "resend"),
    **dict.fromkeys(["mlflow_name", "mlflow_names"], "names"),
    **dict.fromkeys(["config_inputs", "dataset_input"], "inputs"),
}
_SUBMODULES = ("inputs", "journal", "logger", "names", "resend", "store", "transport")

__all__ = ["TrackingUnavailableError", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_SUBMODULES})


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ does this on first use
    from hardpos.tracking.inputs import config_inputs, dataset_input  # noqa: F401
    from hardpos.tracking.journal import (LOCAL_PREFIX, DeliveryReport, QueueOptions, RunQueue,  # noqa: F401
                                          read_jsonl, undelivered_files)
    from hardpos.tracking.logger import (RunLogger, clean_params, close_all, end_run, existing_queue,  # noqa: F401
                                         last_logged_step, numeric_metrics, queue_for, queue_options, spill_dir_for,
                                         start_run)
    from hardpos.tracking.names import mlflow_name, mlflow_names  # noqa: F401
    from hardpos.tracking.resend import ReplayReport, replay  # noqa: F401
    from hardpos.tracking.store import (check_tracking, ensure_experiment, experiment_id_of,  # noqa: F401
                                        is_database_uri, missing_database_driver, search_runs, ui_runs_url)
    from hardpos.tracking.transport import (ClientTransport, HttpTransport, Rejected, Transient,  # noqa: F401
                                            fail_fast_mlflow, next_unit, probe)
