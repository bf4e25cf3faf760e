"""What a HardPos job prints: the ``hardpos`` logger's console handler and Ray's verbosity.

One place, called when a job starts (:func:`hardpos.runtime.execute`, :func:`hardpos.runtime.init_ray`,
the Ray Train worker), never at import time. The level is every job config's ``log_level``
(the CLI's ``--verbose`` is ``log_level=debug``):

* ``info`` (default): HardPos's own lines -- stage lines, one progress line per stretch of a
  long step, warnings, results. Ray's own output is off: its INFO logs, Ray Data's progress
  bars and execution logs, Ray Train's INFO lines, and warnings such as Ray Train's
  "Failed to query Ray Train Controller actor state" (its placement-group cleaner polls
  Ray's state API, which needs the dashboard). Errors always show.
* ``debug``: HardPos's debug lines and all of Ray's output back.
* ``warning`` / ``error``: only HardPos's warnings / errors (and Ray's errors).

The hardpos lines of Ray workers (e.g. training progress on rank 0) reach the console
through Ray's log forwarding (``log_to_driver``), prefixed with the worker's name and pid.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import IO, Any, Iterator

from hardpos.tracking.redact import RedactFormatter

LEVELS = ("debug", "info", "warning", "error")
LOGGER = "hardpos"
_HANDLER = "hardpos-console"
# ray.data's own logging config with its console handler at WARNING (Ray Data reads the
# file named by RAY_DATA_LOGGING_CONFIG in every process, so its worker-side actors obey too).
QUIET_RAY_DATA_CONFIG = Path(__file__).parent / "resources" / "ray_data_logging_quiet.yaml"


def check_level(level: str) -> str:
    """``level`` lower-cased; a ``ValueError`` naming the accepted levels otherwise."""
    name = str(level).lower()
    if name not in LEVELS:
        raise ValueError(f"log_level={level!r}: expected one of {', '.join(LEVELS)}")
    return name


def verbose(level: str) -> bool:
    """True when Ray's own output should show (``log_level=debug``)."""
    return check_level(level) == "debug"


class _ConsoleHandler(logging.StreamHandler):
    """A StreamHandler on a fixed stream, or (None) on whatever ``sys.stderr`` is when a
    record is written: a replaced stderr (pytest's capture, a notebook) is followed instead
    of a closed one being kept."""

    def __init__(self, stream: IO[str] | None = None):
        self._fixed = stream
        logging.Handler.__init__(self)

    @property
    def stream(self) -> IO[str]:  # type: ignore[override]
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: IO[str] | None) -> None:
        self._fixed = value


def setup(level: str = "info", stream: IO[str] | None = None) -> logging.Logger:
    """Give the ``hardpos`` logger one console handler at ``level`` on ``stream`` (None: the
    current ``sys.stderr``). Idempotent: a second call only changes the level and stream. The
    logger does not propagate to the root logger, so Ray's root-logger handlers in worker
    processes neither drop nor repeat its lines."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(check_level(level).upper())
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER), None)
    if handler is None:
        handler = _ConsoleHandler()
        handler.set_name(_HANDLER)
        # No secret on the console: a URI's password or a header's value reads *** there.
        handler.setFormatter(RedactFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    handler.stream = stream
    logger.propagate = False
    return logger


def current_level() -> str:
    """The level :func:`setup` last gave the ``hardpos`` logger (``info`` before any setup)."""
    level = logging.getLogger(LOGGER).level
    return logging.getLevelName(level).lower() if level != logging.NOTSET else "info"


def ray_env(level: str) -> dict[str, str]:
    """Environment for a Ray this process starts (its workers inherit it): empty when verbose."""
    if verbose(level):
        return {}
    # MLflow's artifact-download progress bars are as noisy as Ray Data's (one per model load)
    filters = ",".join(f for f in (os.environ.get("PYTHONWARNINGS", ""), ray_warning_filters(level)) if f)
    return {"RAY_DATA_DISABLE_PROGRESS_BARS": "1", "RAY_DATA_LOGGING_CONFIG": str(QUIET_RAY_DATA_CONFIG),
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "PYTHONWARNINGS": filters}


def apply_ray_env(level: str) -> None:
    """Set :func:`ray_env` in ``os.environ`` before Ray starts; a value the user set wins."""
    for key, value in ray_env(level).items():
        os.environ.setdefault(key, value)


def ray_init_kwargs(level: str) -> dict[str, Any]:
    """``ray.init`` keywords for ``level``: the driver's ``ray`` logger and every worker's root
    logger at ERROR unless verbose (Ray's warnings are mostly about Ray's own bookkeeping)."""
    # lazy: runtime (on hardpos.cli's import path) calls this only when it starts Ray
    import ray

    loud = verbose(level)
    return {
        "log_to_driver": True,  # the workers' hardpos lines (training progress) reach the console
        "logging_level": logging.INFO if loud else logging.ERROR,
        "logging_config": ray.LoggingConfig(encoding="TEXT", log_level="INFO" if loud else "ERROR"),
    }


# Ray's own noise that is not ours to fix: Ray Train reads the deprecated
# ExecutionOptions.exclude_resources itself (DataConfig.default_ingest_options), and the raylet
# warns that "N PYTHON worker processes have been started" whenever short tasks outnumber the
# cores (every Ray Data job on a 2-core machine). Hidden unless verbose.
RAY_DEPRECATION_NOISE = "`ExecutionOptions.exclude_resources` is deprecated"
RAYLET_NOISE = re.compile(r"worker processes have been started on node")
# The GCS logs an error when it asks an actor's worker to exit and that worker has already
# gone: the closed socket *is* the kill succeeding (ray-project/ray#53412, #58544). Only that
# exact line, with that status; any other kill failure still reaches the console.
GCS_KILL_NOISE = re.compile(r"\(gcs_server\) gcs_actor_scheduler\.cc:\d+: Failed to kill actor \w+, return status: "
                            r"Invalid: KillActor RPC failed for actor \w+: RpcError: RPC error: Socket closed "
                            r"rpc_code: 14\s*$")


# Ray Data's actor pools pass each actor its constructor arguments (the DataContext and the map
# transformer) as object refs the driver owns for the whole run, and keep max_restarts=-1 so a
# lost node's actors come back; the driver's core worker then logs an error line per actor
# (ray-project/ray#53727: lineage of such arguments, which the driver keeps alive here). Only
# that line, only for Ray Data's MapWorker actors; any other core-worker error still shows.
ACTOR_ARGS_NOISE = re.compile(rb"core_worker\.cc:\d+: Actor with class name: 'MapWorker\(.*\)' and ID: '\w+' has "
                              rb"constructor arguments in the object store and max_restarts > 0")
# Ray Data warns when an actor pool gets fewer input blocks than it has actors: with a few rows
# (fewer blocks than engine.http.concurrency) that is the plan, not a problem.
RAY_DATA_FEW_INPUTS = r"The minimum number of concurrent actors for .* is set to"


def ray_warning_filters(level: str) -> str:
    """``PYTHONWARNINGS`` entries that hide Ray's own deprecation noise in Ray's processes."""
    return "" if verbose(level) else f"ignore:{RAY_DEPRECATION_NOISE}:Warning"


class RayDataNotices(logging.Filter):
    """Drops Ray Data's notices that its progress bars are off: HardPos turns them off itself
    (below ``debug``), so the notice is no news. Named in the quiet Ray Data logging config,
    which every Ray process reads."""

    NOTICES = ("Progress bars disabled", "Progress bars for operators disabled")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOTICES)


class _DropLines:
    """A text stream that forwards everything except lines matching ``pattern`` (and the
    newline ``print`` writes after them)."""

    def __init__(self, stream: IO[str], pattern: re.Pattern[str]):
        self._stream, self._pattern, self._eat_newline = stream, pattern, False

    def write(self, text: str) -> int:
        if self._eat_newline and text == "\n":
            self._eat_newline = False
            return len(text)
        self._eat_newline = False
        if self._pattern.search(text):
            self._eat_newline = not text.endswith("\n")
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def quiet_raylet(level: str) -> None:
    """Unless verbose, the driver's stdout drops the raylet's worker-start warnings and its
    stderr the GCS's successful-kill error (Ray's log monitor prints the raylet's and the GCS's
    lines to the driver's ``sys.stdout`` and ``sys.stderr``). Idempotent."""
    if verbose(level):
        return
    if not isinstance(sys.stdout, _DropLines):
        sys.stdout = _DropLines(sys.stdout, RAYLET_NOISE)  # type: ignore[assignment]
    if not isinstance(sys.stderr, _DropLines):
        sys.stderr = _DropLines(sys.stderr, GCS_KILL_NOISE)  # type: ignore[assignment]


