"""The generate stage's join into training rows: one row per caption by default (the paper
pairs each training caption with one hard positive and one hard negative), the positive
picked by a seeded rule and recorded; "all" keeps one row per accepted positive."""
from __future__ import annotations

import collections
import hashlib
import os
import random

import pytest

from hardpos.config import load_config
from hardpos.rules.perturber import RulePerturber
from hardpos.generate import join, shard_files

CAPTION = "A black dog and a white cat."
POSITIVES = {"replace": "A black hound and a white cat.", "swap": "A white cat and a black dog."}


def cap(index=0, caption_id="c0", caption=CAPTION, negatives=()):
    return {"index": index, "caption_id": caption_id, "caption": caption, "image": f"/i/{index}.png",
            "negatives": list(negatives)}


def acc(index, kind, text, polarity="positive", source="llm:m"):
    return {"request_id": f"{index}:{kind}", "kind": kind, "polarity": polarity, "text": text, "source": source}


def two_positives(index=0):
    # swap first: the engine's answer order must not matter
    return [acc(index, "swap", POSITIVES["swap"]), acc(index, "replace", POSITIVES["replace"])]


def seeds_choosing(kind_index: int, caption_id: str = "c0") -> list[int]:
    return [s for s in range(64) if join.positive_choice(s, caption_id, 2) == kind_index]


def test_one_gives_one_seeded_row_and_all_gives_every_positive():
    for seed in range(8):
        rules = RulePerturber(seed=seed)  # the picker's rule engine is seeded with the stage's seed
        picker = join.NegativePicker("rules", seed, "src")
        (row,) = join.join_triplets([cap()], two_positives(), picker)  # "one" is the default
        again = join.join_triplets([cap()], list(reversed(two_positives())),
                                       join.NegativePicker("rules", seed, "src"), positives="one")
        assert again == [row]  # same seed, any answer order: the same row
        kind = ["replace", "swap"][join.positive_choice(seed, "c0", 2)]
        assert row["kind"] == kind and row["hard_positive"] == POSITIVES[kind] and row["source"] == "llm:m"
        assert (row["n_positives"], row["positive_kinds"], row["positive_index"]) == (2, "replace,swap",
                                                                                      ["replace", "swap"].index(kind))
        # the hard negative is the rule engine's for the chosen positive's kind
        assert row["hard_negative"] == join.rule_negative(rules, CAPTION, kind) and row["negative_source"] == "rule"
    # another seed may pick the other positive: both picks occur, and both are valid rows (checked above)
    assert seeds_choosing(0) and seeds_choosing(1)
    s_replace, s_swap = seeds_choosing(0)[0], seeds_choosing(1)[0]
    got = {s: join.join_triplets([cap()], two_positives(), join.NegativePicker("rules", s, "src"))[0]["kind"]
           for s in (s_replace, s_swap)}
    assert got == {s_replace: "replace", s_swap: "swap"}

    rules = RulePerturber(seed=0)
    negatives = [join.rule_negative(rules, CAPTION, k) for k in ("replace", "swap")]
    assert negatives[0] != negatives[1]  # so matching the negative to the positive's kind is checked
    every = join.join_triplets([cap()], two_positives(), join.NegativePicker("rules", 0, "src"), positives="all")
    assert [(t["kind"], t["hard_positive"], t["positive_index"]) for t in every] == [
        ("replace", POSITIVES["replace"], 0), ("swap", POSITIVES["swap"], 1)]
    assert [t["hard_negative"] for t in every] == negatives
    with pytest.raises(ValueError, match="positives must be one of"):
        join.join_triplets([cap()], two_positives(), join.NegativePicker("rules", 0, "src"), positives="first")


def test_positive_choice_is_the_documented_hash():
    for seed, caption_id, n in [(0, "c0", 2), (7, "391895", 2), (3, "x", 3), (1, "c0", 1)]:
        h = int.from_bytes(hashlib.sha256(f"{seed}\x00{caption_id}\x00positive".encode()).digest()[:4], "little")
        assert join.positive_choice(seed, caption_id, n) == h % n
    assert join.positive_choice(5, "any", 1) == 0
    with pytest.raises(ValueError, match="at least one positive"):
        join.positive_choice(0, "c0", 0)
    # over many captions both positives are picked about equally often (no kind is favoured)
    picks = collections.Counter(join.positive_choice(0, str(i), 2) for i in range(2000))
    assert 900 < picks[0] < 1100


