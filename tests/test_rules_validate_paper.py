"""The paper preset validates as the paper's release did; the strict validator stays the
platform's default, and every example the paper's prompt prints passes or fails it for a
reason a reviewer would agree with.

The release (generate_hard_positives.py) wrote each completion's ``generated_text`` as is.
The validator's ``paper`` mode keeps that, less what is never a training caption: empty,
identical, non-text, over-length, chatter ("Sure! Here is ..."), another language, broken
determiner agreement; a run-on completion is cut to its first line. ``strict`` adds the
REPLACE one-edit rule and the SWAP whole-conjunct rule (the paper's multi-word REPLACE edits
stay accepted in paper mode).
"""
from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardpos.config import ConfigError
from hardpos.rules.validate import MODES, Verdict, validate
from hardpos.generate.engine_config import ENGINE_COLUMNS, REQUEST_COLUMNS
from hardpos.generate.planning import judge_batch
from hardpos.generate.prompts import load_prompts


def paper_few_shot() -> list[tuple[str, str]]:
    """The (input, output) pairs written into the paper preset's SWAP prompt."""
    swap = {t.kind: t for t in load_prompts("paper")}["swap"]
    return re.findall(r"Input: (.+)\nOutput: (.+)", swap.prompt)


def test_the_paper_prompt_holds_its_five_few_shot_answers():
    pairs = paper_few_shot()
    assert len(pairs) == 5 and pairs[0] == ("three giraffes and two antelope", "two antelopes and three giraffes")


@pytest.mark.parametrize("original,candidate", paper_few_shot())
def test_every_few_shot_answer_of_the_paper_prompt_passes_both_modes(original, candidate):
    # strict once rejected two of them: "a mixture of [rice] and [broccoli]" (a mixture's "of"
    # takes the whole coordination) and "two antelope" -> "two antelopes" (number agreement)
    assert validate(original, candidate, "swap", "paper") == Verdict(True, None, candidate)
    assert validate(original, candidate, "swap") == Verdict(True, None, candidate)


# Hard positives of the kinds the paper's appendix shows (its SWAP answers reorder "trees and
# bushes", "rice and broccoli"; several of its REPLACE answers change more than one word).
# paper mode takes them all; strict rejects some, each for the reason given.
SAMPLES = [
    ("swap", "a mixture of rice and broccoli", "a mixture of broccoli and rice", None),
    ("swap", "three giraffes and two antelope", "two antelopes and three giraffes", None),
    ("swap", "A giraffe eating leaves from trees and bushes", "A giraffe eating leaves from bushes and trees", None),
    ("swap", "Two zebras grazing among the trees and bushes in a field.",
     "Two zebras grazing among the bushes and trees in a field.", None),
    # "tall" may describe the trees only: in the new order it may describe the bushes
    ("swap", "An elephant walking through tall trees and bushes.", "An elephant walking through tall bushes and trees.",
     "not_conjunct_swap"),
    # two separate word changes: each one is its own unchecked risk to the meaning (the prompt
    # asks for one word); strict REPLACE positives are one contiguous edit
    ("replace", "A large white dog sitting on a couch", "A big white dog resting on a couch", "too_many_edits"),
    ("replace", "A man holding a red umbrella on a street", "A guy holding a red umbrella on a road", "too_many_edits"),
    ("replace", "A woman on a beach holding a surf board", "A lady on the beach carrying a surfboard",
     "too_many_edits"),
]


@pytest.mark.parametrize("kind,original,candidate,strict_reason", SAMPLES)
def test_paper_style_samples_pass_paper_mode_and_strict_says_why(kind, original, candidate, strict_reason):
    assert validate(original, candidate, kind, "paper") == Verdict(True, None, candidate)
    assert validate(original, candidate, kind).reason == strict_reason


@pytest.mark.parametrize("candidate,reason", [
    (None, "empty"),
    ("   ", "empty"),
    ('""', "empty"),
    (b"a dog and a cat", "non_text"),
    (42, "non_text"),
    ("1234 -- 5678", "non_text"),
    ("a dog\x00 and a cat", "non_text"),
    ("A cat and a dog.", "identical"),
    ("  a cat and  A DOG ", "identical"),
    ("a dog and a cat " + "and a bird and a horse and a cow and a sheep", "length"),
])
def test_paper_mode_rejects_only_what_cannot_be_a_caption(candidate, reason):
    assert validate("A cat and a dog.", candidate, "swap", "paper") == Verdict(False, reason, None)


def test_paper_mode_cuts_a_completion_that_runs_past_its_first_line():
    # raw completions with max_new_tokens 20 often go on: paper mode keeps the first line
    original = "a bathroom with a sink, toilet and shower"
    continued = " a bathroom with a sink, shower and toilet\n\nInput: a cat"
    assert validate(original, continued, "swap", "paper") == Verdict(
        True, None, "a bathroom with a sink, shower and toilet")
    assert validate(original, continued, "swap").reason == "chatter"
    replace = "A hound on a beach.\nA puppy on a beach."
    assert validate("A dog on the beach.", replace, "replace", "paper") == Verdict(True, None, "A hound on a beach.")
    assert validate("A dog on the beach.", replace, "replace").reason == "chatter"


