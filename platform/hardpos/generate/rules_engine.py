"""The rule engine: :class:`hardpos.rules.perturber.RulePerturber` in CPU ``map_batches`` tasks.

:func:`apply_rules` fills the engine columns (contract in :mod:`hardpos.generate.engines`)
with rule edits, ``no_rule`` where none applies. Rows are seeded per (seed, caption, kind)
(:func:`row_seed`), so outputs do not depend on batching, workers or resume; the lexicon is
the synthetic world's when a world folder is given, and the perturber is the worker
process's cached one for (seed, world) (:func:`hardpos.world.lexicon.world_perturber`).
"""
from __future__ import annotations

import hashlib

import pyarrow as pa

from hardpos.generate.engine_config import REQUEST_COLUMNS, EngineConfig
from hardpos.world.lexicon import world_perturber


def _rule_kind(kind: str) -> tuple[str, str]:
    """Prompt kind -> (polarity, rule kind): "swap_negative" -> ("negative", "swap")."""
    base, _, tail = kind.partition("_")
    return ("negative" if tail == "negative" else "positive"), base


def row_seed(seed: int, caption_id: str, kind: str) -> int:
    """A stable per-row seed (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{caption_id}\x00{kind}".encode()).digest()[:4], "little")


def rules_batch(batch, seed: int = 0, world_dir: str | None = None, include_benchmark_pairs: bool = False):
    """``map_batches`` function: the rule engine over a batch of request rows (pyarrow).

    A plain task, not an actor: tasks reuse Ray's pooled workers (no per-run actor start-up)
    and the perturber is cached per worker. ``RulePerturber.pick`` seeds its choice with
    (seed, polarity, kind, caption), so a row's output does not depend on batching,
    workers or resume.
    """
    rules = world_perturber(seed, world_dir, include_benchmark_pairs)
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
    return pa.schema([
        ("request_id", pa.string()), ("shard", pa.int64()), ("caption_id", pa.string()), ("caption", pa.string()),
        ("kind", pa.string()), ("polarity", pa.string()), ("raw_output", pa.string()), ("engine_error", pa.string()),
        ("engine_detail", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("source", pa.string()),
    ])


def apply_rules(ds, cfg: EngineConfig, seed: int, world_dir: str | None = None):
    return ds.map_batches(rules_batch, fn_kwargs={"seed": seed, "world_dir": world_dir,
                                                  "include_benchmark_pairs": cfg.rules.include_benchmark_pairs},
                          batch_format="pyarrow",
                          batch_size=cfg.rules.batch_size, num_cpus=cfg.rules.num_cpus)

