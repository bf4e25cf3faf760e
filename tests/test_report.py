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
    """Rows in which every sign (a)-(e) holds on REPLACE and SWAP."""
    return {
        "pretrained": _row(world_replace_attribute__orig_acc=0.70, world_replace_relation__orig_acc=0.65,
                           replace__orig_acc=0.60, swap__orig_acc=0.60, replace__brittleness=0.10, swap__brittleness=0.10),
        "hn-only": _row(replace__orig_acc=0.75, swap__orig_acc=0.72, replace__brittleness=0.20, swap__brittleness=0.18,
                        replace__aug_acc=0.50, swap__aug_acc=0.50),
        "hp+hn": _row(replace__aug_acc=0.60, swap__aug_acc=0.58, replace__brittleness=0.12, swap__brittleness=0.11),
        "w_neg=0": _row(replace__orig_acc=0.58, swap__orig_acc=0.60),
        "w_neg=1": _row(replace__orig_acc=0.70, swap__orig_acc=0.70),
    }


def _by_claim(signs):
    return {(s.sign, s.claim, s.benchmark): s for s in signs}


def test_every_sign_holds_on_paper_like_rows():
    signs = S.paper_signs(_paper_rows())
    assert len(signs) == 2 + 6 * 2  # (a) per subset; (b)-(e) on REPLACE and SWAP
    assert all(s.held for s in signs), [s.line() for s in signs if not s.held]
    got = _by_claim(signs)
    assert got[("c", "HN-only more brittle than base", "REPLACE")].line() == "HN-only more brittle than base (REPLACE): yes (+10.0)"
    assert got[("a", "base relation orig in [60, 85]", "REPLACE")].line() == "base relation orig in [60, 85] (REPLACE): yes (65.0)"
    assert got[("e", "w_neg=0 orig no better than base", "SWAP")].value == pytest.approx(0.0)  # equal: "no better" holds


@pytest.mark.parametrize("model, cell, value, sign, claim, bench", [
    ("pretrained", "world_replace_attribute/orig_acc", 0.97, "a", "base attribute orig in [60, 85]", "REPLACE"),
    ("pretrained", "world_replace_relation/orig_acc", 0.50, "a", "base relation orig in [60, 85]", "REPLACE"),
    ("hn-only", "replace/orig_acc", 0.60, "b", "HN-only orig above base", "REPLACE"),  # equal is not above
    ("pretrained", "swap/brittleness", 0.25, "c", "HN-only more brittle than base", "SWAP"),
    ("hp+hn", "swap/aug_acc", 0.40, "d", "HP+HN aug above HN-only", "SWAP"),
    ("hp+hn", "replace/brittleness", 0.25, "d", "HP+HN less brittle than HN-only", "REPLACE"),
    ("w_neg=1", "swap/orig_acc", 0.55, "e", "orig at w_neg=1 above w_neg=0", "SWAP"),
    ("w_neg=0", "replace/orig_acc", 0.61, "e", "w_neg=0 orig no better than base", "REPLACE"),
])
def test_each_sign_fails_alone(model, cell, value, sign, claim, bench):
    rows = _paper_rows()
    rows[model][cell] = value
    failed = [(s.sign, s.claim, s.benchmark) for s in S.paper_signs(rows) if not s.held]
    assert failed == [(sign, claim, bench)]


def test_over_seeds_a_difference_must_beat_the_larger_std():
    rows = _paper_rows()  # HN-only is 10 points more brittle than the base on REPLACE
    spreads = {"pretrained": {"replace/brittleness": 0.02}, "hn-only": {"replace/brittleness": 0.12}}
    sign = _by_claim(S.paper_signs(rows, spreads))[("c", "HN-only more brittle than base", "REPLACE")]
    assert not sign.held and sign.noise == pytest.approx(12.0)
    assert sign.line() == "HN-only more brittle than base (REPLACE): no (+10.0, std 12.0)"
    spreads["hn-only"]["replace/brittleness"] = 0.08
    assert _by_claim(S.paper_signs(rows, spreads))[("c", "HN-only more brittle than base", "REPLACE")].held
    # "no better than": fails only when the excess beats the std
    rows["w_neg=0"]["replace/orig_acc"] = 0.63
    key = ("e", "w_neg=0 orig no better than base", "REPLACE")
    assert not _by_claim(S.paper_signs(rows))[key].held
    assert _by_claim(S.paper_signs(rows, {"w_neg=0": {"replace/orig_acc": 0.05}}))[key].held


def test_signs_need_their_models_and_the_markdown_says_so():
    rows = _paper_rows()
    del rows["w_neg=0"], rows["w_neg=1"]  # no --full grid: no (e)
    signs = S.paper_signs(rows)
    assert {s.sign for s in signs} == {"a", "b", "c", "d"}
    assert S.paper_signs({"hn-only": rows["hn-only"]}) == [] and S.signs_markdown([]) == ""
    md = R.markdown_table(rows, title="t")
    assert "The paper's signs in this run (10 of 10 hold; margins in points):" in md
    assert "- (c) HN-only more brittle than base (SWAP): yes (+8.0)" in md
    assert "signs" not in R.markdown_table(rows, signs=False)
    spread = {m: {c: 0.001 for c in r} for m, r in rows.items()}
    assert "exceeds its std over seeds" in R.markdown_table(rows, spread)


def test_over_seeds_a_paired_difference_uses_the_std_of_the_per_seed_differences():
    # three seeds whose worlds differ in difficulty (every model 10 points lower in seed 1)
    # while HN-only is 3 +- 1 points more brittle than the base in each: the cells' spreads
    # (~5.8) hide the effect, the paired differences (std 1.0) do not
    base = _paper_rows()
    per_seed = []
    for shift, gap in ((0.0, 0.03), (-0.10, 0.02), (0.0, 0.04)):
        seed = {m: dict(r) for m, r in base.items()}
        seed["pretrained"]["replace/brittleness"] = 0.20 + shift
        seed["hn-only"]["replace/brittleness"] = 0.20 + shift + gap
        per_seed.append(seed)
    mean, std = R.aggregate(per_seed)
    key = ("c", "HN-only more brittle than base", "REPLACE")
    unpaired = _by_claim(S.paper_signs(mean, std))[key]
    assert not unpaired.held and unpaired.noise == pytest.approx(100 * std["hn-only"]["replace/brittleness"])
    paired = _by_claim(S.paper_signs(mean, std, per_seed=per_seed))[key]
    assert paired.held and paired.value == pytest.approx(3.0) and paired.noise == pytest.approx(1.0)
    assert "- (c) HN-only more brittle than base (REPLACE): yes (+3.0, std 1.0)" in R.markdown_table(
        mean, std, per_seed=per_seed)
    # and a consistent effect of the wrong sign fails however small the noise
    for seed in per_seed:
        seed["hn-only"]["replace/brittleness"] = seed["pretrained"]["replace/brittleness"] - 0.01
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