@pytest.mark.parametrize("candidate,reason", [
    ("Sure! Here is the sentence: A hound on the beach.", "chatter"),
    ("Sure! A hound on the beach.", "chatter"),
    ("Here is the caption: a hound on the beach", "chatter"),
    ('"A hound on the beach."', "chatter"),
    ("A hound (synonym for dog) on the beach.", "chatter"),
    ("Un perro en la playa.", "non_english"),
    ("Ein Hund am Strand.", "non_english"),
    ("一只狗在海滩上", "non_english"),
    ("A skis on the beach.", "agreement"),
    ("A broccoli on the beach.", "agreement"),
])
def test_paper_mode_never_accepts_chatter_other_languages_or_broken_agreement(candidate, reason):
    assert validate("A dog on the beach.", candidate, "replace", "paper") == Verdict(False, reason, None)
    assert validate("A dog on the beach.", candidate, "replace").reason == reason


def test_an_unknown_mode_is_a_caller_error():
    assert MODES == ("strict", "paper")
    with pytest.raises(ValueError, match="unknown validation mode 'loose'"):
        validate("a cat", "a kitten", "replace", "loose")


def test_the_paper_preset_validates_as_the_paper_and_the_others_strictly():
    assert {t.validation for t in load_prompts("paper")} == {"paper"}
    assert {t.validation for t in load_prompts("chat")} == {"strict"}
    assert {t.validation for t in load_prompts("with_negatives")} == {"strict"}
    # the preset keeps completions as generated; the validator's mode decides
    assert {t.postprocess for t in load_prompts("paper")} == {"none"}


def test_a_prompt_file_with_a_bad_validation_names_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("prompts:\n  - kind: replace\n    user: 'x {caption}'\n    validation: lenient\n")
    with pytest.raises(ConfigError, match=r"validation must be one of \('strict', 'paper'\), got 'lenient'"):
        load_prompts(str(path))
    path.write_text("prompts:\n  - kind: replace\n    user: 'x {caption}'\n    validation: paper\n")
    assert load_prompts(str(path))[0].validation == "paper"


def _engine_rows(outputs: list[tuple[str, str, str]]) -> pa.Table:
    rows = []
    for k, (kind, caption, raw) in enumerate(outputs):
        rows.append({"request_id": f"{k}:{kind}", "shard": 0, "caption_id": str(k), "caption": caption, "kind": kind,
                     "polarity": "positive", "raw_output": raw, "engine_error": None, "engine_detail": None,
                     "prompt_tokens": 10, "completion_tokens": 5, "source": "llm:test"})
    assert set(rows[0]) == set(REQUEST_COLUMNS + ENGINE_COLUMNS)
    return pa.Table.from_pylist(rows)


def test_the_judge_applies_each_kinds_mode():
    batch = _engine_rows([
        ("swap", "a cat and a dog", "a dog and a cat\nInput: a bird"),
        ("replace", "A large white dog sitting on a couch", "A big white dog resting on a couch"),
        ("replace", "a red car", "a red car"),
    ])
    strict = judge_batch(batch).to_pylist()
    assert [(r["status"], r["reason"]) for r in strict] == [
        ("rejected", "chatter"), ("rejected", "too_many_edits"), ("rejected", "identical")]
    paper = judge_batch(batch, validation={"swap": "paper", "replace": "paper"}).to_pylist()
    assert [(r["status"], r["reason"], r["text"]) for r in paper] == [
        ("accepted", None, "a dog and a cat"),
        ("accepted", None, "A big white dog resting on a couch"),
        ("rejected", "identical", None)]
    mixed = judge_batch(batch, validation={"swap": "paper"}).to_pylist()  # kinds not named: strict
    assert [r["status"] for r in mixed] == ["accepted", "rejected", "rejected"]


def test_the_generate_stage_judges_the_paper_preset_as_the_paper(ray_session, shared_data, tmp_path):
    """The http engine against the OpenAI-compatible stub on 127.0.0.1 with prompts=paper: the
    stub's multi-edit answers are accepted as generated; its chatter is rejected, like anything
    that cannot be a caption."""
    from hardpos.generate import stage as generate
    from hardpos.config import load_config
    from hardpos.runtime import execute
    from tests.support.openai_stub import OpenAIStub, behaviour

    source = str(shared_data / "negclip" / "valid_neg_clip.tsv")
    with OpenAIStub() as stub:
        cfg = load_config(generate.Config, None, [
            f"output_dir={tmp_path / 'out'}", "tracking.enabled=false", f"input={source}", "limit=60",
            "shard_size=30", "prompts=paper", "engine.kind=http", f"engine.http.url={stub.url}",
            "engine.http.model=stub-llm", "engine.http.retry_wait_s=0.01", "engine.http.preflight=false"])
        summary = execute("generate", cfg, quiet=True)
    assert summary["validation"] == {"replace": "paper", "swap": "paper"}
    reasons = {key.split("/")[1] for key in summary["rejected_by_kind_reason"]}
    assert reasons <= {"empty", "identical", "length", "non_text", "http_error", "chatter", "non_english",
                       "agreement"}, reasons
    # the stub's multi-edit answers are kept as generated; its chatter never is
    accepted = pq.read_table(summary["outputs"]["accepted"]).to_pylist()
    assert summary["accepted"] == len(accepted) > 0
    assert any(behaviour(r["caption"].strip(), r["kind"]) == "multi" for r in accepted)
    rejects = pq.read_table(summary["outputs"]["rejects"]).to_pylist()
    assert {r["reason"] for r in rejects if behaviour(r["caption"].strip(), r["kind"]) == "chatter"} <= {
        "chatter", "length"}
    assert not any(behaviour(r["caption"].strip(), r["kind"]) == "chatter" for r in accepted)

