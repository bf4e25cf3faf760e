"""`hardpos perturb`: rule-based hard negatives and hard positives for a caption set.

Input (``input=``): any caption source :func:`hardpos.data.captions.formats.read_captions` reads
(COCO captions json, jsonl/json, parquet, NegCLIP tsv, SugarCrepe json), a triplet file,
or a synthetic world folder (its ``<split>.parquet``; the world's lexicon is then used so
negatives stay in the world's vocabulary). Which world an input belongs to, its lexicon and
the rule engine's seed are decided exactly as the generate stage's rule engine decides them
(:func:`hardpos.world.build.world_dir_of`, :func:`hardpos.world.lexicon.world_perturber`),
so both stages make the same candidates for a caption of the same world, and the same picks
with ``balanced_picks=false``. By default this stage balances its picks over the whole caption
set (:mod:`hardpos.rules.balance`), which the generate stage, streaming one batch at a
time, does not.

Output (``output_dir``):

* ``triplets.<fmt>``: one triplet row per non-empty caption, ``hard_negative`` and
  ``hard_positive`` filled where the rules can (null otherwise), ``kind`` the REPLACE/SWAP
  kind both were drawn from, ``source`` "rule", plus ``negative_slot`` / ``positive_slot``
  (what changed).  Image paths are made resolvable from the output folder: relative paths
  of triplet/world inputs are resolved against the input file's folder, others against
  ``image_root`` when given (else kept as they are).
* ``rejects.jsonl``: every input row that did not become a triplet, with a reason
  ("empty").  ``inputs == written + rejected`` always holds and is logged.

Summary: coverage (share of non-empty captions with at least one negative / positive of
each kind, from the full rule output), the share of written rows with a negative /
positive, and throughput in captions/s (rule work only, and end to end); with balanced
picks, ``ngram_imbalance_per_pick`` per polarity (the L1 norm of the picked edits' word n-gram
counts minus their captions', per pick) beside the seeded-random picks' (also MLflow metrics).
With ``num_workers > 0`` the captions are perturbed by that many Ray tasks.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Literal

from hardpos import storage, tracking
from hardpos.config import ConfigError, JobConfig, require
from hardpos.data.captions import CaptionSourceError
from hardpos.data.captions.formats import read_captions
from hardpos.rules.lexicon import benchmark_substitution, seen_substitutions_tag
from hardpos.rules.perturber import mirror_positives, pick_balanced, pick_triplet
from hardpos.data.triplets import TripletFileError, make_triplet, read_triplets, resolve_image, write_triplets
from hardpos.world.build import world_dir_of
from hardpos.world.lexicon import world_perturber
from hardpos.runtime import JobContext, init_ray


@dataclasses.dataclass
class Config(JobConfig):
    """Rule perturbation job.

    input: caption source, triplet file (.parquet/.jsonl with triplet columns) or world folder.
    output_dir: where triplets.<fmt>, rejects.jsonl and summary.json go (local or s3://).
    seed: seeds every per-caption choice (stable across machines and workers).
    kinds: perturbation kinds a row may use ("replace", "swap").
    negatives: fill hard_negative.
    positives: fill hard_positive.
    split: world split to read when input is a world folder ("finetune", "pretrain").
    limit: only the first N input rows (None: all).
    lexicon: "auto" (the world's lexicon when the input is a world folder or a file next to its
        world.json, else the full one), "default" or "world" (an error without a world).
    include_benchmark_pairs: also emit the REPLACE benchmark's own substitutions as hard
        positives (off: a model trained on them has seen the test's invariances; on, the run is
        tagged ``hardpos.seen_substitutions=replace``). A world's lexicon ignores it.
    image_root: folder/URI that relative image paths of caption sources are relative to.
    output_format: "parquet" or "jsonl".
    num_workers: 0 perturbs in this process; N > 0 splits the captions over N Ray tasks.
    balanced_picks: inside each drawn REPLACE/SWAP family, pick the candidate that keeps the
        picked edits' word 1-2 gram counts closest to their captions' (a text-only reader then
        finds no word that marks an edit); false: the seeded-random pick. The candidates are made
        in parallel, the picks in one process in a seeded order.
    positive_picks: "balanced" (the default: as ``balanced_picks`` says) or "mirrored": a REPLACE
        positive only where another caption's positive makes the reverse substitution (x -> y
        beside y -> x), so every substituted word is added as often as it is removed and a
        text-only reader cannot tell the positives from their captions; REPLACE rows without a
        mirror keep their negative and get no positive (fewer REPLACE positives). Needs
        balanced_picks. A synthetic world's captions offer mirrors only with synonyms in
        finetuning (``world finetune_synonym_rate``, e.g. 0.5).
    """

    input: str = ""
    output_dir: str = "outputs/perturb"
    kinds: list[str] = dataclasses.field(default_factory=lambda: ["replace", "swap"])
    negatives: bool = True
    positives: bool = True
    split: str = "finetune"
    limit: int | None = None
    lexicon: Literal["auto", "default", "world"] = "auto"
    include_benchmark_pairs: bool = False
    image_root: str | None = None
    output_format: Literal["parquet", "jsonl"] = "parquet"
    num_workers: int = 0
    balanced_picks: bool = True
    positive_picks: Literal["balanced", "mirrored"] = "balanced"

    def __post_init__(self) -> None:
        require(self.positive_picks == "balanced" or self.balanced_picks, "positive_picks",
                "mirrored positives are picked over the whole caption set: needs balanced_picks=true",
                self.positive_picks)


TRIPLET_INPUT_COLUMNS = {"caption", "hard_negative", "hard_positive", "kind", "source", "caption_id"}


def _load_rows(cfg: Config) -> tuple[list[dict], str, str | None]:
    """(rows with caption_id/caption/image[/extra], the file read, the input's world folder or None)."""
    src = cfg.input
    if not src:
        raise ConfigError("input is required: a caption file, a triplet file or a world folder")
    world_dir = world_dir_of(src)  # the generate stage decides it the same way
    if world_dir == src:
        src = storage.join(src, f"{cfg.split}.parquet")
        if not storage.exists(src):
            raise ConfigError(f"world folder {cfg.input} has no split {cfg.split!r} ({src} is missing)")
    # the folder relative image paths of a triplet/world file are relative to (absolute when local)
    base = src.rsplit("/", 1)[0] if storage.is_s3(src) else os.path.dirname(os.path.abspath(src))
    rows: list[dict] | None = None
    if src.endswith((".parquet", ".jsonl")) and _holds_triplets(src):
        try:
            triplets = read_triplets(src)
        except TripletFileError:
            triplets = None  # not a triplet file: read it as a caption source below
        if triplets is not None:
            rows = []
            for t in triplets[: cfg.limit if cfg.limit is not None else None]:
                extra = {k: v for k, v in t.items() if k not in TRIPLET_INPUT_COLUMNS and k != "image"}
                image = resolve_image(t["image"], base, image_root=cfg.image_root) if t.get("image") else None
                rows.append({**extra, "caption_id": t["caption_id"], "caption": t["caption"] or "", "image": image})
    if rows is None:
        try:
            rows = read_captions(src, limit=cfg.limit)
        except CaptionSourceError as exc:
            raise ConfigError(str(exc)) from exc
        if cfg.image_root:
            for r in rows:
                if r["image"]:
                    r["image"] = resolve_image(r["image"], base, image_root=cfg.image_root)
    return rows, src, world_dir


def _holds_triplets(src: str) -> bool:
    """True when a .parquet/.jsonl file has a column only triplet files have: a hard negative or
    positive, or both a triplet's ``source`` and ``caption_id``. A file of captions and images
    alone (``{"id", "caption", "image"}``) reads as a caption source, keeping its own ids."""
    if src.endswith(".parquet"):
        import pyarrow.parquet as pq  # lazy: the stage's module loads without pyarrow for --help

        fs, path = storage.arrow_filesystem(src)
        columns = set(pq.read_schema(path, filesystem=fs).names)
    else:
        first = storage.read_head(src, 1 << 16).split(b"\n", 1)[0]
        try:
            record = json.loads(first)
        except ValueError:
            return False  # not JSON lines: the caption reader names the problem
        columns = set(record) if isinstance(record, dict) else set()
    return bool(columns & {"hard_negative", "hard_positive"}) or {"source", "caption_id"} <= columns


def _perturb_chunk(captions: list[str], seed: int, kinds: list[str], want_neg: bool, want_pos: bool,
                   world_dir: str | None, include_benchmark_pairs: bool = False) -> tuple[list[dict], float]:
    """Pure per-caption work (runs in-process or in a Ray task): (results, CPU seconds spent).

    world_dir: the input's world (its lexicon is used), None for the full lexicon.

    CPU seconds, not wall time, make the throughput figure comparable on a shared machine.
    """
    cpu0 = time.process_time()
    # the generate stage's rule engine, same lexicon and seed
    rules = world_perturber(seed, world_dir, include_benchmark_pairs)
    out = [pick_triplet(rules, caption, seed, kinds, want_neg, want_pos) for caption in captions]
    return out, time.process_time() - cpu0


def _candidates_chunk(captions: list[str], seed: int, kinds: list[str], want_neg: bool, want_pos: bool,
                      world_dir: str | None, include_benchmark_pairs: bool = False) -> tuple[list, float]:
    """Every (negative, positive) candidate of each caption, of ``kinds`` (in-process or in a
    Ray task), and the CPU seconds spent: what the balanced picks choose from."""
    cpu0 = time.process_time()
    rules = world_perturber(seed, world_dir, include_benchmark_pairs)
    out = [rules.candidates(c, kinds, want_neg, want_pos) for c in captions]
    return out, time.process_time() - cpu0


def check(cfg: Config) -> None:
    """Before any work: the tracking server (this stage's inputs are read, and named in its errors, by ``run``)."""
    tracking.check_tracking(cfg.tracking)


def run(cfg: Config, ctx: JobContext) -> dict:
    bad = [k for k in cfg.kinds if k not in ("replace", "swap")]
    if bad or not cfg.kinds:
        raise ConfigError(f"kinds: must be a non-empty subset of ['replace', 'swap'], got {cfg.kinds}")
    if not (cfg.negatives or cfg.positives):
        raise ConfigError("at least one of negatives / positives must be true")
    if cfg.num_workers < 0:
        raise ConfigError("num_workers must be >= 0")

    started = time.perf_counter()
    rows, src, input_world = _load_rows(cfg)
    if cfg.lexicon == "world" and input_world is None:
        raise ConfigError(f"lexicon=world needs a synthetic world input (a folder with world.json, or a file "
                          f"next to one); {cfg.input} is not one")
    world_dir = input_world if cfg.lexicon in ("auto", "world") else None
    keep = [r for r in rows if isinstance(r["caption"], str) and r["caption"].strip()]
    rejects = [{**r, "reason": "empty"} for r in rows if not (isinstance(r["caption"], str) and r["caption"].strip())]

    t0 = time.perf_counter()
    cpu_s = 0.0
    captions = [r["caption"] for r in keep]
    args = (cfg.seed, list(cfg.kinds), cfg.negatives, cfg.positives, world_dir, cfg.include_benchmark_pairs)
    work = _candidates_chunk if cfg.balanced_picks else _perturb_chunk
    if cfg.num_workers > 0 and captions:
        import ray  # lazy: the CLI imports this module for its Config; Ray loads once a job fans out

        init_ray(cfg.ray)
        task = ray.remote(num_cpus=1)(work)
        size = -(-len(captions) // cfg.num_workers)
        refs = [task.remote(captions[i:i + size], *args) for i in range(0, len(captions), size)]
        chunks = ray.get(refs)
        made = [x for chunk, _ in chunks for x in chunk]
        cpu_s = sum(c for _, c in chunks)
    else:
        made, cpu_s = work(captions, *args)
    balance_info: dict = {}
    if cfg.balanced_picks:
        cpu0 = time.process_time()
        results, balance_info = pick_balanced(captions, made, cfg.seed, cfg.seed, cfg.kinds, cfg.negatives,
                                              cfg.positives)
        if cfg.positive_picks == "mirrored" and cfg.positives:
            balance_info.update(mirror_positives(captions, made, results, cfg.seed))
        cpu_s += time.process_time() - cpu0
    else:
        results = made
    rule_s = time.perf_counter() - t0

    out_rows = []
    for r, res in zip(keep, results):
        extra = {k: v for k, v in r.items() if k not in ("caption_id", "caption", "image")}
        out_rows.append(make_triplet(
            image=r["image"], caption=r["caption"], hard_negative=res["neg"], hard_positive=res["pos"],
            kind=res["kind"] or "none", source="rule", caption_id=r["caption_id"],
            **{**extra, "negative_slot": res["neg_slot"], "positive_slot": res["pos_slot"]}))
    out_uri = write_triplets(out_rows, ctx.path(f"triplets.{cfg.output_format}"))
    storage.write_text(ctx.path("rejects.jsonl"), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects))
    total_s = time.perf_counter() - started

    n = len(keep)
    coverage = {}
    for key in (results[0]["cov"] if results else {}):
        coverage[key] = round(sum(res["cov"][key] for res in results) / n, 4) if n else 0.0
    coverage["neg_any"] = round(sum(any(v for k, v in res["cov"].items() if k.startswith("neg_")) for res in results) / n, 4) if n else 0.0
    coverage["pos_any"] = round(sum(any(v for k, v in res["cov"].items() if k.startswith("pos_")) for res in results) / n, 4) if n else 0.0
    filled = {
        "with_negative": sum(1 for r in out_rows if r["hard_negative"]),
        "with_positive": sum(1 for r in out_rows if r["hard_positive"]),
        "with_both": sum(1 for r in out_rows if r["hard_negative"] and r["hard_positive"]),
        "with_neither": sum(1 for r in out_rows if not r["hard_negative"] and not r["hard_positive"]),
    }
    kinds_written = {}
    for r in out_rows:
        kinds_written[r["kind"]] = kinds_written.get(r["kind"], 0) + 1
    assert len(rows) == len(out_rows) + len(rejects)  # nothing is lost
    summary = {
        "input": cfg.input, "read": src, "lexicon": "world" if world_dir else "default",
        "world_dir": world_dir,
        "inputs": len(rows), "written": len(out_rows), "rejected": len(rejects),
        "rejects_by_reason": {"empty": len(rejects)} if rejects else {},
        "coverage": coverage, "filled": filled, "kinds_written": kinds_written,
        "captions_per_s_rules": round(n / rule_s, 1) if rule_s > 0 else None,
        "captions_per_cpu_s_rules": round(n / cpu_s, 1) if cpu_s > 0 else None,
        "captions_per_s_end_to_end": round(len(rows) / total_s, 1) if total_s > 0 else None,
        "rule_seconds": round(rule_s, 3), "output": out_uri, "rejects": ctx.path("rejects.jsonl"),
        "balanced_picks": cfg.balanced_picks, "positive_picks": cfg.positive_picks, **balance_info,
        # test-set hygiene: positives that are the REPLACE benchmark's own substitutions
        "include_benchmark_pairs": cfg.include_benchmark_pairs,
        "positives_with_benchmark_substitutions": sum(
            1 for r in out_rows if r["hard_positive"] and r["kind"] == "replace"
            and benchmark_substitution(r["caption"], r["hard_positive"]) is not None),
    }
    if ctx.run is not None and cfg.include_benchmark_pairs:
        ctx.run.set_tags(seen_substitutions_tag(True))
    ctx.log_metrics({**{f"coverage/{k}": v for k, v in coverage.items()},
                     "inputs": len(rows), "written": len(out_rows), "rejected": len(rejects),
                     "captions_per_s": summary["captions_per_s_rules"] or 0.0,
                     **{f"ngram_imbalance_per_pick/{polarity}/{how}": v
                        for polarity, d in balance_info.get("ngram_imbalance_per_pick", {}).items()
                        for how, v in d.items()}})
    print(f"perturb: {len(rows)} inputs -> {len(out_rows)} triplets + {len(rejects)} rejects; "
          f"{summary['captions_per_s_rules']} captions/s (rules, wall), {summary['captions_per_cpu_s_rules']} "
          f"captions per CPU-second, {summary['captions_per_s_end_to_end']} captions/s end to end")
    print("coverage (share of non-empty captions): " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in coverage.items()))
    if balance_info:
        print("balanced picks: word n-gram imbalance per pick " + ", ".join(
            f"{polarity} {d['balanced']} (seeded-random: {d['seeded_random']})"
            for polarity, d in balance_info["ngram_imbalance_per_pick"].items()))
    return summary
