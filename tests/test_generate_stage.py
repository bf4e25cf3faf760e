"""The generate stage: prompts as data, engine config builders, the OpenAI-compatible stub,
the real Ray Data pipeline (http against the stub on real NegCLIP captions, the rule
engine), sharded exactly-once resume, bad inputs, S3 output, and a GPU-only vLLM run."""
from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from hardpos.config import ConfigError, load_config
from hardpos.generate import engine_config, http_engine, join, pipeline, planning, shard_files, vllm_engine
from hardpos.generate.prompts import load_prompts
from tests.support import free_port
from tests.support.openai_stub import OpenAIStub, behaviour, canned

NEGCLIP = "negclip/valid_neg_clip.tsv"


def gen_config(tmp_path, *overrides, name="out"):
    from hardpos.generate import stage as generate

    return load_config(generate.Config, None, [f"output_dir={tmp_path / name}", "tracking.enabled=false", *overrides])


def run_stage(cfg):
    from hardpos.runtime import execute

    return execute("generate", cfg, quiet=True)


def http_overrides(stub, *extra):
    return ["engine.kind=http", f"engine.http.url={stub.url}", "engine.http.model=stub-llm",
            "engine.http.retry_wait_s=0.01", "engine.http.batch_size=16",
            # the preflight request would shift the stub's exact request counts; tested on its own
            "engine.http.preflight=false", *extra]


def merged(out_dir, what):
    return shard_files.read_parquet_rows(os.path.join(out_dir, f"{what}.parquet"))


# --------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("preset", ["paper", "chat"])
def test_bundled_prompts_apply_replace_to_all_and_swap_to_short_and_captions(preset):
    templates = {t.kind: t for t in load_prompts(preset)}
    assert list(templates) == ["replace", "swap"]
    assert templates["replace"].polarity == templates["swap"].polarity == "positive"
    fourteen = "A man and a woman " + " ".join(["word"] * 9) + "."  # 14 words
    fifteen = "A man and a woman " + " ".join(["word"] * 10) + "."
    assert templates["replace"].applies(fifteen) and templates["replace"].applies("A dog.")
    assert templates["swap"].applies(fourteen)
    assert not templates["swap"].applies(fifteen)          # fewer than 15 words
    assert not templates["swap"].applies("A sandy beach.")  # "and" must be a whole word


def test_chat_prompts_send_few_shot_turns_before_the_caption():
    templates = {t.kind: t for t in load_prompts("chat")}
    assert {t.prompt_mode for t in templates.values()} == {"chat"}
    msgs = templates["swap"].messages("A cat {x} and a dog.")
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 3 + ["user"]  # few-shot turns first
    assert msgs[-1]["content"].endswith("Sentence: A cat {x} and a dog.")   # braces survive
    assert "synonym" in templates["replace"].messages("A dog.")[-1]["content"]


def test_prompt_files_include_filter_and_errors(tmp_path):
    assert [t.kind for t in load_prompts("with_negatives")] == ["replace", "swap", "replace_negative", "swap_negative"]
    neg = load_prompts("with_negatives", ["swap_negative"])
    assert [t.polarity for t in neg] == ["negative"]
    custom = tmp_path / "mine.yaml"
    custom.write_text("include: paper.yaml\nprompts:\n  - kind: replace_negative\n    polarity: negative\n"
                      "    user: 'Break it: {caption}'\n")
    (tmp_path / "paper.yaml").write_text("prompts:\n  - kind: replace\n    user: 'Rewrite: {caption}'\n")
    assert [t.kind for t in load_prompts(str(custom))] == ["replace", "replace_negative"]
    with pytest.raises(ConfigError, match="not found"):
        load_prompts(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="kinds"):
        load_prompts("paper", ["nope"])
    (tmp_path / "bad.yaml").write_text("prompts:\n  - kind: replace\n    user: 'no placeholder'\n")
    with pytest.raises(ConfigError, match=r"\{caption\}"):
        load_prompts(str(tmp_path / "bad.yaml"))


# --------------------------------------------------------------------------- engine configs
def test_vllm_processor_config_is_built_from_config():
    cfg = engine_config.VLLMEngineConfig(model_source="/models/tiny", tensor_parallel_size=2, concurrency=3, batch_size=48,
                                   chat_template=False, max_num_seqs=128, max_concurrent_batches=4,
                                   engine_kwargs={"enforce_eager": True})
    pc = vllm_engine.build_vllm_processor_config(cfg)
    assert type(pc).__name__ == "vLLMEngineProcessorConfig"
    assert pc.model_source == "/models/tiny"
    # a fixed pool of 3 replicas from the start (an int would autoscale up from one)
    assert pc.concurrency == (3, 3) and pc.get_concurrency() == {"min_size": 3, "max_size": 3}
    assert pc.batch_size == 48 and pc.max_concurrent_batches == 4  # 48 x 4 = 192 rows offered >= 128 sequences
    assert pc.should_continue_on_error is True  # bad rows are rejects, never a crashed job
    assert pc.chat_template_stage is False and pc.tokenize_stage is True and pc.detokenize_stage is True
    kw = pc.engine_kwargs
    assert kw["tensor_parallel_size"] == 2 and kw["pipeline_parallel_size"] == 1
    assert kw["distributed_executor_backend"] == "ray" and kw["max_num_seqs"] == 128 and kw["enforce_eager"] is True
    assert kw["enable_prefix_caching"] is True
    single = vllm_engine.build_vllm_processor_config(engine_config.VLLMEngineConfig(prefix_caching=False))
    assert "distributed_executor_backend" not in single.engine_kwargs and single.chat_template_stage is True
    assert "max_num_seqs" not in single.engine_kwargs  # vLLM's own default for the GPU
    assert single.engine_kwargs["enable_prefix_caching"] is False
    pre = vllm_engine.VLLMPre({t.kind: t for t in load_prompts("chat")}, engine_config.SamplingConfig(max_tokens=20), True)
    row = pre({"kind": "replace", "caption": "A dog."})
    assert row["sampling_params"] == {"max_tokens": 20, "temperature": 0.0, "top_p": 1.0}
    assert row["messages"][-1]["content"].endswith("Sentence: A dog.")
    post = vllm_engine._normalise_vllm_row("llm:m", {"request_id": "0:replace", "__inference_error__": "boom"})
    assert post["engine_error"] == "inference_error" and post["raw_output"] is None


