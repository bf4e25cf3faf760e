"""The paper's package: the demo's results in the Table-1 layout and the paper's signs (pure, no Ray)."""
from __future__ import annotations

import pytest

from hardpos.paper import signs, table1


def _row(**cells) -> dict[str, float]:
    """A demo row: every REPLACE/SWAP/subset figure 0.5, then ``cells`` (dots for slashes)."""
    row = {c: 0.5 for c in table1.COLUMNS + table1.SUBSET_COLUMNS}
    row.update({k.replace("__", "/"): v for k, v in cells.items()})
    return row


def _paper_rows() -> dict[str, dict[str, float]]:
    """Rows in which every sign 1-4 and both sanity checks hold on REPLACE and SWAP."""
    return {
        "pretrained": _row(world_replace_attribute__orig_acc=0.70, world_replace_relation__orig_acc=0.65,
                           replace__orig_acc=0.60, swap__orig_acc=0.60, replace__aug_acc=0.50, swap__aug_acc=0.50,
                           replace__brittleness=0.10, swap__brittleness=0.10),
        "captions-only": _row(replace__orig_acc=0.62, swap__orig_acc=0.63),
        # drop orig - aug: 0.25 and 0.22 (base: 0.10 and 0.10)
        "hn-only": _row(replace__orig_acc=0.75, swap__orig_acc=0.72, replace__brittleness=0.20, swap__brittleness=0.18,
                        replace__aug_acc=0.50, swap__aug_acc=0.50),
        "hp+hn": _row(replace__aug_acc=0.60, swap__aug_acc=0.58, replace__brittleness=0.12, swap__brittleness=0.11),
        "w_neg=0": _row(replace__orig_acc=0.58, swap__orig_acc=0.60, replace__brittleness=0.10, swap__brittleness=0.10),
        "w_neg=0.5": _row(replace__orig_acc=0.66, swap__orig_acc=0.66, replace__brittleness=0.12, swap__brittleness=0.12),
        "w_neg=1": _row(replace__orig_acc=0.70, swap__orig_acc=0.70, replace__brittleness=0.12, swap__brittleness=0.11),
    }


def _by_claim(found):
    return {(s.sign, s.claim, s.benchmark): s for s in found}


def test_every_sign_holds_on_paper_like_rows():
    found = signs.paper_signs(_paper_rows())
    assert len(found) == 4 * 2 + 4 * 2  # 1-3 (4 claims) and 4 (4 claims) on REPLACE and SWAP
    assert all(s.held for s in found), [s.line() for s in found if not s.held]
    got = _by_claim(found)
    drop = got[("2", "HN-only drops more from orig to aug than base", "REPLACE")]
    assert drop.line() == "HN-only drops more from orig to aug than base (REPLACE): held (+15.0; paper +3.4)"
    lowest = got[("4", "w_neg=0 lowest orig of the grid and HN-only", "REPLACE")]
    # the paper's margin is to its own closest among the same models (w_neg=0.5: 67.3 vs 58.5)
    assert (lowest.versus, lowest.value, lowest.paper) == ("w_neg=0.5", pytest.approx(-8.0), pytest.approx(-8.8))
    brittle = got[("4", "HN-only most brittle of the grid", "SWAP")]
    # Table 3 on SWAP: HN-only 25.1 against w_neg = 0's 25.0
    assert brittle.line() == "HN-only most brittle of the grid (SWAP): held (+6.0 vs w_neg=0.5; paper +0.1)"
    # the testbed's sanity checks are not among the paper's signs; they are listed apart
    assert not [s for s in found if "captions-only" in s.claim or "base relation" in s.claim]
    sanity = _by_claim(signs.sanity_checks(_paper_rows()))
    assert sanity[("S1", "base relation orig in [60, 85]", "REPLACE")].line() == \
        "base relation orig in [60, 85] (REPLACE): held (65.0)"
    assert sanity[("S2", "HN-only orig above captions-only", "SWAP")].line() == \
        "HN-only orig above captions-only (SWAP): held (+9.0)"


