"""``models:/`` and ``runs:/`` model sources resolve in the job's configured tracking URI, in
every stage's loading path.

A tiny model is logged and registered (HardPos's own log_model + the register stage's core)
in a store at ``<tmp>/a/mlruns.db``; each test then works from an empty ``<tmp>/b`` with
``$MLFLOW_TRACKING_URI`` unset and MLflow's global URIs reset: the only way to find the model
is the configured URI. Loading it must give the registered weights, and a name that does not
exist must be an error that names the store it looked in.
"""
from __future__ import annotations

import dataclasses
import os
import re
import uuid
from pathlib import Path

import pytest
import torch

from hardpos.config import ModelConfig
from hardpos.models.clip import load_model


@dataclasses.dataclass
class Store:
    uri: str
    name: str       # registered model name (unique per test: a wrong store cannot hold it)
    run_id: str     # the run the registered model was logged in
    state: dict     # the registered weights
    ckpt: Path
    cwd: Path       # the empty working directory the test runs in


def _same_weights(model: torch.nn.Module, state: dict) -> bool:
    got = model.state_dict()
    return set(got) == set(state) and all(torch.equal(got[k].cpu(), state[k]) for k in state)


def _isolate(mp: pytest.MonkeyPatch, cwd: Path) -> None:
    """No $MLFLOW_TRACKING_URI / $MLFLOW_REGISTRY_URI, MLflow's global URIs unset, cwd = ``cwd``."""
    from mlflow.tracking._model_registry import utils as registry_uri
    from mlflow.tracking._tracking_service import utils as tracking_uri

    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        mp.delenv(var, raising=False)
    mp.setattr(tracking_uri, "_tracking_uri", None)
    mp.setattr(registry_uri, "_registry_uri", None)
    cwd.mkdir(parents=True, exist_ok=True)
    mp.chdir(cwd)


@pytest.fixture(scope="module")
def registered(tmp_path_factory) -> Store:
    """A tiny model logged + registered as ``<name>@champion`` in <tmp>/a (once per module:
    creating an MLflow SQLite store and logging a model take several seconds)."""
    from hardpos import tracking
    from hardpos.config import TrackingConfig
    from hardpos.models.clip import save_checkpoint
    from hardpos.models.pyfunc import log_model
    from hardpos.stages import register

    root = tmp_path_factory.mktemp("model-uri")
    (root / "a").mkdir()
    uri = f"sqlite:///{root / 'a' / 'mlruns.db'}"
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, root / "setup")  # registering needs no global state either
        torch.manual_seed(11)
        lm = load_model(ModelConfig(arch="hardpos-tiny"))
        ckpt = save_checkpoint(lm.model, lm.model_cfg, root / "ckpt", {"arch": lm.arch})
        run = tracking.start_run(TrackingConfig(tracking_uri=uri, experiment="uri-tests"), "trained")
        run.set_tags({"hardpos.model_uri": log_model(run, ckpt), "hardpos.stage": "train"})
        tracking.end_run(run)
        name = f"uri-test-{uuid.uuid4().hex[:8]}"
        out = register.register_best(register.Config(name=name, run_id=run.run_id, challenger_alias=""), uri, "uri-tests")
        assert out["model_uri"] == f"models:/{name}@champion" and out["champion"]["version"] == "1"
        assert not list((root / "setup").iterdir())
    state = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    return Store(uri, name, run.run_id, state, ckpt, root / "setup")


@pytest.fixture
def store(registered, tmp_path, monkeypatch) -> Store:
    """The registered model, seen from an empty working directory <tmp>/b with no MLflow
    environment and MLflow's global URIs reset."""
    _isolate(monkeypatch, tmp_path / "b")
    return dataclasses.replace(registered, cwd=tmp_path / "b")


def _no_store_in_cwd(store: Store) -> None:
    """Nothing resolved against the working directory (a lookup there would create a database)."""
    assert not [p.name for p in store.cwd.iterdir() if p.suffix == ".db" or p.name in ("mlruns", "mlartifacts")]


# --------------------------------------------------------------------------- the library loader
def test_models_and_runs_uris_load_the_registered_weights_from_the_configured_store(store):
    for uri in (f"models:/{store.name}@champion", f"models:/{store.name}/1", f"models:/{store.name}/latest",
                f"runs:/{store.run_id}/model"):
        lm = load_model(ModelConfig(pretrained=uri), tracking_uri=store.uri)
        assert _same_weights(lm.model, store.state), uri
        assert lm.meta["source"] == uri
    _no_store_in_cwd(store)


