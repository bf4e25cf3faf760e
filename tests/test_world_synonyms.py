"""``finetune_synonym_rate``: finetuning captions written with the finetuning synonyms at a rate,
so the rule engine's REPLACE positives go both ways and mirrored picks balance them; 0 (the
default) leaves every world as it was."""
from __future__ import annotations

import hashlib
import json
from collections import Counter

import pytest

from hardpos.data.triplets import read_triplets
from hardpos.world.build import generate_world
from hardpos.world.grammar import truth
from hardpos.world.lexicon import world_lexicon
from hardpos.world.scene import BENCHMARK_FILES, RELATIONS, SYNONYMS, UNSEEN_SYNONYMS, Scene, WorldConfig

SMALL = dict(seed=2, n_pretrain=300, n_finetune=300, n_benchmark=100, write_images=False)
#: md5 of each file's rows (json, sorted keys) of WorldConfig(**SMALL), taken from the code before
#: finetune_synonym_rate existed: worlds built at rate 0 must stay exactly these
BEFORE = {
    "pretrain": "5966d6d53a8ed29c13f0a467d4c91b14",
    "finetune": "78d30169e08f7c5bdf1f3289ea3f4558",
    "benchmark/replace_attribute": "b16e03a07a24856f616473f1385c2e52",
    "benchmark/replace_relation": "89091a5b2674b9d39297e4f69dc7e568",
    "benchmark/swap": "7398e976056708fc4a293f9abc0f755c",
    "benchmark/replace_attribute_seen": "60da8b24d1696e84ad2ded891003c806",
    "benchmark/replace_relation_seen": "e981d7e757d5e9807c855b6dc2dec304",
}


def _digests(folder) -> dict[str, str]:
    names = ["pretrain", "finetune", *(f"benchmark/{b}" for b in BENCHMARK_FILES)]
    return {n: hashlib.md5(json.dumps(read_triplets(str(folder / f"{n}.parquet")), sort_keys=True).encode()).hexdigest()
            for n in names}


def _word_forms(caption: str, cfg: WorldConfig) -> Counter:
    """How many colour / size / relation words of a caption are canonical or finetuning synonyms."""
    out: Counter = Counter()
    text = f" {caption} "
    for rel in RELATIONS:  # "to the left of" holds "left of": the canonical form first
        if f" {rel} " in text:
            out["canonical"] += 1
            text = text.replace(f" {rel} ", " | ")
        elif f" {SYNONYMS[rel]} " in text:
            out["synonym"] += 1
            text = text.replace(f" {SYNONYMS[rel]} ", " | ")
    for w in text.split():
        if w in cfg.colors or w in cfg.sizes:
            out["canonical"] += 1
        elif w in {SYNONYMS[c] for c in [*cfg.colors, *cfg.sizes]}:
            out["synonym"] += 1
        elif w in set(UNSEEN_SYNONYMS.values()):
            out["unseen"] += 1
    return out


def test_rate_zero_leaves_the_world_as_it_was_and_a_rate_changes_only_finetuning(tmp_path):
    generate_world(WorldConfig(**SMALL), str(tmp_path / "default"))
    assert _digests(tmp_path / "default") == BEFORE
    generate_world(WorldConfig(**SMALL, finetune_synonym_rate=0.0), str(tmp_path / "zero"))
    assert _digests(tmp_path / "zero") == BEFORE
    stats = generate_world(WorldConfig(**SMALL, finetune_synonym_rate=0.5), str(tmp_path / "half"))
    changed = {k for k, v in _digests(tmp_path / "half").items() if v != BEFORE[k]}
    assert changed == {"finetune"}  # pretraining and every benchmark file are the same
    fin0 = read_triplets(str(tmp_path / "zero" / "finetune.parquet"))
    fin = read_triplets(str(tmp_path / "half" / "finetune.parquet"))
    # the same scenes and rows, only caption words (and the form) differ
    assert [(r["scene"], r["template"], r["caption_id"]) for r in fin] == \
        [(r["scene"], r["template"], r["caption_id"]) for r in fin0]
    assert sum(a["caption"] != b["caption"] for a, b in zip(fin, fin0)) > 200
    assert {r["form"] for r in fin} == {"canonical", "synonym"}
    assert all((r["form"] == "synonym") == (r["caption"] != r0["caption"]) for r, r0 in zip(fin, fin0))
    assert "finetune_synonym_share" in stats
    assert "finetune_synonym_share" not in generate_world(WorldConfig(**SMALL), str(tmp_path / "again"))


