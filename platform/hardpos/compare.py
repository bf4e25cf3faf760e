"""Compare finished runs: the rows, the Pareto front and the comparison files.

Rows come from MLflow's ``search_runs`` (:func:`collect_runs`: children of a sweep's
parent run, or any runs of an experiment), so the comparison reflects what is tracked, not
what a process happened to hold in memory; when the tracking server cannot answer, a
sweep's rows come from its trials' ``summary.json`` files instead (:func:`summary_rows`).
The compare stage and the sweep stage both end in :func:`compare_rows` and
:func:`write_comparison`; the table and the plot are :mod:`hardpos.report`'s.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hardpos import registry, report, storage, tracking
from hardpos.data.lexicon import SEEN_SUBSTITUTIONS_TAG


def collect_runs(tracking_uri: str, experiment: str, parent_run_id: str | None = None) -> list[dict[str, Any]]:
    """One flat dict per finished or failed run, oldest first: ``run_id``, ``run_name``,
    ``status``, ``param:<key>`` for params and the metric names as they are."""
    client = registry.mlflow_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    filt = f"tags.mlflow.parentRunId = '{parent_run_id}'" if parent_run_id else ""
    rows = []
    for run in client.search_runs([exp.experiment_id], filter_string=filt, max_results=5000, order_by=["attributes.start_time ASC"]):
        row: dict[str, Any] = {
            "run_id": run.info.run_id,
            "run_name": run.info.run_name,
            "status": run.info.status,
        }
        for key, value in run.data.params.items():
            row[f"param:{key}"] = _number_or_text(value)
        row.update(run.data.metrics)
        if run.data.tags.get(SEEN_SUBSTITUTIONS_TAG):
            row["seen_substitutions"] = run.data.tags[SEEN_SUBSTITUTIONS_TAG]
        rows.append(row)
    return rows


def _number_or_text(value: str) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def summary_rows(output_dir: str) -> list[dict[str, Any]]:
    """Rows like :func:`collect_runs` gives, from a sweep's ``trials/<name>/summary.json``
    (the finished trials only; ``param:<key>`` from the trial's overrides)."""
    trials = storage.join(output_dir, "trials")
    rows = []
    for uri in storage.list_files(trials, suffix="/summary.json"):
        if uri[len(trials):].strip("/").count("/") != 1:  # trials/<name>/summary.json only
            continue
        s = storage.read_json(uri)
        if s.get("status") != "ok":
            continue
        row: dict[str, Any] = {"run_id": s.get("mlflow_run_id"), "run_name": uri.rstrip("/").split("/")[-2],
                               "status": "FINISHED"}
        row.update({f"param:{k}": v for k, v in (s.get("overrides") or {}).items()})
        row.update(tracking.numeric_metrics(s.get("final_metrics") or {}))
        if isinstance(s.get("objective"), (int, float)):
            row["objective"] = float(s["objective"])
        if s.get("seen_substitutions"):
            row["seen_substitutions"] = s["seen_substitutions"]
        rows.append(row)
    return rows


def pareto_front(rows: list[dict[str, Any]], criteria: dict[str, str]) -> list[int]:
    """Indices of rows no other row dominates. ``criteria``: metric -> "max" | "min".

    Rows missing a criterion are left out. Row a dominates b when a is at least as good on
    every criterion and strictly better on one (so equal rows are both on the front).
    """
    usable = [i for i, r in enumerate(rows) if all(isinstance(r.get(m), (int, float)) for m in criteria)]

    def better_or_equal(a, b, m, mode):
        return a[m] >= b[m] if mode == "max" else a[m] <= b[m]

    def strictly_better(a, b, m, mode):
        return a[m] > b[m] if mode == "max" else a[m] < b[m]

    front = []
    for i in usable:
        dominated = any(
            all(better_or_equal(rows[j], rows[i], m, mode) for m, mode in criteria.items())
            and any(strictly_better(rows[j], rows[i], m, mode) for m, mode in criteria.items())
            for j in usable if j != i
        )
        if not dominated:
            front.append(i)
    return front


def compare_rows(rows: list[dict[str, Any]], criteria: dict[str, str]) -> tuple[str, list[int]]:
    """(the Table-3-style Markdown with a Pareto column, the Pareto front's row indices)."""
    front = pareto_front(rows, criteria)
    return report.comparison_table(rows, pareto=front), front


def write_comparison(rows: list[dict[str, Any]], table: str, ctx) -> list[str]:
    """``comparison.md`` + ``tradeoff.png``: drawn locally, copied to ``ctx.output_dir``
    (local or s3://) and logged to the job's MLflow run. Returns the written URIs."""
    local = Path(tempfile.mkdtemp(prefix="hardpos-compare-"))
    (local / "comparison.md").write_text(table + "\n")
    report.tradeoff_plot(rows, local / "tradeoff.png")
    written = storage.upload_dir(local, ctx.output_dir)
    for path in sorted(local.iterdir()):
        ctx.log_artifact(path)
    return written
