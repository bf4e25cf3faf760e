"""The rule engine cannot make the classes a linguist's blind audit found, and the validator
refuses them from any engine, in every mode.

One block per class: (1) number and determiners, (2) particles, phrasal verbs, compounds and
idioms, (3) "negatives" that are not different (a kind, part or companion of the word; an edit
still true in context; time expressions), (4) positives: the colour-shade policy and SWAPs
that move a pronoun's antecedent or strand "another". Captions are made up in the spirit of
each class (COCO style), plus the examples the classes were named by.
"""
from __future__ import annotations

import pytest

from hardpos.rules.lexicon import load_lexicon
from hardpos.rules.english import PAIR_SINGULARS, grammar_hits, new_problems, non_english, problems
from hardpos.rules.conjuncts import is_conjunct_swap
from hardpos.rules.perturber import RulePerturber
from hardpos.rules.validate import validate


@pytest.fixture(scope="module")
def rules():
    return RulePerturber(seed=0)


def negatives(rules, caption):
    return [p.text for p in rules.hard_negatives(caption)]


def positives(rules, caption):
    return [p.text for p in rules.hard_positives(caption)]


# ---------------------------------------------------------------- 1. number and determiners
@pytest.mark.parametrize("text,fault", [
    ("A man riding a pair of kite on a beach.", "pair of kite"),
    ("A man holding a skis on a slope.", "a skis"),
    ("A woman wearing another glasses.", "another glasses"),
    ("A boy in a shorts and a cap.", "a shorts"),
    ("A girl cutting paper with a scissors.", "a scissors"),
    ("A man in a jeans and a hat.", "a jeans"),
    ("A plate with a broccoli and rice.", "a broccoli"),
    ("A bread on a wooden board.", "a bread"),
    ("A bunny on a plate of carrot.", "plate of carrot"),
    ("Donuts and a type of soups on a table.", "type of soups"),
    ("Two lady and a man pose for a picture.", "two lady"),
])
def test_agreement_faults_are_found(text, fault):
    assert problems(text) == [fault]


@pytest.mark.parametrize("text", [
    "A pair of black boots next to a red umbrella.", "A pair of scissors on a desk.", "A cat sits on a mat.",
    "Three toy teddy bears on a picnic blanket.", "Two monkeys sitting on some tree branches.",
    "A bottle in an ice bucket.", "A few kites in the sky.", "A slice of pizza on a plate of food.",
    "A bowl of broccoli and a glass of water.", "A man wearing glasses and a tie.",
])
def test_agreement_accepts_correct_english(text):
    assert problems(text) == []


def test_a_fault_the_original_already_has_is_not_held_against_an_edit():
    assert new_problems("Two woman and a man pose", "Two woman and a boy pose") == []
    assert new_problems("Two woman and a man pose", "Two lady and a man pose") == ["two lady"]


@pytest.mark.parametrize("caption,never", [
    ("A man on a skateboard riding by food vendors.", "a skis"),
    ("A man in a hat holding a kite.", "a shorts"),
    ("A boy eating a sandwich on a bench.", "a broccoli"),
    ("A boy eating a sandwich on a bench.", "a bread"),
    ("A small bunny character is on a plate of pizza.", "plate of carrot"),
    ("Donuts in a box and a type of meat on a plate.", "soups"),
    ("A man riding a pair of skis down a slope.", "pair of frisbee down"),
])
def test_the_rules_never_break_agreement(rules, caption, never):
    made = negatives(rules, caption) + positives(rules, caption)
    assert made and not any(never in t.lower() for t in made)
    assert all(not new_problems(caption, t) for t in made)


def test_plural_only_and_mass_nouns_keep_their_number_in_the_lexicon():
    lex = load_lexicon()
    assert {s.number for s in lex.lookup("skis")} == {"pl"} and {s.number for s in lex.lookup("glasses")} == {"pl"}
    assert {s.number for s in lex.lookup("meat")} == {"sg"}  # no plural sense: "a type of meat" never "soups"
    assert "skis" not in lex.negatives[("skateboard", "sports")]


