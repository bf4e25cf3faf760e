"""The background sender of a :class:`hardpos.tracking.queue.RunQueue`: take the oldest
records, send them in one request, back off while the server is away, say so once.

Split out of :mod:`hardpos.tracking.queue` (issue 16: one module, one job) as a mixin, the
way :mod:`hardpos.data.perturb` keeps its rules: ``RunQueue`` owns the state (records in
memory and in the spill file, the lock and its condition, the counters) and the caller-side
and close-side methods; this class holds only what the sender thread runs. It reads and
writes ``RunQueue``'s attributes and calls its ``_take``/``_commit``/``_save_ledger``/
``pending``, so it is not usable on its own.
"""
from __future__ import annotations

import logging
import time

# The module, not its names: tests swap transport.transport_for for a switchable one.
from hardpos.tracking import transport
from hardpos.tracking.files import drop_copy
from hardpos.tracking.transport import Rejected, Transient, deliver

log = logging.getLogger("hardpos.tracking")


class Sender:
    """The sender-thread half of :class:`hardpos.tracking.queue.RunQueue` (a mixin)."""

    def _run(self) -> None:
        conn = None
        backoff = self.options.retry_min_s
        while True:
            with self._lock:
                while not self._stopped and self._seq == self._done_seq:
                    self._cond.wait(timeout=1.0)
                    if self._ledger_dirty:
                        break
                if self._stopped:
                    return
            self._save_ledger()
            batch = self._take()
            if not batch:
                continue
            try:
                if conn is None:
                    conn = transport.transport_for(self.tracking_uri, self.options.request_timeout_s)
                self._send(conn, batch)
            except Transient as exc:
                self._went_down(str(exc))
                self._back_off(backoff)
                backoff = min(backoff * 2, self.options.retry_max_s)
                continue
            except Exception as exc:  # noqa: BLE001 - never let the sender die on a surprise
                self._went_down(f"{type(exc).__name__}: {exc}")
                self._back_off(backoff)
                backoff = min(backoff * 2, self.options.retry_max_s)
                continue
            backoff = self.options.retry_min_s
            self._came_back()

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

    def _send(self, conn, batch: list[dict]) -> None:
        try:
            deliver(conn, self.run_id, batch, str(self.spill_dir))
            self._commit(batch[-1]["seq"], len(batch))
            self._drop_copies(batch)
            return
        except Rejected as exc:
            if len(batch) == 1:
                self._reject(batch[0], exc)
                return
        for rec in batch:  # isolate the refused record(s); the rest still go
            try:
                deliver(conn, self.run_id, [rec], str(self.spill_dir))
                self._commit(rec["seq"], 1)
            except Rejected as exc:
                self._reject(rec, exc)
            self._drop_copies([rec])

    def _drop_copies(self, records: list[dict]) -> None:
        """Delete the spill-dir copies of artifacts that are done."""
        for rec in records:
            if rec["kind"] == "artifact":
                drop_copy(self.spill_dir, rec["path"])

    def _reject(self, rec: dict, exc: Exception) -> None:
        if self.rejected < 5:
            log.warning("tracking: the server refused a %s record of run %s (%s); dropped", rec["kind"], self.run_id,
                        str(exc)[:300])
        self._commit(rec["seq"], 0, rejected=1)

    def _went_down(self, error: str) -> None:
        self._last_error = error
        if self._down_since is None:
            self._down_since = time.time()
            log.warning("tracking: %s unreachable (%s); records are kept (memory, then %s) and sent when it is back",
                        self.tracking_uri, error[:200], self.spill_dir)

    def _came_back(self) -> None:
        if self._down_since is not None:
            log.warning("tracking: %s reachable again after %.0f s; sending %d queued record(s)", self.tracking_uri,
                        time.time() - self._down_since, self.pending())
            self._down_since = None
