"""Prompt presets and how the engines send them: the ``paper`` preset pinned to the
paper's release (text, few-shot examples, token limits, decoding, raw prompt mode),
prompt-file validation, post-processing, and the raw-prompt requests each LLM engine
builds (vLLM rows, unit-tested; HTTP /v1/completions, for real against the stub)."""
from __future__ import annotations

import json

import pytest

from hardpos.config import ConfigError, load_config
from hardpos.generate import engine_config, http_engine, vllm_engine
from hardpos.generate.prompts import fingerprint, load_prompts, postprocess
from tests.support.openai_stub import OpenAIStub

# The two templates of generate_hard_positives.py in github.com/amitakamath/hard_positives,
# character for character (the script renders them with .format(example=caption).strip()).
RELEASE_SWAP = """Swap the words around the word "and" in a sentence without changing the meaning. Only respond with the changed sentence.

Input: three giraffes and two antelope
Output: two antelopes and three giraffes

Input: a blue and white stained glass clock shows the time
Output: a white and blue stained glass clock shows the time

Input: a mixture of rice and broccoli are put together
Output: a mixture of broccoli and rice are put together

Input: a bathroom with a sink, toilet and shower
Output: a bathroom with a sink, shower and toilet

Input: there is a man wearing glasses and holding a wine bottle
Output: there is a man holding a wine bottle and wearing glasses

Input: {example}
Output: """

RELEASE_REPLACE = """Replace one word in the input sentence with a synonym, without changing the meaning of the sentence. Only output the changed sentence.
Input: {example}
Output: """

# The release's pipeline call sets only max_new_tokens; the rest is Llama-2-70b-chat-hf's
# generation_config (sampling, temperature 0.6, top_p 0.9) and transformers' top_k 50.
PAPER_SAMPLING = {
    "replace": {"max_tokens": 30, "temperature": 0.6, "top_p": 0.9, "top_k": 50},
    "swap": {"max_tokens": 20, "temperature": 0.6, "top_p": 0.9, "top_k": 50},
}

CAPTIONS = [
    "A man and a woman riding bikes down the street.",
    "a plate of rice and broccoli on a wooden table",
    "A {braced} cat and a dog sleeping on a couch.",   # braces stay literal, as with str.format's argument
    "  Two dogs and a cat playing in the snow  ",       # edge whitespace: the whole prompt is stripped
    "A large bus parked next to a building.",
    "A little girl holding an umbrella and smiling.",
    "A bathroom with a sink, toilet and shower.",
    "A child and a large dog sitting on the grass.",
    "A picture of a kitchen with a stove.",
    "A man holding a plate of food and a drink.",
]


def paper():
    return {t.kind: t for t in load_prompts("paper")}


# --------------------------------------------------------------------------- the paper preset
def test_paper_preset_is_the_release_prompts_verbatim():
    templates = paper()
    assert list(templates) == ["replace", "swap"]
    release = {"replace": RELEASE_REPLACE, "swap": RELEASE_SWAP}
    for caption in CAPTIONS:
        for kind, t in templates.items():
            assert t.raw_prompt(caption) == release[kind].format(example=caption).strip()
            assert t.prompt_text(caption) == t.raw_prompt(caption)  # one rendering, whatever asks
    swap = templates["swap"].raw_prompt("x")
    assert swap.count("\nInput: ") == 6 and swap.count("\nOutput: ") == 5  # the five few-shot pairs, then x
    assert swap.endswith("Input: x\nOutput:")  # the template's final space goes with .strip()


def test_paper_preset_settings_are_the_release_decoding_in_raw_mode():
    for kind, t in paper().items():
        assert t.prompt_mode == "raw" and t.raw and t.user is None and t.few_shot == () and t.system is None
        assert t.sampling.overrides() == PAPER_SAMPLING[kind]
        assert t.sampling.stop is None        # HF generation ends at EOS or the token limit
        assert t.postprocess == "none"        # generated_text is kept as generated
        assert t.validation == "paper"        # and filtered as the release did: not at all (see tests/test_rules_validate_paper.py)
        assert t.polarity == "positive"
    swap = paper()["swap"].when
    assert (swap.contains_word, swap.max_words, swap.min_words) == ("and", 15, None)
    assert paper()["replace"].when == type(swap)()
    # the whole preset (text + settings) in one number: any edit to paper.yaml moves it
    assert fingerprint(load_prompts("paper")) == "38f451bb3c59a0c4"


