"""Rule hard positives keep the meaning: the lexicon's block list, excluded pairs, coverage, the hand audit's files."""
import math
from pathlib import Path

import pytest

from hardpos.audit.hand import audit_rates, read_audit, sample_rule_positives, write_audit
from hardpos.rules.lexicon import LEXICON_FILE, _read, load_lexicon
from hardpos.rules.perturber import RulePerturber

AUDITS = Path(__file__).resolve().parent.parent / "docs" / "audits"


@pytest.fixture(scope="module")
def rules():
    """The rule engine with the REPLACE benchmark's pairs included: the block-list mechanics
    below are about senses, whichever table a synonym comes from (several, such as
    "sitting"->"seated", are benchmark pairs that the default lexicon holds out)."""
    return RulePerturber(seed=0, lexicon=load_lexicon(include_benchmark_pairs=True))


def rewrites(rules, caption):
    """The REPLACE positives of a caption as {"flying->soaring": text}."""
    return {p.slot.split(" ", 1)[1]: p.text for p in rules.hard_positives(caption) if p.kind == "replace"}


# One case per block-list entry in lexicon.json "positive_rules":
# (rule id, caption where the rewrite is WRONG, the rewrite, caption where the same rewrite is right, the rewrite).
# Captions are NegCLIP COCO captions unless marked (s) for synthetic.
BLOCK_LIST = [
    ("wood-compound", "A wood paneled hallway with a bench.", "wood->wooden",  # (s)
     "A wood table with two chairs.", "wood->wooden"),  # (s)
    ("picture-idiom", "A man takes his picture in the mirror.", "picture->image",  # (s)
     "A picture of a dog on a bed.", "picture->image"),  # (s)
    ("bike-motor", "Motorcyclists riding their bikes down a road.", "bikes->bicycles",  # (s)
     "A man riding his bike down a road.", "bike->bicycle"),  # (s)
    ("seated-person", "A couple of pieces of luggage sitting on the ground.", "sitting->seated",
     "There are a lot of people sitting by the fountain.", "sitting->seated"),
    ("seated-particle", "A man sitting down on a chair at a table with food.", "sitting->seated",
     "A man sitting on a bench.", "sitting->seated"),  # (s)
    ("resting-object", "A man with a laptop sitting on a bench.", "sitting->resting",  # (s)
     "A computer keyboard sitting on top of a desk.", "sitting->resting"),
    ("resting-surface", "A red stop sign sitting in the middle of a street.", "sitting->resting",
     "A pair of rusty scissors sitting on a floor.", "sitting->resting"),
    ("resting-place", "A red fire hydrant sitting on the side of a road.", "sitting->resting",
     "A rusty fire hydrant sitting on a city sidewalk.", "sitting->resting"),
    ("full-of-intensifier", "Commercial retail refrigerator stocked full of beer bottles.", "full of->filled with",
     "A woman standing in front of a table full of bananas.", "full of->filled with"),
    ("glasses-worn", "Two glasses on a table next to a bottle.", "glasses->eyeglasses",  # (s)
     "A man with glasses, checkered shirt and dotted tie", "glasses->spectacles"),
    ("glasses-drink", "A woman sitting at a table with glasses of wine.", "glasses->eyeglasses",  # (s)
     "A man with glasses that is holding a bunch of frisbees.", "glasses->eyeglasses"),
    ("bright-colour", "A bright yellow kitchen with a table.", "bright->brightly lit",  # (s)
     "A bright kitchen with white cabinets.", "bright->brightly lit"),  # (s)
    ("lighting-place", "A woman with dark hair holding a cat.", "dark->dim",  # (s)
     "A dark street with a bicycle near a tree on the side of a building.", "dark->dim"),
    ("looking-direction", "A giraffe looking for food between large rocks.", "looking->gazing",
     "A zebra in a zoo pin looking down at the ground.", "looking->gazing"),
    ("looking-animate", "A bench sits all alone on a beach looking at the magnificent ocean view.",
     "looking at->gazing at", "A dog looking at a slice of pizza.", "looking at->gazing at"),
    ("baby-modifier", "a cake made with diapers for a baby shower", "baby->infant",
     "A baby sitting in a high chair eating food.", "baby->infant"),
    ("baby-animal", "A baby and adult elephant are standing by large rocks.", "baby->infant",
     "A baby sitting in a high chair eating food.", "baby->infant"),
    ("holding-holder", "A plate holding a slice of pizza with assorted vegetables.", "holding->grasping",
     "A man holding a banana in his hand.", "holding->grasping"),
    ("holding-particle", "A woman holding up an umbrella near a stage.", "holding->grasping",
     "A man in shirt and tie holding an umbrella.", "holding->grasping"),
    ("walking-object", "A man walking a dog across a wet street.", "walking->strolling",
     "A herd of sheep walking across a snow covered field.", "walking->strolling"),
    ("riding-object", "A group of people riding down a snow covered ski slope.", "riding->traveling on",
     "A man riding a horse while other men look on. ", "riding->traveling on"),
    ("riding-ride", "A group of people riding swings in the snow.", "riding->traveling on",
     "A man riding a horse while other men look on. ", "riding->traveling on"),
    ("laying-object", "A man laying bricks next to a wall.", "laying->lying",  # (s)
     "A cute brown dog laying on a blanket.", "laying->lying"),
    ("hanging-rigid", "A stop sign is hanging from a post.", "hanging->dangling",
     "A bathroom shower with towel hanging from the door.", "hanging->dangling"),
    ("hanging-loose", "A bunch of bananas hanging on the tree", "hanging->dangling",
     "A bathroom shower with towel hanging from the door.", "hanging->dangling"),
    ("over-above", "Bears lope over the ground in a dry landscape.", "over->above",
     "A black bird flying over a body of water.", "over->above"),
    ("over-motion", "A man jumping a brown horse over an obstacle.", "over->above",
     "A black bird flying over a body of water.", "over->above"),
    ("young-adult", "A young boy holding up an electric tooth  brush.", "young->youthful",
     "a young woman packing luggage backs with clothing", "young->youthful"),
    ("old-age", "A two year old boy eating cake.", "old->aged",  # (s)
     "An old man on the phone wearing glasses and a blue coat.", "old->aged"),
    ("old-fixed", "Two old fashioned buses parked on the side of the road.", "old->aged",
     "An old man on the phone wearing glasses and a blue coat.", "old->aged"),
    ("colour-names", "A table with a glass of white wine on top of it. ", "white->ivory",
     "A white sink sitting under a mirror in a bathroom.", "white->ivory"),
    ("colour-material", "A white statue holding open a newspaper while sitting on a bench.", "white->ivory",
     "A white sink sitting under a mirror in a bathroom.", "white->ivory"),
    ("black-and-white", "There is a black and white photo with a bench falling over.", "white->ivory",
     "A black cat playing with a pair of shoes on a stool", "black->ebony"),
    ("chestnut-horse", "two brown horses standing behind some rocks ", "brown->chestnut",
     "A cute brown dog laying on a blanket.", "brown->chestnut"),
    ("colour-noun", "A brown of wooden park benches sitting next to a lake.", "brown->chestnut",
     "A cute brown dog laying on a blanket.", "brown->chestnut"),
    ("colour-turns", "A traffic light turns green on the corner of a city street.", "green->emerald",
     "A herd of sheep grazing on a lush green hillside.", "green->emerald"),
    ("dressed-garment", "An old man on the phone wearing glasses and a blue coat.", "wearing->dressed in",
     "A dog wearing a tuxedo sitting at a table witha piece of cake with a lit candle.", "wearing->dressed in"),
    ("sporting-gear", "Two people wearing skis on a snowy hill ", "wearing->sporting",
     "A woman wearing a hat bites into a pastry.", "wearing->sporting"),
    ("field-sports", "A group of children playing soccer on a field.", "field->meadow",
     "A herd of sheep walking across a snow covered field.", "field->meadow"),
    ("on-a-meadow", "A man standing on a lush green field under a kite.", "field->meadow",
     "A few cows grazing in a field near trees.", "field->meadow"),
    ("plate-baseball", "A batter standing at the plate during a baseball game.", "plate->dish",  # (s)
     "a close up of a plate of food with broccoli ", "plate->dish"),
    ("tall-high", "A tall giraffe walking through lush green forest.", "tall->high",
     " A bench sitting on to of a field of tall grass near water.", "tall->high"),
    ("lit-burning", "A sheet cake sitting on top of a table with lit candles.", "lit->illuminated",
     "A very orderly office with a bed in it was very well lit cause of open windows.", "lit->illuminated"),
    ("lit-up", "A neon colored building lit up in the night time", "lit->illuminated",
     "A very orderly office with a bed in it was very well lit cause of open windows.", "lit->illuminated"),
    ("closed-shut", "a close up of a child holding a closed umbrella", "closed->shut",
     "Grown cat sitting in front of a closed door leading outside. ", "closed->shut"),
    ("little-quantity", "some kids standing around during a little league game ", "little->small",
     "A little girl wearing a pink jacket holding two ski poles.", "little->small"),
    ("large-quantity", "A large number of zebras running in the wild.", "large->big",
     "A large crowd of people huddling under umbrellas.", "large->big"),
    ("eating-object", "Various people eating in a restaurant at a table.", "eating->ingesting",
     "A man eating a hotdog in a crowded stadium.", "eating->ingesting"),
    ("eating-compound", "A restaurant with patrons in the outdoor eating area.", "eating->consuming",
     "A man eating a hotdog in a crowded stadium.", "eating->consuming"),
    ("prep-object", "A group of people outside on snow skis.", "outside->outside of",
     "Commuter buses parked in a lot outside an apartment complex.", "outside->outside of"),
    ("prep-adjective", "An outside doorway to a restroom showing a destroyed wall and damaged floor.",
     "outside->outside of", "Commuter buses parked in a lot outside an apartment complex.", "outside->outside of"),
    ("under-state", "there is a large building under construction and many parking meters", "under->beneath",
     "A cat laying in bed under a blue blanket.", "under->beneath"),
    ("material-noun", "A bench made of wood and metal.", "wood->wooden",  # (s)
     "A wood table with two chairs.", "wood->wooden"),  # (s)
    ("spotted-verb", "A deer spotted in the woods.", "spotted->dotted",  # (s)
     "A spotted dog on a couch.", "spotted->dotted"),  # (s)
    ("throwing-pitch", "A catcher kneeling on the field throwing the baseball back to the pitcher. ",
     "throwing->tossing", "A man throwing a frisbee in a park.", "throwing->tossing"),  # (s)
    ("picture-object", "A colorful vase sitting on top of a table next to a picture on a wall.", "picture->photo",
     "A picture of a dog on a bed.", "picture->photo"),
]

