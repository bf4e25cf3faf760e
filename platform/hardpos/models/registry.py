"""The MLflow Model Registry side of HardPos: choose a run, register its model, set aliases.

A trained HardPos model is logged by the train stage as an MLflow model (see
:mod:`hardpos.models.pyfunc`), whose URI the run records in the tag ``hardpos.model_uri``
(falling back to ``runs:/<run_id>/model``).  Registering it makes
``models:/<name>@champion`` loadable by ``evaluate`` and the Serve app through
:func:`hardpos.models.clip.load_model`, with no training config files needed.

This module is the write side: THE ranking of "best model" and THE registration. The read
side (parsing, resolving, downloading and pinning model URIs in one store) is
:mod:`hardpos.models.uri`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence, TypeVar

from hardpos.models.uri import logged_model, use_tracking_uri

MODEL_URI_TAG = "hardpos.model_uri"
T = TypeVar("T")


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


def metric_of(item: Any, metric: str) -> float | None:
    """``metric`` of an MLflow run (``run.data.metrics``) or of a plain row (a mapping),
    as a float; None when it is missing, not a number, NaN or infinite."""
    metrics = item.data.metrics if hasattr(item, "data") else item
    value = metrics.get(metric) if isinstance(metrics, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def rank(items: Sequence[T], metric: str, mode: str = "max", *, metrics_of: Callable[[T], Any] | None = None) -> list[T]:
    """THE ranking of "best model" (the sweep, the register stage and the demo all use it):
    the items with a finite ``metric``, best first (``mode`` "max" or "min").

    Items are MLflow runs or rows (mappings); ``metrics_of`` maps an item to what holds its
    metrics when it is neither (e.g. a model name -> its table row).
    Ties keep the given order: the earlier item wins. Callers list candidates oldest first
    (:func:`candidate_runs`, :func:`hardpos.stages.compare.collect_runs`) or in configuration order
    (the demo's variants), so a later run that only equals the champion never replaces it.
    Items with a missing, NaN or infinite metric are left out, never ranked last.
    """
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', not {mode!r}")
    get = metrics_of or (lambda item: item)
    scored = [(v, i, item) for i, item in enumerate(items) if (v := metric_of(get(item), metric)) is not None]
    # sorted() is stable and the index breaks ties explicitly: earlier first.
    scored.sort(key=lambda t: (-t[0] if mode == "max" else t[0], t[1]))
    return [item for _, _, item in scored]


def register_ranked(client, ranked: Sequence[Any], name: str, alias: str = "champion",
                    challenger_alias: str | None = "challenger", *, metric: str | None = None) -> dict[str, Any]:
    """THE registration: ``ranked[0]`` (an MLflow run, or a row with ``run_id``) becomes
    ``name@alias``; ``ranked[1]``, when there is one and ``challenger_alias`` is not empty,
    becomes ``name@challenger_alias``. Returns ``{"champion", "model_uri"[, "challenger"]}``
    (the :class:`Registered` facts as dicts). Raises ValueError for an empty ``ranked``."""
    if not ranked:
        raise ValueError(f"nothing to register as {name}@{alias}: no ranked run")

    def run_of(item):
        return item if hasattr(item, "info") else client.get_run(item["run_id"])

    champion = register(client, run_of(ranked[0]), name, alias, metric=metric)
    out: dict[str, Any] = {"champion": dataclasses.asdict(champion), "model_uri": f"models:/{name}@{alias}"}
    if challenger_alias and len(ranked) > 1:
        out["challenger"] = dataclasses.asdict(register(client, run_of(ranked[1]), name, challenger_alias, metric=metric))
    return out


def candidate_runs(client, experiment: str, parent_run_id: str | None = None, stage: str = "train") -> list:
    """Finished runs of ``experiment`` (children of ``parent_run_id`` when given) that logged a model."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"MLflow experiment {experiment!r} does not exist at {client.tracking_uri}")
    filters = ["attributes.status = 'FINISHED'"]
    if parent_run_id:
        filters.append(f"tags.mlflow.parentRunId = '{parent_run_id}'")
    # oldest first: rank() keeps the given order among ties, so the earlier run wins them
    runs = client.search_runs([exp.experiment_id], filter_string=" and ".join(filters), max_results=5000,
                              order_by=["attributes.start_time ASC"])
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
    with use_tracking_uri(client.tracking_uri):
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
        newest = logged_model(client, run, name)
        if newest is not None:
            return f"models:/{newest.model_id}", newest.model_id
        return f"{run.info.artifact_uri.rstrip('/')}/{name}", None
    if uri.startswith("models:/m-"):
        return uri, uri[len("models:/"):]
    return uri, None
