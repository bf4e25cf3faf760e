"""Configs: one validation style, --help with the stage's real defaults, list items by index,
"world" spelled the same in every stage, and every shipped YAML loading into its stage."""
from __future__ import annotations

import dataclasses
import pickle
import re
import shlex
from pathlib import Path
from typing import Literal

import pytest
import yaml

from hardpos import cli, runtime
from hardpos.stages.demo import PhaseConfig
from hardpos.config import (ConfigError, JobConfig, TrackingConfig, describe_config, field_docs, from_dict,
                            load_config, require, type_name)

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- one validation style
@dataclasses.dataclass
class _Phase:
    """A section that checks itself.

    steps: optimiser steps.
    mode: how / what, on two
        lines (a continuation).
    """

    steps: int = 3
    mode: Literal["a", "b"] = "a"

    def __post_init__(self) -> None:
        require(self.steps >= 1, "steps", "must be >= 1", self.steps)


@dataclasses.dataclass
class _Item:
    name: str = "x"
    weight: float = 1.0


@dataclasses.dataclass
class _Cfg(JobConfig):
    """Test config.

    inner, outer: two phases.
    items: a list of items.
    """

    inner: _Phase = dataclasses.field(default_factory=lambda: _Phase(steps=600, mode="b"))
    outer: _Phase = dataclasses.field(default_factory=_Phase)
    items: list[_Item] = dataclasses.field(default_factory=lambda: [_Item("p", 0.5), _Item("q", 2.0)])
    grid: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.0])


def test_config_error_is_a_value_error_that_names_the_full_key_path():
    with pytest.raises(ConfigError) as info:
        load_config(_Cfg, None, ["inner.steps=0"])
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "inner.steps must be >= 1, got 0"
    assert info.value.key == "inner.steps"
    with pytest.raises(ConfigError, match=r"^tracking\.drain_timeout_s must be >= 0, got -1\.0$"):
        load_config(_Cfg, None, ["tracking.drain_timeout_s=-1"])
    # built directly (no loader), the key is relative to the dataclass; still a ValueError
    with pytest.raises(ValueError, match=r"^request_timeout_s must be > 0, got 0$"):
        TrackingConfig(request_timeout_s=0)
    # type errors read "key: what was wrong"
    with pytest.raises(ConfigError, match=r"^outer\.mode: 'c' is not one of 'a', 'b'$"):
        load_config(_Cfg, None, ["outer.mode=c"])


def test_config_error_keeps_its_key_through_pickling():
    """Ray ships a worker's exception to the driver pickled: the key path must survive."""
    err = pickle.loads(pickle.dumps(ConfigError("must be > 0, got 0", key="data.limit")))
    assert (str(err), err.key, err.reason) == ("data.limit must be > 0, got 0", "data.limit", "must be > 0, got 0")


