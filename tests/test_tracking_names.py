"""Names from user input (a config mapping's keys, benchmark names, a file's kind values)
reach MLflow sanitised one way, never dropped; report.md shows a user's markup as text."""
from __future__ import annotations

import pytest

from hardpos.config import TrackingConfig
from hardpos.tracking.names import accepted, mlflow_name, mlflow_names


@pytest.mark.parametrize("name, expected", [
    ("explorer.evaluations.HP+HN", "explorer.evaluations.HP_HN"),
    ("bench/<b>x</b>/orig_acc", "bench/_b_x_/b_/orig_acc"),
    ("a//b", "a/b"), ("/x/", "x"), ("a/../b", "a/__/b"), (".", "_"), ("", "_"),
    ("replace/attribute/aug_acc", "replace/attribute/aug_acc"),  # accepted names are unchanged
])
def test_one_rule_for_every_name(name, expected):
    assert mlflow_name(name) == expected and accepted(expected)


def test_long_and_meeting_names_stay_apart():
    long = mlflow_name("x" * 300 + "+")
    assert len(long) == 250 and accepted(long) and long != mlflow_name("x" * 300 + "-")
    out = mlflow_names({"HP+HN": 1, "HP_HN": 2, "HP HN": 3})
    assert out["HP_HN"] == 2 and out["HP HN"] == 3  # an accepted name keeps its name
    assert sorted(out.values()) == [1, 2, 3] and all(accepted(k) for k in out)


def test_a_real_store_takes_every_name(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    from hardpos import tracking

    run = tracking.start_run(TrackingConfig(tracking_uri=tracking_uri, experiment="names"), "names",
                             spill_dir=str(tmp_path / "spill"))
    run.log_params({"explorer": {"evaluations": {"HP+HN": "outputs/x", "HN-only": "outputs/y"}}})
    run.log_metrics({"mine/<img src=x onerror=alert(1)>/orig_acc": 0.5, "mine/attribute/orig_acc": 0.75})
    run.set_tags({"hardpos.note<1>": "v"})
    report = tracking.end_run(run)
    assert report["undelivered"] == 0
    data = MlflowClient(tracking_uri).get_run(run.run_id).data
    assert data.params["explorer.evaluations.HP_HN"] == "outputs/x" and data.params["explorer.evaluations.HN-only"] == "outputs/y"
    assert data.metrics == {"mine/_img src_x onerror_alert_1__/orig_acc": 0.5, "mine/attribute/orig_acc": 0.75}
    assert data.tags["hardpos.note_1_"] == "v"


def test_report_md_shows_markup_as_text():
    import numpy as np

    from hardpos.eval.evaluator import BenchmarkResult, EvalReport
    from hardpos.eval.metrics import benchmark_metrics
    from hardpos.eval.outputs import markdown_report

    kind = "<script>alert(1)</script>"
    subsets = [kind, kind, "attribute", "attribute"]
    s_c, s_n, s_p = np.array([.9, .8, .7, .6]), np.array([.5, .5, .5, .5]), np.array([.6, .4, .6, .4])
    res = BenchmarkResult("<b>mine</b>", "triplets", "pooled", ["a", "b", "c", "d"], subsets, s_c, s_n, s_p,
                          benchmark_metrics("<b>mine</b>", subsets, s_c, s_n, s_p, "pooled"),
                          [{"image": "<img src=x>", "error": "[x](javascript:y)", "n_items": 1}], ["e"], [])
    text = markdown_report(EvalReport([res]), "`model`")
    assert "<script>" not in text and "<b>" not in text and "<img" not in text and "[x](javascript" not in text
    assert "\\[x\\](javascript:y)" in text
    assert "| &lt;b&gt;mine&lt;/b&gt; | &lt;script&gt;alert(1)&lt;/script&gt; | 100.0 |" in text
    assert "# Evaluation: \\`model\\`" in text
