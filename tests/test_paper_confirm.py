"""The confirmatory checks: the check list, the paired test, Holm, one run's verdicts, and the
refusals of the confirmatory tool (changed checks, incomplete or foreign worlds)."""
import json
import math

import pytest
from scipy import stats

from benchmarks import confirmatory
from hardpos.paper import confirm
from hardpos.paper.confirm import Check, Comparison

DEMO_MODELS = {"pretrained", "captions-only", "hn-only", "hp+hn", "hp-replace+hn", "hp-swap+hn",
               "w_neg=0", "w_neg=0.25", "w_neg=0.5", "w_neg=0.75", "w_neg=1"}


def _rows(**cols):
    """model -> {column: fraction}, from keyword model names with '_' for '+'/'-'."""
    return {m: dict(v) for m, v in cols.items()}


def test_holm_adjusts_in_input_order_and_stays_monotone():
    # sorted: .005x4 = .02, .01x3 = .03, .03x2 = .06, .04x1 = .04 -> .06 (monotone)
    assert confirm.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert confirm.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert confirm.holm([]) == []


def test_the_paired_test_is_scipys_one_sided_paired_t_in_the_papers_direction():
    a = [0.70, 0.72, 0.69, 0.75, 0.71]
    b = [0.66, 0.70, 0.69, 0.70, 0.68]
    worlds = [{"x": {"swap/orig_acc": x}, "y": {"swap/orig_acc": y}} for x, y in zip(a, b)]
    up = confirm.paired_one_sided(Comparison("x", "y", "swap/orig_acc", "greater"), worlds)
    ref = stats.ttest_rel(a, b, alternative="greater")
    assert up.p == pytest.approx(ref.pvalue) and up.t == pytest.approx(ref.statistic)
    assert up.mean == pytest.approx(100 * (sum(a) - sum(b)) / 5)
    down = confirm.paired_one_sided(Comparison("x", "y", "swap/orig_acc", "less"), worlds)
    assert down.p == pytest.approx(1 - ref.pvalue)  # the other direction
    with pytest.raises(ValueError, match="at least 2 worlds"):
        confirm.paired_one_sided(Comparison("x", "y", "swap/orig_acc", "greater"), worlds[:1])


def test_drop_is_original_minus_augmented_accuracy():
    rows = {"a": {"replace/orig_acc": 0.8, "replace/aug_acc": 0.5}, "b": {"replace/orig_acc": 0.7, "replace/aug_acc": 0.6}}
    assert Comparison("a", "b", "replace/drop", "greater").margin(rows) == pytest.approx(20.0)


def test_a_check_holds_only_when_every_comparison_does_and_repeats_count_once():
    # x beats y clearly in every world, x vs z is a coin toss: "x highest of {y, z}" takes the larger p
    worlds = [{"x": {"swap/orig_acc": 0.8}, "y": {"swap/orig_acc": 0.6 + 0.01 * k},
               "z": {"swap/orig_acc": 0.8 + (0.01 if k % 2 else -0.01)}} for k in range(6)]
    vs_y = Comparison("x", "y", "swap/orig_acc", "greater")
    vs_z = Comparison("x", "z", "swap/orig_acc", "greater")
    checks = [Check("top", "f", "x highest", "SWAP", (vs_y, vs_z)), Check("y", "f", "x above y", "SWAP", (vs_y,)),
              Check("again", "g", "x above y, quoted twice", "SWAP", (vs_y,))]
    v = {x.check.id: x for x in confirm.judge(checks, worlds)}
    assert v["top"].p == max(t.p for t in v["top"].tests) and not v["top"].held
    assert v["y"].held_holm and v["again"].same_as == "y" and v["again"].p_holm == v["y"].p_holm
    # Holm over the two distinct checks only
    assert v["y"].p_holm == pytest.approx(min(1.0, 2 * v["y"].p))
    assert confirm.counts(list(v.values())) == {"checks": 3, "distinct": 2, "held": 1, "held_holm": 1}


