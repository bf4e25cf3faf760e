"""Tracking as a side channel: every record goes to a journal on disk first, one shipper sends it.

Every metric, param, tag, artifact, model and run-status change a
:class:`hardpos.tracking.RunLogger` records is appended, in the calling process, to that
process's journal of the run (``<run_id>.<process>.log.jsonl`` in the run's spill folder,
``<output_dir>/tracking``; first line: a header naming the run and the tracking URI). The
append is a buffered file write: it never touches the network, so a slow or dead tracking
server costs the caller nothing but the write, and nothing is held only in memory.

One shipper sends a journal, oldest record first, in requests of up to MLflow's
``log_batch`` limits (:func:`read_unit`, :func:`send_unit`), and moves the journal's
*cursor* (the byte offset of the first record not yet sent) past each request that the
server took. The same two functions ship a live journal from the queue's background thread
(:class:`RunQueue`) and a left-over journal from ``hardpos track replay``
(:mod:`hardpos.tracking.resend`). Requests have a short timeout and no HTTP retries; the
thread backs off (``retry_min_s`` doubling to ``retry_max_s``) and says once that the
server went away and once that it came back. Why a resend is harmless: "Exactly once" in
:mod:`hardpos.tracking.transport`.

Closing (:meth:`RunQueue.close`) waits at most ``timeout`` seconds for the cursor to reach
the end. What is left becomes ``<run_id>.<process>.undelivered.jsonl`` (the header and
exactly the records not sent) for a restarted worker of the same run to adopt (append to
its own journal) or for ``hardpos track replay`` to send; with nothing left the journal is
deleted. A process killed without running Python code (SIGKILL, a lost node) leaves its
``.log.jsonl`` with everything it recorded: ``hardpos track replay <that file>`` sends it.

Models. ``log_model`` is never run on the background thread (it loads torch and open_clip,
and MLflow's model logging reads process state): a ``model`` record stops the shipper until
:meth:`RunQueue.close` logs it in the caller's thread (or replay does), so a model is
logged in its place in the stream, before the run's final status.

Ray Train restarts. The rank-0 worker that raises closes at once (``hand_off``): its journal
becomes an undelivered file that the restarted rank 0 adopts before logging anything. Each
process also keeps a ledger (``<run_id>.<process>.ledger.json``: the highest step recorded
per metric key) so :func:`hardpos.tracking.logger.last_logged_step` knows which steps were
logged even while the server is down, and a restarted worker does not log re-trained steps
a second time.

Where the files are: ``spill_dir`` is a local folder; for an ``s3://`` output_dir a folder
under the system temp directory (named in summary.json). On a multi-node cluster the driver
sees a worker's file only when the folder is shared or the worker ran on its node;
otherwise the file stays on the worker's node, named in that worker's log line.

Nothing here runs at import time; threads start with a run's first queue in a process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

# The module, not its names: tests swap transport.transport_for for a switchable one.
from hardpos.tracking import transport
from hardpos.tracking.redact import redact, redact_text
from hardpos.tracking.transport import MAX_ENTITIES, Rejected, Transient, deliver, log_model_now, next_unit, probe

log = logging.getLogger("hardpos.tracking")

LOG_SUFFIX = ".log.jsonl"
UNDELIVERED_SUFFIX = ".undelivered.jsonl"
CURSOR_SUFFIX = ".sent"
LEDGER_SUFFIX = ".ledger.json"
# Run ids of runs recorded locally (the server was down at the start): replay creates the real run.
LOCAL_PREFIX = "local-"


# --------------------------------------------------------------------------- files
def spill_folder(spill_dir: str | os.PathLike | None) -> Path:
    """``spill_dir``, or a shared default under the system temp directory when None."""
    return Path(spill_dir) if spill_dir else Path(tempfile.gettempdir()) / "hardpos-tracking"


def process_tag() -> str:
    """host-pid-random: restarted workers on one host never share a journal."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every non-blank line as JSON; a bad line raises ValueError naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON line ({exc})") from exc
    return rows


def read_header(path: Path) -> tuple[dict, int]:
    """A journal's header and the byte offset of its first record; ValueError when the
    first line is not a tracking header."""
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        header = json.loads(first)
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("kind") != "header":
        raise ValueError(f"{path}: no header line (not a tracking journal)")
    return header, len(first)


