"""SugarCrepe++ (kind ``sugarcrepe_pp``): the loader on the real files (../shared/data), clear
errors for malformed files, the metrics on hand-made scores (ties count against the model),
and an end-to-end evaluation of a tiny random model on stand-in COCO images."""
from __future__ import annotations

import json

import numpy as np
import pytest
from eval_util import stand_in_images, tiny_model

from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.items import BenchmarkError
from hardpos.eval.encoding import encode_captions
from hardpos.eval.evaluator import evaluate_benchmarks
from hardpos.eval.metrics import benchmark_metrics, text_only_correct, text_only_metrics
from hardpos.eval.spec import BenchmarkSpec
from hardpos.eval.formats import SUGARCREPE_PP_CATEGORIES as CATEGORIES
from hardpos.eval.sugarcrepe_pp import text_similarities
from hardpos.stages.sweep import objective

COUNTS = {"replace_att": 788, "replace_obj": 1652, "replace_rel": 1406, "swap_att": 666, "swap_obj": 245}


@pytest.fixture(scope="module")
def lm():
    return tiny_model(seed=0)


def _write_folder(root, rows_per_cat=None):
    """A SugarCrepe++ folder in the published format: 2 valid items per category."""
    root.mkdir(parents=True, exist_ok=True)
    for k, cat in enumerate(CATEGORIES):
        rows = rows_per_cat.get(cat) if rows_per_cat else None
        if rows is None:
            rows = [{"id": i, "filename": f"0000000{k}{i}.jpg", "caption": f"a red car {k}{i}",
                     "caption2": f"a car that is red {k}{i}", "negative_caption": f"a blue car {k}{i}"} for i in range(2)]
        (root / f"{cat}.json").write_text(json.dumps(rows))
    return root


# --------------------------------------------------------------------------- loader
def test_real_files_load_five_categories(shared_data):
    bench = load_benchmark(BenchmarkSpec("scpp", "sugarcrepe_pp", str(shared_data / "sugarcrepe_pp"),
                                         image_root="/coco/val2017"))
    assert len(bench.items) == 4_757 and bench.subsets == list(CATEGORIES)
    assert {c: sum(it.subset == c for it in bench.items) for c in CATEGORIES} == COUNTS
    assert bench.kind == "sugarcrepe_pp" and bench.aggregate == "mean_of_subsets" and bench.has_positives
    first = json.loads((shared_data / "sugarcrepe_pp" / "replace_att.json").read_text())[0]
    item = bench.items[0]
    # caption -> s_c, caption2 (the paraphrase) -> s_p, negative_caption -> s_n
    assert (item.caption, item.positive, item.negative) == (first["caption"], first["caption2"], first["negative_caption"])
    assert item.item_id == f"replace_att/{first['id']}" and item.image == f"/coco/val2017/{first['filename']}"
    assert all(it.positive and it.image.startswith("/coco/val2017/0000") for it in bench.items)


def test_limit_keeps_the_first_items_of_every_category(shared_data):
    bench = load_benchmark(BenchmarkSpec("scpp", "sugarcrepe_pp", str(shared_data / "sugarcrepe_pp"), limit=3))
    assert [it.item_id for it in bench.items] == [f"{c}/{i}" for c in CATEGORIES for i in range(3)]
    # without image_root, file names resolve against the benchmark folder
    assert bench.items[0].image.startswith(str(shared_data / "sugarcrepe_pp") + "/")


