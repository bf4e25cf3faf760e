"""LoRA (hardpos.train.lora): TSVLC's placement, exact start and merge, checkpoints that
resume the adapters and export a plain open_clip model, and a real 2-worker Ray Train run."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from hardpos.config import ConfigError, ModelConfig, load_config
from hardpos.models.clip import encode_image, encode_text, load_model
from hardpos.train import lora
from hardpos.train.checkpoint import load_train_state, save_train_checkpoint
from hardpos.train.config import TrainConfig


@pytest.fixture()
def tiny():
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    return lm


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(3, 3, 32, 32, generator=g), torch.randint(1, 400, (3, 9), generator=g)


def _features(m):
    img, tok = _inputs()
    m.eval()
    with torch.no_grad():
        return encode_image(m, img), encode_text(m, tok)


def _perturb_adapters(m, std=0.05):
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in m.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def test_tsvlc_placement_both_towers_and_only_adapters_train(tiny):
    m = tiny.model
    base_total = sum(p.numel() for p in m.parameters())
    counts = lora.apply_lora(m, rank=4, alpha=1.0)
    # hardpos-tiny: 3 blocks per tower x (q/k/v in-projection, out-projection, c_fc, c_proj) + the patch conv
    assert counts.adapted == 3 * 4 * 2 + 1
    adapted = {n.split(".parametrizations.")[0] + "." + n.split(".parametrizations.")[1].split(".")[0]
               for n, _ in m.named_parameters() if n.endswith(".lora_A")}
    assert "visual.conv1.weight" in adapted and "transformer.resblocks.2.attn.in_proj_weight" in adapted
    assert "visual.transformer.resblocks.0.mlp.c_fc.weight" in adapted
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    assert not m.logit_scale.requires_grad and not m.token_embedding.weight.requires_grad
    assert counts.total == base_total + counts.trainable and 0 < counts.fraction < 0.05
    # a 96-wide block's MLP c_fc (384 x 96) at rank 4: A 4 x 96, B 384 x 4
    params = dict(m.named_parameters())
    prefix = "transformer.resblocks.0.mlp.c_fc.parametrizations.weight.0."
    assert params[prefix + "lora_A"].shape == (4, 96) and params[prefix + "lora_B"].shape == (384, 4)


def test_settings_pick_the_layers(tiny):
    m = tiny.model
    counts = lora.apply_lora(m, rank=2, targets=["attn"], towers=["text"])
    assert counts.adapted == 3 * 2  # in_proj + out_proj of 3 text blocks
    with pytest.raises(ValueError, match="already carries"):
        lora.apply_lora(m, rank=2)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        lora.apply_lora(load_model(ModelConfig(arch="hardpos-tiny")).model, rank=0)


def test_adapters_start_at_the_pretrained_model_and_merge_exactly(tiny):
    m = tiny.model
    ref = copy.deepcopy(m)
    before = _features(ref)
    lora.apply_lora(m, rank=4, alpha=2.0)
    for x, y in zip(_features(m), before):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)  # B = 0: the same model (up to float order)
    _perturb_adapters(m)
    moved = _features(m)
    assert (moved[0] - before[0]).abs().max() > 1e-3 and (moved[1] - before[1]).abs().max() > 1e-3
    merged = lora.merged_state_dict(m)
    assert set(merged) == set(ref.state_dict())  # plain open_clip keys
    ref.load_state_dict(merged)
    for x, y in zip(_features(ref), moved):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    # adapted weights come out moved, frozen ones untouched
    orig = dict(m.named_parameters())["visual.conv1.parametrizations.weight.original"]
    assert not torch.equal(merged["visual.conv1.weight"], orig)
    assert torch.equal(merged["ln_final.weight"], m.ln_final.weight)


def test_checkpoint_holds_merged_model_and_resumes_the_adapters(tiny, tmp_path):
    m = tiny.model
    lora.apply_lora(m, rank=4)
    _perturb_adapters(m)
    want = _features(m)
    save_train_checkpoint(tmp_path / "ck", m, tiny.model_cfg, {"step": 3}, {"step": 3})
    state = torch.load(tmp_path / "ck" / "train_state.pt", weights_only=True)
    assert state["lora"] and all(k.endswith((".lora_A", ".lora_B")) for k in state["lora"])
    # model/ is a plain open_clip checkpoint: loads with no LoRA code and computes the same
    plain = load_model(ModelConfig(arch="hardpos-tiny", pretrained=str(tmp_path / "ck" / "model"))).model
    assert not lora.has_lora(plain)
    for x, y in zip(_features(plain), want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    # resume: the same base + fresh adapters, then the checkpoint's adapters
    torch.manual_seed(0)
    again = load_model(ModelConfig(arch="hardpos-tiny")).model
    lora.apply_lora(again, rank=4)
    assert load_train_state(tmp_path / "ck", again)["step"] == 3
    for x, y in zip(_features(again), want):
        assert torch.equal(x, y)
    # a checkpoint and a run that disagree on LoRA (or on its rank) are clear errors
    with pytest.raises(ValueError, match="trained with LoRA"):
        load_train_state(tmp_path / "ck", load_model(ModelConfig(arch="hardpos-tiny")).model)
    other = load_model(ModelConfig(arch="hardpos-tiny")).model
    lora.apply_lora(other, rank=2)
    with pytest.raises(ValueError, match="same lora.rank"):
        load_train_state(tmp_path / "ck", other)


def test_lora_config_is_checked():
    assert not TrainConfig().lora.enabled  # full finetuning stays the default
    cfg = load_config(TrainConfig, None, ["lora.rank=4", "lora.targets=[attn, mlp]"])
    assert cfg.lora.enabled and cfg.lora.alpha == 1.0 and cfg.lora.towers == ["visual", "text"]
    for bad, key in (("lora.rank=-1", "rank"), ("lora.alpha=0", "alpha"), ("lora.targets=[qkv]", "targets"),
                     ("lora.towers=[]", "towers"), ("data.positive_kinds=[]", "positive_kinds")):
        with pytest.raises(ConfigError, match=key):
            load_config(TrainConfig, None, [bad])


def test_paper_preset_is_tsvlcs_lora_and_weighting():
    cfg = load_config(TrainConfig, str(Path(__file__).parents[1] / "jobs/configs/train_paper.yaml"), [])
    assert (cfg.lora.rank, cfg.lora.alpha) == (4, 1.0)
    assert sorted(cfg.lora.targets) == ["attn", "mlp", "patch"] and sorted(cfg.lora.towers) == ["text", "visual"]
    assert cfg.loss.gather_with_grad is False and cfg.scaling.num_workers == 4
    full = load_config(TrainConfig, str(Path(__file__).parents[1] / "jobs/configs/train_paper.yaml"), ["lora.rank=0"])
    assert not full.lora.enabled  # full finetuning is one key away


def test_positive_kinds_drop_the_other_kinds_positives(tmp_path):
    import numpy as np

    from hardpos.train.data import Preprocess
    from tests.support import write_triplets

    lm = load_model(ModelConfig())
    path, rows = write_triplets(tmp_path, n=4)
    rows = [{**r, "hard_positive": r["hard_positive"] or "a positive"} for r in rows]
    kinds = ["replace", "swap", "swap", None]
    batch = {k: np.array([r[k] for r in rows], dtype=object) for k in ("image", "caption", "hard_negative", "hard_positive")}
    batch["kind"] = np.array(kinds, dtype=object)
    every = Preprocess(lm.preprocess_val, lm.tokenizer, 32, str(tmp_path))(batch)
    swaps = Preprocess(lm.preprocess_val, lm.tokenizer, 32, str(tmp_path), positive_kinds=["swap"])(batch)
    assert every["has_pos"].tolist() == [True, True, True, True]
    assert swaps["has_pos"].tolist() == [False, True, True, False]
    assert swaps["has_neg"].tolist() == every["has_neg"].tolist()  # negatives and captions stay


def test_positive_kinds_that_no_row_has_stop_before_training(tmp_path, ray_session):
    """The driver counts the rows with a positive of the asked kinds (a batch mask, so Ray Data
    prints no "use expr" warning): none -> a DataError naming the key; some -> datasets."""
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq

    from hardpos.train.config import DataConfig
    from hardpos.train.data import DataError, build_datasets
    from tests.support import write_triplets

    lm = load_model(ModelConfig())
    path, rows = write_triplets(tmp_path, n=6)
    rows = [{**r, "hard_positive": "a positive" if i < 4 else None, "kind": "replace"} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataError, match=r"no training row has a hard positive of kind \['swap'\]"):
        build_datasets(DataConfig(train_path=str(path), val_fraction=0.0, positive_kinds=["swap"]),
                       lm.preprocess_train, lm.preprocess_val, lm.tokenizer, 32)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*instead of 'fn'")
        ds = build_datasets(DataConfig(train_path=str(path), val_fraction=0.5, positive_kinds=["replace"]),
                            lm.preprocess_train, lm.preprocess_val, lm.tokenizer, 32)
    assert ds.train_rows + ds.val_rows == 6 and ds.val_rows > 0


# --------------------------------------------------------------------------- Ray Train
def _lora_run(tmp_path):
    """One 2-worker LoRA run on SWAP positives: (its config, summary, the base weights, the
    adapted keys)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hardpos import runtime
    from hardpos.models.clip import save_checkpoint
    from tests.support import write_triplets

    path, _ = write_triplets(tmp_path / "data", n=48)
    table = pq.read_table(path).to_pylist()
    for i, r in enumerate(table):
        r["kind"] = "swap" if i % 2 else "replace"
    pq.write_table(pa.Table.from_pylist(table), path)
    lm = load_model(ModelConfig())
    save_checkpoint(lm.model, lm.model_cfg, tmp_path / "base")
    base = {k: v.clone() for k, v in lm.model.state_dict().items()}
    probe = load_model(ModelConfig()).model
    lora.apply_lora(probe, rank=2)
    adapted = {lora._plain_key(k) for k in probe.state_dict() if k.endswith(".original")}
    cfg = load_config(TrainConfig, None, [
        "batch_size=8", "optim.lr=0.01", "optim.warmup_steps=1", "data.shuffle_buffer=0", "fault.max_failures=0",
        "data.val_fraction=0", "epochs=1", "lora.rank=2", "data.positive_kinds=[swap]", "loss.gather_with_grad=false",
        f"model.pretrained={tmp_path / 'base'}", f"data.train_path={path}", f"output_dir={tmp_path / 'out'}",
        "tracking.enabled=false"])
    return cfg, runtime.execute("train", cfg, quiet=True), base, adapted