def test_the_agreement_check_and_the_audit_read_one_noun_list():
    """Every plural-only and mass noun of the lexicon, and every singular "pair of" never takes,
    is a fault for the rule engine's agreement check and a hit for the blind audit's grammar
    rules alike: both read the same lists."""
    lex = load_lexicon()
    assert {"skis", "tweezers", "pyjamas", "police"} <= lex.plural_only
    assert {"broccoli", "food", "baggage", "hair"} <= lex.mass
    for word in sorted(lex.plural_only):
        assert problems(f"A man with another {word}.") == [f"another {word}"], word
        assert grammar_hits(f"A man with {word}.", f"A man with another {word}.") == ["singular_det_plural_noun"], word
    for word in sorted(lex.mass):
        assert problems(f"A man with another {word}.") == [f"another {word}"], word
        assert grammar_hits(f"A man with {word}.", f"A man with another {word}.") == ["article_mass_noun"], word
    for word in sorted(PAIR_SINGULARS):
        assert problems(f"A pair of {word}.") == [f"pair of {word}"], word
        assert grammar_hits(f"A pair of {word}s.", f"A pair of {word}.") == ["pair_of_singular"], word
    assert problems("A few dog on the grass.") == ["few dog"]
    assert grammar_hits("A few dogs on the grass.", "A few dog on the grass.") == ["count_singular_noun"]


def test_a_mass_noun_is_replaced_by_one_that_can_be_a_mass(rules):
    made = negatives(rules, "A bunny on a plate of pizza.")
    assert {"A bunny on a plate of broccoli.", "A bunny on a plate of salad."} <= set(made)
    assert not any(f"plate of {w}." in t for t in made for w in ("carrot", "apple", "banana", "donut"))


# ---------------------------------------------------------------- 2. particles, compounds, idioms
@pytest.mark.parametrize("caption,never", [
    ("A woman holding up an umbrella near a stage.", ["throwing up", "dropping up", "tossing up"]),
    ("A little girl holding up a stuffed animal.", ["dropping up", "throwing up"]),
    ("A dog laying down on a rug.", ["standing down", "sitting down"]),
    ("A sheep standing up against the side of a house.", ["lying up", "sitting up"]),
    ("Mugs hanging from a hook on the wall.", ["lying from"]),
    ("A lamp hanging from it over the table.", ["lying from"]),
    ("Two hikers with walking sticks on a trail.", ["running sticks"]),
    ("People kite flying on a windy beach.", ["kite parked", "kite landing"]),
    ("A man with a fedora on smiling at the camera.", ["fedora under"]),
    ("A closeup on a plate of food.", ["closeup under"]),
    ("A sitting room with a fireplace.", ["lying room", "standing room"]),
    ("A lady in an outside eating area.", ["smelling area", "holding area"]),
    ("A loaf of bread sliced open on a board.", ["sliced closed", "loaf of broccoli"]),
    ("Cars sit parked on a street.", ["sit flying", "sit landing"]),
    ("A car is parked near an airport.", ["car is landing", "car is flying"]),
    ("A llama is biting on a carrot.", ["biting under"]),
    ("A man takes a picture of the ocean.", ["takes a painting", "takes a drawing"]),
    ("Mostly a black and white photo of a street.", ["gold and white photo", "black and gold photo"]),
    ("An open field with a horse.", ["closed field"]),
    ("Buses stop at the clock tower.", ["laptop tower"]),
    ("Men playing video games in a dimly lit room.", ["dimly unlit"]),
    ("A roasting pan full with apples and meat.", ["empty with"]),
    ("A train with lights on traveling on train tracks.", ["lights under", "lights above"]),
    ("A woman with an umbrella looking at a body of water.", ["body of grass", "body of sand", "body of snow"]),
    ("A person is high in the air as he skateboards on the ramp.", ["he surfboards", "he snowboards"]),
    ("A low flying airplane over a parked silver van.", ["landing silver van", "flying silver van"]),
])
def test_negatives_keep_particles_compounds_and_idioms(rules, caption, never):
    made = " | ".join(negatives(rules, caption)).lower()
    assert not any(n in made for n in never), made


def test_on_before_a_noun_an_ing_word_modifies_is_still_replaced(rules):
    """Only "on" right before an -ing verb has no object ("lights on traveling"); after an
    article the -ing word modifies the noun, and "on" -> "under" stays a negative."""
    made = " | ".join(negatives(rules, "A large cooked pizza on a dining table.")).lower()
    assert "pizza under a dining table" in made, made


