"""The job contract, in one place: Ray connection, MLflow run, output_dir, summary.json.

A stage is a module ``hardpos.stages.<name>`` that defines

    @dataclass
    class Config(JobConfig): ...           # typed, documented, with defaults
    def run(cfg: Config, ctx: JobContext) -> dict: ...   # returns the summary

:func:`execute` wraps ``run`` with everything every stage must do, so stages never
repeat it: resolve ``output_dir`` (local paths become absolute), open an MLflow run
(params = the flattened config, the config itself as ``config.yaml``), call ``run``,
log the summary, mark the run FINISHED (FAILED on an exception, which is re-raised),
write ``summary.json`` to ``output_dir`` (its ``tracking`` section says whether every
tracking record was delivered), and print where the summary is.  Stages call each other
(the demo, the sweep) through :func:`execute` too, with ``parent_run_id`` for nesting.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from hardpos import storage, tracking
from hardpos.config import JobConfig, RayConfig, dump_yaml, to_dict

STAGES = ("world", "perturb", "generate", "train", "evaluate", "sweep", "compare", "register", "demo", "benchmark", "interpolate")


@dataclasses.dataclass
class JobContext:
    """What a running stage gets besides its config."""

    stage: str
    output_dir: str
    run: tracking.RunLogger | None

    def path(self, *parts: str) -> str:
        """A path/URI under this run's output_dir."""
        return storage.join(self.output_dir, *parts)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log_metrics(metrics, step=step)

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if self.run is not None:
            self.run.log_artifact(local_path, artifact_path)

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run else None


def init_ray(cfg: RayConfig | None = None, **kwargs: Any) -> None:
    """Connect to ``cfg.address`` / ``$RAY_ADDRESS`` when given, else start a local Ray.

    Idempotent. Never stops anything it did not start (no ``ray stop`` anywhere).
    """
    # lazy: runtime is on `hardpos`'s import path (cli.py); ray takes seconds to import
    import ray

    if ray.is_initialized():
        return
    cfg = cfg or RayConfig()
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    # Ray Data's progress bars are useful in a job log; keep the driver log readable.
    kwargs.setdefault("log_to_driver", True)
    if address:
        ray.init(address=address, **kwargs)
    else:
        kwargs.setdefault("include_dashboard", False)
        ray.init(num_cpus=cfg.num_cpus, **kwargs)


def stage_module(name: str):
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return importlib.import_module(f"hardpos.stages.{name}")


def resolve_output_dir(output_dir: str) -> str:
    return output_dir if storage.is_s3(output_dir) else str(Path(output_dir).expanduser().resolve())


def execute(
    stage: str,
    cfg: JobConfig,
    *,
    parent_run_id: str | None = None,
    run_fn: Callable[[Any, JobContext], dict] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run one stage under the job contract and return its summary (also in summary.json)."""
    fn = run_fn or stage_module(stage).run
    cfg = dataclasses.replace(cfg, output_dir=resolve_output_dir(cfg.output_dir))
    storage.makedirs(cfg.output_dir)
    run_name = cfg.tracking.run_name or f"{stage}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = tracking.start_run(cfg.tracking, run_name, tags={"hardpos.stage": stage}, parent_run_id=parent_run_id,
                             spill_dir=tracking.spill_dir_for(cfg.output_dir))
    ctx = JobContext(stage=stage, output_dir=cfg.output_dir, run=run)
    started = time.time()
    try:
        if run is not None:
            run.log_params(to_dict(cfg))
            run.log_text(dump_yaml(cfg), "config.yaml")
        result = fn(cfg, ctx) or {}
        summary = {
            "stage": stage,
            "status": "ok",
            "output_dir": cfg.output_dir,
            "mlflow_run_id": ctx.run_id,
            "elapsed_s": round(time.time() - started, 3),
            **result,
        }
        if run is not None:
            run.log_json(summary, "summary.json")
            # Bounded wait for the tracking queue; what it could not deliver is reported,
            # not raised: the job's status is the stage's result, not the tracker's health.
            summary["tracking"] = tracking.end_run(run, "FINISHED")
        summary_uri = storage.write_json(ctx.path("summary.json"), summary)
    except BaseException:
        tracking.end_run(run, "FAILED")
        raise
    if not quiet:
        print(f"[hardpos] {stage} finished in {summary['elapsed_s']:.1f}s; summary: {summary_uri}", file=sys.stderr)
    return summary
