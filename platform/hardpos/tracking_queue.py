"""Tracking as a side channel: a bounded, non-blocking, spilling MLflow queue per process.

Every metric, param, tag, artifact and run-status change a :class:`hardpos.tracking.RunLogger`
records goes through the :class:`RunQueue` of its run in the calling process:

* ``put`` is O(1) and never touches the network: the record is stamped (sequence number,
  and for metrics the wall-clock timestamp that MLflow will store) and appended to an
  in-memory deque. A background thread sends the records, oldest first, in ``log_batch``
  calls (up to 1000 metrics / 100 params / 100 tags each) with a short request timeout,
  no HTTP retries of MLflow's own, and its own backoff (``retry_min_s`` doubling to
  ``retry_max_s``). A slow or dead tracking server therefore costs the caller nothing but
  the append.
* Memory is bounded: when ``max_queued_records`` records wait, they move to a JSON-lines
  spill file in the run's spill directory (``<output_dir>/tracking``). Records are always
  sent in sequence order: the spill file holds the oldest ones, memory the newest.
* :meth:`RunQueue.close` waits at most ``timeout`` seconds for the queue to drain, then
  writes whatever is left, in order, to ``<run_id>.<process>.undelivered.jsonl`` (first
  line: a header naming the run and the tracking URI) and returns a
  :class:`DeliveryReport`. :func:`replay` (``hardpos track replay <dir>``) sends such files
  later to the same run.
* While the server is unreachable each process logs one warning line when it goes away
  and one when it comes back, never one per retry.

Exactly once. A failed request can be ambiguous (sent, committed, the answer lost), so the
queue delivers *at least* once and makes every resend a no-op instead of checking what the
run holds first (one ``get_metric_history`` call per key per retry would turn a recovery
into a flood of reads): a record's content is fixed when it is queued, and

* a metric is ``(key, value, timestamp, step)``; MLflow's SQL store (sqlite, PostgreSQL,
  MySQL; directly or behind ``mlflow server``) keys metrics on exactly that and drops a
  resent identical row (``SqlAlchemyStore._log_metrics``); tested here against a real
  server and a commit-then-fail transport. A file store or a third-party backend that
  does not dedupe could store a resent batch twice after an ambiguous failure;
* a param may be re-logged with the same value (MLflow refuses only a different value);
* tags, run status and artifacts overwrite: resending them changes nothing.

Ray Train restarts. The rank-0 worker that raises closes its queue at once (no drain wait):
its undelivered records become a file that the restarted rank 0 adopts (appends to its
own spill file, then deletes) before logging anything. Each process also keeps a ledger
(``<run_id>.<process>.ledger.json``: the highest step queued per metric key) so that
:func:`last_logged_step` knows which steps were already logged even while the server is
down, and a restarted worker does not log re-trained steps a second time. A process killed
without running Python code (SIGKILL, a lost node) loses the records still in its memory
(at most ``max_queued_records``, usually the last second or two) and up to a second of
ledger updates.

Where the files are. ``spill_dir`` is a local folder (``<output_dir>/tracking``; for an
``s3://`` output_dir a folder under the system temp directory, named in summary.json). A
Ray Train worker that ends while the server is down does not wait: it leaves its file
there and the driver adopts it and waits instead (one ``drain_timeout_s`` per job, not per
process). On a multi-node cluster the driver sees a worker's file only when the folder is
shared (or the worker ran on the driver's node); otherwise the file stays on the worker's
node, named in that worker's log line.

Artifacts are copied into the spill directory when queued (the caller's temporary file may
vanish) and uploaded by the sender. A model (``log_model``) is never sent from the
background thread: :meth:`RunQueue.defer_model` keeps it for :meth:`RunQueue.close` (the
caller's thread) or for :func:`replay`.

Nothing here runs at import time; threads start on the first record of a run.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import glob
import itertools
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

# MLflow's log_batch limits (per request).
MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000
BATCH_KINDS = ("metric", "param", "tag")
UNDELIVERED_SUFFIX = ".undelivered.jsonl"
SPILL_SUFFIX = ".spill.jsonl"
LEDGER_SUFFIX = ".ledger.json"
LOCAL_PREFIX = "local-"
# MLflow error codes that no resend can fix (the record is dropped and counted as rejected).
_PERMANENT_CODES = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST", "INVALID_STATE",
                    "RESOURCE_ALREADY_EXISTS", "PERMISSION_DENIED", "UNAUTHENTICATED"}


class TrackingUnavailableError(RuntimeError):
    """The tracking server cannot be reached when a run starts (``tracking.required=true``)."""


class _Transient(Exception):
    """The server did not answer (or answered 429/5xx): keep the records and retry."""


class _Rejected(Exception):
    """The server refused the request for good (4xx): resending cannot help."""


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


# --------------------------------------------------------------------------- transport
def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


@contextlib.contextmanager
def fail_fast_http(timeout_s: float) -> Iterator[None]:
    """MLflow's own HTTP client with no retries and a short timeout, for a block.

    For the few *synchronous* calls (run creation, ``log_model``, a metric history read)
    that go through ``MlflowClient``: by default it retries with backoff for minutes. The
    environment is process-wide; the background sender never reads it (it passes its
    timeout and retries explicitly), so only the calling thread's block is affected.
    """
    names = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, round(timeout_s)))}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def short_error(exc: BaseException) -> str:
    """One short phrase for a failed request (the log line, not a urllib3 retry dump)."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    for needle, phrase in (("Connection refused", "connection refused"), ("timed out", "no answer (timed out)"),
                           ("Timeout", "no answer (timed out)"), ("Name or service not known", "host name not found"),
                           ("Temporary failure in name resolution", "host name not found"),
                           ("Connection reset", "connection reset"), ("RemoteDisconnected", "connection closed")):
        if needle in text:
            return phrase
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _classify(exc: BaseException) -> Exception:
    """An exception from MLflow -> _Transient (retry) or _Rejected (drop)."""
    if isinstance(exc, (_Transient, _Rejected)):
        return exc
    code = getattr(exc, "error_code", None)
    if code in _PERMANENT_CODES:
        return _Rejected(f"{code}: {exc}")
    return _Transient(f"{type(exc).__name__}: {exc}")


