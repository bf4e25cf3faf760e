"""MLflow as users browse it: HardPos experiments are model-development experiments with a
note, and runs list the triplet files and benchmarks they read (with digests)."""
from __future__ import annotations

import json

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
