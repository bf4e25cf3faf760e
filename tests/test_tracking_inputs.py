"""MLflow as users browse it: HardPos experiments are model-development experiments with a
note, and runs list the triplet files and benchmarks they read (with digests)."""
from __future__ import annotations

import json

import pytest

from hardpos.config import TrackingConfig
from hardpos.tracking.inputs import config_inputs, dataset_input, digest


def test_inputs_come_from_the_config_with_content_digests(tmp_path):
    from hardpos import runtime
    from hardpos.config import load_config

    train = tmp_path / "triplets.parquet"
    train.write_bytes(b"rows")
    bench = tmp_path / "scpp"
    bench.mkdir()
    (bench / "replace_att.json").write_text("[]")
    (bench / "0001.jpg").write_bytes(b"image")  # images are not hashed
    cfg = load_config(runtime.stage_module("train").Config, None, [
        f"data.train_path={train}", f'eval_benchmarks=[{{name: scpp, kind: sugarcrepe_pp, path: "{bench}"}}, '
                                    f'{{name: gone, kind: triplets, path: "{tmp_path / "none.parquet"}"}}]'])
    inputs = config_inputs(cfg)
    assert [(d["name"], d["context"], d["source_type"]) for d in inputs] == [("triplets.parquet", "training", "local"),
                                                                              ("scpp", "evaluation", "local")]
    assert json.loads(inputs[0]["source"]) == {"uri": str(train)} and len(inputs[0]["digest"]) == 12
    before = digest(str(bench))
    (bench / "0002.jpg").write_bytes(b"another image")
    assert digest(str(bench)) == before  # an image added: the benchmark's table files are the same
    train.write_bytes(b"other rows")
    assert dataset_input(str(train), "training")["digest"] != inputs[0]["digest"]
    assert dataset_input("s3://b/t.parquet", "training")["source_type"] == "s3"


def test_a_run_lists_its_inputs_and_its_experiment_is_model_development(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    from hardpos import tracking

    train = tmp_path / "mine.jsonl"
    train.write_text("{}\n")
    run = tracking.start_run(TrackingConfig(tracking_uri=tracking_uri, experiment="lineage"), "r",
                             spill_dir=str(tmp_path / "spill"))
    run.log_inputs([dataset_input(str(train), "training")])
    assert tracking.end_run(run)["undelivered"] == 0
    client = MlflowClient(tracking_uri)
    got = client.get_run(run.run_id)
    (item,) = got.inputs.dataset_inputs
    assert (item.dataset.name, item.dataset.digest) == ("mine.jsonl", digest(str(train)))
    assert {t.key: t.value for t in item.tags} == {"mlflow.data.context": "training"}
    exp = client.get_experiment(got.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "triplet files and benchmarks" in exp.tags["mlflow.note.content"]
    # an experiment made before (no kind) gets the tags; a note the user wrote stays theirs
    old = client.create_experiment("older", tags={"mlflow.note.content": "mine"})
    assert tracking.ensure_experiment("older", tracking_uri) == old
    assert client.get_experiment(old).tags == {"mlflow.experimentKind": "custom_model_development",
                                                "mlflow.note.content": "mine"}


@pytest.mark.browser
def test_the_mlflow_ui_shows_a_runs_datasets_and_source_in_chromium(tmp_path, mlflow_server, monkeypatch):
    """A stage's run as a user browses it (`mlflow ui` on the store, the demo's link): the
    experiment opens on its runs table (model training, not GenAI), whose Dataset column names
    the triplet file with its digest, whose Source column names the stage and whose Models
    column links the model the run logged."""
    from tests.test_explorer import CHROMIUM, CHROMIUM_ARGS, _need_browser

    _need_browser()
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    from hardpos import runtime, tracking
    from hardpos.config import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "triplets.parquet").write_bytes(b"rows")
    cfg = load_config(runtime.stage_module("train").Config, None, [
        "output_dir=out", "data.train_path=data/triplets.parquet", f"tracking.tracking_uri={mlflow_server.url}",
        "tracking.experiment=hardpos-ui", "tracking.run_name=hp+hn"])
    from tests.serve_util import tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path / "ckpt", seed=0)

    def log_a_model(c, ctx):  # the job contract and a logged model, no training
        uri, deferred = ctx.run.log_model(ckpt)
        return {"model_uri": uri, "deferred": deferred}

    summary = runtime.execute("train", cfg, run_fn=log_a_model, quiet=True)
    assert summary["deferred"] is False
    client = MlflowClient(mlflow_server.url)
    run = client.get_run(summary["mlflow_run_id"])
    digest = run.inputs.dataset_inputs[0].dataset.digest
    (logged,) = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert logged.source_run_id == run.info.run_id
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.goto(tracking.ui_runs_url(mlflow_server.url, run.info.experiment_id), wait_until="load")
            page.get_by_text(f"triplets.parquet ({digest})").first.wait_for(timeout=120_000)
            body = page.inner_text("body")
            assert "hp+hn" in body and "Training" in body and "hardpos train" in body
            assert "/runs" in page.url and "workflowType=machine_learning" in page.url
            assert "Token Usage" not in body  # not the GenAI overview
            # the Models column links the run's logged model to its page
            link = page.locator(f"a[href*='{logged.model_id}']").first
            link.wait_for(timeout=60_000)
            assert link.inner_text().strip() == logged.name
        finally:
            browser.close()
    assert problems == []
