"""Compare tracked runs: the paper's Table-3 layout (Markdown; under the runs, the blind
baselines their evaluations logged: text-only models that never see the image) and a plot of
augmented accuracy and brittleness against the hard-negative weight, from MLflow's search_runs.
``hardpos compare parent_run_id=<sweep run>`` compares one sweep's trials.

Given two or more evaluations (``explorer.evaluations``: label -> an evaluate stage's
output_dir, or ``runs:/<run_id>`` of an evaluate run tracked in this store), it also writes the brittleness explorer (:mod:`hardpos.explorer`):
``<output_dir>/explorer/index.html`` with its thumbnails, logged to the run as the
``explorer`` artifact folder; ``explorer.enabled=false`` turns it off. With evaluations
given, the stage runs even when the experiment has no finished runs to tabulate.

Rows come from MLflow's ``search_runs`` (:func:`collect_runs`: children of a sweep's
parent run, or any runs of an experiment), so the comparison reflects what is tracked, not
what a process happened to hold in memory; when the tracking server cannot answer, a
sweep's rows come from its trials' ``summary.json`` files instead (:func:`summary_rows`).
The compare stage and the sweep stage (:mod:`hardpos.stages.sweep`) both end in :func:`compare_rows` and
:func:`write_comparison`; the table is :func:`hardpos.paper.table3.comparison_table`, the plot
:func:`hardpos.plots.tradeoff_plot`.
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from hardpos import explorer, plots, storage, tracking
from hardpos.config import ConfigError, JobConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.rules.lexicon import SEEN_SUBSTITUTIONS_TAG
from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.items import BenchmarkError
from hardpos.eval.model_eval import resolve_specs
from hardpos.eval.outputs import SCORES_FILE, blind_rows
from hardpos.explorer import ExplorerConfig, ExplorerError
from hardpos.models.uri import mlflow_client
from hardpos.paper import table3
from hardpos.runtime import JobContext


@dataclasses.dataclass
class Config(JobConfig):
    """experiment: the MLflow experiment holding the runs (default: tracking.experiment).
    parent_run_id: only the child runs of this run (a sweep); None: every run of the experiment
        that has the benchmark metrics.
    pareto: metric -> max|min for the Pareto column.
    explorer: the brittleness explorer (evaluations of two or more models; see hardpos.explorer).
    """

    output_dir: str = "outputs/compare"
    experiment: str | None = None
    parent_run_id: str | None = None
    pareto: dict[str, str] = dataclasses.field(default_factory=lambda: {"objective": "max", "replace/brittleness": "min", "swap/brittleness": "min"})
    explorer: ExplorerConfig = dataclasses.field(default_factory=ExplorerConfig)


def check(cfg: Config) -> None:
    """Before any work: the tracking server (this stage's inputs are read, and named in its errors, by ``run``)."""
    tracking.check_tracking(cfg.tracking)


def run(cfg: Config, ctx: JobContext) -> dict:
    experiment = cfg.experiment or cfg.tracking.experiment
    tracking_uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    rows = collect_runs(tracking_uri, experiment, cfg.parent_run_id)
    rows = [r for r in rows if r["status"] == "FINISHED" and any(k.endswith("/aug_acc") for k in r)]
    if not rows and not cfg.explorer.active:
        raise ConfigError(f"no finished runs with benchmark metrics in experiment {experiment!r}"
                          + (f" under parent run {cfg.parent_run_id}" if cfg.parent_run_id else ""))
    out: dict = {"runs": len(rows)}
    if cfg.explorer.active:  # first: its config errors surface before anything is written
        out["explorer"] = write_explorer(cfg.explorer, ctx, tracking_uri)
    if rows:
        table, front = compare_rows(rows, cfg.pareto)
        print(table)
        out.update(table=table, pareto_front=[rows[i]["run_name"] for i in front],
                   artifacts=write_comparison(rows, table, ctx))
    return out


# --------------------------------------------------------------------------- the runs compared
def collect_runs(tracking_uri: str, experiment: str, parent_run_id: str | None = None) -> list[dict[str, Any]]:
    """One flat dict per finished or failed run, oldest first: ``run_id``, ``run_name``,
    ``status``, ``param:<key>`` for params and the metric names as they are."""
    client = mlflow_client(tracking_uri)
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
    """(the Table-3-style Markdown with a Pareto column, the Pareto front's row indices).

    Under the runs, one row per blind baseline the runs logged (``blind/<benchmark>/<model>/...``,
    the evaluate stage's text-only models): what a model that never sees the image reaches on
    the same columns. A benchmark's baseline depends on its texts alone, so the first run that
    logged it gives it; the blind rows take no part in the Pareto front."""
    front = pareto_front(rows, criteria)
    columns = table3.comparison_columns(rows)
    logged: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("blind/") and isinstance(v, (int, float)):
                logged.setdefault(k, float(v))
    blind = [{"run_name": label, **row} for label, row in blind_rows(logged, [k for _, k in columns if "/" in k]).items()]
    return table3.comparison_table(rows + blind, pareto=front, columns=columns), front


def write_comparison(rows: list[dict[str, Any]], table: str, ctx) -> list[str]:
    """``comparison.md`` + ``tradeoff.png``: drawn locally, copied to ``ctx.output_dir``
    (local or s3://) and logged to the job's MLflow run. Returns the written URIs."""
    local = Path(tempfile.mkdtemp(prefix="hardpos-compare-"))
    (local / "comparison.md").write_text(table + "\n")
    plots.tradeoff_plot(rows, local / "tradeoff.png")
    written = storage.upload_dir(local, ctx.output_dir)
    for path in sorted(local.iterdir()):
        ctx.log_artifact(path)
    return written


# --------------------------------------------------------------------------- the explorer
def explorer_items(cfg: ExplorerConfig) -> dict[str, list]:
    """benchmark name -> its loaded items, for the configured benchmarks and world (resolved
    and validated exactly as the evaluate stage does)."""
    if not cfg.benchmarks and not cfg.world_dir:
        raise ConfigError("explorer.benchmarks / explorer.world_dir: give the benchmarks the evaluations scored "
                          "(the page shows their images and captions)")
    specs = resolve_specs(cfg.benchmarks, cfg.world_dir)
    try:
        return {s.name: load_benchmark(s).items for s in specs}
    except BenchmarkError as exc:
        raise ConfigError(f"explorer.benchmarks: {exc}") from exc


def scores_source(uri: str, tracking_uri: str, dest: Path) -> str:
    """Where to read one evaluation's scores: ``uri`` as is, or for ``runs:/<run_id>[/<path>]``
    (an evaluate run; ``<path>`` a folder or .parquet file among its artifacts, default its
    ``scores.parquet``) the artifact downloaded from ``tracking_uri`` under ``dest``."""
    if not uri.startswith("runs:/"):
        return uri
    run_id, _, rel = uri[len("runs:/"):].strip("/").partition("/")
    rel = rel if rel.endswith(".parquet") else "/".join(p for p in (rel, SCORES_FILE) if p)
    try:
        return mlflow_client(tracking_uri).download_artifacts(run_id, rel, str(dest))
    except Exception as exc:  # noqa: BLE001 - no such run / artifact: one clear message
        raise ConfigError(f"explorer.evaluations: cannot fetch {rel} of MLflow run {run_id} "
                          f"from {tracking_uri}: {type(exc).__name__}: {exc}") from exc


def write_explorer(cfg: ExplorerConfig, ctx: JobContext, tracking_uri: str) -> dict:
    """Write ``<output_dir>/explorer/`` (local or s3://) and log it to the run as the
    ``explorer`` artifact folder; returns where the page is and the per-benchmark counts.
    ``tracking_uri``: where ``runs:/`` evaluations are fetched from."""
    downloads = Path(tempfile.mkdtemp(prefix="hardpos-explorer-scores-"))
    try:
        models = {label: explorer.read_scores(scores_source(uri, tracking_uri, downloads / str(k)))
                  for k, (label, uri) in enumerate(cfg.evaluations.items())}
    except ExplorerError as exc:
        raise ConfigError(f"explorer.evaluations: {exc}") from exc
    items = explorer_items(cfg)
    local = Path(tempfile.mkdtemp(prefix="hardpos-explorer-")) / "explorer"
    try:
        result = explorer.write_explorer(models, items, local, max_rows_per_benchmark=cfg.max_rows_per_benchmark,
                                         thumbnail_px=cfg.thumbnail_px)
    except ExplorerError as exc:
        raise ConfigError(f"explorer: {exc}") from exc
    storage.upload_dir(local, ctx.path("explorer"))
    ctx.log_artifact(local, "explorer")
    print(f"[hardpos] explorer: {ctx.path('explorer', explorer.INDEX_FILE)}")
    return {"index": ctx.path("explorer", explorer.INDEX_FILE), "models": result.models, "benchmarks": result.counts}