def test_a_preregistered_check_is_never_left_out():
    worlds = [{"x": {"swap/orig_acc": 0.8}}] * 3
    with pytest.raises(ValueError, match="cannot be judged on world 0"):
        confirm.judge([Check("c", "f", "x above y", "SWAP", (Comparison("x", "y", "swap/orig_acc", "greater"),))], worlds)


def test_one_run_is_judged_by_a_t_prediction_interval():
    assert confirm.prediction_half_width(2.0, 5) == pytest.approx(stats.t.ppf(0.975, 4) * 2.0 * math.sqrt(1.2))
    cmp = Comparison("x", "y", "swap/orig_acc", "greater")
    tested = confirm.Tested(cmp, (4.0, 6.0, 5.0, 3.0, 7.0), 5.0, math.sqrt(2.5), 0.0, 0.0)
    h = confirm.prediction_half_width(math.sqrt(2.5), 5)  # about 4.9 points
    run = lambda margin: confirm.one_run(cmp, {"x": {"swap/orig_acc": margin / 100}, "y": {"swap/orig_acc": 0.0}}, tested)
    assert run(h + 0.5).verdict == "as the confirmatory result"
    assert run(h - 0.5).verdict == "inside the noise"
    assert run(-h - 0.5).verdict == "against it"


def test_the_shipped_checks_compare_demo_models_and_are_preregistered():
    findings = confirm.load_findings()
    checks = confirm.all_checks(findings)
    assert len(checks) == len({c.key() for c in checks}) == 40
    assert set().union(*(c.models() for c in checks)) <= DEMO_MODELS
    assert all(f.quote and f.where for f in findings)
    # the paper's own margin where its tables report it: HN-only vs CLIP on SWAP brittleness, 25.1 vs 21.7
    b_swap = next(c for c in checks if c.id == "B-SWAP")
    assert b_swap.comparisons[0].paper == pytest.approx(3.4)
    # "highest of the grid and HN-only" compares with every member, not the closest rival
    assert len(next(c for c in checks if c.id == "M5-SWAP").comparisons) == 5
    prereg = confirm.load_preregistration()
    assert prereg["checks_sha256"] == confirm.checks_digest(), "checks.json changed after the preregistration"
    assert len(prereg["world_seeds"]) >= 5 and not set(prereg["world_seeds"]) & {0, 1, 2, 3, 4}


def test_docs_checks_is_generated_from_the_check_list():
    from pathlib import Path

    text = confirm.findings_markdown(confirm.load_findings(), confirm.not_tested())
    assert (Path(__file__).parents[1] / "docs" / "checks.md").read_text() == text, \
        "docs/checks.md is stale: python -m benchmarks.confirmatory checks"
    assert "## Stated, not tested" in text


def _record(seed, prereg, commit="c" * 40, **extra):
    rows = {"hn-only": {"swap/orig_acc": 0.7 + 0.001 * seed}, "pretrained": {"swap/orig_acc": 0.6}}
    return {"world_seed": seed, "checks_sha256": prereg["checks_sha256"], "preregistration_commit": commit,
            "rows": rows, **extra}


def test_the_report_judges_all_preregistered_worlds_once_or_refuses():
    prereg = {"world_seeds": [11, 12, 13], "alpha": 0.05, "checks_sha256": "abc"}
    findings = [confirm.Finding("f", "quoted", "Table 1", (
        Check("C-SWAP", "f", "HN-only above the base", "SWAP",
              (Comparison("hn-only", "pretrained", "swap/orig_acc", "greater"),)),))]
    stored = {s: _record(s, prereg) for s in (11, 12)}
    with pytest.raises(confirmatory.Refused, match="2 of 3 preregistered worlds"):
        confirmatory.judge_stored(prereg, "c" * 40, stored, findings)
    stored[13] = _record(13, prereg)
    result = confirmatory.judge_stored(prereg, "c" * 40, stored, findings)
    assert result["counts"] == {"checks": 1, "distinct": 1, "held": 1, "held_holm": 1}
    assert "1 of 1 distinct checks hold after Holm's correction" in result["markdown"]
    with pytest.raises(confirmatory.Refused, match="another preregistration"):
        confirmatory.judge_stored(prereg, "d" * 40, stored, findings)
    with pytest.raises(confirmatory.Refused, match="not preregistered"):
        confirmatory.judge_stored(prereg, "c" * 40, {**stored, 99: _record(99, prereg)}, findings)
    with pytest.raises(confirmatory.Refused, match="uncommitted"):
        confirmatory.judge_stored(prereg, "c" * 40, {**stored, 13: _record(13, prereg, dirty=True)}, findings)