def test_malformed_files_and_items_name_the_file_item_and_field(tmp_path):
    root = _write_folder(tmp_path / "scpp")
    spec = BenchmarkSpec("scpp", "sugarcrepe_pp", str(root))
    assert len(load_benchmark(spec).items) == 10
    good = json.loads((root / "swap_obj.json").read_text())

    def broken(rows, pattern):
        (root / "swap_obj.json").write_text(rows if isinstance(rows, str) else json.dumps(rows))
        with pytest.raises(BenchmarkError, match=pattern):
            load_benchmark(spec)

    broken([good[0], {k: v for k, v in good[1].items() if k != "caption2"}], r"swap_obj\.json item 1: missing field 'caption2'")
    broken([good[0], {**good[1], "negative_caption": ""}], r"swap_obj\.json item 1: field 'negative_caption' must be a non-empty string")
    broken([{**good[0], "filename": None}, good[1]], r"swap_obj\.json item 0: field 'filename' must be a non-empty string")
    broken([good[0], {**good[1], "id": [1]}], r"swap_obj\.json item 1: field 'id' must be an integer or a string")
    broken([good[0], "not an object"], r"swap_obj\.json item 1: expected an object")
    broken([good[0], {**good[1], "id": 0}], r"swap_obj\.json item 1: id 0 repeats item 0")
    broken({"0": good[0]}, r"swap_obj\.json: expected a JSON list")
    broken("[{not json", r"swap_obj\.json")
    (root / "swap_obj.json").unlink()
    with pytest.raises(BenchmarkError, match=r"not found: .*swap_obj\.json"):
        load_benchmark(spec)


# --------------------------------------------------------------------------- metrics
def test_metrics_on_hand_made_scores_ties_count_against():
    subsets = ["replace_att"] * 4 + ["swap_obj"] * 2
    s_c = [0.9, 0.5, 0.5, 0.2, 0.8, 0.7]
    s_n = [0.1, 0.5, 0.4, 0.3, 0.2, 0.1]
    s_p = [0.8, 0.6, 0.3, 0.4, 0.2, 0.9]
    # item: 0 both win; 1 s_c ties s_n (not correct, not brittle); 2 brittle (c > n > p);
    # 3 brittle (p > n > c); 4 s_p ties s_n (orig correct, aug wrong, not brittle); 5 both win
    text = {"t_cp": [0.9, 0.5, 0.5, 0.2, 0.9, 0.3],
            "t_cn": [0.1, 0.5, 0.4, 0.3, 0.1, 0.1],
            "t_pn": [0.2, 0.1, 0.5, 0.1, 0.9, 0.2]}
    # text-only: 0 yes; 1 t_cp ties t_cn (no); 2 t_cp ties t_pn (no); 3 t_cn beats t_cp (no); 4 tie (no); 5 yes
    m = benchmark_metrics("scpp", subsets, s_c, s_n, s_p, "mean_of_subsets", text_sims=text)
    att, obj = "scpp/replace_att", "scpp/swap_obj"
    assert (m[f"{att}/orig_acc"], m[f"{att}/aug_acc"], m[f"{att}/brittleness"]) == (0.5, 0.25, 0.5)
    assert (m[f"{obj}/orig_acc"], m[f"{obj}/aug_acc"], m[f"{obj}/brittleness"]) == (1.0, 0.5, 0.0)
    assert (m[f"{att}/text_only_acc"], m[f"{obj}/text_only_acc"]) == (0.25, 0.5)
    # overall = the unweighted mean of the categories (as SugarCrepe), not the pooled items
    assert m["scpp/aug_acc"] == pytest.approx(0.375) and m["scpp/text_only_acc"] == pytest.approx(0.375)
    assert m["scpp/orig_acc"] == pytest.approx(0.75) and m["scpp/brittleness"] == pytest.approx(0.25)
    # without text scores there is no text-only figure; pooled aggregation pools the items
    assert not any(k.endswith("text_only_acc") for k in benchmark_metrics("scpp", subsets, s_c, s_n, s_p, "mean_of_subsets"))
    assert text_only_metrics("x", subsets, text, "pooled")["x/text_only_acc"] == pytest.approx(2 / 6)
    assert text_only_correct([0.5, 0.6], [0.5, 0.1], [0.1, 0.6]).tolist() == [False, False]
    with pytest.raises(ValueError, match="differ in length"):
        text_only_metrics("x", subsets[:2], text, "pooled")


def test_text_similarities_index_the_encoded_captions():
    feats = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    sims = text_similarities(feats, c_idx=[0, 2], p_idx=[1, 1], n_idx=[2, 0])
    np.testing.assert_allclose(sims["t_cp"], [0.6, 0.8])
    np.testing.assert_allclose(sims["t_cn"], [0.0, 0.0])
    np.testing.assert_allclose(sims["t_pn"], [0.8, 0.6])
    with pytest.raises(ValueError, match="positive"):
        text_similarities(feats, [0], [-1], [2])


