"""Training: the input pipeline pieces, the schedule, and real Ray Train runs on CPU
(2 gloo workers): finetune + checkpoint + MLflow model, explicit resume, injected fault
with automatic resume (S3 data and checkpoints on moto)."""
from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hardpos.config import ConfigError, load_config
from hardpos.train.config import OptimConfig, TrainConfig
from hardpos.train.data import DataError, Preprocess, read_triplets_dataset, split_of, to_model_batch
from hardpos.train.step import build_optimizer, lr_factor, param_groups
from hardpos.train.trainer import decode_task_cpus, plan_steps
from tests.support import write_triplets

BASE = ["batch_size=8", "optim.lr=0.001", "optim.warmup_steps=2", "log_every=1", "data.shuffle_buffer=0",
        "fault.max_failures=0"]


# --------------------------------------------------------------------------- units
def test_plan_steps_and_schedule():
    cfg = load_config(TrainConfig, None, ["batch_size=8", "epochs=3", "scaling.num_workers=2"])
    assert plan_steps(54, cfg) == (3, 9)  # 27 rows per worker -> 3 full batches of 8
    assert plan_steps(54, dataclasses.replace(cfg, max_steps=5)) == (3, 5)
    with pytest.raises(ConfigError, match="fewer than one global batch"):
        plan_steps(15, cfg)
    assert lr_factor(0, 4, 20) == pytest.approx(0.25)
    assert lr_factor(3, 4, 20) == pytest.approx(1.0)
    assert lr_factor(4, 4, 20) == pytest.approx(1.0)
    assert lr_factor(12, 4, 20) == pytest.approx(0.5)
    assert lr_factor(20, 4, 20) == pytest.approx(0.0, abs=1e-12)


def test_weight_decay_only_on_weight_matrices():
    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model

    model = load_model(ModelConfig()).model
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "logit_scale" in no_decay_names
    assert "ln_final.weight" in no_decay_names and "ln_final.bias" in no_decay_names
    assert all(p.ndim >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_fused_adamw_makes_the_same_update_as_the_per_parameter_loop():
    import copy

    import torch

    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model

    torch.manual_seed(0)
    fused_model = load_model(ModelConfig()).model
    loop_model, before = copy.deepcopy(fused_model), copy.deepcopy(fused_model)
    fused, loop = (build_optimizer(m, OptimConfig(lr=1e-2, fused=f)) for m, f in ((fused_model, True),
                                                                                 (loop_model, False)))
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in fused_model.parameters()]
        for model, opt in ((fused_model, fused), (loop_model, loop)):
            for p, grad in zip(model.parameters(), grads):
                p.grad = grad.clone()
            opt.step()
    moved = max((a - b).abs().max().item() for a, b in zip(fused_model.parameters(), before.parameters()))
    diff = max((a - b).abs().max().item() for a, b in zip(fused_model.parameters(), loop_model.parameters()))
    assert moved > 1e-3 and diff < 1e-5
    # a checkpointed state of either kind loads into the other
    loop.load_state_dict(fused.state_dict())
    fused.load_state_dict(loop.state_dict())


