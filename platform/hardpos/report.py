"""Every table and plot HardPos writes, in one module.

* :func:`table` -- THE Markdown table writer (the evaluation report, the demo's results,
  the sweep/compare comparison and the measuring tools' tables all go through it);
* the demo's results (the paper's Table-1 layout): :func:`table_row` from the evaluate
  stage's metrics, :func:`markdown_table` (+ the paper's signs, :mod:`hardpos.signs`),
  :func:`aggregate` over seeds, :func:`write_chart`;
* the comparison of tracked runs (the paper's Table-3 layout): :func:`comparison_table`,
  :func:`tradeoff_plot`;
* the WiSE-FT curve of ``interpolate``: :func:`curve_plot`;
* the evaluate stage's files (:func:`write_outputs`), which a researcher can reuse:

  * ``scores.parquet``  one row per scored item: item_id, benchmark, subset, s_c, s_n, s_p
    (plus t_cp, t_cn, t_pn, the text-only cosines, when a benchmark is SugarCrepe++)
    (s_p null without a hard positive); the schema metadata records how each benchmark
    combines its subsets (so :func:`recompute_metrics` gives back the summary's figures)
    and the precision the scores were computed in (``hardpos.precision``).
  * ``report.md``       the precision the scores were computed in, the paper's Table 1
    layout (orig / aug per benchmark, then brittleness), mean scores (Table 2/9), per-subset
    and SugarCrepe per-category tables, retention, and the list of missing/corrupt images.
    Figures are percentages (x100); the tables are written by :func:`table`.
  * ``missing_images.json`` every image that could not be read, with the error and the
    number of items excluded because of it; ``rejected_rows.json`` annotation rows that
    could not become items.

Pure functions over plain dicts, apart from the files the write_* functions write (local or
s3://); matplotlib is imported only by the plotting functions (it is heavy, and Agg is forced
there: no display on a server or in CI).

Demo rows are models (the pretrained base and every finetuned variant); their columns are
:data:`COLUMNS`, fractions in [0, 1] for accuracies/brittleness (shown as percentages) and
raw cosine similarities for the mean scores. REPLACE is the unweighted mean of its
attribute and relation subsets, computed by :func:`hardpos.eval.metrics.mean_over` (the
evaluator's own REPLACE definition); SWAP is the world's swap benchmark.
"""
from __future__ import annotations

import html
import io
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from hardpos import signs as S
from hardpos import storage
from hardpos.eval import metrics as M
from hardpos.eval.metrics import TEXT_COLUMNS, TEXT_ONLY_ITEMS, TEXT_ONLY_METRIC, benchmark_metrics

if TYPE_CHECKING:
    from hardpos.eval.evaluator import EvalReport

# --------------------------------------------------------------------------- the writer


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (no trailing newline). Cells are written with ``str`` (None -> "");
    a ``|`` inside a cell is escaped so it cannot split the row. Raises ValueError when a
    row's length differs from the header's."""
    def cell(v: Any) -> str:
        return "" if v is None else str(v).replace("|", r"\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"table row {i} has {len(row)} cells, the header {len(header)}: {row!r}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def md_text(value: Any) -> str:
    """A user's text (a benchmark, subset, model or file name) as Markdown that shows it as
    written: HTML markup is escaped (``<script>`` is text, never an element) and so are the
    characters that would start code or a link."""
    text = html.escape(str(value), quote=False)
    return re.sub(r"([`\[\]])", r"\\\1", text)


def pct(value: float | None, spread: float | None = None) -> str:
    """A fraction as a percentage with one decimal ("-" for None/NaN), ``± spread`` when given."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.1f}" + ("" if spread is None else f" ± {100 * spread:.1f}")