def test_stage_configs_raise_config_error_with_the_key():
    train = runtime.stage_module("train")
    for override, key in (("loss.w_neg=-1", "loss.w_neg"), ("data.val_fraction=2", "val_fraction"),
                          ("batch_size=0", "batch_size"), ("tracking.request_timeout_s=0", "tracking.request_timeout_s")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(train.Config, None, [override])
    demo = runtime.stage_module("demo")
    with pytest.raises(ConfigError, match="variants"):
        load_config(demo.Config, None, ["variants=[]"])


# --------------------------------------------------------------------------- sections keep the stage's defaults
def test_overriding_one_key_of_a_section_keeps_the_stages_other_defaults():
    cfg = load_config(_Cfg, None, ["inner.steps=5"])
    assert cfg.inner == _Phase(steps=5, mode="b")  # mode from the stage's default_factory, not _Phase's "a"
    demo = runtime.stage_module("demo").Config
    cfg = load_config(demo, None, ["pretrain.steps=5", "tracking.enabled=false"])
    stage_default = demo().pretrain  # the demo's own, which differs from PhaseConfig's class defaults
    assert (stage_default.lr, stage_default.warmup_steps) != (PhaseConfig().lr, PhaseConfig().warmup_steps)
    assert (cfg.pretrain.steps, cfg.pretrain.lr, cfg.pretrain.warmup_steps) == (5, stage_default.lr, stage_default.warmup_steps)
    assert cfg.tracking.experiment == "hardpos-demo" and cfg.tracking.enabled is False


# --------------------------------------------------------------------------- list items by index
def test_list_items_are_overridable_by_index():
    cfg = load_config(_Cfg, None, ["items.1.weight=0.25", "grid.0=0.5"])
    assert cfg.items == [_Item("p", 0.5), _Item("q", 0.25)]
    assert cfg.grid == [0.5, 1.0]
    demo = load_config(runtime.stage_module("demo").Config, None, ["variants.1.loss.w_neg=0.5"])
    assert [(v.name, v.loss.w_neg) for v in demo.variants] == [("captions-only", 0.0), ("hn-only", 0.5), ("hp+hn", 1.0)]


def test_index_overrides_edit_the_yaml_files_list(tmp_path):
    evaluate = runtime.stage_module("evaluate").Config
    cfg = load_config(evaluate, REPO / "jobs" / "configs" / "evaluate_paper.yaml", ["benchmarks.0.image_root=/data/vg"])
    plain = load_config(evaluate, REPO / "jobs" / "configs" / "evaluate_paper.yaml")
    assert cfg.benchmarks[0].image_root == "/data/vg"
    assert cfg.benchmarks[0].name == plain.benchmarks[0].name and cfg.benchmarks[1:] == plain.benchmarks[1:]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"items": [{"name": "only"}]}))
    assert load_config(_Cfg, path, ["items.0.weight=3"]).items == [_Item("only", 3.0)]


@pytest.mark.parametrize("override, message", [
    ("items.2.weight=1", "items: index 2 is out of range, the list has 2 item(s) (0..1)"),
    ("grid.7=1", "grid: index 7 is out of range, the list has 2 item(s)"),
    ("items.first.weight=1", "items is a list: address its items by index"),
    ("items.0.wait=1", "unknown config key(s) 'items.0.wait'"),
    ("items.1.name=[1]", "items.1.name: expected a string"),
])
def test_bad_index_overrides_name_the_list_and_its_length(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(_Cfg, None, [override])
    assert message in str(info.value)


def test_an_index_into_an_empty_default_list_is_an_error():
    evaluate = runtime.stage_module("evaluate").Config
    with pytest.raises(ConfigError, match="benchmarks: index 0 is out of range, the list has 0 item"):
        load_config(evaluate, None, ["benchmarks.0.image_root=/x"])


# --------------------------------------------------------------------------- world
def test_world_keys_have_one_spelling_in_every_stage():
    # world.<key>: a setting of the world's generation (the demo's section; the world stage's
    # own keys are top-level, its config *is* one); world_dir: the folder of a generated world
    world = runtime.stage_module("world").Config
    flat = load_config(world, None, ["n_pretrain=7", "colors=[blue, yellow]", "output_dir=/tmp/w"])
    assert (flat.n_pretrain, flat.colors, flat.output_dir) == (7, ["blue", "yellow"], "/tmp/w")
    demo = load_config(runtime.stage_module("demo").Config, None, ["world.n_pretrain=7", "world_dir=/tmp/w", "from_scratch=true"])
    assert (demo.world.n_pretrain, demo.world_dir) == (7, "/tmp/w")
    for stage in ("evaluate", "interpolate"):
        assert load_config(runtime.stage_module(stage).Config, None, ["world_dir=/tmp/w"]).world_dir == "/tmp/w"
        with pytest.raises(ConfigError, match="unknown config key.*'world'"):  # one spelling, no alias
            load_config(runtime.stage_module(stage).Config, None, ["world=/tmp/w"])
    compare = load_config(runtime.stage_module("compare").Config, None, ["explorer.world_dir=/tmp/w"])
    assert compare.explorer.world_dir == "/tmp/w"
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) 'world'"):
        load_config(world, None, ["world.n_pretrain=7"])
    # the world's own checks run when the config is built (exit 2 before any work)
    with pytest.raises(ConfigError, match="image_size must be >= 16"):
        load_config(world, None, ["image_size=8"])


