"""Tracking as a side channel: a bounded, non-blocking, spilling MLflow queue per process.

Every metric, param, tag, artifact and run-status change a :class:`hardpos.tracking.RunLogger`
records goes through the :class:`RunQueue` of its run in the calling process:

* ``put`` is O(1) and never touches the network: the record is stamped (sequence number,
  and for metrics the wall-clock timestamp that MLflow will store) and appended to an
  in-memory deque. A background thread sends the records, oldest first, in ``log_batch``
  calls (up to 1000 metrics / 100 params / 100 tags each) with a short request timeout,
  no HTTP retries of MLflow's own, and its own backoff (``retry_min_s`` doubling to
  ``retry_max_s``). A slow or dead tracking server therefore costs the caller nothing but
  the append. How a request is sent and why a resend is harmless:
  :mod:`hardpos.tracking.transport`; the sender thread's code: :mod:`hardpos.tracking.sender`.
* Memory is bounded: when ``max_queued_records`` records wait, they move to a JSON-lines
  spill file in the run's spill directory (``<output_dir>/tracking``; the files:
  :mod:`hardpos.tracking.files`). Records are always sent in sequence order: the spill
  file holds the oldest ones, memory the newest.
* :meth:`RunQueue.close` waits at most ``timeout`` seconds for the queue to drain, then
  writes whatever is left, in order, to ``<run_id>.<process>.undelivered.jsonl`` and
  returns a :class:`DeliveryReport`. :func:`hardpos.tracking.resend.replay`
  (``hardpos track replay <dir>``) sends such files later to the same run.
* While the server is unreachable each process logs one warning line when it goes away
  and one when it comes back, never one per retry.

Ray Train restarts. The rank-0 worker that raises closes its queue at once (no drain wait):
its undelivered records become a file that the restarted rank 0 adopts (appends to its
own spill file, then deletes) before logging anything. Each process also keeps a ledger
(the highest step queued per metric key) so that
:func:`hardpos.tracking.logger.last_logged_step` knows which steps were already logged even
while the server is down, and a restarted worker does not log re-trained steps a second
time. A process killed without running Python code (SIGKILL, a lost node) loses the
records still in its memory (at most ``max_queued_records``, usually the last second or
two) and up to a second of ledger updates.

Artifacts are copied into the spill directory when queued (the caller's temporary file may
vanish) and uploaded by the sender. A model (``log_model``) is never sent from the
background thread: :meth:`RunQueue.defer_model` keeps it for :meth:`RunQueue.close` (the
caller's thread) or for replay.

Nothing here runs at import time; threads start on the first record of a run.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import itertools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from hardpos.tracking.files import (LEDGER_SUFFIX, SPILL_SUFFIX, UNDELIVERED_SUFFIX, count_lines, process_tag,
                                    read_jsonl, spill_folder, write_undelivered)
from hardpos.tracking.sender import Sender
from hardpos.tracking.transport import MAX_ENTITIES, log_model_now, next_unit, probe

log = logging.getLogger("hardpos.tracking")


@dataclasses.dataclass(frozen=True)
class QueueOptions:
    """How a :class:`RunQueue` sends (see ``hardpos.config.TrackingConfig``).

    request_timeout_s: connect + read timeout of one request; no HTTP-level retries.
    max_queued_records: records held in memory before they move to the spill file.
    drain_timeout_s: the default wait of :meth:`RunQueue.close` for the queue to drain.
    retry_min_s / retry_max_s: the sender's backoff after a failed request (doubling).
    """

    request_timeout_s: float = 5.0
    max_queued_records: int = 10_000
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
        return dataclasses.asdict(self)


class RunQueue(Sender):
    """The per-process queue of one run. Create through :func:`hardpos.tracking.logger.queue_for`
    (one queue per run and process); ``on_close`` is called with the queue when it closed."""

    def __init__(self, tracking_uri: str, run_id: str, spill_dir: str | None, options: QueueOptions,
                 local: bool = False, on_close: Callable[[RunQueue], None] | None = None) -> None:
        self._on_close = on_close
        self.tracking_uri, self.run_id, self.options, self.local = tracking_uri, run_id, options, local
        self.spill_dir = spill_folder(spill_dir)
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        self.proc = process_tag()
        self.pid = os.getpid()
        self._spill = self.spill_dir / f"{run_id}.{self.proc}{SPILL_SUFFIX}"
        self._ledger = self.spill_dir / f"{run_id}.{self.proc}{LEDGER_SUFFIX}"
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._memory: collections.deque[dict] = collections.deque()
        self._spill_offset = 0      # bytes of the spill file already delivered
        self._spill_size = 0        # bytes written to the spill file
        self._seq = 0               # last sequence number given out
        self._done_seq = 0          # every record up to here was delivered or rejected
        self._closing = self._stopped = False
        self._down_since: float | None = None
        self._last_error: str | None = None
        self.delivered = self.rejected = 0
        self.high_water: dict[str, int] = {}
        self._ledger_dirty, self._ledger_saved = False, 0.0
        self._models: list[str] = []
        self._thread: threading.Thread | None = None
        self._adopt()
        if not local:
            self._thread = threading.Thread(target=self._run, name=f"hardpos-tracking-{run_id[:8]}", daemon=True)
            self._thread.start()

    # ----------------------------------------------------------------- caller side
    def put(self, record: dict) -> None:
        """Queue one record (never blocks on the network; see the module docstring)."""
        self.put_many([record])

    def put_many(self, records: list[dict]) -> None:
        """Queue records in order under one lock, waking the sender once (one log call ->
        at most one request while the server is healthy)."""
        with self._lock:
            for record in records:
                self._seq += 1
                record["seq"] = self._seq
                self._memory.append(record)
                if record["kind"] == "metric" and record["step"] > self.high_water.get(record["key"], -1):
                    self.high_water[record["key"]] = record["step"]
                    self._ledger_dirty = True
                if len(self._memory) >= self.options.max_queued_records:
                    self._spill_memory()
            self._cond.notify()

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
        """Log ``checkpoint_dir`` as this run's model at :meth:`close` (or by replay)."""
        with self._lock:
            self._models.append(str(checkpoint_dir))

    @property
    def unreachable(self) -> bool:
        """True while the last request failed (or for a run recorded locally)."""
        return self.local or self._down_since is not None

    def pending(self) -> int:
        with self._lock:
            return self._seq - self._done_seq

    # ----------------------------------------------------------------- spill file
    def _spill_memory(self) -> None:
        """Move every record in memory to the end of the spill file (lock held)."""
        if not self._memory or self._stopped:
            return
        with open(self._spill, "a", encoding="utf-8") as fh:
            data = "".join(json.dumps(r) + "\n" for r in self._memory)
            fh.write(data)
        self._spill_size += len(data.encode("utf-8"))
        self._memory.clear()

    def _read_spill(self, limit: int) -> list[dict]:
        """Up to ``limit`` undelivered records from the spill file (lock held)."""
        if self._spill_offset >= self._spill_size:
            return []
        out = []
        with open(self._spill, encoding="utf-8") as fh:
            fh.seek(self._spill_offset)
            for line in fh:
                rec = json.loads(line)
                if rec["seq"] > self._done_seq:
                    out.append(rec)
                    if len(out) >= limit:
                        break
        return out

    def _take(self) -> list[dict]:
        """The oldest undelivered records (a prefix of the stream), up to one request."""
        with self._lock:
            if self._stopped:
                return []
            head = self._read_spill(MAX_ENTITIES)
            if len(head) < MAX_ENTITIES:
                head += [r for r in itertools.islice(self._memory, MAX_ENTITIES - len(head)) if r["seq"] > self._done_seq]
        return head[:next_unit(head)]

    def _commit(self, last_seq: int, delivered: int, rejected: int = 0) -> None:
        """Every record up to ``last_seq`` is done: drop it from the spill file and memory."""
        with self._lock:
            if self._stopped:
                return
            self._done_seq = max(self._done_seq, last_seq)
            self.delivered += delivered
            self.rejected += rejected
            while self._memory and self._memory[0]["seq"] <= self._done_seq:
                self._memory.popleft()
            if self._spill_offset < self._spill_size:
                with open(self._spill, encoding="utf-8") as fh:
                    fh.seek(self._spill_offset)
                    while self._spill_offset < self._spill_size:
                        line = fh.readline()
                        if not line or json.loads(line)["seq"] > self._done_seq:
                            break
                        self._spill_offset += len(line.encode("utf-8"))
                if self._spill_offset >= self._spill_size:  # all sent: start the file afresh
                    self._spill.unlink(missing_ok=True)
                    self._spill_offset = self._spill_size = 0
            self._cond.notify_all()

    def _save_ledger(self, force: bool = False) -> None:
        if not (self._ledger_dirty or force) or (not force and time.monotonic() - self._ledger_saved < 1.0):
            return
        with self._lock:
            data, self._ledger_dirty = dict(self.high_water), False
        tmp = self._ledger.with_name(self._ledger.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._ledger)
        self._ledger_saved = time.monotonic()

    def _adopt(self) -> None:
        """Take over the undelivered files other (finished) processes left for this run."""
        for path in sorted(self.spill_dir.glob(f"{glob.escape(self.run_id)}.*{UNDELIVERED_SUFFIX}")):
            try:
                rows = read_jsonl(path)
            except (OSError, ValueError) as exc:
                log.warning("tracking: cannot read %s (%s); leaving it for `hardpos track replay`", path, exc)
                continue
            header = rows[0] if rows and rows[0].get("kind") == "header" else {}
            if header.get("run_id", self.run_id) != self.run_id:
                continue
            body = [r for r in rows if r.get("kind") != "header"]
            models = [r["dir"] for r in body if r["kind"] == "model"]
            with self._lock:
                self._models.extend(models)
                for rec in body:
                    if rec["kind"] == "model":
                        continue
                    rec = {k: v for k, v in rec.items() if k != "seq"}
                    self._seq += 1
                    rec["seq"] = self._seq
                    self._memory.append(rec)
                    if rec["kind"] == "metric" and rec["step"] > self.high_water.get(rec["key"], -1):
                        self.high_water[rec["key"]] = rec["step"]
                self._spill_memory()  # durable before the original goes
            path.unlink()
            if body:
                log.info("tracking: adopted %d undelivered record(s) of run %s from %s", len(body), self.run_id, path.name)

    # ----------------------------------------------------------------- close
    def close(self, timeout: float | None = None, *, hand_off: bool = False) -> DeliveryReport:
        """Wait up to ``timeout`` s (default ``drain_timeout_s``) for the queue to drain, then
        write what is left to an undelivered file and return the report.

        ``hand_off``: do not wait while the server is unreachable (a Ray Train worker: the
        driver adopts the file and waits instead). Deferred models are logged here, in the
        caller's thread, when the server answers. Idempotent; never raises for tracking.
        """
        timeout = self.options.drain_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, timeout)
        self._adopt()  # e.g. the driver: what its Ray Train worker left
        with self._lock:
            self._closing = True
            self._cond.notify_all()
            while not self.local and self._seq > self._done_seq and not (hand_off and self._down_since is not None):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=min(left, 0.25))
        models_left = self._log_models(deadline) if self._models else []
        with self._lock:
            self._stopped = True
            self._cond.notify_all()
            left = self._write_undelivered(models_left)
            self._memory.clear()
        self._spill.unlink(missing_ok=True)
        self._save_ledger(force=True)
        report = DeliveryReport(self.tracking_uri, self.run_id, delivered=self.delivered, rejected=self.rejected,
                                error=self._last_error if left else None)
        files = sorted(self.spill_dir.glob(f"{glob.escape(self.run_id)}.*{UNDELIVERED_SUFFIX}"))
        report.undelivered = sum(max(0, count_lines(f) - 1) for f in files)
        report.undelivered_files = [str(f) for f in files]
        if files:
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
        return report

    def _write_undelivered(self, models: list[str]) -> int:
        """What is left (spill file, memory, deferred models) -> this process's undelivered
        file (lock held) -> records written."""
        header = {"kind": "header", "run_id": self.run_id, "tracking_uri": self.tracking_uri, "local": self.local,
                  "written": time.time(), "process": self.proc}
        spill = (self._spill, self._spill_offset) if self._spill_offset < self._spill_size else None
        rest = [*(r for r in self._memory if r["seq"] > self._done_seq), *({"kind": "model", "dir": d} for d in models)]
        return write_undelivered(self.spill_dir / f"{self.run_id}.{self.proc}{UNDELIVERED_SUFFIX}", header, spill,
                                 self._done_seq, rest)

    def _log_models(self, deadline: float) -> list[str]:
        """Log deferred models now if the server answers (caller's thread); the rest stay."""
        left = []
        for directory in self._models:
            if self.local or time.monotonic() >= deadline or probe(self.tracking_uri, self.options.request_timeout_s):
                left.append(directory)
                continue
            try:
                log_model_now(self.tracking_uri, self.run_id, directory, self.options.request_timeout_s)
            except Exception as exc:  # noqa: BLE001 - a model that cannot be logged now waits for replay
                self._last_error = f"log_model: {type(exc).__name__}: {str(exc)[:200]}"
                left.append(directory)
        self._models = []
        return left