def num(value: float | None, spread: float | None = None) -> str:
    """A raw number with three decimals ("-" for None/NaN), ``± spread`` when given."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.3f}" + ("" if spread is None else f" ± {spread:.3f}")


# --------------------------------------------------------------------------- the demo's results

#: (benchmark label, evaluate-stage metric prefixes averaged into it)
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("replace", ("world_replace_attribute", "world_replace_relation")),
    ("swap", ("world_swap",)),
)
FIGURES = ("orig_acc", "aug_acc", "brittleness", "mean_s_c", "mean_s_n", "mean_s_p")
#: every cell of the table: "<group>/<figure>"
COLUMNS = tuple(f"{g}/{f}" for g, _ in GROUPS for f in FIGURES)
#: the subsets, reported too (REPLACE attribute vs relation)
SUBSET_COLUMNS = tuple(f"{p}/{f}" for p in ("world_replace_attribute", "world_replace_relation")
                       for f in ("orig_acc", "aug_acc", "brittleness"))
#: what "best model" means in the demo: mean augmented accuracy over REPLACE and SWAP
#: (the sweep stage's default objective); ranked by :func:`hardpos.models.registry.rank`
OBJECTIVE = ("replace/aug_acc", "swap/aug_acc")
PERCENT = ("orig_acc", "aug_acc", "brittleness")


def table_row(metrics: Mapping[str, float]) -> dict[str, float]:
    """One model's row (:data:`COLUMNS` + :data:`SUBSET_COLUMNS` + ``objective``) from its
    evaluate-stage metrics. Raises KeyError naming the missing metric."""
    wanted = [f"{p}/{f}" for _, prefixes in GROUPS for p in prefixes for f in FIGURES] + list(SUBSET_COLUMNS)
    missing = [k for k in wanted if k not in metrics]
    if missing:
        raise KeyError(f"evaluate metrics lack {missing} (have {sorted(metrics)[:8]}...)")
    row: dict[str, float] = {}
    for group, prefixes in GROUPS:
        means = M.mean_over(metrics, prefixes)
        row.update({f"{group}/{f}": means[f] for f in FIGURES})
    row.update({col: float(metrics[col]) for col in SUBSET_COLUMNS})
    row["objective"] = sum(row[k] for k in OBJECTIVE) / len(OBJECTIVE)
    return row


def _cell(col: str, value: float | None, spread: float | None) -> str:
    return pct(value, spread) if col.rsplit("/", 1)[-1] in PERCENT else num(value, spread)


def _results(head: list[str], cols: list[str], rows: Mapping[str, Mapping[str, float]],
             spreads: Mapping[str, Mapping[str, float]]) -> str:
    return table(head, ([model] + [_cell(c, row.get(c), spreads.get(model, {}).get(c)) for c in cols]
                        for model, row in rows.items()))


def markdown_table(rows: Mapping[str, Mapping[str, float]], spreads: Mapping[str, Mapping[str, float]] | None = None,
                   *, title: str | None = None, signs: bool = True,
                   per_seed: Sequence[Mapping[str, Mapping[str, float]]] = (), floors: Mapping | None = None) -> str:
    """The demo's results as Markdown: the Table-1-style comparison, the mean scores, the
    REPLACE subsets and (``signs``) whether each of the paper's signs held in these rows
    (:func:`hardpos.signs.signs_markdown`; nothing when the rows lack the models it compares).

    ``rows``: model -> :func:`table_row`; ``spreads``: model -> same keys (std over seeds),
    shown as ``± x``; ``per_seed``: each seed's rows (``rows`` their mean), so the signs
    compare two models by a paired test over seeds; ``floors`` (a single run): the measured
    noise floors the margins must pass (:func:`hardpos.signs.load_floors`; see :mod:`hardpos.signs`).
    """
    spreads = spreads or {}
    out = [f"### {title}", ""] if title else []
    out.append(_results(["model", "REPLACE orig", "REPLACE aug", "REPLACE brittle", "SWAP orig", "SWAP aug", "SWAP brittle"],
                        [f"{g}/{f}" for g in ("replace", "swap") for f in PERCENT], rows, spreads))
    out += ["", paper_markdown(rows).rstrip("\n")]
    out += ["", "Mean cosine scores (true caption s_c, hard negative s_n, hard positive s_p):", ""]
    out.append(_results(["model", "REPLACE s_c", "REPLACE s_n", "REPLACE s_p", "SWAP s_c", "SWAP s_n", "SWAP s_p"],
                        [f"{g}/mean_s_{x}" for g in ("replace", "swap") for x in ("c", "n", "p")], rows, spreads))
    out += ["", "REPLACE subsets:", ""]
    out.append(_results(["model", "attribute orig", "attribute aug", "attribute brittle", "relation orig",
                         "relation aug", "relation brittle"], list(SUBSET_COLUMNS), rows, spreads))
    checks = (floors or {}).get("checks") if floors else None
    text = S.signs_markdown(S.paper_signs(rows, spreads, per_seed=per_seed, floors=checks),
                            S.sanity_checks(rows, spreads, per_seed=per_seed, floors=checks), floors=floors) if signs else ""
    if text:
        out += ["", text.rstrip("\n")]
    return "\n".join(out) + "\n"


def paper_markdown(rows: Mapping[str, Mapping[str, float]]) -> str:
    """The paper's own numbers for the models in ``rows`` (CLIP ViT-B/32 finetuned on COCO; %):
    Table 1 for the base, HN-only and HP+HN, Table 3 for the ``w_neg=<v>`` grid."""
    head = ["paper model", "REPLACE orig", "REPLACE aug", "REPLACE brittle", "SWAP orig", "SWAP aug", "SWAP brittle"]
    body = []
    for model in rows:
        rep, swap = S.paper_figures(model, "replace"), S.paper_figures(model, "swap")
        if rep or swap:
            body.append(["CLIP ViT-B/32" if model.lower() == "pretrained" else model,
                         *(rep or (None,) * 3), *(swap or (None,) * 3)])
    if not body:
        return ""
    return ("The paper's numbers for these models (CLIP ViT-B/32 finetuned on COCO, %; Table 1, and Table 3 "
            "for the w_neg grid):\n\n" + table(head, body) + "\n")


def aggregate(per_seed: Sequence[Mapping[str, Mapping[str, float]]]) -> tuple[dict, dict]:
    """Mean and (sample) standard deviation over seeds: (model -> col -> mean, model -> col -> std).

    Models present in every seed only; std is 0.0 for a single seed."""
    if not per_seed:
        raise ValueError("no seeds to aggregate")
    models = [m for m in per_seed[0] if all(m in s for s in per_seed)]
    mean: dict[str, dict[str, float]] = {}
    std: dict[str, dict[str, float]] = {}
    for m in models:
        cols = [c for c in per_seed[0][m] if all(c in s[m] for s in per_seed)]
        mean[m], std[m] = {}, {}
        for c in cols:
            vals = [float(s[m][c]) for s in per_seed]
            mu = sum(vals) / len(vals)
            mean[m][c] = mu
            std[m][c] = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return mean, std


CHART_FIGURES = (("orig_acc", "original acc."), ("aug_acc", "augmented acc."), ("brittleness", "brittleness"))
#: characters per title line: a 10-inch figure's suptitle at 11 pt holds about this many
TITLE_WRAP = 95


def chart_figure(rows: Mapping[str, Mapping[str, float]], spreads: Mapping[str, Mapping[str, float]] | None = None,
                 *, title: str = "HardPos on the synthetic world", paper: Mapping[str, Mapping[str, Sequence[float]]] | None = None):
    """The matplotlib Figure :func:`write_chart` saves: per benchmark (REPLACE, SWAP), grouped
    bars of original accuracy, augmented accuracy and brittleness for every model (error bars =
    ``spreads``), and beside a model the paper reports, its Table 1 value as a hatched outline
    (``paper``: default :data:`hardpos.signs.PAPER_TABLE1`, matched case-insensitively; {} for none). The full title, wrapped."""
    # lazy: matplotlib is an optional, heavy plotting dependency only the chart writers need
    import matplotlib

    matplotlib.use("Agg")
    # lazy: pyplot after the Agg backend is chosen
    # lazy: only the title needs it
    import textwrap

    import matplotlib.pyplot as plt

    spreads = spreads or {}
    paper = {k.lower(): v for k, v in (S.PAPER_TABLE1 if paper is None else paper).items()}
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


# --------------------------------------------------------------------------- comparison of tracked runs

#: Table 3 of the paper: the loss weights, then accuracy and brittleness per benchmark.
COMPARISON_COLUMNS = [
    ("run", "run_name"),
    ("w_pos", "param:loss.w_pos"),
    ("w_neg", "param:loss.w_neg"),
    ("objective", "objective"),
    ("REPLACE orig", "replace/orig_acc"),
    ("REPLACE aug", "replace/aug_acc"),
    ("REPLACE brittle", "replace/brittleness"),
    ("SWAP orig", "swap/orig_acc"),
    ("SWAP aug", "swap/aug_acc"),
    ("SWAP brittle", "swap/brittleness"),
]


#: Marks a REPLACE figure of a model trained on the REPLACE benchmark's own substitutions.
SEEN_MARK = "(seen)"


def comparison_columns(rows: list[dict[str, Any]], columns=COMPARISON_COLUMNS) -> list[tuple[str, str]]:
    """The default columns some row has, plus every other ``<benchmark>/aug_acc|brittleness``."""
    present = [(h, k) for h, k in columns if any(k in r for r in rows)]
    known = {k for _, k in present}
    extra = sorted({k for r in rows for k in r if k.endswith(("/aug_acc", "/brittleness")) and k.count("/") == 1 and k not in known})
    return present + [(k, k) for k in extra]


def _comparison_cell(key: str, value: Any) -> str:
    """Fractions as percentages; parameters, loss terms and mean scores as numbers."""
    if isinstance(value, float) and not key.startswith(("param:", "loss.")) and "mean_s" not in key:
        return f"{100 * value:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def comparison_table(rows: list[dict[str, Any]], pareto: list[int] | None = None,
                     columns: list[tuple[str, str]] | None = None) -> str:
    """Runs (:func:`hardpos.stages.compare.collect_runs` rows) in the paper's Table-3 layout;
    ``pareto``: indices of the rows on the Pareto front (a "Pareto" column marks them);
    ``columns``: [(header, key)] (default: :func:`comparison_columns`)."""
    cols = list(columns) if columns is not None else comparison_columns(rows)
    if pareto is not None:
        rows = [{**r, "pareto": "yes" if i in pareto else ""} for i, r in enumerate(rows)]
        cols.append(("Pareto", "pareto"))

    def cell(key: str, row: dict[str, Any]) -> str:
        text = _comparison_cell(key, row.get(key))
        # a REPLACE figure of a model trained on REPLACE's own substitutions is contaminated
        if text and key.startswith("replace") and row.get("seen_substitutions"):
            text += " " + SEEN_MARK
        return text

    out = table([h for h, _ in cols], ([cell(k, r) for _, k in cols] for r in rows))
    if any(r.get("seen_substitutions") for r in rows):
        out += f"\n\n{SEEN_MARK} seen substitutions: trained on hard positives made with the REPLACE benchmark's own " \
               "substitution table (`include_benchmark_pairs`), so these REPLACE numbers are contaminated.\n"
    return out


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


# --------------------------------------------------------------------------- the evaluate stage's files
SCORES_FILE = "scores.parquet"
REPORT_FILE = "report.md"


def _is_count(key: str) -> bool:
    """Retention keys that are counts (``.../n_images``, ``.../n_missing_images`` ...), not fractions."""
    return key.rsplit("/", 1)[-1].startswith("n_")


def markdown_report(report: EvalReport, model_name: str = "model", retention: Mapping[str, float] | None = None,
                    *, device: str | None = None) -> str:
    """The Markdown report (tables in the paper's layout; values in percent). The first
    line under the title says which precision (``report.precision``) the scores were
    computed in, and on which ``device`` when given."""
    m = report.metrics
    model_name = md_text(model_name)
    # A benchmark with hard positives stays in their tables when no item could be scored
    # (all images missing): its row then says so, beside what needs no image.
    pos = [r for r in report.results if f"{r.name}/aug_acc" in m or (getattr(r, "has_positives", False) and not r.item_ids)]
    neg_only = [r for r in report.results if r not in pos]
    where = f" on {device}" if device else ""
    note = ("" if report.precision == "fp32" else
            " (autocast: scores move by ~1e-3 against fp32, enough to flip close decisions; ties count against the model)")
    parts = [f"# Evaluation: {model_name}", "", f"Scores computed in {report.precision}{where}{note}.", ""]
    if pos:
        header = ["model"]
        row = [model_name]
        for r in pos:
            header += [f"{md_text(r.name)} orig", f"{md_text(r.name)} aug"]
            row += [pct(m.get(f"{r.name}/orig_acc")), pct(m.get(f"{r.name}/aug_acc"))]
        for r in pos:
            header.append(f"{md_text(r.name)} brittle")
            row.append(pct(m.get(f"{r.name}/brittleness")))
        parts += ["## Original / augmented accuracy and brittleness (%, Table 1 layout)", "",
                  "Chance: 50 / 33.3 / 33.3. aug = caption and hard positive both beat the hard negative; "
                  "brittle = the hard negative lies strictly between them.", "", table(header, [row]), ""]
        rows = [[md_text(r.name), num(m.get(f"{r.name}/mean_s_c")), num(m.get(f"{r.name}/mean_s_n")),
                 num(m.get(f"{r.name}/mean_s_p")), pct(m.get(f"{r.name}/aug_drop")), str(int(m.get(f"{r.name}/n_items", 0))),
                 _excluded(r)] for r in pos]
        parts += ["## Mean cosine scores", "", table(["benchmark", "mean s_c", "mean s_n", "mean s_p", "aug - orig (pts)", "items",
                                                      "excluded (image missing)"], rows), ""]
    sub_rows = []
    for r in report.results:
        for sub in dict.fromkeys(r.subsets):
            key = f"{r.name}/{sub}"
            if f"{key}/orig_acc" in m:
                sub_rows.append([md_text(r.name), md_text(sub), pct(m.get(f"{key}/orig_acc")), pct(m.get(f"{key}/aug_acc")),
                                 pct(m.get(f"{key}/brittleness")), num(m.get(f"{key}/mean_s_c")), num(m.get(f"{key}/mean_s_n")),
                                 num(m.get(f"{key}/mean_s_p")), str(int(m[f"{key}/n_items"]))])
    if sub_rows:
        parts += ["## Per subset / category", "",
                  table(["benchmark", "subset", "orig", "aug", "brittle", "mean s_c", "mean s_n", "mean s_p", "items"], sub_rows), ""]
    parts += text_only_section(report.results, m)  # SugarCrepe++'s text-only task, when evaluated
    if neg_only:
        rows = [[md_text(r.name), pct(m.get(f"{r.name}/orig_acc")), str(int(m.get(f"{r.name}/n_items", 0))), _excluded(r)]
                for r in neg_only]
        parts += ["## Benchmarks without hard positives (original accuracy, %)", "",
                  table(["benchmark", "orig", "items", "excluded (image missing)"], rows), ""]
    if retention:
        rows = [[md_text(k), str(int(v)) if _is_count(k) else pct(v)] for k, v in sorted(retention.items())]
        parts += ["## Retention (zero-shot classification, retrieval; %)", "", table(["metric", "value"], rows), ""]
    missing = [(r.name, mi) for r in report.results for mi in r.missing_images]
    parts += ["## Missing or corrupt images", ""]
    if missing:
        parts.append(f"{len(missing)} image(s) could not be read; their items are excluded from every figure above "
                     "that needs an image (the text-only task needs none and covers them).")
        parts.append("")
        for name, mi in missing[:50]:
            parts.append(f"- {md_text(name)}: {md_text(mi['image'])} ({md_text(mi['error'])}; {mi['n_items']} item(s))")
        if len(missing) > 50:
            parts.append(f"- ... {len(missing) - 50} more in missing_images.json")
    else:
        parts.append("None: every item was scored.")
    parts.append("")
    return "\n".join(parts)


def write_scores(report: EvalReport, uri: str) -> str:
    """Per-item scores as parquet (local or s3://)."""
    buf = io.BytesIO()
    pq.write_table(report.scores_table(), buf)
    return storage.write_bytes(uri, buf.getvalue())


def recompute_metrics(scores: Any) -> dict[str, float]:
    """Every benchmark's figures from a per-item scores file (path/URI) or pyarrow Table,
    using the same pure function as the evaluator; equals the summary's metrics (minus
    the missing-image counts, which the per-item file cannot know, and, when images were
    missing, the text-only figures, which cover items the file has no row for)."""
    if isinstance(scores, str):
        scores = pq.read_table(io.BytesIO(storage.read_bytes(scores)))
    meta = json.loads((scores.schema.metadata or {}).get(b"hardpos.aggregate", b"{}"))
    cols = scores.to_pydict()
    out: dict[str, float] = {}
    bench = np.asarray(cols["benchmark"], dtype=object)
    for name in dict.fromkeys(cols["benchmark"]):
        sel = bench == name
        s_p = np.array([np.nan if v is None else v for v in np.asarray(cols["s_p"], dtype=object)[sel]], dtype=np.float64)
        out.update(benchmark_metrics(name, np.asarray(cols["subset"], dtype=object)[sel].tolist(),
                                     np.asarray(cols["s_c"])[sel], np.asarray(cols["s_n"])[sel], s_p,
                                     meta.get(name, "pooled"), text_sims=_text_sims(cols, sel)))
    return out


def _text_sims(cols: Mapping[str, list], sel: Any) -> dict[str, Any] | None:
    """The selected rows' text-only cosines, when the file has them for those rows."""
    if not all(k in cols for k in TEXT_COLUMNS):
        return None
    text = {k: np.asarray(cols[k], dtype=object)[sel] for k in TEXT_COLUMNS}
    if any(v is None for v in text[TEXT_COLUMNS[0]]):
        return None
    return {k: v.astype(np.float64) for k, v in text.items()}


def write_outputs(report: EvalReport, output_dir: str, *, model_name: str = "model",
                  retention: Mapping[str, float] | None = None, device: str | None = None) -> dict[str, str]:
    """Write scores.parquet, report.md, missing_images.json, rejected_rows.json under
    ``output_dir`` (local or s3://); returns ``{kind: uri}``."""
    paths = {
        "scores": write_scores(report, storage.join(output_dir, SCORES_FILE)),
        "report": storage.write_text(storage.join(output_dir, REPORT_FILE), markdown_report(report, model_name, retention, device=device)),
        "missing_images": storage.write_json(storage.join(output_dir, "missing_images.json"),
                                             {r.name: r.missing_images for r in report.results}),
        "rejected_rows": storage.write_json(storage.join(output_dir, "rejected_rows.json"),
                                            {r.name: r.rejected_rows for r in report.results}),
    }
    return paths


def _excluded(result: Any) -> str:
    """A benchmark's items left out of the image figures, with the images that caused it."""
    n_items, n_images = len(result.excluded_items), len(result.missing_images)
    return "0" if not n_items else f"{n_items} ({n_images} image(s))"


def text_only_section(results: Sequence[Any], metrics: Mapping[str, float]) -> list[str]:
    """report.md lines for the text-only task of every benchmark that has one: per category
    and overall, in percent, with the items each figure covers and how many of them had no
    image (empty when none has). ``results`` are the evaluator's BenchmarkResults (``.name``,
    ``.subsets``, ``.excluded_items``, ``.missing_images``); the categories come from the
    metric keys, so a benchmark with no scored item (all images missing) still has its rows."""
    rows = []
    for r in results:
        if f"{r.name}/{TEXT_ONLY_METRIC}" not in metrics:
            continue
        prefix = f"{r.name}/"
        subsets = [k[len(prefix):-len(TEXT_ONLY_METRIC) - 1] for k in metrics
                   if k.startswith(prefix) and k.endswith(f"/{TEXT_ONLY_METRIC}") and k != f"{prefix}{TEXT_ONLY_METRIC}"]
        for sub in subsets:
            rows.append([md_text(r.name), md_text(sub), pct(metrics[f"{prefix}{sub}/{TEXT_ONLY_METRIC}"]), "", ""])
        n = metrics.get(f"{prefix}{TEXT_ONLY_ITEMS}")
        rows.append([md_text(r.name), "all (mean of categories)", pct(metrics[f"{prefix}{TEXT_ONLY_METRIC}"]),
                     "" if n is None else str(int(n)), _excluded(r)])
    if not rows:
        return []
    return ["## Text-only task (SugarCrepe++ TOT, %)", "",
            "The text encoder alone: correct when the two positives are closer to each other than either "
            "is to the hard negative (strict). A random ordering scores 33.3; lexical overlap pulls the other way "
            "(the negative shares the caption's words, the paraphrase does not). It needs no image: it covers "
            "every item, those whose image is missing included.", "",
            table(["benchmark", "category", "text-only acc", "items", "image missing (excluded from image figures)"], rows), ""]
