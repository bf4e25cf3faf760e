"""The MLflow Model Registry side of HardPos: choose a run, register its model, set aliases.

A trained HardPos model is logged by the train stage as an MLflow model (see
:mod:`hardpos.mlflow_model`), whose URI the run records in the tag ``hardpos.model_uri``
(falling back to ``runs:/<run_id>/model``).  Registering it makes
``models:/<name>@champion`` loadable by ``evaluate`` and the Serve app through
:func:`hardpos.model.load_model`, with no training config files needed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hardpos import tracking

MODEL_URI_TAG = "hardpos.model_uri"


@dataclasses.dataclass
class Registered:
    name: str
    version: str
    run_id: str
    alias: str
    model_uri: str
    metric: float | None


def model_uri_of(run) -> str:
    return run.data.tags.get(MODEL_URI_TAG) or f"runs:/{run.info.run_id}/model"


def rank_runs(runs: list, metric: str, mode: str = "max") -> list:
    """Runs that have ``metric``, best first (ties: newest first)."""
    scored = [r for r in runs if metric in r.data.metrics]
    scored.sort(key=lambda r: (r.data.metrics[metric] if mode == "max" else -r.data.metrics[metric], r.info.start_time), reverse=True)
    return scored


def candidate_runs(client, experiment: str, parent_run_id: str | None = None, stage: str = "train") -> list:
    """Finished runs of ``experiment`` (children of ``parent_run_id`` when given) that logged a model."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"MLflow experiment {experiment!r} does not exist at {client.tracking_uri}")
    filters = ["attributes.status = 'FINISHED'"]
    if parent_run_id:
        filters.append(f"tags.mlflow.parentRunId = '{parent_run_id}'")
    runs = client.search_runs([exp.experiment_id], filter_string=" and ".join(filters), max_results=5000)
    return [r for r in runs if MODEL_URI_TAG in r.data.tags or r.data.tags.get("hardpos.stage") == stage]


def register(
    client,
    run,
    name: str,
    alias: str = "champion",
    *,
    metric: str | None = None,
    extra_tags: dict[str, Any] | None = None,
) -> Registered:
    """Register ``run``'s model under ``name`` and point ``alias`` at the new version.

    Tags on the version: the run's key metrics (``metric.<name>``), its training-data
    provenance (the run's ``data.*`` params) and anything in ``extra_tags``.
    """
    uri = model_uri_of(run)
    try:
        client.get_registered_model(name)
    except Exception:  # noqa: BLE001 - mlflow raises RestException/MlflowException for "not found"
        client.create_registered_model(name, description="HardPos CLIP finetuned with hard negatives and hard positives")
    source, model_id = model_source(client, uri, run)
    # MLflow's SQL registry resolves models:/<model_id> sources through the *global*
    # tracking store, not the client's.
    with tracking.use_tracking_uri(client.tracking_uri):
        version = client.create_model_version(name, source=source, run_id=run.info.run_id, model_id=model_id)
    tags: dict[str, Any] = {f"metric.{k}": f"{v:.6g}" for k, v in sorted(run.data.metrics.items()) if "/" in k and not k.startswith("loss/")}
    tags.update({f"param.{k}": v for k, v in run.data.params.items() if k.startswith(("data.", "model.", "loss."))})
    tags.update({"hardpos.run_id": run.info.run_id, "hardpos.model_uri": uri, **(extra_tags or {})})
    for key, value in tags.items():
        client.set_model_version_tag(name, version.version, key[:250], str(value)[:5000])
    client.set_registered_model_alias(name, alias, version.version)
    return Registered(name, str(version.version), run.info.run_id, alias, uri, run.data.metrics.get(metric) if metric else None)


def model_source(client, uri: str, run) -> tuple[str, str | None]:
    """(source, logged-model id) for a model version of ``uri``.

    MLflow 3 stores a model logged with ``log_model(name=...)`` as a *logged model* with
    its own artifact location, so ``runs:/<run>/<name>`` is resolved to that logged model
    (``models:/<model_id>``), as ``mlflow.register_model`` does; a plain artifact folder
    (no logged model of that name) falls back to the run's artifact path.
    """
    if uri.startswith("runs:/"):
        name = uri.split("/", 2)[2] if uri.count("/") >= 2 else ""
        models = client.search_logged_models(
            experiment_ids=[run.info.experiment_id],
            filter_string=f"source_run_id = '{run.info.run_id}' AND name = '{name}'",
        )
        if models:
            newest = max(models, key=lambda m: m.creation_timestamp or 0)
            return f"models:/{newest.model_id}", newest.model_id
        return f"{run.info.artifact_uri.rstrip('/')}/{name}", None
    if uri.startswith("models:/m-"):
        return uri, uri[len("models:/"):]
    return uri, None


def set_alias(client, name: str, alias: str, version: str) -> None:
    client.set_registered_model_alias(name, alias, version)