def test_without_the_configured_uri_the_cwd_store_is_named_and_not_created(store):
    """The default (no tracking_uri, no $MLFLOW_TRACKING_URI) is <cwd>/mlflow.db (MLflow 3's own default): here it does
    not exist, so the error says so instead of creating an empty database."""
    from hardpos.models.uri import ModelNotFoundError

    expected = f"sqlite:///{store.cwd.resolve() / 'mlflow.db'}"
    with pytest.raises(ModelNotFoundError, match=re.escape(f"no MLflow store at {expected}")):
        load_model(ModelConfig(pretrained=f"models:/{store.name}@champion"))
    _no_store_in_cwd(store)


def test_unknown_models_aliases_versions_and_runs_name_the_store(store):
    from hardpos.models.uri import ModelNotFoundError

    cases = {
        "models:/no-such-model@champion":
            f"registered model 'no-such-model' not found in the MLflow registry at {store.uri} "
            f"(registered there: {store.name})",
        f"models:/{store.name}@gold":
            f"alias 'gold' of registered model '{store.name}' not found in the MLflow registry at {store.uri} "
            "(its aliases: champion)",
        f"models:/{store.name}/7":
            f"version 7 of registered model '{store.name}' not found in the MLflow registry at {store.uri}",
        "models:/m-0123456789abcdef": f"logged model 'm-0123456789abcdef' not found in the MLflow store at {store.uri}",
    }
    for uri, message in cases.items():
        with pytest.raises(ModelNotFoundError) as info:
            load_model(ModelConfig(pretrained=uri), tracking_uri=store.uri)
        assert str(info.value) == message, uri
    missing_run = "0" * 32
    with pytest.raises(ModelNotFoundError) as info:
        load_model(ModelConfig(pretrained=f"runs:/{missing_run}/model"), tracking_uri=store.uri)
    assert str(info.value) == f"run '{missing_run}' not found in the MLflow store at {store.uri}"
    with pytest.raises(ModelNotFoundError, match=rf"runs:/{store.run_id}/no-such-folder: .*\(MLflow store "
                                                 rf"{re.escape(store.uri)}\)"):
        load_model(ModelConfig(pretrained=f"runs:/{store.run_id}/no-such-folder"), tracking_uri=store.uri)
    with pytest.raises(ValueError, match="stages such as 'Production' are not supported"):
        load_model(ModelConfig(pretrained=f"models:/{store.name}/Production"), tracking_uri=store.uri)
    _no_store_in_cwd(store)


def test_relative_sqlite_uris_become_absolute_where_the_config_is_read(store):
    from hardpos.config.paths import resolve_tracking_uri

    assert resolve_tracking_uri("sqlite:///sub/x.db") == f"sqlite:///{store.cwd.resolve() / 'sub' / 'x.db'}"
    assert resolve_tracking_uri(store.uri) == store.uri
    assert resolve_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert resolve_tracking_uri() == f"sqlite:///{store.cwd.resolve() / 'mlflow.db'}"


# --------------------------------------------------------------------------- evaluate
def test_evaluate_stage_loads_the_registered_model_from_its_tracking_uri(store, tmp_path):
    """`jobs/evaluate.py model.pretrained=models:/<name>@champion tracking.tracking_uri=<store>`
    from a directory without a store: same metrics as evaluating the checkpoint folder."""
    from hardpos.config import load_config
    from hardpos.runtime import execute
    from hardpos.stages import evaluate
    from tests.support import triplet_rows, write_rows

    bench = write_rows(tmp_path / "bench", triplet_rows(6, seed=2))
    common = ["device=cpu", "batch_size=4", f"benchmarks=[{{name: colours, kind: triplets, path: {bench}}}]",
              f"tracking.tracking_uri={store.uri}"]
    registered = execute("evaluate", load_config(evaluate.Config, None, [
        *common, f"output_dir={tmp_path / 'eval-registered'}", f"model.pretrained=models:/{store.name}@champion"]),
        quiet=True)
    direct = execute("evaluate", load_config(evaluate.Config, None, [
        *common, f"output_dir={tmp_path / 'eval-direct'}", f"model.pretrained={store.ckpt}"]), quiet=True)
    assert registered["model"] == f"models:/{store.name}@champion"
    assert registered["metrics"]["colours/n_items"] == 6
    assert registered["metrics"] == direct["metrics"]
    from hardpos.models.uri import mlflow_client

    logged = mlflow_client(store.uri).get_run(registered["mlflow_run_id"])  # the job tracked into the same store
    assert logged.data.params["model.pretrained"] == f"models:/{store.name}@champion"
    _no_store_in_cwd(store)


