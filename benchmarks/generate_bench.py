"""Throughput of the generate stage, measured side by side (``benchmark suite=generate``).

Cases (each pair alternates in one process, see :func:`benchmarks.harness.compare_alternating`):

* rules: the full stage on Ray Data (rule tasks fused with validation and the join's rule
  negatives, sharded parquet, triplet join) vs the same rule work in a plain in-process loop
  (``RulePerturber.pick`` + ``validate`` + ``rule_negative``, nothing written), on a warm
  local cluster; the first run, which also starts Ray, is reported beside it.
* http: the full stage with its default http engine (``engine.http.concurrency`` actors, each
  with up to ``engine.http.max_in_flight`` requests open) against the OpenAI-compatible stub
  (:mod:`tests.support.openai_stub`) with a fixed per-request latency vs a sequential client
  (one ``requests.post`` at a time, the paper's "plain pipeline" shape). How full the engine
  keeps a batching endpoint, beside a plain asyncio client: :mod:`benchmarks.generate_inflight`.

:func:`generate_bench` returns rows for the harness; :func:`measure_stage` runs the stage
once and returns its captions/s, requests/s and tokens/s.

Captions: ``negclip/valid_neg_clip.tsv`` under ``data_dir`` / ``$HARDPOS_REFERENCE_DATA``
when present, else synthetic ones.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

import hardpos.generate.stage
from benchmarks.harness import compare_alternating, reference_data_dir, time_call
from hardpos.config import load_config
from hardpos.data.captions.formats import read_captions
from hardpos.rules.perturber import RulePerturber
from hardpos.rules.validate import validate
from hardpos.generate.engine_config import SamplingConfig
from hardpos.generate.http_engine import chat_payload
from hardpos.generate.join import base_kind, rule_negative
from hardpos.generate.prompts import load_prompts
from hardpos.runtime import execute
from tests.support.openai_stub import OpenAIStub

NEGCLIP = "negclip/valid_neg_clip.tsv"  # under the reference data folder


def caption_file(n: int, tmp: str, data_dir: str | None = None) -> str:
    """A jsonl of n real NegCLIP captions (repeated if needed) from ``data_dir`` /
    ``$HARDPOS_REFERENCE_DATA``, else synthetic ones."""
    caps: list[str] = []
    root = reference_data_dir(data_dir)
    if root is not None and (root / NEGCLIP).is_file():
        caps = [r["caption"] for r in read_captions(str(root / NEGCLIP)) if r["caption"].strip()]
    if not caps:
        words = "a man riding a red bike and a small dog walking on a sunny street".split()
        caps = [" ".join(words[: 6 + i % 10]) for i in range(200)]
    caps = (caps * (n // len(caps) + 1))[:n]
    path = Path(tmp) / f"captions-{n}.jsonl"
    path.write_text("".join(json.dumps({"caption_id": str(i), "caption": c}) + "\n" for i, c in enumerate(caps)))
    return str(path)


def measure_stage(input_uri: str, output_dir: str, overrides: list[str]) -> dict[str, Any]:
    """Run the generate stage once (fresh output, no MLflow) and return its throughput figures."""
    cfg = load_config(hardpos.generate.stage.Config, None, [f"input={input_uri}", f"output_dir={output_dir}", "overwrite=true",
                                       "tracking.enabled=false", *overrides])
    summary = execute("generate", cfg, quiet=True)
    return {**summary["this_run"], "inputs": summary["inputs"], "accepted": summary["accepted"],
            "elapsed_s": summary["elapsed_s"]}


def inprocess_rules(input_uri: str, seed: int = 0) -> int:
    """The baseline: the same rule work as the stage, in this process, nothing written:
    a positive per applicable prompt, validated, and the join's rule negative for it (or
    for the caption, when it gets no positive). Returns the number of triplets."""
    templates = load_prompts("paper")
    rules = RulePerturber(seed=seed)
    triplets = 0
    for row in read_captions(input_uri):
        caption, positives = row["caption"], 0
        for t in templates:
            if t.applies(caption):
                p = rules.pick(caption, "positive", t.kind)
                if p and validate(caption, p.text, t.kind).accepted:
                    rule_negative(rules, caption, base_kind(t.kind))  # the triplet's negative
                    positives += 1
                    triplets += 1
        if not positives:
            triplets += rule_negative(rules, caption, "replace") is not None
    return triplets


def sequential_http(input_uri: str, url: str, model: str = "stub-llm") -> int:
    """The baseline: one chat/completions request at a time from one client."""
    templates = load_prompts("paper")
    done = 0
    with requests.Session() as session:
        for row in read_captions(input_uri):
            for t in templates:
                if t.applies(row["caption"]):
                    session.post(url, json=chat_payload(model, t.messages(row["caption"]), SamplingConfig()), timeout=60)
                    done += 1
    return done


def generate_bench(quick: bool = False, repeats: int = 3, latency_s: float = 0.02, http_concurrency: int = 2,
                   data_dir: str | None = None) -> list[dict[str, Any]]:
    """Rows for the benchmark harness (see the module docstring)."""
    n_rules, n_http = (200, 40) if quick else (4839, 400)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hardpos-genbench-") as tmp:
        src = caption_file(n_rules, tmp, data_dir)
        last: dict[str, Any] = {}

        def rules_stage():
            last.update(measure_stage(src, f"{tmp}/rules", ["engine.kind=rules", "shard_size=1000"]))

        # The first run pays for starting a local Ray and importing the library in each
        # worker; a job submitted to a running cluster pays neither, so it is reported
        # apart and the alternation runs on the warm cluster.
        cold_s = time_call(rules_stage)
        row = compare_alternating(rules_stage, lambda: inprocess_rules(src), repeats=repeats, warmup=0,
                                  work_items=n_rules)
        row.update(case=f"rules: Ray Data stage (validate, join, parquet) vs the same rule work in-process, "
                        f"nothing written, {n_rules} captions (captions/s)",
                   stage_captions_per_s=last.get("captions_per_s"), first_run_with_ray_start_s=round(cold_s, 2))
        rows.append(row)

        src_http = caption_file(n_http, tmp, data_dir)
        with OpenAIStub(latency_s=latency_s) as stub:
            over = ["engine.kind=http", f"engine.http.url={stub.url}", "engine.http.model=stub-llm",
                    f"engine.http.concurrency={http_concurrency}", "engine.http.retry_wait_s=0.01",
                    "engine.http.preflight=false", "shard_size=100"]
            last_http: dict[str, Any] = {}

            def http_stage():
                last_http.update(measure_stage(src_http, f"{tmp}/http", over))

            t0 = time.perf_counter()
            n_req = sequential_http(src_http, stub.url)
            seq_s = time.perf_counter() - t0
            row = compare_alternating(http_stage, lambda: sequential_http(src_http, stub.url), repeats=repeats,
                                      warmup=0, work_items=n_http)
            row.update(case=f"http: Ray Data stage ({http_concurrency} actors, requests in flight) vs sequential client, {n_http} "
                            f"captions / {n_req} requests, stub latency {latency_s * 1000:.0f} ms (captions/s)",
                       stage_captions_per_s=last_http.get("captions_per_s"),
                       stage_requests_per_s=last_http.get("requests_per_s"),
                       stage_tokens_per_s=last_http.get("tokens_per_s"),
                       sequential_requests_per_s=round(n_req / seq_s, 2))
            rows.append(row)
    return rows


if __name__ == "__main__":  # python -m benchmarks.generate_bench [quick]
    import sys

    result = generate_bench(quick="quick" in sys.argv[1:], repeats=3)
    print(json.dumps(result, indent=1, default=str))