@pytest.mark.parametrize("caption,never", [
    ("People kite flying on a windy beach.", "soaring"),
    ("A wood paneled kitchen with a table.", "wooden paneled"),
    ("A man takes his picture in the mirror.", "his image"),
    ("Motorcyclists riding their bikes down a road.", "bicycles"),
    ("An airplane taking off from the pavement.", "sidewalk"),
])
def test_positives_keep_compounds_and_idioms(rules, caption, never):
    assert not any(never in t for t in positives(rules, caption))


# ---------------------------------------------------------------- 3. not different
@pytest.mark.parametrize("caption,never", [
    ("A room with a stove and a sink.", "kitchen with a stove"),         # hypernym -> hyponym
    ("A desk with computers and a camera.", "computers and a monitor"),  # a part of the computers
    ("A desk with computers and a camera.", "computers and a keyboard"),
    ("A man wearing a tie at a party.", "wearing a shirt"),              # worn with it
    ("Two children in uniforms sitting together.", "in shoes"),
    ("A laptop sitting on top of a desk.", "laptop lying on top"),       # a thing "sitting" is just there
    ("A laptop sitting on top of a desk.", "laptop standing on top"),
    ("A fire hydrant sitting in the woods.", "hydrant standing"),
    ("A dog on the beach on a sunny day.", "under a sunny day"),         # a time expression
    ("A man sleeping on a bench in the afternoon on a weekend.", "under a weekend"),
    ("Motorcyclists riding their bikes down a road.", "their motorcycles"),
    ("A beach chair and an umbrella in the sand on the beach.", "in the beach on the sand"),  # a part: no swap
])
def test_negatives_are_really_different(rules, caption, never):
    made = negatives(rules, caption)
    assert not any(never in t for t in made if t != caption), [t for t in made if never in t]


@pytest.mark.parametrize("caption,never", [
    ("Two giraffes standing next to each other in a field.", ["in front of each other", "behind each other"]),
    ("A statue of a man standing next to a tree.", ["statue of a man walking"]),
    ("A tractor and two boats beside the water.", ["on top of the water"]),
    ("A little child kneeling down to pet two dogs on a leash.", ["under a leash", "behind a leash",
                                                                  "in front of a leash", "next to a leash"]),
    ("Buses and cars on interstate going both ways.", ["under interstate", "behind interstate"]),
])
def test_relation_negatives_stay_english_and_false(rules, caption, never):
    made = " | ".join(negatives(rules, caption))
    assert not any(n in made for n in never), made


def test_relations_have_contrasts_enough_to_balance(rules):
    """A relation with one contrast is a word a blind reader learns ("far from" is rare in
    captions, so every "far from" is an edit); each common spatial relation has several, and
    the balanced picks spread over them."""
    def made(caption):
        return {p.text for p in rules.hard_negatives(caption) if p.slot.startswith("relation:")}
    assert made("A cat sitting on a bed.") >= {"A cat sitting under a bed.", "A cat sitting next to a bed.",
                                               "A cat sitting behind a bed.", "A cat sitting in front of a bed."}
    assert made("A dog next to a red car.") >= {"A dog far from a red car.", "A dog behind a red car.",
                                                "A dog in front of a red car.", "A dog on top of a red car."}
    assert made("A man standing in front of a bus.") >= {"A man standing behind a bus.",
                                                         "A man standing next to a bus."}
    assert "Two dogs walking in a yard." in made("Two dogs standing in a yard.")


def test_and_other_says_what_kind_the_noun_is(rules):
    made = negatives(rules, "A bus and other cars on a street.")
    assert made and all(t.startswith("A bus and other ") for t in made), made


def test_the_relations_are_data_and_go_both_ways():
    lex = load_lexicon()
    assert not lex.contrasts("room", "kitchen") and not lex.contrasts("kitchen", "room")
    assert not lex.contrasts("computers", "monitor") and lex.contrasts("kitchen", "bathroom")
    assert ("room", "place") not in {k for k, v in lex.negatives.items() if "kitchen" in v}


# ---------------------------------------------------------------- 4. positives
@pytest.mark.parametrize("caption,never", [
    ("A blue truck on a road.", "azure"), ("A blue truck on a road.", "sapphire"),
    ("A red bus at a stop.", "crimson"), ("An orange drink on a table.", "tangerine"),
    ("A white dog on a couch.", "ivory"), ("A pink dress on a bed.", "rosy"),
])
def test_no_basic_colour_becomes_a_narrower_shade(rules, caption, never):
    assert not any(never in t for t in positives(rules, caption))


