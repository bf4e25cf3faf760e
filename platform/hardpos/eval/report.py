"""Evaluation outputs a researcher can reuse: per-item scores, Markdown tables, recomputation.

* ``scores.parquet``  one row per scored item: item_id, benchmark, subset, s_c, s_n, s_p
  (plus t_cp, t_cn, t_pn, the text-only cosines, when a benchmark is SugarCrepe++)
  (s_p null without a hard positive); the schema metadata records how each benchmark
  combines its subsets (so :func:`recompute_metrics` gives back the summary's figures)
  and the precision the scores were computed in (``hardpos.precision``).
* ``report.md``       the precision the scores were computed in, the paper's Table 1
  layout (orig / aug per benchmark, then brittleness), mean scores (Table 2/9), per-subset
  and SugarCrepe per-category tables, retention, and the list of missing/corrupt images.
  Figures are percentages (x100); the tables are written by :func:`hardpos.report.table`.
* ``missing_images.json`` every image that could not be read, with the error and the
  number of items excluded because of it; ``rejected_rows.json`` annotation rows that
  could not become items.
"""
from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.eval.metrics import TEXT_COLUMNS, benchmark_metrics
from hardpos.eval.sugarcrepe_pp import markdown_section as text_only_section
from hardpos.report import num, pct, table

if TYPE_CHECKING:
    from hardpos.eval.evaluator import EvalReport

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
    pos = [r for r in report.results if any(f"{r.name}/aug_acc" == k for k in m)]
    neg_only = [r for r in report.results if r not in pos]
    where = f" on {device}" if device else ""
    note = ("" if report.precision == "fp32" else
            " (autocast: scores move by ~1e-3 against fp32, enough to flip close decisions; ties count against the model)")
    parts = [f"# Evaluation: {model_name}", "", f"Scores computed in {report.precision}{where}{note}.", ""]
    if pos:
        header = ["model"]
        row = [model_name]
        for r in pos:
            header += [f"{r.name} orig", f"{r.name} aug"]
            row += [pct(m.get(f"{r.name}/orig_acc")), pct(m.get(f"{r.name}/aug_acc"))]
        for r in pos:
            header.append(f"{r.name} brittle")
            row.append(pct(m.get(f"{r.name}/brittleness")))
        parts += ["## Original / augmented accuracy and brittleness (%, Table 1 layout)", "",
                  "Chance: 50 / 33.3 / 33.3. aug = caption and hard positive both beat the hard negative; "
                  "brittle = the hard negative lies strictly between them.", "", table(header, [row]), ""]
        rows = [[r.name, num(m.get(f"{r.name}/mean_s_c")), num(m.get(f"{r.name}/mean_s_n")),
                 num(m.get(f"{r.name}/mean_s_p")), pct(m.get(f"{r.name}/aug_drop")), str(int(m.get(f"{r.name}/n_items", 0)))]
                for r in pos]
        parts += ["## Mean cosine scores", "", table(["benchmark", "mean s_c", "mean s_n", "mean s_p", "aug - orig (pts)", "items"], rows), ""]
    sub_rows = []
    for r in report.results:
        for sub in dict.fromkeys(r.subsets):
            key = f"{r.name}/{sub}"
            if f"{key}/orig_acc" in m:
                sub_rows.append([r.name, sub, pct(m.get(f"{key}/orig_acc")), pct(m.get(f"{key}/aug_acc")),
                                 pct(m.get(f"{key}/brittleness")), num(m.get(f"{key}/mean_s_c")), num(m.get(f"{key}/mean_s_n")),
                                 num(m.get(f"{key}/mean_s_p")), str(int(m[f"{key}/n_items"]))])
    if sub_rows:
        parts += ["## Per subset / category", "",
                  table(["benchmark", "subset", "orig", "aug", "brittle", "mean s_c", "mean s_n", "mean s_p", "items"], sub_rows), ""]
    parts += text_only_section(report.results, m)  # SugarCrepe++'s text-only task, when evaluated
    if neg_only:
        rows = [[r.name, pct(m.get(f"{r.name}/orig_acc")), str(int(m.get(f"{r.name}/n_items", 0)))] for r in neg_only]
        parts += ["## Benchmarks without hard positives (original accuracy, %)", "", table(["benchmark", "orig", "items"], rows), ""]
    if retention:
        rows = [[k, str(int(v)) if _is_count(k) else pct(v)] for k, v in sorted(retention.items())]
        parts += ["## Retention (zero-shot classification, retrieval; %)", "", table(["metric", "value"], rows), ""]
    missing = [(r.name, mi) for r in report.results for mi in r.missing_images]
    parts += ["## Missing or corrupt images", ""]
    if missing:
        parts.append(f"{len(missing)} image(s) could not be read; their items are excluded from every figure above.")
        parts.append("")
        for name, mi in missing[:50]:
            parts.append(f"- `{name}`: `{mi['image']}` ({mi['error']}; {mi['n_items']} item(s))")
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
    the missing-image counts, which the per-item file cannot know)."""
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
