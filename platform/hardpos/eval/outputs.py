"""The evaluate stage's files, which a researcher can reuse, and the figures recomputed from them.

:func:`write_outputs` writes, under the stage's output folder (local or s3://):

* ``scores.parquet``  one row per scored item: item_id, benchmark, subset, s_c, s_n, s_p
  (plus t_cp, t_cn, t_pn, the text-only cosines, when a benchmark is SugarCrepe++, and
  ``blind_<model>_c`` / ``_n`` / ``_p``, a blind baseline's text-only scores: :func:`blind_columns`)
  (s_p null without a hard positive); the schema metadata records how each benchmark
  combines its subsets (so :func:`recompute_metrics` gives back the summary's figures)
  and the precision the scores were computed in (``hardpos.precision``).
* ``report.md``       the precision the scores were computed in, the paper's Table 1
  layout (orig / aug per benchmark, then brittleness; with the blind baselines' rows beside
  the model when the stage computed them), mean scores (Table 2/9), per-subset and
  SugarCrepe per-category tables, the blind baselines per benchmark and subset with their
  intervals (:func:`blind_section`), retention, and the list of missing/corrupt images
  (:func:`markdown_report`). Figures are percentages (x100); the tables are written by
  :func:`hardpos.markdown.table`.
* ``missing_images.json`` every image that could not be read, with the error and the
  number of items excluded because of it; ``rejected_rows.json`` annotation rows that
  could not become items.

Pure functions over the evaluator's report, apart from the files the write_* functions write.
"""
from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.eval.metrics import TEXT_COLUMNS, TEXT_ONLY_ITEMS, TEXT_ONLY_METRIC, benchmark_metrics
from hardpos.markdown import md_text, num, pct, table

if TYPE_CHECKING:
    from hardpos.eval.evaluator import EvalReport

SCORES_FILE = "scores.parquet"
REPORT_FILE = "report.md"
#: the figures of a blind baseline row (``orig_acc`` is its pair measure)
BLIND_FIGURES = ("orig_acc", "aug_acc", "brittleness")


def blind_columns(model: str) -> tuple[str, str, str]:
    """The scores.parquet columns of a blind model's text-only scores of the caption, the hard
    negative and the hard positive (higher: more like a true caption)."""
    return f"blind_{model}_c", f"blind_{model}_n", f"blind_{model}_p"


def _is_count(key: str) -> bool:
    """Retention keys that are counts (``.../n_images``, ``.../n_missing_images`` ...), not fractions."""
    return key.rsplit("/", 1)[-1].startswith("n_")