@pytest.mark.parametrize("model, cell, value, sign, claim, bench", [
    ("pretrained", "world_replace_attribute/orig_acc", 0.97, "S1", "base attribute orig in [60, 85]", "REPLACE"),
    ("pretrained", "world_replace_relation/orig_acc", 0.50, "S1", "base relation orig in [60, 85]", "REPLACE"),
    ("captions-only", "swap/orig_acc", 0.72, "S2", "HN-only orig above captions-only", "SWAP"),  # equal is not above
    ("pretrained", "replace/aug_acc", 0.34, "2", "HN-only drops more from orig to aug than base", "REPLACE"),
    ("hp+hn", "swap/aug_acc", 0.40, "3", "HP+HN aug above HN-only", "SWAP"),
    ("hp+hn", "replace/brittleness", 0.25, "3", "HP+HN less brittle than HN-only", "REPLACE"),
    ("w_neg=1", "swap/orig_acc", 0.59, "4", "orig at w_neg=1 above w_neg=0", "SWAP"),
    ("w_neg=0.5", "replace/orig_acc", 0.58, "4", "w_neg=0 lowest orig of the grid and HN-only", "REPLACE"),
    ("w_neg=0.5", "swap/orig_acc", 0.73, "4", "HN-only highest orig of the grid", "SWAP"),
    ("w_neg=0", "replace/brittleness", 0.21, "4", "HN-only most brittle of the grid", "REPLACE"),
])
def test_each_sign_fails_alone(model, cell, value, sign, claim, bench):
    rows = _paper_rows()
    rows[model][cell] = value
    failed = [(s.sign, s.claim, s.benchmark) for s in signs.paper_signs(rows) + signs.sanity_checks(rows) if not s.held]
    expected = [(sign, claim, bench)]
    if claim == "orig at w_neg=1 above w_neg=0":  # then w_neg=0 is not the lowest either
        expected.append(("4", "w_neg=0 lowest orig of the grid and HN-only", bench))
    assert failed == expected


def test_over_seeds_a_difference_must_beat_the_larger_std():
    rows = _paper_rows()  # HP+HN is 8 points less brittle than HN-only on REPLACE
    key = ("3", "HP+HN less brittle than HN-only", "REPLACE")
    spreads = {"hp+hn": {"replace/brittleness": 0.02}, "hn-only": {"replace/brittleness": 0.09}}
    sign = _by_claim(signs.paper_signs(rows, spreads))[key]
    assert not sign.held and sign.noise == pytest.approx(9.0)
    assert sign.line() == "HP+HN less brittle than HN-only (REPLACE): not held (-8.0 ± 9.0; paper -4.1)"
    spreads["hn-only"]["replace/brittleness"] = 0.07
    assert _by_claim(signs.paper_signs(rows, spreads))[key].held
    # the drop's noise without per-seed rows: the larger spread of its orig and aug cells
    drop = ("2", "HN-only drops more from orig to aug than base", "SWAP")
    assert _by_claim(signs.paper_signs(rows, {"pretrained": {"swap/aug_acc": 0.13}}))[drop].noise == pytest.approx(13.0)
    assert not _by_claim(signs.paper_signs(rows, {"pretrained": {"swap/aug_acc": 0.13}}))[drop].held


def test_signs_need_their_models_and_the_markdown_says_so():
    rows = _paper_rows()
    del rows["w_neg=0"], rows["w_neg=0.5"], rows["w_neg=1"]  # no --full grid: no sign 4
    found = signs.paper_signs(rows)
    assert {s.sign for s in found} == {"1", "2", "3"}
    del rows["captions-only"]
    assert [s for s in signs.sanity_checks(rows) if "captions-only" in s.claim] == []
    assert signs.paper_signs({"hn-only": rows["hn-only"]}) == [] and signs.signs_markdown([]) == ""
    md = table1.markdown_table(rows, title="t")
    assert "The paper's signs (Tables 1 and 3) in this run (8 of 8 held; margins in points" in md
    assert "- (3) HP+HN aug above HN-only (SWAP): held (+8.0; paper +0.6)" in md
    assert "The testbed's own sanity checks (not the paper's signs):" in md
    assert "- (S1) base attribute orig in [60, 85] (REPLACE): held (70.0)" in md
    assert "signs" not in table1.markdown_table(rows, signs=False)


