"""The one Markdown writer, the demo's results table and the paper's signs (pure, no Ray)."""
from __future__ import annotations

import pytest

from hardpos import report as R
from hardpos import signs as S


def test_table_writes_escapes_and_checks_widths():
    assert R.table(["a", "b"], [[1, None], ["x|y", 0.5]]) == "| a | b |\n|---|---|\n| 1 |  |\n| x\\|y | 0.5 |"
    with pytest.raises(ValueError, match="row 0 has 1 cells, the header 2"):
        R.table(["a", "b"], [[1]])


def _row(**cells) -> dict[str, float]:
    """A demo row: every REPLACE/SWAP/subset figure 0.5, then ``cells`` (dots for slashes)."""
    row = {c: 0.5 for c in R.COLUMNS + R.SUBSET_COLUMNS}
    row.update({k.replace("__", "/"): v for k, v in cells.items()})
    return row


def _paper_rows() -> dict[str, dict[str, float]]:
    """Rows in which every sign 1-5 holds on REPLACE and SWAP."""
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


def _by_claim(signs):
    return {(s.sign, s.claim, s.benchmark): s for s in signs}


def test_every_sign_holds_on_paper_like_rows():
    signs = S.paper_signs(_paper_rows())
    assert len(signs) == 2 + 5 * 2 + 4 * 2  # 1 per subset; 2-4 (5 claims) and 5 (4 claims) on REPLACE and SWAP
    assert all(s.held for s in signs), [s.line() for s in signs if not s.held]
    got = _by_claim(signs)
    drop = got[("3", "HN-only drops more from orig to aug than base", "REPLACE")]
    assert drop.line() == "HN-only drops more from orig to aug than base (REPLACE): held (+15.0; paper +3.4)"
    assert got[("1", "base relation orig in [60, 85]", "REPLACE")].line() == "base relation orig in [60, 85] (REPLACE): held (65.0)"
    assert got[("2", "HN-only orig above captions-only", "SWAP")].line() == "HN-only orig above captions-only (SWAP): held (+9.0)"
    lowest = got[("5", "w_neg=0 lowest orig of the grid and HN-only", "REPLACE")]
    # the paper's margin is to its own closest among the same models (w_neg=0.5: 67.3 vs 58.5)
    assert (lowest.versus, lowest.value, lowest.paper) == ("w_neg=0.5", pytest.approx(-8.0), pytest.approx(-8.8))
    brittle = got[("5", "HN-only most brittle of the grid", "SWAP")]
    assert brittle.line() == "HN-only most brittle of the grid (SWAP): held (+6.0 vs w_neg=0.5)"


@pytest.mark.parametrize("model, cell, value, sign, claim, bench", [
    ("pretrained", "world_replace_attribute/orig_acc", 0.97, "1", "base attribute orig in [60, 85]", "REPLACE"),
    ("pretrained", "world_replace_relation/orig_acc", 0.50, "1", "base relation orig in [60, 85]", "REPLACE"),
    ("captions-only", "swap/orig_acc", 0.72, "2", "HN-only orig above captions-only", "SWAP"),  # equal is not above
    ("pretrained", "replace/aug_acc", 0.34, "3", "HN-only drops more from orig to aug than base", "REPLACE"),
    ("hp+hn", "swap/aug_acc", 0.40, "4", "HP+HN aug above HN-only", "SWAP"),
    ("hp+hn", "replace/brittleness", 0.25, "4", "HP+HN less brittle than HN-only", "REPLACE"),
    ("w_neg=1", "swap/orig_acc", 0.59, "5", "orig at w_neg=1 above w_neg=0", "SWAP"),
    ("w_neg=0.5", "replace/orig_acc", 0.58, "5", "w_neg=0 lowest orig of the grid and HN-only", "REPLACE"),
    ("w_neg=0.5", "swap/orig_acc", 0.73, "5", "HN-only highest orig of the grid", "SWAP"),
    ("w_neg=0", "replace/brittleness", 0.21, "5", "HN-only most brittle of the grid", "REPLACE"),
])
def test_each_sign_fails_alone(model, cell, value, sign, claim, bench):
    rows = _paper_rows()
    rows[model][cell] = value
    failed = [(s.sign, s.claim, s.benchmark) for s in S.paper_signs(rows) if not s.held]
    expected = [(sign, claim, bench)]
    if claim == "orig at w_neg=1 above w_neg=0":  # then w_neg=0 is not the lowest either
        expected.append(("5", "w_neg=0 lowest orig of the grid and HN-only", bench))
    assert failed == expected


def test_over_seeds_a_difference_must_beat_the_larger_std():
    rows = _paper_rows()  # HP+HN is 8 points less brittle than HN-only on REPLACE
    key = ("4", "HP+HN less brittle than HN-only", "REPLACE")
    spreads = {"hp+hn": {"replace/brittleness": 0.02}, "hn-only": {"replace/brittleness": 0.09}}
    sign = _by_claim(S.paper_signs(rows, spreads))[key]
    assert not sign.held and sign.noise == pytest.approx(9.0)
    assert sign.line() == "HP+HN less brittle than HN-only (REPLACE): not held (-8.0 ± 9.0; paper -4.1)"
    spreads["hn-only"]["replace/brittleness"] = 0.07
    assert _by_claim(S.paper_signs(rows, spreads))[key].held
    # the drop's noise without per-seed rows: the larger spread of its orig and aug cells
    drop = ("3", "HN-only drops more from orig to aug than base", "SWAP")
    assert _by_claim(S.paper_signs(rows, {"pretrained": {"swap/aug_acc": 0.13}}))[drop].noise == pytest.approx(13.0)
    assert not _by_claim(S.paper_signs(rows, {"pretrained": {"swap/aug_acc": 0.13}}))[drop].held


