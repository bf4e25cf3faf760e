"""The evaluator on a random tiny CLIP: scores equal a direct computation, each distinct
image/caption is encoded once, missing/corrupt images are excluded and listed."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from eval_util import tiny_model

from hardpos.eval import encoding, evaluator
from hardpos.eval.metrics import summarize
from hardpos.eval.pairs import score_pairs
from hardpos.eval.spec import BenchmarkSpec
from tests.support import triplet_rows, write_image, write_rows


@pytest.fixture(scope="module")
def lm():
    return tiny_model(seed=0)


def _direct_scores(lm, folder, rows):
    """Reference: every item scored on its own, at full context length."""
    from PIL import Image

    out = []
    model = lm.model.eval()
    with torch.no_grad():
        for r in rows:
            img = lm.preprocess_val(Image.open(folder / r["image"]).convert("RGB"))[None]
            i = model.encode_image(img, normalize=True)
            t = model.encode_text(lm.tokenizer([r["caption"], r["hard_negative"], r["hard_positive"]]), normalize=True)
            out.append((i @ t.T)[0].tolist())
    return np.array(out)


def test_run_benchmarks_matches_direct_scoring(lm, tmp_path):
    rows = triplet_rows(12, seed=1)
    path = write_rows(tmp_path / "b", rows)
    report = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [BenchmarkSpec("world", "triplets", str(path))], batch_size=5)
    res = report.results[0]
    ref = _direct_scores(lm, tmp_path / "b", rows)
    np.testing.assert_allclose(np.stack([res.s_c, res.s_n, res.s_p], 1), ref, atol=1e-5)
    assert res.n_distinct_images == len({r["image"] for r in rows}) <= 4
    expected = summarize(ref[:, 0], ref[:, 1], ref[:, 2])
    metrics = evaluator.run_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [BenchmarkSpec("world", "triplets", str(path))])
    for key, value in expected.items():
        assert metrics[f"world/{key}"] == pytest.approx(value, abs=1e-6)  # float32 features
    assert metrics["world/n_missing_images"] == 0


def test_missing_and_corrupt_images_are_excluded_and_listed(lm, tmp_path):
    rows = triplet_rows(6, seed=2)
    rows[0] = {**rows[0], "image": "images/nowhere.png"}
    rows[1] = {**rows[1], "image": "images/broken.png"}
    folder = tmp_path / "b"
    path = write_rows(folder, rows)
    (folder / "images" / "broken.png").write_bytes(b"\x89PNG not really")
    rows.append({**rows[2], "hard_negative": None})  # unscorable row: rejected, not crashed
    write_rows(folder, rows)
    (folder / "images" / "nowhere.png").unlink()
    res = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [BenchmarkSpec("t", "triplets", str(path))]).results[0]
    assert sorted(res.excluded_items) == ["0", "1"]
    assert {m["image"].rsplit("/", 1)[1]: m["error"].split(":")[0] for m in res.missing_images} == {"nowhere.png": "missing", "broken.png": "corrupt"}
    assert res.metrics["t/n_items"] == 4 and res.metrics["t/n_excluded_items"] == 2 and res.metrics["t/n_missing_images"] == 2
    assert res.rejected_rows == [{"row": 6, "reason": "no_negative", "caption": rows[2]["caption"]}]
    assert res.item_ids == ["2", "3", "4", "5"]


def test_restores_training_mode_and_score_pairs_agree(lm, tmp_path):
    from PIL import Image

    rows = triplet_rows(3, seed=3)
    path = write_rows(tmp_path / "b", rows)
    lm.model.train()
    res = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [BenchmarkSpec("t", "triplets", str(path))]).results[0]
    assert lm.model.training
    img = Image.open(tmp_path / "b" / rows[0]["image"])
    sims = score_pairs(lm.model, lm.preprocess_val, lm.tokenizer, [img, img, img],
                         [rows[0]["caption"], rows[0]["hard_negative"], rows[0]["hard_positive"]])
    np.testing.assert_allclose(sims, [res.s_c[0], res.s_n[0], res.s_p[0]], atol=1e-6)
    with pytest.raises(ValueError, match="as many images"):
        score_pairs(lm.model, lm.preprocess_val, lm.tokenizer, [img], [])


def test_caption_batches_in_length_order_equal_one_by_one(lm):
    caps = ["a", "a much longer caption about a red square above a blue circle", "two words", "a"]
    batched = encoding.encode_captions(lm.model.eval(), lm.tokenizer, caps, batch_size=2)
    with torch.no_grad():
        single = torch.cat([lm.model.encode_text(lm.tokenizer([c]), normalize=True) for c in caps])
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=0)


def test_fp32_is_the_default_and_bf16_autocast_is_opt_in(lm, tmp_path):
    rows = triplet_rows(8, seed=9)
    spec = [BenchmarkSpec("t", "triplets", str(write_rows(tmp_path / "b", rows)))]
    default = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, spec)
    fp32 = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, spec, precision="fp32")
    bf16 = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, spec, precision="bf16")
    assert default.precision == "fp32" and bf16.precision == "bf16"
    assert default.scores_table().schema.metadata[b"hardpos.precision"] == b"fp32"
    np.testing.assert_array_equal(default.results[0].s_c, fp32.results[0].s_c)
    np.testing.assert_allclose(default.results[0].s_c, _direct_scores(lm, tmp_path / "b", rows)[:, 0], atol=1e-5)
    # bf16 moves every score a little (8 mantissa bits), but not far
    diff = np.abs(bf16.results[0].s_c - default.results[0].s_c)
    assert diff.min() > 0 and diff.max() < 5e-2
    # and the bf16 path is exactly the model under CPU bf16 autocast
    caps = [r["caption"] for r in rows[:3]]
    model = lm.model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model.encode_text(lm.tokenizer(caps), normalize=True).float()
    torch.testing.assert_close(encoding.encode_captions(model, lm.tokenizer, caps, precision="bf16"), ref, atol=1e-2, rtol=0)
    assert not torch.equal(encoding.encode_captions(model, lm.tokenizer, caps, precision="bf16"),
                           encoding.encode_captions(model, lm.tokenizer, caps))
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16"):
        evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, spec, precision="half")


def test_precision_context_dtypes_and_no_tf32_for_fp32_on_cuda():
    with encoding.precision_context("cpu", "bf16"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with encoding.precision_context("cpu", "fp16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    with encoding.precision_context("cpu"):
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    # fp32 on CUDA turns TF32 off for cuBLAS and cuDNN while scoring and restores it after
    # (the flags are process-wide and settable without a GPU)
    flags = [torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn]
    before = [f.fp32_precision for f in flags]
    with encoding.precision_context("cuda", "fp32"):
        assert [f.fp32_precision for f in flags] == ["ieee"] * 3
    assert [f.fp32_precision for f in flags] == before


def _world(tmp_path):
    """A stand-in synthetic world folder: <world>/benchmark/{replace_attribute,replace_relation,swap}.parquet."""
    world = tmp_path / "world"
    for k, stem in enumerate(("replace_attribute", "replace_relation", "swap")):
        write_rows(world / "benchmark", triplet_rows(6 + k, seed=10 + k, image_dir="img"), name=f"{stem}.parquet")
    return world


def test_evaluate_stage_writes_recomputable_outputs_and_mlflow(tmp_path, tracking_uri):
    import json

    import mlflow

    from hardpos.config import load_config
    from hardpos.eval.outputs import recompute_metrics
    from hardpos.runtime import execute
    from hardpos.stages import evaluate

    world = _world(tmp_path)
    rows = triplet_rows(5, seed=4)
    rows[0] = {**rows[0], "image": "images/gone.png"}
    custom = write_rows(tmp_path / "custom", rows)
    (tmp_path / "custom" / "images" / "gone.png").unlink()
    cfg = load_config(evaluate.Config, None, [f"output_dir={tmp_path / 'out'}", f"world_dir={world}", "device=cpu",
                                              f"benchmarks=[{{name: custom, kind: triplets, path: {custom}}}]", "batch_size=4"])
    summary = execute("evaluate", cfg, quiet=True)
    out = tmp_path / "out"
    on_disk = json.loads((out / "summary.json").read_text())
    m = on_disk["metrics"]
    for name in ("world_replace_attribute", "world_replace_relation", "world_swap", "custom"):
        for key in ("orig_acc", "aug_acc", "brittleness", "aug_drop", "mean_s_c", "mean_s_n", "mean_s_p"):
            assert f"{name}/{key}" in m
    assert m["world_swap/n_items"] == 8 and m["custom/n_items"] == 4 and m["custom/n_missing_images"] == 1
    assert on_disk["benchmarks"]["custom"]["n_excluded_items"] == 1
    # the per-item file recomputes to the summary's numbers
    again = recompute_metrics(str(out / "scores.parquet"))
    for key, value in again.items():
        assert m[key] == pytest.approx(value, abs=1e-12), key
    assert set(again) == {k for k in m if not k.endswith(("n_missing_images", "n_excluded_items"))}
    report = (out / "report.md").read_text()
    assert "world_swap brittle" in report and "gone.png" in report
    assert on_disk["precision"] == "fp32" and "Scores computed in fp32 on cpu." in report
    run = mlflow.get_run(summary["mlflow_run_id"])
    assert run.data.params["precision"] == "fp32"
    assert run.data.metrics["world_swap/aug_acc"] == pytest.approx(m["world_swap/aug_acc"])
    assert run.info.status == "FINISHED"


def test_evaluate_stage_config_errors(tmp_path):
    from hardpos.cli import main

    assert main(["evaluate", f"output_dir={tmp_path}", "tracking.enabled=false"]) == 2  # nothing to evaluate
    assert main(["evaluate", f"output_dir={tmp_path}", "tracking.enabled=false", f"world_dir={tmp_path / 'nope'}"]) == 2
    bad = tmp_path / "b.jsonl"
    bad.write_text("not json\n")
    assert main(["evaluate", f"output_dir={tmp_path}", "tracking.enabled=false", "device=cpu",
                 f"benchmarks=[{{name: b, path: {bad}}}]"]) == 2
    assert main(["evaluate", f"output_dir={tmp_path}", "tracking.enabled=false", "precision=fp64",
                 f"benchmarks=[{{name: b, path: {bad}}}]"]) == 2
    for zs in ("{name: zs, root: /x, classnames: imagenet21k}", "{name: zs, root: /x, templates: 'a {} photo'}"):
        assert main(["evaluate", f"output_dir={tmp_path}", "tracking.enabled=false", f"retention.zeroshot=[{zs}]"]) == 2


def test_zero_shot_config_errors_name_the_key():
    from hardpos.config import ConfigError, load_config
    from hardpos.eval.model_eval import resolve_specs
    from hardpos.stages import evaluate

    cfg = load_config(evaluate.Config, None, ["retention.zeroshot=[{name: inet, root: /data/val, classnames: nosuch.txt}]"])
    assert cfg.retention.zeroshot[0].templates == "openai"
    with pytest.raises(ConfigError, match=r"retention.zeroshot.inet: classnames: 'nosuch.txt' is neither"):
        resolve_specs(cfg.benchmarks, cfg.world_dir, cfg.retention)
    with pytest.raises(ConfigError, match="'fp64' is not one of 'fp32', 'bf16', 'fp16'"):
        load_config(evaluate.Config, None, ["precision=fp64"])


def test_ray_data_engine_equals_local_engine_and_retention(tmp_path, ray_session, tracking_uri):
    """engine=ray_data (model actors on Ray Data) gives the local engine's per-item scores,
    in the precision asked for (bf16 here: actors left in fp32 would differ by ~1e-3)."""
    import pyarrow.parquet as pq

    from hardpos.config import load_config
    from hardpos.runtime import execute
    from hardpos.stages import evaluate

    rows = triplet_rows(10, seed=5)
    rows[3] = {**rows[3], "image": "images/absent.png"}
    path = write_rows(tmp_path / "b", rows)
    (tmp_path / "b" / "images" / "absent.png").unlink()
    for colour in ("red", "blue"):
        write_image(tmp_path / "zs" / colour / "x.png")
    common = ["device=cpu", "seed=3", "precision=bf16", f"benchmarks=[{{name: t, path: {path}}}]",
              f"retention.zeroshot=[{{name: zs, root: {tmp_path / 'zs'}, classnames: folders, templates: ['a {{}} photo']}}]"]
    local = execute("evaluate", load_config(evaluate.Config, None, [f"output_dir={tmp_path / 'local'}", *common]), quiet=True)
    dist = execute("evaluate", load_config(evaluate.Config, None, [
        f"output_dir={tmp_path / 'ray'}", "engine=ray_data", "ray_data.num_cpus=0.5", "ray_data.batch_size=3", *common]), quiet=True)
    a = pq.read_table(tmp_path / "local" / "scores.parquet").to_pydict()
    b = pq.read_table(tmp_path / "ray" / "scores.parquet").to_pydict()
    assert a["item_id"] == b["item_id"] and "3" not in a["item_id"]
    for col in ("s_c", "s_n", "s_p"):
        np.testing.assert_allclose(a[col], b[col], atol=1e-6)
    assert dist["metrics"]["t/n_missing_images"] == 1 == local["metrics"]["t/n_missing_images"]
    assert dist["metrics"]["zeroshot/zs/n_images"] == 2 and "zeroshot/zs/top1" in local["metrics"]
    assert dist["precision"] == local["precision"] == "bf16"
    assert pq.read_schema(tmp_path / "ray" / "scores.parquet").metadata[b"hardpos.precision"] == b"bf16"


def test_shipped_configs_parse():
    from pathlib import Path

    from hardpos.config import load_config
    from hardpos.stages import evaluate

    jobs = Path(__file__).resolve().parent.parent / "jobs" / "configs"
    paper = load_config(evaluate.Config, jobs / "evaluate_paper.yaml")
    assert [(b.name, b.kind) for b in paper.benchmarks] == [("replace", "replace"), ("swap", "swap"), ("sugarcrepe", "sugarcrepe"),
                                                                ("sugarcrepe_pp", "sugarcrepe_pp")]
    assert paper.model.arch == "ViT-B-32-quickgelu" and paper.model.pretrained == "openai"
    default = load_config(evaluate.Config, jobs / "evaluate.yaml")
    assert default.world_dir == "outputs/world" and default.model.arch == "hardpos-tiny"


def test_bench_naive_and_efficient_agree(shared_data):
    """The measurement's two evaluators score identically (timing itself is not asserted)."""
    from benchmarks.eval_bench import run

    out = run(n_rows=24, arch="hardpos-tiny", data_dir=str(shared_data), image_size=(40, 30), batch_size=16)
    assert out["n_rows"] == 24 and out["n_distinct_images"] < 24
    assert out["max_abs_score_diff"] < 1e-5
    assert out["metrics_naive"] == pytest.approx(out["metrics_efficient"])


