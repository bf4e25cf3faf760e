"""``python -m benchmarks.calibrate signs``: a seeds measurement judged by the preregistered
checks its rows hold (exploratory: one world), and ``pair`` (pure, no Ray)."""
from __future__ import annotations

import json

import pytest

from benchmarks.calibrate import SignsConfig, main, signs
from hardpos.paper import table1
from scipy import stats


def _row(**cells):
    row = {c: 0.5 for c in table1.COLUMNS + table1.SUBSET_COLUMNS}
    row.update({k.replace("__", "/"): v for k, v in cells.items()})
    return row


def _per_seed(n=5):
    out = []
    for i in range(n):
        e = 0.002 * (i - n // 2)  # a little seed noise on HN-only
        out.append({
            "pretrained": _row(world_replace_attribute__orig_acc=0.68, world_replace_relation__orig_acc=0.63,
                               replace__orig_acc=0.60, swap__orig_acc=0.60),
            "captions-only": _row(replace__orig_acc=0.61 + e, swap__orig_acc=0.62),
            "hn-only": _row(replace__orig_acc=0.66 + e, swap__orig_acc=0.61 - 2 * e, replace__brittleness=0.2),
            "hp+hn": _row(replace__brittleness=0.12 + e),
        })
    return out


def test_signs_judges_the_preregistered_checks_a_seeds_file_can_judge(tmp_path, capsys):
    results = tmp_path / "results_seeds.json"
    results.write_text(json.dumps({"seeds": [0, 1, 2, 3, 4], "per_seed": _per_seed()}))
    md_path = tmp_path / "signs.md"
    out = signs(SignsConfig(results=str(results), output=str(md_path)))
    got = {v.check.id: v for v in out["verdicts"]}
    # only checks among the seeds' models: no w_neg grid, no one-kind positives
    assert "C-REPLACE" in got and not any(i.startswith(("J", "K", "L", "M")) for i in got)
    rep = got["C-REPLACE"]  # HN-only +6.0 +- 0.3 points over the base in every seed
    assert rep.held_holm and rep.tests[0].mean == pytest.approx(6.0) and rep.p < 0.001
    swap = got["C-SWAP"]  # +1.0 +- 0.6 points: t = 3.5 at 4 df
    assert swap.held and swap.p == pytest.approx(stats.t.sf(swap.tests[0].t, 4), abs=1e-9)
    assert swap.p_holm >= swap.p  # Holm over the judgeable checks
    assert not got["H1-SWAP"].held  # no difference at all
    md = md_path.read_text()
    assert md.startswith("### Exploratory: 5 seeds [0, 1, 2, 3, 4] of one world")
    assert f"{out['counts']['held_holm']} of {out['counts']['distinct']} judgeable preregistered checks hold" in md
    assert "| C-REPLACE | REPLACE | HN-only has higher original accuracy than the base |" in md
    assert "Exploratory" in capsys.readouterr().out


def test_signs_needs_two_seeds(tmp_path):
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"per_seed": _per_seed(1)}))
    with pytest.raises(ValueError, match="at least 2"):
        signs(SignsConfig(results=str(results)))
    assert main(["nope"]) == 2


def test_pair_compares_two_measurements_seed_by_seed(tmp_path, capsys):
    from benchmarks.calibrate import PAIR_COLUMNS, PairConfig, pair

    full = _per_seed(5)
    lora = json.loads(json.dumps(full))
    for i, row in enumerate(lora):  # LoRA: +2 points of REPLACE orig on hn-only in every seed (+- 0.1)
        row["hn-only"]["replace/orig_acc"] += 0.02 + 0.001 * (i % 2)
    a, b = tmp_path / "full.json", tmp_path / "lora.json"
    a.write_text(json.dumps({"seeds": [0, 1, 2, 3, 4], "per_seed": full}))
    b.write_text(json.dumps({"seeds": [0, 1, 2], "per_seed": lora[:3]}))  # only the common seeds count
    out = pair(PairConfig(a=str(a), b=str(b), a_name="full", b_name="LoRA", output=str(tmp_path / "p.md")))
    rows = {(r["model"], r["column"]): r for r in out["rows"]}
    assert {m for m, _ in rows} == {"captions-only", "hn-only", "hp+hn"} and len(rows) == 3 * len(PAIR_COLUMNS)
    moved = rows[("hn-only", "replace/orig_acc")]
    assert moved["seeds"] == [0, 1, 2] and moved["differs"] and moved["diff_mean"] == pytest.approx(2.0 + 0.1 / 3)
    assert moved["p"] == pytest.approx(2 * stats.t.sf(moved["diff_mean"] / (moved["diff_std"] / 3 ** 0.5), 2))
    same = rows[("hp+hn", "swap/aug_acc")]
    assert not same["differs"] and same["p"] == 1.0 and same["diff_mean"] == 0
    assert "18 tests at alpha 0.05: 1 differ; about 0.9 would by chance alone." in (tmp_path / "p.md").read_text()
    b.write_text(json.dumps({"seeds": [7], "per_seed": lora[:1]}))
    with pytest.raises(ValueError, match="0 common seed"):
        pair(PairConfig(a=str(a), b=str(b)))


def test_rescore_scores_checkpoints_through_the_evaluate_stage(tmp_path, tracking_uri, capsys):
    from eval_util import tiny_model

    from benchmarks.calibrate import RescoreConfig, rescore
    from hardpos.models.clip import save_checkpoint
    from hardpos.world.build import generate_world
    from hardpos.world.scene import WorldConfig

    generate_world(WorldConfig(n_pretrain=0, n_finetune=0, n_benchmark=12, image_size=32), str(tmp_path / "w"))
    lm = tiny_model(seed=0)
    save_checkpoint(lm.model, lm.model_cfg, tmp_path / "m", meta={"arch": lm.arch})
    rows = rescore(RescoreConfig(world_dir=str(tmp_path / "w"), models={"tiny": str(tmp_path / "m")}, arch=lm.arch,
                                 output_dir=str(tmp_path / "out"), output=str(tmp_path / "rows.json")))
    # the evaluate stage ran (its summary is on disk) and its metrics became the demo's row
    summary = json.loads((tmp_path / "out" / "tiny" / "summary.json").read_text())
    assert rows["tiny"]["swap/orig_acc"] == pytest.approx(summary["metrics"]["world_swap/orig_acc"])
    assert 0.0 <= rows["tiny"]["replace_seen/brittleness"] <= 1.0
    assert json.loads((tmp_path / "rows.json").read_text())["rows"] == rows
    assert "rescore: " in capsys.readouterr().out
