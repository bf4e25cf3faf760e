"""Shipped pretrained bases (hardpos.models.bases): float16 writing, the manifest's hash and world
contract, the demo's start-of-run world check, and the shipped base itself when there is one."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hardpos.stages.compose import PhaseConfig, latest_checkpoint, phase_key
from hardpos.config import ConfigError, ModelConfig, load_config
from hardpos.world.scene import WorldConfig
from hardpos.world.build import generate_world
from hardpos.models import bases
from hardpos.models.clip import load_model, save_checkpoint
from hardpos.models.source import WEIGHTS_NAME
from hardpos.stages import demo

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tiny_ckpt(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    return save_checkpoint(lm.model, lm.model_cfg, tmp_path / "ckpt", {"arch": "hardpos-tiny"})


def _write(tiny_ckpt: Path, dest: Path, world: WorldConfig) -> dict:
    return bases.write_base(tiny_ckpt, dest, "b1", {"command": "x", "world": bases.world_dict(world), "seed": 0})


def test_write_base_is_float16_with_a_matching_hash_and_loads(tiny_ckpt: Path, tmp_path: Path):
    m = _write(tiny_ckpt, tmp_path / "bases", WorldConfig())
    state = load_file(str(tmp_path / "bases" / "b1" / WEIGHTS_NAME))
    floats = [v for v in state.values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float16 for v in floats)
    assert m["weights"]["dtype"] == "float16" and m["weights"]["bytes"] > 0
    assert json.loads((tmp_path / "bases" / "b1.json").read_text())["weights"]["sha256"] == m["weights"]["sha256"]
    assert bases.verify_base(tmp_path / "bases" / "b1")["name"] == "b1"
    # the base loads as a checkpoint; its weights are the originals rounded to float16
    orig = load_file(str(tiny_ckpt / WEIGHTS_NAME))
    loaded = load_model(ModelConfig(arch="hardpos-tiny", pretrained=str(tmp_path / "bases" / "b1"))).model.state_dict()
    k = "visual.conv1.weight"
    assert torch.equal(loaded[k], orig[k].half().float())
    assert not torch.equal(loaded[k], orig[k])  # it really was rounded (the test can fail)


def test_verify_base_rejects_changed_weights(tiny_ckpt: Path, tmp_path: Path):
    _write(tiny_ckpt, tmp_path, WorldConfig())
    w = tmp_path / "b1" / WEIGHTS_NAME
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        bases.verify_base(tmp_path / "b1")


def test_check_world_names_every_differing_key():
    manifest = {"name": "b", "world": bases.world_dict(WorldConfig(seed=0))}
    bases.check_world(manifest, WorldConfig(seed=0))  # the same world passes
    with pytest.raises(ConfigError) as err:
        bases.check_world(manifest, WorldConfig(seed=1, n_pretrain=5))
    assert "world.seed=1 but the base was pretrained on 0" in str(err.value)
    assert "world.n_pretrain=5 but the base was pretrained on 20000" in str(err.value)
    assert "colors" not in str(err.value)  # only what differs
    with pytest.raises(ConfigError, match="records no world"):
        bases.check_world({"name": "b"}, WorldConfig())
    # a world setting added after the base was made counts as its default (the old behaviour)
    older = {"name": "b", "world": {k: v for k, v in bases.world_dict(WorldConfig()).items() if k != "color_prior"}}
    bases.check_world(older, WorldConfig())
    with pytest.raises(ConfigError, match="world.color_prior=0.5 but the base was pretrained on 0.0"):
        bases.check_world(older, WorldConfig(color_prior=0.5))


def test_demo_refuses_a_base_pretrained_on_another_world(tiny_ckpt: Path, tmp_path: Path):
    world = demo.Config().world
    _write(tiny_ckpt, tmp_path, world)
    ok = demo.Config(pretrained=str(tmp_path / "b1"))  # the base's own world: accepted
    assert ok.pretrained.endswith("b1")
    with pytest.raises(ConfigError, match=r"world\.vague_caption_rate=0\.0 but the base was pretrained on 0\.5"):
        demo.Config(pretrained=str(tmp_path / "b1"), world=dataclasses.replace(world, vague_caption_rate=0.0))
    # a checkpoint without a manifest is not checked (any earlier demo's pretrain/model)
    assert demo.Config(pretrained=str(tiny_ckpt), world=WorldConfig(seed=3)).pretrained == str(tiny_ckpt)


def test_base_and_demo_config_errors_are_specific():
    from hardpos.stages import base

    with pytest.raises(ConfigError, match="curriculum: steps must be >= 0"):
        demo.Config(curriculum=PhaseConfig(steps=-1))
    with pytest.raises(ConfigError, match="curriculum: steps must be >= 0"):
        base.Config(curriculum=PhaseConfig(steps=-1))
    with pytest.raises(ConfigError, match="checkpoint_every must be >= 0"):
        PhaseConfig(checkpoint_every=-5)
    with pytest.raises(ConfigError, match="from_scratch=true pretrains a base from scratch; drop pretrained=outputs/x"):
        demo.Config(from_scratch=True, pretrained="outputs/x")
    with pytest.raises(ConfigError, match="name='a/b': must be a plain file name"):
        base.Config(name="a/b")
    with pytest.raises(ConfigError, match="pretrain_only"):  # the base is its own stage now: hardpos base
        load_config(demo.Config, None, ["pretrain_only=true"])


def test_the_base_stage_recipe_is_the_demos_from_scratch_recipe_and_the_shipped_bases():
    """One recipe: the demo's --from-scratch passes its phases to the base stage, whose defaults
    are jobs/configs/base.yaml's, and that file's world is the demo's (the shipped base's)."""
    from hardpos.stages import base

    shipped = load_config(base.Config, str(REPO / "jobs" / "configs" / "base.yaml"), [])
    assert shipped.world == demo.Config().world == base.Config().world
    assert (shipped.curriculum, shipped.pretrain) == (base.Config().curriculum, base.Config().pretrain)
    d = demo.Config()
    assert [(p.steps, p.lr, p.batch_size) for p in (d.curriculum, d.pretrain)] == \
        [(p.steps, p.lr, p.batch_size) for p in (shipped.curriculum, shipped.pretrain)]


def test_from_scratch_drops_the_default_base_and_any_world_is_then_accepted():
    cfg = demo.Config(from_scratch=True, world=WorldConfig(seed=3))
    assert cfg.pretrained is None


def test_a_shipped_base_is_named_base_colon_name(monkeypatch: pytest.MonkeyPatch, tiny_ckpt: Path, tmp_path: Path):
    monkeypatch.setattr(bases, "BASES_DIR", tmp_path / "bases")
    _write(tiny_ckpt, tmp_path / "bases", demo.Config(from_scratch=True).world)
    assert bases.shipped() == ["b1"]
    assert bases.resolve("base:b1") == tmp_path / "bases" / "b1"
    assert bases.manifest_for("base:b1")["name"] == "b1"
    with pytest.raises(FileNotFoundError, match=r"base:nope: no shipped base named 'nope' \(shipped: \['b1'\]"):
        bases.resolve("base:nope")
    with pytest.raises(ConfigError, match="pretrained=base:nope: no shipped base"):
        demo.Config(pretrained="base:nope")
    from hardpos.models import weights

    with pytest.raises(ConfigError, match=r"model.pretrained=base:nope: no such shipped base; use one of \['b1'\]"):
        weights.check_model("model", "hardpos-demo", "base:nope")
    weights.check_model("model", "hardpos-demo", "base:b1")  # a shipped base carries its architecture
    # every stage loads it like any checkpoint (model.pretrained=base:b1)
    state = load_model(ModelConfig(arch="hardpos-demo", pretrained="base:b1")).model.state_dict()
    assert torch.equal(state["visual.conv1.weight"], load_file(str(tiny_ckpt / WEIGHTS_NAME))["visual.conv1.weight"].half().float())
    # another world with the shipped base fails at config load and says how to go on
    with pytest.raises(ConfigError, match=r"world\.seed=3 but the base was pretrained on 0.*--from-scratch"):
        demo.Config(pretrained="base:b1", world=WorldConfig(seed=3))


def test_phase_key_and_latest_checkpoint(tmp_path: Path):
    p = PhaseConfig(steps=10)
    k = phase_key("a", 0, p, "d.parquet", None)
    assert k == phase_key("a", 0, PhaseConfig(steps=10), "d.parquet", None)
    assert k != phase_key("a", 0, PhaseConfig(steps=11), "d.parquet", None)
    assert k != phase_key("a", 0, p, "d.parquet", "start/model")
    assert latest_checkpoint(str(tmp_path / "absent")) is None
    (tmp_path / "run" / "checkpoint_000001").mkdir(parents=True)
    assert latest_checkpoint(str(tmp_path / "run")) is None  # no train_state.pt: not a checkpoint yet
    for step in (1, 2):
        (tmp_path / "run" / f"checkpoint_00000{step}" / "train_state.pt").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "run" / f"checkpoint_00000{step}" / "train_state.pt").write_bytes(b"x")
    assert latest_checkpoint(str(tmp_path / "run")).endswith("checkpoint_000002")


# --------------------------------------------------------------------------- the shipped base
SHIPPED = sorted(bases.BASES_DIR.glob("*.json")) if bases.BASES_DIR.is_dir() else []
#: the shipped base's original accuracy (%) on the first 200 benchmark scenes of its world
#: (200 attribute, 146 relation items): measured 70.5 and 67.1 when it was shipped; the
#: windows (about 1.5 standard errors each side) catch a wrong or damaged base, or a change of
#: the world or the evaluator, and both lie inside the imperfect-base range [60, 85]
EXPECTED = {"world_replace_attribute": (65.0, 76.0), "world_replace_relation": (62.0, 72.0)}


@pytest.mark.skipif(not SHIPPED, reason="no base shipped under platform/hardpos/resources/bases yet")
@pytest.mark.parametrize("manifest_file", SHIPPED, ids=lambda p: p.stem)
def test_shipped_base(manifest_file: Path, tmp_path: Path):
    base_dir = manifest_file.with_suffix("")
    manifest = bases.verify_base(base_dir)  # its hash matches
    bases.check_world(manifest, demo.Config().world, source=str(base_dir))  # the demo's default world
    assert manifest["arch"] == demo.Config().arch and manifest["weights"]["bytes"] < 12e6  # small enough to ship
    # the world's benchmark split is seeded per split: 200 benchmark scenes and no others
    # are the first 200 of the full world's
    world = dataclasses.replace(WorldConfig(**manifest["world"]), n_pretrain=0, n_finetune=0, n_benchmark=200)
    generate_world(world, str(tmp_path / "w"))
    lm = load_model(ModelConfig(arch=manifest["arch"], pretrained=str(base_dir)))
    from hardpos.eval.evaluator import run_benchmarks  # lazy: only this skippable test scores
    from hardpos.eval.spec import BenchmarkSpec  # lazy: as above
    specs = [BenchmarkSpec(name=n, kind="triplets", path=str(tmp_path / "w" / "benchmark" / f"{n.split('_', 1)[1]}.parquet"))
             for n in EXPECTED]
    metrics = run_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, specs)
    for name, (lo, hi) in EXPECTED.items():
        assert lo <= 100 * metrics[f"{name}/orig_acc"] <= hi, (name, metrics[f"{name}/orig_acc"])
