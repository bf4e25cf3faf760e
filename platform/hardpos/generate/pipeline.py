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
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import os
import shutil
import sys
import time
from typing import Any, Callable, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.config import ConfigError
from hardpos.data.captions import read_captions
from hardpos.data.perturb import RulePerturber
from hardpos.data.triplets import make_triplet, read_triplets, resolve_image, write_triplets
from hardpos.data.validate import is_conjunct_swap, validate
from hardpos.generate import engines
from hardpos.generate.prompts import PromptTemplate

ACCEPTED_COLUMNS = ("request_id", "shard", "caption_id", "caption", "kind", "polarity", "text", "raw_output", "source",
                    "prompt_tokens", "completion_tokens")
REJECT_COLUMNS = ("request_id", "shard", "caption_id", "caption", "kind", "polarity", "reason", "detail", "raw_output",
                  "source")
INPUT_KIND = "input"  # kind of rejects for input rows that never reach an engine
MANIFEST_KEYS = ("input_fingerprint", "num_captions", "shard_size", "prompts_fingerprint", "engine", "model", "seed",
                 "join")


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


def plan(captions: list[dict], templates: list[PromptTemplate], shard_size: int, source: str) -> list[Shard]:
    """Split captions into shards (input order) and expand them into requests. Pure.

    Each caption gets one request per template whose ``when`` matches (the paper: REPLACE
    for all, SWAP for captions with "and" and < 15 words). Input rows with no usable
    caption, or no applicable prompt, become rejects of kind "input" here.
    """
    if shard_size < 1:
        raise ConfigError(f"shard_size must be >= 1, got {shard_size}")
    shards = []
    for s, start in enumerate(range(0, len(captions), shard_size)):
        chunk = captions[start:start + shard_size]
        requests, rejects = [], []
        for row in chunk:
            row = {**row, "shard": s}
            problem = _input_problem(row["caption"])
            if problem:
                rejects.append(reject_row(row, INPUT_KIND, "positive", problem[0], problem[1], source))
                continue
            kinds = [t for t in templates if t.applies(row["caption"])]
            if not kinds:
                rejects.append(reject_row(row, INPUT_KIND, "positive", "no_prompt", "no prompt applies", source))
            for t in kinds:
                requests.append({"request_id": f"{row['index']}:{t.kind}", "shard": s, "caption_id": row["caption_id"],
                                 "caption": row["caption"], "kind": t.kind, "polarity": t.polarity})
        shards.append(Shard(s, chunk, requests, rejects))
    return shards


# --------------------------------------------------------------------------- validation
def judge(row: dict) -> dict:
    """Engine row -> result row: the validator's verdict (or the engine error) as status/reason."""
    out = dict(row)
    if row.get("engine_error"):
        out.update(status="rejected", reason=row["engine_error"], detail=row.get("engine_detail"), text=None)
        return out
    verdict = validate(row["caption"], row.get("raw_output"), row["kind"])
    if verdict.accepted:
        out.update(status="accepted", reason=None, detail=None, text=verdict.text)
    else:
        out.update(status="rejected", reason=verdict.reason, detail=None, text=None)
    return out


def result_schema():
    schema = engines.engine_schema()
    for name in ("status", "reason", "detail", "text", "rule_negative"):
        schema = schema.append(pa.field(name, pa.string()))
    return schema


def judge_batch(batch, rule_negatives: dict | None = None):
    """``map_batches`` form of :func:`judge` (pyarrow in, pyarrow out, fixed schema).

    rule_negatives: ``{"seed": int, "world_dir": str | None}`` to also attach each row's rule
    hard negative for its base kind (column ``rule_negative``, see :func:`rule_negative`),
    so the join needs no rule work on the driver; None leaves the column null. Run in the
    same task as the rule engine, the perturber's per-caption cache makes this nearly free.
    """
    rules = engines.cached_perturber(rule_negatives["seed"], rule_negatives["world_dir"]) if rule_negatives else None
    rows = []
    for r in batch.to_pylist():
        row = judge({c: r.get(c) for c in engines.REQUEST_COLUMNS + engines.ENGINE_COLUMNS})
        row["rule_negative"] = rule_negative(rules, row["caption"], base_kind(row["kind"])) if rules else None
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=result_schema())


# --------------------------------------------------------------------------- join
def base_kind(kind: str) -> str:
    """"replace_positive" / "replace_negative" / "replace" -> "replace" (likewise swap)."""
    base = kind.split("_")[0]
    return base if base in ("replace", "swap") else "replace"


