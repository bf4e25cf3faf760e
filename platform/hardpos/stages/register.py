"""Register the chosen run's model in the MLflow Model Registry with alias ``champion``
(and ``challenger`` for the runner-up). The run is given (``run_id``) or chosen as the best
finished train run of ``experiment`` (children of ``parent_run_id`` when given) by ``metric``."""
from __future__ import annotations

import dataclasses
from typing import Literal

from hardpos import registry, tracking
from hardpos.config import ConfigError, JobConfig
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
    """The Ray-free core: pick, register, alias. Returns the summary."""
    client = registry.mlflow_client(tracking_uri)  # runs and the registry: the one configured store
    if cfg.run_id:
        ranked = [client.get_run(cfg.run_id)]
    else:
        runs = registry.candidate_runs(client, experiment, cfg.parent_run_id)
        ranked = registry.rank_runs(runs, cfg.metric, cfg.mode)
        if not ranked:
            raise ConfigError(
                f"no finished run with a model and metric {cfg.metric!r} in experiment {experiment!r}"
                + (f" under parent {cfg.parent_run_id}" if cfg.parent_run_id else "")
            )
    champion = registry.register(client, ranked[0], cfg.name, cfg.alias, metric=cfg.metric)
    out = {"champion": dataclasses.asdict(champion), "model_uri": f"models:/{cfg.name}@{cfg.alias}"}
    if cfg.challenger_alias and len(ranked) > 1:
        out["challenger"] = dataclasses.asdict(registry.register(client, ranked[1], cfg.name, cfg.challenger_alias, metric=cfg.metric))
    return out


def run(cfg: Config, ctx: JobContext) -> dict:
    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    summary = register_best(cfg, uri, cfg.experiment or cfg.tracking.experiment)
    champ = summary["champion"]
    print(f"registered {cfg.name} version {champ['version']} (run {champ['run_id']}) as @{cfg.alias}; load it with {summary['model_uri']}")
    return summary
