"""Generate hard positives (and optional LLM hard negatives) on Ray Data with vLLM, an
OpenAI-compatible endpoint or the rule engine; validate every output; write sharded,
resumable parquet (accepted / rejects with reasons) and the training triplets."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Literal

import pyarrow.parquet as pq

from hardpos import logs, preflight, storage, tracking
from hardpos.config import ConfigError, JobConfig, TrackingConfig, require
from hardpos.data.captions import CaptionSourceError
from hardpos.rules.lexicon import benchmark_substitution, seen_substitutions_tag
from hardpos.rules.validate import KINDS
from hardpos.world.build import world_dir_of
from hardpos.generate.engine_config import EngineConfig
from hardpos.generate.prompts import fingerprint, load_prompts
from hardpos.runtime import JobContext, init_ray

# The CLI imports this module for its Config: Ray and the engines load inside the functions
# that use them (`# lazy:` below), once a job runs.


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
    webdataset: also write each shard's triplets as a webdataset tar under
        ``output_dir/webdataset/`` (``<key>.jpg``/``.png`` image bytes, ``<key>.txt`` caption,
        ``<key>.json`` with ``hard_negative`` / ``hard_positive``), the layout
        ``ray.data.read_webdataset`` reads; triplets whose image cannot be read are skipped
        and counted (``webdataset_skipped``).
    """

    enabled: bool = True
    positives: Literal["one", "all"] = "one"
    negatives: Literal["auto", "dataset", "llm", "rules", "none"] = "auto"
    keep_unmatched: bool = True
    output: str = "triplets.parquet"
    webdataset: bool = False


@dataclasses.dataclass
class Config(JobConfig):
    """generate stage.

    input: caption source: one file, a folder of them or a glob (``caps/part-*.jsonl``),
        local or s3://: jsonl / parquet (incl. triplet files; read by Ray Data's readers,
        rows stay in the cluster), COCO captions / SugarCrepe json, NegCLIP tsv or csv (each
        file read whole by one worker); or a synthetic world folder (reads its
        ``<split>.parquet``; the rule engine then uses the world's lexicon). All files must
        share one format and the same caption/id/image/negatives columns.
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


PREFLIGHT_CAPTION = "A dog and a cat on a red sofa."


def check_config(cfg: Config, templates) -> None:
    """What the config's own ``__post_init__`` cannot check (prompt kinds, engine settings,
    the input's files), before any work starts."""
    unknown = [t.kind for t in templates if t.kind not in KINDS]
    if unknown:
        raise ConfigError(f"prompt kinds {unknown} have no validator; kinds must be one of {sorted(KINDS)}")
    # lazy: see the module's imports
    from hardpos.generate.http_engine import http_spec
    from hardpos.generate.vllm_engine import build_vllm_processor_config

    if cfg.engine.kind == "http":
        http_spec(cfg.engine, {t.kind: t for t in templates})  # raw prompts need a completions URL
    elif cfg.engine.kind == "vllm":
        build_vllm_processor_config(cfg.engine.vllm)


def benchmark_substitution_count(accepted_uri: str) -> int:
    """Accepted REPLACE hard positives whose edit is a pair of the REPLACE benchmark's table."""
    fs, path = storage.arrow_filesystem(accepted_uri)
    table = pq.read_table(path, filesystem=fs, columns=["caption", "kind", "polarity", "text"])
    n = 0
    for row in table.to_pylist():
        if row["polarity"] == "positive" and row["kind"].startswith("replace") and row["text"]:
            n += benchmark_substitution(row["caption"], row["text"]) is not None
    return n


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


