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
* ``http``  -- a few Ray actors (:class:`~hardpos.generate.http_engine.HttpGenerate`), each
  keeping up to ``engine.http.max_in_flight`` requests open against any OpenAI-compatible
  endpoint: ``/v1/chat/completions`` for chat templates, ``/v1/completions`` for raw ones
  (:func:`http_url`); 429 / 503 / Retry-After shrink the window (:mod:`hardpos.generate.flow`).
  Every request ends in a ``{"status", "body"}`` envelope after its retries, so every row
  gets an answer and no server error fails the job.
* ``rules`` -- :class:`hardpos.rules.perturber.RulePerturber` in CPU ``map_batches`` tasks.

The LLM engines send each template as it says (:class:`hardpos.generate.prompts.PromptTemplate`):
a chat template as messages, a raw template as one prompt string with no chat template;
with its own ``sampling`` settings over ``engine.sampling`` (:func:`sampling_params`); and
``raw_output`` is its completion after the template's ``postprocess`` ("none": as generated).

Layout (one module per job; this module is the entry point :func:`apply_engine`):

* :mod:`hardpos.generate.engine_config` -- the column contract, the ``engine`` config
  sections, provenance and :func:`sampling_params` (pure)
* :mod:`hardpos.generate.vllm_engine`   -- the vLLM path
* :mod:`hardpos.generate.http_engine`   -- the OpenAI-compatible HTTP path
* :mod:`hardpos.generate.rules_engine`  -- the rule engine and its per-worker perturber cache
"""
from __future__ import annotations

from hardpos.config import ConfigError
from hardpos.generate.engine_config import EngineConfig
from hardpos.generate.http_engine import apply_http
from hardpos.generate.rules_engine import apply_rules
from hardpos.generate.vllm_engine import apply_vllm


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
