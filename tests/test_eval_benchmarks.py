"""Benchmark loaders on the real files (../shared/data) and on files built in the documented
formats: pairing checks, SWAP crops, SugarCrepe categories, stand-in images."""
from __future__ import annotations

import json

import numpy as np
import pytest
from eval_util import stand_in_images, tiny_model, write_replace_folder

from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.evaluator import evaluate_benchmarks, run_benchmarks
from hardpos.eval.items import BenchmarkError
from hardpos.eval.spec import BenchmarkSpec


@pytest.fixture(scope="module")
def lm():
    return tiny_model(seed=0)


# --------------------------------------------------------------------------- REPLACE
def test_real_replace_files_load_and_pair(shared_data):
    bench = load_benchmark(BenchmarkSpec("replace", "replace", str(shared_data / "hard_positives"), image_root="/vg"))
    subsets = [it.subset for it in bench.items]
    assert len(bench.items) == 27_443
    assert subsets.count("attributes") == 10_575 and subsets.count("relations") == 16_868
    assert len({it.image for it in bench.items if it.subset == "attributes"}) == 4_947
    assert len({it.image for it in bench.items if it.subset == "relations"}) == 6_776
    first = bench.items[0]  # the paper's first attribute row and its swapped partner
    assert (first.caption, first.negative, first.positive) == ("walking elephant", "jumping elephant", "strolling elephant")
    assert first.image == "/vg/data/VG_100K_2/2401814.jpg"
    assert bench.aggregate == "mean_of_subsets" and all(it.positive for it in bench.items)


def test_replace_pairing_mismatch_fails_loudly(tmp_path):
    rows = [("1", "red car", "blue car", "crimson car"), ("2", "tall man", "short man", "big man")]
    root = write_replace_folder(tmp_path / "r", {"attributes": rows, "relations": rows})
    swapped = tmp_path / "r" / "swapped_data" / "vl_checklist_relations.json"
    data = json.loads(swapped.read_text())
    data[1]["false_caption"] = "a different negative"
    swapped.write_text(json.dumps(data))
    with pytest.raises(BenchmarkError, match=r"row 1: false_caption is 'short man'.*'a different negative'"):
        load_benchmark(BenchmarkSpec("replace", "replace", str(root)))
    data[1]["false_caption"], data[1]["image_id"] = "short man", "99"
    swapped.write_text(json.dumps(data))
    with pytest.raises(BenchmarkError, match="row 1: image_id"):
        load_benchmark(BenchmarkSpec("replace", "replace", str(root)))
    swapped.write_text(json.dumps(data[:1]))
    with pytest.raises(BenchmarkError, match="has 2 rows but .* has 1"):
        load_benchmark(BenchmarkSpec("replace", "replace", str(root)))
    (tmp_path / "r" / "data" / "vl_checklist_attributes.json").unlink()
    with pytest.raises(BenchmarkError, match="not found"):
        load_benchmark(BenchmarkSpec("replace", "replace", str(root)))


def test_real_replace_subset_with_stand_in_images(shared_data, tmp_path, lm):
    spec = BenchmarkSpec("replace", "replace", str(shared_data / "hard_positives"), image_root=str(tmp_path / "vg"), limit=150)
    bench = load_benchmark(spec)
    stand_in_images(tmp_path / "vg", [it.image[len(str(tmp_path / "vg")) + 1:] for it in bench.items])
    report = evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [spec], batch_size=64)
    m, res = report.metrics, report.results[0]
    assert m["replace/attributes/n_items"] == 150 and m["replace/relations/n_items"] == 150 and m["replace/n_items"] == 300
    assert res.n_distinct_images < 300  # the same image serves several items
    for key in ("orig_acc", "aug_acc", "brittleness", "aug_drop", "mean_s_c", "mean_s_n", "mean_s_p"):
        assert m[f"replace/{key}"] == pytest.approx((m[f"replace/attributes/{key}"] + m[f"replace/relations/{key}"]) / 2)
        assert 0.0 <= m[f"replace/{key}"] <= 1.0 or key.startswith(("mean", "aug_drop"))
    assert m["replace/n_missing_images"] == 0


@pytest.mark.slow
def test_full_real_replace_with_stand_in_images(shared_data, tmp_path):
    """Done-when check: all 27,443 REPLACE items load, pair and are scored by the job."""
    import time

    from hardpos.config import load_config
    from hardpos.runtime import execute
    from hardpos.stages import evaluate

    root = tmp_path / "vg"
    bench = load_benchmark(BenchmarkSpec("replace", "replace", str(shared_data / "hard_positives"), image_root=str(root)))
    t0 = time.time()
    made = stand_in_images(root, [it.image[len(str(root)) + 1:] for it in bench.items], size=(4, 4))
    print(f"{made} stand-in images in {time.time() - t0:.1f}s")
    cfg = load_config(evaluate.Config, None, [
        f"output_dir={tmp_path / 'out'}", "tracking.enabled=false", "device=cpu", "batch_size=512",
        f"benchmarks=[{{name: replace, kind: replace, path: {shared_data / 'hard_positives'}, image_root: {root}}}]"])
    summary = execute("evaluate", cfg, quiet=True)
    assert summary["metrics"]["replace/n_items"] == 27_443
    assert summary["benchmarks"]["replace"]["n_distinct_images"] == made
    assert summary["metrics"]["replace/n_missing_images"] == 0


