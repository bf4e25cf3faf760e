"""Talking to the tracking store: one request, a short timeout, no retries of MLflow's own.

A failed request is :class:`Transient` (no answer, 429, 5xx: the journal keeps the records
and the shipper tries again) or :class:`Rejected` (a 4xx or an MLflow error no resend can
fix: the record is dropped and counted). The retrying lives in
:mod:`hardpos.tracking.journal`, not here, so that a dead server costs one short request
per backoff step.

An ``mlflow server`` is spoken to over its public REST API through MLflow's own REST client
(an explicit timeout, no retries) with the credentials MLflow's client would use: its
documented settings (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD``, an ``MLFLOW_TRACKING_AUTH`` plugin, ``MLFLOW_TRACKING_INSECURE_TLS``,
``MLFLOW_TRACKING_SERVER_CERT_PATH``, ``MLFLOW_TRACKING_CLIENT_CERT_PATH``). Any other store
(sqlite, PostgreSQL, ...) goes through ``MlflowClient``.

The few synchronous MLflow calls a job makes through ``MlflowClient`` (creating its run,
reading a metric's history, ``log_model``) come after a probe, and :func:`fail_fast_mlflow`
sets MLflow's own HTTP client to fail fast for the whole process, once: no retries and a
30-second request timeout, unless the user set ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` /
``MLFLOW_HTTP_REQUEST_TIMEOUT`` themselves. It is never set and undone around a block:
the process environment is shared with every thread.

Exactly once. A failed request can be ambiguous (sent, committed, the answer lost), so the
queue delivers *at least* once and makes every resend a no-op instead of checking what the
run holds first (one ``get_metric_history`` call per key per retry would turn a recovery
into a flood of reads): a record's content is fixed when it is queued, and

* a metric is ``(key, value, timestamp, step)``; MLflow's SQL store (sqlite, PostgreSQL,
  MySQL; directly or behind ``mlflow server``) keys metrics on exactly that and drops a
  resent identical row (``SqlAlchemyStore._log_metrics``); tested against a real server and
  a commit-then-fail transport. A file store or a third-party backend that does not dedupe
  could store a resent batch twice after an ambiguous failure;
* a param may be re-logged with the same value (MLflow refuses only a different value);
* tags, run status and artifacts overwrite: resending them changes nothing.
"""
from __future__ import annotations

import collections
import mimetypes
import os
import posixpath
import re
import threading
import time
import urllib.parse
from pathlib import Path

import requests
from mlflow.entities import Metric, Param, RunTag
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient
from mlflow.tracking._tracking_service.utils import get_default_host_creds
from mlflow.utils.rest_utils import http_request

# MLflow's log_batch limits (per request).
MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000
BATCH_KINDS = ("metric", "param", "tag")
# MLflow error codes that no resend can fix (the record is dropped and counted as rejected).
_PERMANENT_CODES = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST", "INVALID_STATE",
                    "RESOURCE_ALREADY_EXISTS", "PERMISSION_DENIED", "UNAUTHENTICATED"}


class Transient(Exception):
    """The server did not answer (or answered 429/5xx): keep the records and retry."""


class Rejected(Exception):
    """The server refused the request for good (4xx): resending cannot help."""


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


_FAIL_FAST_LOCK = threading.Lock()
_FAIL_FAST_SET = False


def fail_fast_mlflow() -> None:
    """MLflow's own HTTP client fails fast in this process from now on: no retries, 30 s per
    request (a user's own ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``..._TIMEOUT`` win).

    Called by a job before its first synchronous MLflow call; set once and never undone
    (by default MLflow retries with backoff for minutes, which is what a job whose server
    died must not do). Idempotent and thread-safe."""
    global _FAIL_FAST_SET
    with _FAIL_FAST_LOCK:
        if not _FAIL_FAST_SET:
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
            _FAIL_FAST_SET = True


def rest(base_uri: str, endpoint: str, method: str, timeout_s: float, **kwargs) -> requests.Response:
    """One request to ``base_uri`` + ``endpoint`` through MLflow's own REST client
    (``mlflow.utils.rest_utils.http_request``) with the credentials MLflow's client would use
    for that host (token, basic auth, an ``MLFLOW_TRACKING_AUTH`` plugin, TLS settings, request
    header providers): ``timeout_s`` for connect and read, no retries (the journal retries), and
    the response returned whatever its status (the caller sorts transient from rejected)."""
    headers = kwargs.pop("headers", None)
    return http_request(get_default_host_creds(base_uri.rstrip("/")), "/" + endpoint.lstrip("/"), method,
                        max_retries=0, backoff_factor=0, timeout=timeout_s, raise_on_status=False,
                        extra_headers=headers, **kwargs)


