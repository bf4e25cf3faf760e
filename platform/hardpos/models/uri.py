"""Model URIs in one MLflow store: parse, resolve, download and pin ``models:/`` and ``runs:/`` URIs.

The read side of the registry (:mod:`hardpos.models.registry` is the write side: ranking runs and
registering the best). Loading a model (:mod:`hardpos.models.clip`, in every worker and Serve
replica) needs only this half, and nothing here imports torch.

One store: a job's ``tracking.tracking_uri`` is both its tracking store and its model
registry.  Every lookup here takes that URI explicitly (:func:`mlflow_client`,
:func:`resolve_model_uri`, :func:`download_model`) and never reads MLflow's process-global
tracking/registry URI: Ray Train workers and Serve replicas run in other processes (and
other working directories), so the URI travels with the config, not with the driver's
global state.  MLflow's own ``models:/`` download resolves registered models through the
*global* registry URI even when given ``tracking_uri=``, which is why
:func:`resolve_model_uri` looks the version up itself. The few MLflow *writes* that read the
global (logging a model, registering a version) run inside :func:`use_tracking_uri`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator

_NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"


class ModelNotFoundError(LookupError):
    """A model URI names nothing in the MLflow store it was looked up in (the message names
    the store, so a job pointed at the wrong store says so)."""


@dataclasses.dataclass(frozen=True)
class RegistryRef:
    """A parsed registry URI: ``models:/<name>@<alias>[/path]`` or ``models:/<name>/<version>[/path]``.

    version is a number or ``latest``; path is a sub-path inside the model ("" = all of it).
    """

    name: str
    alias: str | None = None
    version: str | None = None
    path: str = ""


def mlflow_client(tracking_uri: str):
    """An ``MlflowClient`` whose tracking store *and* model registry are ``tracking_uri``.

    ``MlflowClient(tracking_uri)`` alone takes its registry from ``$MLFLOW_REGISTRY_URI`` or
    ``mlflow.set_registry_uri`` when either is set; HardPos keeps runs and registered models
    in the one store the job names.
    """
    # lazy: hardpos.models.clip (every train/eval worker) and the Serve ingress import this module; mlflow costs seconds
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def split_registry_uri(uri: str) -> RegistryRef | None:
    """``models:/name@alias`` / ``models:/name/3`` (optionally ``/sub/path``) -> a :class:`RegistryRef`;
    None for anything else, including ``models:/<model_id>`` (an MLflow 3 logged model).

    Same grammar as MLflow's: a single segment without ``@`` is a logged-model id.
    """
    if not uri.startswith("models:/") or uri.startswith("models://"):
        return None
    rest = uri[len("models:/"):].strip("/")
    head, _, tail = rest.partition("/")
    if "@" in head:
        name, alias = head.split("@", 1)
        if not name or not alias:
            raise ValueError(f"{uri}: expected models:/<name>@<alias>")
        return RegistryRef(name, alias=alias, path=tail)
    if not tail:
        return None  # models:/<model_id>
    version, _, path = tail.partition("/")
    if not (version.isdigit() or version == "latest"):
        raise ValueError(f"{uri}: expected models:/<name>/<version number or 'latest'> or models:/<name>@<alias> "
                         f"(registry stages such as {version!r} are not supported)")
    return RegistryRef(head, version=version, path=path)


def _is_not_found(exc: BaseException) -> bool:
    return str(getattr(exc, "error_code", "")) == _NOT_FOUND


def _require_store(tracking_uri: str) -> None:
    """A local SQLite store must exist: opening a missing one would create an empty database
    (and the lookup would then say "not found" about the wrong store)."""
    if tracking_uri.startswith("sqlite:///"):
        path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:" and not Path(path).is_file():
            raise ModelNotFoundError(f"no MLflow store at {tracking_uri}: the database file {path} does not exist "
                                     "(set tracking.tracking_uri to the store the model was registered in)")


def source_run_tags(uri: str, tracking_uri: str) -> dict[str, str]:
    """The tags of the run that logged the model behind a ``runs:/`` or ``models:/`` URI
    ({} for any other source, or when the store cannot say)."""
    if not uri.startswith(("runs:/", "models:/")):
        return {}
    try:
        client = mlflow_client(tracking_uri)
        if uri.startswith("runs:/"):
            run_id = uri[len("runs:/"):].split("/", 1)[0]
        elif (ref := split_registry_uri(uri)) is not None:
            run_id = model_version(tracking_uri, ref).run_id
        else:
            run_id = client.get_logged_model(uri[len("models:/"):].strip("/")).source_run_id
        return dict(client.get_run(run_id).data.tags) if run_id else {}
    except Exception:  # noqa: BLE001 - provenance is best effort: the model itself loaded or will fail loudly
        return {}


def model_version(tracking_uri: str, ref: RegistryRef):
    """The ``ModelVersion`` ``ref`` names in ``tracking_uri``'s registry.

    Raises :class:`ModelNotFoundError` (naming the store and what it does hold) when the
    model, alias or version does not exist.
    """
    # lazy: hardpos.models.clip (every train/eval worker) and the Serve ingress import this module; mlflow costs seconds
    from mlflow.exceptions import MlflowException

    _require_store(tracking_uri)
    client = mlflow_client(tracking_uri)
    try:
        model = client.get_registered_model(ref.name)
    except MlflowException as exc:
        if not _is_not_found(exc):
            raise
        names = sorted(m.name for m in client.search_registered_models(max_results=20))
        raise ModelNotFoundError(
            f"registered model {ref.name!r} not found in the MLflow registry at {tracking_uri} "
            f"(registered there: {', '.join(names) or 'none'})") from exc
    if ref.alias is not None:
        aliases = dict(model.aliases or {})
        if ref.alias not in aliases:
            raise ModelNotFoundError(
                f"alias {ref.alias!r} of registered model {ref.name!r} not found in the MLflow registry at "
                f"{tracking_uri} (its aliases: {', '.join(sorted(aliases)) or 'none'})")
        return client.get_model_version_by_alias(ref.name, ref.alias)
    if ref.version == "latest":
        versions = client.search_model_versions(f"name = '{ref.name}'")
        if not versions:
            raise ModelNotFoundError(f"registered model {ref.name!r} has no versions in the MLflow registry at {tracking_uri}")
        return max(versions, key=lambda v: int(v.version))
    try:
        return client.get_model_version(ref.name, ref.version)
    except MlflowException as exc:
        if not _is_not_found(exc):
            raise
        raise ModelNotFoundError(
            f"version {ref.version} of registered model {ref.name!r} not found in the MLflow registry at "
            f"{tracking_uri}") from exc


def resolve_model_uri(uri: str, tracking_uri: str) -> str:
    """The artifact location behind a ``models:/`` or ``runs:/`` URI, looked up in ``tracking_uri``.

    ``models:/name@alias`` and ``models:/name/<version>`` become the version's storage
    location, plus any sub-path; ``models:/<model_id>`` becomes the logged model's artifact
    location; ``runs:/<run_id>/<name>[/path]`` becomes the artifact location of the run's
    logged model ``<name>`` (MLflow 3 keeps those apart from the run's artifacts), else the
    run's own artifact folder.  Any other URI is returned unchanged.  The result is a
    ``file:``, ``s3://`` or ``mlflow-artifacts:`` URI that downloads with
    ``mlflow.artifacts.download_artifacts(artifact_uri=..., tracking_uri=tracking_uri)``.
    Done here rather than by MLflow because MLflow resolves both ``models:/`` URIs and a
    run's logged models through its *global* registry URI even when given
    ``tracking_uri=`` (creating ``./mlflow.db`` in the working directory when unset).
    Raises :class:`ModelNotFoundError` naming the store.
    """
    # lazy: hardpos.models.clip (every train/eval worker) and the Serve ingress import this module; mlflow costs seconds
    from mlflow.exceptions import MlflowException

    if uri.startswith("runs:/"):
        return _run_artifact_location(uri, tracking_uri)
    if not uri.startswith("models:/"):
        return uri
    if uri.startswith("models://"):
        raise ValueError(f"{uri}: models://<profile>/... registry URIs are not supported; "
                         "use models:/<name>@<alias> with tracking.tracking_uri naming the store")
    ref = split_registry_uri(uri)
    if ref is None:
        model_id = uri[len("models:/"):].strip("/")
        _require_store(tracking_uri)
        try:
            location = mlflow_client(tracking_uri).get_logged_model(model_id).artifact_location
        except MlflowException as exc:
            if not _is_not_found(exc):
                raise
            raise ModelNotFoundError(f"logged model {model_id!r} not found in the MLflow store at {tracking_uri}") from exc
        return location
    mv = model_version(tracking_uri, ref)
    location = mlflow_client(tracking_uri).get_model_version_download_uri(ref.name, mv.version)
    if location.startswith(("models:/", "runs:/")):  # a version registered straight from such a URI
        location = resolve_model_uri(location, tracking_uri)
    return f"{location.rstrip('/')}/{ref.path}" if ref.path else location


def _run_artifact_location(uri: str, tracking_uri: str) -> str:
    # lazy: hardpos.models.clip (every train/eval worker) and the Serve ingress import this module; mlflow costs seconds
    from mlflow.exceptions import MlflowException

    run_id, _, path = uri[len("runs:/"):].strip("/").partition("/")
    if not run_id or uri.startswith("runs://"):
        raise ValueError(f"{uri}: expected runs:/<run_id>/<artifact path>")
    _require_store(tracking_uri)
    client = mlflow_client(tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if not _is_not_found(exc):
            raise
        raise ModelNotFoundError(f"run {run_id!r} not found in the MLflow store at {tracking_uri}") from exc
    name, _, sub = path.partition("/")
    model = logged_model(client, run, name) if name else None
    base, rel = (model.artifact_location, sub) if model is not None else (run.info.artifact_uri, path)
    return f"{base.rstrip('/')}/{rel}" if rel else base


def logged_model(client, run, name: str):
    """The newest MLflow 3 logged model called ``name`` that ``run`` produced, or None."""
    models = client.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run.info.run_id}' AND name = '{name}'",
    )
    return max(models, key=lambda m: m.creation_timestamp or 0) if models else None


def download_model(uri: str, tracking_uri: str, dst_path: str | os.PathLike | None = None) -> Path:
    """Download the artifacts of ``uri`` (``models:/``, ``runs:/`` or an artifact URI) from the
    store ``tracking_uri``; returns the local path.

    Only ``tracking_uri`` is consulted (never ``$MLFLOW_TRACKING_URI`` or MLflow's global
    URIs).  A missing model, version, alias, run or artifact raises
    :class:`ModelNotFoundError` naming the store.
    """
    # lazy: hardpos.models.clip (every train/eval worker) and the Serve ingress import this module; mlflow costs seconds
    import mlflow
    from mlflow.exceptions import MlflowException

    location = resolve_model_uri(uri, tracking_uri)
    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=location, tracking_uri=tracking_uri,
                                                    registry_uri=tracking_uri,
                                                    dst_path=None if dst_path is None else str(dst_path))
    except MlflowException as exc:
        if not _is_not_found(exc):
            raise
        raise ModelNotFoundError(f"{uri}: {exc.message} (MLflow store {tracking_uri})") from exc
    except FileNotFoundError as exc:  # a local artifact location that is gone
        raise ModelNotFoundError(f"{uri}: artifacts not found at {location} (MLflow store {tracking_uri}): {exc}") from exc
    return Path(local)


def alias_version(tracking_uri: str, name: str, alias: str) -> str:
    """The version ``name@alias`` points at now in ``tracking_uri``'s registry."""
    return str(model_version(tracking_uri, RegistryRef(name, alias=alias)).version)


# --------------------------------------------------------------------------- serving: pin a source
def pin_model_uri(source: str, tracking_uri: str, max_metrics: int = 500) -> tuple[str, dict[str, Any]]:
    """(the exact URI to load for ``source``, registry facts about it).

    A registry URI is pinned to the version it names *now* (an alias or ``latest`` becomes
    ``models:/<name>/<version>[/path]``), so the version reported is the version loaded even
    if the alias moves meanwhile. The facts are ``source, name, alias, version, run_id, tags``
    and ``metrics``: the version's ``metric.<key>`` tags, completed by its run's metrics when
    the run is in the same store (at most ``max_metrics``, sorted by key).

    Any other source (``runs:/``, a checkpoint path, an open_clip tag) is returned as it is,
    with ``{"source": source}``. Raises :class:`ModelNotFoundError` naming ``tracking_uri``
    for an unknown model, alias or version.
    """
    ref = split_registry_uri(source)
    if ref is None:
        return source, {"source": source}
    mv = model_version(tracking_uri, ref)
    tags = dict(mv.tags or {})
    info: dict[str, Any] = {"source": source, "name": ref.name, "alias": ref.alias, "version": str(mv.version),
                            "run_id": mv.run_id, "tags": tags}
    metrics: dict[str, float] = {}
    for key, value in tags.items():
        if key.startswith("metric."):
            try:
                metrics[key[len("metric."):]] = float(value)
            except ValueError:
                pass  # a non-numeric tag is not a metric
    if mv.run_id:
        try:
            run_metrics = mlflow_client(tracking_uri).get_run(mv.run_id).data.metrics
            metrics.update({k: v for k, v in run_metrics.items() if k not in metrics})
        except Exception:  # noqa: BLE001 - the run may live in another store; metrics are optional
            pass
    info["metrics"] = dict(sorted(metrics.items())[:max_metrics])
    pinned = f"models:/{ref.name}/{mv.version}" + (f"/{ref.path}" if ref.path else "")
    return pinned, info


def current_alias_version(source: str, tracking_uri: str) -> str | None:
    """The version ``source``'s alias points at now, or None when ``source`` is not a
    ``models:/<name>@<alias>`` URI (nothing to follow)."""
    ref = split_registry_uri(source)
    if ref is None or ref.alias is None:
        return None
    return alias_version(tracking_uri, ref.name, ref.alias)


@contextlib.contextmanager
def use_tracking_uri(uri: str) -> Iterator[None]:
    """Point MLflow's process-global tracking URI at ``uri`` for a block.

    Only for the few MLflow *writes* that read global state (``log_model`` on the active
    run, the SQL registry resolving a new version's ``models:/<model_id>`` source). Model
    loading never uses it: :func:`hardpos.models.uri.download_model` passes the URI
    explicitly, so a loader running in a thread (a Serve reload) or another process (a Ray
    Train worker) cannot be redirected by this global. ``mlflow.set_tracking_uri`` also
    writes ``$MLFLOW_TRACKING_URI`` (and *unsets* it when given None), so both the global
    and the environment variable are restored exactly afterwards.
    """
    # lazy: mlflow takes seconds to import; loading a model never needs this
    import mlflow
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    saved_global, saved_env = mlflow_uri._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow_uri._tracking_uri = saved_global
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env