def _summary(cfg: Config, *, model: str, src_name: str, source_uri: str, world_dir: str | None, templates: list,
             num_shards: int, done: set, done_before: set, n_input_files: int, num_captions: int, stats,
             total: dict, run_counts: dict, outputs: dict, complete: bool) -> dict:
    """summary.json: the totals over every finished shard (``total``), this run's share
    (``stats``, ``run_counts``), where the outputs are, and how the outputs were judged."""
    wall = max(stats.wall_s, 1e-9)
    summary = {
        "engine": cfg.engine.kind,
        "model": model,
        "source": src_name,
        "input": source_uri,
        "lexicon": "world" if world_dir else "default",
        "prompts": cfg.prompts,
        "kinds": [t.kind for t in templates],
        "complete": complete,
        "shards_total": num_shards,
        "shards_done": len(done),
        "shards_this_run": stats.shards_written,
        "shards_skipped": len(done_before),
        "captions": num_captions,
        "input_files": n_input_files,
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
    # Test-set hygiene: positives that are the REPLACE benchmark's own substitutions (0 unless
    # engine.rules.include_benchmark_pairs is on, or an LLM wrote them itself).
    summary["include_benchmark_pairs"] = cfg.engine.rules.include_benchmark_pairs
    # how each kind's outputs were judged ("paper": as the paper's release, "strict": every check;
    # the rule engine's own rows are always strict)
    summary["validation"] = {t.kind: "strict" if cfg.engine.kind == "rules" else t.validation for t in templates}
    if "accepted" in outputs:
        summary["positives_with_benchmark_substitutions"] = benchmark_substitution_count(outputs["accepted"])
    summary["accept_rate"] = round(summary["accepted"] / summary["inputs"], 4) if summary["inputs"] else 0.0
    return summary


def check(cfg: Config) -> None:
    """Before any work (no Ray, no output): the prompts and engine settings, the S3 endpoint, the
    caption source (exists, one readable format, not empty unless ``allow_empty``), the LLM
    endpoint for ``engine.kind=http``, then the tracking server."""
    # lazy: see the module's imports
    from hardpos.data.captions import stream

    check_config(cfg, load_prompts(cfg.prompts, cfg.kinds or None))
    preflight.check_s3_endpoint([cfg.input, cfg.output_dir])
    if not storage.exists(cfg.input) and not storage.has_glob(cfg.input):
        preflight.fail("input", cfg.input, "caption source not found",
                       "check the path (a file, a folder, a glob or a world folder)")
    uri, _ = resolve_input(cfg)
    try:
        files = stream.resolve_source(uri).files
    except (CaptionSourceError, FileNotFoundError, ValueError) as exc:
        preflight.fail("input", cfg.input, str(exc).splitlines()[0], "give jsonl/parquet/json/tsv/csv captions of one format")
    if not cfg.allow_empty and not preflight.caption_rows_present("input", files):
        preflight.fail("input", cfg.input, "the caption source has no captions",
                       "give a non-empty file, or allow_empty=true to run on nothing")
    if cfg.engine.kind == "http":
        preflight.check_endpoint("engine.http.url", cfg.engine.http.url)
    tracking.check_tracking(cfg.tracking)


def run(cfg: Config, ctx: JobContext) -> dict:
    # lazy: see the module's imports
    from hardpos.data.captions import stream
    from hardpos.generate import engine_config, engines, http_engine, join, pipeline, planning, shard_files

    templates = load_prompts(cfg.prompts, cfg.kinds or None)  # checked by check(cfg) before run
    source_uri, world_dir = resolve_input(cfg)
    try:
        files = stream.resolve_source(source_uri)  # file heads only: bad input fails before Ray starts
    except CaptionSourceError as exc:
        raise ConfigError(str(exc)) from exc
    # an unusable endpoint is a clear error before any work or output (one request per
    # prompt mode, on a fixed caption every bundled prompt applies to: no rows needed)
    http_probe = None
    if cfg.engine.kind == "http" and cfg.engine.http.preflight:
        probe = [{"kind": t.kind, "caption": PREFLIGHT_CAPTION} for t in templates]
        http_probe = http_engine.preflight_requests(cfg.engine.http, {t.kind: t for t in templates}, probe,
                                                    cfg.engine.sampling)
    try:
        init_ray(cfg.ray)
        blocks = stream.read_source(files, limit=cfg.limit, image_root=cfg.image_root)
    except CaptionSourceError as exc:
        raise ConfigError(str(exc)) from exc
    src_name = engine_config.source_of(cfg.engine)
    model = engine_config.model_name(cfg.engine)
    num_shards = pipeline.shard_count(blocks.num_captions, cfg.shard_size)
    picker = join.NegativePicker(cfg.join.negatives, cfg.seed, planning.dataset_name(source_uri), world_dir)
    # The join's rule negatives are computed on the workers, beside validation, when the join
    # can fall back to them (only a source whose every caption has its own negative never needs one).
    needs_rules = cfg.join.enabled and picker.wants_rule_negatives and (
        cfg.join.negatives == "rules" or files.columns is None or files.columns.negatives is None)
    job = pipeline.ShardJob(
        out_dir=ctx.output_dir, templates=tuple(templates), source=src_name, shard_size=cfg.shard_size, seed=cfg.seed,
        world_dir=world_dir, rule_negatives={"seed": cfg.seed, "world_dir": world_dir} if needs_rules else None,
        join=pipeline.JoinSpec(cfg.join.positives, cfg.join.negatives, cfg.join.keep_unmatched,
                               planning.dataset_name(source_uri), cfg.join.webdataset) if cfg.join.enabled else None,
        include_benchmark_pairs=cfg.engine.rules.include_benchmark_pairs)
    out = ctx.output_dir
    if cfg.overwrite:
        shard_files.clear_output(out, [cfg.join.output])
    shard_files.check_manifest(out, {
        "input": source_uri, "input_files": len(files.files), "input_fingerprint": blocks.fingerprint,
        "num_captions": blocks.num_captions, "shard_size": cfg.shard_size, "num_shards": num_shards,
        "prompts": cfg.prompts, "prompts_fingerprint": fingerprint(templates), "kinds": [t.kind for t in templates],
        "engine": cfg.engine.kind, "model": model, "seed": cfg.seed,
        "include_benchmark_pairs": cfg.engine.rules.include_benchmark_pairs,
        "join": {"enabled": cfg.join.enabled, "positives": cfg.join.positives, "negatives": cfg.join.negatives,
                 "keep_unmatched": cfg.join.keep_unmatched, "webdataset": cfg.join.webdataset},
    })
    done = done_before = shard_files.done_shards(out)
    pending = [i for i in range(num_shards) if i not in done]
    if cfg.max_shards is not None:
        pending = pending[:cfg.max_shards]
    print(f"[generate] {blocks.num_captions} captions ({len(files.files)} file(s)) in {num_shards} shards; "
          f"{len(done)} already done, {len(pending)} to run with engine {cfg.engine.kind} ({model})", file=sys.stderr)

    by_kind = {t.kind: t for t in templates}
    started, written = time.time(), {"n": 0}

    def on_done(index: int, counts: dict) -> None:
        written["n"] += 1
        print(f"[generate] shard {index} done: {counts['accepted']}/{counts['inputs']} accepted "
              f"({written['n']}/{len(pending)} this run, {time.time() - started:.1f}s)", file=sys.stderr)
        # progress while it runs (the totals are logged under their plain names at the end)
        ctx.log_metrics({"progress/shards_done": len(done_before) + written["n"],
                         "shard/accepted": counts["accepted"], "shard/rejected": counts["rejected"]},
                        step=written["n"] - 1)

    def make_dataset(ds):
        ds = engines.apply_engine(ds, cfg.engine, by_kind, seed=cfg.seed, world_dir=world_dir)
        return ds.map_batches(planning.judge_batch, batch_size=1024, num_cpus=0.25, batch_format="pyarrow",
                              fn_kwargs={"rule_negatives": job.rule_negatives,
                                         "validation": {k: t.validation for k, t in by_kind.items()}})

    if cfg.engine.kind == "rules":
        # each shard whole on one worker (rules, validation, rule negatives, join, files):
        # the rule work reuses the perturber's per-caption cache and nothing comes back but counts
        stats = pipeline.run_worker_shards(job, blocks, pending, cfg.engine.rules.num_cpus, on_done)
    else:
        # the LLM engines' Ray Data actor pools make the driver's core worker print an error
        # line per actor that is not an error here (hardpos.logs.ACTOR_ARGS_NOISE)
        with logs.quiet_native_stderr(logs.current_level()):
            stats = pipeline.run_driver_shards(job, blocks, pending, make_dataset, on_done)

    # Totals over every finished shard (this run and earlier ones), from the markers.
    done = shard_files.done_shards(out)
    all_counts = [storage.read_json(shard_files.shard_path(out, i, "done.json")) for i in sorted(done)]
    total = shard_files.aggregate(all_counts)
    run_counts = shard_files.aggregate(stats.counts)
    complete = len(done) == num_shards
    if total.get("inputs", 0) != total.get("accepted", 0) + total.get("rejected", 0):
        raise RuntimeError(f"conservation violated: inputs {total.get('inputs')} != accepted "
                           f"{total.get('accepted')} + rejected {total.get('rejected')}")
    outputs = {"shards": storage.join(out, "shards")}
    if complete:
        outputs.update(shard_files.merge_outputs(out, num_shards, cfg.join.enabled, cfg.join.output))
        if cfg.join.enabled and cfg.join.webdataset:
            outputs["webdataset"] = storage.join(out, shard_files.WEBDATASET_DIR)
    summary = _summary(cfg, model=model, src_name=src_name, source_uri=source_uri, world_dir=world_dir,
                       templates=templates, num_shards=num_shards, done=done, done_before=done_before,
                       n_input_files=len(files.files), num_captions=blocks.num_captions, stats=stats,
                       total=total, run_counts=run_counts, outputs=outputs, complete=complete)
    if http_probe is not None:
        summary["http_preflight"] = http_probe
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
        ctx.run.set_tags({"hardpos.engine": cfg.engine.kind, "hardpos.model": model,
                          **seen_substitutions_tag(cfg.engine.rules.include_benchmark_pairs)})
    if done:
        samples = shard_files.sample_rows(out, sorted(done), cfg.samples)
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