# a picture on a pole or a sign is a poster as often as a photo
PICTURE_ON_A_SIGN = ("A picture of an animal is on a pole and next to it is a yellow taxi.", "picture->photograph")


@pytest.mark.parametrize("rule_id,wrong_caption,rewrite,right_caption,right_rewrite", BLOCK_LIST,
                         ids=[c[0] for c in BLOCK_LIST])
def test_block_list_entry(rules, rule_id, wrong_caption, rewrite, right_caption, right_rewrite):
    assert rewrite not in rewrites(rules, wrong_caption), f"{rule_id}: wrong-sense rewrite still produced"
    assert right_rewrite in rewrites(rules, right_caption), f"{rule_id}: the right sense was lost too"


def test_a_picture_on_a_pole_is_not_surely_a_photograph(rules):
    caption, rewrite = PICTURE_ON_A_SIGN
    assert rewrite not in rewrites(rules, caption)


def test_the_governor_is_the_word_that_opens_the_noun_phrase():
    """``governor`` looks back over articles, numbers and modifiers, not over nouns or verbs."""
    data = {"classes": {"place": {"slot": "object", "pos": "noun", "groups": [["field", "meadow"]]}},
            "function_words": _read(LEXICON_FILE)["function_words"],
            "positive_rules": [{"id": "g", "forms": ["field"], "block": {"governor": ["on"]}, "why": "test"}]}
    lex = load_lexicon(data=data)
    rules = RulePerturber(seed=0, lexicon=lex)
    made = lambda c: [p.text for p in rules.hard_positives(c)]  # noqa: E731
    assert made("A dog on a big green field.") == []
    assert made("A dog in a big green field.") == ["A dog in a big green meadow."]
    assert made("A dog on the grass by a field.") == ["A dog on the grass by a meadow."]  # "by" opens it
    with pytest.raises(ValueError, match="token classes"):
        load_lexicon(data={**data, "positive_rules": [{"id": "g", "forms": ["field"], "block": {"governor": ["<det>"]},
                                                       "why": "test"}]})