def test_the_printed_table_keeps_the_papers_numbers_beside_the_testbeds():
    md = table1.markdown_table(_paper_rows(), title="t")
    paper = md.split("The paper's numbers for these models")[1].split("Mean cosine")[0]
    assert "| CLIP ViT-B/32 | 61.6 | 46.8 | 23.2 | 60.5 | 49.6 | 21.7 |" in paper
    assert "| hn-only | 73.9 | 55.7 | 21.0 | 74.3 | 60.5 | 25.1 |" in paper
    assert "| w_neg=0.5 | 67.3 | 56.9 | 16.4 | 72.5 | 60.5 | 22.8 |" in paper  # Table 3 on both benchmarks
    assert "| w_neg=0 | 58.5 | 49.8 | 15.8 | 64.1 | 51.2 | 25.0 |" in paper
    assert "captions-only" not in paper  # the paper has no such row
    assert table1.paper_markdown({"mine": {}, "w_neg=x": {}}) == ""  # no paper row, and no crash on a non-grid name
    assert signs.paper_figures("HN-only", "swap") == (74.3, 60.5, 25.1) and signs.paper_figures("w_neg=0.5", "swap") == (72.5, 60.5, 22.8)


def _seeds(gaps, shifts=None):
    """Per-seed rows where HP+HN is ``gap`` less brittle than HN-only on REPLACE (fractions)."""
    base = _paper_rows()
    out = []
    for i, gap in enumerate(gaps):
        shift = (shifts or [0.0] * len(gaps))[i]
        seed = {m: dict(r) for m, r in base.items()}
        seed["hn-only"]["replace/brittleness"] = 0.20 + shift
        seed["hp+hn"]["replace/brittleness"] = 0.20 + shift - gap
        out.append(seed)
    return out


def test_over_seeds_a_check_is_a_one_sided_paired_t_test():
    # three seeds whose worlds differ in difficulty (every model 10 points lower in seed 1)
    # while HP+HN is 3 +- 1 points less brittle than HN-only in each: the cells' spreads
    # (~5.8) hide the effect, the paired differences (std 1.0) do not: t = 3 / (1 / sqrt 3) = 5.20
    per_seed = _seeds([0.03, 0.02, 0.04], [0.0, -0.10, 0.0])
    mean, std = signs.aggregate(per_seed)
    key = ("3", "HP+HN less brittle than HN-only", "REPLACE")
    unpaired = _by_claim(signs.paper_signs(mean, std))[key]
    assert not unpaired.held and unpaired.noise == pytest.approx(100 * std["hn-only"]["replace/brittleness"])
    paired = _by_claim(signs.paper_signs(mean, std, per_seed=per_seed))[key]
    assert paired.held and paired.value == pytest.approx(-3.0) and paired.noise == pytest.approx(1.0)
    assert (paired.n, paired.t, paired.p) == (3, pytest.approx(-5.196, abs=1e-3), pytest.approx(0.01756, abs=1e-4))
    md = table1.markdown_table(mean, std, per_seed=per_seed)
    assert ("- (3) HP+HN less brittle than HN-only (REPLACE): held (-3.0 ± 1.0, t = -5.20, p = 0.018, n = 3; "
            "paper -4.1)") in md
    k = len(signs.paper_signs(mean, per_seed=per_seed))
    assert f"{k} checks, each a one-sided paired t-test over seeds at alpha = 0.05: if no effect were real, " \
           f"about {0.05 * k:.1f} of them would read" in md
    # the old rule (mean > std, t > 1.73 at 2 df) would call this held; the t-test at alpha 0.05 does not
    weak = _by_claim(signs.paper_signs(*signs.aggregate(_seeds([0.03, 0.001, 0.03])), per_seed=_seeds([0.03, 0.001, 0.03])))[key]
    assert -weak.value > weak.noise and not weak.held and weak.p > 0.05
    # and a consistent effect of the wrong sign fails however small the noise
    wrong = _seeds([-0.01, -0.011, -0.012])
    assert not _by_claim(signs.paper_signs(signs.aggregate(wrong)[0], per_seed=wrong))[key].held


