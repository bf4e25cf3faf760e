"""Ray Tune sweep over any train-config key (default: the paper's hard-negative weight grid
with w_pos = 1, plus an HN-only control). Every trial is a full run of the train stage in a
nested MLflow run; the sweep ends with a Table-3-style comparison, a trade-off plot, the
Pareto front, and the best model registered as ``champion``.

What a trial is (the search space, its overrides, the objective) is plain Python here; Ray
Tune runs the trials; the comparison is the compare stage's (:mod:`hardpos.stages.compare`),
and "best" and its registration are :func:`hardpos.models.registry.rank` /
:func:`hardpos.models.registry.register_ranked` (shared with the register stage and the demo: ties
go to the earlier trial).

Search space (YAML, any train config key, dotted)::

    search_space:
      loss.w_neg: {grid_search: [0.0, 0.25, 0.5, 0.75, 1.0]}
      loss.w_pos: 1.0                       # a constant
      optim.lr: {loguniform: [1.0e-6, 1.0e-4]}
      data.batch_size: {choice: [64, 128]}
    extra_trials:                           # appended to the grid, e.g. the HN-only control
      - {loss.w_pos: 0.0, loss.w_neg: 1.0}

Every grid point and every extra trial becomes one entry of a single Tune ``grid_search``
over override dicts, so controls sit beside the grid; sampled keys (choice/uniform/
loguniform/randint) are drawn per trial, ``num_samples`` times per grid entry.

Resume: the same command run again on the same ``output_dir`` after an interruption (Ctrl-C,
a lost driver, failed trials) restores the Tune experiment (``Tuner.restore``): finished
trials are kept, not re-run; unfinished and failed ones run again. The sweep logs into its
earlier MLflow run and each re-run trial into its own earlier nested run, so MLflow holds one
run per sweep and per trial. A different config on the same ``output_dir`` is refused
(``resume=false`` starts a new sweep there)."""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hardpos import logs, preflight, runtime, storage, tracking
from hardpos.config import ConfigError, JobConfig, from_dict, load_config, set_dotted, to_dict
from hardpos.config.paths import absolute_paths, absolute_value, resolve_tracking_uri
from hardpos.models import registry, weights
from hardpos.models.uri import mlflow_client
from hardpos.runtime import JobContext
from hardpos.stages import compare

if TYPE_CHECKING:
    from ray import tune

# The CLI imports this module for its Config: Ray Tune loads inside the functions that run
# the sweep (`# lazy:` below), once a job starts.


def _paper_grid() -> dict[str, Any]:
    return {"loss.w_neg": {"grid_search": [0.0, 0.25, 0.5, 0.75, 1.0]}, "loss.w_pos": 1.0}


@dataclasses.dataclass
class Config(JobConfig):
    """train_config: YAML file of the train stage the trials start from (None: its defaults).
    train_overrides: dotted train-config overrides applied to every trial (before the search space).
    search_space: dotted train key -> constant | {grid_search: [...]} | {choice: [...]} |
        {uniform|loguniform|randint: [low, high]}.
    extra_trials: override dicts appended to the grid (default: the HN-only control).
    num_samples: Tune samples per grid entry (for the sampled keys).
    objective_metrics: the objective is their mean (default: augmented accuracy on REPLACE and SWAP).
    metric / mode: what Tune and the registry optimise (``objective`` = the mean above).
    scheduler: ``fifo`` or ``asha`` (early stopping on ``metric`` per epoch).
    asha_grace_period / asha_max_t: ASHA's epochs before stopping / maximum epochs.
    max_concurrent_trials: trials at once (each holds its Ray Train workers); capped, saying so, to
        what the cluster's CPUs hold (:func:`trials_that_fit`).
    trial_driver_cpus: CPU of each trial's driver (fractional, so drivers never starve workers).
    max_failures: retries of a failed trial (Tune FailureConfig).
    time_budget_s: stop launching trials after this many seconds (None: no limit).
    pareto: metric -> max|min; the report marks the trials no other trial beats on all of them.
    register: register the best trial's model (champion) and the runner-up (challenger).
    model_name: registered model name.
    resume: an interrupted sweep in ``output_dir`` (same config) resumes instead of starting over.
    seed: every trial's training seed (model init, shuffling; unless ``train_overrides`` or the
        search space set ``seed``) and the seed of Tune's draws for sampled keys, so the same
        command gives the same trials in the same order.
    """

    output_dir: str = "outputs/sweep"
    train_config: str | None = "jobs/configs/train.yaml"
    train_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    search_space: dict[str, Any] = dataclasses.field(default_factory=_paper_grid)
    extra_trials: list[dict[str, Any]] = dataclasses.field(default_factory=lambda: [{"loss.w_pos": 0.0, "loss.w_neg": 1.0}])
    num_samples: int = 1
    objective_metrics: list[str] = dataclasses.field(default_factory=lambda: ["replace/aug_acc", "swap/aug_acc"])
    metric: str = "objective"
    mode: Literal["max", "min"] = "max"
    scheduler: Literal["fifo", "asha"] = "fifo"
    asha_grace_period: int = 1
    asha_max_t: int = 100
    max_concurrent_trials: int = 1
    trial_driver_cpus: float = 0.5
    max_failures: int = 1
    time_budget_s: float | None = None
    pareto: dict[str, str] = dataclasses.field(default_factory=lambda: {"objective": "max", "replace/brittleness": "min", "swap/brittleness": "min"})
    register: bool = True
    model_name: str = "hardpos-clip"
    resume: bool = True


