"""Balanced rule picks: the picked edits carry their captions' own word n-gram counts, so a
text-only reader finds less to tell an edit by."""
from __future__ import annotations

import json

import pytest

from hardpos.audit.text_models import cross_validate
from hardpos.data.captions.formats import read_captions
from hardpos.rules.balance import NgramBalance
from hardpos.rules.perturber import RulePerturber, draw, pick_from


def test_delta_cost_and_add_count_signed_ngrams():
    bal = NgramBalance(ngrams=1)
    assert bal.delta("a red car", "a blue car") == {"blue": 1, "red": -1}
    assert bal.cost("a red car", "a blue car") == 2  # from nothing, two counts off
    bal.add("a red car", "a blue car")
    assert bal.diff == {"blue": 1, "red": -1} and bal.picks == 1 and bal.imbalance == 2.0
    # the reverse edit on another caption cancels both: the L1 norm falls by 2
    assert bal.cost("a blue bus", "a red bus") == -2
    assert bal.cost("a blue bus", "a green bus") == 0  # "blue" back to 0, "green" off by one
    bal.add("a blue bus", "a red bus")
    assert bal.diff == {} and bal.imbalance == 0.0
    with pytest.raises(ValueError):
        NgramBalance(ngrams=0)


def test_best_takes_the_edit_that_evens_the_counts_and_the_draw_breaks_ties():
    bal = NgramBalance()
    bal.add("a red car on the road", "a blue car on the road")
    # the caption says "blue": putting "red" back evens both words; "green" would not
    assert bal.best("a blue kite in the sky", ["a green kite in the sky", "a red kite in the sky"],
                    default="a green kite in the sky") == "a red kite in the sky"
    fresh = NgramBalance()
    options = ["a green kite", "a pink kite"]
    assert fresh.best("a blue kite", options, default="a pink kite") == "a pink kite"  # a tie: the draw


def test_draw_without_balance_is_the_seeded_pick_and_with_it_stays_in_the_drawn_family():
    from tests.support.rule_properties import fixture_captions

    rules = RulePerturber(seed=3)
    caps = fixture_captions()[:300]
    bal = NgramBalance()
    moved = 0
    for cap in caps:
        options = rules.hard_negatives(cap)
        plain = draw(cap, options, 3, "negative")
        assert plain == rules.pick(cap, "negative")
        balanced = draw(cap, options, 3, "negative", balance=bal)
        if plain is None:
            assert balanced is None
            continue
        family = plain.slot.split(" ", 1)[0].split(":", 1)[0] + "/" + plain.kind
        assert balanced.slot.split(" ", 1)[0].split(":", 1)[0] + "/" + balanced.kind == family
        bal.add(cap, balanced.text)
        moved += balanced != plain
    assert moved > 30  # the balance really chooses


def test_balanced_picks_are_harder_for_a_blind_reader_than_seeded_random_ones(shared_data):
    """On 2,000 NegCLIP captions: the balanced picks' n-gram imbalance is lower, and the
    audit's blind reader (grouped 5-fold CV) tells them from their captions less often."""
    rows = read_captions(str(shared_data / "negclip" / "valid_neg_clip.tsv"), limit=2000)
    caps = [r["caption"] for r in rows if r["caption"].strip()]
    rules = RulePerturber(seed=0)
    balanced, plain = (NgramBalance(), NgramBalance()), (NgramBalance(), NgramBalance())
    picked_b, picked_p = [], []
    for cap in caps:
        negs, poss = rules.candidates(cap)
        b = pick_from(cap, negs, poss, 0, 0, balance=balanced)
        p = pick_from(cap, negs, poss, 0, 0)
        assert (b["kind"], b["neg"] is None, b["pos"] is None) == (p["kind"], p["neg"] is None, p["pos"] is None)
        if p["neg"]:
            plain[0].add(cap, p["neg"])
            picked_p.append((cap, p["neg"]))
            picked_b.append((cap, b["neg"]))
    assert balanced[0].imbalance < 0.8 * plain[0].imbalance
    acc_b = cross_validate([c for c, _ in picked_b], [e for _, e in picked_b], steps=200).mean
    acc_p = cross_validate([c for c, _ in picked_p], [e for _, e in picked_p], steps=200).mean
    assert acc_b < acc_p - 0.04, (acc_b, acc_p)


def test_perturb_job_balances_alike_in_process_and_on_ray_workers(tmp_path, ray_session, shared_data, tracking_uri):
    from hardpos import runtime
    from hardpos.config import TrackingConfig
    from hardpos.data.triplets import read_triplets
    from hardpos.stages.perturb import Config

    src = tmp_path / "caps.jsonl"
    rows = read_captions(str(shared_data / "negclip" / "valid_neg_clip.tsv"), limit=400)
    src.write_text("".join(json.dumps({"id": i, "caption": r["caption"], "image": f"{i}.jpg"}) + "\n"
                           for i, r in enumerate(rows)))
    off = TrackingConfig(enabled=False)
    local = runtime.execute("perturb", Config(input=str(src), output_dir=str(tmp_path / "a"), tracking=off), quiet=True)
    spread = runtime.execute("perturb", Config(input=str(src), output_dir=str(tmp_path / "b"), tracking=off,
                                               num_workers=2), quiet=True)
    plain = runtime.execute("perturb", Config(input=str(src), output_dir=str(tmp_path / "c"), tracking=off,
                                              balanced_picks=False), quiet=True)
    a, b, c = (read_triplets(str(tmp_path / d / "triplets.parquet")) for d in "abc")
    assert a == b  # the picks do not depend on how the candidates were made
    assert [r["kind"] for r in a] == [r["kind"] for r in c]  # the kind draw is the same
    assert sum(x["hard_negative"] != y["hard_negative"] for x, y in zip(a, c)) > 20
    imb = local["ngram_imbalance_per_pick"]["negatives"]
    assert local["balanced_picks"] and imb["balanced"] < imb["seeded_random"]
    assert spread["ngram_imbalance_per_pick"] == local["ngram_imbalance_per_pick"]
    assert not plain["balanced_picks"] and "ngram_imbalance_per_pick" not in plain
    from mlflow.tracking import MlflowClient

    logged = runtime.execute("perturb", Config(input=str(src), output_dir=str(tmp_path / "d"),
                                               tracking=TrackingConfig(tracking_uri=tracking_uri)), quiet=True)
    metrics = MlflowClient(tracking_uri).get_run(logged["mlflow_run_id"]).data.metrics
    assert metrics["ngram_imbalance_per_pick/negatives/balanced"] == imb["balanced"]
    assert metrics["ngram_imbalance_per_pick/negatives/seeded_random"] == imb["seeded_random"]