@pytest.mark.parametrize("overrides, message", [
    (["engine.vllm.concurrency=0"], "engine.vllm.concurrency must be >= 1, got 0"),
    (["engine.vllm.batch_size=32", "engine.vllm.max_num_seqs=512"],
     "engine.vllm.max_concurrent_batches must be >= 16 so that batch_size x max_concurrent_batches (256) reaches "
     "max_num_seqs (512)"),
    (["engine.vllm.max_num_seqs=1024"], "must be >= 16"),
    (["engine.vllm.gpu_memory_utilization=1.5"], "engine.vllm.gpu_memory_utilization must be in (0, 1]"),
    (["engine.vllm.engine_kwargs={max_num_seqs: 64, enable_prefix_caching: false}"],
     "set engine.vllm.prefix_caching, engine.vllm.max_num_seqs instead"),
])
def test_vllm_settings_are_checked_from_one_place(tmp_path, overrides, message):
    import re

    with pytest.raises(ConfigError, match=re.escape(message)):
        gen_config(tmp_path, "engine.kind=vllm", *overrides)


def test_parse_chat_response_covers_every_outcome():
    ok = {"choices": [{"message": {"content": "A big dog."}}], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    out = http_engine.parse_chat_response({"status": 200, "body": json.dumps(ok)})
    assert out == {"raw_output": "A big dog.", "engine_error": None, "engine_detail": None, "prompt_tokens": 9,
                   "completion_tokens": 3}
    err = http_engine.parse_chat_response({"status": 500, "body": json.dumps({"error": {"message": "overloaded"}})})
    assert err["engine_error"] == "http_error" and err["engine_detail"] == "HTTP 500: overloaded"
    down = http_engine.parse_chat_response({"status": 0, "body": "", "error": "ClientConnectorError", "attempts": 4})
    assert down["engine_error"] == "request_failed" and "4 attempt" in down["engine_detail"]
    assert http_engine.parse_chat_response({"status": 200, "body": "<html>"})["engine_error"] == "bad_response"
    assert http_engine.parse_chat_response({"status": 200, "body": "{}"})["engine_error"] == "bad_response"
    null = http_engine.parse_chat_response({"status": 200, "body": json.dumps({"choices": [{"message": {"content": None}}]})})
    assert null["engine_error"] is None and null["raw_output"] is None  # the validator calls it "empty"


def test_http_client_retries_then_reports_instead_of_raising():
    """Against the thread-per-connection stub (the one the cluster test runs): a one-off 503
    is retried once, a 500 is an answer, a dead port is a reject after every retry."""
    templates = {t.kind: t for t in load_prompts("chat", ["replace"])}
    caps = [f"A photo of thing number {i} on a table." for i in range(200)]
    flaky = next(c for c in caps if behaviour(c, "replace") == "flaky")
    broken = next(c for c in caps if behaviour(c, "replace") == "error500")
    rows = [{"request_id": f"{i}:replace", "shard": 0, "caption_id": str(i), "caption": c, "kind": "replace",
             "polarity": "positive"} for i, c in enumerate([flaky, broken])]

    def spec(url, retries=2):
        cfg = engine_config.EngineConfig(kind="http", http=engine_config.HttpEngineConfig(
            url=url, model="m", max_retries=retries, retry_wait_s=0.001, timeout_s=5))
        return http_engine.http_spec(cfg, templates, environ={})

    with OpenAIStub() as stub:
        (good, error), _ = http_engine.run_requests(spec(stub.url), rows)
        assert stub.attempts[(flaky, "replace")] == 2  # 503 once, then the answer
        assert stub.attempts[(broken, "replace")] == 1  # a 500 is an answer, not retried
    assert good["engine_error"] is None and good["raw_output"] == canned(flaky, "replace", 1)[1]
    assert error["engine_error"] == "http_error" and error["engine_detail"].startswith("HTTP 500")
    (down,), _ = http_engine.run_requests(spec(f"http://127.0.0.1:{free_port()}/v1/chat/completions", 1), rows[:1])
    assert down["engine_error"] == "request_failed" and "after 2 attempt(s)" in down["engine_detail"]


def test_http_preflight_fails_fast_on_an_unusable_endpoint(tmp_path):
    payload = {"model": "m", "messages": [{"role": "user", "content": "Replace one word.\nSentence: A red bus."}]}
    dead = engine_config.HttpEngineConfig(url=f"http://127.0.0.1:{free_port()}/v1/chat/completions", timeout_s=5)
    with pytest.raises(ConfigError, match="unreachable"):
        http_engine.preflight(dead, payload)
    with OpenAIStub() as stub:
        assert http_engine.preflight(engine_config.HttpEngineConfig(url=stub.url), payload)["status"] == 200
        with pytest.raises(ConfigError, match="no chat/completions route"):
            http_engine.preflight(engine_config.HttpEngineConfig(url=f"{stub.base_url}/chat"), payload)
        raw = {"model": "m", "prompt": "Replace one word.\nInput: A red bus.\nOutput:"}
        with pytest.raises(ConfigError, match="no completions route.*completions_url"):
            http_engine.preflight(engine_config.HttpEngineConfig(url=stub.url), raw, url=f"{stub.base_url}/complete")
        assert http_engine.preflight(engine_config.HttpEngineConfig(url=stub.url), raw, url=stub.completions_url)["status"] == 200
    # through the stage: its check stops the job before writing anything
    src = tmp_path / "caps.jsonl"
    src.write_text(json.dumps({"caption": "A red bus."}) + "\n")
    with pytest.raises(ConfigError, match=r"engine\.http\.url=.*: does not answer"):
        run_stage(gen_config(tmp_path, f"input={src}", "engine.kind=http", f"engine.http.url={dead.url}"))
    assert not (tmp_path / "out" / "shards").exists() and not (tmp_path / "out" / "manifest.json").exists()


# --------------------------------------------------------------------------- planning
def test_plan_shards_requests_and_input_rejects():
    templates = load_prompts("paper")
    caps = [{"index": i, "caption_id": f"c{i}", "caption": c, "image": None, "negatives": []} for i, c in enumerate(
        ["A cat and a dog.", "A red bus.", "", "Bad \ufffd bytes.", "Two men and a horse on a long road."])]
    shards = planning.plan(caps, templates, 2, "rule")
    assert [len(s.captions) for s in shards] == [2, 2, 1]
    assert [r["request_id"] for r in shards[0].requests] == ["0:replace", "0:swap", "1:replace"]
    assert [(r["reason"], r["kind"]) for r in shards[1].input_rejects] == [("empty", "input"), ("non_text", "input")]
    assert [r["kind"] for r in shards[2].requests] == ["replace", "swap"]
    assert sum(s.inputs for s in shards) == 3 + 2 + 2


def test_write_shard_refuses_duplicates_and_gaps(tmp_path):
    caps = [{"index": 0, "caption_id": "0", "caption": "A red bus.", "image": None, "negatives": []}]
    shard = planning.plan(caps, load_prompts("paper"), 10, "rule")[0]
    row = {**shard.requests[0], "raw_output": "A crimson bus.", "engine_error": None, "engine_detail": None,
           "prompt_tokens": 0, "completion_tokens": 0, "source": "rule"}
    good = planning.judge(row)
    assert good["status"] == "accepted" and good["text"] == "A crimson bus."
    with pytest.raises(RuntimeError, match="duplicates 1"):
        shard_files.write_shard(str(tmp_path), shard, [good, good], None)
    with pytest.raises(RuntimeError, match="missing"):
        shard_files.write_shard(str(tmp_path), shard, [], None)
    assert shard_files.done_shards(str(tmp_path)) == set()
    counts = shard_files.write_shard(str(tmp_path), shard, [good], None)
    assert counts["accepted"] == 1 and shard_files.done_shards(str(tmp_path)) == {0}


def test_join_takes_negatives_from_dataset_then_llm_then_rules():
    caps = [
        {"index": 0, "caption_id": "a", "caption": "A red bus on a street.", "image": "/i/0.png",
         "negatives": ["A blue bus on a street."]},
        {"index": 1, "caption_id": "b", "caption": "A man holding a red umbrella.", "image": "/i/1.png", "negatives": []},
        {"index": 2, "caption_id": "c", "caption": "A black dog next to a white cat.", "image": "/i/2.png",
         "negatives": []},
    ]

    def acc(i, kind, polarity, text):
        return {"request_id": f"{i}:{kind}", "kind": kind, "polarity": polarity, "text": text, "source": "llm:m"}

    accepted = [acc(0, "replace", "positive", "A red coach on a street."),
                acc(1, "replace", "positive", "A guy holding a red umbrella."),
                acc(1, "replace_negative", "negative", "A man holding a green umbrella.")]
    auto = join.join_triplets(caps, accepted, join.NegativePicker("auto", 0, "src"))
    by_id = {t["caption_id"]: t for t in auto}
    assert by_id["a"]["hard_negative"] == "A blue bus on a street." and by_id["a"]["negative_source"] == "dataset:src"
    assert by_id["b"]["hard_negative"] == "A man holding a green umbrella." and by_id["b"]["negative_source"] == "llm:m"
    assert by_id["b"]["hard_positive"] == "A guy holding a red umbrella." and by_id["b"]["source"] == "llm:m"
    # no positive for "c": one hard-negative-only row from the rule engine
    assert by_id["c"]["hard_positive"] is None and by_id["c"]["negative_source"] == "rule"
    assert by_id["c"]["hard_negative"] and by_id["c"]["hard_negative"] != caps[2]["caption"]
    rules_only = join.join_triplets(caps, accepted, join.NegativePicker("rules", 0, "src"), keep_unmatched=False)
    assert [t["caption_id"] for t in rules_only] == ["a", "b"]
    assert all(t["negative_source"] == "rule" for t in rules_only)
    none = join.join_triplets(caps, accepted, join.NegativePicker("none", 0, "src"))
    assert [t["hard_negative"] for t in none] == [None, None]  # unmatched captions need a negative to be kept


# --------------------------------------------------------------------------- Ray: http end to end
def expected_outcome(caption: str, kind: str) -> str:
    """What the validator must say about the stub's canned answer (the stub's contract)."""
    from hardpos.rules.validate import validate

    b = behaviour(caption.strip(), kind)  # the stub sees the caption as the prompt's stripped last line
    if b == "error500":
        return "http_error"
    if b in ("good", "flaky"):
        v = validate(caption, canned(caption.strip(), kind, 1)[1], kind)
        return "accepted" if v.accepted else v.reason
    return {"chatter": "chatter", "empty": "empty", "identical": "identical",
            "multi": "not_a_swap" if kind == "swap" else "too_many_edits"}[b]


def test_http_engine_end_to_end_on_real_negclip_captions(ray_session, shared_data, tmp_path, tracking_uri):
    from hardpos import tracking
    from hardpos.data.captions.formats import read_captions
    from hardpos.data.triplets import read_triplets
    from hardpos.generate.prompts import PROMPTS_DIR

    n = 200
    source = str(shared_data / NEGCLIP)
    captions = read_captions(source, limit=n)
    # the paper preset's prompts with the strict validator: the stub's chatter and multi-edit
    # answers exercise its reasons (the preset's own paper mode: tests/test_rules_validate_paper.py)
    prompts = tmp_path / "paper_strict.yaml"
    prompts.write_text((PROMPTS_DIR / "paper.yaml").read_text().replace("validation: paper", "validation: strict"))
    templates = load_prompts(str(prompts))
    assert {t.validation for t in templates} == {"strict"}
    expected = collections.Counter()
    for c in captions:
        for t in templates:
            if t.applies(c["caption"]):
                expected[(t.kind, expected_outcome(c["caption"], t.kind))] += 1
    n_requests = sum(expected.values())
    # the stub fails a "flaky" (caption, kind) once, so a caption repeated in the data is retried once in all
    n_flaky = len({(c["caption"].strip(), t.kind) for c in captions for t in templates if t.applies(c["caption"])
                   and behaviour(c["caption"].strip(), t.kind) == "flaky"})
    with OpenAIStub() as stub:
        cfg = gen_config(tmp_path, f"input={source}", f"limit={n}", "shard_size=50", *http_overrides(stub),
                         "tracking.enabled=true", "tracking.experiment=gen-test", f"prompts={prompts}")
        summary = run_stage(cfg)
        assert stub.requests == n_requests + n_flaky  # each 503 retried exactly once; nothing else resent

    assert summary["complete"] and summary["shards_total"] == 4 and summary["captions"] == n
    assert summary["validation"] == {"replace": "strict", "swap": "strict"}
    assert summary["inputs"] == n_requests == summary["accepted"] + summary["rejected"]
    got = collections.Counter()
    for kind, count in summary["accepted_by_kind"].items():
        got[(kind, "accepted")] += count
    for key, count in summary["rejected_by_kind_reason"].items():
        kind, reason = key.split("/")
        got[(kind, reason)] += count
    assert got == expected
    # the stub's "good" answers are realistic: nearly all pass the validator
    good = sum(1 for c in captions for t in templates if t.applies(c["caption"])
               and behaviour(c["caption"].strip(), t.kind) in ("good", "flaky"))
    assert sum(summary["accepted_by_kind"].values()) >= 0.85 * good
    assert expected[("replace", "http_error")] > 0 and expected[("replace", "chatter")] > 0
    assert summary["this_run"]["tokens_per_s"] > 0 and summary["this_run"]["captions_per_s"] > 0

    out = summary["output_dir"]
    accepted, rejects = merged(out, "accepted"), merged(out, "rejects")
    assert len(accepted) == summary["accepted"] and len(rejects) == summary["rejected"]
    assert len({r["request_id"] for r in accepted + rejects}) == n_requests
    assert all(r["source"] == "llm:stub-llm" for r in accepted)
    http_errors = [r for r in rejects if r["reason"] == "http_error"]
    assert http_errors and all(r["detail"].startswith("HTTP 500") and r["raw_output"] is None for r in http_errors)
    chatter = next(r for r in rejects if r["reason"] == "chatter")
    assert chatter["raw_output"].startswith("Sure!")  # the raw output is kept for inspection

    triplets = read_triplets(os.path.join(out, "triplets.parquet"))
    with_pos = [t for t in triplets if t["hard_positive"] is not None]
    # one row per caption (join.positives "one"): a caption's positives share one row
    with_positive = {r["caption_id"] for r in accepted}
    assert len(with_pos) == len(with_positive) == summary["triplets_with_positive"] == summary["captions_with_positive"]
    assert summary["positives_unused"] == len(accepted) - len(with_pos)
    assert len(triplets) == len({t["caption_id"] for t in triplets})
    # NegCLIP carries its own negatives: the join uses them (except those that are whole-conjunct
    # swaps, which keep the meaning: such a caption falls back to a rule negative), and images
    # resolve absolutely
    from hardpos.generate.join import dataset_negatives

    by_caption = {c["caption_id"]: c for c in captions}
    for t in triplets:
        usable = dataset_negatives(by_caption[t["caption_id"]])
        assert t["negative_source"] == ("dataset:valid_neg_clip" if usable else "rule"), t
        assert not usable or t["hard_negative"] in usable
    assert summary["dataset_negatives_meaning_kept"] == sum(
        len(c["negatives"]) - len(dataset_negatives(c)) for c in captions) > 0
    assert all(t["hard_negative"] for t in triplets) and all(os.path.isabs(t["image"]) for t in triplets)
    assert {t["caption_id"] for t in triplets} == {c["caption_id"] for c in captions}

    run = tracking.search_runs(tracking_uri, "gen-test")[0]
    assert run.data.metrics["accepted"] == summary["accepted"] and run.data.tags["hardpos.engine"] == "http"
    samples = json.loads(Path(out, "samples.json").read_text())
    assert samples["accepted"] and "http_error" in samples["rejected"]


def test_http_stage_in_flight_writes_what_one_request_at_a_time_writes(ray_session, tmp_path):
    """The stage with its defaults (actors x max_in_flight requests open) and with one actor
    sending one request at a time write the same accepted rows, rejects and verdicts."""
    words = ["man", "woman", "dog", "cat", "bus", "table", "child", "plate"]
    src = tmp_path / "caps.jsonl"
    src.write_text("".join(json.dumps({"caption_id": f"c{i}", "caption": (
        f"A {words[i % 8]} and a {words[(i + 3) % 8]} near a red car {i}." if i % 2 else
        f"A small {words[i % 8]} sitting on a big table {i}.")}) + "\n" for i in range(40)))
    outs = {}
    for name, extra in (("in_flight", []), ("serial", ["engine.http.concurrency=1", "engine.http.max_in_flight=1"])):
        with OpenAIStub() as stub:  # a fresh stub: each flaky row fails exactly once in both runs
            summary = run_stage(gen_config(tmp_path, f"input={src}", "shard_size=20", "prompts=chat",
                                           *http_overrides(stub), *extra, name=name))
        outs[name] = (summary, merged(summary["output_dir"], "accepted"), merged(summary["output_dir"], "rejects"))
    (fast, fast_acc, fast_rej), (slow, slow_acc, slow_rej) = outs["in_flight"], outs["serial"]
    assert fast_acc == slow_acc and fast_rej == slow_rej
    for key in ("inputs", "accepted", "rejected", "accepted_by_kind", "rejected_by_kind_reason", "triplets"):
        assert fast[key] == slow[key], key
    assert fast["inputs"] == fast["accepted"] + fast["rejected"] > 40 and fast_rej and fast_acc


def test_rules_engine_over_all_negclip_captions_conserves_rows(ray_session, shared_data, tmp_path):
    from hardpos.data.captions.formats import read_captions
    from hardpos.rules.perturber import RulePerturber
    from hardpos.data.triplets import read_triplets

    source = str(shared_data / NEGCLIP)
    captions = read_captions(source)
    assert len(captions) == 4839
    summary = run_stage(gen_config(tmp_path, f"input={source}", "engine.kind=rules", "shard_size=1000"))
    templates = load_prompts("paper")
    n_requests = sum(1 for c in captions for t in templates if t.applies(c["caption"]))
    assert summary["complete"] and summary["shards_total"] == 5 and summary["captions"] == 4839
    assert summary["inputs"] == n_requests == summary["accepted"] + summary["rejected"]
    assert summary["source"] == "rule" and summary["this_run"]["captions_per_s"] > 0
    out = summary["output_dir"]
    accepted, rejects = merged(out, "accepted"), merged(out, "rejects")
    assert len(accepted) + len(rejects) == n_requests
    assert len({r["request_id"] for r in accepted + rejects}) == n_requests
    # exactly what the rule engine picks, row by row (a spot check keeps the test fast)
    rules = RulePerturber(seed=0)
    for r in accepted[:200]:
        picked = rules.pick(r["caption"], "positive", r["kind"]).text
        assert r["text"] == " ".join(picked.split()) and r["raw_output"] == picked and r["source"] == "rule"
    assert {r["reason"] for r in rejects} <= {"no_rule", "empty", "identical", "too_many_edits", "not_a_swap",
                                              "length", "chatter", "non_text"}
    # REPLACE positives for 63.7% of the captions: the benchmark's own substitutions are held out
    assert summary["accepted_by_kind"]["replace"] > 0.6 * 4839 and summary["accepted_by_kind"]["swap"] > 0
    assert summary["include_benchmark_pairs"] is False and summary["positives_with_benchmark_substitutions"] == 0
    triplets = read_triplets(os.path.join(out, "triplets.parquet"))
    # one row per caption (join.positives "one"), whichever of its positives the seeded rule picked
    assert sum(t["hard_positive"] is not None for t in triplets) == len({r["caption_id"] for r in accepted})
    assert len(triplets) == len({t["caption_id"] for t in triplets}) == summary["triplets"]
    assert summary["positives_unused"] == summary["captions_with_several_positives"] > 0
    assert len({t["caption_id"] for t in triplets}) > 0.95 * 4839


def test_rules_engine_on_a_synthetic_world_uses_its_lexicon_and_rule_negatives(ray_session, tmp_path):
    from hardpos.data.triplets import read_triplets, resolve_image
    from hardpos.world.build import generate_world
    from hardpos.world.scene import WorldConfig

    world = tmp_path / "world"
    generate_world(WorldConfig(n_pretrain=10, n_finetune=40, n_benchmark=10, image_size=16), str(world))
    summary = run_stage(gen_config(tmp_path, f"input={world}", "engine.kind=rules", "shard_size=20"))
    assert summary["lexicon"] == "world" and summary["input"].endswith("finetune.parquet")
    assert summary["inputs"] == summary["accepted"] + summary["rejected"] and summary["accepted"] > 0
    triplets = read_triplets(os.path.join(summary["output_dir"], "triplets.parquet"))
    with_neg = [t for t in triplets if t["hard_negative"]]
    assert with_neg and all(t["negative_source"] == "rule" for t in with_neg)
    # the rule negatives computed on the workers (fused with the rule engine) are exactly
    # what the driver-side join computes for the same (caption, kind)
    from hardpos.rules.perturber import RulePerturber
    from hardpos.world.lexicon import rule_lexicon

    rules = RulePerturber(seed=0, lexicon=rule_lexicon(str(world)))
    for t in triplets:
        assert t["hard_negative"] == join.rule_negative(rules, t["caption"], join.base_kind(t["kind"]))
    # images were written resolved, so the train stage finds them from the output folder
    assert all(os.path.isabs(t["image"]) and os.path.exists(t["image"]) for t in triplets)
    assert resolve_image(triplets[0]["image"], summary["output_dir"]) == triplets[0]["image"]


def test_resume_after_interruption_is_exactly_once(ray_session, shared_data, tmp_path, monkeypatch):
    source = str(shared_data / NEGCLIP)
    base = [f"input={source}", "limit=40", "shard_size=10"]
    with OpenAIStub() as stub:
        http = http_overrides(stub)
        first = run_stage(gen_config(tmp_path, *base, *http, "max_shards=2"))
        assert not first["complete"] and first["shards_done"] == 2 and first["shards_this_run"] == 2
        assert not Path(first["output_dir"], "triplets.parquet").exists()  # merged only when complete
        out = first["output_dir"]

        # crash in the middle of the next run, after one more shard was committed
        real_write, calls = shard_files.write_shard, {"n": 0}

        def crashing(*args, **kwargs):
            result = real_write(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] == 1:
                raise KeyboardInterrupt("simulated interruption")
            return result

        monkeypatch.setattr(shard_files, "write_shard", crashing)
        with pytest.raises(KeyboardInterrupt):
            run_stage(gen_config(tmp_path, *base, *http_overrides(stub)))
        monkeypatch.setattr(shard_files, "write_shard", real_write)
        done = shard_files.done_shards(out)
        assert len(done) == 3 and {0, 1} < done  # shards commit in completion order
        # a shard whose files were written but whose marker was not must be redone
        (extra,) = done - {0, 1}
        os.remove(shard_files.shard_path(out, extra, "done.json"))

        before = stub.requests
        final = run_stage(gen_config(tmp_path, *base, *http_overrides(stub)))
        redo_requests = stub.requests - before

    assert final["complete"] and final["shards_skipped"] == 2 and final["shards_this_run"] == 2
    captions = planning.load_inputs(source, limit=40)
    shards = planning.plan(captions, load_prompts("paper"), 10, "llm:stub-llm")
    planned = [r["request_id"] for s in shards for r in s.requests]
    # the finished shards 0-1 were not sent again (flaky rows answered by now need no retry)
    assert redo_requests == sum(len(s.requests) for s in shards[2:])
    rows = merged(out, "accepted") + merged(out, "rejects")
    ids = [r["request_id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(planned) and set(ids) == set(planned)
    assert final["inputs"] == len(planned) == final["accepted"] + final["rejected"]
    # changing the settings of a half-done output_dir is refused, not mixed (the rules engine:
    # the stub is gone, and the stage's check would name the dead endpoint first)
    with pytest.raises(ConfigError, match="different settings"):
        run_stage(gen_config(tmp_path, f"input={source}", "limit=40", "shard_size=20", "engine.kind=rules"))
    # overwrite=true starts over: no shard or merged file of the old run survives a partial rerun
    again = run_stage(gen_config(tmp_path, f"input={source}", "limit=40", "shard_size=20", "engine.kind=rules",
                                 "overwrite=true", "max_shards=1"))
    assert again["shards_done"] == 1 and not again["complete"]
    assert sorted(os.listdir(out)) == ["manifest.json", "samples.json", "shards", "summary.json"]
    assert len(os.listdir(os.path.join(out, "shards"))) == 4  # one shard: accepted, rejects, triplets, marker


def test_bad_inputs_fail_before_work_or_become_row_rejects(ray_session, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hardpos.cli import main

    assert main(["generate", f"input={tmp_path / 'missing.jsonl'}", f"output_dir={tmp_path / 'o1'}",
                 "tracking.enabled=false"]) == 2
    no_col = tmp_path / "nocol.tsv"
    no_col.write_text("filepath\tneg_caption\na.jpg\t[]\n")
    with pytest.raises(ConfigError, match="no caption column"):
        run_stage(gen_config(tmp_path, f"input={no_col}", name="o2"))
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"caption": "A caf\u00e9 table."}\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        run_stage(gen_config(tmp_path, f"input={latin}", name="o3"))
    assert not (tmp_path / "o2" / "shards").exists() and not (tmp_path / "o3" / "shards").exists()

    rows = pa.table({"caption": ["A red bus and a car.", "", "Bad \ufffd bytes."], "image": ["i0.png", None, "i2.png"]})
    src = tmp_path / "caps.parquet"
    pq.write_table(rows, src)
    with OpenAIStub() as stub:
        summary = run_stage(gen_config(tmp_path, f"input={src}", *http_overrides(stub), name="o4"))
    assert summary["inputs"] == 4 and summary["rejected_by_kind"].get("input") == 2
    assert summary["rejected_by_kind_reason"]["input/empty"] == 1
    assert summary["rejected_by_kind_reason"]["input/non_text"] == 1
    rejects = merged(summary["output_dir"], "rejects")
    assert {r["caption_id"] for r in rejects if r["kind"] == "input"} == {"1", "2"}


def test_s3_output_dir_resumes(ray_session, s3_env, tmp_path):
    src = tmp_path / "caps.jsonl"
    src.write_text("".join(json.dumps({"caption": f"A man walking next to a red car number {i}.", "image": f"im{i}.png"})
                           + "\n" for i in range(8)))
    over = [f"input={src}", "shard_size=4", "engine.kind=rules", f"output_dir=s3://{s3_env}/gen"]
    first = run_stage(gen_config(tmp_path, *over, "max_shards=1"))
    final = run_stage(gen_config(tmp_path, *over))
    assert first["shards_done"] == 1 and final["complete"] and final["shards_this_run"] == 1
    assert final["inputs"] == 8 == final["accepted"] + final["rejected"] and final["accepted"] > 0
    from hardpos.data.triplets import read_triplets

    rows = shard_files.read_parquet_rows(f"s3://{s3_env}/gen/accepted.parquet")
    assert sorted(r["caption_id"] for r in rows) == sorted({r["caption_id"] for r in rows})  # once each
    triplets = read_triplets(f"s3://{s3_env}/gen/triplets.parquet")
    assert triplets and all(t["image"] == str(tmp_path / t["image"].rsplit("/", 1)[-1]) for t in triplets)


# --------------------------------------------------------------------------- GPU: vLLM
@pytest.mark.gpu
def test_vllm_engine_runs_a_small_model(shared_data, tmp_path, request):
    import shutil

    if shutil.which("nvidia-smi") is None:
        pytest.skip("no CUDA GPU (nvidia-smi not found)")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    pytest.importorskip("vllm", reason="vllm is not installed (pip install hardpos[vllm])")
    model = os.environ.get("HARDPOS_VLLM_MODEL")
    cached = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub" / \
        "models--Qwen--Qwen2.5-0.5B-Instruct"
    if not model and cached.is_dir():
        model = "Qwen/Qwen2.5-0.5B-Instruct"  # the placeholder of jobs/configs/generate_vllm.yaml, already cached
    if not model:
        pytest.skip("no small instruct model available offline: set HARDPOS_VLLM_MODEL to a local model folder "
                    "(e.g. Qwen2.5-0.5B-Instruct) or cache Qwen/Qwen2.5-0.5B-Instruct")
    request.getfixturevalue("ray_session")  # only now: skipping must not cost a Ray start
    summary = run_stage(gen_config(tmp_path, f"input={shared_data / NEGCLIP}", "limit=64", "shard_size=32",
                                   "engine.kind=vllm", f"engine.vllm.model_source={model}",
                                   "engine.vllm.max_model_len=1024", "engine.vllm.batch_size=32"))
    assert summary["complete"] and summary["inputs"] == summary["accepted"] + summary["rejected"]
    assert summary["accepted"] > 0 and summary["this_run"]["tokens_per_s"] > 0


# --------------------------------------------------------------------------- webdataset shards, streamed merge
def test_webdataset_shard_follows_ray_read_webdataset_layout(tmp_path):
    import io
    import tarfile

    from PIL import Image

    img = tmp_path / "im0.png"
    Image.new("RGB", (4, 4), (200, 0, 0)).save(img)
    (tmp_path / "im1.JPEG").write_bytes(b"\xff\xd8fake-jpeg")
    rows = [{"image": str(img), "caption": "a red cube", "caption_id": "c0", "hard_negative": "a blue cube",
             "hard_positive": "a crimson cube", "kind": "replace", "source": "rule", "negative_source": "rule"},
            {"image": str(tmp_path / "missing.png"), "caption": "a cat", "caption_id": "c1", "hard_negative": None,
             "hard_positive": None, "kind": "replace", "source": "rule", "negative_source": None},
            {"image": str(tmp_path / "im1.JPEG"), "caption": "a dog", "caption_id": "c2", "hard_negative": None,
             "hard_positive": "a puppy", "kind": "swap", "source": "rule", "negative_source": None}]
    assert shard_files.write_webdataset(str(tmp_path / "out"), 3, rows) == (2, 1)
    with tarfile.open(shard_files.webdataset_path(str(tmp_path / "out"), 3)) as tar:
        names = tar.getnames()
        files = {n: tar.extractfile(n).read() for n in names}
    assert names == ["00003-000000.png", "00003-000000.txt", "00003-000000.json",
                     "00003-000002.jpg", "00003-000002.txt", "00003-000002.json"]
    assert Image.open(io.BytesIO(files["00003-000000.png"])).size == (4, 4)
    assert files["00003-000000.txt"].decode() == "a red cube"
    meta = json.loads(files["00003-000002.json"])
    assert meta == {"caption_id": "c2", "caption": "a dog", "hard_negative": None, "hard_positive": "a puppy",
                    "kind": "swap", "source": "rule", "negative_source": None}


def test_merge_streams_shards_with_unified_triplet_schema(tmp_path):
    from hardpos.data.triplets import make_triplet, read_triplets, write_triplets

    out = str(tmp_path)
    caps = [{"index": i, "caption_id": f"c{i}", "caption": "A red bus.", "image": None, "negatives": []}
            for i in range(4)]
    shards = planning.plan(caps, load_prompts("paper", ["replace"]), 2, "rule")
    for s in shards:
        rows = [planning.judge({**r, "raw_output": "A crimson bus.", "engine_error": None, "engine_detail": None,
                                "prompt_tokens": 0, "completion_tokens": 0, "source": "rule"}) for r in s.requests]
        shard_files.write_shard(out, s, rows, None)
    # the second shard's extra column is all null: its parquet type is null, the first one's int64
    write_triplets([make_triplet(image="/a.png", caption="A", kind="replace", source="rule", caption_id="c0",
                                 positive_index=0)], shard_files.shard_path(out, 0, "triplets.parquet"))
    write_triplets([make_triplet(image="/b.png", caption="B", kind="replace", source="rule", caption_id="c2",
                                 positive_index=None)], shard_files.shard_path(out, 1, "triplets.parquet"))
    merged_out = shard_files.merge_outputs(out, 2, True, "triplets.parquet")
    assert [r["request_id"] for r in shard_files.read_parquet_rows(merged_out["accepted"])] == [
        "0:replace", "1:replace", "2:replace", "3:replace"]
    assert [(t["caption_id"], t["positive_index"]) for t in read_triplets(merged_out["triplets"])] == [
        ("c0", 0), ("c2", None)]
    as_jsonl = shard_files.merge_outputs(out, 2, True, "triplets.jsonl")["triplets"]
    assert [t["caption"] for t in read_triplets(as_jsonl)] == ["A", "B"]
    assert not [n for n in os.listdir(out) if n.startswith(".merge-")]  # no temp file left behind


def test_rules_stage_over_a_glob_of_files_writes_webdataset_ray_reads(ray_session, tmp_path):
    import ray
    from PIL import Image

    from hardpos.data.triplets import read_triplets

    caps = tmp_path / "caps"
    caps.mkdir()
    words = ["red", "blue", "green", "white"]
    n = 0
    for part, count in ((0, 5), (1, 4), (2, 3)):
        lines = []
        for _ in range(count):
            Image.new("RGB", (8, 8), (n * 20, 0, 0)).save(caps / f"im{n}.png")
            # no ids: a row's id is its index in the whole source (files in name order)
            lines.append(json.dumps({"caption": f"A {words[n % 4]} car and a {words[(n + 1) % 4]} dog.",
                                     "image": f"im{n}.png"}))
            n += 1
        (caps / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    summary = run_stage(gen_config(tmp_path, f"input={caps}/part-*.jsonl", "engine.kind=rules", "shard_size=5",
                                   "join.webdataset=true"))
    assert summary["complete"] and summary["input_files"] == 3 and summary["captions"] == 12
    assert summary["shards_total"] == 3 and summary["inputs"] == summary["accepted"] + summary["rejected"] == 24
    out = summary["output_dir"]
    triplets = read_triplets(os.path.join(out, "triplets.parquet"))
    assert [t["caption_id"] for t in triplets] == [str(i) for i in range(12)]
    assert all(t["image"] == str(caps / f"im{i}.png") for i, t in enumerate(triplets))
    tars = sorted(os.listdir(os.path.join(out, "webdataset")))
    assert tars == ["shard-00000.tar", "shard-00001.tar", "shard-00002.tar"]
    rows = ray.data.read_webdataset(os.path.join(out, "webdataset"), decoder=None).take_all()
    assert len(rows) == len(triplets) == 12
    by_key = {r["__key__"]: r for r in rows}
    first = by_key["00000-000000"]
    assert first["txt"] == triplets[0]["caption"].encode() and first["png"] == (caps / "im0.png").read_bytes()
    meta = json.loads(first["json"])
    assert (meta["hard_positive"], meta["hard_negative"]) == (triplets[0]["hard_positive"], triplets[0]["hard_negative"])


# --------------------------------------------------------------------------- bad sources
def _caption_lines(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_bad_sources_are_named_before_work_and_leave_no_output(tmp_path):
    # each fails in the stage's check, before Ray starts: no output folder is even created
    bad = {
        "nothing": (str(tmp_path / "none" / "part-*.jsonl"), r"glob .*none/part-\*\.jsonl matches no file"),
        "nocap": (str(tmp_path / "nocap" / "part-*.jsonl"), r"nocap/part-1\.jsonl: no caption column"),
        "mixed": (str(tmp_path / "mixed" / "part-*.jsonl"),
                  r"mixed schemas: .*mixed/part-0\.jsonl.*'caption'.*mixed/part-1\.jsonl.*'text'"),
    }
    _caption_lines(tmp_path / "nocap" / "part-0.jsonl", [{"caption": "a red bus"}])
    _caption_lines(tmp_path / "nocap" / "part-1.jsonl", [{"image": "x.jpg", "label": 3}])
    _caption_lines(tmp_path / "mixed" / "part-0.jsonl", [{"caption": "a cat", "image": "c.jpg"}])
    _caption_lines(tmp_path / "mixed" / "part-1.jsonl", [{"text": "a dog", "image": "d.jpg"}])
    for name, (source, match) in bad.items():
        with pytest.raises(ConfigError, match=match):
            run_stage(gen_config(tmp_path, f"input={source}", "engine.kind=rules", name=f"out-{name}"))
        assert not (tmp_path / f"out-{name}").exists(), name


def test_first_bad_json_line_names_file_and_line(tmp_path):
    from hardpos.data.captions.stream import first_bad_json_line

    good = _caption_lines(tmp_path / "a.jsonl", [{"caption": f"a cat {i}"} for i in range(5)])
    broken = _caption_lines(tmp_path / "b.jsonl", [{"caption": "a dog"}, "", '{"caption": "cut off', "{}"])
    listed = _caption_lines(tmp_path / "c.jsonl", [{"caption": "a dog"}, "[1, 2]"])
    assert first_bad_json_line([str(good)]) is None
    assert first_bad_json_line([str(good), str(broken)]).startswith(f"{broken}: line 3 is not JSON")
    assert first_bad_json_line([str(listed)]) == f"{listed}: line 2 is not a JSON object"


def test_rows_past_the_head_bad_json_names_the_file_missing_caption_is_a_reject(ray_session, tmp_path):
    # the head check reads 100 lines: a broken line 301 is found only by the read, which must
    # name the file and the line, and fail before anything is written
    rows = [{"caption_id": f"1-{j}", "caption": f"A red bus and a small dog {j}."} for j in range(400)]
    _caption_lines(tmp_path / "caps" / "part-0.jsonl", [{"caption_id": f"0-{j}", "caption": "A red bus."} for j in range(10)])
    _caption_lines(tmp_path / "caps" / "part-1.jsonl", rows[:300] + ['{"caption_id": "1-300", "caption": "cut'] + rows[301:])
    with pytest.raises(ConfigError, match=r"caps/part-1\.jsonl: line 301 is not JSON"):
        run_stage(gen_config(tmp_path, f"input={tmp_path / 'caps' / 'part-*.jsonl'}", "engine.kind=rules",
                             name="broken"))
    assert os.listdir(tmp_path / "broken") == []
    # a row past the head without the caption field is a counted row reject, not a silent drop
    rows[250] = {"caption_id": "1-250", "text": "no caption field"}
    _caption_lines(tmp_path / "one" / "caps.jsonl", rows)
    summary = run_stage(gen_config(tmp_path, f"input={tmp_path / 'one' / 'caps.jsonl'}", "engine.kind=rules",
                                   "shard_size=200", name="nocap"))
    assert summary["complete"] and summary["captions"] == 400
    assert summary["rejected_by_kind_reason"]["input/empty"] == 1
    assert [r["caption_id"] for r in merged(summary["output_dir"], "rejects") if r["kind"] == "input"] == ["1-250"]


def test_a_failed_overwrite_run_leaves_nothing_that_looks_complete(ray_session, tmp_path, monkeypatch):
    src = _caption_lines(tmp_path / "caps.jsonl", [{"caption": f"A red car and a blue dog {i}."} for i in range(12)])
    first = run_stage(gen_config(tmp_path, f"input={src}", "engine.kind=rules", "shard_size=5"))
    out = Path(first["output_dir"])
    assert first["complete"] and (out / "summary.json").exists() and (out / "triplets.parquet").exists()

    def lost(*args, **kwargs):
        raise RuntimeError("simulated: a shard task failed for good")

    monkeypatch.setattr(pipeline, "run_worker_shards", lost)
    with pytest.raises(RuntimeError, match="simulated"):
        run_stage(gen_config(tmp_path, f"input={src}", "engine.kind=rules", "shard_size=5", "overwrite=true"))
    # the first run's summary ("complete": true) must not outlive the outputs it describes
    left = sorted(os.listdir(out))
    assert "summary.json" not in left and not {"accepted.parquet", "rejects.parquet", "triplets.parquet"} & set(left)
    assert shard_files.done_shards(str(out)) == set()
