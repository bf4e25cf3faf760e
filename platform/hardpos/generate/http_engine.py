"""The HTTP engine: ``ray.data.llm.HttpRequestProcessorConfig`` against any OpenAI-compatible endpoint.

Chat templates go to ``/v1/chat/completions``, raw ones to ``/v1/completions``
(:func:`http_url`; :func:`apply_http` runs one processor per prompt mode). Ray's HTTP stage
raises (killing the job) when retries run out or a body is empty/non-JSON, and hands 500s
back as normal replies; :class:`ResilientSession` owns retries instead and always returns a
``{"status", "body"}`` envelope, which :func:`parse_chat_response` (pure) turns into the
engine columns, so every row gets an answer. :func:`preflight` checks the endpoint from the
driver before a job starts and raises ``ConfigError`` when it cannot serve it.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from typing import Any

import aiohttp
import requests

from hardpos.config import ConfigError
from hardpos.generate.engine_config import (
    REQUEST_COLUMNS, EngineConfig, HttpEngineConfig, SamplingConfig, sampling_params, source_of,
)
from hardpos.generate.prompts import PromptTemplate, postprocess
from hardpos.generate.vllm_engine import postprocess_modes

RETRYABLE = (408, 429, 502, 503, 504)


class _Envelope:
    """What :class:`ResilientSession.post` resolves to: looks like an aiohttp response
    with status 200 whose JSON is ``{"status": <real status>, "body": <text>, ...}``."""

    status = 200
    reason = "OK"

    def __init__(self, payload: dict):
        self._payload = payload

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def json(self, *args, **kwargs):
        return self._payload


class ResilientSession:
    """An aiohttp session for Ray's HttpRequestUDF that never raises per request.

    Retries 408/429/5xx-gateway statuses and connection errors with exponential backoff,
    then reports the final outcome in a fixed-schema envelope (``status``, ``body``,
    ``error``, ``attempts``) that the stage's postprocess turns into an output or a reject.
    A fixed schema also keeps Ray Data's Arrow blocks uniform across good and bad rows.
    """

    def __init__(self, max_retries: int = 3, retry_wait_s: float = 1.0, timeout_s: float = 60.0):
        self.max_retries, self.retry_wait_s, self.timeout_s = max_retries, retry_wait_s, timeout_s
        self._session = None

    async def __aenter__(self):
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await self._session.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._session.__aexit__(*exc)

    def post(self, url: str, **kwargs) -> Any:
        return self._post(url, **kwargs)

    async def _post(self, url: str, **kwargs) -> _Envelope:
        status, body, error = 0, "", None
        attempt = 0
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.retry_wait_s * (2 ** (attempt - 1)))
            try:
                async with self._session.post(url, **kwargs) as resp:
                    status, error = resp.status, None
                    body = (await resp.read()).decode("utf-8", errors="replace")
                if status not in RETRYABLE:
                    break
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                status, body, error = 0, "", f"{type(exc).__name__}: {exc}"[:300]
        return _Envelope({"status": status, "body": body, "error": error or "", "attempts": attempt + 1})


def resilient_session_factory(cfg: HttpEngineConfig):
    """A picklable zero-argument session factory for ``HttpRequestProcessorConfig``."""
    return functools.partial(ResilientSession, cfg.max_retries, cfg.retry_wait_s, cfg.timeout_s)


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


def build_http_processor_config(cfg: HttpEngineConfig, environ: dict[str, str] | None = None,
                                url: str | None = None):
    """The ``HttpRequestProcessorConfig`` for ``cfg`` (pure apart from reading the API key env var).

    url: the route this processor posts to (None: ``cfg.url``; :func:`apply_http` passes
    :func:`http_url` for its prompt mode).
    Retries live in :class:`ResilientSession` (so the Ray stage's own ``max_retries`` is 0:
    its exhausted retries would raise and fail the whole job); actors get fractional CPUs.
    """
    from ray.data.llm import HttpRequestProcessorConfig  # lazy: ray.data.llm takes ~2.6 s to import

    url = url or cfg.url
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"engine.http.url must be an http(s) URL, got {url!r}")
    if cfg.concurrency < 1 or cfg.batch_size < 1:
        raise ConfigError("engine.http.concurrency and engine.http.batch_size must be >= 1")
    if not 0 < cfg.num_cpus <= 64:
        raise ConfigError(f"engine.http.num_cpus must be in (0, 64], got {cfg.num_cpus}")
    if cfg.qps is not None and cfg.qps < 1:
        raise ConfigError(f"engine.http.qps must be >= 1 or null, got {cfg.qps}")
    return HttpRequestProcessorConfig(
        url=url,
        headers=http_headers(cfg, environ),
        qps=cfg.qps,
        max_retries=0,
        concurrency=cfg.concurrency,
        batch_size=cfg.batch_size,
        session_factory=resilient_session_factory(cfg),
        # A fixed pool (n, n): an autoscaling pool starts with one actor and only grows on
        # backlog, which for latency-bound requests leaves most of the concurrency unused.
        http_request_stage={"num_cpus": cfg.num_cpus, "concurrency": (cfg.concurrency, cfg.concurrency)},
    )


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


class HttpPre:
    """Request row -> ``{"payload": <completions or chat/completions body>}``."""

    def __init__(self, templates: dict, model: str, sampling: SamplingConfig):
        self.templates, self.model, self.sampling = templates, model, sampling

    def __call__(self, row: dict) -> dict:
        return {"payload": request_payload(self.model, self.templates[row["kind"]], row["caption"], self.sampling)}


def parse_chat_response(envelope: dict) -> dict:
    """A :class:`ResilientSession` envelope -> the engine columns (minus source). Pure.

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