def test_a_shade_may_become_its_basic_colour_and_spellings_stay(rules):
    assert "A blue truck on a road." in positives(rules, "An azure truck on a road.")
    assert not any("sapphire" in t for t in positives(rules, "An azure truck on a road."))
    assert "A grey truck on a road." in positives(rules, "A gray truck on a road.")


def test_the_world_and_the_benchmark_opt_in_keep_their_shades():
    from hardpos.world.lexicon import world_lexicon

    assert ("crimson", "lexicon") in world_lexicon().positives[("red", "color")]
    assert ("crimson", "paper") in load_lexicon(include_benchmark_pairs=True).positives[("red", "color")]
    assert ("red", "color") not in load_lexicon().positives


@pytest.mark.parametrize("original,candidate", [
    ("A toilet and a bathtub in a bathroom with a cat next to it.",
     "A bathtub and a toilet in a bathroom with a cat next to it."),
    ("A man and another man sitting on a bench.", "Another man and a man sitting on a bench."),
    ("Two persons are on a bicycle and a third is on a scooter.",
     "Two persons are on a third and a bicycle is on a scooter."),
    ("A table with five red cups, a pineapple and some oranges on a plate",
     "A table with five red cups, some oranges and a pineapple on a plate"),
    ("two giraffes and some green trees and yellow flowers", "some green trees and two giraffes and yellow flowers"),
    ("A black and white photo of a street.", "A white and black photo of a street."),
    ("A bride and groom cutting a wedding cake.", "Groom and a bride cutting a wedding cake."),  # a shared article
    ("The man and woman sitting on a bench.", "Woman and the man sitting on a bench."),
])
def test_swaps_that_move_a_reference_are_no_positives(rules, original, candidate):
    assert not is_conjunct_swap(original, candidate)
    assert validate(original, candidate, "swap").reason == "not_conjunct_swap"
    assert candidate not in positives(rules, original)


@pytest.mark.parametrize("original,candidate", [
    ("A bathroom has a shower and toilet in it.", "A bathroom has a toilet and shower in it."),
    ("A man and a boy standing next to each other.", "A boy and a man standing next to each other."),
    ("A black and white cat on a bed.", "A white and black cat on a bed."),
    ("An omelette, oranges, and tomatoes on a plate.", "An omelette, tomatoes, and oranges on a plate."),
    ("A table and chairs in a dining room.", "Chairs and a table in a dining room."),  # a plural has no article to share
    ("A kitchen with a stove and refrigerator.", "A kitchen with a refrigerator and stove."),  # the article stays first
])
def test_swaps_whose_references_stay_are_still_positives(original, candidate):
    assert is_conjunct_swap(original, candidate)


# ---------------------------------------------------------------- the validator, every mode
@pytest.mark.parametrize("mode", ["strict", "paper"])
@pytest.mark.parametrize("original,candidate,reason", [
    ("A man riding a kite on a beach.", "A man riding a pair of kite on a beach.", None),  # two edits: strict says so
    ("A man holding skis on a slope.", "A man holding a skis on a slope.", "agreement"),
    ("A man holding a sandwich.", "A man holding a broccoli.", "agreement"),
    ("A dog on a beach.", "Sure! Here is the sentence: A dog on a shore.", "chatter"),
    ("A dog on a beach.", "Un perro en la playa.", "non_english"),
    ("A dog on a beach.", "Собака на пляже.", "non_english"),
])
def test_the_validator_refuses_the_classes_in_every_mode(mode, original, candidate, reason):
    verdict = validate(original, candidate, "replace_negative", mode)
    if reason is None:
        assert not verdict.accepted
    else:
        assert verdict.reason == reason


def test_paper_mode_keeps_multi_word_replace_edits():
    assert validate("A man holding a red umbrella on a street", "A guy holding a red umbrella on a road",
                    "replace", "paper").accepted


def test_non_english_lets_a_rare_english_word_or_a_name_through():
    assert not non_english("A blue truck on a road.", "A cerulean truck on a road.")
    assert not non_english("A man in Paris.", "A man in Zagreb.")
    assert non_english("A dog on a beach.", "Ein Hund am Strand.")