def load_cursor(path: Path, default: int) -> int:
    """The journal's cursor (bytes already sent), ``default`` when it has none."""
    try:
        return max(default, int((path.parent / (path.name + CURSOR_SUFFIX)).read_text()))
    except (OSError, ValueError):
        return default


def save_cursor(path: Path, offset: int) -> None:
    """Atomically (temp file + rename), so a crash leaves the old or the new cursor."""
    cursor = path.parent / (path.name + CURSOR_SUFFIX)
    tmp = cursor.with_name(cursor.name + ".tmp")
    tmp.write_text(str(offset))
    os.replace(tmp, cursor)


def drop_journal(path: Path) -> None:
    path.unlink(missing_ok=True)
    (path.parent / (path.name + CURSOR_SUFFIX)).unlink(missing_ok=True)


def records_after(path: Path, offset: int, end: int | None = None) -> list[dict]:
    """The records of ``path`` from byte ``offset`` (to ``end``)."""
    out = []
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read() if end is None else fh.read(max(0, end - offset))
    for line in data.splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def drop_copy(spill_dir: Path, rel: str) -> None:
    """Remove an artifact copy (``artifacts/<run>/<id>/<name>``) and the folders it leaves empty."""
    folder = spill_dir / Path(rel).parent
    shutil.rmtree(folder, ignore_errors=True)
    for parent in (folder.parent, folder.parent.parent):
        with contextlib.suppress(OSError):
            parent.rmdir()


def ledger_step(spill_dir: str | None, run_id: str, key: str) -> int:
    """The highest step of ``key`` any process recorded for the run, from the ledgers (0: none)."""
    best = 0
    for path in spill_folder(spill_dir).glob(f"{glob.escape(run_id)}.*{LEDGER_SUFFIX}"):
        try:
            best = max(best, int(json.loads(path.read_text()).get(key, 0)))
        except (OSError, ValueError):
            continue
    return best