def test_train_step_clips_schedules_and_clamps():
    """The ONE step (used by the worker, calibration and the benchmark) does every part of a step."""
    import math as _math

    from hardpos.config import ModelConfig
    from hardpos.models.clip import encode_text, load_model
    from hardpos.train.config import LossConfig
    from hardpos.train.step import TripletCLIP, build_scheduler, forward_loss, model_batch, train_step

    torch.manual_seed(0)
    lm = load_model(ModelConfig())
    net = TripletCLIP(lm.model).train()
    g = torch.Generator().manual_seed(0)
    images = torch.randn(4, 3, 32, 32, generator=g)
    tok = lm.tokenizer(["a red circle", "a blue square", "a green star", "a small red circle",
                        "a red square", "a blue circle", "a green square", "a small blue circle"] + ["x"] * 4)
    batch = model_batch(images, tok[:4], tok[4:8], tok[8:], pos_mask=torch.tensor([True, False, True, False]))
    assert batch["row_mask"].all() and batch["neg_mask"].all()
    with torch.no_grad():
        lm.model.logit_scale.fill_(10.0)  # above ln 100: the step must clamp it
        expected = float(forward_loss(net, batch, LossConfig())["total"])
    opt = build_optimizer(lm.model, OptimConfig(lr=1e-3))
    sched = build_scheduler(opt, warmup_steps=4, total_steps=20)
    before = encode_text(lm.model, tok[:4]).detach()
    terms = train_step(net, batch, LossConfig(), opt, sched, grad_clip=1e-4)
    assert float(terms["total"]) == pytest.approx(expected, rel=1e-5) and int(terms["_rows"]) == 4
    assert float(lm.model.logit_scale) == pytest.approx(_math.log(100))
    assert sched.last_epoch == 1 and opt.param_groups[0]["lr"] == pytest.approx(1e-3 * lr_factor(1, 4, 20))
    grads = [p.grad for p in lm.model.parameters() if p.grad is not None]
    assert grads and float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads]))) \
        == pytest.approx(1e-4, rel=1e-3)  # clipped to grad_clip
    assert not torch.allclose(encode_text(lm.model, tok[:4]), before)  # the optimiser stepped


def test_fail_once_hook_raises_once_on_the_last_rank(tmp_path):
    from tests.support.faults import FailOnce

    hook = FailOnce(at_step=3, marker=str(tmp_path / "m"))
    hook(2, 1, 2)
    hook(3, 0, 2)  # not the last rank
    assert not (tmp_path / "m").exists()
    with pytest.raises(RuntimeError, match="injected fault at step 3"):
        hook(3, 1, 2)
    hook(3, 1, 2)  # the restarted run trains on
    assert (tmp_path / "m").read_text() == "failed once at step 3\n"
    assert "fail_at_step" not in {f.name for f in dataclasses.fields(TrainConfig().fault)}


def test_step_benchmark_times_the_training_step(monkeypatch):
    """The train_step benchmark suite times train_step itself, not a copy of it."""
    from benchmarks.train_bench import bench_train_step
    from hardpos.train import step

    calls = []
    real = step.train_step

    def counting(*args, **kwargs):
        calls.append(kwargs.get("grad_clip"))
        return real(*args, **kwargs)

    monkeypatch.setattr(step, "train_step", counting)
    out = bench_train_step("hardpos-tiny", batch_size=4, repeats=1, warmup=0)
    # combined_vs_clip 1 + combined_padding 2 + fused_adamw 2 steps, clipped as in training
    assert calls == [OptimConfig().grad_clip] * 5
    assert out["combined_samples_per_s"] > 0 and out["combined_vs_clip/ratio_median"] > 0


def test_bad_config_values_are_rejected():
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        load_config(TrainConfig, None, ["batch_size=0"])
    with pytest.raises(ConfigError, match="val_fraction"):
        load_config(TrainConfig, None, ["data.val_fraction=1.5"])
    with pytest.raises(ConfigError, match="precision"):
        load_config(TrainConfig, None, ["precision=fp8"])


def test_shipped_configs_load():
    repo = Path(__file__).resolve().parent.parent
    tiny = load_config(TrainConfig, repo / "jobs/configs/train.yaml")
    assert tiny.model.arch == "hardpos-tiny" and tiny.scaling.num_workers == 2 and not tiny.scaling.use_gpu
    paper = load_config(TrainConfig, repo / "jobs/configs/train_paper.yaml")
    assert (paper.model.arch, paper.model.pretrained) == ("ViT-B-32-quickgelu", "openai")
    assert (paper.scaling.num_workers, paper.scaling.use_gpu, paper.batch_size, paper.epochs) == (4, True, 128, 5)
    assert paper.optim.lr == 5e-6
    # as the paper ran it on 4 GPUs (TSVLC): no NegCLIP columns, per-GPU positives, TSVLC's
    # warmup, no clipping, no hold-out
    assert (paper.loss.negclip_columns, paper.loss.analogy_scope) == (False, "worker")
    assert (paper.optim.warmup_steps, paper.optim.grad_clip, paper.data.val_fraction) == (10000, 0.0, 0.0)