# --------------------------------------------------------------------------- serve
def test_serve_loader_resolves_in_the_app_config_tracking_uri(store):
    from hardpos.serve import config, errors, scoring

    cfg = config.load_app_config({"model": f"models:/{store.name}@champion", "tracking_uri": store.uri})
    loaded, info = scoring.load_model(cfg, "cpu")
    assert _same_weights(loaded.model, store.state) and not loaded.model.training
    assert (info["name"], info["alias"], info["version"], info["run_id"]) == (store.name, "champion", "1", store.run_id)
    assert scoring.current_version(cfg) == "1"
    by_run, info = scoring.load_model(config.load_app_config({"model": f"runs:/{store.run_id}/model", "tracking_uri": store.uri}))
    assert _same_weights(by_run.model, store.state) and info == {"source": f"runs:/{store.run_id}/model"}

    missing = config.load_app_config({"model": "models:/not-registered@champion", "tracking_uri": store.uri})
    with pytest.raises(LookupError) as exc:
        scoring.load_model(missing)
    err = errors.classify_load_error(missing.model, exc.value)
    assert err.status == 404 and store.uri in err.message and "'not-registered' not found" in err.message
    _no_store_in_cwd(store)


def test_serve_replica_loads_from_the_store_build_app_resolved(store, tmp_path, monkeypatch):
    """build_app (the driver) resolves tracking_uri once, a relative sqlite path included; the
    replica, constructed in another working directory with no environment, loads from it."""
    from hardpos.serve import app

    relative = os.path.relpath(store.uri[len("sqlite:///"):], store.cwd)  # ../../model-uri0/a/mlruns.db
    built = app.build_app({"model": f"models:/{store.name}@champion", "tracking_uri": f"sqlite:///{relative}",
                           "device": "cpu", "reload_poll_s": 0})
    handle, config, _ = built._bound_deployment.init_args  # ScoringAPI(None, config, digest): one deployment
    assert handle is None  # the default app's replicas hold the model themselves (ScoringModel's code)
    assert config["tracking_uri"] == store.uri
    (tmp_path / "replica").mkdir()
    monkeypatch.chdir(tmp_path / "replica")
    replica = app.ScoringModel.func_or_class(config)
    assert replica._error is None and replica._state is not None
    assert _same_weights(replica._state.loaded.model, store.state)
    assert replica._state.info["version"] == "1" and replica._current_version() == "1"
    assert not list((tmp_path / "replica").iterdir())


# --------------------------------------------------------------------------- train (Ray Train workers)
def test_the_registered_model_finetunes_on_http_images_on_ray_train_workers_and_evaluates(store, tmp_path, ray_session):
    """One Ray Train run for two things a user meets on a real cluster:

    * model.pretrained=models:/<name>@champion resolves on the driver and in the workers
      (other processes and working directories). lr=0: the trained weights must be exactly the
      registered ones, which proves the workers started from them (not random weights);
    * a triplet file whose images are http:// URLs (a real server on 127.0.0.1): two workers
      fetch them, and the evaluate stage reads the same file with every image found."""
    from hardpos.config import load_config
    from hardpos.runtime import execute
    from hardpos.stages import evaluate
    from hardpos.train.config import TrainConfig
    from tests.support.http_images import COLOURS, http_triplets, serve_colour_squares

    with serve_colour_squares(tmp_path / "served") as (base, seen):
        data = http_triplets(base, tmp_path / "data" / "triplets.parquet")
        cfg = load_config(TrainConfig, None, [
            f"output_dir={tmp_path / 'train'}", f"data.train_path={data}", "data.val_fraction=0", "data.shuffle_buffer=0",
            "batch_size=4", "epochs=1", "max_steps=3", "optim.lr=0", "optim.warmup_steps=0", "log_every=1",
            "scaling.num_workers=2", "fault.max_failures=0",
            f"model.pretrained=models:/{store.name}@champion", f"tracking.tracking_uri={store.uri}"])
        summary = execute("train", cfg, quiet=True)
        assert summary["status"] == "ok" and summary["steps"] == 3 and summary["train_rows"] == 24
        assert set(seen) == {f"/{c}.png" for c in COLOURS}  # the workers fetched over HTTP
        trained = load_model(ModelConfig(pretrained=summary["checkpoint"]))
        assert _same_weights(trained.model, store.state)
        # ... and the run's own model went to the same store, loadable by its runs:/ URI.
        again = load_model(ModelConfig(pretrained=summary["model_uri"]), tracking_uri=store.uri)
        assert _same_weights(again.model, store.state)

        report = execute("evaluate", load_config(evaluate.Config, None, [
            f"model.pretrained={summary['checkpoint']}", f"output_dir={tmp_path / 'eval'}",
            f"benchmarks=[{{name: web, kind: triplets, path: '{data}'}}]", f"tracking.tracking_uri={store.uri}"]),
            quiet=True)
    bench = report["benchmarks"]["web"]
    assert bench["n_items"] == 24 and bench["n_missing_images"] == 0 and bench["n_excluded_items"] == 0
    assert 0.0 <= report["metrics"]["web/orig_acc"] <= 1.0
    _no_store_in_cwd(store)