def undelivered_files(path: str | os.PathLike) -> list[Path]:
    """Undelivered files at ``path``: a file as given (an orphaned ``.log.jsonl`` too), or a
    folder's ``*.undelivered.jsonl`` files, searched recursively. Live journals in a folder
    are left alone: their process is still shipping them."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    return sorted(p.rglob(f"*{UNDELIVERED_SUFFIX}"))


# --------------------------------------------------------------------------- the shipper
def read_unit(path: Path, offset: int, end: int) -> tuple[list[dict], int]:
    """The records of the next request from byte ``offset`` (never past ``end``) and the
    offset after them: a batch of metric/param/tag records within ``log_batch``'s limits,
    or one record of another kind. ``([], offset)`` when nothing is left."""
    records, offsets = [], []
    with open(path, "rb") as fh:
        fh.seek(offset)
        pos = offset
        while pos < end and len(records) < MAX_ENTITIES:
            line = fh.readline()
            if not line:
                break
            pos += len(line)
            if line.strip():
                records.append(json.loads(line))
                offsets.append(pos)
    n = next_unit(records)
    return (records[:n], offsets[n - 1]) if n else ([], offset)


def send_unit(conn, run_id: str, unit: list[dict], spill_dir: Path,
              on_reject: Callable[[dict, Exception], None]) -> tuple[int, int]:
    """Send one unit -> (records delivered, records refused). A refused batch is resent
    record by record so the refused one(s) are isolated and the rest still go. Raises
    :class:`Transient` when the server does not answer (nothing is counted as sent)."""
    try:
        deliver(conn, run_id, unit, str(spill_dir))
        delivered, rejected = len(unit), 0
    except Rejected as exc:
        if len(unit) == 1:
            on_reject(unit[0], exc)
            delivered, rejected = 0, 1
        else:
            delivered = rejected = 0
            for rec in unit:
                try:
                    deliver(conn, run_id, [rec], str(spill_dir))
                    delivered += 1
                except Rejected as one:
                    on_reject(rec, one)
                    rejected += 1
    for rec in unit:
        if rec["kind"] == "artifact":
            drop_copy(spill_dir, rec["path"])
    return delivered, rejected


# --------------------------------------------------------------------------- the queue
@dataclasses.dataclass(frozen=True)
class QueueOptions:
    """How a :class:`RunQueue` sends (see ``hardpos.config.TrackingConfig``).

    request_timeout_s: connect + read timeout of one request; no HTTP-level retries.
    drain_timeout_s: the default wait of :meth:`RunQueue.close` for the journal to be sent.
    retry_min_s / retry_max_s: the shipper's backoff after a failed request (doubling).
    """

    request_timeout_s: float = 5.0
    drain_timeout_s: float = 30.0
    retry_min_s: float = 0.5
    retry_max_s: float = 10.0


@dataclasses.dataclass
class DeliveryReport:
    """What :meth:`RunQueue.close` could and could not deliver (goes into summary.json)."""

    tracking_uri: str
    run_id: str
    delivered: int = 0
    undelivered: int = 0
    rejected: int = 0
    undelivered_files: list[str] = dataclasses.field(default_factory=list)
    replay: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return redact(dataclasses.asdict(self))


class RunQueue:
    """One process's journal of one run and the thread that ships it. Create through
    :func:`hardpos.tracking.logger.queue_for` (one per run and process); ``on_close`` is
    called with the queue once it closed."""

    def __init__(self, tracking_uri: str, run_id: str, spill_dir: str | None, options: QueueOptions,
                 local: bool = False, on_close: Callable[[RunQueue], None] | None = None) -> None:
        self.tracking_uri, self.run_id, self.options, self.local = tracking_uri, run_id, options, local
        self._on_close = on_close
        self.spill_dir = spill_folder(spill_dir)
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        self.proc = process_tag()
        self.pid = os.getpid()
        self.path = self.spill_dir / f"{run_id}.{self.proc}{LOG_SUFFIX}"
        self._ledger = self.spill_dir / f"{run_id}.{self.proc}{LEDGER_SUFFIX}"
        # The file names its server without the password (replay takes the real URI from
        # --tracking-uri or $MLFLOW_TRACKING_URI then).
        header = {"kind": "header", "run_id": run_id, "tracking_uri": redact_text(tracking_uri), "local": local,
                  "written": time.time(), "process": self.proc}
        self._fh = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._size = self._offset = self._write([header])   # bytes written / bytes sent
        self._seq = self._sent_seq = 0                       # records written / records sent or refused
        self._closing = self._stopped = False
        self._at_model = False       # the shipper waits at a model record for close()
        self._down_since: float | None = None
        self._last_error: str | None = None
        self.delivered = self.rejected = 0
        self.high_water: dict[str, int] = {}
        self._ledger_dirty, self._ledger_saved = False, 0.0
        self._thread: threading.Thread | None = None
        self._adopt()
        if not local:
            self._thread = threading.Thread(target=self._run, name=f"hardpos-tracking-{run_id[:8]}", daemon=True)
            self._thread.start()

    # ----------------------------------------------------------------- caller side
    def _write(self, records: list[dict]) -> int:
        """Append ``records`` to the journal and flush (lock held, or in __init__) -> bytes."""
        data = "".join(json.dumps(r) + "\n" for r in records)
        self._fh.write(data)
        self._fh.flush()
        return len(data.encode("utf-8"))

    def put(self, record: dict) -> None:
        """Record one record (never waits on the network; see the module docstring)."""
        self.put_many([record])

    def put_many(self, records: list[dict]) -> None:
        """Append records in order under one lock and wake the shipper once (one log call ->
        at most one request while the server is healthy)."""
        if not records:
            return
        with self._lock:
            if self._stopped:
                log.warning("tracking: run %s's queue in this process is closed; %d record(s) not recorded",
                            self.run_id, len(records))
                return
            for record in records:
                self._seq += 1
                record["seq"] = self._seq
                if record["kind"] == "metric" and record["step"] > self.high_water.get(record["key"], -1):
                    self.high_water[record["key"]] = record["step"]
                    self._ledger_dirty = True
            self._size += self._write(records)
            self._cond.notify_all()

    def put_artifact(self, local_path: str | os.PathLike, artifact_path: str | None) -> None:
        """Copy ``local_path`` (file or folder) under the spill dir now, upload it later."""
        src = Path(local_path)
        rel = Path("artifacts") / self.run_id / f"{self.proc}-{uuid.uuid4().hex[:8]}" / src.name
        dst = self.spill_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
        self.put({"kind": "artifact", "path": rel.as_posix(), "artifact_path": artifact_path})

    def defer_model(self, checkpoint_dir: str) -> None:
        """Log ``checkpoint_dir`` as this run's model, in its place in the stream, at
        :meth:`close` (the caller's thread) or by replay."""
        self.put({"kind": "model", "dir": str(checkpoint_dir)})

    @property
    def unreachable(self) -> bool:
        """True while the last request failed (or for a run recorded locally)."""
        return self.local or self._down_since is not None

    def pending(self) -> int:
        """Records not yet sent (or refused)."""
        with self._lock:
            return self._seq - self._sent_seq

    # ----------------------------------------------------------------- the shipper thread
    def _run(self) -> None:
        conn = None
        backoff = self.options.retry_min_s
        while True:
            with self._lock:
                while not self._stopped and (self._offset >= self._size or self._at_model):
                    self._cond.wait(timeout=1.0)
                    if self._ledger_dirty:
                        break
                if self._stopped:
                    return
                offset, end = self._offset, self._size
            self._save_ledger()
            unit, after = read_unit(self.path, offset, end) if offset < end else ([], offset)
            if not unit:
                continue
            if unit[0]["kind"] == "model":
                with self._lock:
                    self._at_model = True  # close() logs it in the caller's thread
                    self._cond.notify_all()
                continue
            try:
                if conn is None:
                    conn = transport.transport_for(self.tracking_uri, self.options.request_timeout_s)
                delivered, rejected = send_unit(conn, self.run_id, unit, self.spill_dir, self._reject)
            except Exception as exc:  # noqa: BLE001 - Transient, or a surprise: the shipper never dies
                self._went_down(str(exc) if isinstance(exc, Transient) else f"{type(exc).__name__}: {exc}")
                self._back_off(backoff)
                backoff = min(backoff * 2, self.options.retry_max_s)
                continue
            self._advance(after, unit[-1]["seq"], delivered, rejected)
            backoff = self.options.retry_min_s
            self._came_back()

    def _advance(self, offset: int, seq: int, delivered: int, rejected: int = 0) -> None:
        """Everything before byte ``offset`` (records up to ``seq``) is done."""
        with self._lock:
            self._offset, self._sent_seq = offset, max(self._sent_seq, seq)
            self.delivered += delivered
            self.rejected += rejected
            self._at_model = False
            self._cond.notify_all()

    def _back_off(self, delay: float) -> None:
        """Wait ``delay`` s before the next try. New records do not cut it short (each log
        call would otherwise cost a failed request); :meth:`close` does: while draining,
        tries come at least every second."""
        with self._lock:
            was_closing = self._closing
            until = time.monotonic() + (min(delay, 1.0) if was_closing else delay)
            while not self._stopped and not (self._closing and not was_closing):
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)

    def _reject(self, rec: dict, exc: Exception) -> None:
        if self.rejected < 5:
            log.warning("tracking: the server refused a %s record of run %s (%s); dropped", rec["kind"], self.run_id,
                        str(exc)[:300])

    def _went_down(self, error: str) -> None:
        self._last_error = error
        if self._down_since is None:
            self._down_since = time.time()
            log.warning("tracking: %s unreachable (%s); records are kept in %s and sent when it is back",
                        self.tracking_uri, error[:200], self.path)

    def _came_back(self) -> None:
        if self._down_since is not None:
            log.warning("tracking: %s reachable again after %.0f s; sending %d recorded record(s)", self.tracking_uri,
                        time.time() - self._down_since, self.pending())
            self._down_since = None

    def _save_ledger(self, force: bool = False) -> None:
        if not (self._ledger_dirty or force) or (not force and time.monotonic() - self._ledger_saved < 1.0):
            return
        with self._lock:
            data, self._ledger_dirty = dict(self.high_water), False
        tmp = self._ledger.with_name(self._ledger.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._ledger)
        self._ledger_saved = time.monotonic()

    # ----------------------------------------------------------------- adoption
    def _adopt(self) -> None:
        """Append the undelivered files other (finished) processes left for this run to
        this journal (durably, before the originals go)."""
        for path in sorted(self.spill_dir.glob(f"{glob.escape(self.run_id)}.*{UNDELIVERED_SUFFIX}")):
            try:
                header, start = read_header(path)
                body = records_after(path, load_cursor(path, start))
            except (OSError, ValueError) as exc:
                log.warning("tracking: cannot read %s (%s); leaving it for `hardpos track replay`", path, exc)
                continue
            if header.get("run_id", self.run_id) != self.run_id:
                continue
            self.put_many([{k: v for k, v in rec.items() if k != "seq"} for rec in body])
            drop_journal(path)
            if body:
                log.info("tracking: adopted %d undelivered record(s) of run %s from %s", len(body), self.run_id,
                         path.name)

    # ----------------------------------------------------------------- close
    def close(self, timeout: float | None = None, *, hand_off: bool = False) -> DeliveryReport:
        """Wait up to ``timeout`` s (default ``drain_timeout_s``) for the journal to be sent,
        then keep what is left in an undelivered file and return the report.

        ``hand_off``: do not wait while the server is unreachable (a Ray Train worker: the
        driver adopts the file and waits instead). Models are logged here, in the caller's
        thread, when the shipper reaches them and the server answers. Idempotent; never
        raises for tracking.
        """
        timeout = self.options.drain_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, timeout)
        if self._stopped:
            return self._report()
        self._adopt()  # e.g. the driver: what its Ray Train worker left
        with self._lock:
            self._closing = True
            self._cond.notify_all()
        while not self.local:
            with self._lock:
                left = deadline - time.monotonic()
                if self._offset >= self._size or left <= 0 or (hand_off and self._down_since is not None):
                    break
                if not self._at_model:
                    self._cond.wait(timeout=min(left, 0.25))
                    continue
            outcome = self._log_model()
            if outcome == "failed":
                break  # left for replay, with everything after it
            if outcome == "away":
                with self._lock:
                    self._cond.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        with self._lock:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.options.request_timeout_s + 1))
        self._fh.close()
        self._save_ledger(force=True)
        return self._finish(hand_off)

    def _log_model(self) -> str:
        """Log the model record the shipper stopped at, in the caller's thread -> ``"sent"``,
        ``"away"`` (the server does not answer: try again) or ``"failed"`` (leave it to replay)."""
        unit, after = read_unit(self.path, self._offset, self._size)
        if probe(self.tracking_uri, self.options.request_timeout_s):
            return "away"
        try:
            log_model_now(self.tracking_uri, self.run_id, unit[0]["dir"], self.options.request_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be logged now waits for replay
            self._last_error = f"log_model: {type(exc).__name__}: {str(exc)[:200]}"
            return "failed"
        self._advance(after, unit[0]["seq"], 1)
        return "sent"

    def _finish(self, hand_off: bool) -> DeliveryReport:
        """The journal -> an undelivered file with what is left, or gone; the report."""
        left = records_after(self.path, self._offset) if self._offset < self._size else []
        if left:
            header, _ = read_header(self.path)
            out = self.spill_dir / f"{self.run_id}.{self.proc}{UNDELIVERED_SUFFIX}"
            tmp = out.with_name(out.name + ".tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({**header, "written": time.time()}) + "\n")
                fh.writelines(json.dumps(r) + "\n" for r in left)
            os.replace(tmp, out)
        drop_journal(self.path)
        report = self._report(error=self._last_error if left else None)
        if report.undelivered_files:
            report.replay = f"hardpos track replay {self.spill_dir}"
            if not hand_off:
                why = "recorded locally (the server was down at the start)" if self.local else \
                    f"not delivered to {self.tracking_uri} ({(self._last_error or 'no answer')[:120]})"
                log.warning("tracking: %d record(s) of run %s %s; saved in %s; send them with: %s", report.undelivered,
                            self.run_id, why, self.spill_dir, report.replay)
        elif not hand_off:
            # The run's last owner and nothing left: the restart ledgers have done their job.
            for ledger in self.spill_dir.glob(f"{glob.escape(self.run_id)}.*{LEDGER_SUFFIX}"):
                ledger.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.spill_dir.rmdir()  # only when empty
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None
        return report

    def _report(self, error: str | None = None) -> DeliveryReport:
        files = sorted(self.spill_dir.glob(f"{glob.escape(self.run_id)}.*{UNDELIVERED_SUFFIX}"))
        undelivered = 0
        for f in files:
            with contextlib.suppress(OSError, ValueError):
                header, start = read_header(f)
                undelivered += len(records_after(f, load_cursor(f, start)))
        return DeliveryReport(self.tracking_uri, self.run_id, delivered=self.delivered, rejected=self.rejected,
                              undelivered=undelivered, undelivered_files=[str(f) for f in files], error=error)
