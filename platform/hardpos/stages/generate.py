"""Generate hard positives (and optional LLM hard negatives) on Ray Data with vLLM, an
OpenAI-compatible endpoint or the rule engine; validate every output; write sharded,
resumable parquet (accepted / rejects with reasons) and the training triplets."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from typing import Literal

import ray

from hardpos import storage
from hardpos.config import ConfigError, JobConfig, TrackingConfig, require
from hardpos.data.captions import CaptionSourceError
from hardpos.data.validate import KINDS
from hardpos.data.world import world_dir_of
from hardpos.generate import engines, pipeline
from hardpos.generate.engines import EngineConfig, build_http_processor_config, build_vllm_processor_config
from hardpos.generate.prompts import fingerprint, load_prompts
from hardpos.runtime import JobContext, init_ray


@dataclasses.dataclass
class JoinConfig:
    """The join into training triplets.

    enabled: write triplets (per shard, merged into ``output`` when every shard is done).
    positives: "one" (the paper: each training caption paired with one hard positive and
        one hard negative): a caption with several accepted positives (e.g. a REPLACE and
        a SWAP one) gives ONE row, its positive picked by a seeded rule: the hash of
        (seed, caption_id) modulo the number of the caption's accepted positives, sorted
        by kind (replace < swap). The same seed gives the same rows on every rerun,
        resume or shard size; another seed may pick another positive. "all": one row per
        accepted positive (such a caption is then trained on once per positive per epoch).
        Rows record the choice (``n_positives``, ``positive_kinds``, ``positive_index``)
        and the summary counts it (``triplets_per_caption``, ``positives_per_caption``,
        ``captions_with_several_positives``, ``positives_unused``).
    negatives: where each triplet's hard negative comes from: "auto" (the dataset's own
        negative when the source has one, e.g. NegCLIP neg_caption, except those that are
        whole-conjunct swaps and so keep the meaning (counted in the summary as
        ``dataset_negatives_meaning_kept``), else an accepted LLM
        negative, else the rule engine), "dataset", "llm", "rules" or "none". An LLM or
        rule negative is of the row's positive kind where one exists.
    keep_unmatched: captions with no accepted positive still give one row (positive null)
        so hard-negative training sees every caption.
    output: merged triplet file name inside output_dir (.parquet or .jsonl).
    """

    enabled: bool = True
    positives: Literal["one", "all"] = "one"
    negatives: Literal["auto", "dataset", "llm", "rules", "none"] = "auto"
    keep_unmatched: bool = True
    output: str = "triplets.parquet"


@dataclasses.dataclass
class Config(JobConfig):
    """generate stage.

    input: caption source (COCO captions json, jsonl, parquet incl. triplet files, NegCLIP
        tsv, SugarCrepe json; local or s3://), or a synthetic world folder (reads its
        ``<split>.parquet``; the rule engine then uses the world's lexicon).
    split: the world split read when input is a world folder.
    limit: use only the first N captions (None: all).
    image_root: folder/prefix that relative image paths are relative to (None: the input
        file's folder); output image paths are written resolved (absolute / s3://).
    prompts: prompt template file: a bundled name ("paper": the paper's raw prompts and
        decoding; "chat"; "with_negatives") or a YAML path/URI in the same format
        (hardpos/resources/prompts/paper.yaml).
    kinds: keep only these prompt kinds (empty: all kinds in the file).
    engine: which engine and its settings (engine.kind = rules | http | vllm).
    shard_size: captions per output shard (the unit of resume).
    max_shards: process at most this many pending shards in this run, then stop
        (None: all). A later run with the same output_dir continues.
    overwrite: delete this output_dir's shards first instead of resuming.
    samples: accepted pairs (and rejects per reason) kept in samples.json.
    join: the triplet join (see JoinConfig).
    """

    output_dir: str = "outputs/generate"
    input: str = "outputs/world"
    split: str = "finetune"
    limit: int | None = None
    image_root: str | None = None
    prompts: str = "paper"
    kinds: list[str] = dataclasses.field(default_factory=list)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    shard_size: int = 1000
    max_shards: int | None = None
    overwrite: bool = False
    samples: int = 20
    join: JoinConfig = dataclasses.field(default_factory=JoinConfig)
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-generate"))

    def __post_init__(self) -> None:
        require(self.shard_size >= 1, "shard_size", "must be >= 1", self.shard_size)
        require(self.max_shards is None or self.max_shards >= 1, "max_shards", "must be >= 1 or null", self.max_shards)
        require(self.limit is None or self.limit >= 0, "limit", "must be >= 0 or null", self.limit)


def check_config(cfg: Config, templates) -> None:
    """What the config's own ``__post_init__`` cannot check (prompt kinds, engine settings,
    the input's files), before any work starts."""
    unknown = [t.kind for t in templates if t.kind not in KINDS]
    if unknown:
        raise ConfigError(f"prompt kinds {unknown} have no validator; kinds must be one of {sorted(KINDS)}")
    if cfg.engine.kind == "http":
        build_http_processor_config(cfg.engine.http)
    elif cfg.engine.kind == "vllm":
        build_vllm_processor_config(cfg.engine.vllm)


def resolve_input(cfg: Config) -> tuple[str, str | None]:
    """(the caption file to read, the world folder whose lexicon the rules use or None)."""
    src, world_dir = cfg.input, world_dir_of(cfg.input)  # the perturb stage decides it the same way
    if world_dir == src:
        src = storage.join(src, f"{cfg.split}.parquet")
        if not storage.exists(src):
            raise ConfigError(f"world folder {cfg.input} has no split {cfg.split!r} ({src} is missing)")
    mode = cfg.engine.rules.lexicon
    if mode == "world" and world_dir is None:
        raise ConfigError(f"engine.rules.lexicon=world needs a synthetic world input; {cfg.input} is not one")
    return src, (world_dir if mode in ("auto", "world") else None)


def _histogram(counts: dict[str, int]) -> dict[str, int]:
    """``{"2": 5, "0": 1, "1": 9}`` -> the same in numeric key order (summed shards come unordered)."""
    return {k: counts[k] for k in sorted(counts, key=int)}


def run(cfg: Config, ctx: JobContext) -> dict:
    templates = load_prompts(cfg.prompts, cfg.kinds or None)
    check_config(cfg, templates)
    source_uri, world_dir = resolve_input(cfg)
    try:
        captions = pipeline.load_inputs(source_uri, limit=cfg.limit, image_root=cfg.image_root)
    except CaptionSourceError as exc:
        raise ConfigError(str(exc)) from exc
    source = engines.source_of(cfg.engine)
    model = engines.model_name(cfg.engine)
    shards = pipeline.plan(captions, templates, cfg.shard_size, source)
    # an unusable endpoint is a clear error before any work or output
    preflight = None
    if cfg.engine.kind == "http" and cfg.engine.http.preflight:
        preflight = engines.preflight_requests(cfg.engine.http, {t.kind: t for t in templates},
                                               [r for s in shards for r in s.requests], cfg.engine.sampling)
    out = ctx.output_dir
    if cfg.overwrite:
        pipeline.clear_output(out, [cfg.join.output])
    pipeline.check_manifest(out, {
        "input": source_uri, "input_fingerprint": pipeline.input_fingerprint(captions), "num_captions": len(captions),
        "shard_size": cfg.shard_size, "num_shards": len(shards), "prompts": cfg.prompts,
        "prompts_fingerprint": fingerprint(templates), "kinds": [t.kind for t in templates],
        "engine": cfg.engine.kind, "model": model, "seed": cfg.seed,
        "join": {"enabled": cfg.join.enabled, "positives": cfg.join.positives, "negatives": cfg.join.negatives,
                 "keep_unmatched": cfg.join.keep_unmatched},
    })
    done = done_before = pipeline.done_shards(out)
    pending = [s for s in shards if s.index not in done]
    if cfg.max_shards is not None:
        pending = pending[:cfg.max_shards]
    print(f"[generate] {len(captions)} captions in {len(shards)} shards; {len(done)} already done, "
          f"{len(pending)} to run with engine {cfg.engine.kind} ({model})", file=sys.stderr)

    by_kind = {t.kind: t for t in templates}
    picker = pipeline.NegativePicker(cfg.join.negatives, cfg.seed, pipeline.dataset_name(source_uri), world_dir)
    # The join's rule negatives are computed on the workers, beside validation, when the join
    # can fall back to them (a caption with dataset negatives never needs one under "auto").
    needs_rules = cfg.join.enabled and picker.wants_rule_negatives and (
        cfg.join.negatives == "rules" or any(not c["negatives"] for c in captions))
    rule_negatives = {"seed": cfg.seed, "world_dir": world_dir} if needs_rules else None

    def make_dataset(requests):
        init_ray(cfg.ray)
        # ~2 blocks per shard: rows stream back roughly shard by shard, so shards commit
        # (and become resumable) continuously instead of at the end.
        blocks = max(1, min(2 * len(pending), max(1, len(requests) // 8), 2000))
        ds = ray.data.from_items(requests, override_num_blocks=blocks)
        if cfg.engine.kind == "rules":
            # One CPU operator (rules fused with judge, below): Ray Data's per-operator resource
            # reservation only holds CPUs back from it (on 2 CPUs it ran one task at a time;
            # measured 0.7 s vs 1.5 s for 4,839 captions). The LLM engines keep the reservation:
            # there it keeps the CPU judge from starving the GPU/HTTP actors, and vice versa.
            ds.context.op_resource_reservation_enabled = False
        ds = engines.apply_engine(ds, cfg.engine, by_kind, seed=cfg.seed, world_dir=world_dir)
        judge_args = {"fn_kwargs": {"rule_negatives": rule_negatives}, "batch_format": "pyarrow"}
        if cfg.engine.kind == "rules":
            # The rule stage's own resources and batch size, so Ray Data fuses the two into one
            # task: validation and rule negatives then reuse the perturbations the rule engine
            # just computed for each caption (RulePerturber caches per caption), and the one
            # operator gets the whole CPU budget instead of splitting it with a 0.25-CPU judge.
            return ds.map_batches(pipeline.judge_batch, batch_size=cfg.engine.rules.batch_size,
                                  num_cpus=cfg.engine.rules.num_cpus, **judge_args)
        return ds.map_batches(pipeline.judge_batch, batch_size=1024, num_cpus=0.25, **judge_args)

    def on_shard(shard, results):
        triplets, join_stats = None, None
        if cfg.join.enabled:
            accepted = [r for r in results if r["status"] == "accepted"]
            per_caption = pipeline.join_by_caption(shard.captions, accepted, picker, cfg.join.positives,
                                                   cfg.join.keep_unmatched,
                                                   pipeline.rule_negatives_of(results) if rule_negatives else {})
            triplets = [t for rows in per_caption for t in rows]
            join_stats = pipeline.join_counts(per_caption)
            if picker.mode in ("auto", "dataset"):
                join_stats["dataset_negatives_meaning_kept"] = pipeline.meaning_kept_negatives(shard.captions)
        counts = pipeline.write_shard(out, shard, results, triplets, join_stats)
        # progress while it runs (the totals are logged under their plain names at the end)
        ctx.log_metrics({"progress/shards_done": len(done_before) + stats_box["n"] + 1,
                         "shard/accepted": counts["accepted"], "shard/rejected": counts["rejected"]},
                        step=stats_box["n"])
        stats_box["n"] += 1
        return counts

    stats_box = {"n": 0}
    stats = pipeline.run_shards(pending, make_dataset, out, on_shard)

    # Totals over every finished shard (this run and earlier ones), from the markers.
    done = pipeline.done_shards(out)
    all_counts = [storage.read_json(pipeline.shard_path(out, i, "done.json")) for i in sorted(done)]
    total = pipeline.aggregate(all_counts)
    run_counts = pipeline.aggregate(stats.counts)
    complete = len(done) == len(shards)
    if total.get("inputs", 0) != total.get("accepted", 0) + total.get("rejected", 0):
        raise RuntimeError(f"conservation violated: inputs {total.get('inputs')} != accepted "
                           f"{total.get('accepted')} + rejected {total.get('rejected')}")
    outputs = {"shards": storage.join(out, "shards")}
    if complete:
        outputs.update(pipeline.merge_outputs(out, len(shards), cfg.join.enabled, cfg.join.output))
    wall = max(stats.wall_s, 1e-9)
    summary = {
        "engine": cfg.engine.kind,
        "model": model,
        "source": source,
        "input": source_uri,
        "lexicon": "world" if world_dir else "default",
        "prompts": cfg.prompts,
        "kinds": [t.kind for t in templates],
        "complete": complete,
        "shards_total": len(shards),
        "shards_done": len(done),
        "shards_this_run": stats.shards_written,
        "shards_skipped": len(done_before),
        "captions": len(captions),
        "captions_done": total.get("captions", 0),
        "inputs": total.get("inputs", 0),
        "accepted": total.get("accepted", 0),
        "rejected": total.get("rejected", 0),
        "accepted_by_kind": total.get("accepted_by_kind", {}),
        "rejected_by_kind": total.get("rejected_by_kind", {}),
        "rejected_by_reason": total.get("rejected_by_reason", {}),
        "rejected_by_kind_reason": total.get("rejected_by_kind_reason", {}),
        "triplets": total.get("triplets", 0),
        "triplets_with_positive": total.get("triplets_with_positive", 0),
        "triplets_with_negative": total.get("triplets_with_negative", 0),
        "join_positives": cfg.join.positives if cfg.join.enabled else None,
        "triplets_per_caption": _histogram(total.get("triplets_per_caption", {})),
        "positives_per_caption": _histogram(total.get("positives_per_caption", {})),
        "captions_with_positive": total.get("captions_with_positive", 0),
        "captions_with_several_positives": total.get("captions_with_several_positives", 0),
        "positives_unused": total.get("positives_unused", 0),
        # a dataset's "negatives" that are whole-conjunct swaps keep the meaning: never used as negatives
        "dataset_negatives_meaning_kept": total.get("dataset_negatives_meaning_kept", 0),
        "this_run": {
            "captions": stats.captions,
            "inputs": run_counts.get("inputs", 0),
            "wall_s": round(stats.wall_s, 3),
            "join_and_write_s": round(stats.commit_s, 3),
            "captions_per_s": round(stats.captions / wall, 2) if stats.captions else 0.0,
            "requests_per_s": round(run_counts.get("inputs", 0) / wall, 2) if stats.captions else 0.0,
            "completion_tokens": run_counts.get("completion_tokens", 0),
            "prompt_tokens": run_counts.get("prompt_tokens", 0),
            "tokens_per_s": (round(run_counts.get("completion_tokens", 0) / wall, 2)
                             if run_counts.get("completion_tokens") else None),
        },
        "outputs": outputs,
    }
    if preflight is not None:
        summary["http_preflight"] = preflight
    summary["accept_rate"] = round(summary["accepted"] / summary["inputs"], 4) if summary["inputs"] else 0.0
    ctx.log_metrics({
        "inputs": summary["inputs"], "accepted": summary["accepted"], "rejected": summary["rejected"],
        "accept_rate": summary["accept_rate"], "captions_per_s": summary["this_run"]["captions_per_s"],
        "requests_per_s": summary["this_run"]["requests_per_s"],
        **({"triplets": summary["triplets"],
            "captions_with_several_positives": summary["captions_with_several_positives"]} if cfg.join.enabled else {}),
        **({"tokens_per_s": summary["this_run"]["tokens_per_s"]} if summary["this_run"]["tokens_per_s"] else {}),
        **{f"accepted/{k}": v for k, v in summary["accepted_by_kind"].items()},
        **{f"rejected/{k}": v for k, v in summary["rejected_by_reason"].items()},
    })
    if ctx.run is not None:
        ctx.run.set_tags({"hardpos.engine": cfg.engine.kind, "hardpos.model": model})
    if done:
        samples = pipeline.sample_rows(out, sorted(done), cfg.samples)
        outputs["samples"] = storage.write_json(storage.join(out, "samples.json"), samples)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "samples.json")
            with open(path, "w") as fh:
                json.dump(samples, fh, indent=2, ensure_ascii=False)
            ctx.log_artifact(path)
    print(f"[generate] {summary['accepted']}/{summary['inputs']} accepted; rejects by reason "
          f"{summary['rejected_by_reason']}; {'complete' if complete else 'INCOMPLETE: rerun to resume'}",
          file=sys.stderr)
    return summary

