"""Every plot HardPos draws, as PNG files.

* the demo's results (the paper's Table-1 layout, :mod:`hardpos.paper.table1` rows):
  :func:`chart_figure`, saved by :func:`write_chart`;
* the comparison of tracked runs (the paper's Table-3 layout): :func:`tradeoff_plot`;
* the WiSE-FT curve of the ``interpolate`` stage: :func:`curve_panels`, :func:`curve_plot`.

matplotlib is imported only inside the plotting functions (it is heavy and an optional
dependency), and the Agg backend is forced there: no display on a server or in CI.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from hardpos.paper.figures import PAPER_TABLE1
from hardpos.paper.table1 import GROUPS

CHART_FIGURES = (("orig_acc", "original acc."), ("aug_acc", "augmented acc."), ("brittleness", "brittleness"))
#: characters per title line: a 10-inch figure's suptitle at 11 pt holds about this many
TITLE_WRAP = 95


def chart_figure(rows: Mapping[str, Mapping[str, float]], spreads: Mapping[str, Mapping[str, float]] | None = None,
                 *, title: str = "HardPos on the synthetic world", paper: Mapping[str, Mapping[str, Sequence[float]]] | None = None):
    """The matplotlib Figure :func:`write_chart` saves: per benchmark (REPLACE, SWAP), grouped
    bars of original accuracy, augmented accuracy and brittleness for every model (error bars =
    ``spreads``), and beside a model the paper reports, its Table 1 value as a hatched outline
    (``paper``: default :data:`hardpos.paper.figures.PAPER_TABLE1`, matched case-insensitively; {} for none). The full title, wrapped."""
    # lazy: matplotlib is an optional, heavy plotting dependency only the chart writers need
    import matplotlib

    matplotlib.use("Agg")
    # lazy: pyplot after the Agg backend is chosen
    # lazy: only the title needs it
    import textwrap

    import matplotlib.pyplot as plt

    spreads = spreads or {}
    paper = {k.lower(): v for k, v in (PAPER_TABLE1 if paper is None else paper).items()}
    models = list(rows)
    slots = [s for m in models for s in ([(m, False)] + ([(m, True)] if m.lower() in paper else []))]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.8), sharey=True)
    width = 0.84 / max(1, len(slots))
    colors = {m: f"C{i}" for i, m in enumerate(models)}
    for ax, (group, _) in zip(axes, GROUPS):
        for k, (model, from_paper) in enumerate(slots):
            xs = [i + (k - (len(slots) - 1) / 2) * width for i in range(len(CHART_FIGURES))]
            if from_paper:
                ys = [float(v) for v in paper[model.lower()][group]]
                bars = ax.bar(xs, ys, width, label=f"{model} (paper, Table 1)", facecolor="none",
                              edgecolor=colors[model], hatch="///", linewidth=1.0)
            else:
                ys = [100 * rows[model][f"{group}/{f}"] for f, _ in CHART_FIGURES]
                err = [100 * spreads.get(model, {}).get(f"{group}/{f}", 0.0) for f, _ in CHART_FIGURES] if spreads else None
                bars = ax.bar(xs, ys, width, label=model, color=colors[model], yerr=err, capsize=2 if err else 0)
            for b, y in zip(bars, ys):
                ax.text(b.get_x() + b.get_width() / 2, y + 1, f"{y:.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(CHART_FIGURES)), [label for _, label in CHART_FIGURES])
        ax.set_title(group.upper())
        ax.set_ylim(0, 110)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("%")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle("\n".join(textwrap.wrap(title, TITLE_WRAP)), fontsize=11)
    rows_of_legend = math.ceil(len(labels) / min(4, max(1, len(labels))))
    fig.tight_layout(rect=(0, 0.06 * rows_of_legend, 1, 1))
    return fig


def write_chart(rows: Mapping[str, Mapping[str, float]], path: str, spreads: Mapping[str, Mapping[str, float]] | None = None,
                *, title: str = "HardPos on the synthetic world",
                paper: Mapping[str, Mapping[str, Sequence[float]]] | None = None) -> str:
    """Save :func:`chart_figure` as a PNG at ``path`` (1,000 px wide: README width) -> ``path``."""
    # lazy: matplotlib is an optional, heavy plotting dependency only the chart writers need
    import matplotlib.pyplot as plt

    fig = chart_figure(rows, spreads, title=title, paper=paper)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def tradeoff_plot(rows: list[dict[str, Any]], path: str | Path, x: str = "param:loss.w_neg") -> Path | None:
    """Augmented accuracy and brittleness (REPLACE, SWAP, any ``*/aug_acc``) against ``x``.

    Only rows with a numeric ``x`` are plotted (the HN-only control has w_pos = 0 and is
    drawn as a separate marker). Returns None when nothing can be plotted.
    """
    # lazy: matplotlib is an optional, heavy plotting dependency only the chart writers need
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in rows if isinstance(r.get(x), float)]
    if not points:
        return None
    benches = sorted({k.split("/")[0] for r in points for k in r if k.endswith("/aug_acc") and k.count("/") == 1})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, ax in zip(("aug_acc", "brittleness"), axes):
        for bench in benches:
            key = f"{bench}/{name}"
            main = sorted((r[x], r[key]) for r in points if key in r and r.get("param:loss.w_pos", 1.0) != 0.0)
            ctrl = [(r[x], r[key]) for r in points if key in r and r.get("param:loss.w_pos", 1.0) == 0.0]
            if main:
                line, = ax.plot([p[0] for p in main], [100 * p[1] for p in main], marker="o", label=f"{bench} (w_pos=1)")
                if ctrl:
                    ax.scatter([p[0] for p in ctrl], [100 * p[1] for p in ctrl], marker="x", s=80, color=line.get_color(), label=f"{bench} HN-only")
        ax.set_xlabel("hard-negative weight w_neg")
        ax.set_ylabel(f"{name.replace('_', ' ')} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("Augmented accuracy (higher is better)")
    axes[1].set_title("Brittleness (lower is better)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_panels(columns: Sequence[tuple[str, str]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The WiSE-FT plot's panels, [(title, [(label, metric key)])], from the curve's columns:
    original and augmented accuracy (each benchmark's two lines), brittleness, retention;
    panels with nothing to draw are left out. Every title names exactly what it draws."""
    def accuracy(k: str) -> bool:
        return k.endswith(("/aug_acc", "/orig_acc")) and not k.startswith(("zeroshot/", "retrieval/"))

    panels = [(name, [(h, k) for h, k in columns if pred(k)]) for name, pred in (
        ("original and augmented accuracy (%)", accuracy),
        ("brittleness (%, lower is better)", lambda k: k.endswith("/brittleness")),
        ("retention (%)", lambda k: k.startswith(("zeroshot/", "retrieval/"))))]
    panels = [p for p in panels if p[1]]
    if panels and panels[0][0].startswith("original") and not any(k.endswith("/aug_acc") for _, k in panels[0][1]):
        panels[0] = ("original accuracy (%)", panels[0][1])  # no benchmark with hard positives
    return panels


def curve_plot(points: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], path: str, *, title: str) -> str:
    """PNG of a WiSE-FT curve (``interpolate``): :func:`curve_panels` against alpha (original
    accuracy dashed, augmented solid, in one colour per benchmark); ``points`` are
    ``{"alpha", "metrics"}``, ``columns`` (header, key)."""
    # lazy: matplotlib is an optional, heavy plotting dependency only the chart writers need
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = curve_panels(columns)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), squeeze=False)
    xs = [p["alpha"] for p in points]
    for ax, (name, cols) in zip(axes[0], panels):
        colours: dict[str, Any] = {}
        for header, key in cols:
            bench = key.rsplit("/", 1)[0]
            line, = ax.plot(xs, [100 * p["metrics"].get(key, float("nan")) for p in points], marker="o", label=header,
                            linestyle="--" if key.endswith("/orig_acc") else "-", color=colours.get(bench))
            colours.setdefault(bench, line.get_color())
        ax.set_xlabel("alpha (0 = base, 1 = finetuned)")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
