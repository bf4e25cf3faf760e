"""The generate pipeline: captions -> prompts -> engine -> validator -> sharded, resumable output.

Flow (one code path for every engine)::

    read_captions(input)                         driver: rows + dataset negatives + images
      -> plan(): shards of ``shard_size`` captions in input order; one request per
         (caption, applicable prompt kind); bad input rows become rejects right here
      -> ray.data.from_items(requests of the shards not yet done)
      -> engines.apply_engine()                  Ray Data: rules / http / vllm
      -> map_batches(judge_batch)                Ray Data: hardpos.data.validate on every row,
                                                 plus the join's rule negatives (fused with
                                                 the rule engine into one task)
      -> driver collects rows per shard, joins triplets: one row per caption with the
         positive a seeded rule picks (or one per accepted positive with join.positives
         "all"), its hard negative from dataset > LLM > rule negative;
         a complete shard is written atomically
         (accepted / rejects / triplets parquet, then the ``.done.json`` marker)
      -> when every shard is done: merged accepted.parquet, rejects.parquet,
         triplets.parquet (the training input) and samples.json

Resume: a shard is finished iff its ``.done.json`` exists; a rerun with the same
output_dir (and the same input/prompts/engine, checked against ``manifest.json``) skips
finished shards and redoes unfinished ones from scratch, so no row is lost or written
twice. Conservation ``inputs == accepted + rejected`` is checked per shard and overall.

Layout (one job per module, all re-exported here so ``hardpos.generate.pipeline`` keeps its
names): :mod:`hardpos.generate.planning` (inputs, shards, judging),
:mod:`hardpos.generate.join` (the triplet join), :mod:`hardpos.generate.shard_files`
(shard files, manifest, merge, counts); this module drives them (:func:`run_shards`).
Callers use the names through this module (``pipeline.write_shard``), so a test may
replace one here.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

from hardpos.generate.join import (
    POSITIVES_MODES,
    NegativePicker,
    base_kind,
    dataset_negatives,
    join_by_caption,
    join_caption,
    join_counts,
    join_triplets,
    meaning_kept_negatives,
    positive_choice,
    rule_negative,
    rule_negatives_of,
)
from hardpos.generate.planning import (
    INPUT_KIND,
    Shard,
    dataset_name,
    input_fingerprint,
    judge,
    judge_batch,
    load_inputs,
    plan,
    reject_row,
    result_schema,
)
from hardpos.generate.shard_files import (
    ACCEPTED_COLUMNS,
    MANIFEST_KEYS,
    MERGED,
    REJECT_COLUMNS,
    aggregate,
    check_manifest,
    clear_output,
    counts_of,
    done_shards,
    merge_outputs,
    read_parquet_rows,
    sample_rows,
    shard_path,
    write_shard,
)

__all__ = [
    "ACCEPTED_COLUMNS", "INPUT_KIND", "MANIFEST_KEYS", "MERGED", "POSITIVES_MODES", "REJECT_COLUMNS",
    "NegativePicker", "RunStats", "Shard", "aggregate", "base_kind", "check_manifest", "clear_output", "counts_of",
    "dataset_name", "dataset_negatives", "done_shards", "input_fingerprint", "join_by_caption", "join_caption",
    "join_counts", "join_triplets", "judge", "judge_batch", "load_inputs", "meaning_kept_negatives", "merge_outputs",
    "plan", "positive_choice", "read_parquet_rows", "reject_row", "result_schema", "rule_negative",
    "rule_negatives_of", "run_shards", "sample_rows", "shard_path", "write_shard",
]


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