def test_every_block_list_entry_has_a_test():
    ids = {r.id for rs in load_lexicon().rules.values() for r in rs}
    assert ids == {c[0] for c in BLOCK_LIST}


def test_negclip_block_list_captions_are_real(shared_data):
    from hardpos.data.captions.formats import read_captions

    real = {r["caption"] for r in read_captions(str(shared_data / "negclip" / "valid_neg_clip.tsv"))}
    used = {c for case in BLOCK_LIST for c in (case[1], case[3])}
    assert len(used & real) >= 55  # most cases are real COCO captions, not made up


# The examples of intensity / hyponym / category changes: never produced, while the
# broader direction (a specific word to its general one) stays a positive.
@pytest.mark.parametrize("caption,never", [
    ("Two men stand by a large desert pizza.", "large->huge"),
    ("A big flatbed truck with the flag of the United Kingdom. ", "big->huge"),
    ("A small child posed in a chair with a teddy bear.", "small->tiny"),
    ("A dog stands near toys outside in the yard.", "dog->puppy"),
    ("Horses walk along a beach while boats ride at their moorings offshore.", "horses->ponies"),
    ("A cat on the kitchen counter sticking its nose in a cupboard.", "cat->kitten"),
    ("A gray chair and a black chair sit in a room near a lamp.", "lamp->lamp post"),
    ("A man holding a tennis racquet and a tennis ball.", "holding->clutching"),
    ("A desk in an office with a computer and a phone.", "phone->cell phone"),
    ("A bike sitting near the water that has boats in it.", "near->next to"),
    ("The long steam train sits at the station.", "long->lengthy"),
    ("A close up of a person's hand with a scissors cutting something wet.", "wet->damp"),
    ("A bathroom with a bath tub a toilet and a sink", "bathroom->restroom"),
    ("A man at a table with several dishes of food.", "dishes->plates"),
])
def test_excluded_pairs_are_never_produced(rules, caption, never):
    assert never not in rewrites(rules, caption)