class HttpTransport:
    """REST calls to an ``mlflow server`` with an explicit timeout and no retries."""

    def __init__(self, uri: str, timeout_s: float) -> None:
        from mlflow.utils.credentials import get_default_host_creds

        self.uri, self.timeout_s = uri, timeout_s
        self._creds = get_default_host_creds(uri)
        self._artifact_uris: dict[str, str] = {}

    def _call(self, endpoint: str, method: str, creds=None, **kwargs) -> dict:
        from mlflow.utils.rest_utils import http_request

        try:
            resp = http_request(creds or self._creds, endpoint, method, max_retries=0, timeout=self.timeout_s,
                                raise_on_status=False, **kwargs)
        except Exception as exc:  # noqa: BLE001 - connection refused, timeout, DNS: all transient
            raise _Transient(short_error(exc)) from exc
        if resp.status_code == 200:
            return resp.json() if resp.text.strip() else {}
        text = resp.text[:300]
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Transient(f"HTTP {resp.status_code}: {text}")
        raise _Rejected(f"HTTP {resp.status_code}: {text}")

    def log_batch(self, run_id: str, metrics: list[dict], params: list[dict], tags: list[dict]) -> None:
        self._call("/api/2.0/mlflow/runs/log-batch", "POST", json={
            "run_id": run_id,
            "metrics": [{k: m[k] for k in ("key", "value", "timestamp", "step")} for m in metrics],
            "params": [{"key": p["key"], "value": p["value"]} for p in params],
            "tags": [{"key": t["key"], "value": t["value"]} for t in tags]})

    def terminate(self, run_id: str, status: str, end_time: int) -> None:
        self._call("/api/2.0/mlflow/runs/update", "POST", json={"run_id": run_id, "status": status, "end_time": end_time})

    def upload(self, run_id: str, local: Path, artifact_path: str | None) -> None:
        """PUT through the server's artifact proxy (``mlflow-artifacts:``), else straight to the store."""
        import mimetypes
        import posixpath

        from mlflow.utils.credentials import get_default_host_creds

        artifact_uri = self._artifact_uris.get(run_id)
        if artifact_uri is None:
            info = self._call("/api/2.0/mlflow/runs/get", "GET", params={"run_id": run_id})
            artifact_uri = self._artifact_uris[run_id] = info["run"]["info"]["artifact_uri"]
        if not artifact_uri.startswith("mlflow-artifacts:"):
            _store_upload(artifact_uri, local, artifact_path)
            return
        from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

        base = MlflowArtifactsRepository.resolve_uri(artifact_uri, self.uri)
        creds = get_default_host_creds(base)
        for path, rel in _files_of(local):
            dest = posixpath.join(*(p for p in (artifact_path, rel) if p))
            with open(path, "rb") as fh:
                self._call(posixpath.join("/", dest), "PUT", creds=creds, data=fh,
                           extra_headers={"Content-Type": mimetypes.guess_type(path.name)[0] or "application/octet-stream"})


