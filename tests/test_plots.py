"""The plots (matplotlib, Agg): the demo's chart of the paper's Table-1 layout."""
from __future__ import annotations

from hardpos import plots


def _demo_rows() -> dict:
    figs = {"orig_acc": 0.62, "aug_acc": 0.45, "brittleness": 0.25}
    return {m: {f"{g}/{f}": v + 0.01 * i for g in ("replace", "swap") for f, v in figs.items()}
            for i, m in enumerate(["pretrained", "captions-only", "HN-only", "HP+HN"])}


def test_chart_shows_the_whole_title_and_the_papers_table1(tmp_path):
    """The demo's chart: a long title fits inside the figure (wrapped, not cut at the right
    edge), and the paper's Table 1 values stand beside the testbed's bars as hatched outlines."""
    title = ("HardPos demo (world seed 0, train seed 0; 6000 pretrain / 2000 finetune scenes; "
             "1200 pretrain + 300 finetune steps)")
    fig = plots.chart_figure(_demo_rows(), title=title)
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
    path = plots.write_chart(_demo_rows(), str(tmp_path / "results.png"), title=title)
    # lazy: only this test reads the PNG back
    from PIL import Image

    assert Image.open(path).size[0] == 1000
