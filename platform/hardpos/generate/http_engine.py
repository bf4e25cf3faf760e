"""The HTTP engine: many requests in flight from a few Ray actors to any OpenAI-compatible endpoint.

Chat templates go to ``/v1/chat/completions``, raw ones to ``/v1/completions``
(:func:`http_url`, per row by its kind). The request rows are split into blocks of
``engine.http.batch_size`` so every actor has work from the start; each actor
(:class:`HttpGenerate`, a Ray Data async callable class) runs one :class:`HttpClient`: one
aiohttp connection pool and one event loop, on which the rows of every batch it holds are
sent concurrently, at most ``engine.http.max_in_flight`` at once. How many may be open, and
when the next one may go, is :mod:`hardpos.generate.flow`'s (pure) decision: an AIMD window
that 429 / 503 / Retry-After / timeouts shrink, and the ``qps`` / ``tokens_per_minute``
limits.

Every row gets an answer: a request's outcome is a fixed-schema envelope (``status``,
``body``, ``error``, ``attempts``) after its retries, which :func:`parse_chat_response`
(pure) turns into the engine columns, and the template's postprocess is applied; nothing a
server does raises out of a batch. Outputs are the same rows and verdicts whatever the
window or the number of actors (the deterministic stub pins this in the tests).
:func:`preflight` checks the endpoint from the driver before a job starts and raises
``ConfigError`` when it cannot serve it.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import threading
import time
from typing import Any

import aiohttp
import requests

from hardpos.config import ConfigError
from hardpos.generate.engine_config import (
    REQUEST_COLUMNS, EngineConfig, HttpEngineConfig, SamplingConfig, sampling_params, source_of,
)
from hardpos.generate.flow import OVERLOAD_STATUSES, FlowControl, prompt_tokens_estimate, retry_after_s
from hardpos.generate.prompts import PromptTemplate, postprocess
from hardpos.generate.vllm_engine import postprocess_modes

RETRYABLE = (408, 429, 502, 503, 504)


def http_headers(cfg: HttpEngineConfig, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Request headers: ``cfg.headers`` + ``Authorization: Bearer $<api_key_env>`` when set."""
    environ = os.environ if environ is None else environ
    headers = dict(cfg.headers)
    if cfg.api_key_env:
        key = environ.get(cfg.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
    return headers


def http_url(cfg: HttpEngineConfig, raw: bool) -> str:
    """The URL a request goes to: ``cfg.url`` for chat templates; for raw templates
    ``cfg.completions_url``, else the completions route next to ``cfg.url``. Pure."""
    if not raw:
        return cfg.url
    if cfg.completions_url:
        return cfg.completions_url
    base = cfg.url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base[: -len("/chat/completions")] + "/completions"
    if base.endswith("/completions"):
        return base
    raise ConfigError(f"raw prompts (prompt_mode: raw, e.g. prompts=paper) go to a /v1/completions route, and "
                      f"engine.http.url {cfg.url!r} does not end in /chat/completions to derive it from: "
                      "set engine.http.completions_url")


def preflight(cfg: HttpEngineConfig, payload: dict, environ: dict[str, str] | None = None,
              url: str | None = None) -> dict:
    """One request from the driver; raises ConfigError when the endpoint cannot serve the job.

    url: where to post (None: ``cfg.url``); a ``payload`` with ``prompt`` is a completions
    request, one with ``messages`` a chat one (the 404 message names the route it needs).
    Returns ``{"status", "latency_s"}``. Any other status (200, a 500 for this prompt, a
    429) means the endpoint is there: those are per-row outcomes, not configuration errors.
    """
    url = url or cfg.url
    headers = {"Content-Type": "application/json", **http_headers(cfg, environ)}
    start = time.perf_counter()
    try:
        resp = requests.post(url, json=payload, headers=headers, timeout=cfg.timeout_s)
    except requests.RequestException as exc:
        raise ConfigError(f"engine.http.url {url} is unreachable ({type(exc).__name__}: {exc}); "
                          "start the server or fix the URL (engine.http.preflight=false skips this check)") from exc
    latency = time.perf_counter() - start
    if resp.status_code in (401, 403):
        raise ConfigError(f"{url} refused the request (HTTP {resp.status_code}); set the API key in "
                          f"${cfg.api_key_env or '<engine.http.api_key_env>'}")
    if resp.status_code in (404, 405):
        if "prompt" in payload:
            raise ConfigError(f"{url} has no completions route (HTTP {resp.status_code}); raw prompts need an "
                              "OpenAI-compatible /v1/completions URL (engine.http.completions_url)")
        raise ConfigError(f"{url} has no chat/completions route (HTTP {resp.status_code}); the URL must end in "
                          "/v1/chat/completions")
    return {"status": resp.status_code, "latency_s": round(latency, 4)}


def preflight_requests(cfg: HttpEngineConfig, templates: dict[str, PromptTemplate], requests: list[dict],
                       sampling: SamplingConfig, environ: dict[str, str] | None = None) -> dict | None:
    """:func:`preflight` with the job's first request of each prompt mode, at its route.

    Returns None when there is no request, else ``{"status", "latency_s", "routes"}``: the
    first request's status and latency, and ``{url: status}`` of every route checked.
    """
    firsts: dict[bool, dict] = {}
    for r in requests:
        firsts.setdefault(templates[r["kind"]].raw, r)
    out: dict | None = None
    for raw, r in firsts.items():
        t = templates[r["kind"]]
        url = http_url(cfg, raw)
        res = preflight(cfg, request_payload(cfg.model, t, r["caption"], sampling), environ, url=url)
        if out is None:
            out = {**res, "routes": {}}
        out["routes"][url] = res["status"]
    return out


def chat_payload(model: str, messages: list[dict], s: SamplingConfig, template: PromptTemplate | None = None) -> dict:
    """A ``/v1/chat/completions`` body."""
    return {"model": model, "messages": messages, **sampling_params(s, template)}


def completion_payload(model: str, prompt: str, s: SamplingConfig, template: PromptTemplate | None = None) -> dict:
    """A ``/v1/completions`` body: the raw prompt, no chat template (``echo`` stays off, so the
    reply holds only the completion, like the release's ``return_full_text=False``)."""
    return {"model": model, "prompt": prompt, **sampling_params(s, template)}


def request_payload(model: str, template: PromptTemplate, caption: str, s: SamplingConfig) -> dict:
    """The body for one (template, caption): completions for a raw template, chat otherwise. Pure."""
    if template.raw:
        return completion_payload(model, template.raw_prompt(caption), s, template)
    return chat_payload(model, template.messages(caption), s, template)


def parse_chat_response(envelope: dict) -> dict:
    """A request's envelope (``status``, ``body``, ``error``, ``attempts``) -> the engine
    columns (minus source). Pure.

    Reads a chat reply (``choices[0].message.content``) or a completions one
    (``choices[0].text``)."""
    status = int(envelope.get("status") or 0)
    body = envelope.get("body") or ""
    out = {"raw_output": None, "engine_error": None, "engine_detail": None, "prompt_tokens": 0, "completion_tokens": 0}
    if status == 0:
        out.update(engine_error="request_failed",
                   engine_detail=f"{envelope.get('error') or 'no response'} after {envelope.get('attempts')} attempt(s)")
        return out
    try:
        data = json.loads(body) if body else None
    except json.JSONDecodeError:
        data = None
    if not 200 <= status < 300:
        message = ""
        if isinstance(data, dict):
            err = data.get("error")
            message = err.get("message", "") if isinstance(err, dict) else str(err or data.get("message") or "")
        out.update(engine_error="http_error", engine_detail=f"HTTP {status}: {message or body[:200]}".strip())
        return out
    if not isinstance(data, dict):
        out.update(engine_error="bad_response", engine_detail=f"not a JSON object: {body[:200]!r}")
        return out
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    out["prompt_tokens"] = int(usage.get("prompt_tokens") or 0)
    out["completion_tokens"] = int(usage.get("completion_tokens") or 0)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        out.update(engine_error="bad_response", engine_detail=f"no choices in reply: {body[:200]!r}")
        return out
    choice = choices[0]
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    text = message.get("content", choice.get("text"))
    # A null/empty completion is the model's answer (validator: "empty"), not an engine error.
    out["raw_output"] = text if isinstance(text, str) else (None if text is None else json.dumps(text))
    return out




# --------------------------------------------------------------------------- one actor's client
@dataclasses.dataclass(frozen=True)
class HttpSpec:
    """Everything an HTTP actor needs, resolved on the driver (:func:`http_spec`); picklable.

    urls: kind -> the URL its requests go to. qps / tokens_per_minute: this actor's share of
    the job's limits (None: none). The rest as in :class:`HttpEngineConfig`.
    """

    templates: dict[str, PromptTemplate]
    urls: dict[str, str]
    model: str
    sampling: SamplingConfig
    headers: dict[str, str]
    source: str
    postprocess: dict[str, str]
    max_in_flight: int = 64
    qps: float | None = None
    tokens_per_minute: float | None = None
    max_retries: int = 3
    retry_wait_s: float = 1.0
    timeout_s: float = 60.0


def http_spec(cfg: EngineConfig, templates: dict[str, PromptTemplate], environ: dict[str, str] | None = None,
              actors: int | None = None) -> HttpSpec:
    """The :class:`HttpSpec` of ``cfg`` for ``templates`` (pure apart from reading the API
    key's env var). actors: how many actors share the job's qps / tokens_per_minute (None:
    ``cfg.http.concurrency``). Raises ConfigError when a raw template has no completions URL."""
    h = cfg.http
    share = actors or h.concurrency
    return HttpSpec(
        templates=dict(templates), urls={k: http_url(h, t.raw) for k, t in templates.items()}, model=h.model,
        sampling=cfg.sampling, headers=http_headers(h, environ), source=source_of(cfg),
        postprocess=postprocess_modes(templates), max_in_flight=h.max_in_flight,
        qps=h.qps / share if h.qps else None,
        tokens_per_minute=h.tokens_per_minute / share if h.tokens_per_minute else None,
        max_retries=h.max_retries, retry_wait_s=h.retry_wait_s, timeout_s=h.timeout_s)


def request_cost(payload: dict) -> int:
    """A payload's tokens against a tokens-per-minute limit (:func:`prompt_tokens_estimate`)."""
    if "prompt" in payload:
        chars = len(payload["prompt"])
    else:
        chars = sum(len(str(m.get("content", ""))) for m in payload.get("messages", []))
    return prompt_tokens_estimate(chars, int(payload.get("max_tokens") or 0))


class HttpClient:
    """One actor's requests: one aiohttp session (a connection pool of ``max_in_flight``),
    one :class:`FlowControl`, on the event loop of the first :meth:`generate` call (every
    later call must come on that loop; Ray Data gives an actor's calls one loop).

    :meth:`generate` sends the rows it is given concurrently with those of every other call
    in progress, within the flow control's window, and returns their engine rows in input
    order; it never raises for a row.
    """

    def __init__(self, spec: HttpSpec):
        self.spec = spec
        self.flow = FlowControl.of(spec.max_in_flight, spec.qps, spec.tokens_per_minute, spec.retry_wait_s)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._timeout = aiohttp.ClientTimeout(total=spec.timeout_s)

    async def generate(self, rows: list[dict]) -> list[dict]:
        """Engine rows (request columns + engine columns) for request rows, in their order."""
        if self._session is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            # one pool per actor, as large as the window can get: a slot never waits for a connection
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.spec.max_in_flight, limit_per_host=0),
                headers={"Content-Type": "application/json", **self.spec.headers})
        return list(await asyncio.gather(*(self._row(r) for r in rows)))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def close(self) -> None:
        """Close the session from another thread than its loop's (an actor's teardown), so
        aiohttp has no unclosed session to complain about; best effort, never raises."""
        loop, session = self._loop, self._session
        if session is None or loop is None or session.closed:
            return
        try:
            if loop.is_running() and threading.get_ident() != self._loop_thread:
                asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout=5)
        except Exception:  # noqa: BLE001 - teardown: the process is going away
            pass

    # ---------------------------------------------------------------- the window
    async def _acquire(self, cost: int) -> int:
        """Wait for a window slot (and the rate limits); returns the request's epoch."""
        loop = self._loop
        assert loop is not None
        while True:
            wait = self.flow.ready(loop.time())
            if wait == 0.0:
                break
            if wait is None:  # full: the next request to finish wakes one waiter
                waiter = loop.create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():
                        self._wake()  # pass the wake-up on
                    raise
            else:  # a Retry-After pause
                await asyncio.sleep(wait)
        epoch, delay = self.flow.start(cost, loop.time())
        if self.flow.ready(loop.time()) == 0.0:
            self._wake()  # room for more (the window grew): wake the next in line too
        if delay > 0:
            await asyncio.sleep(delay)
        return epoch

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # ---------------------------------------------------------------- one row
    async def _post(self, url: str, payload: dict) -> tuple[int, str, str | None, float | None, bool]:
        """One attempt: (status, body, error, retry_after, overloaded); status 0 without a reply."""
        assert self._session is not None
        try:
            async with self._session.post(url, json=payload, timeout=self._timeout) as resp:
                body = (await resp.read()).decode("utf-8", errors="replace")
                retry_after = retry_after_s(resp.headers.get("Retry-After"), time.time())
                return resp.status, body, None, retry_after, resp.status in OVERLOAD_STATUSES
        except asyncio.TimeoutError:
            # the endpoint holds requests longer than timeout_s: as much a sign of a full one as a 429
            return 0, "", f"TimeoutError: no reply within {self.spec.timeout_s:g} s", None, True
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return 0, "", f"{type(exc).__name__}: {exc}"[:300], None, False

    async def _row(self, row: dict) -> dict:
        spec = self.spec
        kind = row["kind"]
        payload = request_payload(spec.model, spec.templates[kind], row["caption"], spec.sampling)
        url, cost = spec.urls[kind], request_cost(payload)
        status, body, error, attempts = 0, "", None, 0
        for attempt in range(spec.max_retries + 1):
            attempts = attempt + 1
            epoch = await self._acquire(cost)
            retry_after, overloaded = None, False
            try:
                status, body, error, retry_after, overloaded = await self._post(url, payload)
            finally:
                assert self._loop is not None
                self.flow.finish(epoch, overloaded, self._loop.time(), retry_after if status in RETRYABLE else None)
                self._wake()
            if status and status not in RETRYABLE:
                break
            if attempt < spec.max_retries:
                await asyncio.sleep(self.flow.retry_wait(attempt + 1, retry_after))
        out = parse_chat_response({"status": status, "body": body, "error": error or "", "attempts": attempts})
        out["raw_output"] = postprocess(out["raw_output"], spec.postprocess.get(kind, "none"))
        return {**{c: row.get(c) for c in REQUEST_COLUMNS}, **out, "source": spec.source}


