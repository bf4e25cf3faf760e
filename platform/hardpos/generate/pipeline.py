"""The generate pipeline: captions -> prompts -> engine -> validator -> sharded, resumable output.

Flow (one shard plan for every engine; rows stay in the cluster)::

    stream.resolve_source(input)                 driver: file list + heads checked (no rows)
      -> stream.read_source()                    Ray Data readers -> normalised caption blocks in
                                                 the object store; the driver keeps refs + counts
      -> shards of ``shard_size`` captions in source order (caption index // shard_size)
      -> rules engine: one Ray task per shard (:func:`run_worker_shards`): plan the shard's
         requests, rules + validation + the join's rule negatives, the triplet join, and the
         shard's files, written by the worker; the driver receives only the shard's counts
      -> LLM engines (:func:`run_driver_shards`): each shard's requests go into the object
         store, Ray Data runs the engine (http / vllm) and the judge over them, and the
         driver joins and commits each shard as soon as its rows are in (it holds only
         the shards in flight)
      -> a shard is committed atomically (:func:`commit_shard`: accepted / rejects /
         triplets parquet [, webdataset tar], then the ``.done.json`` marker with counts)
      -> when every shard is done: merged accepted.parquet, rejects.parquet,
         triplets.parquet (the training input), streamed shard by shard, and samples.json

The join: one row per caption with the positive a seeded rule picks (or one per accepted
positive with join.positives "all"), its hard negative from dataset > LLM > rule negative.

Resume: a shard is finished iff its ``.done.json`` exists; a rerun with the same
output_dir (and the same input/prompts/engine, checked against ``manifest.json``) skips
finished shards and redoes unfinished ones from scratch, so no row is lost or written
twice; a shard task that Ray retries (a node died) finds the marker and writes nothing.
Conservation ``inputs == accepted + rejected`` is checked per shard and overall.

The pipeline's parts, one idea a module: :mod:`hardpos.data.captions.stream` (reading the
caption source), :mod:`hardpos.generate.planning` (inputs, shards, judging),
:mod:`hardpos.generate.join` (the triplet join), :mod:`hardpos.generate.shard_files` (shard
files, manifest, merge, counts); this module holds the shard jobs and the two ways of running them, and drives the others.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Iterable

import pyarrow as pa
import ray

from hardpos import storage
from hardpos.generate import engine_config, rules_engine, shard_files
from hardpos.generate.join import NegativePicker, join_by_caption, join_counts, meaning_kept_negatives, rule_negatives_of
from hardpos.generate.planning import Shard, judge_batch, plan_shard
from hardpos.generate.prompts import PromptTemplate
from hardpos.data.captions.stream import CaptionBlocks, caption_rows


# --------------------------------------------------------------------------- driver
@dataclasses.dataclass
class RunStats:
    shards_written: int = 0
    captions: int = 0
    counts: list[dict] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    commit_s: float = 0.0  # driver time spent joining + writing shards (inside wall_s)


def run_shards(shards: list[Shard], make_dataset: Callable[[list[dict]], Any], out_dir: str,
               on_shard: Callable[[Shard, list[dict]], dict]) -> RunStats:
    """Stream the pipeline's results and commit each shard once all its rows are in.

    ``make_dataset(requests)`` builds the Ray Dataset (engine + judge) over the requests of
    ``shards``; ``on_shard(shard, results)`` writes one complete shard and returns its counts.
    """
    stats = RunStats()
    start = time.time()
    by_index = {s.index: s for s in shards}
    buffers: dict[int, list[dict]] = {s.index: list(s.input_rejects) for s in shards}
    remaining = {s.index: len(s.requests) for s in shards}

    def commit(index: int) -> None:
        t0 = time.time()
        counts = on_shard(by_index[index], buffers.pop(index))
        stats.commit_s += time.time() - t0
        stats.counts.append(counts)
        stats.shards_written += 1
        stats.captions += len(by_index[index].captions)
        print(f"[generate] shard {index} done: {counts['accepted']}/{counts['inputs']} accepted "
              f"({stats.shards_written}/{len(shards)} this run, {time.time() - start:.1f}s)", file=sys.stderr)

    for index in [i for i, n in remaining.items() if n == 0]:
        commit(index)
    requests = [r for s in shards for r in s.requests]
    if requests:
        ds = make_dataset(requests)
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                index = row["shard"]
                if index not in remaining or index not in buffers:
                    raise RuntimeError(f"pipeline returned a row for shard {index} that is not pending: {row['request_id']}")
                buffers[index].append(row)
                remaining[index] -= 1
                if remaining[index] == 0:
                    commit(index)
    left = {i: n for i, n in remaining.items() if n and i in buffers}
    if left:
        raise RuntimeError(f"pipeline ended with rows missing for shards {left}")
    stats.wall_s = time.time() - start
    return stats


# --------------------------------------------------------------------------- streaming: shared by both paths
@dataclasses.dataclass(frozen=True)
class JoinSpec:
    """The join's settings as a worker needs them (the stage's ``join`` section, resolved)."""

    positives: str = "one"
    negatives: str = "auto"
    keep_unmatched: bool = True
    dataset: str = "source"
    webdataset: bool = False


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """Everything needed to plan, run (rules) and commit one shard, on any process (picklable).

    rule_negatives: ``{"seed", "world_dir"}`` when the judge should attach the join's rule
    negatives (see :func:`judge_batch`), else None; join: None when the join is off.
    """

    out_dir: str
    templates: tuple[PromptTemplate, ...]
    source: str
    shard_size: int
    seed: int = 0
    world_dir: str | None = None
    rule_negatives: dict | None = None
    join: JoinSpec | None = None
    include_benchmark_pairs: bool = False

    def picker(self) -> NegativePicker:
        assert self.join is not None
        return NegativePicker(self.join.negatives, self.seed, self.join.dataset, self.world_dir)


def commit_shard(job: ShardJob, shard: Shard, results: list[dict], picker: NegativePicker | None = None) -> dict:
    """Join ``results`` (every row of ``shard``: its input rejects and judged engine rows)
    into triplets and write the shard (:func:`hardpos.generate.shard_files.write_shard`, marker last); returns its counts."""
    triplets, join_stats = None, None
    if job.join is not None:
        picker = picker or job.picker()
        accepted = [r for r in results if r["status"] == "accepted"]
        per_caption = join_by_caption(shard.captions, accepted, picker, job.join.positives, job.join.keep_unmatched,
                                      rule_negatives_of(results) if job.rule_negatives else {})
        triplets = [t for rows in per_caption for t in rows]
        join_stats = join_counts(per_caption)
        if picker.mode in ("auto", "dataset"):
            join_stats["dataset_negatives_meaning_kept"] = meaning_kept_negatives(shard.captions)
        if job.join.webdataset:
            join_stats["webdataset_samples"], join_stats["webdataset_skipped"] = shard_files.write_webdataset(
                job.out_dir, shard.index, triplets)
    return shard_files.write_shard(job.out_dir, shard, results, triplets, join_stats)


def _shard_range(blocks: CaptionBlocks, index: int, shard_size: int) -> tuple[int, int, list[tuple[int, int, int]]]:
    start = index * shard_size
    stop = min(start + shard_size, blocks.num_captions)
    return start, stop, blocks.pieces(start, stop)


def _fetch_shard(job: ShardJob, blocks: CaptionBlocks, index: int) -> Shard:
    start, _, pieces = _shard_range(blocks, index, job.shard_size)
    tables = ray.get([blocks.refs[b] for b, _, _ in pieces])
    return plan_shard(caption_rows(tables, pieces, start), list(job.templates), index, job.source)


def shard_count(num_captions: int, shard_size: int) -> int:
    return -(-num_captions // shard_size)


# --------------------------------------------------------------------------- rules: shards on the workers
def rules_shard(job: ShardJob, index: int, start: int, pieces: list[tuple[int, int, int]], *tables: pa.Table) -> dict:
    """A whole shard on one worker (rules engine): plan, rules + judge, join, commit.

    Idempotent: a shard whose marker exists (Ray retried this task after a node died, or
    rebuilt its lost result) is not written again; its recorded counts come back."""
    marker = shard_files.shard_path(job.out_dir, index, "done.json")
    if storage.exists(marker):
        return storage.read_json(marker)
    shard = plan_shard(caption_rows(tables, pieces, start), list(job.templates), index, job.source)
    results = list(shard.input_rejects)
    if shard.requests:
        requests = pa.Table.from_pylist([{c: r[c] for c in engine_config.REQUEST_COLUMNS} for r in shard.requests])
        rows = rules_engine.rules_batch(requests, seed=job.seed, world_dir=job.world_dir,
                                   include_benchmark_pairs=job.include_benchmark_pairs)
        results.extend(judge_batch(rows, job.rule_negatives).to_pylist())
    return commit_shard(job, shard, results)


def run_worker_shards(job: ShardJob, blocks: CaptionBlocks, pending: Iterable[int], num_cpus: float,
                      on_done: Callable[[int, dict], None]) -> RunStats:
    """Run :func:`rules_shard` for every pending shard as Ray tasks, at most a few per CPU in
    flight (the driver's memory stays flat: it holds refs and counts, never rows)."""
    stats, start = RunStats(), time.time()
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_retries": 3}
    if storage.is_s3(job.out_dir):  # workers write the shards: they need the driver's S3 settings
        options["runtime_env"] = {"env_vars": storage.worker_env(include_tracking=False)}
    task = ray.remote(rules_shard).options(**options)
    window = max(2, int(2 * ray.cluster_resources().get("CPU", 1) / max(num_cpus, 0.01)))
    todo, inflight = list(pending), {}
    todo.reverse()
    while todo or inflight:
        while todo and len(inflight) < window:
            index = todo.pop()
            s, _, pieces = _shard_range(blocks, index, job.shard_size)
            inflight[task.remote(job, index, s, pieces, *[blocks.refs[b] for b, _, _ in pieces])] = index
        ready, _ = ray.wait(list(inflight), num_returns=1)
        index = inflight.pop(ready[0])
        counts = ray.get(ready[0])
        stats.counts.append(counts)
        stats.shards_written += 1
        stats.captions += counts.get("captions", 0)
        on_done(index, counts)
    stats.wall_s = time.time() - start
    return stats


# --------------------------------------------------------------------------- LLM engines: Ray Data + driver commits
def run_driver_shards(job: ShardJob, blocks: CaptionBlocks, pending: Iterable[int], make_dataset: Callable[[Any], Any],
                      on_done: Callable[[int, dict], None]) -> RunStats:
    """The LLM engines: pending shards' requests go to the object store shard by shard,
    ``make_dataset(ds)`` adds the engine and judge to the Ray Dataset over them, and each
    shard is re-planned from its captions and committed (:func:`commit_shard`) as soon as
    all its rows are back; the driver holds only the shards in flight."""
    stats, start = RunStats(), time.time()
    picker = job.picker() if job.join is not None else None
    expected: dict[int, int] = {}
    refs = []
    schema = rules_engine.engine_schema()
    request_schema = pa.schema([schema.field(c) for c in engine_config.REQUEST_COLUMNS])
    for index in pending:
        shard = _fetch_shard(job, blocks, index)
        expected[index] = len(shard.requests)
        if shard.requests:
            refs.append(ray.put(pa.Table.from_pylist(
                [{c: r[c] for c in engine_config.REQUEST_COLUMNS} for r in shard.requests], schema=request_schema)))

    def commit(index: int, rows: list[dict]) -> None:
        t0 = time.time()
        shard = _fetch_shard(job, blocks, index)
        counts = commit_shard(job, shard, [*shard.input_rejects, *rows], picker)
        stats.commit_s += time.time() - t0
        stats.counts.append(counts)
        stats.shards_written += 1
        stats.captions += len(shard.captions)
        on_done(index, counts)

    for index in [i for i, n in expected.items() if n == 0]:
        commit(index, [])
    buffers: dict[int, list[dict]] = {i: [] for i, n in expected.items() if n}
    if refs:
        ds = make_dataset(ray.data.from_arrow_refs(refs))
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                index = row["shard"]
                if index not in buffers:
                    raise RuntimeError(f"pipeline returned a row for shard {index} that is not pending: {row['request_id']}")
                buffers[index].append(row)
                if len(buffers[index]) == expected[index]:
                    commit(index, buffers.pop(index))
    if buffers:
        raise RuntimeError(f"pipeline ended with rows missing for shards "
                           f"{ {i: expected[i] - len(b) for i, b in buffers.items()} }")
    stats.wall_s = time.time() - start
    return stats
