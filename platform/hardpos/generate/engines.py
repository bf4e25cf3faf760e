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
  ``/v1/chat/completions`` endpoint (:func:`build_http_processor_config`). Ray's HTTP
  stage raises (killing the job) when retries run out or a body is empty/non-JSON, and
  hands 500s back as normal replies; :class:`ResilientSession` owns retries instead and
  always returns a ``{"status", "body"}`` envelope so every row gets an answer.
* ``rules`` -- :class:`hardpos.data.perturb.RulePerturber` in CPU ``map_batches`` tasks.
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

REQUEST_COLUMNS = ("request_id", "shard", "caption_id", "caption", "kind", "polarity")
ENGINE_COLUMNS = ("raw_output", "engine_error", "engine_detail", "prompt_tokens", "completion_tokens", "source")
ENGINE_REASONS = ("http_error", "request_failed", "bad_response", "inference_error", "no_rule")


# --------------------------------------------------------------------------- configs
@dataclasses.dataclass
class SamplingConfig:
    """Decoding settings shared by the LLM engines.

    max_tokens: most tokens generated per request (a caption is ~15-30 tokens).
    temperature: sampling temperature (0 = greedy, reproducible).
    top_p: nucleus sampling mass.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0


@dataclasses.dataclass
class VLLMEngineConfig:
    """vLLM on GPU actors via ``ray.data.llm`` (production path).

    model_source: HF model id or local/s3 path of the model weights.
    tensor_parallel_size / pipeline_parallel_size: GPUs per engine replica = their product.
    concurrency: number of engine replicas (GPU actors); total GPUs = concurrency * TP * PP.
    batch_size: rows per Ray Data batch sent to a replica.
    max_concurrent_batches: batches in flight per replica (overlaps tail latency).
    chat_template: True applies the model's chat template to the messages; False sends the
        plain-text prompt (base models).
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

    url: full URL of the chat/completions route.
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
    preflight: send one real request from the driver before the job starts; an unreachable
        endpoint, a wrong route (404) or a refused key (401/403) is then a clear error up
        front instead of every row becoming a reject after its retries.
    """

    url: str = "http://127.0.0.1:8000/v1/chat/completions"
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


def build_vllm_processor_config(cfg: VLLMEngineConfig):
    """The ``vLLMEngineProcessorConfig`` for ``cfg`` (pure; constructing it needs no GPU).

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
        chat_template_stage=cfg.chat_template,
        tokenize_stage=True,
        detokenize_stage=True,
        should_continue_on_error=True,
    )


def sampling_params(s: SamplingConfig) -> dict[str, Any]:
    return {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}


class VLLMPre:
    """Request row -> vLLM input (messages or plain prompt + sampling params)."""

    def __init__(self, templates: dict, sampling: SamplingConfig, chat_template: bool):
        self.templates, self.sampling, self.chat = templates, sampling, chat_template

    def __call__(self, row: dict) -> dict:
        t = self.templates[row["kind"]]
        out = {"sampling_params": sampling_params(self.sampling)}
        if self.chat:
            out["messages"] = t.messages(row["caption"])
        else:
            out["prompt"] = t.prompt_text(row["caption"])
        return out