def run_requests(spec: HttpSpec, rows: list[dict], batch_size: int | None = None) -> tuple[list[dict], FlowControl]:
    """Send ``rows`` from this process with one :class:`HttpClient` (no Ray): the engine rows
    in input order and the client's flow control (its counters). batch_size: hand the rows
    over in calls of this many, all in progress at once (as an actor holds several batches);
    None: one call. For tests and the benchmark's one-actor reference."""

    async def main() -> tuple[list[dict], FlowControl]:
        client = HttpClient(spec)
        try:
            step = batch_size or max(1, len(rows))
            parts = await asyncio.gather(*(client.generate(rows[i:i + step]) for i in range(0, len(rows), step)))
            return [r for part in parts for r in part], client.flow
        finally:
            await client.aclose()

    return asyncio.run(main())


# --------------------------------------------------------------------------- Ray Data
class HttpGenerate:
    """The Ray Data UDF (an async callable class; one instance per actor): a pyarrow batch of
    request rows -> the same rows with the engine columns, in order (:class:`HttpClient`)."""

    def __init__(self, spec: HttpSpec):
        self.spec = spec
        self.client: HttpClient | None = None

    async def __call__(self, batch):
        import pyarrow as pa  # lazy: actor side

        from hardpos.generate.rules_engine import engine_schema  # lazy: actor side

        if self.client is None:  # built on the actor's event loop, where every call runs
            self.client = HttpClient(self.spec)
        rows = await self.client.generate(batch.select(list(REQUEST_COLUMNS)).to_pylist())
        return pa.Table.from_pylist(rows, schema=engine_schema())

    def __del__(self):
        if getattr(self, "client", None) is not None:
            self.client.close()


