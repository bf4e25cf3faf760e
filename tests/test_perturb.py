"""Rule engine: exact outputs on real NegCLIP captions, determinism, the paper's table, the job."""
import json

import pytest

from hardpos.data.perturb import Perturbation, RulePerturber
from hardpos.data.validate import validate


@pytest.fixture(scope="module")
def rules():
    return RulePerturber(seed=0)


@pytest.fixture(scope="module")
def negclip(shared_data):
    from hardpos.data.captions import read_captions

    return {r["caption"] for r in read_captions(str(shared_data / "negclip" / "valid_neg_clip.tsv"))}


# (caption from ../shared/data/negclip/valid_neg_clip.tsv, polarity, expected (kind, slot, text) present)
EXACT = [
    ("A child holding a flowered umbrella and petting a yak.", "positive",
     ("swap", "conjuncts:verb_phrases", "A child petting a yak and holding a flowered umbrella.")),
    ("A child holding a flowered umbrella and petting a yak.", "positive",
     ("replace", "relation:hold holding->grasping", "A child grasping a flowered umbrella and petting a yak.")),
    ("A child holding a flowered umbrella and petting a yak.", "negative",
     ("replace", "relation:hold holding->throwing", "A child throwing a flowered umbrella and petting a yak.")),
    ("A red carpet in a bathroom with white fixtures", "negative",
     ("swap", "attributes:color red<->white", "A white carpet in a bathroom with red fixtures")),
    ("A red carpet in a bathroom with white fixtures", "negative",
     ("replace", "attribute:color red->orange", "An orange carpet in a bathroom with white fixtures")),
    ("A red carpet in a bathroom with white fixtures", "positive",
     ("replace", "attribute:color red->crimson", "A crimson carpet in a bathroom with white fixtures")),
    ("A black and white cat sitting on top of a toilet seat.", "positive",
     ("swap", "conjuncts:adjectives", "A white and black cat sitting on top of a toilet seat.")),
    ("A black and white cat sitting on top of a toilet seat.", "positive",
     ("replace", "relation:spatial_on on top of->on", "A black and white cat sitting on a toilet seat.")),
    ("A black and white cat sitting on top of a toilet seat.", "negative",
     ("replace", "relation:spatial_on on top of->under", "A black and white cat sitting under a toilet seat.")),
    ("A lady sitting on a couch with a laptop.", "negative",
     ("swap", "objects:thing couch<->laptop", "A lady sitting on a laptop with a couch.")),
    ("A lady sitting on a couch with a laptop.", "negative",
     ("replace", "relation:spatial_on_simple on->under", "A lady sitting under a couch with a laptop.")),
    ("A store room holds sinks, bathtubs and toilets", "positive",
     ("swap", "conjuncts:noun_phrases", "A store room holds sinks, toilets and bathtubs")),
    ("A car and a bus behind a fence.", "positive",
     ("swap", "conjuncts:noun_phrases", "A bus and a car behind a fence.")),
    ("A car and a bus behind a fence.", "positive",
     ("replace", "relation:spatial_depth behind->to the rear of", "A car and a bus to the rear of a fence.")),
    ("A car and a bus behind a fence.", "negative",
     ("replace", "object:vehicle car->airplane", "An airplane and a bus behind a fence.")),
    ("There are a lot of people sitting by the fountain.", "negative",
     ("replace", "relation:state_posture sitting->standing", "There are a lot of people standing by the fountain.")),
]


@pytest.mark.parametrize("caption,polarity,expected", EXACT)
def test_exact_outputs_on_real_captions(rules, negclip, caption, polarity, expected):
    assert caption in negclip  # the test really uses NegCLIP captions
    got = rules.hard_negatives(caption) if polarity == "negative" else rules.hard_positives(caption)
    assert Perturbation(expected[2], expected[0], expected[1]) in got


