"""The comparison of tracked runs in the paper's Table-3 layout: loss weights, then accuracy and brittleness.

:func:`comparison_table` writes the rows the compare stage collects
(:func:`hardpos.stages.compare.collect_runs`), one per run, with the Pareto front marked and
every REPLACE figure of a model trained on the REPLACE benchmark's own substitutions marked
:data:`SEEN_MARK`; its plot is :func:`hardpos.plots.tradeoff_plot`. Pure functions.
"""
from __future__ import annotations

from typing import Any

from hardpos.markdown import table

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