# --------------------------------------------------------------------------- end to end
def test_tiny_model_scores_recompute_from_independent_encodings(shared_data, tmp_path, lm):
    """The evaluator's per-item scores equal each item scored on its own (image and texts
    encoded separately), and its figures equal the metric functions applied to them."""
    spec = BenchmarkSpec("scpp", "sugarcrepe_pp", str(shared_data / "sugarcrepe_pp"), image_root=str(tmp_path / "coco"), limit=4)
    bench = load_benchmark(spec)
    stand_in_images(tmp_path / "coco", {it.image.rsplit("/", 1)[1] for it in bench.items})
    report = evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [spec], batch_size=8)
    (res,) = report.results
    assert len(res.item_ids) == 20 and res.n_distinct_captions <= 60
    # independent: every item's caption / paraphrase / negative encoded in its own call
    for j, it in enumerate(bench.items[:6]):
        t = encode_captions(lm.model, lm.tokenizer, [it.caption, it.positive, it.negative]).numpy().astype(np.float64)
        assert res.text_sims["t_cp"][j] == pytest.approx(t[0] @ t[1], abs=1e-5)
        assert res.text_sims["t_cn"][j] == pytest.approx(t[0] @ t[2], abs=1e-5)
        assert res.text_sims["t_pn"][j] == pytest.approx(t[1] @ t[2], abs=1e-5)
    m = res.metrics
    for cat in CATEGORIES:
        sel = np.array(res.subsets) == cat
        c, n, p = res.s_c[sel], res.s_n[sel], res.s_p[sel]
        assert m[f"scpp/{cat}/n_items"] == 4
        assert m[f"scpp/{cat}/orig_acc"] == pytest.approx(np.mean(c > n))
        assert m[f"scpp/{cat}/aug_acc"] == pytest.approx(np.mean((c > n) & (p > n)))
        assert m[f"scpp/{cat}/brittleness"] == pytest.approx(np.mean(((c > n) & (n > p)) | ((p > n) & (n > c))))
        tt = {k: v[sel] for k, v in res.text_sims.items()}
        assert m[f"scpp/{cat}/text_only_acc"] == pytest.approx(np.mean((tt["t_cp"] > tt["t_cn"]) & (tt["t_cp"] > tt["t_pn"])))
    for key in ("orig_acc", "aug_acc", "brittleness", "text_only_acc"):
        assert m[f"scpp/{key}"] == pytest.approx(np.mean([m[f"scpp/{c}/{key}"] for c in CATEGORIES]))
    # the figures are sweep objectives like any other (train's per-epoch metrics are these keys)
    assert objective(m, ["scpp/aug_acc", "scpp/text_only_acc"]) == pytest.approx((m["scpp/aug_acc"] + m["scpp/text_only_acc"]) / 2)


