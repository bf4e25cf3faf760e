"""Compare tracked runs: the paper's Table-3 layout (Markdown) and a plot of augmented
accuracy and brittleness against the hard-negative weight, from MLflow's search_runs.
``hardpos compare parent_run_id=<sweep run>`` compares one sweep's trials."""
from __future__ import annotations

import dataclasses

from hardpos import compare, tracking
from hardpos.config import ConfigError, JobConfig
from hardpos.runtime import JobContext


@dataclasses.dataclass
class Config(JobConfig):
    """experiment: the MLflow experiment holding the runs (default: tracking.experiment).
    parent_run_id: only the child runs of this run (a sweep); None: every run of the experiment
        that has the benchmark metrics.
    pareto: metric -> max|min for the Pareto column.
    """

    output_dir: str = "outputs/compare"
    experiment: str | None = None
    parent_run_id: str | None = None
    pareto: dict[str, str] = dataclasses.field(default_factory=lambda: {"objective": "max", "replace/brittleness": "min", "swap/brittleness": "min"})


def run(cfg: Config, ctx: JobContext) -> dict:
    experiment = cfg.experiment or cfg.tracking.experiment
    rows = compare.collect_runs(tracking.resolve_tracking_uri(cfg.tracking.tracking_uri), experiment, cfg.parent_run_id)
    rows = [r for r in rows if r["status"] == "FINISHED" and any(k.endswith("/aug_acc") for k in r)]
    if not rows:
        raise ConfigError(f"no finished runs with benchmark metrics in experiment {experiment!r}"
                          + (f" under parent run {cfg.parent_run_id}" if cfg.parent_run_id else ""))
    table, front = compare.compare_rows(rows, cfg.pareto)
    print(table)
    return {"runs": len(rows), "table": table, "pareto_front": [rows[i]["run_name"] for i in front],
            "artifacts": compare.write_comparison(rows, table, ctx)}