def test_every_image_missing_scores_nothing_and_does_not_crash(lm, tmp_path):
    rows = triplet_rows(3, seed=6)
    path = write_rows(tmp_path / "b", rows, images=False)
    res = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [BenchmarkSpec("t", "triplets", str(path))]).results[0]
    assert res.metrics["t/n_items"] == 0 and "t/orig_acc" not in res.metrics
    assert res.metrics["t/n_excluded_items"] == 3 and len(res.missing_images) == len({r["image"] for r in rows})


def test_benchmark_and_images_on_s3(lm, tmp_path, s3_env):
    from hardpos import storage

    rows = triplet_rows(4, seed=7)
    write_rows(tmp_path / "b", rows)
    prefix = f"s3://{s3_env}/bench"
    storage.upload_dir(tmp_path / "b", prefix)
    spec = BenchmarkSpec("s3", "triplets", f"{prefix}/bench.jsonl")
    remote = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [spec]).results[0]
    local = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [BenchmarkSpec("s3", "triplets", str(tmp_path / "b" / "bench.jsonl"))]).results[0]
    assert remote.metrics["s3/n_items"] == 4 and remote.metrics["s3/n_missing_images"] == 0
    np.testing.assert_allclose(remote.s_c, local.s_c, atol=1e-6)


@pytest.mark.integration  # runs jobs/evaluate.py in a subprocess
def test_jobs_evaluate_on_the_generated_synthetic_world(tmp_path):
    """Done-when: the evaluate job over the real synthetic world's three benchmarks."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from hardpos.world.build import generate_world
    from hardpos.world.scene import WorldConfig

    world = tmp_path / "world"
    generate_world(WorldConfig(n_pretrain=5, n_finetune=5, n_benchmark=40, image_size=32), str(world))
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, str(repo / "jobs" / "evaluate.py"), "--config", str(repo / "jobs/configs/evaluate.yaml"),
                           f"world_dir={world}", f"output_dir={tmp_path / 'out'}", "tracking.enabled=false", "device=cpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for name in ("world_replace_attribute", "world_replace_relation", "world_swap"):
        assert summary["metrics"][f"{name}/n_items"] > 0 and summary["metrics"][f"{name}/n_missing_images"] == 0
        assert 0.0 <= summary["metrics"][f"{name}/brittleness"] <= 1.0


def test_harness_suite_runs_without_shared_data(tmp_path, monkeypatch):
    """`python -m benchmarks.suites suite=evaluate quick=true` works for users without the reference data."""
    from benchmarks.eval_bench import evaluate_bench

    monkeypatch.delenv("HARDPOS_REFERENCE_DATA", raising=False)
    monkeypatch.setenv("HARDPOS_SHARED_DATA", str(tmp_path / "absent"))
    (row,) = evaluate_bench(quick=True)
    assert row["suite"] == "evaluate" and row["max_abs_score_diff"] < 1e-5 and row["ratio_median"] > 0
    assert "16 rows" in row["case"]


@pytest.mark.gpu
def test_cuda_fp32_scores_equal_cpu_and_bf16_is_close(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    rows = triplet_rows(16, seed=8)
    path = write_rows(tmp_path / "b", rows)
    spec = [BenchmarkSpec("t", "triplets", str(path))]
    lm = tiny_model(seed=0)
    cpu = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, spec).results[0]
    lm.model.cuda()
    gpu = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, spec, device="cuda").results[0]
    np.testing.assert_allclose(gpu.s_c, cpu.s_c, atol=1e-5)  # fp32 by default, no TF32
    bf16 = evaluator.evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, spec, device="cuda", precision="bf16").results[0]
    np.testing.assert_allclose(bf16.s_c, cpu.s_c, atol=2e-2)
    assert gpu.metrics["t/n_items"] == 16