# --------------------------------------------------------------------------- the search space (no Ray)
SAMPLERS = ("choice", "uniform", "loguniform", "randint", "quniform")


def split_search_space(space: dict[str, Any]) -> tuple[dict[str, list], dict[str, tuple[str, Any]], dict[str, Any]]:
    """-> (grid keys -> values, sampled keys -> (sampler, args), constant keys -> value)."""
    grid, sampled, constant = {}, {}, {}
    for key, spec in space.items():
        if isinstance(spec, dict) and len(spec) == 1:
            (kind, args), = spec.items()
            if kind == "grid_search":
                if not isinstance(args, list) or not args:
                    raise ConfigError(f"search_space.{key}: grid_search needs a non-empty list")
                grid[key] = args
                continue
            if kind in SAMPLERS:
                if kind == "choice" and (not isinstance(args, list) or not args):
                    raise ConfigError(f"search_space.{key}: choice needs a non-empty list")
                if kind != "choice" and (not isinstance(args, list) or len(args) not in (2, 3)):
                    raise ConfigError(f"search_space.{key}: {kind} needs [low, high]")
                if kind == "loguniform" and min(args[:2]) <= 0:
                    raise ConfigError(f"search_space.{key}: loguniform bounds must be > 0")
                sampled[key] = (kind, args)
                continue
            raise ConfigError(f"search_space.{key}: unknown search kind {kind!r}; use grid_search or one of {', '.join(SAMPLERS)}")
        constant[key] = spec
    return grid, sampled, constant


