"""Data made with the REPLACE benchmark's own substitutions is marked from end to end: the
perturb stage counts and tags it, a train run on it inherits the mark from the triplets'
summary.json, and Table-3 comparisons flag its REPLACE numbers."""
from __future__ import annotations

import json

from hardpos import runtime
from hardpos.config import load_config
from hardpos.paper import table3
from hardpos.stages import perturb
from hardpos.train.stage import seen_substitutions


def _captions(tmp_path):
    path = tmp_path / "captions.jsonl"
    rows = [{"image": f"{i}.jpg", "caption": c} for i, c in enumerate([
        "A white dog sitting on a bench.", "A man holding a bat.", "A black cat under a table.",
        "A red bus next to a tree."])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_perturb_counts_benchmark_substitutions_only_when_asked(tmp_path):
    src = _captions(tmp_path)
    out = {}
    for include in (False, True):
        cfg = load_config(perturb.Config, None, [f"input={src}", f"output_dir={tmp_path / str(include)}",
                                                 "kinds=[replace]", "negatives=false", "tracking.enabled=false",
                                                 f"include_benchmark_pairs={str(include).lower()}"])
        out[include] = runtime.execute("perturb", cfg, quiet=True)
    assert out[False]["include_benchmark_pairs"] is False
    assert out[False]["positives_with_benchmark_substitutions"] == 0
    assert out[True]["positives_with_benchmark_substitutions"] >= 2   # white->ivory, holding->grasping, ...
    # the train stage reads the mark off the summary beside the triplets
    assert seen_substitutions(str(tmp_path / "True" / "triplets.parquet")) == "replace"
    assert seen_substitutions(str(tmp_path / "False" / "triplets.parquet")) is None
    assert seen_substitutions(str(tmp_path / "nowhere" / "t.parquet")) is None


def test_comparison_table_flags_contaminated_replace_numbers():
    rows = [{"run_name": "clean", "replace/aug_acc": 0.5, "swap/aug_acc": 0.4},
            {"run_name": "leaky", "replace/aug_acc": 0.6, "swap/aug_acc": 0.4, "seen_substitutions": "replace"}]
    text = table3.comparison_table(rows)
    lines = text.splitlines()
    assert "| clean | 50.0 | 40.0 |" in lines and "| leaky | 60.0 (seen) | 40.0 |" in lines
    assert "contaminated" in text
    assert "(seen)" not in table3.comparison_table(rows[:1])


def test_generate_counts_and_tags_benchmark_substitutions(ray_session, tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    from hardpos.generate import stage as generate

    src = _captions(tmp_path)
    got = {}
    for include in (False, True):
        cfg = load_config(generate.Config, None, [
            f"input={src}", f"output_dir={tmp_path / f'gen-{include}'}", "engine.kind=rules",
            f"engine.rules.include_benchmark_pairs={str(include).lower()}", "tracking.experiment=seen"])
        got[include] = runtime.execute("generate", cfg, quiet=True)
    assert got[False]["positives_with_benchmark_substitutions"] == 0
    assert got[True]["positives_with_benchmark_substitutions"] >= 2
    tags = {k: MlflowClient(tracking_uri).get_run(got[k]["mlflow_run_id"]).data.tags for k in got}
    assert tags[True]["hardpos.seen_substitutions"] == "replace" and "hardpos.seen_substitutions" not in tags[False]
    assert seen_substitutions(str(tmp_path / "gen-True" / "triplets.parquet")) == "replace"
