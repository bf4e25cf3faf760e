"""The vLLM engine: ``ray.data.llm.vLLMEngineProcessorConfig`` + ``build_processor`` on GPU actors.

:func:`apply_vllm` turns the request dataset into the engine columns (contract in
:mod:`hardpos.generate.engines`); :func:`build_vllm_processor_config`, :class:`VLLMPre` and
:class:`VLLMPost` are pure and unit-tested on CPU. A row vLLM fails on becomes an
``inference_error`` reject, never a crashed job.
"""
from __future__ import annotations

import functools
from typing import Any

from hardpos.config import ConfigError
from hardpos.generate.engine_config import (
    ENGINE_COLUMNS, REQUEST_COLUMNS, EngineConfig, SamplingConfig, VLLMEngineConfig, sampling_params, source_of,
)
from hardpos.generate.prompts import PromptTemplate, postprocess


def vllm_engine_kwargs(cfg: VLLMEngineConfig) -> dict[str, Any]:
    """vLLM's engine args from ``cfg``: its own fields, then ``engine_kwargs`` (which may not
    repeat them: :class:`VLLMEngineConfig` refuses that). Pure."""
    kwargs = {
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "max_model_len": cfg.max_model_len,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        # Prompts of one kind share their instruction and few-shot examples: cached once.
        "enable_prefix_caching": cfg.prefix_caching,
    }
    if cfg.max_num_seqs is not None:
        kwargs["max_num_seqs"] = cfg.max_num_seqs
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
    (``inference_error``), never a crashed job. The values were checked by
    :class:`VLLMEngineConfig` itself.
    """
    from ray.data.llm import vLLMEngineProcessorConfig  # lazy: ray.data.llm takes ~2.6 s to import

    return vLLMEngineProcessorConfig(
        model_source=cfg.model_source,
        engine_kwargs=vllm_engine_kwargs(cfg),
        # (n, n): a fixed pool. An int n is an autoscaling pool that starts one replica and
        # grows only on backlog, leaving GPUs idle while each new replica loads its model.
        concurrency=(cfg.concurrency, cfg.concurrency),
        batch_size=cfg.batch_size,
        max_concurrent_batches=cfg.max_concurrent_batches,
        accelerator_type=cfg.accelerator_type,
        chat_template_stage=cfg.chat_template if chat_template is None else chat_template,
        tokenize_stage=True,
        detokenize_stage=True,
        should_continue_on_error=True,
    )



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
    from ray.data.llm import build_processor  # lazy: ray.data.llm takes ~2.6 s to import

    source = source_of(cfg)
    processor = build_processor(
        build_vllm_processor_config(cfg.vllm, vllm_chat_stage(templates, cfg.vllm.chat_template)),
        preprocess=VLLMPre(templates, cfg.sampling, cfg.vllm.chat_template),
        postprocess=VLLMPost(source, postprocess_modes(templates)),
    )
    return processor(ds).map(functools.partial(_normalise_vllm_row, source))

