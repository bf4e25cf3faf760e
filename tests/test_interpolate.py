"""WiSE-FT: the weight mix is exact at its ends and linear between them,
mismatched models fail with a message naming the difference, and the interpolate stage
reproduces the endpoints' scores, tracks one child run per alpha and registers a mix
with its provenance (real MLflow sqlite store, tiny hardpos-tiny checkpoints)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from eval_util import tiny_model

from hardpos.config import ConfigError, ModelConfig, load_config
from hardpos.interpolate.mix import (
    ArchitectureMismatch,
    check_alphas,
    check_compatible,
    interpolate_state,
    load_pair,
    state_of,
)
from hardpos.models.clip import load_model, save_checkpoint
from tests.support import triplet_rows, write_image, write_rows


# --------------------------------------------------------------------------- the mix
def _states():
    base = {"w": torch.tensor([1.0, 2.0, -3.0]), "h": torch.tensor([0.5], dtype=torch.bfloat16),
            "n": torch.tensor(7, dtype=torch.long)}
    ft = {"w": torch.tensor([3.0, 2.0, 1.0]), "h": torch.tensor([1.5], dtype=torch.bfloat16),
          "n": torch.tensor(9, dtype=torch.long)}
    return base, ft


def test_mix_is_linear_and_exact_at_both_ends():
    base, ft = _states()
    mid = interpolate_state(base, ft, 0.25)
    assert torch.equal(mid["w"], torch.tensor([1.5, 2.0, -2.0]))
    assert mid["h"].dtype == torch.bfloat16 and mid["h"].item() == 0.75
    assert mid["n"].item() == 9 and mid["n"].dtype == torch.long  # integer buffers: the finetuned model's
    # values where base + 1 * (ft - base) != ft in float32: the endpoints must still be bit-exact
    b = {"x": torch.tensor([0.1, 1e8, -7.3e-5, 3.0])}
    f = {"x": torch.tensor([0.7, 1.0, 2.2e3, -1e-30])}
    assert torch.equal(interpolate_state(b, f, 0.0)["x"], b["x"])
    assert torch.equal(interpolate_state(b, f, 1.0)["x"], f["x"])
    assert torch.equal(base["w"], torch.tensor([1.0, 2.0, -3.0]))  # inputs untouched


def test_alphas_are_checked():
    assert check_alphas([0, 1]) == [0.0, 1.0]
    for bad, match in (([], "at least one"), ([1.5], r"\[0, 1\]"), ([float("nan")], r"\[0, 1\]"), ([0.5, 0.5], "unique")):
        with pytest.raises(ValueError, match=match):
            check_alphas(bad)
    import hardpos.interpolate.stage

    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        load_config(hardpos.interpolate.stage.Config, None, ["alphas=[0, 2]"])
    with pytest.raises(ConfigError, match="register_alpha must be one of alphas"):
        load_config(hardpos.interpolate.stage.Config, None, ["alphas=[0, 1]", "register_alpha=0.5"])


def test_mismatches_name_the_first_difference():
    base, ft = _states()
    with pytest.raises(ArchitectureMismatch, match="'hardpos-tiny' model, the finetuned a 'hardpos-small'"):
        check_compatible(base, ft, base_arch="hardpos-tiny", ft_arch="hardpos-small")
    with pytest.raises(ArchitectureMismatch, match=r"configs differ at vision_cfg.width \(64 vs 128\)"):
        check_compatible(base, ft, base_cfg={"embed_dim": 8, "vision_cfg": {"width": 64}},
                         ft_cfg={"embed_dim": 8, "vision_cfg": {"width": 128}})
    with pytest.raises(ArchitectureMismatch, match="'extra' exists only in the finetuned model"):
        check_compatible(base, {**ft, "extra": torch.zeros(1)})
    with pytest.raises(ArchitectureMismatch, match=r"'w' has shape \(3,\) in the base and \(4,\) in the finetuned"):
        check_compatible(base, {**ft, "w": torch.zeros(4)})
    check_compatible(base, ft, base_arch="a", ft_arch="a", base_cfg={"x": 1}, ft_cfg={"x": 1})  # compatible: no error


def test_load_pair_refuses_two_architectures(tmp_path):
    torch.manual_seed(0)
    demo = load_model(ModelConfig(arch="hardpos-demo"))
    save_checkpoint(demo.model, demo.model_cfg, tmp_path / "demo", meta={"arch": "hardpos-demo"})
    with pytest.raises(ArchitectureMismatch, match="'hardpos-tiny' model, the finetuned a 'hardpos-demo' model"):
        load_pair(ModelConfig(arch="hardpos-tiny"), ModelConfig(pretrained=str(tmp_path / "demo")))


# --------------------------------------------------------------------------- the stage
def _checkpoint(path: Path, seed: int) -> str:
    lm = tiny_model(seed=seed)
    save_checkpoint(lm.model, lm.model_cfg, path, meta={"arch": lm.arch})
    return str(path)


def test_interpolate_stage_endpoints_children_curve_and_registration(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    from hardpos.runtime import execute
    from hardpos.interpolate import stage as interpolate
    from hardpos.stages import evaluate, register

    base, ft = _checkpoint(tmp_path / "base", 0), _checkpoint(tmp_path / "ft", 1)
    bench = write_rows(tmp_path / "b", triplet_rows(12, seed=3))
    for colour in ("red", "blue", "green"):
        write_image(tmp_path / "zs" / colour / "x.png", colour={"red": (200, 0, 0), "blue": (0, 0, 200), "green": (0, 200, 0)}[colour])
    common = ["device=cpu", "batch_size=5", f"benchmarks=[{{name: t, path: {bench}}}]",
              f"retention.zeroshot=[{{name: zs, root: {tmp_path / 'zs'}, classnames: folders, templates: ['a {{}} photo']}}]"]
    ends = {name: execute("evaluate", load_config(evaluate.Config, None, [
        f"output_dir={tmp_path / name}", f"model.pretrained={path}", *common]), quiet=True)["metrics"]
        for name, path in (("base", base), ("ft", ft))}
    assert ends["base"] != ends["ft"]  # the two models differ, so the endpoint checks can fail

    cfg = load_config(interpolate.Config, None, [
        f"output_dir={tmp_path / 'wise'}", f"base.pretrained={base}", f"finetuned.pretrained={ft}",
        "alphas=[0, 0.5, 1]", "register_alpha=0.5", "register_name=tiny-wise", *common])
    summary = execute("interpolate", cfg, quiet=True)

    # alpha = 0 and 1 reproduce the endpoints' scores exactly (every figure, retention included)
    points = {p["alpha"]: p for p in summary["points"]}
    assert points[0.0]["metrics"] == ends["base"]
    assert points[1.0]["metrics"] == ends["ft"]
    assert points[0.5]["metrics"] != ends["base"] and "zeroshot/zs/top1" in points[0.5]["metrics"]

    # one finished child run per alpha, with metrics, a logged model and the provenance
    client = MlflowClient(tracking_uri)
    parent = client.get_run(summary["mlflow_run_id"])
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.info.run_name for r in children) == ["alpha=0", "alpha=0.5", "alpha=1"]
    for r in children:
        assert r.info.status == "FINISHED" and r.data.tags["hardpos.stage"] == "interpolate"
        assert r.data.tags["hardpos.wise.base"] == base and r.data.tags["hardpos.wise.finetuned"] == ft
        assert r.data.tags["hardpos.model_uri"] == f"runs:/{r.info.run_id}/model"
        alpha = float(r.data.tags["hardpos.wise.alpha"])
        assert r.data.metrics["t/aug_acc"] == pytest.approx(points[alpha]["metrics"]["t/aug_acc"])

    # the curve: one row per alpha, the plot, the numbers
    out = tmp_path / "wise"
    md = (out / "curve.md").read_text()
    assert "| alpha | t orig | t aug | t brittle | zeroshot/zs/top1 |" in md
    assert [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ") and "alpha" not in line] == ["0", "0.5", "1"]
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(json.loads((out / "curve.json").read_text())["points"]) == 3
    assert (out / "alpha_0.5" / "report.md").is_file() and (out / "alpha_0.5" / "model" / "open_clip_config.json").is_file()

    # register_alpha=0.5: the version carries both parents and alpha, and loads as the 0.5 mix
    version = client.get_model_version_by_alias("tiny-wise", "wise")
    assert version.tags["hardpos.wise.base"] == base and version.tags["hardpos.wise.finetuned"] == ft
    assert version.tags["hardpos.wise.alpha"] == "0.5" and version.run_id == points[0.5]["run_id"]
    loaded = load_model(ModelConfig(pretrained="models:/tiny-wise@wise"), tracking_uri=tracking_uri)
    want = interpolate_state(state_of(tiny_model(seed=0).model), state_of(tiny_model(seed=1).model), 0.5)
    got = state_of(loaded.model)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

    # or through the register stage pointed at a child run: provenance via its model.wise.* params
    reg = register.register_best(register.Config(name="tiny-wise-1", run_id=points[1.0]["run_id"]), tracking_uri, "unused")
    tags = client.get_model_version("tiny-wise-1", reg["champion"]["version"]).tags
    assert tags["param.model.wise.alpha"] == "1" and tags["param.model.wise.base"] == base


def test_the_plot_draws_what_its_titles_say():
    """The accuracy panel draws original AND augmented accuracy of every benchmark with hard
    positives (its title says both); a benchmark without positives: original only."""
    from hardpos.eval.spec import BenchmarkSpec
    from hardpos.plots import curve_panels
    from hardpos.interpolate.stage import curve_columns

    metrics = {f"{b}/{f}": 0.5 for b in ("r", "s") for f in ("orig_acc", "aug_acc", "brittleness")}
    metrics.update({"sc/orig_acc": 0.6, "zeroshot/zs/top1": 0.4})
    specs = [BenchmarkSpec(n, "triplets", "x") for n in ("r", "s", "sc")]
    panels = dict(curve_panels(curve_columns(specs, metrics)))
    assert list(panels) == ["original and augmented accuracy (%)", "brittleness (%, lower is better)", "retention (%)"]
    assert [k for _, k in panels["original and augmented accuracy (%)"]] == ["r/orig_acc", "r/aug_acc", "s/orig_acc",
                                                                                "s/aug_acc", "sc/orig_acc"]
    only_orig = dict(curve_panels(curve_columns(specs[2:], metrics)))
    assert list(only_orig) == ["original accuracy (%)", "retention (%)"]
