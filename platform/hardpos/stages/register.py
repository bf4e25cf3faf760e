"""Register the chosen run's model in the MLflow Model Registry with alias ``champion``
(and ``challenger`` for the runner-up). The run is given (``run_id``) or chosen as the best
finished train run of ``experiment`` (children of ``parent_run_id`` when given) by ``metric``,
ranked as the sweep and the demo rank (:func:`hardpos.models.registry.rank`)."""
from __future__ import annotations

import dataclasses
from typing import Literal

from hardpos import tracking
from hardpos.config import ConfigError, JobConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.models import registry
from hardpos.models.uri import mlflow_client
from hardpos.runtime import JobContext


@dataclasses.dataclass
class Config(JobConfig):
    """name: registered model name.
    run_id: the run whose model to register; None -> the best run by ``metric``.
    experiment: where to look for runs when run_id is None (default: tracking.experiment).
    parent_run_id: only consider child runs of this run (a sweep's parent run).
    metric / mode: how "best" is decided.
    alias / challenger_alias: aliases for the best and the runner-up ("" disables challenger).
    """

    output_dir: str = "outputs/register"
    name: str = "hardpos-clip"
    run_id: str | None = None
    experiment: str | None = None
    parent_run_id: str | None = None
    metric: str = "objective"
    mode: Literal["max", "min"] = "max"
    alias: str = "champion"
    challenger_alias: str = "challenger"


def register_best(cfg: Config, tracking_uri: str, experiment: str) -> dict:
    """The Ray-free core: pick (:func:`hardpos.models.registry.rank`; ties go to the older run),
    register and alias (:func:`hardpos.models.registry.register_ranked`). Returns the summary."""
    client = mlflow_client(tracking_uri)  # runs and the registry: the one configured store
    if cfg.run_id:
        ranked = [client.get_run(cfg.run_id)]
    else:
        runs = registry.candidate_runs(client, experiment, cfg.parent_run_id)
        ranked = registry.rank(runs, cfg.metric, cfg.mode)
        if not ranked:
            raise ConfigError(
                f"no finished run with a model and metric {cfg.metric!r} in experiment {experiment!r}"
                + (f" under parent {cfg.parent_run_id}" if cfg.parent_run_id else "")
            )
    return registry.register_ranked(client, ranked, cfg.name, cfg.alias, cfg.challenger_alias, metric=cfg.metric)


def check(cfg: Config) -> None:
    """Before any work: the tracking server (this stage's inputs are read, and named in its errors, by ``run``)."""
    tracking.check_tracking(cfg.tracking)


def run(cfg: Config, ctx: JobContext) -> dict:
    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    summary = register_best(cfg, uri, cfg.experiment or cfg.tracking.experiment)
    champ = summary["champion"]
    print(f"registered {cfg.name} version {champ['version']} (run {champ['run_id']}) as @{cfg.alias}; load it with {summary['model_uri']}")
    return summary