def rule_negative(rules, caption: str, kind: str) -> str | None:
    """The rule engine's hard negative for ``caption``: one of ``kind`` if the rules make one,
    else of any kind; vetted by the shared validator (as the perturb stage does); None when
    the rules make none or cannot parse the caption. Deterministic (seeded per caption), so
    workers and the driver agree on it.
    """
    if not isinstance(caption, str):
        return None
    try:
        p = rules.pick(caption, "negative", kind) or rules.pick(caption, "negative")
    except Exception:  # noqa: BLE001 - a caption the rules cannot parse has no rule negative
        return None
    if p is None or not validate(caption, p.text, f"{p.kind}_negative").accepted:
        return None
    return p.text


def rule_negatives_of(results: Iterable[dict]) -> dict[tuple[str, str], str | None]:
    """(caption index, base kind) -> the rule negative the workers attached to a result row
    (:func:`judge_batch` with ``rule_negatives``); rows without the column (input rejects,
    which never reach the workers) are skipped."""
    return {(r["request_id"].split(":", 1)[0], base_kind(r["kind"])): r["rule_negative"]
            for r in results if "rule_negative" in r}


def dataset_negatives(cap: dict) -> list[str]:
    """The source's own negatives of ``cap`` that really are negatives.

    Some datasets' "negatives" keep the meaning: NegCLIP's COCO swaps include 210 whole-
    conjunct swaps ("A dog and a cat ..." -> "A cat and a dog ..."), which are SWAP hard
    *positives*. Training on one as a negative teaches exactly the brittleness the paper is
    about, so they are left out here (and counted by :func:`meaning_kept_negatives`).
    """
    return [n for n in cap["negatives"] or [] if not is_conjunct_swap(cap["caption"], n)]


def meaning_kept_negatives(captions: Iterable[dict]) -> int:
    """How many dataset negatives of ``captions`` :func:`dataset_negatives` leaves out."""
    return sum(len(c["negatives"] or []) - len(dataset_negatives(c)) for c in captions)


class NegativePicker:
    """The hard negative for a (caption, kind): dataset > LLM > rules under mode "auto"."""

    def __init__(self, mode: str, seed: int, dataset: str, world_dir: str | None = None):
        self.mode, self.seed, self.dataset, self.world_dir = mode, seed, dataset, world_dir
        self._rules = None

    @property
    def wants_rule_negatives(self) -> bool:
        """Whether the join may fall back to rule negatives (worth computing on the workers)."""
        return self.mode in ("auto", "rules")

    def _rule(self, cap: dict, kind: str, known: Mapping[tuple[str, str], str | None]) -> str | None:
        key = (str(cap["index"]), kind)
        if key in known:
            return known[key]
        if self._rules is None:
            self._rules = RulePerturber(seed=self.seed, lexicon=engines.rule_lexicon(self.world_dir))
        return rule_negative(self._rules, cap["caption"], kind)

    def pick(self, cap: dict, kind: str, llm_negatives: dict[str, str],
             known: Mapping[tuple[str, str], str | None] = {}) -> tuple[str | None, str | None]:  # noqa: B006 - read only
        """(negative text, its source) or (None, None).

        known: rule negatives already computed on the workers (:func:`rule_negatives_of`);
        anything not in it is computed here with the same :func:`rule_negative`.
        """
        if self.mode == "none":
            return None, None
        base = kind.split("_")[0]
        usable = dataset_negatives(cap) if self.mode in ("auto", "dataset") else []
        if usable:
            i = engines.row_seed(self.seed, cap["caption_id"], "negative") % len(usable)
            return usable[i], f"dataset:{self.dataset}"
        if self.mode in ("auto", "llm"):
            others = [v for k, v in llm_negatives.items() if not k.startswith("__")]
            text = llm_negatives.get(f"{base}_negative") or next(iter(others), None)
            if text:
                return text, llm_negatives.get("__source__")
        if self.mode in ("auto", "rules"):
            text = self._rule(cap, base_kind(kind), known)
            if text:
                return text, "rule"
        return None, None


POSITIVES_MODES = ("one", "all")