def test_exclusions_are_one_way(rules):
    assert "kitten->cat" in rewrites(rules, "A kitten on a bed in a blanket and a hand holding an electric toothbrush. ")
    assert "beach->shore" in rewrites(rules, "A guy reaches for a Frisbee at a beach.")
    assert "cell phone->phone" in rewrites(rules, "A cell phone and a banana on a rock.")


def test_no_excluded_pair_survives_in_the_lexicon():
    lex = load_lexicon()
    excluded = set(_read(LEXICON_FILE)["positive_excluded"])
    plural = {f"{a}s->{b}s" for a, b in (k.split("->") for k in excluded)}
    made = {f"{form}->{syn}" for (form, _cls), syns in lex.positives.items() for syn, _src in syns}
    assert not made & excluded
    assert not made & plural  # "dogs->puppies" goes with "dog->puppy"


def test_structural_rules(rules):
    # a noun modifying another noun keeps its synonyms out ("road signs" are traffic signs)
    assert "street->road" not in rewrites(rules, "Street signs against the disorganized electric wire infrastructure "
                                                 "in Jerusalem")
    # a capitalised word inside the caption is a name
    assert "blue->azure" not in rewrites(rules, "This is an air show put on by the US Navy Blue Angels. ")
    # an -ing verb after a noun is its predicate, not its head: "a man sitting" keeps man->guy
    assert "man->guy" in rewrites(rules, "A man sitting down on a chair at a table with food.")


def test_world_lexicon_keeps_its_synonyms():
    from hardpos.world.lexicon import world_lexicon
    from hardpos.world.scene import SYNONYMS

    rules = RulePerturber(seed=0, lexicon=world_lexicon())
    got = rewrites(rules, "a large yellow circle to the left of a small red square")
    assert {"yellow->golden", "large->big", "small->little", "red->crimson", "to the left of->left of"} <= set(got)
    assert SYNONYMS["yellow"] == "golden"


@pytest.mark.parametrize("rule,match", [
    ({"id": "x", "forms": ["red"], "block": {"next": ["<verb>"]}, "why": "w"}, "unknown token class"),
    ({"id": "x", "forms": ["red"], "only": {"next": ["a"]}, "block": {"next": ["b"]}, "why": "w"}, "exactly one"),
    ({"id": "x", "forms": ["red"], "block": {"nearby": ["a"]}, "why": "w"}, "keys from"),
    ({"id": "x", "forms": ["@nothing"], "block": {"next": ["a"]}, "why": "w"}, "names no word list"),
    ({"id": "x", "forms": ["red"], "block": {"next": ["a"]}}, "why"),
    ({"id": "x", "forms": ["red"], "block": {"head": ["<np>"]}, "why": "w"}, "only apply to 'next' and 'prev'"),
])
def test_bad_rules_are_refused_with_the_entry_named(rule, match):
    data = _read(LEXICON_FILE)
    data["positive_rules"] = [rule]
    with pytest.raises(ValueError, match=match):
        load_lexicon(data=data)


