"""Compare finished runs from MLflow: the paper's Table-3 layout and a trade-off plot.

Rows come from ``search_runs`` (children of a sweep's parent run, or any runs of an
experiment), so the comparison always reflects what is tracked, not what a process
happened to hold in memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hardpos import sweep

# Table 3 of the paper: the loss weights, then accuracy and brittleness per benchmark.
DEFAULT_COLUMNS = [
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


def collect_runs(tracking_uri: str, experiment: str, parent_run_id: str | None = None) -> list[dict[str, Any]]:
    """One flat dict per finished or failed run: ``run_id``, ``run_name``, ``status``,
    ``param:<key>`` for params and the metric names as they are."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
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
        rows.append(row)
    return rows


def _number_or_text(value: str) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def columns_for(rows: list[dict[str, Any]], columns=DEFAULT_COLUMNS) -> list[tuple[str, str]]:
    """Keep the default columns some row has, plus every other ``*/aug_acc`` benchmark."""
    present = [(h, k) for h, k in columns if any(k in r for r in rows)]
    known = {k for _, k in present}
    extra = sorted({k for r in rows for k in r if k.endswith(("/aug_acc", "/brittleness")) and k.count("/") == 1 and k not in known})
    return present + [(k, k) for k in extra]


def markdown_table(rows: list[dict[str, Any]], pareto: list[int] | None = None) -> str:
    cols = columns_for(rows)
    if pareto is not None:
        rows = [{**r, "pareto": "yes" if i in pareto else ""} for i, r in enumerate(rows)]
        cols = cols + [("Pareto", "pareto")]
    table_rows = [{k: r.get(k) for _, k in cols} for r in rows]
    return sweep.comparison_table(table_rows, cols)


def tradeoff_plot(rows: list[dict[str, Any]], path: str | Path, x: str = "param:loss.w_neg") -> Path | None:
    """Augmented accuracy and brittleness (REPLACE, SWAP, any ``*/aug_acc``) against ``x``.

    Only rows with a numeric ``x`` are plotted (the HN-only control has w_pos = 0 and is
    drawn as a separate marker). Returns None when nothing can be plotted.
    """
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