def positive_choice(seed: int, caption_id: str, n: int) -> int:
    """Index of the hard positive a caption trains with under ``positives="one"``.

    The rule: ``sha256(f"{seed}\\x00{caption_id}\\x00positive")`` (its first 4 bytes,
    little-endian; :func:`hardpos.generate.engines.row_seed`) modulo ``n``, over the
    caption's accepted positives sorted by kind ("replace" < "swap"). It depends only on
    the seed and the caption id, never on the order the engine answered in, so reruns,
    resumes and any sharding give the same row; another seed may pick another positive.
    """
    if n < 1:
        raise ValueError(f"positive_choice needs at least one positive, got n={n}")
    return engines.row_seed(seed, caption_id, "positive") % n


def join_caption(cap: dict, rows: list[dict], picker: NegativePicker, positives: str = "one",
                 keep_unmatched: bool = True, rule_negatives: Mapping[tuple[str, str], str | None] = {}  # noqa: B006
                 ) -> list[dict]:
    """The triplet rows of one caption from its accepted engine rows (any order). Pure
    apart from the rule engine the picker may run.

    positives: "one" gives at most one row: the positive :func:`positive_choice` picks
    (seeded with ``picker.seed``, the stage's seed) over the caption's accepted positives
    sorted by kind, as the paper pairs each training caption with one hard positive and
    one hard negative; "all" gives one row per accepted positive, in kind order.
    Each row's hard negative is picked for that row's positive kind (``picker.pick``).
    A caption with no accepted positive gives one row with a null positive (when
    ``keep_unmatched`` and a negative exists), so hard-negative-only training sees it.

    Every row records the choice: ``n_positives`` (the caption's accepted positives),
    ``positive_kinds`` (their kinds, comma-joined, in the order the index counts) and
    ``positive_index`` (0-based index of this row's positive in that order; null on a
    negative-only row). ``kind``/``source`` are the chosen positive's.
    """
    if positives not in POSITIVES_MODES:
        raise ValueError(f"positives must be one of {POSITIVES_MODES}, got {positives!r}")
    rows = sorted(rows, key=lambda r: r["kind"])  # a stable order, whatever order the engine answered in
    pos = [r for r in rows if r["polarity"] == "positive"]
    llm_neg = {r["kind"]: r["text"] for r in rows if r["polarity"] == "negative"}
    if llm_neg:
        llm_neg["__source__"] = next(r["source"] for r in rows if r["polarity"] == "negative")
    common = {"image": cap["image"], "caption": cap["caption"], "caption_id": cap["caption_id"],
              "n_positives": len(pos), "positive_kinds": ",".join(r["kind"] for r in pos) or None}
    if pos:
        chosen = range(len(pos)) if positives == "all" else [positive_choice(picker.seed, cap["caption_id"], len(pos))]
        out = []
        for i in chosen:
            p = pos[i]
            neg, neg_source = picker.pick(cap, p["kind"], llm_neg, rule_negatives)
            out.append(make_triplet(**common, hard_negative=neg, hard_positive=p["text"], kind=p["kind"],
                                    source=p["source"], negative_source=neg_source, positive_index=i))
        return out
    if keep_unmatched and isinstance(cap["caption"], str) and cap["caption"].strip():
        neg, neg_source = picker.pick(cap, "replace", llm_neg, rule_negatives)
        if neg is not None:
            return [make_triplet(**common, hard_negative=neg, hard_positive=None, kind="replace", source=neg_source,
                                 negative_source=neg_source, positive_index=None)]
    return []


def join_by_caption(captions: list[dict], accepted: list[dict], picker: NegativePicker, positives: str = "one",
                    keep_unmatched: bool = True, rule_negatives: Mapping[tuple[str, str], str | None] = {}  # noqa: B006
                    ) -> list[list[dict]]:
    """:func:`join_caption` for every caption of a shard: one list of rows per caption, in
    caption order (what :func:`join_counts` counts).

    rule_negatives: the workers' rule negatives (:func:`rule_negatives_of` over the shard's
    results); the same values are computed here for whatever it lacks, so it changes the
    speed of the join, never its output."""
    by_caption: dict[str, list[dict]] = collections.defaultdict(list)
    for row in accepted:
        by_caption[row["request_id"].split(":", 1)[0]].append(row)
    return [join_caption(cap, by_caption.get(str(cap["index"]), []), picker, positives, keep_unmatched,
                         rule_negatives) for cap in captions]


def join_triplets(captions: list[dict], accepted: list[dict], picker: NegativePicker,
                  keep_unmatched: bool = True, rule_negatives: Mapping[tuple[str, str], str | None] = {},  # noqa: B006
                  positives: str = "one") -> list[dict]:
    """Training triplets for one shard, flat in caption order (see :func:`join_caption`):
    with ``positives="one"`` (the default) at most one row per caption."""
    return [t for rows in join_by_caption(captions, accepted, picker, positives, keep_unmatched, rule_negatives)
            for t in rows]