def test_the_paired_test_needs_two_seeds():
    with pytest.raises(ValueError, match="at least 2"):
        signs.paired_test([1.0])


def test_one_run_is_judged_by_the_measured_noise_floor():
    per_seed = _seeds([0.03, 0.02, 0.04, 0.03, 0.03])
    floors = signs.floors_from(per_seed, source="test")
    key = "3|HP+HN less brittle than HN-only|REPLACE"
    assert floors["seeds"] == 5 and floors["checks"][key]["held"]
    assert floors["checks"][key]["floor"] == pytest.approx(1.645 * floors["checks"][key]["sd"], abs=1e-3)
    one = _paper_rows()  # HP+HN 8 points less brittle: beyond a ~1.2 floor
    got = _by_claim(signs.paper_signs(one, floors=floors["checks"]))
    assert got[("3", "HP+HN less brittle than HN-only", "REPLACE")].verdict == "held"
    one["hp+hn"]["replace/brittleness"] = 0.195  # 0.5 points: inside the floor
    sign = _by_claim(signs.paper_signs(one, floors=floors["checks"]))[("3", "HP+HN less brittle than HN-only", "REPLACE")]
    assert (sign.held, sign.verdict) == (False, "inside the noise")
    assert "inside the noise (-0.5, floor" in sign.line()
    # a check the seeds did not hold is never "held" in one run, whatever its margin
    floors["checks"][key]["held"] = False
    one["hp+hn"]["replace/brittleness"] = 0.10
    sign = _by_claim(signs.paper_signs(one, floors=floors["checks"]))[("3", "HP+HN less brittle than HN-only", "REPLACE")]
    assert (sign.held, sign.verdict) == (False, "not held over seeds")
    # a check without a floor cannot be told from noise in one run
    assert all(s.verdict == "no noise floor" for s in signs.paper_signs(one, floors={}))
    md = table1.markdown_table(_paper_rows(), floors=floors)
    assert "One run: a margin counts only beyond its noise floor (1.64 x the std" in md and "5 seeds of test" in md


def test_one_kind_positives_sign_table_1d():
    rows = _paper_rows()
    # REPLACE-only positives: 8 points less brittle than HN-only on REPLACE, 1 on SWAP
    rows["hp-replace+hn"] = _row(replace__brittleness=0.12, swap__brittleness=0.17)
    rows["hp-swap+hn"] = _row(replace__brittleness=0.19, swap__brittleness=0.12)
    got = _by_claim(signs.paper_signs(rows))
    rep = got[("5", "hp-replace+hn saves more brittleness on REPLACE than on the other benchmark", "REPLACE")]
    swp = got[("5", "hp-swap+hn saves more brittleness on SWAP than on the other benchmark", "SWAP")]
    assert (rep.held, rep.value, swp.held, swp.value) == (True, pytest.approx(7.0), True, pytest.approx(5.0))
    rows["hp-swap+hn"]["replace/brittleness"] = 0.10  # it saves more on REPLACE: improved invariance transferred
    assert not _by_claim(signs.paper_signs(rows))[("5", "hp-swap+hn saves more brittleness on SWAP than on the other "
                                                 "benchmark", "SWAP")].held


def test_the_shipped_noise_floors_name_exactly_the_checks_the_code_makes():
    floors = signs.load_floors()
    assert floors is not None and floors["seeds"] >= 5 and floors["alpha"] == signs.ALPHA
    rows = _paper_rows()  # with --full's one-kind-positive models, so sign 5's checks are made too
    rows["hp-replace+hn"] = _row(replace__brittleness=0.12, swap__brittleness=0.17)
    rows["hp-swap+hn"] = _row(replace__brittleness=0.19, swap__brittleness=0.12)
    made = {s.key for s in signs.paper_signs(rows) + signs.sanity_checks(rows) if s.kind != "range"}
    assert set(floors["checks"]) == made  # a renamed claim would orphan its floor
    for check in floors["checks"].values():
        assert check["floor"] == pytest.approx(signs.Z_ONE_SIDED * check["sd"], abs=1e-3)