def test_complete_output_for_one_caption(rules):
    caption = "There are a lot of people sitting by the fountain."
    assert rules.hard_negatives(caption) == [
        Perturbation("There are a lot of people standing by the fountain.", "replace", "relation:state_posture sitting->standing"),
        Perturbation("There are a lot of people lying by the fountain.", "replace", "relation:state_posture sitting->lying"),
    ]
    assert rules.hard_positives(caption) == [
        Perturbation("There are a lot of people seated by the fountain.", "replace", "relation:state_posture sitting->seated")]


@pytest.mark.parametrize("caption,absent", [
    ("A woman and a cat sitting in front of a TV.", "objects:"),        # conjuncts are not an object swap
    ("A dog on the beach.", "relation:spatial_on_simple"),              # "under the beach" is nonsense
    ("Two hands holding and dialing a cellular phone.", "conjuncts:verb_phrases"),  # shared object
    ("A giraffe is walking up a grassy and rocky hill.", "conjuncts:noun_phrases"),
    ("A toilet and sink side by side in a bathroom.", "conjuncts:noun_phrases"),
])
def test_skips_rather_than_nonsense(rules, caption, absent):
    slots = [p.slot for p in rules.hard_negatives(caption) + rules.hard_positives(caption)]
    assert not any(s.startswith(absent) for s in slots), slots


def test_the_paper_examples(rules):
    pos = {p.text for p in rules.hard_positives("a sink, toilet and shower")}
    assert "a sink, shower and toilet" in pos
    pos = {p.text for p in rules.hard_positives("a man wearing glasses and holding a bottle")}
    assert "a man holding a bottle and wearing glasses" in pos
    assert "strolling elephant" in {p.text for p in rules.hard_positives("walking elephant")}
    assert "letters ON dangling sign" in {p.text for p in rules.hard_positives("letters ON hanging sign")}


def test_every_output_passes_the_validator_on_real_captions(rules, negclip):
    bad = []
    for caption in sorted(negclip)[:600]:
        for p in rules.hard_positives(caption):
            v = validate(caption, p.text, p.kind)
            if not v.accepted:
                bad.append((caption, p, v.reason))
        for p in rules.hard_negatives(caption):
            v = validate(caption, p.text, p.kind + "_negative")
            if not v.accepted:
                bad.append((caption, p, v.reason))
    assert not bad, bad[:5]


def test_pick_is_seeded_and_deterministic(negclip):
    caps = sorted(negclip)[:200]
    a, b, c = RulePerturber(seed=1), RulePerturber(seed=1), RulePerturber(seed=2)
    pa = [a.pick(x, "negative") for x in caps]
    assert pa == [b.pick(x, "negative") for x in caps]
    assert pa != [c.pick(x, "negative") for x in caps]
    assert all(p is None or p.kind == "swap" for p in (a.pick(x, "positive", "swap") for x in caps))
    with pytest.raises(ValueError):
        a.pick("a dog", "neutral")
    assert a.pick("zzz qqq", "negative") is None


def test_paper_table_rederived_from_shared_files_matches_shipped(shared_data):
    from hardpos.data.paper_table import derive_table, load_table

    derived = derive_table(shared_data / "hard_positives")
    shipped = load_table()
    assert derived == shipped
    rel = {(r["from"], r["to"]) for r in shipped["relations"]}
    att = {(r["from"], r["to"]) for r in shipped["attributes"]}
    assert {("walking", "strolling"), ("hanging", "dangling"), ("in", "within"), ("behind", "to the rear of"),
            ("on top of", "on"), ("riding", "traveling on")} <= rel
    assert {("red", "crimson"), ("white", "ivory"), ("large", "big"), ("wet", "damp")} <= att
    assert len(att) == 23 and len(rel) == 15  # paper: 24 attribute / 14 relation rules (see report)
    assert shipped["provenance"]["attributes_rows"] == 10575 and shipped["provenance"]["relations_rows"] == 16868