# ---------------------------------------------------------------------------- measured on NegCLIP; the audit files
def test_replace_positive_coverage_on_negclip(shared_data, rules):
    from hardpos.audit.hand import unique_captions
    from hardpos.data.captions.formats import read_captions

    caps = unique_captions(r["caption"] for r in read_captions(str(shared_data / "negclip" / "valid_neg_clip.tsv")))
    covered = sum(rules.pick(c, "positive", "replace") is not None for c in caps)
    clean = RulePerturber(seed=0)  # the default: the REPLACE benchmark's pairs held out
    covered_clean = sum(clean.pick(c, "positive", "replace") is not None for c in caps)
    # docs/audits/README.md: 3,475 (72.2%) with the benchmark's pairs, 2,933 (60.9%) without; a
    # rule change may move them, within these bounds (past them, the README's figures are restated)
    assert len(caps) == 4815
    assert 0.68 <= covered / len(caps) <= 0.77 and 0.57 <= covered_clean / len(caps) <= 0.65, (covered, covered_clean)
    assert covered - covered_clean >= 0.08 * len(caps)  # the benchmark's table is worth ~9 points of coverage


def test_clean_heldout_audit_meets_the_bar():
    """The held-out sample drawn with today's default (the benchmark's pairs held out); the rows
    the engine still picks meet the same bar (tests/test_audit_hand.py)."""
    held = read_audit(AUDITS / "rule_positives_heldout_clean.tsv")
    rates = audit_rates(held)
    assert rates["n"] == 200 and rates["wrong"] == 0 and rates["doubtful"] <= 0.03, rates
    seen = {r["caption"] for name in ("before", "after") for r in read_audit(AUDITS / f"rule_positives_{name}.tsv")}
    assert not seen & {r["caption"] for r in held}  # held out: no caption of the tuned-on samples


def test_after_audit_meets_the_bar():
    after = read_audit(AUDITS / "rule_positives_after.tsv")
    rates = audit_rates(after)
    assert rates["n"] >= 300 and rates["wrong"] <= 0.01, rates
    before = {r["caption"] for r in read_audit(AUDITS / "rule_positives_before.tsv")}
    assert sum(r["caption"] in before for r in after) >= 200  # the same captions re-judged, plus fresh ones
    assert {r["sample"] for r in after} == {"same", "fresh"}


def test_heldout_audit_meets_the_bar():
    held = read_audit(AUDITS / "rule_positives_heldout.tsv")
    rates = audit_rates(held)
    assert rates["n"] >= 200 and rates["wrong"] <= 0.01, rates
    seen = {r["caption"] for name in ("before", "after") for r in read_audit(AUDITS / f"rule_positives_{name}.tsv")}
    assert not seen & {r["caption"] for r in held}  # held out: no caption of the tuned-on samples


def test_no_before_audit_wrong_rewrite_is_produced_any_more(rules):
    wrong = [r for r in read_audit(AUDITS / "rule_positives_before.tsv") if r["label"] == "wrong"]
    assert len(wrong) >= 30
    still = [(r["caption"], r["positive"]) for r in wrong
             if r["positive"] in {p.text for p in rules.hard_positives(r["caption"])}]
    assert not still


# ---------------------------------------------------------------------------- the audit helpers
def test_sample_is_seeded_and_skips_captions_without_a_positive(rules):
    caps = ["A man running on the beach.", "zzz qqq", "A red car.", "", "A woman holding a cat.", "A red car."]
    a, stats = sample_rule_positives(caps, n=3, seed=1, perturber=rules)
    b, _ = sample_rule_positives(caps, n=3, seed=1, perturber=rules)
    assert a == b and len(a) == 3 and "zzz qqq" not in {r["caption"] for r in a}
    assert stats.with_positive == 3 and stats.coverage_all == 3 / 4  # 4 unique non-empty captions
    c, unmeasured = sample_rule_positives(caps, n=3, seed=1, perturber=rules, coverage=False)
    assert c == a and unmeasured.drawn == stats.drawn and math.isnan(unmeasured.coverage_all)
    with pytest.raises(ValueError, match="n must be"):
        sample_rule_positives(caps, n=0, perturber=rules)


def test_read_audit_refuses_unlabelled_rows(tmp_path):
    path = tmp_path / "a.tsv"
    write_audit(path, [{"caption": "a", "positive": "b", "label": "ok", "why": "same"},
                       {"caption": "c", "positive": "d", "label": "fine", "why": "x"}])
    with pytest.raises(ValueError, match=r"a\.tsv:3: label must be one of"):
        read_audit(path)
    write_audit(path, [{"caption": "a", "positive": "b", "label": "wrong", "why": ""}])
    with pytest.raises(ValueError, match="reason"):
        read_audit(path)
