"""Reading inputs, planning shards and judging engine rows (the pipeline's front half).

Contract: :func:`load_inputs` reads caption rows (errors before any work starts);
:func:`plan` splits them into shards in input order and expands each caption into one
request per applicable prompt (bad input rows become rejects of kind "input"), pure;
:func:`judge` / :func:`judge_batch` turn an engine row into a result row with the shared
validator's verdict (and, on the workers, the join's rule negative).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

import pyarrow as pa

from hardpos import storage
from hardpos.config import ConfigError
from hardpos.data.captions.formats import read_captions
from hardpos.rules.validate import validate
from hardpos.data.triplets import resolve_image
from hardpos.generate import engine_config, rules_engine
from hardpos.generate.join import base_kind, rule_negative
from hardpos.generate.prompts import PromptTemplate
from hardpos.world.lexicon import world_perturber

INPUT_KIND = "input"  # kind of rejects for input rows that never reach an engine


# --------------------------------------------------------------------------- inputs
def input_fingerprint(captions: list[dict]) -> str:
    h = hashlib.sha256()
    for row in captions:
        h.update(f"{row['caption_id']}\x00{row['caption']}\x01".encode("utf-8", errors="replace"))
    return h.hexdigest()[:16]


def load_inputs(uri: str, *, limit: int | None = None, image_root: str | None = None) -> list[dict]:
    """Caption rows for the pipeline: ``index, caption_id, caption, image, negatives``.

    Raises :class:`hardpos.data.captions.CaptionSourceError` (a missing file, no caption
    column, non-UTF-8 text) before any work starts. Relative image paths are resolved
    against ``image_root`` or the input file's folder, so the output's images resolve
    wherever the output lives.
    """
    rows = read_captions(uri, limit=limit)
    base_dir = uri.rsplit("/", 1)[0] if storage.is_s3(uri) else os.path.dirname(os.path.abspath(uri))
    out = []
    for i, row in enumerate(rows):
        image = row.get("image")
        if image:
            image = resolve_image(image, base_dir, image_root)
        out.append({"index": i, "caption_id": str(row["caption_id"]), "caption": row["caption"], "image": image,
                    "negatives": row["negatives"]})
    return out


def dataset_name(uri: str) -> str:
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    for ext in (".parquet", ".jsonl", ".json", ".tsv", ".csv"):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return name


# --------------------------------------------------------------------------- planning
@dataclasses.dataclass
class Shard:
    index: int
    captions: list[dict]
    requests: list[dict]
    input_rejects: list[dict]

    @property
    def inputs(self) -> int:
        return len(self.requests) + len(self.input_rejects)


def _input_problem(caption: Any) -> tuple[str, str] | None:
    if not isinstance(caption, str):
        return "non_text", f"caption is {type(caption).__name__}, not text"
    if not caption.strip():
        return "empty", "input caption is empty"
    if "\ufffd" in caption or any(ord(ch) < 32 and ch not in "\t\n\r" for ch in caption):
        return "non_text", "input caption holds undecodable or control characters"
    return None


def reject_row(base: dict, kind: str, polarity: str, reason: str, detail: str, source: str) -> dict:
    return {"request_id": f"{base['index']}:{kind}", "shard": base["shard"], "caption_id": base["caption_id"],
            "caption": base["caption"] if isinstance(base["caption"], str) else repr(base["caption"]),
            "kind": kind, "polarity": polarity, "raw_output": None, "engine_error": None, "engine_detail": None,
            "prompt_tokens": 0, "completion_tokens": 0, "source": source, "status": "rejected", "reason": reason,
            "detail": detail, "text": None}


def plan_shard(captions: list[dict], templates: list[PromptTemplate], index: int, source: str) -> Shard:
    """One shard (number ``index``) of ``captions`` expanded into requests. Pure.

    Each caption gets one request per template whose ``when`` matches (the paper: REPLACE
    for all, SWAP for captions with "and" and < 15 words). Input rows with no usable
    caption, or no applicable prompt, become rejects of kind "input" here.
    """
    requests, rejects = [], []
    for row in captions:
        row = {**row, "shard": index}
        problem = _input_problem(row["caption"])
        if problem:
            rejects.append(reject_row(row, INPUT_KIND, "positive", problem[0], problem[1], source))
            continue
        kinds = [t for t in templates if t.applies(row["caption"])]
        if not kinds:
            rejects.append(reject_row(row, INPUT_KIND, "positive", "no_prompt", "no prompt applies", source))
        for t in kinds:
            requests.append({"request_id": f"{row['index']}:{t.kind}", "shard": index, "caption_id": row["caption_id"],
                             "caption": row["caption"], "kind": t.kind, "polarity": t.polarity})
    return Shard(index, captions, requests, rejects)


def plan(captions: list[dict], templates: list[PromptTemplate], shard_size: int, source: str) -> list[Shard]:
    """Split captions into shards (input order) and expand them into requests
    (:func:`plan_shard`). Pure; the stage itself plans each shard on a worker."""
    if shard_size < 1:
        raise ConfigError(f"shard_size must be >= 1, got {shard_size}")
    return [plan_shard(captions[start:start + shard_size], templates, s, source)
            for s, start in enumerate(range(0, len(captions), shard_size))]


# --------------------------------------------------------------------------- validation
def judge(row: dict, mode: str = "strict") -> dict:
    """Engine row -> result row: the validator's verdict (or the engine error) as status/reason.

    mode: the validator's mode for this row's kind (its template's ``validation``)."""
    out = dict(row)
    if row.get("engine_error"):
        out.update(status="rejected", reason=row["engine_error"], detail=row.get("engine_detail"), text=None)
        return out
    verdict = validate(row["caption"], row.get("raw_output"), row["kind"], mode)
    if verdict.accepted:
        out.update(status="accepted", reason=None, detail=None, text=verdict.text)
    else:
        out.update(status="rejected", reason=verdict.reason, detail=None, text=None)
    return out


def result_schema():
    schema = rules_engine.engine_schema()
    for name in ("status", "reason", "detail", "text", "rule_negative"):
        schema = schema.append(pa.field(name, pa.string()))
    return schema


def judge_batch(batch, rule_negatives: dict | None = None, validation: dict[str, str] | None = None):
    """``map_batches`` form of :func:`judge` (pyarrow in, pyarrow out, fixed schema).

    rule_negatives: ``{"seed": int, "world_dir": str | None}`` to also attach each row's rule
    hard negative for its base kind (column ``rule_negative``, see :func:`rule_negative`),
    so the join needs no rule work on the driver; None leaves the column null. Run in the
    same task as the rule engine, the perturber's per-caption cache makes this nearly free.
    validation: kind -> validator mode (the templates' ``validation``); kinds not in it, and
    the rule engine's own rows, are validated strictly.
    """
    rules = world_perturber(rule_negatives["seed"], rule_negatives["world_dir"]) if rule_negatives else None
    rows = []
    for r in batch.to_pylist():
        row = judge({c: r.get(c) for c in engine_config.REQUEST_COLUMNS + engine_config.ENGINE_COLUMNS},
                    (validation or {}).get(r.get("kind"), "strict"))
        row["rule_negative"] = rule_negative(rules, row["caption"], base_kind(row["kind"])) if rules else None
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=result_schema())