def markdown_report(report: EvalReport, model_name: str = "model", retention: Mapping[str, float] | None = None,
                    *, device: str | None = None, blind: Mapping[str, Any] | None = None) -> str:
    """The Markdown report (tables in the paper's layout; values in percent). The first
    line under the title says which precision (``report.precision``) the scores were
    computed in, and on which ``device`` when given. ``blind``: the blind baselines
    (``{"models": {name: description}, "rows": [...]}``, the rows of
    :meth:`hardpos.audit.baselines.BlindResult.rows`), shown beside the model."""
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
    overall = _blind_overall(blind)
    if pos:
        header = ["model"]
        row = [model_name]
        for r in pos:
            header += [f"{md_text(r.name)} orig", f"{md_text(r.name)} aug"]
            row += [pct(m.get(f"{r.name}/orig_acc")), pct(m.get(f"{r.name}/aug_acc"))]
        for r in pos:
            header.append(f"{md_text(r.name)} brittle")
            row.append(pct(m.get(f"{r.name}/brittleness")))
        rows_t1 = [row]
        for bm in (blind or {}).get("models", {}):
            b = [f"blind: {md_text(bm)} (no image)"]
            for r in pos:
                b += [pct(overall.get((r.name, bm), {}).get("orig_acc")), pct(overall.get((r.name, bm), {}).get("aug_acc"))]
            b += [pct(overall.get((r.name, bm), {}).get("brittleness")) for r in pos]
            rows_t1.append(b)
        note = (" The blind rows are text-only models that never see the image (see the blind baselines below)."
                if len(rows_t1) > 1 else "")
        parts += ["## Original / augmented accuracy and brittleness (%, Table 1 layout)", "",
                  "Chance: 50 / 33.3 / 33.3. aug = caption and hard positive both beat the hard negative; "
                  "brittle = the hard negative lies strictly between them." + note, "", table(header, rows_t1), ""]
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
        models = list((blind or {}).get("models", {}))
        rows = [[md_text(r.name), pct(m.get(f"{r.name}/orig_acc")),
                 *(pct(overall.get((r.name, bm), {}).get("orig_acc")) for bm in models),
                 str(int(m.get(f"{r.name}/n_items", 0))), _excluded(r)] for r in neg_only]
        parts += ["## Benchmarks without hard positives (original accuracy, %)", "",
                  table(["benchmark", "orig", *(f"blind: {md_text(bm)}" for bm in models), "items",
                         "excluded (image missing)"], rows), ""]
    parts += blind_section(blind)
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
                  retention: Mapping[str, float] | None = None, device: str | None = None,
                  blind: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Write scores.parquet, report.md, missing_images.json, rejected_rows.json under
    ``output_dir`` (local or s3://); returns ``{kind: uri}``. ``blind``: as for
    :func:`markdown_report`."""
    paths = {
        "scores": write_scores(report, storage.join(output_dir, SCORES_FILE)),
        "report": storage.write_text(storage.join(output_dir, REPORT_FILE),
                                     markdown_report(report, model_name, retention, device=device, blind=blind)),
        "missing_images": storage.write_json(storage.join(output_dir, "missing_images.json"),
                                             {r.name: r.missing_images for r in report.results}),
        "rejected_rows": storage.write_json(storage.join(output_dir, "rejected_rows.json"),
                                            {r.name: r.rejected_rows for r in report.results}),
    }
    return paths


def blind_rows(metrics: Mapping[str, float], columns: Sequence[str],
               groups: Mapping[str, Sequence[str]] | None = None) -> dict[str, dict[str, float]]:
    """Rows of the blind baselines for a table whose cells are ``<benchmark>/<figure>`` keys
    (``columns``), from flat metrics holding ``blind/<benchmark>/<model>/<figure>``: one row
    per blind model found, labelled ``blind: <model> (no image)``. ``groups``: a column's
    benchmark that is the unweighted mean of several (the demo's ``replace`` = its attribute
    and relation benchmarks), filled where every one of them has the figure."""
    groups = groups or {}
    models = list(dict.fromkeys(k.split("/")[2] for k in metrics if k.startswith("blind/") and k.count("/") == 3))
    out: dict[str, dict[str, float]] = {}
    for model in models:
        row: dict[str, float] = {}
        for col in columns:
            bench, _, fig = col.rpartition("/")
            parts = groups.get(bench, (bench,))
            keys = [f"blind/{b}/{model}/{fig}" for b in parts]
            if bench and all(k in metrics for k in keys):
                row[col] = float(np.mean([metrics[k] for k in keys]))
        if row:
            out[f"blind: {model} (no image)"] = row
    return out


def _blind_overall(blind: Mapping[str, Any] | None) -> dict[tuple[str, str], dict[str, float]]:
    """(benchmark, blind model) -> its overall figures, from the blind rows."""
    return {(r["benchmark"], r["model"]): {f: r[f] for f in BLIND_FIGURES if f in r}
            for r in (blind or {}).get("rows", []) if r["subset"] == "all"}


def blind_section(blind: Mapping[str, Any] | None) -> list[str]:
    """report.md lines for the blind baselines: each model named with how it was fit, then one
    row per benchmark, subset (``all``: the benchmark's overall figure) and model, in percent
    with 95% intervals (empty without baselines)."""
    if not blind or not blind.get("rows"):
        return []

    def cell(r: Mapping[str, Any], f: str) -> str:
        return f"{pct(r[f])} [{pct(r[f + '_lo'])}, {pct(r[f + '_hi'])}]" if f in r else ""

    rows = [[md_text(r["benchmark"]), md_text(r["subset"]), md_text(r["model"]), str(r["n_items"]),
             *((cell(r, f) for f in BLIND_FIGURES) if not r.get("skipped") else (f"not measured: {md_text(r['skipped'])}", "", ""))]
            for r in blind["rows"]]
    models = [f"- `{md_text(k)}`: {md_text(v)}" for k, v in blind.get("models", {}).items()]
    return ["## Blind baselines (text only, no image; %, 95% interval)", "",
            "What a model that reads only the captions gets right: each text is scored by a model fitted on the other "
            "folds (grouped by original caption), and the same strict comparisons as the model's give orig (the pair "
            "measure: the caption scored above its hard negative; chance 50), aug and brittle (chance 33.3). A model's "
            "figure above its blind baseline is what the image added.", "", *models, "",
            table(["benchmark", "subset", "blind model", "items", "orig (pair)", "aug", "brittle"], rows), ""]


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
