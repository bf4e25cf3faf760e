"""``python -m benchmarks.calibrate signs``: a seeds measurement re-analysed with the paired
t-test per check, the README's sign table and the noise floors for one run (pure, no Ray)."""
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


def test_signs_reanalyses_per_seed_rows_and_writes_floors(tmp_path, capsys):
    results = tmp_path / "results_seeds.json"
    results.write_text(json.dumps({"seeds": [0, 1, 2, 3, 4], "per_seed": _per_seed()}))
    floors_path, md_path = tmp_path / "floors.json", tmp_path / "signs.md"
    out = signs(SignsConfig(results=str(results), write_floors=str(floors_path), output=str(md_path)))
    got = {(s.sign, s.claim, s.benchmark): s for s in out["signs"]}
    rep = got[("1", "HN-only orig above base", "REPLACE")]
    assert rep.held and rep.n == 5 and rep.p < 0.001
    swap = got[("1", "HN-only orig above base", "SWAP")]  # +1.0 +- 0.6 points: t = 3.5, 4 df
    assert swap.held and swap.p == pytest.approx(stats.t.sf(swap.t, 4), abs=1e-6)
    assert not got[("3", "HP+HN aug above HN-only", "SWAP")].held  # no difference at all
    md = md_path.read_text()
    k = len(out["signs"])
    assert f"{k} checks, each a one-sided paired t-test over seeds at alpha = 0.05" in md
    assert "| 1. HN-only orig above base | held (+6.0 ± 0.3, p < 0.001; paper +12.3) |" in md
    assert "| S1. base attribute orig in [60, 85] | held (68.0 ± 0.0) |  |" in md
    floors = json.loads(floors_path.read_text())
    assert floors["seeds"] == 5 and "1|HN-only orig above base|SWAP" in floors["checks"]
    assert floors["checks"]["1|HN-only orig above base|SWAP"]["floor"] == pytest.approx(1.645 * swap.noise, abs=1e-3)
    assert "The paper's signs (Tables 1 and 3) in these seeds" in capsys.readouterr().out


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