@pytest.mark.parametrize("rate", [0.2, 0.5])
def test_synonym_share_is_close_to_the_rate_and_every_caption_stays_true(tmp_path, rate):
    cfg = WorldConfig(seed=4, n_pretrain=0, n_finetune=1500, n_benchmark=0, write_images=False,
                      finetune_synonym_rate=rate)
    stats = generate_world(cfg, str(tmp_path))
    rows = read_triplets(str(tmp_path / "finetune.parquet"))
    forms = Counter()
    for r in rows:
        forms += _word_forms(r["caption"], cfg)
        assert truth(r["caption"], Scene.from_json(r["scene"]), cfg) is True, r["caption"]
    share = forms["synonym"] / (forms["synonym"] + forms["canonical"])
    assert forms["unseen"] == 0  # the benchmark's held-out synonyms never reach finetuning
    assert abs(share - rate) < 0.03  # ~6,000 words: 3 points is over 4 standard errors
    assert share == pytest.approx(stats["finetune_synonym_share"], abs=1e-4)
    assert stats["finetune_synonym_words"] == forms["synonym"]


def test_rate_one_writes_every_word_with_its_synonym_and_bad_rates_are_refused(tmp_path):
    cfg = WorldConfig(n_pretrain=0, n_finetune=200, n_benchmark=0, write_images=False, finetune_synonym_rate=1.0)
    generate_world(cfg, str(tmp_path))
    forms = sum((_word_forms(r["caption"], cfg) for r in read_triplets(str(tmp_path / "finetune.parquet"))), Counter())
    assert forms["canonical"] == 0 and forms["synonym"] > 600
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="finetune_synonym_rate must be in"):
            WorldConfig(finetune_synonym_rate=bad).validate()


def test_world_lexicon_goes_both_ways_and_keeps_canonical_words_entries():
    """Every finetuning synonym's positive goes back to its word (golden -> yellow too, which the
    full lexicon leaves out for real captions), and its negatives may use synonyms; a canonical
    word's entries are the shipped lexicon's, so worlds without synonyms get the same triplets."""
    from hardpos.rules.lexicon import load_lexicon
    from hardpos.world.build import vocabulary

    cfg = WorldConfig(colors=["red", "yellow", "green", "blue", "purple", "white", "orange", "pink", "brown", "gray"])
    lex = world_lexicon(cfg)
    voc = vocabulary(cfg)
    base = load_lexicon(include_benchmark_pairs=True, restrict_to=set(voc["colors"]) | set(voc["shapes"]) | set(
        voc["sizes"]) | set(voc["relations"]) | set(voc["synonyms"].values()))
    for word, syn in voc["synonyms"].items():
        there = {t for (f, _), ts in lex.positives.items() if f == word for t, _ in ts}
        back = {t for (f, _), ts in lex.positives.items() if f == syn for t, _ in ts}
        assert there == {syn} and back == {word}, (word, syn)
    assert ("golden", "color") not in base.positives and lex.positives[("golden", "color")] == (("yellow", "world"),)
    assert lex.negatives[("over", "spatial_vertical")] == ("below", "beneath")
    assert set(lex.negatives[("crimson", "color")]) >= {"blue", "sapphire", "yellow", "golden"}
    canonical = set(voc["synonyms"]) | set(voc["shapes"])
    assert {k: v for k, v in lex.positives.items() if k[0] in canonical} == \
        {k: v for k, v in base.positives.items() if k[0] in canonical}
    assert {k: v for k, v in lex.negatives.items() if k[0] in canonical} == \
        {k: v for k, v in base.negatives.items() if k[0] in canonical}