def join_counts(per_caption: list[list[dict]]) -> dict[str, Any]:
    """What the join made of a shard's captions (summed over shards by :func:`aggregate`):

    ``triplets_per_caption`` / ``positives_per_caption``: histograms ``{"n": captions}``
    of rows written and accepted positives per caption; ``captions_with_positive`` and
    ``captions_with_several_positives`` (> 1 accepted positive: under "one" only one of
    them trains); ``positives_unused``: accepted positives in no row.
    """
    n_pos = [rows[0]["n_positives"] if rows else 0 for rows in per_caption]
    used = sum(1 for rows in per_caption for t in rows if t["hard_positive"] is not None)
    return {
        "triplets_per_caption": {str(k): v for k, v in sorted(collections.Counter(map(len, per_caption)).items())},
        "positives_per_caption": {str(k): v for k, v in sorted(collections.Counter(n_pos).items())},
        "captions_with_positive": sum(1 for n in n_pos if n > 0),
        "captions_with_several_positives": sum(1 for n in n_pos if n > 1),
        "positives_unused": sum(n_pos) - used,
    }


# --------------------------------------------------------------------------- shard files
def _parquet_bytes(rows: list[dict], columns: Iterable[str]) -> bytes:
    schema = result_schema()
    fields = [schema.field(c) for c in columns]
    table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows], schema=pa.schema(fields))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def shard_path(out_dir: str, index: int, what: str) -> str:
    return storage.join(out_dir, "shards", f"shard-{index:05d}.{what}")


def counts_of(results: list[dict]) -> dict[str, Any]:
    acc = [r for r in results if r["status"] == "accepted"]
    rej = [r for r in results if r["status"] != "accepted"]
    return {
        "inputs": len(results),
        "accepted": len(acc),
        "rejected": len(rej),
        "accepted_by_kind": dict(collections.Counter(r["kind"] for r in acc)),
        "rejected_by_kind": dict(collections.Counter(r["kind"] for r in rej)),
        "rejected_by_reason": dict(collections.Counter(r["reason"] for r in rej)),
        "rejected_by_kind_reason": dict(collections.Counter(f"{r['kind']}/{r['reason']}" for r in rej)),
        "prompt_tokens": sum(int(r.get("prompt_tokens") or 0) for r in results),
        "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in results),
    }


def write_shard(out_dir: str, shard: Shard, results: list[dict], triplets: list[dict] | None,
                join_stats: Mapping[str, Any] | None = None) -> dict:
    """Write one finished shard; the ``.done.json`` marker goes last (it is the commit).

    join_stats: the join's own counts (:func:`join_counts`), kept in the marker beside the
    row counts so the run's summary can add them up over shards."""
    expected = {r["request_id"] for r in shard.requests} | {r["request_id"] for r in shard.input_rejects}
    got = [r["request_id"] for r in results]
    if len(got) != len(set(got)) or set(got) != expected:
        missing, extra = expected - set(got), set(got) - expected
        raise RuntimeError(f"shard {shard.index}: results do not match its requests exactly "
                           f"(missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}, "
                           f"duplicates {len(got) - len(set(got))})")
    results = sorted(results, key=lambda r: (int(r["request_id"].split(":")[0]), r["request_id"]))
    accepted = [r for r in results if r["status"] == "accepted"]
    rejects = [r for r in results if r["status"] != "accepted"]
    storage.write_bytes(shard_path(out_dir, shard.index, "accepted.parquet"), _parquet_bytes(accepted, ACCEPTED_COLUMNS))
    storage.write_bytes(shard_path(out_dir, shard.index, "rejects.parquet"), _parquet_bytes(rejects, REJECT_COLUMNS))
    counts = counts_of(results)
    counts["captions"] = len(shard.captions)
    if triplets is not None:
        write_triplets(triplets, shard_path(out_dir, shard.index, "triplets.parquet")) if triplets else None
        counts["triplets"] = len(triplets)
        counts["triplets_with_positive"] = sum(1 for t in triplets if t["hard_positive"] is not None)
        counts["triplets_with_negative"] = sum(1 for t in triplets if t["hard_negative"] is not None)
    if join_stats:
        counts.update(join_stats)
    if counts["inputs"] != counts["accepted"] + counts["rejected"] or counts["inputs"] != shard.inputs:
        raise RuntimeError(f"shard {shard.index}: conservation violated: {counts}")
    storage.write_json(shard_path(out_dir, shard.index, "done.json"), counts)
    return counts