# --------------------------------------------------------------------------- --help
def test_field_docs_parse_the_dataclass_docstrings():
    assert field_docs(_Phase) == {"steps": "optimiser steps.", "mode": "how / what, on two lines (a continuation)."}
    docs = field_docs(_Cfg)
    assert docs["inner"] == docs["outer"] == "two phases."
    assert docs["seed"] == "global seed for everything random in the stage."  # inherited from JobConfig
    assert type_name(Literal["a", "b"]) == "one of 'a', 'b'" and type_name(str | None) == "str | None"


def test_help_lines_show_the_instances_values_docs_and_choices():
    lines = describe_config(_Cfg())
    assert "  inner.steps: int = 600" in lines and "  outer.steps: int = 3" in lines
    assert "  inner.mode: one of 'a', 'b' = 'b'" in lines
    assert "  items.1.weight: float = 2.0" in lines and "      optimiser steps." in lines


def _help(capsys, *argv: str) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_demo_help_shows_the_demos_real_defaults(capsys):
    out = _help(capsys, "demo", "--help")
    # The demo's own defaults (whatever its calibration sets), not PhaseConfig's class defaults.
    own, cls = runtime.stage_module("demo").Config(), PhaseConfig()
    assert own.pretrain.lr != cls.lr and own.finetune.lr != cls.lr
    assert f"  pretrain.steps: int = {own.pretrain.steps}" in out and f"  pretrain.lr: float = {own.pretrain.lr}" in out
    assert f"  pretrain.lr: float = {cls.lr}" not in out
    assert f"  finetune.steps: int = {own.finetune.steps}" in out and "  tracking.experiment: str = 'hardpos-demo'" in out
    assert "  generate_engine: one of 'rules', 'http', 'vllm' = 'rules'" in out
    assert "  variants.1.loss.w_neg: float = 1.0" in out
    # the field's doc, under its key
    assert re.search(r"  pretrain\.lr: float = 5e-05\n +peak learning rate", out)
    # with --config, the file's values
    small = yaml.safe_load((REPO / "jobs" / "configs" / "demo-small.yaml").read_text())
    out = _help(capsys, "demo", "--config", str(REPO / "jobs" / "configs" / "demo-small.yaml"), "--help", "finetune.lr=0.003")
    assert f"  pretrain.steps: int = {small['pretrain']['steps']}" in out and "  finetune.lr: float = 0.003" in out


def test_train_help_documents_every_key(capsys):
    out = _help(capsys, "train", "--help")
    assert "  precision: one of 'auto', 'fp32', 'bf16' = 'auto'" in out
    assert "  loss.w_neg: float = 1.0" in out and "  optim.beta2: float = 0.98" in out
    assert "  eval_benchmarks.<i>.kind: one of 'replace', 'swap', 'sugarcrepe', 'sugarcrepe_pp', 'triplets' = 'triplets'" in out
    keys = out.split("config keys", 1)[1].splitlines()[1:]
    undocumented = [line for line, nxt in zip(keys, keys[1:] + [""]) if line.startswith("  ") and not line.startswith("   ")
                    and not nxt.startswith("      ")]
    assert undocumented == []


def test_world_help_lists_the_worlds_keys_at_top_level(capsys):
    out = _help(capsys, "world", "--help")
    assert "  n_pretrain: int = 20000" in out and "also accepted" not in out


def test_help_for_a_bad_override_is_a_config_error(capsys):
    assert cli.main(["demo", "--help", "pretrain.stepz=1"]) == 2
    assert "pretrain.stepz" in capsys.readouterr().err