def _preprocess_udf(base_dir):
    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model

    lm = load_model(ModelConfig())
    return Preprocess(lm.preprocess_val, lm.tokenizer, 32, str(base_dir)), lm


def test_preprocess_keeps_bad_rows_as_counted_rejects(tmp_path):
    path, rows = write_triplets(tmp_path, n=3, bad=2)
    rows = rows[2:] + rows[:2] + [{**rows[2], "caption": None}]
    udf, lm = _preprocess_udf(tmp_path)
    batch = {k: np.array([r[k] for r in rows], dtype=object) for k in ("image", "caption", "hard_negative", "hard_positive")}
    out = udf(batch)
    assert out["ok"].tolist() == [True, True, True, False, False, False]
    assert "missing_0" in out["error"][3] and "FileNotFoundError" in out["error"][3]
    assert "corrupt_1" in out["error"][4]
    assert out["error"][5] == "no caption"
    assert out["image"].shape == (6, 3, 32, 32) and out["image"][:3].std() > 0
    assert out["has_neg"].tolist() == [r["hard_negative"] is not None for r in rows]
    # Tokens are the tokenizer's, one row per text.
    assert torch.equal(torch.as_tensor(out["text_tokens"][0]).long(), lm.tokenizer([rows[0]["caption"]])[0])

    mb = to_model_batch(out, batch_size=8)
    assert mb["skipped"] == 3
    assert mb["images"].shape == (8, 3, 32, 32)
    assert mb["row_mask"].tolist() == [True] * 3 + [False] * 5
    assert not (mb["neg_mask"] & ~mb["row_mask"]).any() and not (mb["pos_mask"] & ~mb["row_mask"]).any()
    longest = max(len(lm.tokenizer([t])[0].nonzero()) for r in rows[:3] for t in (r["caption"], r["hard_negative"] or "", r["hard_positive"] or ""))
    assert mb["text_tokens"].shape[1] == mb["neg_tokens"].shape[1] == longest


@pytest.mark.parametrize("null", [None, float("nan"), np.float32("nan")])
def test_preprocess_reads_the_file_when_the_bytes_cell_is_null(tmp_path, null):
    """A files-layout row's ``image_bytes`` is null; after a row-wise Ray Data filter it arrives
    as np.float32(nan), which must mean "read the file", not 4 bytes of image data."""
    path, rows = write_triplets(tmp_path, n=3)
    udf, _ = _preprocess_udf(tmp_path)
    batch = {k: np.array([r[k] for r in rows], dtype=object) for k in ("image", "caption", "hard_negative", "hard_positive")}
    batch["image_bytes"] = np.array([null] * len(rows), dtype=object)
    out = udf(batch)
    assert out["ok"].tolist() == [True] * len(rows), list(out["error"])