# --------------------------------------------------------------------------- SWAP
def _swap_folder(tmp_path, n=4):
    """An ARO VG-Attribution file pair; each image has a coloured box at the bbox."""
    from PIL import Image

    rows_o, rows_s = [], []
    for i in range(n):
        img = Image.new("RGB", (40, 30), (255, 255, 255))
        img.paste((200, 10 * i, 30), (5 + i, 4, 25 + i, 20))
        (tmp_path / "swap" / "images").mkdir(parents=True, exist_ok=True)
        img.save(tmp_path / "swap" / "images" / f"{i}.png")
        base = {"image_path": f"{i}.png", "bbox_x": 5 + i, "bbox_y": 4, "bbox_w": 20, "bbox_h": 16,
                "false_caption": "the blue car and the red sky", "attributes": ["red", "blue"]}
        rows_o.append({**base, "true_caption": "the red car and the blue sky"})
        rows_s.append({**base, "true_caption": "the blue sky and the red car"})
    for folder, rows in (("data", rows_o), ("swapped_data", rows_s)):
        (tmp_path / "swap" / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / "swap" / folder / "visual_genome_attribution.json").write_text(json.dumps(rows))
    return tmp_path / "swap", rows_o


def test_swap_loader_crops_to_the_box(tmp_path, lm):
    from PIL import Image

    from hardpos.eval.pairs import score_pairs

    folder, rows = _swap_folder(tmp_path)
    spec = BenchmarkSpec("swap", "swap", str(folder), image_root=str(folder / "images"))
    bench = load_benchmark(spec)
    assert [it.crop for it in bench.items][:2] == [(5.0, 4.0, 20.0, 16.0), (6.0, 4.0, 20.0, 16.0)]
    assert bench.items[0].positive == "the blue sky and the red car"
    res = evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [spec]).results[0]
    crop = Image.open(folder / "images" / "0.png").convert("RGB").crop((5, 4, 25, 20))
    full = Image.open(folder / "images" / "0.png").convert("RGB")
    ref = score_pairs(lm.model, lm.preprocess_val, lm.tokenizer, [crop, full], [rows[0]["true_caption"]] * 2)
    assert res.s_c[0] == pytest.approx(ref[0], abs=1e-5) and abs(ref[1] - ref[0]) > 1e-4  # scored on the crop
    assert set(res.metrics) >= {"swap/orig_acc", "swap/aug_acc", "swap/brittleness"}


def test_swap_pairing_checks_the_box(tmp_path):
    folder, _ = _swap_folder(tmp_path)
    path = folder / "swapped_data" / "visual_genome_attribution.json"
    data = json.loads(path.read_text())
    data[2]["bbox_w"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(BenchmarkError, match="row 2: bbox_w"):
        load_benchmark(BenchmarkSpec("swap", "swap", str(folder)))


# --------------------------------------------------------------------------- SugarCrepe
def test_real_sugarcrepe_loads_seven_categories(shared_data):
    bench = load_benchmark(BenchmarkSpec("sugarcrepe", "sugarcrepe", str(shared_data / "sugar_crepe"), image_root="/coco/val2017"))
    assert len(bench.items) == 7_511 and len(bench.subsets) == 7
    assert not bench.has_positives and all(it.positive is None for it in bench.items)
    assert bench.items[0].image == "/coco/val2017/000000085329.jpg"


def test_sugarcrepe_metrics_have_no_positive_figures(shared_data, tmp_path, lm):
    spec = BenchmarkSpec("sugarcrepe", "sugarcrepe", str(shared_data / "sugar_crepe"), image_root=str(tmp_path / "coco"), limit=4)
    bench = load_benchmark(spec)
    stand_in_images(tmp_path / "coco", {it.image.rsplit("/", 1)[1] for it in bench.items})
    m = run_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [spec])
    cats = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
    assert all(m[f"sugarcrepe/{c}/n_items"] == 4 for c in cats)
    assert m["sugarcrepe/orig_acc"] == pytest.approx(np.mean([m[f"sugarcrepe/{c}/orig_acc"] for c in cats]))
    assert not any(k.endswith(("aug_acc", "brittleness", "mean_s_p")) for k in m)


# --------------------------------------------------------------------------- triplets / specs
def test_bad_specs_fail_with_clear_errors(tmp_path):
    with pytest.raises(BenchmarkError, match="unknown kind"):
        load_benchmark(BenchmarkSpec("x", "nope", str(tmp_path)))  # type: ignore[arg-type]
    with pytest.raises(BenchmarkError, match="path is empty"):
        load_benchmark(BenchmarkSpec("x", "triplets", ""))
    with pytest.raises(BenchmarkError, match="not found"):
        load_benchmark(BenchmarkSpec("x", "triplets", str(tmp_path / "none.parquet")))
    with pytest.raises(BenchmarkError, match="not found"):
        load_benchmark(BenchmarkSpec("x", "sugarcrepe", str(tmp_path)))
