"""The caption validator on realistic LLM outputs, good and bad."""
import pytest

from hardpos.data.validate import REASONS, Verdict, validate

ORIG = "A man walking his dog on the beach."

GOOD_REPLACE = [
    (ORIG, "A man strolling his dog on the beach.", "A man strolling his dog on the beach."),
    (ORIG, "  A man   strolling his dog on the beach ", "A man strolling his dog on the beach"),
    (ORIG, "a man walking his dog on the shore", "a man walking his dog on the shore"),
    ("letters ON hanging sign", "letters ON dangling sign", "letters ON dangling sign"),
    ("cat sitting next to a laptop", "cat sitting beside a laptop", "cat sitting beside a laptop"),
    ("A woman holding an umbrella in the rain.", "A woman grasping an umbrella in the rain.",
     "A woman grasping an umbrella in the rain."),
    ("a red circle above a blue square", "a crimson circle above a blue square", "a crimson circle above a blue square"),
    ("a red circle above a blue square", "a red circle over a blue square", "a red circle over a blue square"),
    ("Two people sitting on a bench.", "Two people seated on a bench.", "Two people seated on a bench."),
    ("walking elephant", "strolling elephant", "strolling elephant"),
]

BAD = [
    # (original, candidate, kind, reason)
    (ORIG, "Sure! Here is the rewritten caption: A man strolling his dog on the beach.", "replace", "chatter"),
    (ORIG, "Here's a hard positive: A man strolling his dog on the beach.", "replace", "chatter"),
    (ORIG, "Output: A man strolling his dog on the beach.", "replace", "chatter"),
    (ORIG, "Caption: A man strolling his dog on the beach.", "replace", "chatter"),
    (ORIG, "Certainly. A man strolling his dog on the beach.", "replace", "chatter"),
    (ORIG, '"A man strolling his dog on the beach."', "replace", "chatter"),
    (ORIG, "\u201cA man strolling his dog on the beach.\u201d", "replace", "chatter"),
    (ORIG, "`A man strolling his dog on the beach.`", "replace", "chatter"),
    (ORIG, "A man strolling his dog on the beach.\n\nI replaced 'walking' with 'strolling'.", "replace", "chatter"),
    (ORIG, "A man strolling his dog on the beach.\nA man walking his canine on the beach.", "replace", "chatter"),
    (ORIG, "A man strolling (synonym for walking) his dog on the beach.", "replace", "chatter"),
    (ORIG, "walking -> strolling: A man strolling his dog on the beach.", "replace", "chatter"),
    (ORIG, "1. A man strolling his dog on the beach.", "replace", "chatter"),
    (ORIG, "**A man strolling his dog on the beach.**", "replace", "chatter"),
    (ORIG, "I'm sorry, but I cannot rewrite this caption.", "replace", "chatter"),
    (ORIG, "As an AI language model, I would write: A man strolling his dog.", "replace", "chatter"),
    (ORIG, "A man strolling his dog on the beach, because strolling means walking.", "replace", "chatter"),
    (ORIG, "", "replace", "empty"),
    (ORIG, "   \n  ", "replace", "empty"),
    (ORIG, None, "replace", "empty"),
    (ORIG, '""', "replace", "empty"),
    (ORIG, "a man walking his dog on the beach", "replace", "identical"),
    (ORIG, "A MAN WALKING HIS DOG ON THE BEACH", "replace", "identical"),
    (ORIG, "A man walking his dog on the beach.", "replace", "identical"),
    (ORIG, "A man walking  his dog on the beach", "replace", "identical"),
    (ORIG, "A man strolling his puppy on the beach.", "replace", "too_many_edits"),
    (ORIG, "A person strolling his dog on the sand.", "replace", "too_many_edits"),
    (ORIG, "A man walking his dog along the long sandy shoreline by the calm blue sea at sunset in summer.", "replace", "length"),
    (ORIG, "Man.", "replace", "length"),
    (ORIG, "The gentleman takes his canine companion for a walk beside the ocean.", "replace", "too_many_edits"),
    (ORIG, 42, "replace", "non_text"),
    (ORIG, b"A man strolling his dog on the beach.", "replace", "non_text"),
    (ORIG, {"caption": "A man strolling"}, "replace", "non_text"),
    (ORIG, ["A man strolling his dog on the beach."], "replace", "non_text"),
    (ORIG, "1234 5678", "replace", "non_text"),
    (ORIG, "A man strolling his dog on the \ufffd beach.", "replace", "non_text"),
    (ORIG, "A man strolling\x00 his dog on the beach.", "replace", "non_text"),
    # swaps
    ("a sink, toilet and shower", "a sink, toilet and tub", "swap", "not_a_swap"),
    ("a sink, toilet and shower", "a sink, toilet, and shower", "swap", "not_a_swap"),  # order unchanged
    ("a sink, toilet and shower", "a sink, toilet, and shower", "replace", "identical"),  # no word changed
    ("a man wearing glasses and holding a bottle", "a man wearing glasses and holding a bottle.", "swap", "identical"),
    ("a man wearing glasses and holding a bottle", "a man holding glasses and wearing a hat", "swap", "not_a_swap"),
    ("a red circle and a blue square", "a blue square and a green circle", "swap", "not_a_swap"),
    ("a red circle and a blue square", "Sure! a blue square and a red circle", "swap", "chatter"),
    ("a red circle and a blue square", "a red circle and a blue square and a red circle and a blue square and more",
     "swap", "length"),
]