def done_shards(out_dir: str) -> set[int]:
    """Indices of the shards whose ``.done.json`` marker exists."""
    prefix = storage.join(out_dir, "shards")
    out = set()
    for path in storage.list_files(prefix, suffix=".done.json"):
        name = str(path).rsplit("/", 1)[-1]
        try:
            out.add(int(name.split(".")[0].split("-")[1]))
        except (IndexError, ValueError):
            continue
    return out


def check_manifest(out_dir: str, manifest: dict) -> None:
    """Write the manifest on the first run; on reruns refuse to mix different settings."""
    path = storage.join(out_dir, "manifest.json")
    if storage.exists(path):
        old = storage.read_json(path)
        diff = {k: (old.get(k), manifest.get(k)) for k in MANIFEST_KEYS if old.get(k) != manifest.get(k)}
        if diff:
            raise ConfigError(f"{out_dir} holds shards of a run with different settings {diff}; resume needs the "
                              "same input, shard_size, prompts, engine, model and seed: use a new output_dir "
                              "(or overwrite=true to start over)")
        return
    storage.write_json(path, manifest)


MERGED = ("manifest.json", "accepted.parquet", "rejects.parquet", "samples.json")


def clear_output(out_dir: str, extra: Iterable[str] = ()) -> None:
    """Remove shard files, the manifest and merged outputs (``overwrite=true``)."""
    names = [*MERGED, *extra]
    if storage.is_s3(out_dir):
        bucket, _ = storage.split_s3(out_dir)
        client = storage.s3_client()
        for uri in [*storage.list_files(storage.join(out_dir, "shards")), *(storage.join(out_dir, n) for n in names)]:
            client.delete_object(Bucket=bucket, Key=storage.split_s3(uri)[1])  # deleting a missing key is a no-op
        return

    shutil.rmtree(storage.join(out_dir, "shards"), ignore_errors=True)
    for name in names:
        try:
            os.remove(storage.join(out_dir, name))
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- merge
def read_parquet_rows(uri: str) -> list[dict]:
    return pq.read_table(io.BytesIO(storage.read_bytes(uri))).to_pylist()


def merge_outputs(out_dir: str, num_shards: int, join: bool, triplets_name: str) -> dict[str, str]:
    """Concatenate every shard's files into the run's merged outputs (shard order)."""
    outputs = {}
    for what in ("accepted", "rejects"):
        tables = [pq.read_table(io.BytesIO(storage.read_bytes(shard_path(out_dir, i, f"{what}.parquet"))))
                  for i in range(num_shards)]
        table = pa.concat_tables(tables) if tables else pa.table({})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        outputs[what] = storage.write_bytes(storage.join(out_dir, f"{what}.parquet"), buf.getvalue())
    if join:
        rows = []
        for i in range(num_shards):
            p = shard_path(out_dir, i, "triplets.parquet")
            if storage.exists(p):
                rows.extend(read_triplets(p))
        outputs["triplets"] = write_triplets(rows, storage.join(out_dir, triplets_name))
    return outputs


def sample_rows(out_dir: str, indices: list[int], n: int) -> dict[str, Any]:
    """Up to ``n`` accepted pairs and up to ``n`` rejects per reason, from the first finished shards."""
    accepted: list[dict] = []
    rejects: dict[str, list[dict]] = collections.defaultdict(list)
    for i in indices[:8]:
        for r in read_parquet_rows(shard_path(out_dir, i, "accepted.parquet")):
            if len(accepted) < n:
                accepted.append({k: r[k] for k in ("kind", "caption", "text", "source")})
        for r in read_parquet_rows(shard_path(out_dir, i, "rejects.parquet")):
            if len(rejects[r["reason"]]) < n:
                rejects[r["reason"]].append({k: r[k] for k in ("kind", "caption", "raw_output", "reason", "detail")})
    return {"accepted": accepted, "rejected": dict(rejects)}


def aggregate(counts: list[dict]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for c in counts:
        for k, v in c.items():
            if isinstance(v, dict):
                bucket = total.setdefault(k, {})
                for kk, vv in v.items():
                    bucket[kk] = bucket.get(kk, 0) + vv
            else:
                total[k] = total.get(k, 0) + v
    return total


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