# --------------------------------------------------------------------------- every shipped config loads
def _stage_of(path: Path) -> str:
    return re.split(r"[_-]", path.stem)[0]


def _infra_job_commands() -> list[tuple[str, list[str]]]:
    """``(manifest, argv)`` for every ``python jobs/<stage>.py ...`` entrypoint in infra/."""
    out = []
    for path in sorted((REPO / "infra").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            entry = ((doc or {}).get("spec") or {}).get("entrypoint") if isinstance(doc, dict) else None
            if entry and "jobs/" in entry:
                out.append((str(path.relative_to(REPO)), shlex.split(entry)))
    return out


JOB_CONFIGS = sorted((REPO / "jobs" / "configs").glob("*.yaml"))
INFRA_COMMANDS = _infra_job_commands()


def test_the_config_parametrisations_are_not_empty():
    """An empty list would turn the two tests below into silent skips."""
    assert {_stage_of(p) for p in JOB_CONFIGS} >= {"demo", "evaluate", "generate", "perturb", "sweep", "train", "world"}
    assert sorted(argv[1] for _, argv in INFRA_COMMANDS) == ["jobs/generate.py", "jobs/sweep.py", "jobs/train.py"]


@pytest.mark.parametrize("path", JOB_CONFIGS, ids=lambda p: p.name)
def test_every_job_config_loads_into_its_stage(path):
    stage = _stage_of(path)
    assert stage in runtime.STAGES, f"{path.name}: {stage!r} is not a stage"
    cfg = load_config(runtime.stage_module(stage).Config, path)
    # every key the file sets survives into the config (no silently dropped sections)
    data = yaml.safe_load(path.read_text()) or {}
    loaded = dataclasses.asdict(cfg)
    assert set(data) <= set(loaded)


@pytest.mark.parametrize("manifest, argv", INFRA_COMMANDS, ids=[m for m, _ in INFRA_COMMANDS])
def test_every_infra_job_command_loads_into_its_stage(manifest, argv):
    config_file, overrides, _, _ = cli.parse_args(argv[2:])
    stage = re.fullmatch(r"jobs/(\w+)\.py", argv[1]).group(1)
    cfg = load_config(runtime.stage_module(stage).Config, REPO / config_file if config_file else None, overrides)
    assert cfg.output_dir.startswith("${HARDPOS_RUNS_URI}/"), manifest


def test_from_dict_names_sections_of_direct_errors():
    with pytest.raises(ConfigError, match=r"^outer\.steps must be >= 1, got -2$"):
        from_dict(_Cfg, {"outer": {"steps": -2}})
    assert from_dict(_Cfg, {}, base=_Cfg(seed=4)).seed == 4



@dataclasses.dataclass
class _Inner:
    y: int = 0


@dataclasses.dataclass
class _SharedDoc:
    """x / inner: one line for two keys."""

    x: int = 0
    inner: _Inner = dataclasses.field(default_factory=_Inner)


def test_every_config_key_has_its_own_help_text():
    """--help shows each key's own doc: none missing, and no section documented by a line
    shared with other keys (interpolate's retention.* once showed world_dir's text)."""
    from hardpos.config.help import doc_problems

    assert {s: doc_problems(runtime.stage_module(s).Config) for s in runtime.STAGES} == {s: [] for s in runtime.STAGES}
    assert doc_problems(_SharedDoc) == ["inner: a section documented by a line shared with other keys", "inner.y: no doc line"]
    text = "\n".join(describe_config(runtime.stage_module("interpolate").Config()))
    retention = text.split("  retention.*", 1)[1].split("  retention.zeroshot", 1)[0]
    assert "world_dir" not in retention and "zero-shot" in retention
    for key in ("register_name", "register_alias"):
        assert text.split(f"  {key}:", 1)[1].splitlines()[1].strip(), key  # its doc line follows