def calls_per_actor(cfg: HttpEngineConfig) -> int:
    """Batches an actor works on at once: enough rows to fill its window twice over, so a
    slot that frees finds the next row waiting while finished batches go downstream, and
    at least two (one batch at a time would leave the window emptying at each batch's end)."""
    return max(2, -(-2 * cfg.max_in_flight // cfg.batch_size))


def http_map_kwargs(cfg: HttpEngineConfig) -> dict[str, Any]:
    """``map_batches`` keywords of the HTTP actors: a fixed pool of ``concurrency`` actors
    (an autoscaling pool starts with one and grows only on backlog), each taking
    :func:`calls_per_actor` batches at once (and as many more queued beside them), with
    fractional CPUs. Pure apart from importing Ray Data."""
    from ray.data import ActorPoolStrategy  # lazy: ray.data takes seconds to import

    calls = calls_per_actor(cfg)
    return {
        "batch_size": cfg.batch_size,
        "batch_format": "pyarrow",
        "zero_copy_batch": True,
        "num_cpus": cfg.num_cpus,
        "compute": ActorPoolStrategy(size=cfg.concurrency, max_concurrent_calls_per_actor=calls,
                                     max_tasks_in_flight_per_actor=2 * calls),
    }


def apply_http(ds, cfg: EngineConfig, templates: dict):
    """The request dataset -> engine rows: blocks of ``batch_size`` rows (so the first
    batches already reach every actor), then :class:`HttpGenerate` on the actor pool."""
    spec = http_spec(cfg, templates)
    return ds.repartition(target_num_rows_per_block=cfg.http.batch_size).map_batches(
        HttpGenerate, fn_constructor_kwargs={"spec": spec}, **http_map_kwargs(cfg.http))