@pytest.mark.parametrize("original,candidate,text", GOOD_REPLACE)
def test_good_replace_positives_are_accepted_with_cleaned_text(original, candidate, text):
    verdict = validate(original, candidate, "replace")
    assert verdict == Verdict(True, None, text)


@pytest.mark.parametrize("original,candidate,kind,reason", BAD)
def test_bad_outputs_are_rejected_with_their_reason(original, candidate, kind, reason):
    verdict = validate(original, candidate, kind)
    assert reason in REASONS
    assert (verdict.accepted, verdict.reason, verdict.text) == (False, reason, None)


@pytest.mark.parametrize("original,candidate", [
    ("a sink, toilet and shower", "a sink, shower and toilet"),
    ("a man wearing glasses and holding a bottle", "a man holding a bottle and wearing glasses"),
    ("a red circle and a blue square", "a blue square and a red circle"),
    ("an apple and a car", "a car and an apple"),  # a/an agreement may follow the new order
    ("A dog and a cat on a couch.", "A cat and a dog on a couch."),
])
def test_good_swaps_are_accepted(original, candidate):
    assert validate(original, candidate, "swap") == Verdict(True, None, " ".join(candidate.split()))


def test_negative_kinds_use_the_same_edit_shape_rules():
    assert validate(ORIG, "A man walking his cat on the beach.", "replace_negative").accepted
    assert validate(ORIG, "A man walking his cat on the snow.", "replace_negative").reason == "too_many_edits"
    assert validate("a red circle and a blue square", "a blue circle and a red square", "swap_negative").accepted
    assert validate("a red circle and a blue square", "a green circle and a red square", "swap_negative").reason == "not_a_swap"


def test_unknown_kind_and_bad_original_are_caller_errors():
    with pytest.raises(ValueError, match="unknown validation kind"):
        validate(ORIG, "x", "paraphrase")
    with pytest.raises(ValueError, match="original caption must be a string"):
        validate(None, "x", "replace")  # type: ignore[arg-type]


def test_original_with_a_colon_or_quote_does_not_make_a_faithful_edit_chatter():
    assert validate("Sign reads: STOP", "Sign says: STOP", "replace").accepted
    assert validate("\"Love\" painted on a red wall", "\"Love\" painted on a crimson wall", "replace").accepted