def test_chat_preset_keeps_the_earlier_wording_and_its_fingerprint():
    chat = load_prompts("chat")
    assert {t.prompt_mode for t in chat} == {"chat"} and all(t.sampling.overrides() == {} for t in chat)
    assert chat[0].messages("A dog.")[-1]["content"] == (
        "Replace one word in the following sentence with a synonym, without changing the meaning of the sentence. "
        "Only output the changed sentence.\nSentence: A dog.")
    # the fingerprint the same templates had as "paper" before raw mode existed: old runs still resume
    assert fingerprint(chat) == "5c56e17009f5533a"
    assert [t.prompt_mode for t in load_prompts("with_negatives")] == ["chat"] * 4


# --------------------------------------------------------------------------- prompt files
@pytest.mark.parametrize("entry, message", [
    ("prompt_mode: raw\n    user: 'x {caption}'", r"\['user'\] are chat fields"),
    ("prompt_mode: raw\n    prompt: 'no placeholder'", r"needs 'prompt', a string containing \{caption\}"),
    ("prompt: 'x {caption}'", "'prompt' is the raw-mode field"),
    ("prompt_mode: text\n    user: 'x {caption}'", "prompt_mode must be one of"),
    ("user: 'x {caption}'\n    postprocess: last_line", "postprocess must be one of"),
    ("user: 'x {caption}'\n    sampling: {top_p: 1.5}", r"top_p must be in \(0, 1\]"),
    ("user: 'x {caption}'\n    sampling: {max_tokens: 0}", "max_tokens must be an integer >= 1"),
    ("user: 'x {caption}'\n    sampling: {temperature: -1}", "temperature must be a number >= 0"),
    ("user: 'x {caption}'\n    sampling: {stop: [1]}", "stop must be"),
    ("user: 'x {caption}'\n    sampling: {seed: 3}", "'sampling' accepts"),
])
def test_prompt_file_errors_name_the_field(tmp_path, entry, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"prompts:\n  - kind: replace\n    {entry}\n")
    with pytest.raises(ConfigError, match=message):
        load_prompts(str(path))