def test_llm_negative_follows_the_chosen_positive_kind():
    rows = two_positives() + [acc(0, "replace_negative", "A black dog and a white horse.", "negative"),
                              acc(0, "swap_negative", "A white dog and a black cat.", "negative")]
    want = {"replace": "A black dog and a white horse.", "swap": "A white dog and a black cat."}
    for seed in (seeds_choosing(0)[0], seeds_choosing(1)[0]):
        (row,) = join.join_triplets([cap()], rows, join.NegativePicker("auto", seed, "src"))
        assert row["hard_negative"] == want[row["kind"]] and row["negative_source"] == "llm:m"
    # a dataset negative wins under "auto" whatever the positive (NegCLIP's neg_caption)
    (row,) = join.join_triplets([cap(negatives=["A cat and a dog."])], rows, join.NegativePicker("auto", 0, "neg"))
    assert row["hard_negative"] == "A cat and a dog." and row["negative_source"] == "dataset:neg"


def test_join_counts_per_caption():
    caps = [cap(0, "a"), cap(1, "b", "A red bus on a street."), cap(2, "c", "A man holding a red umbrella."),
            cap(3, "d", "   ")]
    accepted = two_positives(0) + [acc(1, "replace", "A red coach on a street.")]
    picker = join.NegativePicker("rules", 0, "src")
    one = join.join_by_caption(caps, accepted, picker)
    assert [len(rows) for rows in one] == [1, 1, 1, 0]  # "c" keeps a negative-only row, the blank caption none
    assert one[2][0]["hard_positive"] is None and one[2][0]["n_positives"] == 0 and one[2][0]["positive_index"] is None
    assert join.join_counts(one) == {
        "triplets_per_caption": {"0": 1, "1": 3}, "positives_per_caption": {"0": 2, "1": 1, "2": 1},
        "captions_with_positive": 2, "captions_with_several_positives": 1, "positives_unused": 1}
    every = join.join_by_caption(caps, accepted, picker, positives="all")
    assert join.join_counts(every) == {
        "triplets_per_caption": {"0": 1, "1": 2, "2": 1}, "positives_per_caption": {"0": 2, "1": 1, "2": 1},
        "captions_with_positive": 2, "captions_with_several_positives": 1, "positives_unused": 0}
    # the flat form is the per-caption lists in caption order
    assert join.join_triplets(caps, accepted, picker) == [t for rows in one for t in rows]


def test_rows_do_not_depend_on_sharding_or_answer_order():
    rng = random.Random(0)
    caps = [cap(i, f"id{i}") for i in range(40)]
    accepted = [r for i in range(40) for r in two_positives(i)]
    picker = join.NegativePicker("none", 3, "src")
    whole = join.join_triplets(caps, accepted, picker)
    shuffled = accepted[:]
    rng.shuffle(shuffled)
    sharded = [t for start in range(0, 40, 7) for t in join.join_triplets(caps[start:start + 7], shuffled, picker)]
    assert sharded == whole and len(whole) == 40
    kinds = collections.Counter(t["kind"] for t in whole)
    assert kinds["replace"] > 0 and kinds["swap"] > 0  # the seeded rule spreads the picks


# --------------------------------------------------------------------------- the stage on Ray
def gen_config(tmp_path, name, *overrides):
    from hardpos.generate import stage as generate

    return load_config(generate.Config, None, [f"output_dir={tmp_path / name}", "tracking.enabled=false", *overrides])


