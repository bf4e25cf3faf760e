"""The benchmark harness itself (quick mode: smoke sizes; numbers are not asserted)."""
import json

import pytest

from benchmarks import suites
from benchmarks.harness import compare_alternating, format_table, reference_data_dir
from hardpos import runtime
from hardpos.config import load_config


def test_compare_alternating_reports_ratio_of_medians():
    calls = []
    row = compare_alternating(lambda: calls.append("fast"), lambda: calls.append("slow"), repeats=4, warmup=1)
    # warm-up pair, then alternating order so neither path always runs second
    assert calls == ["fast", "slow", "fast", "slow", "slow", "fast", "fast", "slow", "slow", "fast"]
    assert row["repeats"] == 4 and row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]


def test_format_table():
    table = format_table([{"suite": "text", "case": "c", "optimised_s": 0.01, "baseline_s": 0.05, "ratio_median": 5.0, "ratio_min": 4.0, "ratio_max": 6.0}])
    assert table.splitlines()[-1] == "| text | c | 10.0 ms | 50.0 ms | 5.00x [4.00, 6.00] |"


def test_text_suite_quick_checks_equality_and_writes_summary(tmp_path, capsys):
    args = [f"output_dir={tmp_path}", "suite=text", "quick=true", "tracking.enabled=false"]
    assert suites.main(args) == 0
    assert "| text |" in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    (row,) = on_disk["rows"]
    assert row["suite"] == "text" and row["max_abs_diff"] < 1e-4
    assert row["ratio_median"] > 0 and summary["machine"]["cpus"] >= 1


def test_unknown_suite_is_a_config_error(capsys):
    from hardpos.config import ConfigError

    with pytest.raises(ConfigError, match="suite"):
        load_config(suites.Config, None, ["suite=nope"])
    assert suites.main(["suite=nope"]) == 2
    assert "config error" in capsys.readouterr().err


def test_the_command_line_lists_its_keys_and_is_no_stage(capsys):
    assert suites.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "python -m benchmarks.suites" in out and "  suite: " in out and "  evaluate_rows: " in out
    assert "benchmark" not in runtime.STAGES


def test_gpu_suite_and_vllm_rows_say_why_they_did_not_run(monkeypatch):
    import torch

    cfg = load_config(suites.Config, None, ["suite=gpu", "tracking.enabled=false"])
    if not torch.cuda.is_available():
        assert suites.gpu_suite(cfg) == [{"suite": "gpu", "case": "skipped: no CUDA device", "value": None}]
    monkeypatch.delenv("HARDPOS_VLLM_MODEL", raising=False)
    (row,) = suites.vllm_rows(10)  # vllm missing, or no model named: never a download
    assert row["value"] is None and row["case"].startswith("vLLM: skipped (")


def test_evaluate_items_row_times_the_evaluator():
    # the gpu suite's evaluate row, on the CPU with the tiny model (the same code path)
    cfg = load_config(suites.Config, None, ["text_arch=hardpos-tiny", "evaluate_rows=8", "tracking.enabled=false"])
    row = suites.evaluate_items_row(cfg, "cpu", image_size=(40, 30))
    assert row["case"].startswith("evaluate: hardpos-tiny REPLACE 8 rows on cpu")
    assert row["value"] == round(8 / row["seconds"], 1) and row["value"] > 0


def test_reference_data_dir_explicit_then_env_then_none(monkeypatch, tmp_path):
    monkeypatch.delenv("HARDPOS_REFERENCE_DATA", raising=False)
    monkeypatch.delenv("HARDPOS_SHARED_DATA", raising=False)
    assert reference_data_dir() is None
    monkeypatch.setenv("HARDPOS_SHARED_DATA", str(tmp_path / "old"))
    assert reference_data_dir() == tmp_path / "old"
    monkeypatch.setenv("HARDPOS_REFERENCE_DATA", str(tmp_path / "env"))
    assert reference_data_dir() == tmp_path / "env"
    assert reference_data_dir(str(tmp_path / "arg")) == tmp_path / "arg"


def test_text_suite_reads_captions_from_data_dir(shared_data, monkeypatch):
    # the reference captions come from data_dir= (never a path guessed beside the repo)
    from hardpos.data.captions.formats import read_captions

    monkeypatch.delenv("HARDPOS_REFERENCE_DATA", raising=False)
    monkeypatch.delenv("HARDPOS_SHARED_DATA", raising=False)
    cfg = load_config(suites.Config, None, [f"data_dir={shared_data}"])
    real = [r["caption"] for r in read_captions(str(shared_data / "negclip" / "valid_neg_clip.tsv"), limit=4)]
    assert suites._bench_captions(cfg, 4) == real
    synthetic = suites._bench_captions(load_config(suites.Config, None, []), 4)
    assert synthetic != real and synthetic[0].startswith("a man riding")


def test_lora_suite_quick_times_lora_beside_full_finetuning(tmp_path):
    cfg = load_config(suites.Config, None, ["suite=lora", "quick=true", "tracking.enabled=false"])
    (row,) = suites.lora_suite(cfg)
    assert row["suite"] == "lora" and row["ratio_median"] > 0 and row["rank"] == 4
    # the exact parts: trainable parameters and their gradient + AdamW bytes
    assert 0 < row["lora_trainable"] < row["full_trainable"] / 20
    assert row["full_grad_optim_bytes"] == 12 * row["full_trainable"]
    assert "LoRA r4" in row["case"] and "vs full" in row["case"]
