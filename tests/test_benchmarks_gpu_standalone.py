"""The Ray-free GPU suite (benchmarks.gpu_standalone), run on the CPU with the tiny model.

The lent GPU machine has torch and open_clip but no Ray or MLflow, so the suite runs in a
fresh interpreter here and must not import them (nor pandas); its JSON must hold real
numbers for every section, including the combined-vs-CLIP ratio.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import child_env, gpu_standalone, suites

REPO = Path(__file__).resolve().parents[1]
TINY = ["--arch", "hardpos-tiny", "--batch", "4", "--steps", "1", "--warmup", "0", "--eval-rows", "8",
        "--eval-repeats", "1", "--serve-batches", "1,2", "--image-size", "40x30", "--device", "cpu"]


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu-suite") / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_standalone", *TINY, "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=child_env({"HARDPOS_COMMIT": "test"}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result  # printed and written alike
    return result


def test_runs_without_ray_mlflow_or_pandas(cpu_run):
    # modules_loaded is read from sys.modules at the end of the run, in the suite's own process
    assert not {"ray", "mlflow", "pandas", "boto3", "fastapi"} & set(cpu_run["modules_loaded"]), cpu_run["modules_loaded"]


def test_every_section_has_positive_figures_and_the_ratio(cpu_run):
    assert cpu_run["machine"]["device"] == "cpu" and cpu_run["machine"]["commit"] == "test"
    train = cpu_run["train"]
    assert train["arch"] == "hardpos-tiny" and train["batch_size"] == 4 and train["precision"] == "fp32"
    assert train["combined_samples_per_s"] > 0 and train["clip_samples_per_s"] > 0
    assert train["combined_over_clip"] == pytest.approx(train["combined_samples_per_s"] / train["clip_samples_per_s"])
    assert 0 < train["text_tokens_batch"] < train["text_tokens_full"]  # batch-length vs the full context
    assert "meets_goal" not in train  # the goal is a CUDA figure
    ev = cpu_run["evaluate"]
    assert ev["items"] == 8 and ev["fp32_items_per_s"] == pytest.approx(8 / ev["fp32_seconds"]) and "bf16_items_per_s" not in ev
    serve = cpu_run["serve"]
    assert set(k for k in serve if k.startswith("batch_")) == {"batch_1", "batch_2"}
    for fig in (serve["batch_1"], serve["batch_2"]):
        assert fig["items_per_s"] > 0 and fig["forward_ms_per_item"] > 0 and fig["decode_ms_per_item"] > 0


def test_suite_rows_from_the_json(cpu_run):
    rows = suites._gpu_rows(cpu_run)
    assert rows[0]["value"] == round(cpu_run["train"]["combined_samples_per_s"], 1) and rows[0]["ratio"] > 0
    assert [r["case"].split(": ")[0] for r in rows] == ["hardpos-tiny b4 cuda bf16", "evaluate",
                                                        "serve forward", "serve forward"]


@pytest.mark.parametrize("kwargs, match", [
    ({"batch": 0}, "batch"), ({"sections": ("train", "gpu")}, "sections"), ({"sections": ()}, "sections"),
    ({"eval_repeats": 0}, "eval_repeats"),
    ({"serve_batches": (0,)}, "serve_batches"), ({"device": "tpu"}, "device"), ({"eval_rows": 1}, "eval_rows"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpu_standalone.GpuSuiteConfig(**kwargs)


def test_cli_flags_map_to_the_config():
    cfg, out = gpu_standalone.parse_args(TINY + ["--sections", "train,serve", "--out", "x.json"])
    assert (cfg.arch, cfg.batch, cfg.steps, cfg.warmup, cfg.device) == ("hardpos-tiny", 4, 1, 0, "cpu")
    assert cfg.serve_batches == (1, 2) and cfg.image_size == (40, 30) and cfg.sections == ("train", "serve")
    assert out == "x.json"
    with pytest.raises(SystemExit):
        gpu_standalone.parse_args(["--image-size", "big"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_says_so():
    assert gpu_standalone.resolve_device("auto") == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA device"):
        gpu_standalone.resolve_device("cuda")


def test_device_script_runs_the_cpu_path(tmp_path):
    # infra/device/gpu_suite.sh with no wheels folder and DEVICE=cpu: the same command the GPU machine runs
    script = REPO / "infra" / "device" / "gpu_suite.sh"
    env = {**__import__("os").environ, "OUT": str(tmp_path), "GPU_SUITE_ARGS": " ".join(TINY[:-2] + ["--sections", "serve"]),
           "DEVICE": "cpu", "WHEELS": str(tmp_path / "no-wheels"), "PYTHON": sys.executable, "HARDPOS_COMMIT": "test"}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert result["machine"]["device"] == "cpu" and result["serve"]["batch_2"]["items_per_s"] > 0
    assert (tmp_path / "gpu_suite.log").is_file()


@pytest.mark.slow  # torch.compile's tracing takes ~15 CPU-s even with the eager backend
def test_compile_section_times_the_compiled_step_against_eager():
    cfg = gpu_standalone.GpuSuiteConfig(arch="hardpos-tiny", batch=4, steps=1, warmup=0, device="cpu", sections=("compile",),
                                        compile_backend="eager")
    fig = gpu_standalone.run(cfg)["compile"]
    assert fig["backend"] == "eager" and fig["first_call_s"] > 0
    assert fig["compiled_samples_per_s"] > 0 and fig["eager_samples_per_s"] > 0 and fig["compiled_over_eager"] > 0