def test_changed_checks_are_refused_with_exit_2(tmp_path, capsys):
    changed = tmp_path / "checks.json"
    changed.write_text(confirm.CHECKS_PATH.read_text().replace("HN-only is more brittle", "HN-only is brittler"))
    with pytest.raises(confirmatory.Refused, match="the checks changed since the preregistration"):
        confirmatory.check_unchanged(confirm.load_preregistration(), changed)
    assert confirmatory.main(["nonsense"]) == confirmatory.EXIT_REFUSED


def test_a_run_lists_its_margins_until_the_confirmatory_worlds_are_in(tmp_path):
    prereg = {"world_seeds": [1, 2, 3], "alpha": 0.05, "checks_sha256": "x"}
    (tmp_path / "worlds").mkdir()
    (tmp_path / "preregistration.json").write_text(json.dumps(prereg))
    findings = [confirm.Finding("f", "q", "Table 1", (
        Check("C", "f", "HN-only above the base", "SWAP", (Comparison("hn-only", "pretrained", "swap/orig_acc", "greater"),)),
        Check("G", "f", "grid", "SWAP", (Comparison("w_neg=1", "w_neg=0", "swap/orig_acc", "greater"),))))]
    run = {"hn-only": {"swap/orig_acc": 0.75}, "pretrained": {"swap/orig_acc": 0.60}}
    text = confirm.run_verdicts_markdown(run, findings, folder=tmp_path)
    assert "(Table 1 models;" in text and "- C (SWAP) HN-only above the base: hn-only vs pretrained swap/orig_acc +15.0" in text
    assert "- G " not in text and "Not judged: the confirmatory run has 0 of 3" in text
    for k, d in enumerate((0.10, 0.12, 0.14)):
        (tmp_path / "worlds" / f"world{k + 1}.json").write_text(json.dumps(
            {"world_seed": k + 1, "rows": {"hn-only": {"swap/orig_acc": 0.6 + d}, "pretrained": {"swap/orig_acc": 0.6}}}))
    text = confirm.run_verdicts_markdown(run, findings, folder=tmp_path)
    assert "- C (SWAP) HN-only above the base: as the confirmatory result (hn-only vs pretrained swap/orig_acc +15.0 " \
           "(confirmatory +12.0 ± " in text


def test_the_stored_worlds_give_the_published_result():
    """The repository's ten preregistered worlds, judged as preregistered, give the counts the
    README and results.md state and exactly the table in docs/confirmatory.md."""
    root = confirm.CONFIRMATORY_DIR.parents[3]
    prereg = confirm.load_preregistration()
    stored = confirm.load_worlds()
    assert sorted(stored) == sorted(prereg["world_seeds"])
    assert all(not r["dirty"] and r["checks_sha256"] == prereg["checks_sha256"] for r in stored.values())
    worlds = [stored[s]["rows"] for s in prereg["world_seeds"]]
    verdicts = confirm.judge(confirm.all_checks(confirm.load_findings()), worlds, prereg["alpha"])
    assert confirm.counts(verdicts) == {"checks": 40, "distinct": 40, "held": 24, "held_holm": 16}
    assert confirm.verdicts_table(verdicts) in (root / "docs" / "confirmatory.md").read_text()
    held = {v.check.id for v in verdicts if v.held_holm}
    assert "B-REPLACE" not in held and "B-SWAP" not in held and "H2-SWAP" in held and "H2-REPLACE" not in held
    assert "16 hold after correction, 24 before" in (root / "README.md").read_text()
    assert "16 of the 40 checks hold after Holm's correction, 24 before it" in (root / "docs" / "results.md").read_text()
