"""The MLflow internals HardPos still leans on, pinned: each test fails on an MLflow upgrade
that moves or changes one, instead of the product failing at a user's site.

* ``use_tracking_uri`` (``hardpos.models.uri``) saves and restores MLflow's private
  process-global tracking URI around ``log_model`` (the fluent API reads only that global);
* ``get_artifact_repository`` (``hardpos.tracking.transport``) uploads an artifact straight
  to a store that is not behind the tracking server's artifact proxy;
* ``get_default_host_creds`` + ``http_request`` (``hardpos.tracking.transport``): the REST
  client MLflow's own ``MlflowClient`` uses, with the credentials it would use for a host.
Everything else talks to MLflow through ``MlflowClient`` or the public REST API.
"""
from __future__ import annotations

import os

import mlflow
import pytest

from hardpos.models.uri import use_tracking_uri


def test_the_private_global_tracking_uri_is_where_use_tracking_uri_expects_it(monkeypatch, tmp_path):
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(mlflow_uri, "_tracking_uri", None)
    uri = f"sqlite:///{tmp_path / 'a.db'}"
    with use_tracking_uri(uri):
        assert mlflow_uri._tracking_uri == uri and mlflow.get_tracking_uri() == uri
        assert os.environ["MLFLOW_TRACKING_URI"] == uri   # set_tracking_uri also writes the env
    assert mlflow_uri._tracking_uri is None and "MLFLOW_TRACKING_URI" not in os.environ  # unset again

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///before.db")
    with use_tracking_uri(uri):
        assert mlflow.get_tracking_uri() == uri
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///before.db" and mlflow_uri._tracking_uri is None


def test_get_artifact_repository_uploads_to_a_plain_store(tmp_path):
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    src = tmp_path / "note.txt"
    src.write_text("hello")
    repo = get_artifact_repository((tmp_path / "store").as_uri())
    repo.log_artifact(str(src), "notes")
    assert (tmp_path / "store" / "notes" / "note.txt").read_text() == "hello"


@pytest.mark.parametrize("name", ["MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"])
def test_mlflows_http_settings_are_the_documented_environment_variables(name):
    from mlflow import environment_variables as env

    assert getattr(env, name).name == name  # fail_fast_mlflow sets these by name


def test_mlflows_rest_client_takes_the_arguments_the_transport_passes(monkeypatch):
    import inspect

    from mlflow.tracking._tracking_service.utils import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    params = inspect.signature(http_request).parameters
    assert {"max_retries", "backoff_factor", "timeout", "raise_on_status", "extra_headers"} <= set(params)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t0k")
    creds = get_default_host_creds("http://127.0.0.1:1")
    assert (creds.host, creds.token) == ("http://127.0.0.1:1", "t0k")
