"""The demo's result: the paper's Table-1-style comparison and a PNG chart.

Pure functions over the evaluate stage's metric dicts (``world_replace_attribute/orig_acc``
...), so the demo, the calibration tool and the tests share one definition:

* REPLACE = the unweighted mean of the attribute and relation subsets (DESIGN section 5),
  for every figure (accuracies, brittleness and mean scores);
* SWAP = the world's swap benchmark.

Rows are models (the pretrained base and every finetuned variant); columns are
:data:`COLUMNS`.  Values are fractions in [0, 1] for accuracies/brittleness and raw cosine
similarities for the mean scores; the Markdown shows percentages for the former.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

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
#: (the sweep stage's default objective)
OBJECTIVE = ("replace/aug_acc", "swap/aug_acc")
PERCENT = ("orig_acc", "aug_acc", "brittleness")


def table_row(metrics: Mapping[str, float]) -> dict[str, float]:
    """One model's row (:data:`COLUMNS` + :data:`SUBSET_COLUMNS` + ``objective``) from its
    evaluate-stage metrics. Raises KeyError naming the missing metric."""
    row: dict[str, float] = {}
    for group, prefixes in GROUPS:
        for fig in FIGURES:
            keys = [f"{p}/{fig}" for p in prefixes]
            missing = [k for k in keys if k not in metrics]
            if missing:
                raise KeyError(f"evaluate metrics lack {missing} (have {sorted(metrics)[:8]}...)")
            row[f"{group}/{fig}"] = sum(float(metrics[k]) for k in keys) / len(keys)
    for col in SUBSET_COLUMNS:
        row[col] = float(metrics[col])
    row["objective"] = sum(row[k] for k in OBJECTIVE) / len(OBJECTIVE)
    return row


def _fmt(col: str, value: float | None, spread: float | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    pct = col.rsplit("/", 1)[-1] in PERCENT
    text = f"{100 * value:.1f}" if pct else f"{value:.3f}"
    if spread is not None:
        text += f" ± {100 * spread:.1f}" if pct else f" ± {spread:.3f}"
    return text


def markdown_table(rows: Mapping[str, Mapping[str, float]], spreads: Mapping[str, Mapping[str, float]] | None = None,
                   *, title: str | None = None) -> str:
    """The Table-1-style comparison (+ the mean scores and the REPLACE subsets) as Markdown.

    ``rows``: model -> :func:`table_row`; ``spreads``: model -> same keys, shown as ``± x``.
    """
    spreads = spreads or {}
    out = [f"### {title}", ""] if title else []
    head = ["model", "REPLACE orig", "REPLACE aug", "REPLACE brittle", "SWAP orig", "SWAP aug", "SWAP brittle"]
    cols = ["replace/orig_acc", "replace/aug_acc", "replace/brittleness", "swap/orig_acc", "swap/aug_acc", "swap/brittleness"]
    out += _md(head, cols, rows, spreads)
    out += ["", "Mean cosine scores (true caption s_c, hard negative s_n, hard positive s_p):", ""]
    head = ["model", "REPLACE s_c", "REPLACE s_n", "REPLACE s_p", "SWAP s_c", "SWAP s_n", "SWAP s_p"]
    cols = [f"{g}/mean_s_{x}" for g in ("replace", "swap") for x in ("c", "n", "p")]
    out += _md(head, cols, rows, spreads)
    out += ["", "REPLACE subsets:", ""]
    head = ["model", "attribute orig", "attribute aug", "attribute brittle", "relation orig", "relation aug",
            "relation brittle"]
    out += _md(head, list(SUBSET_COLUMNS), rows, spreads)
    return "\n".join(out) + "\n"


def _md(head: list[str], cols: list[str], rows, spreads) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, row in rows.items():
        sp = spreads.get(model, {})
        lines.append("| " + " | ".join([model] + [_fmt(c, row.get(c), sp.get(c)) for c in cols]) + " |")
    return lines


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


def write_chart(rows: Mapping[str, Mapping[str, float]], path: str, spreads: Mapping[str, Mapping[str, float]] | None = None,
                *, title: str = "HardPos on the synthetic world") -> str:
    """A PNG: per benchmark (REPLACE, SWAP), grouped bars of original accuracy, augmented
    accuracy and brittleness for every model (error bars = ``spreads`` when given)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a server / in CI
    import matplotlib.pyplot as plt

    spreads = spreads or {}
    models = list(rows)
    figs = (("orig_acc", "original acc."), ("aug_acc", "augmented acc."), ("brittleness", "brittleness"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    width = 0.8 / max(1, len(models))
    for ax, (group, _) in zip(axes, GROUPS):
        for k, model in enumerate(models):
            xs = [i + (k - (len(models) - 1) / 2) * width for i in range(len(figs))]
            ys = [100 * rows[model][f"{group}/{f}"] for f, _ in figs]
            err = [100 * spreads.get(model, {}).get(f"{group}/{f}", 0.0) for f, _ in figs] if spreads else None
            bars = ax.bar(xs, ys, width, label=model, yerr=err, capsize=2 if err else 0)
            for b, y in zip(bars, ys):
                ax.text(b.get_x() + b.get_width() / 2, y + 1, f"{y:.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(figs)), [label for _, label in figs])
        ax.set_title(group.upper())
        ax.set_ylim(0, 110)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("%")
    axes[1].legend(fontsize=8, loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def best_model(rows: Mapping[str, Mapping[str, float]], candidates: Iterable[str] | None = None) -> str:
    """The model with the highest ``objective`` (ties: the first listed)."""
    names = list(candidates) if candidates is not None else list(rows)
    if not names:
        raise ValueError("no candidate models")
    return max(names, key=lambda m: (rows[m]["objective"], -names.index(m)))
