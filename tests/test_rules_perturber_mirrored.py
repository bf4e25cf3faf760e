"""Mirrored REPLACE positives (``perturb positive_picks=mirrored``, opt-in): every substitution
kept beside its reverse, so a text-only reader cannot tell the positives from their captions;
the default picks are unchanged."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardpos.rules.perturber import mirror_positives, substitution
from hardpos.rules.text import Perturbation

CAPTIONS = Path(__file__).resolve().parent / "support" / "captions_coco_style.txt"


def _pos(text: str, slot: str) -> Perturbation:
    return Perturbation(text, "replace", slot)


def test_substitutions_are_matched_with_their_reverse_and_the_rest_dropped():
    captions = ["a man on a bike", "a guy on a bike", "a man with a dog", "a red car", "a tall man"]
    cands = [([], [_pos("a guy on a bike", "object:person man->guy")]),
             ([], [_pos("a man on a bike", "object:person guy->man")]),
             ([], [_pos("a guy with a dog", "object:person man->guy"), _pos("a man with a puppy", "object:animal dog->puppy")]),
             ([], [_pos("a crimson car", "attribute:color red->crimson")]),
             ([], [])]
    results = [{"kind": "replace", "pos": c[1][0].text if c[1] else None, "pos_slot": None} for c in cands]
    results[4] = {"kind": "swap", "pos": "a man who is tall", "pos_slot": "conjuncts:x"}
    info = mirror_positives(captions, cands, results, seed=0)
    texts = [r["pos"] for r in results]
    # man->guy has one reverse (caption 1): one of captions 0 / 2 is matched with it, the other gets none
    assert texts[1] == "a man on a bike" and sum(t in ("a guy on a bike", "a guy with a dog") for t in texts[:3]) == 1
    assert texts[3] is None and texts[4] == "a man who is tall"  # no crimson->red anywhere; SWAP untouched
    assert info == {"replace_positives": {"balanced": 4, "mirrored": 2}}
    assert substitution("relation:spatial next to->beside") == ("next to", "beside") and substitution("conjuncts:x") is None


def test_perturb_mirrored_positives_are_opt_in_and_balanced(tmp_path):
    from collections import Counter

    from hardpos import runtime
    from hardpos.config import ConfigError, TrackingConfig
    from hardpos.data.triplets import read_triplets
    from hardpos.stages.perturb import Config

    src = tmp_path / "caps.jsonl"
    caps = [c for c in CAPTIONS.read_text().splitlines() if c.strip()]
    src.write_text("".join(json.dumps({"id": i, "caption": c, "image": f"{i}.jpg"}) + "\n" for i, c in enumerate(caps)))
    off = TrackingConfig(enabled=False)
    plain = runtime.execute("perturb", Config(input=str(src), output_dir=str(tmp_path / "a"), tracking=off), quiet=True)
    mirrored = runtime.execute("perturb", Config(input=str(src), output_dir=str(tmp_path / "b"), tracking=off,
                                                 positive_picks="mirrored"), quiet=True)
    a, b = (read_triplets(str(tmp_path / d / "triplets.parquet")) for d in "ab")
    assert [r["hard_negative"] for r in a] == [r["hard_negative"] for r in b]  # the negatives are the default's
    assert [r["hard_positive"] for r in a if r["kind"] == "swap"] == [r["hard_positive"] for r in b if r["kind"] == "swap"]
    n = mirrored["replace_positives"]["mirrored"]
    assert 0 < n < mirrored["replace_positives"]["balanced"] and plain["positive_picks"] == "balanced"
    subs = Counter(tuple(r["positive_slot"].split(" ", 1)[1].lower().split("->")) for r in b
                   if r["kind"] == "replace" and r["hard_positive"])
    assert sum(subs.values()) == n and all(subs[(x, y)] == subs[(y, x)] for x, y in subs)  # each word in as often as out
    with pytest.raises(ConfigError, match="needs balanced_picks"):
        Config(input="x", positive_picks="mirrored", balanced_picks=False)


@pytest.mark.slow
def test_mirrored_positives_on_negclip_are_near_chance_for_both_blind_models(shared_data, tmp_path):
    """On the 4,839 NegCLIP captions the default REPLACE positives are told from their captions
    in 87-88% of pairs; the mirrored ones within 10 points of chance for both kinds of model."""
    from hardpos import runtime
    from hardpos.audit.text_models import cross_validate, lm_pair_correct
    from hardpos.config import TrackingConfig
    from hardpos.data.triplets import read_triplets
    from hardpos.stages.perturb import Config

    runtime.execute("perturb", Config(input=str(shared_data / "negclip" / "valid_neg_clip.tsv"), output_dir=str(tmp_path),
                                      positive_picks="mirrored", tracking=TrackingConfig(enabled=False)), quiet=True)
    rows = [r for r in read_triplets(str(tmp_path / "triplets.parquet")) if r["kind"] == "replace" and r["hard_positive"]]
    caps, pos = [r["caption"] for r in rows], [r["hard_positive"] for r in rows]
    assert len(rows) > 600
    assert abs(cross_validate(caps, pos).pair_mean - 0.5) <= 0.10
    assert abs(lm_pair_correct(caps, pos).mean() - 0.5) <= 0.10