def test_evaluate_stage_reports_logs_and_recomputes(shared_data, tmp_path, tracking_uri):
    """The evaluate job on SugarCrepe++ next to SugarCrepe (both on stand-in COCO images):
    summary, report.md, MLflow metrics, and scores.parquet recomputing to the summary."""
    import mlflow
    import pyarrow.parquet as pq

    from hardpos.config import load_config
    from hardpos.eval.outputs import recompute_metrics
    from hardpos.runtime import execute
    from hardpos.stages import evaluate

    coco = tmp_path / "coco"
    specs = [BenchmarkSpec("scpp", "sugarcrepe_pp", str(shared_data / "sugarcrepe_pp"), image_root=str(coco), limit=3),
             BenchmarkSpec("sc", "sugarcrepe", str(shared_data / "sugar_crepe"), image_root=str(coco), limit=2)]
    stand_in_images(coco, {it.image.rsplit("/", 1)[1] for s in specs for it in load_benchmark(s).items})
    benches = ", ".join(f"{{name: {s.name}, kind: {s.kind}, path: {s.path}, image_root: {coco}, limit: {s.limit}}}" for s in specs)
    cfg = load_config(evaluate.Config, None, [f"output_dir={tmp_path / 'out'}", "device=cpu", "batch_size=8",
                                              "model.arch=hardpos-tiny", f"benchmarks=[{benches}]"])
    summary = execute("evaluate", cfg, quiet=True)
    m = json.loads((tmp_path / "out" / "summary.json").read_text())["metrics"]
    for key in ("orig_acc", "aug_acc", "brittleness", "text_only_acc", "mean_s_p"):
        assert f"scpp/{key}" in m and all(f"scpp/{c}/{key}" in m for c in CATEGORIES)
    assert m["scpp/n_items"] == 15 and not any(k.startswith("sc/") and k.endswith("text_only_acc") for k in m)
    table = pq.read_table(tmp_path / "out" / "scores.parquet").to_pydict()
    assert table["benchmark"] == ["scpp"] * 15 + ["sc"] * 14
    assert all(isinstance(table[k][i], float) for k in ("t_cp", "t_cn", "t_pn") for i in range(15))
    assert table["t_cp"][15:] == [None] * 14  # SugarCrepe has no text-only task
    again = recompute_metrics(str(tmp_path / "out" / "scores.parquet"))
    assert set(again) == {k for k in m if not k.endswith(("n_missing_images", "n_excluded_items"))}
    for key, value in again.items():
        assert m[key] == pytest.approx(value, abs=1e-12), key
    report = (tmp_path / "out" / "report.md").read_text()
    assert "scpp aug" in report and "## Text-only task (SugarCrepe++ TOT, %)" in report
    assert f"| scpp | swap_obj | {100 * m['scpp/swap_obj/text_only_acc']:.1f} |" in report
    logged = mlflow.get_run(summary["mlflow_run_id"]).data.metrics
    assert logged["scpp/text_only_acc"] == pytest.approx(m["scpp/text_only_acc"])
    assert logged["scpp/replace_rel/aug_acc"] == pytest.approx(m["scpp/replace_rel/aug_acc"])


def test_without_images_the_text_only_figures_are_still_reported(tmp_path, lm):
    """SugarCrepe++ with none of its COCO images (and with some): the text-only task needs
    no image, so its figures cover every item; report.md keeps the benchmark under the
    hard-positive headings and puts the missing count beside the figures."""
    from hardpos.eval.outputs import markdown_report

    folder = _write_folder(tmp_path / "scpp")
    spec = BenchmarkSpec("scpp", "sugarcrepe_pp", str(folder), image_root=str(tmp_path / "no-images"))
    (res,) = evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [spec], batch_size=8).results
    m = res.metrics
    assert m["scpp/n_items"] == 0 and m["scpp/n_excluded_items"] == 10 and m["scpp/n_missing_images"] == 10
    assert m["scpp/text_only_n_items"] == 10 and 0.0 <= m["scpp/text_only_acc"] <= 1.0
    assert all(f"scpp/{c}/text_only_acc" in m for c in CATEGORIES) and "scpp/aug_acc" not in m
    report = markdown_report(type("R", (), {"results": [res], "metrics": m, "precision": "fp32"})(), "tiny")
    assert "Benchmarks without hard positives" not in report
    assert "| scpp | - | - | - |" in report  # in the Table 1 layout, unscored
    assert f"| scpp | all (mean of categories) | {100 * m['scpp/text_only_acc']:.1f} | 10 | 10 (10 image(s)) |" in report
    assert f"| scpp | swap_obj | {100 * m['scpp/swap_obj/text_only_acc']:.1f} |" in report

    # half the images present: the image figures cover those items, the text-only ones all
    stand_in_images(tmp_path / "half", {f"0000000{k}0.jpg" for k in range(5)})
    half = BenchmarkSpec("scpp", "sugarcrepe_pp", str(folder), image_root=str(tmp_path / "half"))
    (res2,) = evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [half], batch_size=8).results
    assert res2.metrics["scpp/n_items"] == 5 and res2.metrics["scpp/text_only_n_items"] == 10
    assert res2.metrics["scpp/text_only_acc"] == pytest.approx(m["scpp/text_only_acc"])  # no image, same figure
    assert len(res2.text_sims["t_cp"]) == 5  # the scores file's rows stay the scored items