def quiet_ray_data(level: str) -> None:
    """Ray Data's progress bars and INFO logs in this (driver) process, per ``level``."""
    # lazy: ray.data takes seconds to import; only stages that use Ray are here
    from ray.data import DataContext

    loud = verbose(level)
    if not loud:
        warnings.filterwarnings("ignore", message=re.escape(RAY_DEPRECATION_NOISE))
        warnings.filterwarnings("ignore", message=RAY_DATA_FEW_INPUTS)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = loud
    # ERROR, not WARNING: turning the bars off makes Ray Data warn once that they are off
    logging.getLogger("ray.data").setLevel(logging.DEBUG if loud else logging.ERROR)


@contextlib.contextmanager
def quiet_native_stderr(level: str, pattern: re.Pattern[bytes] = ACTOR_ARGS_NOISE) -> Iterator[None]:
    """While the block runs, the process's file descriptor 2 goes through a pipe whose reader
    drops the lines matching ``pattern`` (unless verbose): Ray's C++ core worker writes its
    error lines there directly, past ``sys.stderr``. Every other line passes unchanged and in
    order; on exit fd 2 is restored and what is left in the pipe is written out. Where fd 2
    cannot be redirected the block runs as it is."""
    if verbose(level):
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        def emit(data: bytes) -> None:
            while data:
                data = data[os.write(saved, data):]

        held = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(read_end, 65536):
                *lines, held = (held + chunk).split(b"\n")
                kept = b"".join(line + b"\n" for line in lines if not pattern.search(line))
                if kept:
                    emit(kept)
            if held and not pattern.search(held):
                emit(held)
        os.close(read_end)

    reader = threading.Thread(target=pump, name="hardpos-stderr-filter", daemon=True)
    reader.start()
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the reader drains it and ends
        reader.join(timeout=5)
        if not reader.is_alive():  # else a child holds the pipe open and the reader still writes
            os.close(saved)


def quiet_worker(level: str) -> None:
    """In a Ray Train worker: third-party INFO chatter off unless verbose.

    Ray Train sets each worker's root logger to INFO with a console handler, so libraries'
    INFO lines (open_clip logs every model build through the root logger) would reach the
    job's console; HardPos's own lines do not depend on the root logger (see :func:`setup`)."""
    logging.getLogger().setLevel(logging.INFO if verbose(level) else logging.WARNING)


def train_log_level(level: str) -> str:
    """Ray Train's own console level (``ray.train.LoggingConfig``) for ``level``."""
    return "INFO" if verbose(level) else "WARNING"


def duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3725`` -> ``1h02m``; short and stable for progress lines."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