class VLLMPost:
    """vLLM output row -> the engine columns (request columns carried over)."""

    def __init__(self, source: str):
        self.source = source

    def __call__(self, row: dict) -> dict:
        return {
            **{c: row.get(c) for c in REQUEST_COLUMNS},
            "raw_output": row.get("generated_text"),
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
        build_vllm_processor_config(cfg.vllm),
        preprocess=VLLMPre(templates, cfg.sampling, cfg.vllm.chat_template),
        postprocess=VLLMPost(source),
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


def build_http_processor_config(cfg: HttpEngineConfig, environ: dict[str, str] | None = None):
    """The ``HttpRequestProcessorConfig`` for ``cfg`` (pure apart from reading the API key env var).

    Retries live in :class:`ResilientSession` (so the Ray stage's own ``max_retries`` is 0:
    its exhausted retries would raise and fail the whole job); actors get fractional CPUs.
    """
    from ray.data.llm import HttpRequestProcessorConfig

    if not cfg.url.startswith(("http://", "https://")):
        raise ConfigError(f"engine.http.url must be an http(s) URL, got {cfg.url!r}")
    if cfg.concurrency < 1 or cfg.batch_size < 1:
        raise ConfigError("engine.http.concurrency and engine.http.batch_size must be >= 1")
    if not 0 < cfg.num_cpus <= 64:
        raise ConfigError(f"engine.http.num_cpus must be in (0, 64], got {cfg.num_cpus}")
    if cfg.qps is not None and cfg.qps < 1:
        raise ConfigError(f"engine.http.qps must be >= 1 or null, got {cfg.qps}")
    return HttpRequestProcessorConfig(
        url=cfg.url,
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


def preflight(cfg: HttpEngineConfig, payload: dict, environ: dict[str, str] | None = None) -> dict:
    """One request from the driver; raises ConfigError when the endpoint cannot serve the job.

    Returns ``{"status", "latency_s"}``. Any other status (200, a 500 for this prompt, a
    429) means the endpoint is there: those are per-row outcomes, not configuration errors.
    """
    import time

    import requests

    headers = {"Content-Type": "application/json", **http_headers(cfg, environ)}
    start = time.perf_counter()
    try:
        resp = requests.post(cfg.url, json=payload, headers=headers, timeout=cfg.timeout_s)
    except requests.RequestException as exc:
        raise ConfigError(f"engine.http.url {cfg.url} is unreachable ({type(exc).__name__}: {exc}); "
                          "start the server or fix the URL (engine.http.preflight=false skips this check)") from exc
    latency = time.perf_counter() - start
    if resp.status_code in (401, 403):
        raise ConfigError(f"{cfg.url} refused the request (HTTP {resp.status_code}); set the API key in "
                          f"${cfg.api_key_env or '<engine.http.api_key_env>'}")
    if resp.status_code in (404, 405):
        raise ConfigError(f"{cfg.url} has no chat/completions route (HTTP {resp.status_code}); the URL must end in "
                          "/v1/chat/completions")
    return {"status": resp.status_code, "latency_s": round(latency, 4)}


def chat_payload(model: str, messages: list[dict], s: SamplingConfig) -> dict:
    return {"model": model, "messages": messages, "max_tokens": s.max_tokens, "temperature": s.temperature,
            "top_p": s.top_p}


class HttpPre:
    """Request row -> ``{"payload": <chat/completions body>}``."""

    def __init__(self, templates: dict, model: str, sampling: SamplingConfig):
        self.templates, self.model, self.sampling = templates, model, sampling

    def __call__(self, row: dict) -> dict:
        return {"payload": chat_payload(self.model, self.templates[row["kind"]].messages(row["caption"]), self.sampling)}


def parse_chat_response(envelope: dict) -> dict:
    """A :class:`ResilientSession` envelope -> the engine columns (minus source). Pure."""
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
    """HTTP reply row -> request columns + engine columns."""

    def __init__(self, source: str):
        self.source = source

    def __call__(self, row: dict) -> dict:
        env = row.get("http_response")
        env = env if isinstance(env, dict) else {"status": 0, "error": f"unexpected reply {env!r}"[:200]}
        return {**{c: row.get(c) for c in REQUEST_COLUMNS}, **parse_chat_response(env), "source": self.source}


def apply_http(ds, cfg: EngineConfig, templates: dict):
    from ray.data.llm import build_processor

    processor = build_processor(
        build_http_processor_config(cfg.http),
        preprocess=HttpPre(templates, cfg.http.model, cfg.sampling),
        postprocess=HttpPost(source_of(cfg)),
        # pre/postprocess are cheap row maps; fractional CPUs keep them from starving actors.
        preprocess_map_kwargs={"num_cpus": 0.25},
        postprocess_map_kwargs={"num_cpus": 0.25},
    )
    return processor(ds)


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