def test_a_pickled_preprocess_loads_without_open_clip_and_decodes_the_same(tmp_path):
    """Ray ships the decode UDF to processes that never call it (the Ray Train controller, the
    dataset manager, the split coordinator): unpickling it must not import open_clip or torch
    (seconds per process); the copy then decodes exactly what the original does."""
    import os
    import pickle
    import subprocess
    import sys

    from ray import cloudpickle

    path, rows = write_triplets(tmp_path, n=3)
    udf, _ = _preprocess_udf(tmp_path)
    batch = {k: np.array([r[k] for r in rows], dtype=object) for k in ("image", "caption", "hard_negative", "hard_positive")}
    (tmp_path / "udf.pkl").write_bytes(cloudpickle.dumps(udf))
    (tmp_path / "batch.pkl").write_bytes(cloudpickle.dumps(batch))
    script = (
        "import pickle, sys\n"
        f"udf = pickle.loads(open({str(tmp_path / 'udf.pkl')!r}, 'rb').read())\n"
        "print(sorted(m for m in ('open_clip', 'torch', 'torchvision') if m in sys.modules))\n"
        f"out = udf(pickle.loads(open({str(tmp_path / 'batch.pkl')!r}, 'rb').read()))\n"
        f"open({str(tmp_path / 'out.pkl')!r}, 'wb').write(pickle.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # nothing heavy until the first batch
    theirs, mine = pickle.loads((tmp_path / "out.pkl").read_bytes()), udf(batch)
    assert set(theirs) == set(mine)
    for key in mine:
        np.testing.assert_array_equal(theirs[key], mine[key])


def test_triplet_module_features_equal_separate_encoding(tmp_path):
    from hardpos.models.clip import encode_image, encode_text, tokenize
    from hardpos.train.step import TripletCLIP

    path, rows = write_triplets(tmp_path, n=6)
    udf, lm = _preprocess_udf(tmp_path)
    batch = {k: np.array([r[k] for r in rows], dtype=object) for k in ("image", "caption", "hard_negative", "hard_positive")}
    mb = to_model_batch(udf(batch), batch_size=6)
    net = TripletCLIP(lm.model).eval()
    with torch.no_grad():
        out = net(mb["images"], mb["text_tokens"], mb["neg_tokens"], mb["pos_tokens"], mb["neg_mask"], mb["pos_mask"])
        text = encode_text(lm.model, tokenize(lm.tokenizer, [r["caption"] for r in rows]))
        image = encode_image(lm.model, mb["images"])
    torch.testing.assert_close(out["text"], text, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["image"], image)
    for key, col, mask in (("negative", "hard_negative", mb["neg_mask"]), ("positive", "hard_positive", mb["pos_mask"])):
        idx = [i for i, r in enumerate(rows) if r[col] is not None]
        assert mask.nonzero().flatten().tolist() == idx
        with torch.no_grad():
            ref = encode_text(lm.model, tokenize(lm.tokenizer, [rows[i][col] for i in idx]))
        torch.testing.assert_close(out[key][idx], ref, atol=1e-5, rtol=1e-5)
        assert out[key][~mask].abs().sum() == 0


def test_missing_or_malformed_training_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="training data not found"):
        read_triplets_dataset(str(tmp_path / "nope.parquet"))


def test_split_is_stable_and_roughly_proportional():
    names = [f"images/{i}.png" for i in range(2000)]
    val = [n for n in names if split_of(n, 0.1)]
    assert 150 < len(val) < 250
    assert val == [n for n in names if split_of(n, 0.1)]
    assert not any(split_of(n, 0.0) for n in names)


# --------------------------------------------------------------------------- Ray Train runs
@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    """One 2-worker run (2 epochs, val split, per-epoch benchmark, MLflow) shared by tests."""
    import os

    from hardpos import runtime

    root = tmp_path_factory.mktemp("train")
    path, rows = write_triplets(root / "data", n=64, bad=4)
    bench, _ = write_triplets(root / "bench", n=12, seed=3)
    uri = f"sqlite:///{root / 'mlruns.db'}"
    cfg = load_config(TrainConfig, None, [
        *BASE, f"output_dir={root / 'out'}", f"data.train_path={path}", "data.val_fraction=0.15", "epochs=2",
        f"tracking.tracking_uri={uri}", "tracking.experiment=test-train",
        f"eval_benchmarks=[{{name: bench, kind: triplets, path: '{bench}'}}]"])
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        summary = runtime.execute("train", cfg, quiet=True)
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old
    return {"cfg": cfg, "summary": summary, "rows": rows, "root": root, "uri": uri}