def test_rule_edits_of_synonym_captions_hold_to_the_ground_truth(tmp_path):
    """On a world with synonyms the rule positives go both ways and are true of the scene; the
    negatives are false of it (but for an object that happens to match, as on any world)."""
    from hardpos.rules.perturber import RulePerturber, substitution

    cfg = WorldConfig(seed=3, n_pretrain=0, n_finetune=400, n_benchmark=0, write_images=False,
                      finetune_synonym_rate=0.5)
    generate_world(cfg, str(tmp_path))
    rules = RulePerturber(seed=0, lexicon=world_lexicon(cfg))
    subs: Counter = Counter()
    neg_total = neg_false = neg_synonym = 0
    synonyms = set(SYNONYMS.values())
    for r in read_triplets(str(tmp_path / "finetune.parquet")):
        scene = Scene.from_json(r["scene"])
        for p in rules.hard_positives(r["caption"]):
            assert truth(p.text, scene, cfg) is True, (r["caption"], p)
            if p.kind == "replace":
                subs[substitution(p.slot)] += 1
        for p in rules.hard_negatives(r["caption"]):
            neg_total += 1
            neg_false += truth(p.text, scene, cfg) is False
            if p.kind == "replace" and substitution(p.slot)[1] in synonyms:
                neg_synonym += 1
    words = [*cfg.colors, *cfg.sizes, *RELATIONS]
    assert all(subs[(w, SYNONYMS[w])] > 0 and subs[(SYNONYMS[w], w)] > 0 for w in words), subs
    assert neg_false / neg_total >= 0.98 and neg_synonym > 100


def test_mirrored_positives_on_a_synonym_world_are_kept_and_near_chance(tmp_path):
    """At rate 0.5 mirrored picks keep nearly every REPLACE positive and both blind models pick the
    original in 50 +- 5% of pairs (46.8 and 47.1 here; a small set's cross-fitted models learn the
    mirror of each held-out pair and read a little below chance); without synonyms they keep none."""
    from hardpos import runtime
    from hardpos.audit.text_models import cross_validate, lm_pair_correct
    from hardpos.config import TrackingConfig
    from hardpos.stages.perturb import Config

    off = TrackingConfig(enabled=False)
    kept = {}
    for rate, n in ((0.0, 300), (0.5, 2000)):
        world = tmp_path / f"w{rate}"
        generate_world(WorldConfig(seed=1, n_pretrain=0, n_finetune=n, n_benchmark=0, write_images=False,
                                   finetune_synonym_rate=rate), str(world))
        out = tmp_path / f"p{rate}"
        kept[rate] = runtime.execute("perturb", Config(input=str(world), output_dir=str(out), tracking=off,
                                                       positive_picks="mirrored"), quiet=True)["replace_positives"]
    assert kept[0.0]["mirrored"] == 0 and kept[0.0]["balanced"] > 200
    assert kept[0.5]["mirrored"] >= 0.95 * kept[0.5]["balanced"] > 1500
    rows = [r for r in read_triplets(str(tmp_path / "p0.5" / "triplets.parquet")) if r["kind"] == "replace" and r["hard_positive"]]
    pairs = list(dict.fromkeys((r["caption"], r["hard_positive"]) for r in rows))  # as the audit counts them
    caps, pos = [c for c, _ in pairs], [p for _, p in pairs]
    assert len(pairs) > 1000
    assert abs(cross_validate(caps, pos).pair_mean - 0.5) <= 0.05
    assert abs(lm_pair_correct(caps, pos).mean() - 0.5) <= 0.05


def test_a_world_made_before_the_key_is_still_reused(tmp_path):
    """The demo reuses a world whose world.json matches its config: one written before
    finetune_synonym_rate existed (no such key) is the world rate 0 makes, not rate 0.5's."""
    from hardpos.stages.compose import world_matches

    cfg = WorldConfig(n_pretrain=10, n_finetune=10, n_benchmark=10, write_images=False)
    generate_world(cfg, str(tmp_path))
    meta = json.loads((tmp_path / "world.json").read_text())
    assert meta["config"].pop("finetune_synonym_rate") == 0.0
    (tmp_path / "world.json").write_text(json.dumps(meta))
    assert world_matches(str(tmp_path), cfg)
    assert not world_matches(str(tmp_path), WorldConfig(**{**meta["config"], "finetune_synonym_rate": 0.5}))
    assert not world_matches(str(tmp_path), WorldConfig(**{**meta["config"], "seed": 1}))
