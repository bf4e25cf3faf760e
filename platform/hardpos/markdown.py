"""THE Markdown table writer and the cell formats every table HardPos writes uses.

The evaluation report (:mod:`hardpos.eval.outputs`), the demo's results
(:mod:`hardpos.paper.table1`), the comparison of tracked runs (:mod:`hardpos.paper.table3`),
the WiSE-FT trade-off table and the measuring tools' tables all go through :func:`table`, so
a ``|`` in a cell can never split a row anywhere. Pure functions over plain values.
"""
from __future__ import annotations

import html
import math
import re
from typing import Any, Iterable, Sequence


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