def artifacts_url(artifact_uri: str, tracking_uri: str) -> str:
    """The HTTP URL of an ``mlflow-artifacts:`` location, served by the tracking server's
    artifact proxy (``/api/2.0/mlflow-artifacts/artifacts/<path>``); a host in the artifact
    URI wins over the tracking URI's."""
    track, art = urllib.parse.urlparse(tracking_uri), urllib.parse.urlparse(artifact_uri)
    path = re.sub(r"//+", "/", f"{track.path}/api/2.0/mlflow-artifacts/artifacts/{art.path}")
    return urllib.parse.urlunparse((track.scheme, art.netloc or track.netloc, path, "", "", "")).rstrip("/")


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


def classify(exc: BaseException) -> Exception:
    """An exception from MLflow -> Transient (retry) or Rejected (drop)."""
    if isinstance(exc, (Transient, Rejected)):
        return exc
    code = getattr(exc, "error_code", None)
    if code in _PERMANENT_CODES:
        return Rejected(f"{code}: {exc}")
    return Transient(f"{type(exc).__name__}: {exc}")


class HttpTransport:
    """REST calls to an ``mlflow server`` with an explicit timeout and no retries."""

    def __init__(self, uri: str, timeout_s: float) -> None:
        self.uri, self.timeout_s = uri, timeout_s
        self._artifact_uris: dict[str, str] = {}

    def _call(self, endpoint: str, method: str, base: str | None = None, **kwargs) -> dict:
        try:
            resp = rest(base or self.uri, endpoint, method, self.timeout_s, **kwargs)
        except Exception as exc:  # noqa: BLE001 - connection refused, timeout, DNS: all transient
            raise Transient(short_error(exc)) from exc
        if resp.status_code == 200:
            return resp.json() if resp.text.strip() else {}
        text = resp.text[:300]
        if resp.status_code == 429 or resp.status_code >= 500:
            raise Transient(f"HTTP {resp.status_code}: {text}")
        raise Rejected(f"HTTP {resp.status_code}: {text}")

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
        artifact_uri = self._artifact_uris.get(run_id)
        if artifact_uri is None:
            info = self._call("/api/2.0/mlflow/runs/get", "GET", params={"run_id": run_id})
            artifact_uri = self._artifact_uris[run_id] = info["run"]["info"]["artifact_uri"]
        if not artifact_uri.startswith("mlflow-artifacts:"):
            _store_upload(artifact_uri, local, artifact_path)
            return
        base = artifacts_url(artifact_uri, self.uri)
        for path, rel in _files_of(local):
            dest = posixpath.join(*(p for p in (artifact_path, rel) if p))
            with open(path, "rb") as fh:
                self._call(posixpath.join("/", dest), "PUT", base=base, data=fh,
                           headers={"Content-Type": mimetypes.guess_type(path.name)[0] or "application/octet-stream"})

    def log_inputs(self, run_id: str, datasets: list[dict]) -> None:
        self._call("/api/2.0/mlflow/runs/log-inputs", "POST", json={"run_id": run_id, "datasets": [
            {"tags": [{"key": "mlflow.data.context", "value": d["context"]}],
             "dataset": {k: d[k] for k in ("name", "digest", "source_type", "source")}} for d in datasets]})

    def metric_history(self, run_id: str, key: str) -> list[int]:
        """The steps logged for ``key`` (every page)."""
        steps, token = [], None
        while True:
            params = {"run_id": run_id, "metric_key": key, "max_results": 25000, **({"page_token": token} if token else {})}
            page = self._call("/api/2.0/mlflow/metrics/get-history", "GET", params=params)
            steps += [int(m.get("step", 0)) for m in page.get("metrics", [])]
            token = page.get("next_page_token")
            if not token:
                return steps


def _files_of(local: Path) -> list[tuple[Path, str]]:
    """(file, artifact-relative path) for a file (its name) or a folder (its tree)."""
    if local.is_file():
        return [(local, local.name)]
    return [(p, p.relative_to(local).as_posix()) for p in sorted(local.rglob("*")) if p.is_file()]


