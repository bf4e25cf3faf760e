"""Generation-engine configuration and the engines' shared row contract.

Holds the request / engine column names every engine honours (see
:mod:`hardpos.generate.engines` for the contract), the typed ``engine`` config sections
(:class:`EngineConfig` and its ``sampling`` / ``vllm`` / ``http`` / ``rules`` parts), the
provenance helpers (:func:`model_name`, :func:`source_of`) and the pure
:func:`sampling_params` both LLM engines send. Pure: no Ray, no I/O.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal

from hardpos.config import require
from hardpos.generate.prompts import PromptTemplate

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


# engine_kwargs keys that have their own field below: each setting has one place
VLLM_OWN_KWARGS = {"tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
                   "max_model_len": "max_model_len", "gpu_memory_utilization": "gpu_memory_utilization",
                   "enable_prefix_caching": "prefix_caching", "max_num_seqs": "max_num_seqs"}


@dataclasses.dataclass
class VLLMEngineConfig:
    """vLLM on GPU actors via ``ray.data.llm`` (production path).

    Throughput comes from keeping each replica's running batch full: vLLM decodes up to
    ``max_num_seqs`` sequences per step, and Ray Data keeps ``batch_size x
    max_concurrent_batches`` rows inside each replica, so that product must reach
    max_num_seqs (Ray warns when it does not; a value of max_num_seqs set here is checked).

    model_source: HF model id or local/s3 path of the model weights.
    tensor_parallel_size / pipeline_parallel_size: GPUs per engine replica = their product.
    concurrency: number of engine replicas (GPU actors); total GPUs = concurrency * TP * PP.
        Replicas share nothing: requests/s grow with it until the input or the CPU stages
        (chat template, tokenizer) are the limit.
    batch_size: rows per Ray Data batch sent to a replica (larger: fewer per-batch costs;
        smaller: less work redone when a replica dies, less tail at the end).
    max_concurrent_batches: batches in flight per replica: batch_size x this is the most
        sequences a replica is offered at once, and must be >= max_num_seqs to fill it.
    max_num_seqs: sequences vLLM decodes at once per replica (its running batch; the biggest
        throughput knob: decode reads the weights once per step for every sequence in it);
        None: vLLM's default for the GPU (Ray's docs: 256 on A10G/A100, 1024 on H100). Bounded
        by the KV cache: max_num_seqs x (prompt + max_tokens) tokens must fit beside the weights.
    prefix_caching: vLLM's automatic prefix caching: requests of one prompt kind share its
        instruction and few-shot examples (the paper's SWAP prompt is five examples long), so
        their KV cache is computed once and reused, and prefill work drops to the caption.
    chat_template: for chat-mode templates: True applies the model's chat template to the
        messages; False sends their plain-text rendering (base models). Raw-mode templates
        (the bundled ``paper`` prompts) always go as their raw prompt, chat template off;
        one job's templates must then agree on it (see :func:`vllm_chat_stage`).
    max_model_len: context length the engine reserves KV cache for.
    gpu_memory_utilization: fraction of GPU memory vLLM may take.
    accelerator_type: e.g. "A100", "H100", or null for any GPU.
    engine_kwargs: other vLLM engine args (those with a field here must be set there).
    """

    model_source: str = "Qwen/Qwen2.5-0.5B-Instruct"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    concurrency: int = 1
    batch_size: int = 64
    max_concurrent_batches: int = 8
    max_num_seqs: int | None = None
    prefix_caching: bool = True
    chat_template: bool = True
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.85
    accelerator_type: str | None = None
    engine_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("tensor_parallel_size", "pipeline_parallel_size", "concurrency", "batch_size",
                    "max_concurrent_batches", "max_model_len"):
            require(getattr(self, key) >= 1, key, "must be >= 1", getattr(self, key))
        require(self.max_num_seqs is None or self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1 or null",
                self.max_num_seqs)
        require(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]",
                self.gpu_memory_utilization)
        own = sorted(k for k in self.engine_kwargs if k in VLLM_OWN_KWARGS)
        require(not own, "engine_kwargs", "must not hold settings that have their own key (set "
                + ", ".join(f"engine.vllm.{VLLM_OWN_KWARGS[k]}" for k in own) + " instead)", own)
        if self.max_num_seqs is not None:
            offered = self.batch_size * self.max_concurrent_batches
            require(offered >= self.max_num_seqs, "max_concurrent_batches",
                    f"must be >= {-(-self.max_num_seqs // self.batch_size)} so that batch_size x "
                    f"max_concurrent_batches ({offered}) reaches max_num_seqs ({self.max_num_seqs}), or a replica "
                    "never runs a full batch", self.max_concurrent_batches)


@dataclasses.dataclass
class HttpEngineConfig:
    """Any OpenAI-compatible chat/completions endpoint (``vllm serve``, a hosted API).

    Throughput is ``concurrency x max_in_flight / latency`` until the endpoint is full: an
    endpoint that batches (vLLM's ``max_num_seqs``, 256 by default on an A100) is used fully
    only with that many requests open at once. The window shrinks by itself when the
    endpoint says it is full (429 / 503, a ``Retry-After``, a timeout) and grows back as it
    answers (AIMD: :mod:`hardpos.generate.flow`).

    url: full URL of the chat/completions route (chat-mode templates).
    completions_url: full URL of the completions route, for raw-mode templates (the
        bundled ``paper`` prompts); None derives it from ``url`` (``.../chat/completions``
        -> ``.../completions``; a ``url`` that already ends in ``/completions`` is used as is).
    model: the "model" field sent in each request (and recorded as llm:<model>).
    api_key_env: name of the env var holding the API key (sent as "Authorization: Bearer");
        unset/empty variable -> no Authorization header. The key itself never goes in config.
    headers: extra request headers.
    max_in_flight: requests each actor keeps open at once (one aiohttp connection pool per
        actor, across the rows of a batch and across batches): the ceiling of its in-flight
        window. Set concurrency x max_in_flight to about the endpoint's batch capacity.
    concurrency: number of HTTP actors (each runs max_in_flight requests on one event loop;
        more actors spread the client's CPU over more cores and hosts).
    batch_size: rows per Ray Data batch: the input is split into blocks of this many rows so
        every actor has work from the start, and results flow to the validator a batch at a
        time. Each batch costs Ray Data a few ms of CPU: at short latencies batches of 16
        rows made that the limit (a third of the requests/s of 64-row batches at 0.05 s).
    qps: requests per second for the whole job, shared evenly by the actors (None: no limit).
    tokens_per_minute: tokens per minute for the whole job, shared evenly by the actors, each
        request counted before it is sent as its prompt's characters / 4 plus its max_tokens,
        as hosted APIs count it (None: no limit).
    max_retries: retries per request on 408/429/502/503/504, timeouts and connection errors;
        a row whose retries run out is a reject (``http_error`` / ``request_failed``).
    retry_wait_s: base wait of the exponential backoff between retries (a longer
        ``Retry-After`` from the server wins).
    timeout_s: per-request timeout, from sending to the last byte of the reply.
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
    max_in_flight: int = 64
    concurrency: int = 2
    batch_size: int = 64
    qps: float | None = None
    tokens_per_minute: int | None = None
    max_retries: int = 3
    retry_wait_s: float = 1.0
    timeout_s: float = 60.0
    num_cpus: float = 0.25
    preflight: bool = True

    def __post_init__(self) -> None:
        for key in ("url", "completions_url"):
            value = getattr(self, key)
            require(value is None and key == "completions_url" or str(value).startswith(("http://", "https://")),
                    key, "must be an http(s) URL", value)
        for key in ("max_in_flight", "concurrency", "batch_size"):
            require(getattr(self, key) >= 1, key, "must be >= 1", getattr(self, key))
        require(self.qps is None or self.qps > 0, "qps", "must be > 0 or null", self.qps)
        require(self.tokens_per_minute is None or self.tokens_per_minute >= 1, "tokens_per_minute",
                "must be >= 1 or null", self.tokens_per_minute)
        require(self.max_retries >= 0, "max_retries", "must be >= 0", self.max_retries)
        require(self.retry_wait_s >= 0, "retry_wait_s", "must be >= 0", self.retry_wait_s)
        require(self.timeout_s > 0, "timeout_s", "must be > 0", self.timeout_s)
        require(0 < self.num_cpus <= 64, "num_cpus", "must be in (0, 64]", self.num_cpus)


@dataclasses.dataclass
class RulesEngineConfig:
    """The CPU rule engine (hardpos.rules.perturber.RulePerturber).

    batch_size: rows per map_batches task.
    num_cpus: CPUs per rule task (Ray runs as many tasks as the cluster's CPUs allow).
    lexicon: "auto" (the world's lexicon when the input is a synthetic world, else the full
        one), "default" or "world".
    include_benchmark_pairs: also emit the REPLACE benchmark's own substitutions ("white" ->
        "ivory", "holding" -> "grasping") as hard positives. Off by default: a model trained
        on them has seen the test's invariances, so its REPLACE numbers are contaminated. On,
        the run is tagged ``hardpos.seen_substitutions=replace`` and models trained on its
        triplets are flagged next to their REPLACE numbers. (A synthetic world's lexicon is
        its own and ignores this.)
    """

    batch_size: int = 256
    num_cpus: float = 1.0
    lexicon: Literal["auto", "default", "world"] = "auto"
    include_benchmark_pairs: bool = False


@dataclasses.dataclass
class EngineConfig:
    """Which engine generates, and its settings.

    kind: "rules" (CPU, no model), "http" (OpenAI-compatible endpoint) or "vllm" (GPU actors).
    sampling: decoding defaults of the LLM engines (http, vllm); a prompt template's own
        ``sampling:`` settings override them field by field.
    vllm: the vLLM engine on GPU actors (used when kind is "vllm").
    http: the OpenAI-compatible endpoint (used when kind is "http").
    rules: the CPU rule engine (used when kind is "rules").
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
