"""Relation hard negatives: enough contrasts per common relation for balanced picks, and the
guards that keep the new ones grammatical and false (docs/blind-audit.md, "Balancing needs
candidates to choose from")."""
import pytest

from hardpos.rules.lexicon import load_lexicon
from hardpos.rules.perturber import RulePerturber
from hardpos.world.lexicon import world_lexicon


@pytest.fixture(scope="module")
def rules():
    return RulePerturber(seed=0)


def negatives(rules, caption):
    return {p.text for p in rules.hard_negatives(caption)}


def targets(lex, form):
    return {t for (f, cls), ts in lex.negatives.items()
            if f == form and any(s.cls == cls and s.slot == "relation" for s in lex.lookup(f)) for t in ts}


COMMON = {"on": 4, "next to": 5, "beside": 5, "in front of": 3, "behind": 3, "near": 2, "under": 2,
          "walking": 2, "running": 2, "standing": 3, "sitting": 2, "holding": 4, "riding": 3}


@pytest.mark.parametrize("form,k", COMMON.items(), ids=list(COMMON))
def test_common_relations_have_several_contrasts(form, k):
    assert len(targets(load_lexicon(), form)) >= k


def test_on_can_be_inserted_as_often_as_removed():
    """Balanced picks put "on" back only through relations that become "on"."""
    lex = load_lexicon()
    into_on = {f for (f, _), ts in lex.negatives.items() if "on" in ts}
    assert {"next to", "beside", "alongside", "near", "in front of", "behind", "in back of", "under"} <= into_on


MADE = [
    ("A cat sitting next to a bowl.", "A cat sitting on a bowl."),
    ("A vase of roses in front of a bookcase.", "A vase of roses on a bookcase."),
    ("A polar bear near rock formations.", "A polar bear on rock formations."),
    ("A cat sleeping under a table.", "A cat sleeping on a table."),
    ("A man holding a sandwich.", "A man eating a sandwich."),
    ("A boy holding a hat.", "A boy wearing a hat."),
    ("A man riding a skateboard.", "A man holding a skateboard."),
    ("A dog walking on the beach.", "A dog standing on the beach."),
]


@pytest.mark.parametrize("caption,negative", MADE, ids=[m[1] for m in MADE])
def test_new_contrasts_are_made(rules, caption, negative):
    assert negative in negatives(rules, caption)


NEVER = [
    ("A man standing next to a woman.", "A man standing on a woman."),  # people are no place to stand on
    ("Two dogs sitting next to each other.", "Two dogs sitting on each other."),
    ("A car parked next to the road.", "A car parked on the road."),  # likely still true
    ("Elephants near a body of water.", "Elephants on a body of water."),
    ("A baby elephant walking near a grassy shore.", "A baby elephant walking on a grassy shore."),
    ("A man sitting next to the phone.", "A man sitting on the phone."),  # another sense
    ("A man behind the wheel of a car.", "A man on the wheel of a car."),  # idiom
    ("A tower under a cloudy blue sky.", "A tower on a cloudy blue sky."),
    ("A building under construction.", "A building on construction."),
    ("A tray holding a sandwich.", "A tray eating a sandwich."),  # only people and animals eat
    ("A man holding an orange surfboard.", "A man eating an orange surfboard."),  # the colour
    ("A man holding an umbrella.", "A man eating an umbrella."),
    ("A man holding a kite.", "A man wearing a kite."),
    ("A man riding a horse.", "A man holding a horse."),
    ("A man walking a dog.", "A man standing a dog."),
    ("A man walking down the street.", "A man standing down the street."),
    ("A train running on the tracks.", "A train standing on the tracks."),  # not a walker
    ("A dog standing near.", "A dog standing on."),
]


@pytest.mark.parametrize("caption,wrong", NEVER, ids=[n[1] for n in NEVER])
def test_guarded_negatives_are_never_made(rules, caption, wrong):
    assert wrong not in negatives(rules, caption)


def test_the_world_relation_contrasts_are_unchanged():
    """The synthetic world's rule output is preregistered: its canonical relation words keep exactly
    these contrasts; its finetuning synonyms ("over", "left of", only in captions of a world with
    ``finetune_synonym_rate`` > 0) may also be contrasted with the other side's synonym."""
    got = {k: v for k, v in world_lexicon().negatives.items() if k[1].startswith("spatial")}
    assert got == {
        ("above", "spatial_vertical"): ("below",), ("over", "spatial_vertical"): ("below", "beneath"),
        ("below", "spatial_vertical"): ("above",), ("beneath", "spatial_vertical"): ("above", "over"),
        ("to the left of", "spatial_horizontal"): ("to the right of",),
        ("left of", "spatial_horizontal"): ("to the right of", "right of"),
        ("to the right of", "spatial_horizontal"): ("to the left of",),
        ("right of", "spatial_horizontal"): ("to the left of", "left of")}