def _store_upload(artifact_uri: str, local: Path, artifact_path: str | None) -> None:
    repo = get_artifact_repository(artifact_uri)
    try:
        if local.is_dir():
            repo.log_artifacts(str(local), artifact_path)
        else:
            repo.log_artifact(str(local), artifact_path)
    except Exception as exc:  # noqa: BLE001
        raise classify(exc) from exc


class ClientTransport:
    """Any other store (``sqlite:///``, ``postgresql://``...) through ``MlflowClient``."""

    def __init__(self, uri: str, timeout_s: float) -> None:
        self.uri, self.timeout_s = uri, timeout_s
        self._client = MlflowClient(uri)

    def _wrap(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified: a locked database retries, a bad value drops
            raise classify(exc) from exc

    def log_batch(self, run_id: str, metrics: list[dict], params: list[dict], tags: list[dict]) -> None:
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

    def log_inputs(self, run_id: str, datasets: list[dict]) -> None:
        # lazy: the entity classes are only needed by a run that logs its inputs
        from mlflow.entities import Dataset, DatasetInput, InputTag

        self._wrap(self._client.log_inputs, run_id, [
            DatasetInput(Dataset(d["name"], d["digest"], d["source_type"], d["source"]),
                         [InputTag("mlflow.data.context", d["context"])]) for d in datasets])

    def metric_history(self, run_id: str, key: str) -> list[int]:
        return [m.step for m in self._wrap(self._client.get_metric_history, run_id, key)]


def transport_for(uri: str, timeout_s: float):
    return HttpTransport(uri, timeout_s) if is_http(uri) else ClientTransport(uri, timeout_s)


def probe(uri: str, timeout_s: float = 5.0, attempts: int = 1) -> str | None:
    """None when the tracking store answers within ``timeout_s``, else why not (one line).

    ``attempts`` > 1 retries a failure after 0.5 s, 1 s, ... (a blip is not an outage); a
    refused connection fails in milliseconds, so even then a dead server is known fast.
    """
    if not is_http(uri):
        return None  # a database URI: the first real call reports its own error
    problem = None
    for attempt in range(max(1, attempts)):
        if attempt:
            time.sleep(0.5 * 2 ** (attempt - 1))
        try:
            # An endpoint every MLflow server serves (/health is not guaranteed behind a proxy).
            resp = rest(uri, "/api/2.0/mlflow/experiments/search", "POST", timeout_s, json={"max_results": 1})
        except Exception as exc:  # noqa: BLE001
            problem = short_error(exc)
            continue
        if resp.status_code == 429 or resp.status_code >= 500:
            problem = f"HTTP {resp.status_code} from {uri}"
            continue
        return None
    return problem


def deliver(transport, run_id: str, records: list[dict], spill_dir: str | None) -> None:
    """Send one unit: a batch of metric/param/tag records, or one ``end``/``artifact``/``input`` record."""
    kind = records[0]["kind"]
    if kind in BATCH_KINDS:
        transport.log_batch(run_id, [r for r in records if r["kind"] == "metric"],
                            [r for r in records if r["kind"] == "param"], [r for r in records if r["kind"] == "tag"])
    elif kind == "end":
        transport.terminate(run_id, records[0]["status"], records[0]["end_time"])
    elif kind == "input":
        transport.log_inputs(run_id, records[0]["datasets"])
    elif kind == "artifact":
        local = Path(spill_dir or ".") / records[0]["path"]
        if not local.exists():
            raise Rejected(f"artifact copy {local} is gone")
        transport.upload(run_id, local, records[0].get("artifact_path"))
    else:
        raise Rejected(f"record kind {kind!r} cannot be sent from the queue")


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


def log_model_now(tracking_uri: str, run_id: str, checkpoint_dir: str, timeout_s: float) -> str:
    """``log_model`` + the ``hardpos.model_uri`` tag, failing fast when the server is away."""
    # lazy: hardpos.models.pyfunc loads torch, open_clip and mlflow.pyfunc (seconds); only a model
    # upload needs it, not every process that logs a metric.
    from hardpos.models.pyfunc import log_model

    fail_fast_mlflow()
    uri = log_model(run_id, checkpoint_dir, tracking_uri=tracking_uri)
    MlflowClient(tracking_uri).set_tag(run_id, "hardpos.model_uri", uri)
    return uri
