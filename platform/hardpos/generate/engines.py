"""The three generation engines behind one Ray Data contract.

Every engine is ``apply(ds) -> ds``: it takes the request dataset (columns
:data:`REQUEST_COLUMNS`: one row per (caption, prompt kind)) and returns it with the
engine columns :data:`ENGINE_COLUMNS` added, one output row per input row, never raising
for a single bad row:

``raw_output``         the engine's text (None when it produced none)
``engine_error``       None, or a machine-readable reason: ``http_error`` (non-2xx status
                       after retries), ``request_failed`` (connection/timeouts after
                       retries), ``bad_response`` (unparseable body or no choices),
                       ``inference_error`` (vLLM failed on the row), ``no_rule`` (the rule
                       engine has no edit of that kind for the caption)
``engine_detail``      human-readable detail for the error (status, message), else None
``prompt_tokens`` / ``completion_tokens``  token counts where the engine reports them
``source``             provenance: ``llm:<model>`` or ``rule``

Engines:

* ``vllm``  -- ``ray.data.llm.vLLMEngineProcessorConfig`` + ``build_processor`` on GPU
  actors (:func:`build_vllm_processor_config` is pure and unit-tested on CPU).
* ``http``  -- ``ray.data.llm.HttpRequestProcessorConfig`` against any OpenAI-compatible
  endpoint: ``/v1/chat/completions`` for chat templates, ``/v1/completions`` for raw ones
  (:func:`build_http_processor_config`, :func:`http_url`). Ray's HTTP
  stage raises (killing the job) when retries run out or a body is empty/non-JSON, and
  hands 500s back as normal replies; :class:`ResilientSession` owns retries instead and
  always returns a ``{"status", "body"}`` envelope so every row gets an answer.
* ``rules`` -- :class:`hardpos.data.perturb.RulePerturber` in CPU ``map_batches`` tasks.

The LLM engines send each template as it says (:class:`hardpos.generate.prompts.PromptTemplate`):
a chat template as messages, a raw template as one prompt string with no chat template;
with its own ``sampling`` settings over ``engine.sampling`` (:func:`sampling_params`); and
``raw_output`` is its completion after the template's ``postprocess`` ("none": as generated).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Literal

from hardpos.config import ConfigError
from hardpos.generate.prompts import PromptTemplate, postprocess

REQUEST_COLUMNS = ("request_id", "shard", "caption_id", "caption", "kind", "polarity")
ENGINE_COLUMNS = ("raw_output", "engine_error", "engine_detail", "prompt_tokens", "completion_tokens", "source")
ENGINE_REASONS = ("http_error", "request_failed", "bad_response", "inference_error", "no_rule")


# --------------------------------------------------------------------------- configs
@dataclasses.dataclass
class SamplingConfig:
    """Decoding defaults of the LLM engines. A template's own ``sampling:`` settings (in
    its prompt file) override these field by field; the bundled ``paper`` prompts set
    max_tokens, temperature, top_p and top_k per kind, so with them only ``stop`` and
    what they leave unset come from here.

    max_tokens: most tokens generated per request (a caption is ~15-30 tokens).
    temperature: sampling temperature (0 = greedy, reproducible).
    top_p: nucleus sampling mass.
    top_k: sample from the k most likely tokens (None: the engine's default, no limit).
        Sent as ``top_k``, which vLLM (offline and its OpenAI server) accepts and the
        OpenAI API does not.
    stop: strings that end generation (empty: none).
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class VLLMEngineConfig:
    """vLLM on GPU actors via ``ray.data.llm`` (production path).

    model_source: HF model id or local/s3 path of the model weights.
    tensor_parallel_size / pipeline_parallel_size: GPUs per engine replica = their product.
    concurrency: number of engine replicas (GPU actors); total GPUs = concurrency * TP * PP.
    batch_size: rows per Ray Data batch sent to a replica.
    max_concurrent_batches: batches in flight per replica (overlaps tail latency).
    chat_template: for chat-mode templates: True applies the model's chat template to the
        messages; False sends their plain-text rendering (base models). Raw-mode templates
        (the bundled ``paper`` prompts) always go as their raw prompt, chat template off;
        one job's templates must then agree on it (see :func:`vllm_chat_stage`).
    max_model_len: context length the engine reserves KV cache for.
    gpu_memory_utilization: fraction of GPU memory vLLM may take.
    accelerator_type: e.g. "A100", "H100", or null for any GPU.
    engine_kwargs: extra vLLM engine args (override the ones above).
    """

    model_source: str = "Qwen/Qwen2.5-0.5B-Instruct"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    concurrency: int = 1
    batch_size: int = 64
    max_concurrent_batches: int = 8
    chat_template: bool = True
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.85
    accelerator_type: str | None = None
    engine_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class HttpEngineConfig:
    """Any OpenAI-compatible chat/completions endpoint (``vllm serve``, a hosted API).

    url: full URL of the chat/completions route (chat-mode templates).
    completions_url: full URL of the completions route, for raw-mode templates (the
        bundled ``paper`` prompts); None derives it from ``url`` (``.../chat/completions``
        -> ``.../completions``; a ``url`` that already ends in ``/completions`` is used as is).
    model: the "model" field sent in each request (and recorded as llm:<model>).
    api_key_env: name of the env var holding the API key (sent as "Authorization: Bearer");
        unset/empty variable -> no Authorization header. The key itself never goes in config.
    headers: extra request headers.
    qps: requests per second per actor (None: as fast as replies come).
    max_retries: retries per request on 408/429/502/503/504 and connection errors.
    retry_wait_s: base wait of the exponential backoff between retries.
    timeout_s: per-request timeout.
    concurrency: number of HTTP actors. Each actor sends its requests ONE AT A TIME, so
        throughput ~ concurrency / latency: raise it for slow endpoints.
    batch_size: rows per actor batch.
    num_cpus: CPUs reserved per HTTP actor; fractional so a small cluster never deadlocks
        (actors mostly wait on the network).
    preflight: send one real request (per route the job's prompts use) from the driver
        before the job starts; an unreachable
        endpoint, a wrong route (404) or a refused key (401/403) is then a clear error up
        front instead of every row becoming a reject after its retries.
    """

    url: str = "http://127.0.0.1:8000/v1/chat/completions"
    completions_url: str | None = None
    model: str = "default"
    api_key_env: str | None = "OPENAI_API_KEY"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    qps: int | None = None
    max_retries: int = 3
    retry_wait_s: float = 1.0
    timeout_s: float = 60.0
    concurrency: int = 2
    batch_size: int = 16
    num_cpus: float = 0.25
    preflight: bool = True


@dataclasses.dataclass
class RulesEngineConfig:
    """The CPU rule engine (hardpos.data.perturb.RulePerturber).

    batch_size: rows per map_batches task.
    num_cpus: CPUs per rule task (Ray runs as many tasks as the cluster's CPUs allow).
    lexicon: "auto" (the world's lexicon when the input is a synthetic world, else the full
        one), "default" or "world".
    """

    batch_size: int = 256
    num_cpus: float = 1.0
    lexicon: Literal["auto", "default", "world"] = "auto"


@dataclasses.dataclass
class EngineConfig:
    """Which engine generates, and its settings.

    kind: "rules" (CPU, no model), "http" (OpenAI-compatible endpoint) or "vllm" (GPU actors).
    """

    kind: Literal["rules", "http", "vllm"] = "rules"
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    vllm: VLLMEngineConfig = dataclasses.field(default_factory=VLLMEngineConfig)
    http: HttpEngineConfig = dataclasses.field(default_factory=HttpEngineConfig)
    rules: RulesEngineConfig = dataclasses.field(default_factory=RulesEngineConfig)


def model_name(cfg: EngineConfig) -> str:
    """The model recorded in provenance and summaries."""
    if cfg.kind == "vllm":
        return cfg.vllm.model_source
    if cfg.kind == "http":
        return cfg.http.model
    return "rules"


def source_of(cfg: EngineConfig) -> str:
    return "rule" if cfg.kind == "rules" else f"llm:{model_name(cfg)}"


# --------------------------------------------------------------------------- vLLM
def vllm_engine_kwargs(cfg: VLLMEngineConfig) -> dict[str, Any]:
    kwargs = {
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "max_model_len": cfg.max_model_len,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        # Prompts share long few-shot prefixes: prefix caching saves most prefill work.
        "enable_prefix_caching": True,
    }
    if cfg.tensor_parallel_size * cfg.pipeline_parallel_size > 1:
        # Multi-GPU replicas need Ray as the executor backend inside the actor.
        kwargs["distributed_executor_backend"] = "ray"
    kwargs.update(cfg.engine_kwargs)
    return kwargs


def build_vllm_processor_config(cfg: VLLMEngineConfig, chat_template: bool | None = None):
    """The ``vLLMEngineProcessorConfig`` for ``cfg`` (pure; constructing it needs no GPU).

    chat_template: whether the processor runs the chat-template stage (None: ``cfg.chat_template``;
    :func:`apply_vllm` passes :func:`vllm_chat_stage` of the job's templates).
    ``should_continue_on_error`` is always on: a row vLLM fails on becomes a reject
    (``inference_error``), never a crashed job.
    """
    from ray.data.llm import vLLMEngineProcessorConfig

    for name in ("tensor_parallel_size", "pipeline_parallel_size", "concurrency", "batch_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"engine.vllm.{name} must be >= 1, got {getattr(cfg, name)}")
    return vLLMEngineProcessorConfig(
        model_source=cfg.model_source,
        engine_kwargs=vllm_engine_kwargs(cfg),
        concurrency=cfg.concurrency,
        batch_size=cfg.batch_size,
        max_concurrent_batches=cfg.max_concurrent_batches,
        accelerator_type=cfg.accelerator_type,
        chat_template_stage=cfg.chat_template if chat_template is None else chat_template,
        tokenize_stage=True,
        detokenize_stage=True,
        should_continue_on_error=True,
    )


def sampling_params(s: SamplingConfig, template: PromptTemplate | None = None) -> dict[str, Any]:
    """The decoding settings of one request: ``s`` overridden by the template's own. Pure.

    Always max_tokens, temperature and top_p; top_k and stop only when set (an endpoint
    that does not know top_k never sees it unless a template or config asks for it).
    """
    out: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
    if s.top_k is not None:
        out["top_k"] = s.top_k
    if s.stop:
        out["stop"] = list(s.stop)
    if template is not None:
        out.update(template.sampling.overrides())
    return out


def vllm_chat_stage(templates: dict[str, PromptTemplate], chat_template: bool) -> bool:
    """Whether the vLLM processor runs its chat-template stage for these templates.

    The stage is all-or-nothing per processor (it needs ``messages`` on every row), so raw
    templates need it off and chat templates with ``chat_template=True`` need it on; a
    file mixing the two would need two sets of GPU replicas, and is refused.
    """
    wants = {(not t.raw) and chat_template for t in templates.values()}
    if len(wants) > 1:
        raw = sorted(k for k, t in templates.items() if t.raw)
        chat = sorted(k for k, t in templates.items() if not t.raw)
        raise ConfigError(f"the vllm engine sends one job's prompts either through the model's chat template or "
                          f"raw, but raw kinds {raw} and chat kinds {chat} are mixed: run them as two jobs "
                          "(kinds=[...]) or set engine.vllm.chat_template=false (chat prompts then go as plain text)")
    return wants.pop() if wants else chat_template


# vLLM's own "not set" values, for keys some rows of a job set and others do not
VLLM_UNSET = {"top_k": -1, "stop": None}


class VLLMPre:
    """Request row -> vLLM input: ``messages`` (chat template on), or a plain ``prompt``
    (a raw template's own, or a chat template's plain-text rendering), plus the row's
    ``sampling_params`` (the template's settings over the engine's).

    Every row's sampling_params has the same keys (those any template sets, the rest
    given vLLM's "not set" value), so Ray Data's Arrow blocks keep one struct type and
    vLLM never receives a null where it expects a number.
    """

    def __init__(self, templates: dict, sampling: SamplingConfig, chat_template: bool):
        self.templates, self.sampling, self.chat = templates, sampling, chat_template
        self.keys = sorted({k for t in templates.values() for k in sampling_params(sampling, t)})

    def __call__(self, row: dict) -> dict:
        t = self.templates[row["kind"]]
        params = sampling_params(self.sampling, t)
        out = {"sampling_params": {k: params.get(k, VLLM_UNSET.get(k)) for k in self.keys}}
        if t.raw:
            out["prompt"] = t.raw_prompt(row["caption"])
        elif self.chat:
            out["messages"] = t.messages(row["caption"])
        else:
            out["prompt"] = t.prompt_text(row["caption"])
        return out


def postprocess_modes(templates: dict[str, PromptTemplate]) -> dict[str, str]:
    """kind -> the template's postprocess mode (what the engines' post steps need of them)."""
    return {k: t.postprocess for k, t in templates.items()}


class VLLMPost:
    """vLLM output row -> the engine columns (request columns carried over)."""

    def __init__(self, source: str, postprocess_by_kind: dict[str, str] | None = None):
        self.source, self.post = source, postprocess_by_kind or {}

    def __call__(self, row: dict) -> dict:
        return {
            **{c: row.get(c) for c in REQUEST_COLUMNS},
            "raw_output": postprocess(row.get("generated_text"), self.post.get(row.get("kind"), "none")),
            "engine_error": None,
            "engine_detail": None,
            "prompt_tokens": int(row.get("num_input_tokens") or 0),
            "completion_tokens": int(row.get("num_generated_tokens") or 0),
            "source": self.source,
        }


def _normalise_vllm_row(source: str, row: dict) -> dict:
    """Error rows bypass the processor's postprocess: give them the engine columns too."""
    err = row.get("__inference_error__") or ""
    if err:
        return {**{c: row.get(c) for c in REQUEST_COLUMNS}, "raw_output": None, "engine_error": "inference_error",
                "engine_detail": str(err)[:500], "prompt_tokens": 0, "completion_tokens": 0, "source": source}
    return {**{c: row.get(c) for c in REQUEST_COLUMNS + ENGINE_COLUMNS}}


def apply_vllm(ds, cfg: EngineConfig, templates: dict):
    from ray.data.llm import build_processor

    source = source_of(cfg)
    processor = build_processor(
        build_vllm_processor_config(cfg.vllm, vllm_chat_stage(templates, cfg.vllm.chat_template)),
        preprocess=VLLMPre(templates, cfg.sampling, cfg.vllm.chat_template),
        postprocess=VLLMPost(source, postprocess_modes(templates)),
    )
    return processor(ds).map(functools.partial(_normalise_vllm_row, source))


# --------------------------------------------------------------------------- HTTP
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
        import aiohttp

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        await self._session.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._session.__aexit__(*exc)

    def post(self, url: str, **kwargs) -> Any:
        return self._post(url, **kwargs)

    async def _post(self, url: str, **kwargs) -> _Envelope:
        import aiohttp

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
    from ray.data.llm import HttpRequestProcessorConfig

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
    import time

    import requests

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
        from ray.data.expressions import col

        expr = col("kind").is_in(sorted(kinds))
    except (ImportError, AttributeError):
        return ds.filter(functools.partial(_kind_in, kinds))
    return ds.filter(expr=expr)


def apply_http(ds, cfg: EngineConfig, templates: dict):
    """One HTTP processor per prompt mode the templates use (a processor posts to one URL):
    chat kinds to ``/v1/chat/completions``, raw kinds to ``/v1/completions``; with both,
    the request rows are split by kind and the two outputs unioned (each has its own pool
    of ``concurrency`` actors)."""
    from ray.data.llm import build_processor

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


# --------------------------------------------------------------------------- rules
def _rule_kind(kind: str) -> tuple[str, str]:
    """Prompt kind -> (polarity, rule kind): "swap_negative" -> ("negative", "swap")."""
    base, _, tail = kind.partition("_")
    return ("negative" if tail == "negative" else "positive"), base


def row_seed(seed: int, caption_id: str, kind: str) -> int:
    """A stable per-row seed (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{caption_id}\x00{kind}".encode()).digest()[:4], "little")


def rule_lexicon(world_dir: str | None):
    """The rule lexicon: the synthetic world's (restricted to its words) or the full default."""
    if not world_dir:
        return None
    from hardpos.data.world import config_from_world, world_lexicon

    return world_lexicon(config_from_world(world_dir))


_PERTURBERS: dict[tuple[int, str | None], Any] = {}


def cached_perturber(seed: int, world_dir: str | None):
    """One RulePerturber per (seed, lexicon) per worker process, reused across tasks (and
    across the fused rules -> judge stages, whose rule negatives then hit its per-caption cache)."""
    key = (seed, world_dir)
    if key not in _PERTURBERS:
        from hardpos.data.perturb import RulePerturber

        _PERTURBERS[key] = RulePerturber(seed=seed, lexicon=rule_lexicon(world_dir))
    return _PERTURBERS[key]


def rules_batch(batch, seed: int = 0, world_dir: str | None = None):
    """``map_batches`` function: the rule engine over a batch of request rows (pyarrow).

    A plain task, not an actor: tasks reuse Ray's pooled workers (no per-run actor start-up)
    and the perturber is cached per worker. ``RulePerturber.pick`` seeds its choice with
    (seed, polarity, kind, caption), so a row's output does not depend on batching,
    workers or resume.
    """
    import pyarrow as pa

    rules = cached_perturber(seed, world_dir)
    out = []
    for row in batch.to_pylist():
        polarity, rule_kind = _rule_kind(row["kind"])
        res = {**{c: row.get(c) for c in REQUEST_COLUMNS}, "raw_output": None, "engine_error": None,
               "engine_detail": None, "prompt_tokens": 0, "completion_tokens": 0, "source": "rule"}
        try:
            p = rules.pick(row["caption"], polarity, rule_kind)
        except Exception as exc:  # noqa: BLE001 - one bad caption must not kill the job
            res.update(engine_error="inference_error", engine_detail=f"{type(exc).__name__}: {exc}"[:300])
        else:
            if p is None:
                res.update(engine_error="no_rule", engine_detail=f"no {polarity} {rule_kind} rule applies")
            else:
                res["raw_output"] = p.text
        out.append(res)
    return pa.Table.from_pylist(out, schema=engine_schema())


def engine_schema():
    import pyarrow as pa

    return pa.schema([
        ("request_id", pa.string()), ("shard", pa.int64()), ("caption_id", pa.string()), ("caption", pa.string()),
        ("kind", pa.string()), ("polarity", pa.string()), ("raw_output", pa.string()), ("engine_error", pa.string()),
        ("engine_detail", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("source", pa.string()),
    ])


def apply_rules(ds, cfg: EngineConfig, seed: int, world_dir: str | None = None):
    return ds.map_batches(rules_batch, fn_kwargs={"seed": seed, "world_dir": world_dir}, batch_format="pyarrow",
                          batch_size=cfg.rules.batch_size, num_cpus=cfg.rules.num_cpus)


def apply_engine(ds, cfg: EngineConfig, templates: dict, seed: int = 0, world_dir: str | None = None):
    """Dispatch to the configured engine (see the module docstring for the contract).

    world_dir: a synthetic world folder; the rule engine then uses the world's lexicon.
    """
    if cfg.kind == "rules":
        return apply_rules(ds, cfg, seed, world_dir)
    if cfg.kind == "http":
        return apply_http(ds, cfg, templates)
    if cfg.kind == "vllm":
        return apply_vllm(ds, cfg, templates)
    raise ConfigError(f"engine.kind must be rules, http or vllm, got {cfg.kind!r}")