def test_custom_raw_template_with_stop_and_first_line(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("prompts:\n  - kind: replace\n    prompt_mode: raw\n    prompt: |-\n      Rewrite: {caption}\n"
                    "      Output:\n    sampling: {max_tokens: 12, stop: \"\\n\"}\n    postprocess: first_line\n")
    (t,) = load_prompts(str(path))
    assert t.raw_prompt("A dog.") == "Rewrite: A dog.\nOutput:"
    assert t.sampling.overrides() == {"max_tokens": 12, "stop": ["\n"]}
    assert t.postprocess == "first_line"


def test_postprocess_keeps_what_the_template_says():
    continued = " two antelopes and three giraffes\n\nInput: a dog and a cat\nOutput:"
    assert postprocess(continued, "none") == continued
    assert postprocess(continued, "first_line") == " two antelopes and three giraffes"
    assert postprocess("\n\n  a dog\nmore", "first_line") == "  a dog"
    assert postprocess("  \n ", "first_line") == "  \n "  # still blank: the validator says "empty"
    assert postprocess(None, "first_line") is None
    with pytest.raises(ValueError, match="postprocess"):
        postprocess("x", "last_line")


def test_template_sampling_overrides_the_engine_defaults_field_by_field():
    defaults = engine_config.SamplingConfig(max_tokens=64, temperature=0.0, top_p=1.0, stop=["\n\n"])
    assert engine_config.sampling_params(defaults, paper()["swap"]) == {**PAPER_SAMPLING["swap"], "stop": ["\n\n"]}
    chat = load_prompts("chat")[0]
    assert engine_config.sampling_params(defaults, chat) == {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0,
                                                       "stop": ["\n\n"]}
    assert engine_config.sampling_params(engine_config.SamplingConfig()) == {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0}


# --------------------------------------------------------------------------- vLLM rows
def test_vllm_gets_raw_prompt_rows_and_no_chat_template_for_the_paper_preset():
    templates = paper()
    assert vllm_engine.vllm_chat_stage(templates, chat_template=True) is False
    pc = vllm_engine.build_vllm_processor_config(engine_config.VLLMEngineConfig(), vllm_engine.vllm_chat_stage(templates, True))
    assert pc.chat_template_stage is False and pc.tokenize_stage is True
    pre = vllm_engine.VLLMPre(templates, engine_config.SamplingConfig(), chat_template=True)
    for kind, release in (("replace", RELEASE_REPLACE), ("swap", RELEASE_SWAP)):
        row = pre({"kind": kind, "caption": CAPTIONS[0]})
        assert row == {"prompt": release.format(example=CAPTIONS[0]).strip(), "sampling_params": PAPER_SAMPLING[kind]}
    post = vllm_engine.VLLMPost("llm:m", vllm_engine.postprocess_modes(templates))
    out = post({"request_id": "0:swap", "kind": "swap", "generated_text": " a b\nInput:", "num_input_tokens": 9,
                "num_generated_tokens": 4})
    assert out["raw_output"] == " a b\nInput:" and out["prompt_tokens"] == 9  # postprocess none: as generated


def test_vllm_refuses_a_raw_and_chat_mix_that_needs_two_chat_template_settings(tmp_path):
    mixed_file = tmp_path / "mixed.yaml"
    mixed_file.write_text("include: paper\nprompts:\n  - kind: replace_negative\n    polarity: negative\n"
                          "    user: 'Break it: {caption}'\n    postprocess: first_line\n")
    mixed = {t.kind: t for t in load_prompts(str(mixed_file))}
    with pytest.raises(ConfigError, match=r"raw kinds \['replace', 'swap'\] and chat kinds \['replace_negative'\]"):
        vllm_engine.vllm_chat_stage(mixed, chat_template=True)
    # chat template off: every row is a plain prompt, one processor; keys stay uniform
    assert vllm_engine.vllm_chat_stage(mixed, chat_template=False) is False
    pre = vllm_engine.VLLMPre(mixed, engine_config.SamplingConfig(), chat_template=False)
    neg = pre({"kind": "replace_negative", "caption": "A dog."})
    assert neg == {"prompt": "Break it: A dog.\n", "sampling_params": {
        "max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": -1}}  # -1: vLLM's "no top-k"
    assert "messages" not in pre({"kind": "swap", "caption": "A cat and a dog."})
    post = vllm_engine.VLLMPost("llm:m", vllm_engine.postprocess_modes(mixed))
    assert post({"kind": "replace_negative", "generated_text": "A cat.\nNote: x"})["raw_output"] == "A cat."


# --------------------------------------------------------------------------- HTTP payloads
def test_http_raw_template_posts_a_completions_payload():
    body = http_engine.request_payload("llama", paper()["replace"], CAPTIONS[1], engine_config.SamplingConfig())
    assert body == {"model": "llama", "prompt": RELEASE_REPLACE.format(example=CAPTIONS[1]).strip(),
                    **PAPER_SAMPLING["replace"]}
    chat = {t.kind: t for t in load_prompts("chat")}
    assert set(http_engine.request_payload("llama", chat["replace"], "A dog.", engine_config.SamplingConfig())) == {
        "model", "messages", "max_tokens", "temperature", "top_p"}


def test_http_url_per_prompt_mode():
    cfg = engine_config.HttpEngineConfig(url="http://h:8000/v1/chat/completions")
    assert http_engine.http_url(cfg, raw=False) == "http://h:8000/v1/chat/completions"
    assert http_engine.http_url(cfg, raw=True) == "http://h:8000/v1/completions"
    completions = engine_config.HttpEngineConfig(url="http://h/v1/completions")
    assert http_engine.http_url(completions, raw=True) == "http://h/v1/completions"
    own = engine_config.HttpEngineConfig(url="http://h/chat", completions_url="http://h/complete")
    assert http_engine.http_url(own, raw=True) == "http://h/complete"
    with pytest.raises(ConfigError, match="completions_url"):
        http_engine.http_url(engine_config.HttpEngineConfig(url="http://h/chat"), raw=True)
    spec = http_engine.http_spec(engine_config.EngineConfig(kind="http", http=cfg), paper(), environ={})
    assert set(spec.urls.values()) == {"http://h:8000/v1/completions"}  # each raw kind to its route


def test_parse_completions_reply_reads_choice_text():
    body = {"object": "text_completion", "choices": [{"text": " a dog and a cat"}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 5}}
    out = http_engine.parse_chat_response({"status": 200, "body": json.dumps(body)})
    assert out["raw_output"] == " a dog and a cat" and out["prompt_tokens"] == 40 and out["engine_error"] is None


# --------------------------------------------------------------------------- HTTP for real
def test_http_stage_sends_raw_prompts_to_completions_and_chat_to_chat(ray_session, tmp_path):
    """A prompt file mixing the paper's raw kinds with a chat kind, run by the generate
    stage against the stub: every request lands on its route with the exact body."""
    from hardpos.generate import stage as generate
    from hardpos.runtime import execute

    src = tmp_path / "captions.jsonl"
    src.write_text("".join(json.dumps({"caption_id": str(i), "caption": c}) + "\n" for i, c in enumerate(CAPTIONS)))
    prompt_file = tmp_path / "mixed.yaml"
    prompt_file.write_text("include: paper\nprompts:\n  - kind: replace_negative\n    polarity: negative\n"
                           "    user: |-\n      Change one word so the meaning changes.\n      Sentence: {caption}\n")
    templates = {t.kind: t for t in load_prompts(str(prompt_file))}
    with OpenAIStub() as stub:
        cfg = load_config(generate.Config, None, [
            f"input={src}", f"output_dir={tmp_path / 'out'}", "tracking.enabled=false", f"prompts={prompt_file}",
            "engine.kind=http", f"engine.http.url={stub.url}", "engine.http.model=stub-llm",
            "engine.http.retry_wait_s=0.01", "engine.http.concurrency=1", "engine.sampling.max_tokens=48"])
        summary = execute("generate", cfg, quiet=True)
        received, routes = list(stub.received), {stub.url: 200, stub.completions_url: 200}

    assert summary["complete"] and summary["inputs"] == summary["accepted"] + summary["rejected"]
    assert summary["http_preflight"]["routes"] == routes  # one preflight per route
    n_swap = sum(templates["swap"].applies(c) for c in CAPTIONS)
    assert n_swap >= 5 and summary["inputs"] == 2 * len(CAPTIONS) + n_swap
    assert summary["accepted_by_kind"].get("replace", 0) + summary["accepted_by_kind"].get("swap", 0) > 0
    by_route = {"chat": [], "completions": []}
    for route, body in received:
        by_route[route].append(body)
    raw_kinds = {"Replace": "replace", "Swap": "swap"}
    for body in by_route["completions"]:
        kind = raw_kinds[body["prompt"].split(" ", 1)[0]]
        # the job's captions, or the fixed caption of the stage's preflight probe (sent before Ray starts)
        caption = next(c for c in [*CAPTIONS, generate.PREFLIGHT_CAPTION] if body["prompt"] == templates[kind].raw_prompt(c))
        release = RELEASE_REPLACE if kind == "replace" else RELEASE_SWAP
        assert body == {"model": "stub-llm", "prompt": release.format(example=caption).strip(), **PAPER_SAMPLING[kind]}
    for body in by_route["chat"]:
        assert "prompt" not in body and body["messages"][-1]["content"].startswith("Change one word")
        assert (body["max_tokens"], body["temperature"], body["top_p"]) == (48, 0.0, 1.0)  # engine.sampling
    # every request once (+ the stub's one-off 503s retried, + one preflight per route)
    assert len(by_route["completions"]) >= len(CAPTIONS) + n_swap + 1
    assert len(by_route["chat"]) >= len(CAPTIONS) + 1
