"""The rule context and the rule families over it: a rule's inputs are its arguments.

:class:`~hardpos.rules.context.RuleContext` is built once from a lexicon and frozen; every rule
family is a plain function of it and of the caption's tokens and matches, and
:class:`~hardpos.rules.perturber.RulePerturber` offers exactly what the families make.
"""
from __future__ import annotations

import dataclasses

import pytest

from hardpos.rules.context import RuleContext, is_content, is_ing_verb, matches
from hardpos.rules.english import DETERMINERS
from hardpos.rules.lexicon import load_lexicon
from hardpos.rules.perturber import RulePerturber, perturbations
from hardpos.rules.replace import replace_edits
from hardpos.rules.swap import swap_attributes, swap_conjuncts, swap_objects
from hardpos.rules.text import tokenize

CAPTION = "A red car parked next to a blue truck and a dog."


@pytest.fixture(scope="module")
def ctx():
    return RuleContext.of(load_lexicon())


def test_the_context_holds_the_lexicon_and_the_sets_derived_from_it(ctx):
    lex = ctx.lexicon
    assert ctx.determiners == DETERMINERS
    assert "on" in ctx.linkers and not {"and", "or", "but", "the", "a"} & ctx.linkers
    assert "red" in ctx.attr_adjs and "tennis" in lex.adjectives and "tennis" not in ctx.attr_adjs  # a noun modifier
    monitor = lex.lookup("monitor")[0]
    assert ctx.group_forms[(monitor.cls, monitor.group)] == {"monitor", "monitors"}
    assert ctx.starts["next"] == 2  # "next to" is the longest form starting with "next"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.lexicon = lex  # type: ignore[misc]


def test_the_token_helpers_read_only_the_context(ctx):
    toks = tokenize("The dog is sitting under an awning")
    assert [t.low for t in toks if is_content(ctx, t)] == ["dog", "sitting", "awning"]
    assert [t.low for t in toks if is_ing_verb(ctx, t)] == ["sitting"]  # "awning" is listed as no verb
    assert [(m.form, m.senses[0].cls) for m in matches(ctx, tokenize(CAPTION))] == [
        ("red", "color"), ("car", "vehicle"), ("parked", "fly"), ("next to", "spatial_near"), ("blue", "color"),
        ("truck", "vehicle"), ("dog", "animal")]


def test_each_family_is_a_function_of_the_context_and_the_caption(ctx):
    toks = tokenize(CAPTION)
    found = matches(ctx, toks)
    assert [p.text for p in swap_attributes(ctx, CAPTION, toks, found)] == [
        "A blue car parked next to a red truck and a dog."]
    assert [(p.text, p.slot) for p in replace_edits(ctx, CAPTION, toks, found, "positive")] == [
        ("A red automobile parked next to a blue truck and a dog.", "object:vehicle car->automobile"),
        ("A red car parked beside a blue truck and a dog.", "relation:spatial_near next to->beside"),
        ("A red car parked alongside a blue truck and a dog.", "relation:spatial_near next to->alongside"),
        ("A red car parked next to a blue lorry and a dog.", "object:vehicle truck->lorry")]
    assert list(swap_objects(ctx, CAPTION, toks, found)) == []  # "car parked": a noun before a participle stays
    swapped = "A man wearing a hat and holding a cup."
    assert [p.text for p in swap_conjuncts(ctx, swapped, tokenize(swapped))] == [
        "A man holding a cup and wearing a hat."]


def test_the_perturber_offers_what_the_families_make(ctx):
    rules = RulePerturber(seed=0)
    for caption in (CAPTION, "A man wearing a hat and holding a cup.", "Two dogs chasing a cat on the grass."):
        assert perturbations(ctx, caption) == (rules.hard_negatives(caption), rules.hard_positives(caption))