def test_two_workers_finetune_and_write_everything(trained):
    from mlflow.tracking import MlflowClient

    s, rows = trained["summary"], trained["rows"]
    on_disk = json.loads((Path(s["output_dir"]) / "summary.json").read_text())
    assert on_disk["steps"] == s["steps"]
    train_rows = [r for r in rows if not split_of(r["image"], 0.15)]
    assert s["train_rows"] == len(train_rows) and s["val_rows"] == len(rows) - len(train_rows)
    spe = (len(train_rows) // 2) // 8
    assert (s["steps_per_epoch"], s["steps"], s["epochs"], s["global_batch"]) == (spe, 2 * spe, 2, 16)
    fm = s["final_metrics"]
    for name in ("loss/total", "loss/contrastive", "loss/hard_negative", "loss/hard_positive", "val/loss",
                 "bench/aug_acc", "bench/orig_acc", "bench/brittleness"):
        assert name in fm and math.isfinite(fm[name]), name
    assert s["samples_per_s"] > 0
    # Bad images (the file's first rows, so inside the first batches) are counted, not fatal.
    bad_in_train = sum(1 for r in train_rows if r["caption_id"].startswith("bad"))
    assert bad_in_train > 0 and fm["data/skipped_rows"] == bad_in_train
    # Final checkpoint in open_clip local-dir format.
    ckpt = Path(s["checkpoint"])
    assert (ckpt / "open_clip_config.json").is_file() and (ckpt / "open_clip_model.safetensors").is_file()
    assert json.loads((ckpt / "hardpos.json").read_text())["step"] == s["steps"]
    # Ray Train checkpoints: one per epoch, named by step.
    ray_dirs = sorted(p.name for p in Path(s["ray_checkpoint"]).parent.glob("checkpoint_*") if p.is_dir())
    assert ray_dirs == [f"checkpoint_{spe:09d}", f"checkpoint_{2 * spe:09d}"]
    # MLflow (rank 0 only): per-step terms, epoch means that decrease, val loss per epoch.
    client = MlflowClient(trained["uri"])
    run_id = s["mlflow_run_id"]
    steps = client.get_metric_history(run_id, "loss/hard_negative")
    assert sorted(m.step for m in steps) == list(range(1, 2 * spe + 1))  # exactly one writer
    for term in ("total", "contrastive", "hard_negative", "hard_positive"):
        hist = sorted(client.get_metric_history(run_id, f"epoch/loss/{term}"), key=lambda m: m.step)
        assert [m.step for m in hist] == [1, 2]
        assert hist[1].value < hist[0].value, term
    assert [m.step for m in client.get_metric_history(run_id, "val/loss")] == [1, 2]
    assert len(client.get_metric_history(run_id, "bench/aug_acc")) == 2


def test_logged_mlflow_model_loads_with_the_trained_weights(trained):
    from safetensors.torch import load_file

    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model

    s = trained["summary"]
    assert s["model_uri"] == f"runs:/{s['mlflow_run_id']}/model"
    import os

    os.environ["MLFLOW_TRACKING_URI"] = trained["uri"]
    try:
        lm = load_model(ModelConfig(pretrained=s["model_uri"]))
    finally:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    saved = load_file(str(Path(s["checkpoint"]) / "open_clip_model.safetensors"))
    state = lm.model.state_dict()
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert lm.meta["step"] == s["steps"]


def test_resume_from_continues_at_the_saved_step(trained):
    from hardpos import runtime

    cfg, s = trained["cfg"], trained["summary"]
    ray_run = str(Path(s["ray_checkpoint"]).parent)  # a run folder: its latest checkpoint is used
    cfg2 = dataclasses.replace(cfg, output_dir=str(trained["root"] / "out2"), epochs=3, resume_from=ray_run,
                               eval_benchmarks=[], tracking=dataclasses.replace(cfg.tracking, enabled=False))
    s2 = runtime.execute("train", cfg2, quiet=True)
    spe = s["steps_per_epoch"]
    assert s2["final_metrics"]["resumed_from_step"] == 2 * spe
    assert (s2["steps"], s2["epochs"]) == (3 * spe, 3)
    ray_dirs = sorted(p.name for p in Path(s2["ray_checkpoint"]).parent.glob("checkpoint_*") if p.is_dir())
    assert ray_dirs == [f"checkpoint_{3 * spe:09d}"]  # only the one new epoch was trained


def test_injected_fault_resumes_from_the_last_checkpoint_on_s3(ray_session, s3_env, tmp_path, tracking_uri):
    import functools

    from hardpos import runtime, storage
    from hardpos.train import stage as train
    from tests.support.faults import FailOnce

    bucket = s3_env
    path, rows = write_triplets(tmp_path / "data", n=40)
    storage.upload_dir(tmp_path / "data", f"s3://{bucket}/data")
    cfg = load_config(TrainConfig, None, [
        *BASE, "fault.max_failures=1", "epochs=2", "data.val_fraction=0", f"output_dir={tmp_path / 'out'}",
        f"data.train_path=s3://{bucket}/data/triplets.parquet", f"checkpoint.storage_path=s3://{bucket}/ckpt",
        f"tracking.tracking_uri={tracking_uri}"])
    spe = (40 // 2) // 8
    # the fault comes from a test hook passed to the stage, not from the production config
    marker = tmp_path / "fault_injected"
    run_fn = functools.partial(train.run, step_hook=FailOnce(at_step=spe + 1, marker=str(marker)))
    s = runtime.execute("train", cfg, run_fn=run_fn, quiet=True)
    assert marker.read_text().startswith(f"failed once at step {spe + 1}")
    assert s["final_metrics"]["resumed_from_step"] == spe  # restarted from the epoch-1 checkpoint
    assert (s["steps"], s["epochs"]) == (2 * spe, 2)
    ckpts = sorted({u.split("/")[-2] for u in storage.list_files(f"s3://{bucket}/ckpt") if u.endswith("train_state.pt")})
    assert ckpts == [f"checkpoint_{spe:09d}", f"checkpoint_{2 * spe:09d}"]
    assert (Path(s["checkpoint"]) / "open_clip_model.safetensors").is_file()
    # step spe + 1 was logged, then the worker failed and trained it again after the
    # restart: MLflow still holds every step exactly once
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(s["mlflow_run_id"], "loss/total")
    assert sorted(m.step for m in history) == list(range(1, 2 * spe + 1))
    epochs = MlflowClient(tracking_uri).get_metric_history(s["mlflow_run_id"], "epoch")
    assert sorted(m.step for m in epochs) == [1, 2]


def test_a_remote_checkpoint_is_read_from_a_private_copy_that_is_then_removed(tmp_path, monkeypatch):
    # Ray's Checkpoint.as_directory() downloads into a folder named after the checkpoint's
    # uuid, which every worker's pickled copy shares, so two workers of a node read and rewrite
    # one folder (seen as a truncated train_state.pt on resume from s3). The loader takes only
    # the filesystem and the path, never that object; here: a non-local filesystem loads
    # exactly, through a temporary folder of its own that is gone afterwards.
    import pyarrow.fs

    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model
    from hardpos.train.checkpoint import load_remote_train_state, save_train_checkpoint

    lm = load_model(ModelConfig(arch="hardpos-tiny"), device="cpu")
    save_train_checkpoint(tmp_path / "ckpt", lm.model, lm.model_cfg, {"step": 3}, {"step": 3, "epoch": 0})
    remote = pyarrow.fs.SubTreeFileSystem(str(tmp_path), pyarrow.fs.LocalFileSystem())  # not LocalFileSystem: copied
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    fresh = load_model(ModelConfig(arch="hardpos-tiny"), device="cpu").model
    state = load_remote_train_state(remote, "ckpt", fresh)
    assert state == {"step": 3, "epoch": 0}
    assert list(scratch.iterdir()) == []
    for (name, a), (_, b) in zip(lm.model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name


def test_decode_tasks_ask_for_no_more_cpu_than_the_workers_leave():
    cfg = load_config(TrainConfig, None, ["scaling.num_workers=2", "scaling.cpus_per_worker=0.5"])
    assert decode_task_cpus(cfg, 8.0) == 1.0
    assert decode_task_cpus(cfg, 2.0) == 1.0  # standalone on a 2-core machine: 1 CPU left
    # a sweep's trial driver holds 0.5 more: a 1-CPU decode task would never be scheduled
    assert decode_task_cpus(cfg, 2.0, reserved_cpus=0.5) == 0.5
    assert decode_task_cpus(cfg, 1.0) == 1.0  # nothing left (autoscaling): 1, with a warning
    pinned = load_config(TrainConfig, None, ["scaling.num_workers=2", "data.decode_cpus=0.25"])
    assert decode_task_cpus(pinned, 2.0, reserved_cpus=0.5) == 0.25
    with pytest.raises(ConfigError, match="decode_cpus"):
        load_config(TrainConfig, None, ["data.decode_cpus=0"])
