"""Sweep maths without Ray: search spaces from YAML, trial overrides, the objective.

The sweep job in three places, one job each: this module (what a trial is), the sweep
stage (``hardpos.stages.sweep``: Ray Tune at the edge, one train-stage run per trial) and
:mod:`hardpos.compare` (the trials compared: rows, Pareto front, ``comparison.md``), whose
tables and plots are :mod:`hardpos.report`'s.

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
"""
from __future__ import annotations

import itertools
import math
from typing import Any

from ray import tune

from hardpos.config import ConfigError

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