class HttpPost:
    """HTTP reply row -> request columns + engine columns (raw_output post-processed as
    the row's template says)."""

    def __init__(self, source: str, postprocess_by_kind: dict[str, str] | None = None):
        self.source, self.post = source, postprocess_by_kind or {}

    def __call__(self, row: dict) -> dict:
        env = row.get("http_response")
        env = env if isinstance(env, dict) else {"status": 0, "error": f"unexpected reply {env!r}"[:200]}
        out = parse_chat_response(env)
        out["raw_output"] = postprocess(out["raw_output"], self.post.get(row.get("kind"), "none"))
        return {**{c: row.get(c) for c in REQUEST_COLUMNS}, **out, "source": self.source}


def _kind_in(kinds: frozenset, row: dict) -> bool:
    return row["kind"] in kinds


def _rows_of_kinds(ds, kinds: frozenset):
    """The rows of ``ds`` whose kind is in ``kinds``: a Ray Data expression where this Ray
    has one (vectorised, no per-row Python), else a row predicate."""
    try:
        from ray.data.expressions import col  # lazy: a feature probe (older Ray lacks it)

        expr = col("kind").is_in(sorted(kinds))
    except (ImportError, AttributeError):
        return ds.filter(functools.partial(_kind_in, kinds))
    return ds.filter(expr=expr)


def apply_http(ds, cfg: EngineConfig, templates: dict):
    """One HTTP processor per prompt mode the templates use (a processor posts to one URL):
    chat kinds to ``/v1/chat/completions``, raw kinds to ``/v1/completions``; with both,
    the request rows are split by kind and the two outputs unioned (each has its own pool
    of ``concurrency`` actors)."""
    from ray.data.llm import build_processor  # lazy: ray.data.llm takes ~2.6 s to import

    by_mode: dict[bool, frozenset] = {}
    for raw in (False, True):
        kinds = frozenset(k for k, t in templates.items() if t.raw == raw)
        if kinds:
            by_mode[raw] = kinds
    outputs = []
    for raw, kinds in by_mode.items():
        processor = build_processor(
            build_http_processor_config(cfg.http, url=http_url(cfg.http, raw)),
            preprocess=HttpPre(templates, cfg.http.model, cfg.sampling),
            postprocess=HttpPost(source_of(cfg), postprocess_modes(templates)),
            # pre/postprocess are cheap row maps; fractional CPUs keep them from starving actors.
            preprocess_map_kwargs={"num_cpus": 0.25},
            postprocess_map_kwargs={"num_cpus": 0.25},
        )
        part = ds if len(by_mode) == 1 else _rows_of_kinds(ds, kinds)
        outputs.append(processor(part))
    return outputs[0] if len(outputs) == 1 else outputs[0].union(*outputs[1:])