def _files_of(local: Path) -> list[tuple[Path, str]]:
    """(file, artifact-relative path) for a file (its name) or a folder (its tree)."""
    if local.is_file():
        return [(local, local.name)]
    return [(p, p.relative_to(local).as_posix()) for p in sorted(local.rglob("*")) if p.is_file()]


def _store_upload(artifact_uri: str, local: Path, artifact_path: str | None) -> None:
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(artifact_uri)
    try:
        if local.is_dir():
            repo.log_artifacts(str(local), artifact_path)
        else:
            repo.log_artifact(str(local), artifact_path)
    except Exception as exc:  # noqa: BLE001
        raise _classify(exc) from exc


class ClientTransport:
    """Any other store (``sqlite:///``, ``postgresql://``...) through ``MlflowClient``."""

    def __init__(self, uri: str, timeout_s: float) -> None:
        from mlflow.tracking import MlflowClient

        self.uri, self.timeout_s = uri, timeout_s
        self._client = MlflowClient(uri)

    def _wrap(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified: a locked database retries, a bad value drops
            raise _classify(exc) from exc

    def log_batch(self, run_id: str, metrics: list[dict], params: list[dict], tags: list[dict]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        self._wrap(self._client.log_batch, run_id,
                   metrics=[Metric(m["key"], m["value"], m["timestamp"], m["step"]) for m in metrics],
                   params=[Param(p["key"], p["value"]) for p in params],
                   tags=[RunTag(t["key"], t["value"]) for t in tags])

    def terminate(self, run_id: str, status: str, end_time: int) -> None:
        self._wrap(self._client.set_terminated, run_id, status=status, end_time=end_time)

    def upload(self, run_id: str, local: Path, artifact_path: str | None) -> None:
        if local.is_dir():
            self._wrap(self._client.log_artifacts, run_id, str(local), artifact_path)
        else:
            self._wrap(self._client.log_artifact, run_id, str(local), artifact_path)


def transport_for(uri: str, timeout_s: float):
    return HttpTransport(uri, timeout_s) if is_http(uri) else ClientTransport(uri, timeout_s)


def probe(uri: str, timeout_s: float = 5.0, attempts: int = 1) -> str | None:
    """None when the tracking store answers within ``timeout_s``, else why not (one line).

    ``attempts`` > 1 retries a failure after 0.5 s, 1 s, ... (a blip is not an outage); a
    refused connection fails in milliseconds, so even then a dead server is known fast.
    """
    if not is_http(uri):
        return None  # a database URI: the first real call reports its own error
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    problem = None
    for attempt in range(max(1, attempts)):
        if attempt:
            time.sleep(0.5 * 2 ** (attempt - 1))
        try:
            # An endpoint every MLflow server serves (/health is not guaranteed behind a proxy).
            resp = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/experiments/search", "POST",
                                max_retries=0, timeout=timeout_s, raise_on_status=False, json={"max_results": 1})
        except Exception as exc:  # noqa: BLE001
            problem = short_error(exc)
            continue
        if resp.status_code == 429 or resp.status_code >= 500:
            problem = f"HTTP {resp.status_code} from {uri}"
            continue
        return None
    return problem


def deliver(transport, run_id: str, records: list[dict], spill_dir: str | None) -> None:
    """Send one unit: a batch of metric/param/tag records, or one ``end``/``artifact`` record."""
    kind = records[0]["kind"]
    if kind in BATCH_KINDS:
        transport.log_batch(run_id, [r for r in records if r["kind"] == "metric"],
                            [r for r in records if r["kind"] == "param"], [r for r in records if r["kind"] == "tag"])
    elif kind == "end":
        transport.terminate(run_id, records[0]["status"], records[0]["end_time"])
    elif kind == "artifact":
        local = Path(spill_dir or ".") / records[0]["path"]
        if not local.exists():
            raise _Rejected(f"artifact copy {local} is gone")
        transport.upload(run_id, local, records[0].get("artifact_path"))
    else:
        raise _Rejected(f"record kind {kind!r} cannot be sent from the queue")


def next_unit(records: list[dict] | collections.deque, start: int = 0) -> int:
    """How many records from ``start`` form the next request (log_batch limits respected)."""
    if start >= len(records):
        return 0
    if records[start]["kind"] not in BATCH_KINDS:
        return 1
    counts = {"metric": 0, "param": 0, "tag": 0}
    limits = {"metric": MAX_METRICS, "param": MAX_PARAMS, "tag": MAX_TAGS}
    n = 0
    while start + n < len(records) and n < MAX_ENTITIES:
        kind = records[start + n]["kind"]
        if kind not in BATCH_KINDS or counts[kind] >= limits[kind]:
            break
        counts[kind] += 1
        n += 1
    return n


# --------------------------------------------------------------------------- the queue
def _process_tag() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    """Atomically (temp file + rename): a reader never sees half a file."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON line ({exc})") from exc
    return rows


class RunQueue:
    """The per-process queue of one run. Create through :func:`queue_for`."""

    def __init__(self, tracking_uri: str, run_id: str, spill_dir: str | None, options: QueueOptions,
                 local: bool = False) -> None:
        import tempfile

        self.tracking_uri, self.run_id, self.options, self.local = tracking_uri, run_id, options, local
        self.spill_dir = Path(spill_dir) if spill_dir else Path(tempfile.gettempdir()) / "hardpos-tracking"
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        self.proc = _process_tag()
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

    # ----------------------------------------------------------------- sender thread
    def _run(self) -> None:
        transport = None
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
                if transport is None:
                    transport = transport_for(self.tracking_uri, self.options.request_timeout_s)
                self._send(transport, batch)
            except _Transient as exc:
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

    def _send(self, transport, batch: list[dict]) -> None:
        try:
            deliver(transport, self.run_id, batch, str(self.spill_dir))
            self._commit(batch[-1]["seq"], len(batch))
            self._drop_copies(batch)
            return
        except _Rejected as exc:
            if len(batch) == 1:
                self._reject(batch[0], exc)
                return
        for rec in batch:  # isolate the refused record(s); the rest still go
            try:
                deliver(transport, self.run_id, [rec], str(self.spill_dir))
                self._commit(rec["seq"], 1)
            except _Rejected as exc:
                self._reject(rec, exc)
            self._drop_copies([rec])

    def _drop_copies(self, records: list[dict]) -> None:
        """Delete the spill-dir copies of artifacts that are done."""
        for rec in records:
            if rec["kind"] == "artifact":
                _drop_copy(self.spill_dir, rec["path"])

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
        report.undelivered = sum(max(0, _count_lines(f) - 1) for f in files)
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
        _forget(self)
        return report

    def _write_undelivered(self, models: list[str]) -> int:
        """Stream what is left (spill file, memory, deferred models) into this process's
        undelivered file, header first (lock held) -> records written."""
        path = self.spill_dir / f"{self.run_id}.{self.proc}{UNDELIVERED_SUFFIX}"
        tmp = path.with_name(path.name + ".tmp")
        n = 0
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(json.dumps({"kind": "header", "run_id": self.run_id, "tracking_uri": self.tracking_uri,
                                  "local": self.local, "written": time.time(), "process": self.proc}) + "\n")
            if self._spill_offset < self._spill_size:
                with open(self._spill, encoding="utf-8") as fh:
                    fh.seek(self._spill_offset)
                    for line in fh:
                        if json.loads(line)["seq"] > self._done_seq:
                            out.write(line)
                            n += 1
            for rec in [*(r for r in self._memory if r["seq"] > self._done_seq),
                        *({"kind": "model", "dir": d} for d in models)]:
                out.write(json.dumps(rec) + "\n")
                n += 1
        if n:
            os.replace(tmp, path)
        else:
            tmp.unlink()
        return n

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


def log_model_now(tracking_uri: str, run_id: str, checkpoint_dir: str, timeout_s: float) -> str:
    """``log_model`` + the ``hardpos.model_uri`` tag, failing fast when the server is away."""
    from mlflow.tracking import MlflowClient

    from hardpos.mlflow_model import log_model

    with fail_fast_http(timeout_s):
        uri = log_model(run_id, checkpoint_dir, tracking_uri=tracking_uri)
        MlflowClient(tracking_uri).set_tag(run_id, "hardpos.model_uri", uri)
    return uri


def _drop_copy(spill_dir: Path, rel: str) -> None:
    """Remove an artifact copy (``artifacts/<run>/<id>/<name>``) and the folders it leaves empty."""
    folder = spill_dir / Path(rel).parent
    shutil.rmtree(folder, ignore_errors=True)
    for parent in (folder.parent, folder.parent.parent):
        with contextlib.suppress(OSError):
            parent.rmdir()


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


# --------------------------------------------------------------------------- registry
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
            q = _QUEUES[key] = RunQueue(tracking_uri, run_id, spill_dir, options, local=local)
            if not _ATEXIT:
                atexit.register(close_all)
                _ATEXIT = True
        return q


def existing_queue(tracking_uri: str, run_id: str, spill_dir: str | None) -> RunQueue | None:
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


# --------------------------------------------------------------------------- restarts
def ledger_step(spill_dir: str | None, run_id: str, key: str) -> int:
    """The highest step of ``key`` any process queued for the run, from the ledgers (0: none)."""
    import tempfile

    folder = Path(spill_dir) if spill_dir else Path(tempfile.gettempdir()) / "hardpos-tracking"
    best = 0
    for path in folder.glob(f"{glob.escape(run_id)}.*{LEDGER_SUFFIX}"):
        try:
            best = max(best, int(json.loads(path.read_text()).get(key, 0)))
        except (OSError, ValueError):
            continue
    return best


def last_logged_step(tracking_uri: str, run_id: str, spill_dir: str | None, key: str, options: QueueOptions,
                     local: bool = False) -> int:
    """The highest step logged for ``key``: in MLflow (when it answers fast) or queued by any
    process of this run (ledgers, adopted files). A resumed worker skips steps up to it."""
    q = queue_for(tracking_uri, run_id, spill_dir, options, local=local)  # adopts leftovers first
    best = max(ledger_step(spill_dir, run_id, key), q.high_water.get(key, 0))
    if local:
        return best
    if probe(tracking_uri, options.request_timeout_s) is None:
        from mlflow.tracking import MlflowClient

        try:
            with fail_fast_http(options.request_timeout_s):
                history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
            best = max(best, max((m.step for m in history), default=0))
        except Exception as exc:  # noqa: BLE001 - the ledger is the fallback
            log.warning("tracking: could not read %s's history from %s (%s); using the local ledger", key,
                        tracking_uri, str(exc)[:200])
    return best


# --------------------------------------------------------------------------- replay
@dataclasses.dataclass
class ReplayReport:
    """What :func:`replay` sent."""

    files: int = 0
    runs: dict[str, str] = dataclasses.field(default_factory=dict)  # run id in the file -> run id in MLflow
    delivered: int = 0
    rejected: int = 0
    left: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


def undelivered_files(path: str | os.PathLike) -> list[Path]:
    """Undelivered files at ``path`` (a file, or a folder searched recursively)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    return sorted(p.rglob(f"*{UNDELIVERED_SUFFIX}"))


def replay(path: str | os.PathLike, tracking_uri: str | None = None, timeout_s: float = 30.0) -> ReplayReport:
    """Send undelivered files to their runs, oldest record first; a file whose records all
    went is deleted, one that fails is rewritten with what is left (resending is harmless:
    see "Exactly once" above).

    ``tracking_uri`` overrides the URI each file names (the server moved). A run recorded
    locally (``local-...``: the server was down when the job started) is created first (same
    experiment, name, tags and start time); its new id is kept in ``<local id>.run.json``
    beside the file, so files of the same run replayed later land in the same run.
    """
    report = ReplayReport()
    files = undelivered_files(path)
    # Runs created locally first, parents before children (a child's parent tag may name a local run).
    parsed = []
    for f in files:
        rows = read_jsonl(f)
        if not rows or rows[0].get("kind") != "header":
            report.errors.append(f"{f}: no header line (not an undelivered tracking file)")
            continue
        parsed.append((f, rows[0], rows[1:]))
    parsed.sort(key=lambda item: (not any(r["kind"] == "create" for r in item[2]),
                                  any(str(v).startswith(LOCAL_PREFIX) for r in item[2] if r["kind"] == "create"
                                      for v in r.get("tags", {}).values()),
                                  str(item[0])))
    mapping = _known_local_runs(files)
    for f, header, rows in parsed:
        report.files += 1
        uri = tracking_uri or header["tracking_uri"]
        run_id = header["run_id"]
        try:
            if run_id.startswith(LOCAL_PREFIX):
                run_id = mapping.get(run_id) or _create_local_run(uri, run_id, rows, mapping, f.parent, timeout_s)
            report.runs[header["run_id"]] = run_id
        except Exception as exc:  # noqa: BLE001 - report and go on with the next file
            report.errors.append(f"{f}: cannot create run {run_id}: {type(exc).__name__}: {exc}"[:500])
            report.left += len(rows)
            continue
        left, delivered, rejected, error = _replay_rows(uri, run_id, rows, f.parent, timeout_s)
        report.delivered += delivered
        report.rejected += rejected
        if left:
            report.left += len(left)
            report.errors.append(f"{f}: {len(left)} record(s) left ({error})")
            _write_jsonl(f, [header, *left])
        else:
            f.unlink()
            for rec in rows:
                if rec["kind"] == "artifact":
                    _drop_copy(f.parent, rec["path"])
            run = glob.escape(header["run_id"])
            if not any(f.parent.glob(f"{run}.*{UNDELIVERED_SUFFIX}")):  # the run is complete in MLflow
                for ledger in f.parent.glob(f"{run}.*{LEDGER_SUFFIX}"):
                    ledger.unlink(missing_ok=True)
    return report


def _known_local_runs(files: list[Path]) -> dict[str, str]:
    mapping = {}
    for folder in {f.parent for f in files}:
        for p in folder.glob(f"{LOCAL_PREFIX}*.run.json"):
            try:
                mapping[p.name[: -len(".run.json")]] = json.loads(p.read_text())["run_id"]
            except (OSError, ValueError, KeyError):
                continue
    return mapping


def _create_local_run(uri: str, local_id: str, rows: list[dict], mapping: dict[str, str], folder: Path,
                      timeout_s: float) -> str:
    from mlflow.tracking import MlflowClient

    from hardpos.tracking import ensure_experiment

    create = next((r for r in rows if r["kind"] == "create"), None)
    if create is None:
        raise ValueError(f"run {local_id} was recorded locally but this file does not say how to create it "
                         f"(replay the folder holding its driver's file first)")
    tags = {k: mapping.get(v, v) for k, v in create.get("tags", {}).items()}
    with fail_fast_http(timeout_s):
        exp_id = ensure_experiment(create["experiment"], uri)
        run = MlflowClient(uri).create_run(exp_id, start_time=create.get("start_time"), tags=tags,
                                           run_name=create.get("run_name"))
    run_id = run.info.run_id
    mapping[local_id] = run_id
    (folder / f"{local_id}.run.json").write_text(json.dumps({"run_id": run_id, "tracking_uri": uri}))
    return run_id


def _replay_rows(uri: str, run_id: str, rows: list[dict], folder: Path, timeout_s: float
                 ) -> tuple[list[dict], int, int, str | None]:
    """Send ``rows`` in order -> (rows not sent, delivered, rejected, last error)."""
    transport = transport_for(uri, timeout_s)
    body = [r for r in rows if r["kind"] not in ("create",)]
    i, delivered, rejected = 0, 0, 0
    while i < len(body):
        if body[i]["kind"] == "model":
            try:
                log_model_now(uri, run_id, body[i]["dir"], timeout_s)
                delivered += 1
            except Exception as exc:  # noqa: BLE001
                return body[i:], delivered, rejected, f"log_model: {type(exc).__name__}: {str(exc)[:200]}"
            i += 1
            continue
        n = next_unit(body, i)
        unit = body[i:i + n]
        try:
            deliver(transport, run_id, unit, str(folder))
            delivered += n
        except _Transient as exc:
            return body[i:], delivered, rejected, str(exc)[:300]
        except _Rejected:
            for rec in unit:
                try:
                    deliver(transport, run_id, [rec], str(folder))
                    delivered += 1
                except _Rejected as exc:
                    rejected += 1
                    log.warning("replay: the server refused a %s record (%s); dropped", rec["kind"], str(exc)[:200])
                except _Transient as exc:
                    return body[body.index(rec, i):], delivered, rejected, str(exc)[:300]
        i += n
    return [], delivered, rejected, None
