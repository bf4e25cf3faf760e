"""The job contract, in one place: Ray connection, MLflow run, output_dir, summary.json.

A stage is a module (``hardpos.stages.<name>``, or its library's ``stage`` module where the
stage's driver and workers live together: :data:`STAGE_MODULES`) that defines

    @dataclass
    class Config(JobConfig): ...           # typed, documented, with defaults
    def check(cfg: Config) -> None: ...    # cheap checks before any work (ConfigError: key=value: problem; fix)
    def run(cfg: Config, ctx: JobContext) -> dict: ...   # returns the summary

Adding a stage is that module plus its name in :data:`STAGES` (the CLI's list).
:func:`execute` wraps ``run`` with everything every stage must do, so stages never
repeat it: make the config's relative paths absolute (they mean the directory the job
started in, also in Ray workers and Tune trials: :mod:`hardpos.config.paths`), run the
stage's ``check`` (inputs, servers, weights, cheapest first: :mod:`hardpos.preflight` has the
shared helpers) before anything is started or written, open an MLflow run
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

from hardpos import logs, storage, tracking
from hardpos.config import JobConfig, RayConfig, TrackingConfig, dump_yaml, to_dict
from hardpos.config.paths import absolute_paths, resolve_tracking_uri
from hardpos.tracking.redact import redact

# Ray Train's switch for its preemption watcher (ray.train.v2._internal.constants), off on a local Ray.
NO_PREEMPTION_WATCHER = ("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

STAGES = ("world", "perturb", "generate", "train", "evaluate", "sweep", "compare", "register", "demo", "interpolate",
          "audit", "debias", "base")
#: the stages that live in the package of their library (driver and workers side by side, as
#: Ray's example apps); every other stage is ``hardpos.stages.<name>``
STAGE_MODULES = {"train": "hardpos.train.stage", "generate": "hardpos.generate.stage",
                 "interpolate": "hardpos.interpolate.stage"}


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


def init_ray(cfg: RayConfig | None = None, log_level: str | None = None, **kwargs: Any) -> None:
    """Connect to ``cfg.address`` / ``$RAY_ADDRESS`` when given, else start a local Ray.

    log_level: below ``debug`` Ray's own logs, warnings and Ray Data's progress bars stay off
        the console (:mod:`hardpos.logs`). None: the running job's ``log_level`` (what
        :func:`execute` gave :func:`hardpos.logs.setup`), so stages need not pass it.
    A local Ray gets a dashboard on 127.0.0.1 only with ``cfg.include_dashboard``; its address
    is printed. Idempotent. Never stops anything it did not start (no ``ray stop`` anywhere).
    """
    # lazy: runtime is on `hardpos`'s import path (cli.py); ray takes seconds to import
    import ray

    if ray.is_initialized():
        return
    cfg = cfg or RayConfig()
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    log_level = log_level or logs.current_level()
    logs.apply_ray_env(log_level)  # before Ray starts: its workers inherit the environment
    for key, value in logs.ray_init_kwargs(log_level).items():
        kwargs.setdefault(key, value)
    if address:
        ray.init(address=address, **kwargs)
    else:
        # A local Ray is one node that no cloud can drain: Ray Train's preemption watcher has
        # nothing to watch there, and starting it prints an error-level core-worker line per
        # finetune (an actor with restarts whose constructor arguments sit in the object
        # store). Set before ray.init so the Train controller's process inherits it.
        os.environ.setdefault(NO_PREEMPTION_WATCHER[0], NO_PREEMPTION_WATCHER[1])
        kwargs.setdefault("include_dashboard", cfg.include_dashboard)
        if kwargs["include_dashboard"]:
            kwargs.setdefault("dashboard_host", "127.0.0.1")
        context = ray.init(num_cpus=cfg.num_cpus, **kwargs)
        if kwargs["include_dashboard"] and getattr(context, "dashboard_url", None):
            print(f"[hardpos] Ray dashboard: http://{context.dashboard_url}", file=sys.stderr)
    logs.quiet_ray_data(log_level)
    logs.quiet_raylet(log_level)


def reopen_run(cfg: TrackingConfig, run_id: str | None, spill_dir: str | None = None) -> tracking.RunLogger | None:
    """Continue the existing MLflow run ``run_id`` (status back to RUNNING) instead of creating one.

    What a resumed job (an interrupted sweep, one of its trials) logs into, so a re-run adds no
    duplicate run. None -- the caller then starts a new run -- when tracking is off, ``run_id`` is
    empty or a locally recorded placeholder, the server does not answer, or the run is gone or deleted.
    """
    if not cfg.enabled or not run_id or run_id.startswith(tracking.LOCAL_PREFIX):
        return None
    uri = resolve_tracking_uri(cfg.tracking_uri)
    if tracking.probe(uri, cfg.request_timeout_s) is not None:
        return None
    # lazy: runtime is on `hardpos`'s import path (cli.py); mlflow takes seconds to import
    from mlflow.tracking import MlflowClient

    try:
        tracking.fail_fast_mlflow()
        client = MlflowClient(uri)
        if client.get_run(run_id).info.lifecycle_stage != "active":
            return None
        client.update_run(run_id, status="RUNNING")
    except Exception:  # noqa: BLE001 - gone, deleted or unreachable: a new run is the answer
        return None
    return tracking.RunLogger(uri, run_id, spill_dir, options=tracking.queue_options(cfg))


def stage_module(name: str):
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return importlib.import_module(STAGE_MODULES.get(name, f"hardpos.stages.{name}"))


def resolve_output_dir(output_dir: str) -> str:
    return output_dir if storage.is_s3(output_dir) else str(Path(output_dir).expanduser().resolve())


def execute(
    stage: str,
    cfg: JobConfig,
    *,
    parent_run_id: str | None = None,
    run_fn: Callable[[Any, JobContext], dict] | None = None,
    quiet: bool = False,
    resume_run_id: str | None = None,
) -> dict[str, Any]:
    """Run one stage under the job contract and return its summary (also in summary.json).

    run_fn: run this instead of the stage module's ``run`` (and skip its ``check``: the sweep's
        trials, whose shared inputs the sweep checked once).
    resume_run_id: log into this existing MLflow run (see :func:`reopen_run`) instead of a new
        one. None: a stage module that defines ``resume_run_id(cfg) -> str | None`` (the sweep:
        the run of the interrupted sweep it resumes) is asked, when ``run_fn`` is not given.
    """
    logs.setup(cfg.log_level)
    logs.apply_ray_env(cfg.log_level)  # also quiets MLflow's download bars in stages without Ray
    module = stage_module(stage) if run_fn is None else None
    fn = run_fn or module.run
    # Relative paths mean this directory, also in Ray workers and Tune trials (which run elsewhere).
    cfg = absolute_paths(cfg)
    cfg = dataclasses.replace(cfg, output_dir=resolve_output_dir(cfg.output_dir))
    if module is not None:
        # A user's mistake (a missing file, a dead server, weights that cannot be fetched)
        # costs seconds and one line, before anything is started or written.
        module.check(cfg)
    storage.makedirs(cfg.output_dir)
    if resume_run_id is None and hasattr(module, "resume_run_id"):
        resume_run_id = module.resume_run_id(cfg)
    spill_dir = tracking.spill_dir_for(cfg.output_dir)
    run = reopen_run(cfg.tracking, resume_run_id, spill_dir)
    if run is None:
        run_name = cfg.tracking.run_name or f"{stage}-{time.strftime('%Y%m%d-%H%M%S')}"
        # mlflow.source.*: the runs table's Source column names the stage that made the run
        run = tracking.start_run(cfg.tracking, run_name, tags={"hardpos.stage": stage, "mlflow.source.name": f"hardpos {stage}",
                                                               "mlflow.source.type": "JOB"},
                                 parent_run_id=parent_run_id, spill_dir=spill_dir)
    ctx = JobContext(stage=stage, output_dir=cfg.output_dir, run=run)
    started = time.time()
    try:
        if run is not None:
            # What is recorded is redacted (hardpos.tracking.redact): a password in a URI or a
            # header's value reads ***; the stage itself runs with the real config.
            recorded = redact(to_dict(cfg))
            run.log_params(recorded)
            run.log_text(dump_yaml(recorded), "config.yaml")
            # lineage in MLflow's runs table: the triplets and benchmarks this run reads
            run.log_inputs(redact(tracking.config_inputs(cfg)))
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
        summary = redact(summary)
        summary_uri = storage.write_json(ctx.path("summary.json"), summary)
    except BaseException:
        tracking.end_run(run, "FAILED")
        raise
    if not quiet:
        print(f"[hardpos] {stage} finished in {summary['elapsed_s']:.1f}s; summary: {summary_uri}", file=sys.stderr)
    return summary
