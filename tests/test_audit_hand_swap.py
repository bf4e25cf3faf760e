"""The hand audit of rule SWAP hard positives (docs/audits/swap_positives_*.tsv).

* held out: 120 NegCLIP captions (seed 2026) with the positive the engine picked, each labelled
  (0 wrong, 11 doubtful). The rows the engine still picks meet its bar (no wrong, at most 11 of
  120 doubtful): a regression report (tests/test_audit_hand.py), not a pin of the rows.
* dropped: the 13 positives the comma-list, compound, pronoun and place guards removed, each
  labelled with its reason (12 wrong, 1 ok: the rules' coverage cost); a wrong one is never
  emitted again and the validator refuses it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hardpos.audit.hand import Draw, audit_rates, produced_rows, read_audit, read_labelled, regression_report
from hardpos.rules.perturber import RulePerturber
from hardpos.rules.validate import validate

AUDITS = Path(__file__).resolve().parent.parent / "docs" / "audits"


@pytest.fixture(scope="module")
def rules():
    return RulePerturber(seed=0)


def test_the_heldout_swap_audit_meets_its_bar_and_so_do_the_rows_still_picked(rules):
    rows = read_audit(AUDITS / "swap_positives_heldout.tsv")
    rates = audit_rates(rows)
    assert rates["n"] == 120 and rates["wrong"] == 0 and rates["doubtful"] == 11 / 120
    labelled = read_labelled(AUDITS / "swap_positives_heldout.tsv")
    picked = produced_rows(Draw(sampler="rule_positives", source="negclip", seed=2026, n=120, kind="swap"),
                           labelled=labelled, perturber=rules)
    rep = regression_report(labelled, picked)["positive"]
    assert rep.wrong == 0 and rep.doubtful <= 11 and rep.still_share >= 0.5, rep
    assert all(r["slot"].startswith("conjuncts:") for r in picked)


def test_dropped_wrong_swap_positives_stay_dropped(rules):
    rows = read_audit(AUDITS / "swap_positives_dropped.tsv")
    assert len(rows) == 13 and [r["label"] for r in rows].count("wrong") == 12
    for r in rows:
        if r["label"] == "wrong":
            assert all(p.text != r["positive"] for p in rules.hard_positives(r["caption"])), r["caption"]
            assert validate(r["caption"], r["positive"], "swap").reason == "not_conjunct_swap"


def test_the_sampler_draws_swap_positives_and_names_a_bad_kind():
    from hardpos.audit.hand import sample_rule_positives

    caps = ["a cat and a dog on a bench", "a red car", "a man and a woman on a beach"]
    rows, stats = sample_rule_positives(caps, n=5, seed=1, kind="swap")
    assert {r["caption"] for r in rows} == {caps[0], caps[2]} and stats.coverage_all == 2 / 3
    assert all(r["slot"].startswith("conjuncts:") for r in rows)
    with pytest.raises(ValueError, match="kind must be 'replace' or 'swap', got 'add'"):
        sample_rule_positives(caps, kind="add")
