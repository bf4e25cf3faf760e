"""Score one model the way every stage that reports a model's figures does: which benchmarks
(the configured ones plus a synthetic world's), on which device, and the benchmark report with
the retention figures beside it.

The evaluate stage (:mod:`hardpos.stages.evaluate`) and the interpolate stage
(:mod:`hardpos.interpolate.stage`, which scores mixed weights) both call these functions, so a
figure means the same in either; the compare stage resolves its explorer's benchmarks here too.

Cheap to import (the CLI loads the stages' configs through it): torch, open_clip and Ray load
inside the functions that use them (``# lazy:`` below), once a job runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from hardpos import storage
from hardpos.config import ConfigError
from hardpos.eval.items import BenchmarkError
from hardpos.eval.spec import BenchmarkSpec, Precision, RetentionConfig

if TYPE_CHECKING:
    import torch

    from hardpos.eval.evaluator import EvalReport
    from hardpos.models.clip import LoadedModel

#: (metric prefix, benchmark file stem) of a world folder's benchmarks; the REPLACE subsets'
#: positives are synonyms finetuning never sees
WORLD_BENCHMARKS = (("world_replace_attribute", "replace_attribute"), ("world_replace_relation", "replace_relation"),
                    ("world_swap", "swap"))
#: the same REPLACE items with the synonyms finetuning saw; evaluated when the folder has them
WORLD_SEEN_BENCHMARKS = (("world_replace_attribute_seen", "replace_attribute_seen"),
                         ("world_replace_relation_seen", "replace_relation_seen"))


def resolve_specs(benchmarks: Sequence[BenchmarkSpec], world_dir: str | None = None,
                  retention: RetentionConfig | None = None) -> list[BenchmarkSpec]:
    """``benchmarks`` plus ``world_dir``'s (:data:`WORLD_BENCHMARKS` must all be there,
    :data:`WORLD_SEEN_BENCHMARKS` are added where present), validated before any model is
    built: names unique, non-empty and free of '/' (they prefix the metrics), every path given,
    and something to evaluate (a benchmark or a ``retention`` dataset). Raises
    :class:`ConfigError` naming the key; ``retention`` is checked by :func:`check_retention`."""
    retention = retention or RetentionConfig()
    specs = list(benchmarks)
    if world_dir:
        for name, stem in WORLD_BENCHMARKS:
            path = storage.join(world_dir, "benchmark", f"{stem}.parquet")
            if not storage.exists(path):
                raise ConfigError(f"world_dir={world_dir}: benchmark file {path} is missing (run the world stage first)")
            specs.append(BenchmarkSpec(name=name, kind="triplets", path=path))
        for name, stem in WORLD_SEEN_BENCHMARKS:
            path = storage.join(world_dir, "benchmark", f"{stem}.parquet")
            if storage.exists(path):
                specs.append(BenchmarkSpec(name=name, kind="triplets", path=path))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"benchmarks: names must be unique (they prefix the metrics), got {names}")
    for s in specs:
        if not s.name or "/" in s.name:
            raise ConfigError(f"benchmarks: name {s.name!r} must be non-empty and contain no '/'")
        if not s.path:
            raise ConfigError(f"benchmarks.{s.name}: path is required")
    if not specs and not retention.zeroshot and not retention.retrieval:
        raise ConfigError("nothing to evaluate: give benchmarks=[...], world_dir=... or retention datasets")
    check_retention(retention)
    return specs


def check_retention(cfg: RetentionConfig) -> None:
    """Names unique and free of '/', class names and templates resolvable (named sets,
    lists, readable files): fails before any model is built."""
    for kind, specs in (("zeroshot", cfg.zeroshot), ("retrieval", cfg.retrieval)):
        names = [s.name for s in specs]
        if len(set(names)) != len(names) or any(not n or "/" in n for n in names):
            raise ConfigError(f"retention.{kind}: names must be unique, non-empty and free of '/': {names}")
    if not cfg.zeroshot:
        return
    # lazy: open_clip's class-name lists (seconds to import); only zero-shot retention needs them
    from hardpos.eval.retention import RetentionError, resolve_classnames, resolve_templates

    for zs in cfg.zeroshot:
        try:
            resolve_classnames(zs.classnames)
            resolve_templates(zs.templates)
        except RetentionError as exc:
            raise ConfigError(f"retention.zeroshot.{zs.name}: {exc}") from exc


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; any other value as given."""
    import torch  # lazy: see the module docstring

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def evaluate_model(model: torch.nn.Module, lm: LoadedModel, specs: Sequence[BenchmarkSpec], *, device: str,
                   batch_size: int, num_threads: int, precision: Precision, retention: RetentionConfig | None = None,
                   image_encoder: Any = None) -> tuple[EvalReport, dict[str, float]]:
    """(benchmark report, retention metrics) of ``model`` on ``specs`` (from :func:`resolve_specs`)
    and the ``retention`` datasets (None: none), with ``lm``'s preprocessing and tokenizer.

    ``model`` may be another module than ``lm.model`` of the same architecture (the
    interpolate stage loads each mix into one module). ``image_encoder``: a distributed image
    encoder (:func:`hardpos.eval.distributed.ray_image_encoder`; None: encode in this process).
    A benchmark that cannot be read raises :class:`ConfigError` naming it."""
    # lazy: see the module docstring
    from hardpos.eval.evaluator import evaluate_benchmarks
    from hardpos.eval.retention import retrieval, zero_shot

    retention = retention or RetentionConfig()
    kw = dict(device=device, batch_size=batch_size, num_threads=num_threads, precision=precision)
    try:
        report = evaluate_benchmarks(model, lm.preprocess_val, lm.tokenizer, specs, image_encoder=image_encoder, **kw)
    except BenchmarkError as exc:
        raise ConfigError(str(exc)) from exc
    scores: dict[str, float] = {}
    for zs in retention.zeroshot:
        scores.update(zero_shot(model, lm.preprocess_val, lm.tokenizer, zs, **kw))
    for rs in retention.retrieval:
        scores.update(retrieval(model, lm.preprocess_val, lm.tokenizer, rs, **kw))
    return report, scores
