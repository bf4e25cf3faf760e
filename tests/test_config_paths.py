"""Relative paths mean the directory the job started in, in every stage and every Tune trial."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hardpos import runtime
from hardpos.config import ConfigError, load_config
from hardpos.config.paths import absolute_paths, absolute_value

REPO = Path(__file__).resolve().parent.parent


def test_relative_paths_become_absolute_and_names_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    cfg = load_config(runtime.stage_module("train").Config, None, [
        "data.train_path=outputs/demo/generate/triplets.parquet", "data.image_root=s3://bucket/images",
        "model.pretrained=base:hardpos-base", "checkpoint.storage_path=~/ckpt",
        'eval_benchmarks=[{name: r, kind: triplets, path: "bench/*.parquet"}]',
    ])
    out = absolute_paths(cfg)
    assert out.data.train_path == str(tmp_path / "outputs/demo/generate/triplets.parquet")
    assert out.eval_benchmarks[0].path == str(tmp_path / "bench/*.parquet")  # globs keep their pattern
    assert out.data.image_root == "s3://bucket/images" and out.model.pretrained == "base:hardpos-base"
    assert out.checkpoint.storage_path == os.path.expanduser("~/ckpt")
    assert out.output_dir == str(tmp_path / "outputs/train")
    assert cfg.data.train_path == "outputs/demo/generate/triplets.parquet"  # a copy: the input is unchanged
    # a field that holds a path or a name is resolved only when the path exists
    assert absolute_value("model.pretrained", "model") == str(tmp_path / "model")
    assert absolute_value("prompts", "paper") == "paper"
    assert absolute_value("loss.w_neg", "0.5") == "0.5"
    # a file name inside output_dir is no path of its own: generate writes <output_dir>/triplets.parquet
    gen = absolute_paths(load_config(runtime.stage_module("generate").Config, None, ["output_dir=out"]))
    assert gen.join.output == "triplets.parquet" and gen.output_dir == str(tmp_path / "out")


def test_the_sweeps_trials_get_absolute_paths_and_its_data_is_checked_once(tmp_path, monkeypatch):
    """Tune runs a trial in its own folder: a relative train path (as jobs/configs/sweep.yaml
    has) must reach the trial absolute, and a missing file fails the sweep before any trial."""
    monkeypatch.chdir(tmp_path)
    module = runtime.stage_module("sweep")
    overrides = {"data.train_path": "data/t.parquet", "eval_benchmarks": [{"name": "r", "kind": "triplets", "path": "b.parquet"}]}
    cfg = load_config(module.Config, None, [
        f"train_config={REPO / 'jobs/configs/train.yaml'}", f"train_overrides={json.dumps(overrides)}",
        'search_space={"data.val_path": {"grid_search": ["v.parquet", "s3://b/v.parquet"]}}',
        'extra_trials=[{"data.val_path": "w.parquet"}]',
    ])
    base = module.trial_base(cfg)
    assert base["data"]["train_path"] == str(tmp_path / "data/t.parquet")
    assert base["eval_benchmarks"][0]["path"] == str(tmp_path / "b.parquet")
    space, extra = module.absolute_space(cfg)
    assert space["data.val_path"] == {"grid_search": [str(tmp_path / "v.parquet"), "s3://b/v.parquet"]}
    assert extra == [{"data.val_path": str(tmp_path / "w.parquet")}]
    elsewhere = tmp_path / "tune" / "trial"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)  # what Tune does to a trial
    assert module.trial_train_config(base, {"loss.w_neg": 0.5}).data.train_path == str(tmp_path / "data/t.parquet")
    # the sweep stage's check, which the runtime runs before the sweep starts any trial
    with pytest.raises(ConfigError, match=r"train_overrides\.data\.train_path.*t\.parquet"):
        module.check(cfg)