def test_signs_need_their_models_and_the_markdown_says_so():
    rows = _paper_rows()
    del rows["w_neg=0"], rows["w_neg=0.5"], rows["w_neg=1"]  # no --full grid: no sign 5
    signs = S.paper_signs(rows)
    assert {s.sign for s in signs} == {"1", "2", "3", "4"}
    del rows["captions-only"]
    assert [s for s in S.paper_signs(rows) if "captions-only" in s.claim] == []
    assert S.paper_signs({"hn-only": rows["hn-only"]}) == [] and S.signs_markdown([]) == ""
    md = R.markdown_table(rows, title="t")
    assert "The paper's signs in this run (10 of 10 held; margins in points, the paper's beside them):" in md
    assert "- (4) HP+HN aug above HN-only (SWAP): held (+8.0; paper +0.6)" in md
    assert "signs" not in R.markdown_table(rows, signs=False)
    spread = {m: {c: 0.001 for c in r} for m, r in rows.items()}
    assert "exceeds its std over seeds" in R.markdown_table(rows, spread)


def test_the_printed_table_keeps_the_papers_numbers_beside_the_testbeds():
    md = R.markdown_table(_paper_rows(), title="t")
    paper = md.split("The paper's numbers for these models")[1].split("Mean cosine")[0]
    assert "| CLIP ViT-B/32 | 61.6 | 46.8 | 23.2 | 60.5 | 49.6 | 21.7 |" in paper
    assert "| hn-only | 73.9 | 55.7 | 21.0 | 74.3 | 60.5 | 25.1 |" in paper
    assert "| w_neg=0.5 | 67.3 | 56.9 | 16.4 |  |  |  |" in paper  # Table 3 is REPLACE only
    assert "captions-only" not in paper  # the paper has no such row
    assert R.paper_markdown({"mine": {}, "w_neg=x": {}}) == ""  # no paper row, and no crash on a non-grid name
    assert S.paper_figures("HN-only", "swap") == (74.3, 60.5, 25.1) and S.paper_figures("w_neg=0.5", "swap") is None


def test_over_seeds_a_paired_difference_uses_the_std_of_the_per_seed_differences():
    # three seeds whose worlds differ in difficulty (every model 10 points lower in seed 1)
    # while HP+HN is 3 +- 1 points less brittle than HN-only in each: the cells' spreads
    # (~5.8) hide the effect, the paired differences (std 1.0) do not
    base = _paper_rows()
    per_seed = []
    for shift, gap in ((0.0, 0.03), (-0.10, 0.02), (0.0, 0.04)):
        seed = {m: dict(r) for m, r in base.items()}
        seed["hn-only"]["replace/brittleness"] = 0.20 + shift
        seed["hp+hn"]["replace/brittleness"] = 0.20 + shift - gap
        per_seed.append(seed)
    mean, std = R.aggregate(per_seed)
    key = ("4", "HP+HN less brittle than HN-only", "REPLACE")
    unpaired = _by_claim(S.paper_signs(mean, std))[key]
    assert not unpaired.held and unpaired.noise == pytest.approx(100 * std["hn-only"]["replace/brittleness"])
    paired = _by_claim(S.paper_signs(mean, std, per_seed=per_seed))[key]
    assert paired.held and paired.value == pytest.approx(-3.0) and paired.noise == pytest.approx(1.0)
    assert "- (4) HP+HN less brittle than HN-only (REPLACE): held (-3.0 ± 1.0; paper -4.1)" in R.markdown_table(
        mean, std, per_seed=per_seed)
    # and a consistent effect of the wrong sign fails however small the noise
    for seed in per_seed:
        seed["hp+hn"]["replace/brittleness"] = seed["hn-only"]["replace/brittleness"] + 0.01
    mean, std = R.aggregate(per_seed)
    assert not _by_claim(S.paper_signs(mean, std, per_seed=per_seed))[key].held


def _demo_rows() -> dict:
    figs = {"orig_acc": 0.62, "aug_acc": 0.45, "brittleness": 0.25}
    return {m: {f"{g}/{f}": v + 0.01 * i for g in ("replace", "swap") for f, v in figs.items()}
            for i, m in enumerate(["pretrained", "captions-only", "HN-only", "HP+HN"])}


def test_chart_shows_the_whole_title_and_the_papers_table1(tmp_path):
    """The demo's chart: a long title fits inside the figure (wrapped, not cut at the right
    edge), and the paper's Table 1 values stand beside the testbed's bars as hatched outlines."""
    title = ("HardPos demo (world seed 0, train seed 0; 6000 pretrain / 2000 finetune scenes; "
             "1200 pretrain + 300 finetune steps)")
    fig = R.chart_figure(_demo_rows(), title=title)
    fig.canvas.draw()
    suptitle = next(t for t in fig.texts if t.get_text().startswith("HardPos demo"))
    box = suptitle.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, (box, fig.bbox)
    assert " ".join(suptitle.get_text().split()) == title  # all of it, only wrapped
    labels = fig.legends[0].get_texts()
    assert [t.get_text() for t in labels].count("HN-only (paper, Table 1)") == 1
    hatched = [p for ax in fig.axes for p in ax.patches if p.get_hatch()]
    heights = sorted(round(p.get_height(), 1) for p in hatched)
    assert len(hatched) == 3 * 3 * 2  # 3 models of the paper x 3 figures x 2 benchmarks
    assert 73.9 in heights and 16.9 in heights and 21.7 in heights
    path = R.write_chart(_demo_rows(), str(tmp_path / "results.png"), title=title)
    # lazy: only this test reads the PNG back
    from PIL import Image

    assert Image.open(path).size[0] == 1000