def _exported(summary) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(summary["checkpoint"]) / "open_clip_model.safetensors"))


@pytest.mark.integration
def test_two_worker_lora_run_exports_a_plain_model(ray_session, tmp_path):
    _, s, base, adapted = _lora_run(tmp_path)
    spe = (48 // 2) // 8
    fm = s["final_metrics"]
    assert s["steps"] == spe and 0 < fm["params/trainable"] < 100_000 and fm["loss/hard_positive"] > 0
    saved = _exported(s)
    assert set(saved) == set(base)  # plain open_clip keys: adapters merged
    assert all(torch.equal(saved[k], base[k]) for k in base if k not in adapted)  # frozen, logit_scale too
    assert all(not torch.equal(saved[k], base[k]) for k in adapted)  # every adapted weight moved


# slow: a second Ray Train run (about 30 s); the default suite resumes full finetuning on Ray
# Train (test_train_trainer) and the adapters from a checkpoint (test_checkpoint_holds_merged_model_and_resumes_the_adapters)
@pytest.mark.slow
@pytest.mark.integration
def test_a_lora_run_resumes_from_its_adapters(ray_session, tmp_path):
    from hardpos import runtime

    cfg, s, base, adapted = _lora_run(tmp_path)
    spe = (48 // 2) // 8
    saved = _exported(s)
    cfg2 = dataclasses.replace(cfg, output_dir=str(tmp_path / "out2"), epochs=2,
                               resume_from=str(Path(s["ray_checkpoint"]).parent))
    s2 = runtime.execute("train", cfg2, quiet=True)
    assert s2["final_metrics"]["resumed_from_step"] == spe and s2["steps"] == 2 * spe
    resumed = _exported(s2)
    assert all(torch.equal(resumed[k], base[k]) for k in base if k not in adapted)
    assert all(not torch.equal(resumed[k], saved[k]) for k in adapted)  # trained on from the adapters