def test_stage_writes_one_row_per_real_negclip_caption(ray_session, shared_data, tmp_path):
    from hardpos.data.triplets import read_triplets
    from hardpos.runtime import execute

    source = str(shared_data / "negclip" / "valid_neg_clip.tsv")
    base = [f"input={source}", "limit=60", "engine.kind=rules", "seed=0"]
    one = execute("generate", gen_config(tmp_path, "one", *base, "shard_size=25"), quiet=True)
    out = one["output_dir"]
    rows = read_triplets(os.path.join(out, "triplets.parquet"))
    accepted = shard_files.read_parquet_rows(os.path.join(out, "accepted.parquet"))
    n_pos = collections.Counter(r["caption_id"] for r in accepted if r["polarity"] == "positive")
    ids = [r["caption_id"] for r in rows]
    # NegCLIP gives every caption a negative, so every caption keeps exactly one row
    assert one["complete"] and one["join_positives"] == "one" and one["captions"] == 60
    assert len(ids) == len(set(ids)) == 60 == one["triplets"]
    assert one["triplets_per_caption"] == {"1": 60}
    several = sorted(c for c, n in n_pos.items() if n > 1)
    assert several, "the first 60 NegCLIP captions should include REPLACE+SWAP captions"
    assert one["captions_with_several_positives"] == len(several)
    assert one["captions_with_positive"] == len(n_pos) == one["triplets_with_positive"]
    assert one["positives_unused"] == sum(n_pos.values()) - len(n_pos)
    assert one["positives_per_caption"] == {"0": 60 - len(n_pos), **{str(k): v for k, v in sorted(
        collections.Counter(n_pos.values()).items())}}
    texts = collections.defaultdict(dict)
    for r in accepted:
        texts[r["caption_id"]][r["kind"]] = r["text"]
    for t in rows:
        assert t["n_positives"] == n_pos.get(t["caption_id"], 0) and t["negative_source"] == "dataset:valid_neg_clip"
        if t["n_positives"]:
            kinds = sorted(texts[t["caption_id"]])
            assert t["positive_kinds"] == ",".join(kinds)
            assert t["positive_index"] == join.positive_choice(0, t["caption_id"], len(kinds))
            assert t["hard_positive"] == texts[t["caption_id"]][kinds[t["positive_index"]]]
            assert t["kind"] == kinds[t["positive_index"]]

    # another shard size (a fresh output dir) gives the very same rows; "all" gives every positive
    resharded = execute("generate", gen_config(tmp_path, "one-b", *base, "shard_size=60"), quiet=True)
    assert read_triplets(os.path.join(resharded["output_dir"], "triplets.parquet")) == rows
    every = execute("generate", gen_config(tmp_path, "all", *base, "shard_size=25", "join.positives=all"), quiet=True)
    all_rows = read_triplets(os.path.join(every["output_dir"], "triplets.parquet"))
    assert every["join_positives"] == "all" and every["positives_unused"] == 0
    assert len(all_rows) == 60 + one["positives_unused"] == every["triplets"]
    assert every["triplets_per_caption"] == {"1": 60 - len(several), "2": len(several)}
    assert {(t["caption_id"], t["kind"]) for t in all_rows if t["caption_id"] in several} == {
        (c, k) for c in several for k in ("replace", "swap")}
    strip = ("caption_id", "kind", "hard_positive", "hard_negative")
    assert {tuple(t[k] for k in strip) for t in rows} <= {tuple(t[k] for k in strip) for t in all_rows}


def test_dataset_negatives_that_keep_the_meaning_are_never_picked():
    swapped = "A white cat and a black dog."  # a whole-conjunct swap: a positive, not a negative
    real = "A white dog and a black cat."    # a binding swap: a real hard negative
    c = cap(negatives=[swapped, real])
    assert join.dataset_negatives(c) == [real]
    assert join.meaning_kept_negatives([c, cap(negatives=[real])]) == 1
    picker = join.NegativePicker("auto", seed=0, dataset="negclip")
    for seed in range(8):
        picker.seed = seed
        assert picker.pick(c, "replace", {}) == (real, "dataset:negclip")
    # only meaning-keeping negatives: the picker falls back to the rule engine
    neg, source = picker.pick(cap(negatives=[swapped]), "replace", {})
    assert source == "rule" and neg not in (swapped, None)
