"""A real Ray Tune sweep: each trial is a Ray Train run of the train stage, tracked as a
nested MLflow run; then the comparison, the Pareto front and the registry (champion)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardpos import runtime
from hardpos.config import ConfigError, load_config
from tests.support import write_triplets
from tests.support.mlflow_server import LocalMlflowServer


def _sweep_cfg(tmp_path: Path, triplets: Path, tracking_uri: str, extra: list[str] = ()):
    module = runtime.stage_module("sweep")
    bench = {"kind": "triplets", "path": str(triplets)}
    overrides = {
        "data.train_path": str(triplets), "data.val_fraction": 0.0, "epochs": 1, "batch_size": 16,
        "scaling.num_workers": 1, "scaling.cpus_per_worker": 0.5, "optim.warmup_steps": 1,
        "eval_benchmarks": [{"name": "replace", **bench}, {"name": "swap", **bench}],
    }
    return load_config(module.Config, None, [
        f"output_dir={tmp_path / 'sweep'}",
        "train_config=jobs/configs/train.yaml",
        f"train_overrides={json.dumps(overrides)}",
        'search_space={"loss.w_neg": {"grid_search": [0.0, 1.0]}, "loss.w_pos": 1.0}',
        "extra_trials=[]",
        f"tracking.tracking_uri={tracking_uri}",
        "tracking.experiment=sweep-test",
        "model_name=sweep-clip",
        *extra,
    ])


def _check_sweep(summary: dict, tracking_uri: str, out: Path) -> None:
    import torch
    from mlflow.tracking import MlflowClient

    from hardpos.config import ModelConfig
    from hardpos.models.clip import encode_text, load_model, tokenize

    assert summary["trials"] == 2 and summary["finished"] == 2 and summary["failed"] == []
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("sweep-test")
    parent = client.get_run(summary["mlflow_run_id"])
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(float(c.data.params["loss.w_neg"]) for c in children) == [0.0, 1.0]
    for child in children:
        assert child.info.status == "FINISHED"
        assert {"replace/aug_acc", "swap/brittleness", "objective", "loss/total"} <= set(child.data.metrics)
        # per-epoch metrics are logged once per epoch: Tune bookkeeping adds no duplicates
        assert len(client.get_metric_history(child.info.run_id, "replace/aug_acc")) == 1
    assert (out / "comparison.md").read_text().count("\n") == 4  # header, rule, 2 trials
    assert (out / "tradeoff.png").stat().st_size > 1000
    # the champion alias resolves to the best trial, and its model loads and scores
    version = client.get_model_version_by_alias("sweep-clip", "champion")
    best = max(c.data.metrics["objective"] for c in children)
    assert client.get_run(version.run_id).data.metrics["objective"] == best
    lm = load_model(ModelConfig(pretrained="models:/sweep-clip@champion"))
    with torch.no_grad():
        feats = encode_text(lm.model.eval(), tokenize(lm.tokenizer, ["a red circle", "a crimson circle"]))
    assert torch.isfinite(feats).all() and feats.shape[0] == 2
    assert client.get_model_version_by_alias("sweep-clip", "challenger").run_id != version.run_id


def test_sweep_on_sqlite_store(tmp_path, ray_session, tracking_uri, monkeypatch, capsys):
    # Relative paths, as jobs/configs/sweep.yaml has them: they mean the directory the sweep
    # started in, not the Tune trial's folder each trial runs in. Two trials at once do not fit
    # the session's 2 CPUs (they would hang): the sweep runs them one at a time and says so.
    triplets, _ = write_triplets(tmp_path / "data", n=48)
    monkeypatch.chdir(tmp_path)
    repo = Path(__file__).resolve().parent.parent
    cfg = _sweep_cfg(Path("."), triplets.relative_to(tmp_path), tracking_uri,
                     [f"train_config={repo / 'jobs/configs/train.yaml'}", "max_concurrent_trials=2"])
    summary = runtime.execute("sweep", cfg, quiet=True)
    assert "max_concurrent_trials=2: the cluster's 2 CPUs hold 1 trial(s) at once" in capsys.readouterr().err
    _check_sweep(summary, tracking_uri, tmp_path / "sweep")
    assert summary["model_uri"] == "models:/sweep-clip@champion"
    assert set(summary["pareto_front"]) <= {r["run_name"] for r in summary["rows"]}


@pytest.fixture
def mlflow_server(tmp_path):
    """A real `mlflow server` on 127.0.0.1 (sqlite backend, local artifact store). It runs in
    its own process group, stopped as a whole (the server forks a uvicorn worker, which
    stopping the parent alone left running)."""
    server = LocalMlflowServer(tmp_path / "mlflow-server")
    try:
        server.start()  # waits for /health (up to 300 s: a loaded 2-core CI box needs ~80 s)
        yield server.url
    finally:
        server.kill()


@pytest.mark.slow
def test_sweep_against_a_real_mlflow_server(tmp_path, ray_session, mlflow_server, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    triplets, _ = write_triplets(tmp_path / "data", n=48)
    summary = runtime.execute("sweep", _sweep_cfg(tmp_path, triplets, mlflow_server), quiet=True)
    _check_sweep(summary, mlflow_server, tmp_path / "sweep")


def test_register_and_compare_stages_on_a_real_mlflow_server(tmp_path, mlflow_server, monkeypatch):
    """The registry path against a server: log a model in a train-like run, register it, load it back."""
    import torch

    from hardpos import tracking
    from hardpos.config import ModelConfig, TrackingConfig
    from hardpos.models.pyfunc import log_model
    from hardpos.models.clip import load_model, save_checkpoint

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    ckpt = save_checkpoint(lm.model, lm.model_cfg, tmp_path / "ckpt", {"arch": lm.arch})
    run = tracking.start_run(TrackingConfig(experiment="reg-test"), "trial-a", tags={"hardpos.stage": "train"})
    uri = log_model(run, ckpt)
    run.set_tags({"hardpos.model_uri": uri})
    run.log_metrics({"objective": 0.7, "replace/aug_acc": 0.6, "swap/aug_acc": 0.8})
    tracking.end_run(run)

    reg = runtime.stage_module("register")
    summary = runtime.execute("register", load_config(reg.Config, None, [
        f"output_dir={tmp_path / 'reg'}", "tracking.experiment=reg-test", "name=reg-clip"]), quiet=True)
    assert summary["champion"]["run_id"] == run.run_id and "challenger" not in summary
    loaded = load_model(ModelConfig(pretrained="models:/reg-clip@champion"))
    ref = lm.model.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in loaded.model.state_dict().items())

    cmp = runtime.stage_module("compare")
    out = runtime.execute("compare", load_config(cmp.Config, None, [
        f"output_dir={tmp_path / 'cmp'}", "tracking.experiment=reg-test"]), quiet=True)
    assert out["runs"] == 1 and "| trial-a |" in out["table"]


def test_search_space_typos_fail_before_any_trial(tmp_path, tracking_uri, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    module = runtime.stage_module("sweep")
    cfg = load_config(module.Config, None, [f"output_dir={tmp_path}", 'search_space={"loss.w_nag": {"grid_search": [0, 1]}}'])
    with pytest.raises(ConfigError, match="loss.w_nag"):
        runtime.execute("sweep", cfg, quiet=True)


@pytest.mark.slow  # two sweeps: ~2x test_sweep_on_sqlite_store
@pytest.mark.timeout(1500)
def test_an_interrupted_sweep_resumes_without_rerunning_finished_trials(tmp_path, ray_session, tracking_uri, monkeypatch):
    """Run 1: trial B's data file is missing, so B fails (max_failures=0) while A finishes.
    Run 2, the same command after the file appears: A is not re-run, B runs again into its
    own earlier MLflow run, and the sweep logs into its earlier run -- no duplicate runs."""
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    good, _ = write_triplets(tmp_path / "data", n=48)
    late = tmp_path / "late" / good.name  # appears between the two runs
    extra = [f'search_space={{"data.train_path": {{"grid_search": ["{good}", "{late}"]}}}}', "max_failures=0",
             "register=false"]
    cfg = _sweep_cfg(tmp_path, good, tracking_uri, extra)
    first = runtime.execute("sweep", cfg, quiet=True)
    assert first["finished"] == 1 and len(first["failed"]) == 1 and str(late) in json.dumps(first["failed"])
    trials = tmp_path / "sweep" / "trials"
    (done,) = [p for p in trials.iterdir() if (p / "summary.json").is_file()]
    done_mtime = (done / "summary.json").stat().st_mtime_ns

    late.parent.mkdir()
    late.write_bytes(good.read_bytes())
    second = runtime.execute("sweep", _sweep_cfg(tmp_path, good, tracking_uri, extra), quiet=True)
    assert second["finished"] == 2 and second["failed"] == []
    assert (done / "summary.json").stat().st_mtime_ns == done_mtime  # the finished trial did not run again
    assert second["mlflow_run_id"] == first["mlflow_run_id"]  # one sweep run, resumed

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("sweep-test")
    sweeps = client.search_runs([exp.experiment_id], "tags.`hardpos.stage` = 'sweep'")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{first['mlflow_run_id']}'")
    assert len(sweeps) == 1 and sweeps[0].info.status == "FINISHED"
    assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
    assert sorted(c.info.run_name for c in children) == sorted(p.name for p in trials.iterdir())
    for child in children:  # the re-run trial logged each step once
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "loss/total")]
        assert steps and len(steps) == len(set(steps))
    # a different config on the same output_dir is refused, not mixed into this sweep
    cfg3 = _sweep_cfg(tmp_path, good, tracking_uri, [*extra, "num_samples=2"])
    with pytest.raises(ConfigError, match="different config.*num_samples"):
        runtime.execute("sweep", cfg3, quiet=True)
