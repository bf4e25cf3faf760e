"""The demo's results in the paper's Table-1 layout: one row per model, from the evaluate stage's metrics.

:func:`table_row` turns a model's evaluate-stage metrics into its row; :func:`markdown_table`
writes the rows (the Table-1-style comparison, the mean scores and the REPLACE subsets);
:func:`paper_markdown` sets the paper's own numbers beside them. The mean and std over seeds
is :func:`hardpos.paper.figures.aggregate`;
the bar chart of the rows is :func:`hardpos.plots.write_chart`.

Rows are models (the pretrained base and every finetuned variant); their columns are
:data:`COLUMNS`, fractions in [0, 1] for accuracies/brittleness (shown as percentages) and
raw cosine similarities for the mean scores. REPLACE is the unweighted mean of its
attribute and relation subsets, computed by :func:`hardpos.eval.metrics.mean_over` (the
evaluator's own REPLACE definition); SWAP is the world's swap benchmark. Pure functions.
"""
from __future__ import annotations

from typing import Mapping

from hardpos.eval.metrics import mean_over
from hardpos.markdown import num, pct, table
from hardpos.paper.figures import paper_figures

#: (benchmark label, evaluate-stage metric prefixes averaged into it)
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("replace", ("world_replace_attribute", "world_replace_relation")),
    ("swap", ("world_swap",)),
)
FIGURES = ("orig_acc", "aug_acc", "brittleness", "mean_s_c", "mean_s_n", "mean_s_p")
#: every cell of the table: "<group>/<figure>"
COLUMNS = tuple(f"{g}/{f}" for g, _ in GROUPS for f in FIGURES)
#: REPLACE again with the synonyms finetuning saw (the same items; REPLACE's own positives
#: are synonyms it never saw): reported beside REPLACE when the metrics have it
SEEN_GROUP = ("replace_seen", ("world_replace_attribute_seen", "world_replace_relation_seen"))
#: the subsets, reported too (REPLACE attribute vs relation)
SUBSET_COLUMNS = tuple(f"{p}/{f}" for p in ("world_replace_attribute", "world_replace_relation")
                       for f in ("orig_acc", "aug_acc", "brittleness"))
#: what "best model" means in the demo: mean augmented accuracy over REPLACE and SWAP
#: (the sweep stage's default objective); ranked by :func:`hardpos.models.registry.rank`
OBJECTIVE = ("replace/aug_acc", "swap/aug_acc")
PERCENT = ("orig_acc", "aug_acc", "brittleness")


def table_row(metrics: Mapping[str, float]) -> dict[str, float]:
    """One model's row (:data:`COLUMNS` + :data:`SUBSET_COLUMNS` + ``objective``, and
    :data:`SEEN_GROUP`'s ``replace_seen/<figure>`` where the metrics hold it) from its
    evaluate-stage metrics. Raises KeyError naming the missing metric."""
    wanted = [f"{p}/{f}" for _, prefixes in GROUPS for p in prefixes for f in FIGURES] + list(SUBSET_COLUMNS)
    missing = [k for k in wanted if k not in metrics]
    if missing:
        raise KeyError(f"evaluate metrics lack {missing} (have {sorted(metrics)[:8]}...)")
    row: dict[str, float] = {}
    for group, prefixes in GROUPS:
        means = mean_over(metrics, prefixes)
        row.update({f"{group}/{f}": means[f] for f in FIGURES})
    row.update({col: float(metrics[col]) for col in SUBSET_COLUMNS})
    group, prefixes = SEEN_GROUP
    if all(f"{p}/{f}" in metrics for p in prefixes for f in FIGURES):  # worlds made before the split lack it
        means = mean_over(metrics, prefixes)
        row.update({f"{group}/{f}": means[f] for f in FIGURES})
    row["objective"] = sum(row[k] for k in OBJECTIVE) / len(OBJECTIVE)
    return row


def _cell(col: str, value: float | None, spread: float | None) -> str:
    return pct(value, spread) if col.rsplit("/", 1)[-1] in PERCENT else num(value, spread)


def _results(head: list[str], cols: list[str], rows: Mapping[str, Mapping[str, float]],
             spreads: Mapping[str, Mapping[str, float]]) -> str:
    return table(head, ([model] + [_cell(c, row.get(c), spreads.get(model, {}).get(c)) for c in cols]
                        for model, row in rows.items()))


def markdown_table(rows: Mapping[str, Mapping[str, float]], spreads: Mapping[str, Mapping[str, float]] | None = None,
                   *, title: str | None = None) -> str:
    """The demo's results as Markdown: the Table-1-style comparison beside the paper's numbers,
    the mean scores, REPLACE with the synonyms finetuning saw (where the rows have it) and the
    REPLACE subsets. ``rows``: model -> :func:`table_row`; ``spreads``: model -> the same keys
    (std over seeds), shown as ``± x``. What the rows say about the paper's findings is
    :func:`hardpos.paper.confirm.run_verdicts_markdown`'s."""
    spreads = spreads or {}
    out = [f"### {title}", ""] if title else []
    out.append(_results(["model", "REPLACE orig", "REPLACE aug", "REPLACE brittle", "SWAP orig", "SWAP aug", "SWAP brittle"],
                        [f"{g}/{f}" for g in ("replace", "swap") for f in PERCENT], rows, spreads))
    out += ["", paper_markdown(rows).rstrip("\n")]
    out += ["", "Mean cosine scores (true caption s_c, hard negative s_n, hard positive s_p):", ""]
    out.append(_results(["model", "REPLACE s_c", "REPLACE s_n", "REPLACE s_p", "SWAP s_c", "SWAP s_n", "SWAP s_p"],
                        [f"{g}/mean_s_{x}" for g in ("replace", "swap") for x in ("c", "n", "p")], rows, spreads))
    seen = [f"replace_seen/{f}" for f in PERCENT]
    if any(all(c in row for c in seen) for row in rows.values()):
        out += ["", "REPLACE with the synonyms finetuning saw (the same items; the REPLACE columns above use "
                "synonyms it never saw):", ""]
        out.append(_results(["model", "seen orig", "seen aug", "seen brittle"], seen, rows, spreads))
    out += ["", "REPLACE subsets:", ""]
    out.append(_results(["model", "attribute orig", "attribute aug", "attribute brittle", "relation orig",
                         "relation aug", "relation brittle"], list(SUBSET_COLUMNS), rows, spreads))
    return "\n".join(out) + "\n"


def paper_markdown(rows: Mapping[str, Mapping[str, float]]) -> str:
    """The paper's own numbers for the models in ``rows`` (CLIP ViT-B/32 finetuned on COCO; %):
    Table 1 for the base, HN-only and HP+HN, Table 3 for the ``w_neg=<v>`` grid."""
    head = ["paper model", "REPLACE orig", "REPLACE aug", "REPLACE brittle", "SWAP orig", "SWAP aug", "SWAP brittle"]
    body = []
    for model in rows:
        rep, swap = paper_figures(model, "replace"), paper_figures(model, "swap")
        if rep or swap:
            body.append(["CLIP ViT-B/32" if model.lower() == "pretrained" else model,
                         *(rep or (None,) * 3), *(swap or (None,) * 3)])
    if not body:
        return ""
    return ("The paper's numbers for these models (CLIP ViT-B/32 finetuned on COCO, %; Table 1, and Table 3 "
            "for the w_neg grid):\n\n" + table(head, body) + "\n")