def grid_points(grid: dict[str, list], constant: dict[str, Any], extra_trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the grid (with constants), then the extra trials."""
    keys = list(grid)
    points = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))] if keys else [{}]
    points = [{**constant, **p} for p in points]
    return points + [{**constant, **extra} for extra in extra_trials]


def to_tune_space(space: dict[str, Any], extra_trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Ray Tune param_space: ``{"overrides": grid_search([...]), "<sampled key>": sampler}``."""
    from ray import tune  # lazy: see the module's imports

    grid, sampled, constant = split_search_space(space)
    out: dict[str, Any] = {"overrides": tune.grid_search(grid_points(grid, constant, extra_trials))}
    for key, (kind, args) in sampled.items():
        out[key] = getattr(tune, kind)(args) if kind == "choice" else getattr(tune, kind)(*args)
    return out


def trial_overrides(tune_config: dict[str, Any]) -> dict[str, Any]:
    """Flatten one trial's Tune config back into dotted train-config overrides."""
    overrides = dict(tune_config.get("overrides", {}))
    overrides.update({k: v for k, v in tune_config.items() if k != "overrides"})
    return overrides


def objective(metrics: dict[str, Any], terms: list[str]) -> float | None:
    """Mean of the named metrics (None unless all are present and finite)."""
    values = [metrics.get(t) for t in terms]
    if not values or any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


STATE_FILE = "sweep_state.json"  # {"run_id": the sweep's MLflow run, "config": the sweep's config}


# --------------------------------------------------------------------------- resume
def _tune_location(output_dir: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path) of the Tune experiment ``<output_dir>/tune``."""
    return storage.arrow_filesystem(storage.join(output_dir, "tune"))


def resumable(cfg: Config) -> bool:
    """True when ``output_dir`` holds a Tune experiment of this same sweep config to restore.

    Raises ConfigError when it holds one of a different config (resuming it would mix two
    sweeps in one comparison)."""
    if not cfg.resume:
        return False
    from ray import tune  # lazy: see the module's imports

    fs, path = _tune_location(cfg.output_dir)
    if not tune.Tuner.can_restore(path, storage_filesystem=fs):
        return False
    state_uri = storage.join(cfg.output_dir, STATE_FILE)
    saved = storage.read_json(state_uri).get("config") if storage.exists(state_uri) else None
    if saved is not None and saved != _comparable(cfg):
        changed = sorted(k for k in set(saved) | set(_comparable(cfg)) if saved.get(k) != _comparable(cfg).get(k))
        raise ConfigError(f"{cfg.output_dir} holds an interrupted sweep with a different config (changed: "
                          f"{', '.join(changed)}); run it with its own config to resume it, or set "
                          f"output_dir to a new folder or resume=false to start a new sweep")
    return True


def _comparable(cfg: Config) -> dict[str, Any]:
    """The config as saved in STATE_FILE (plain JSON types, so a reloaded copy compares equal)."""
    return json.loads(json.dumps(to_dict(cfg), default=str))


def resume_run_id(cfg: Config) -> str | None:
    """The MLflow run of the interrupted sweep this one resumes (runtime.execute reopens it)."""
    if not resumable(cfg):
        return None
    state_uri = storage.join(cfg.output_dir, STATE_FILE)
    return storage.read_json(state_uri).get("run_id") if storage.exists(state_uri) else None


def _trial_run_to_resume(tracking_cfg: dict[str, Any], parent_run_id: str | None, name: str) -> str | None:
    """The nested MLflow run an earlier, unfinished attempt of trial ``name`` left (None: none)."""
    if not parent_run_id or not tracking_cfg.get("enabled", True):
        return None
    try:
        tracking.fail_fast_mlflow()
        runs = tracking.search_runs(tracking_cfg["tracking_uri"], tracking_cfg["experiment"],
                                    f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.mlflow.runName = '{name}'",
                                    order_by=["attributes.start_time DESC"])
    except Exception:  # noqa: BLE001 - server unreachable: the trial starts a run (or records it locally)
        return None
    unfinished = [r for r in runs if r.info.status != "FINISHED"]
    return unfinished[0].info.run_id if unfinished else None


# --------------------------------------------------------------------------- config plumbing
def train_module():
    return runtime.stage_module("train")


def base_train_dict(cfg: Config) -> dict[str, Any]:
    """The trials' shared train config as a plain dict (validated)."""
    module = train_module()
    path = cfg.train_config
    if path and not storage.is_s3(path) and not Path(path).exists():
        raise ConfigError(f"train_config not found: {path}")
    base = load_config(module.Config, path, [f"{k}={_yaml(v)}" for k, v in cfg.train_overrides.items()])
    # Trials run in Tune's trial folders: their paths must not be relative (see hardpos.config.paths).
    return to_dict(absolute_paths(base))


def trial_base(cfg: Config) -> dict[str, Any]:
    """The train config every trial starts from: :func:`base_train_dict` with the sweep's
    ``log_level`` and ``seed`` (unless ``train_overrides`` sets ``seed``; a search-space
    ``seed`` still wins per trial, as every trial override does)."""
    base = base_train_dict(cfg)
    base["log_level"] = cfg.log_level
    if "seed" not in cfg.train_overrides:
        base["seed"] = cfg.seed
    return base


def _yaml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def trial_train_config(base: dict[str, Any], overrides: dict[str, Any]):
    """Base train dict + one trial's dotted overrides -> a validated train Config."""
    data = copy.deepcopy(base)
    for key, value in overrides.items():
        set_dotted(data, key, value)
    return from_dict(train_module().Config, data)


def absolute_space(cfg: Config) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(search_space, extra_trials) with every path value of a train key made absolute from the
    directory the sweep started in: a trial runs in its own Tune folder."""
    def value(key: str, spec: Any) -> Any:
        if isinstance(spec, dict) and len(spec) == 1:
            (kind, args), = spec.items()
            if kind in ("grid_search", "choice") and isinstance(args, list):
                return {kind: [absolute_value(key, a) for a in args]}
            return spec
        return absolute_value(key, spec)

    space = {k: value(k, v) for k, v in cfg.search_space.items()}
    extra = [{k: absolute_value(k, v) for k, v in trial.items()} for trial in cfg.extra_trials]
    return space, extra


def validate_space(cfg: Config, base: dict[str, Any]) -> int:
    """Every grid entry must make a valid train config: typos fail before any trial runs."""
    space, extra_trials = absolute_space(cfg)
    grid, sampled, constant = split_search_space(space)
    points = grid_points(grid, constant, extra_trials)
    for point in points:
        trial_train_config(base, point)
    for key, (kind, args) in sampled.items():
        trial_train_config(base, {key: args[0]})
    return len(points) * cfg.num_samples


# --------------------------------------------------------------------------- the trial
def _objective_callback(terms: list[str]):
    """TuneReportCallback that adds ``objective`` (mean of ``terms``) to every report."""
    from ray.tune.integration.ray_train import TuneReportCallback  # lazy: see the module's imports

    class ObjectiveReportCallback(TuneReportCallback):
        def after_report(self, run_context, metrics, checkpoint):
            metrics = [dict(m) for m in metrics]
            value = objective(metrics[0], terms)
            if value is not None:
                metrics[0]["objective"] = value
            super().after_report(run_context, metrics, checkpoint)

    return ObjectiveReportCallback()


def run_trial(tune_config: dict[str, Any], *, base: dict[str, Any], output_dir: str, tracking_cfg: dict[str, Any],
              parent_run_id: str | None, objective_terms: list[str], driver_cpus: float = 0.0,
              concurrent_trials: int = 1) -> None:
    """One Tune trial = one run of the train stage (its own nested MLflow run).

    driver_cpus / concurrent_trials: what this trial's driver holds and how many trials
    share the cluster, so its data decode tasks ask for no more CPU than its share leaves.
    """
    # lazy: see the module's imports (this runs in a Tune trial's process)
    import ray
    from ray import tune

    from hardpos.train.trainer import decode_task_cpus

    ctx = tune.get_context()
    overrides = trial_overrides(tune_config)
    train_cfg = trial_train_config(base, overrides)
    name = ctx.get_trial_name()
    share = ray.cluster_resources().get("CPU", 0.0) / max(1, concurrent_trials)
    decode_cpus = decode_task_cpus(train_cfg, share, reserved_cpus=driver_cpus)
    train_cfg = dataclasses.replace(
        train_cfg,
        output_dir=storage.join(output_dir, "trials", name),
        tracking=dataclasses.replace(train_cfg.tracking, **{**tracking_cfg, "run_name": name}),
        data=dataclasses.replace(train_cfg.data, decode_cpus=decode_cpus),
    )
    module = train_module()
    callback = _objective_callback(objective_terms)

    def run_fn(cfg, run_ctx):
        summary = module.run(cfg, run_ctx, callbacks=[callback])
        value = objective(summary.get("final_metrics", {}), objective_terms)
        summary["overrides"] = overrides  # the sweep's comparison reads it when MLflow is unreachable
        if value is not None:
            run_ctx.log_metrics({"objective": value})
            summary["objective"] = value
        if run_ctx.run is not None:
            run_ctx.run.set_tags({"hardpos.sweep_overrides": overrides})
        return summary

    runtime.execute("train", train_cfg, parent_run_id=parent_run_id, run_fn=run_fn, quiet=True,
                    resume_run_id=_trial_run_to_resume(tracking_cfg, parent_run_id, name))


def check(cfg: Config) -> None:
    """Before any trial: the trials' shared train config (file + overrides) loads and the search
    space names its keys, then what every trial reads passes the train stage's data check once
    (not the same failure in each trial); then the tracking server and the weights."""
    trials = trial_base(cfg)
    validate_space(cfg, trials)  # the config itself first: a typo in the search space costs nothing to find
    base = from_dict(train_module().Config, trials)
    preflight.check_s3_endpoint([base.data.train_path, base.data.val_path, base.model.pretrained, cfg.output_dir])
    train_module().check_data(base, allow_empty=cfg.allow_empty, key_prefix="train_overrides.")
    tracking.check_tracking(cfg.tracking)
    weights.check_model("train_overrides.model", base.model.arch, base.model.pretrained)


def trials_that_fit(cluster_cpus: float, driver_cpus: float, base: Any) -> int:
    """How many trials the cluster's CPUs hold at once: each holds its driver, its Ray Train
    workers (``scaling.num_workers x scaling.cpus_per_worker``) and must leave its data decode
    tasks some CPU (``data.decode_cpus`` when set, else at least 0.01: fractional decode tasks
    are scheduled, a trial whose share leaves none waits for data forever). 0 when not even one
    fits (an autoscaling cluster before its nodes join)."""
    decode = base.data.decode_cpus if base.data.decode_cpus is not None else 0.01
    need = driver_cpus + base.scaling.num_workers * base.scaling.cpus_per_worker + decode
    return int(math.floor(cluster_cpus / need + 1e-9)) if need > 0 else 0


def concurrent_trials(cfg: Config, base: Any, cluster_cpus: float) -> int:
    """``max_concurrent_trials``, capped (saying so on stderr) to :func:`trials_that_fit` on this
    cluster: more trials than the CPUs hold would each get too small a share for their decode
    tasks and hang. When not even one fits, one (its decode tasks wait for a node; see
    :func:`hardpos.train.trainer.decode_task_cpus`)."""
    fit = trials_that_fit(cluster_cpus, cfg.trial_driver_cpus, base)
    if cfg.max_concurrent_trials <= max(1, fit):
        return cfg.max_concurrent_trials
    capped = max(1, fit)
    per_trial = cfg.trial_driver_cpus + base.scaling.num_workers * base.scaling.cpus_per_worker
    held = f"{fit} trial(s)" if fit else "no trial (its decode tasks wait for a node with a free CPU)"
    print(f"[hardpos] max_concurrent_trials={cfg.max_concurrent_trials}: the cluster's {cluster_cpus:g} CPUs hold "
          f"{held} at once ({per_trial:g} CPU each for the driver and workers, plus the data decode "
          f"tasks); running {capped} at a time", file=sys.stderr)
    return capped


# --------------------------------------------------------------------------- the stage
def run(cfg: Config, ctx: JobContext) -> dict:
    from ray import tune  # lazy: see the module's imports

    base = trial_base(cfg)
    n_trials = validate_space(cfg, base)
    runtime.init_ray(cfg.ray)
    import ray  # lazy: see the module's imports

    train_base = from_dict(train_module().Config, base)
    at_once = concurrent_trials(cfg, train_base, ray.cluster_resources().get("CPU", 0.0))
    tracking_cfg = {
        "tracking_uri": resolve_tracking_uri(cfg.tracking.tracking_uri),
        "experiment": cfg.tracking.experiment,
        "enabled": cfg.tracking.enabled,
        # The sweep checked the server when it started; a trial that starts during an outage
        # records its run locally (sent at the end of the sweep) instead of failing.
        "required": False,
        "drain_timeout_s": cfg.tracking.drain_timeout_s,
        "request_timeout_s": cfg.tracking.request_timeout_s,
    }
    trainable = tune.with_resources(
        functools.partial(run_trial, base=base, output_dir=ctx.output_dir, tracking_cfg=tracking_cfg,
                          parent_run_id=ctx.run_id, objective_terms=list(cfg.objective_metrics),
                          driver_cpus=cfg.trial_driver_cpus, concurrent_trials=at_once),
        {"CPU": cfg.trial_driver_cpus},
    )
    fs, tune_path = _tune_location(ctx.output_dir)
    param_space = to_tune_space(*absolute_space(cfg))
    resuming = resumable(cfg)
    storage.write_json(storage.join(ctx.output_dir, STATE_FILE), {"run_id": ctx.run_id, "config": _comparable(cfg)})
    if resuming:
        # Finished trials keep their results; unfinished and failed ones run again.
        print(f"[hardpos] resuming the interrupted sweep in {tune_path}", file=sys.stderr)
        # resume_errored, not restart_errored: the latter re-adds a failed trial under a new name,
        # which would give it a second MLflow run; the same trial (no Tune checkpoint) starts over.
        tuner = tune.Tuner.restore(tune_path, trainable, resume_unfinished=True, resume_errored=True,
                                   param_space=param_space, storage_filesystem=fs)
    else:
        tuner = _new_tuner(cfg, trainable, param_space, fs, tune_path, at_once)
    grid = tuner.fit()
    return _report(cfg, ctx, grid, n_trials, tracking_cfg)


def _new_tuner(cfg: Config, trainable: Any, param_space: dict[str, Any], fs: Any, tune_path: str,
               at_once: int) -> tune.Tuner:
    # lazy: see the module's imports
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search import BasicVariantGenerator

    scheduler = (
        ASHAScheduler(time_attr="training_iteration", grace_period=cfg.asha_grace_period, max_t=cfg.asha_max_t)
        if cfg.scheduler == "asha" else FIFOScheduler()
    )
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=cfg.metric, mode=cfg.mode, scheduler=scheduler, num_samples=cfg.num_samples,
            # Grid order is the trial order; the sampled keys' draws follow the sweep's seed. The
            # concurrency limit goes to the generator: Tune ignores TuneConfig's for a given one.
            search_alg=BasicVariantGenerator(random_state=cfg.seed, max_concurrent=at_once),
            time_budget_s=cfg.time_budget_s,
        ),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(Path(tune_path).parent), storage_filesystem=fs,
            failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
            verbose=2 if logs.verbose(cfg.log_level) else 1,  # 1: the trial status table
        ),
    )


def _report(cfg: Config, ctx: JobContext, grid: Any, n_trials: int, tracking_cfg: dict[str, Any]) -> dict[str, Any]:
    """The trials compared (table, plot, Pareto front) and the best registered -> the summary."""
    failed = [{"trial": r.path.rsplit("/", 1)[-1] if r.path else None, "config": trial_overrides(r.config or {}),
               "error": f"{type(r.error).__name__}: {r.error}"[:2000]} for r in grid if r.error is not None]
    rows, tracking_down = trial_rows(cfg, ctx, tracking_cfg["tracking_uri"])
    finished = [r for r in rows if r["status"] == "FINISHED"]
    table, front = compare.compare_rows(finished, cfg.pareto)
    artifacts = compare.write_comparison(finished, table, ctx)
    print(table)
    if failed:
        print(f"WARNING: {len(failed)} of {n_trials} trials failed:", file=sys.stderr)
        for f in failed:
            print(f"  {f['trial']} {f['config']}: {f['error'][:300]}", file=sys.stderr)
    if not finished:
        raise RuntimeError(f"all {n_trials} trials failed; first error: {failed[0]['error'] if failed else 'unknown'}")

    ranked = registry.rank(finished, cfg.metric, cfg.mode)  # the register stage's and the demo's ranking
    summary: dict[str, Any] = {
        "trials": n_trials,
        "finished": len(finished),
        "failed": failed,
        "metric": cfg.metric,
        "best": {k: v for k, v in ranked[0].items()} if ranked else None,
        "pareto_front": [finished[i]["run_name"] for i in front],
        "table": table,
        "artifacts": artifacts,
        "rows": finished,
    }
    if tracking_down:
        summary["registered"] = False
        print(f"WARNING: the comparison comes from the trials' summary.json files and no model was registered: "
              f"{tracking_down}", file=sys.stderr)
    if cfg.register and ranked and not tracking_down:
        client = mlflow_client(tracking_cfg["tracking_uri"])
        summary.update(registry.register_ranked(client, ranked, cfg.model_name, "champion", "challenger", metric=cfg.metric))
        print(f"champion: {ranked[0]['run_name']} ({cfg.metric}={ranked[0][cfg.metric]:.4f}) -> {summary['model_uri']}")
    return summary


def trial_rows(cfg: Config, ctx: JobContext, tracking_uri: str) -> tuple[list[dict[str, Any]], str | None]:
    """The trials as comparison rows, and why MLflow could not give them (None when it did).

    From MLflow when it answers, after sending what trials could not deliver during an
    outage (their undelivered files; runs recorded locally are created then). Otherwise
    -- server down, tracking off, or the sweep's own run recorded locally -- from the
    trials' summary.json files, so a tracking outage never loses a finished sweep's result.
    """
    if not cfg.tracking.enabled or ctx.run is None:
        return compare.summary_rows(ctx.output_dir), "tracking is disabled"
    problem = tracking.probe(tracking_uri, cfg.tracking.request_timeout_s)
    if problem is None and not storage.is_s3(ctx.output_dir):
        trials_dir = Path(ctx.output_dir) / "trials"
        if trials_dir.is_dir() and tracking.undelivered_files(trials_dir):
            sent = tracking.replay(trials_dir, timeout_s=cfg.tracking.request_timeout_s)
            print(f"sent {sent.delivered} tracking record(s) the trials could not deliver"
                  + (f"; {sent.left} still left: {sent.errors[:3]}" if sent.left else ""), file=sys.stderr)
    if problem is None and not ctx.run.local:
        try:
            tracking.fail_fast_mlflow()
            return compare.collect_runs(tracking_uri, cfg.tracking.experiment, ctx.run_id), None
        except Exception as exc:  # noqa: BLE001 - the server went away again: fall back below
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
    reason = problem or "the sweep's run was recorded locally (server down at its start)"
    return compare.summary_rows(ctx.output_dir), f"{tracking_uri} unreachable ({reason})"
