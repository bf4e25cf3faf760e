"""Performance harness: every stage's optimised path vs its naive baseline, side by side.

    python -m benchmarks.suites [--config FILE.yaml] suite=<name>|all [key=value ...] [--help]

Prints a Markdown table and writes summary.json under ``output_dir`` (the job contract of
:func:`hardpos.runtime.execute`: an MLflow run when tracking is on). Each suite alternates
the two paths in one process and reports the median ratio with min/max (see
:mod:`benchmarks.harness`). Suites: text, train_step, lora (LoRA vs full finetuning: step time
and memory), evaluate, serve, generate, gpu (CUDA only), resilience (node loss; figures, not ratios), tracking (step time with the MLflow
server dead vs alive). ``quick=true`` shrinks every suite to a smoke run (used by the test
suite to keep the harness working; its numbers mean nothing). Reference files (NegCLIP
captions, the REPLACE annotations) come from ``data_dir=`` or ``$HARDPOS_REFERENCE_DATA``;
without either, suites use synthetic stand-ins.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from benchmarks import child_env, gpu_standalone
from benchmarks.eval_bench import evaluate_bench
from benchmarks.generate_bench import caption_file, measure_stage
from benchmarks.harness import compare_alternating, format_table, reference_data_dir
from benchmarks.train_bench import bench_lora_step, bench_train_step
from hardpos.cli import parse_args
from hardpos.config import ConfigError, JobConfig, ModelConfig, describe_config, dump_yaml, load_config
from hardpos.data.captions.formats import read_captions
from hardpos.models.clip import encode_text, load_model, tokenize
from hardpos.runtime import JobContext, execute

Suite = Literal["all", "text", "train_step", "lora", "evaluate", "serve", "generate", "gpu", "resilience", "tracking"]
SUITES = ("text", "train_step", "lora", "evaluate", "serve", "generate", "gpu", "resilience", "tracking")


@dataclasses.dataclass
class Config(JobConfig):
    """suite: one suite or ``all``.
    repeats: alternating pairs per case (the median ratio is reported).
    quick: tiny sizes, for smoke tests of the harness itself.
    text_arch: architecture for the text/train_step suites (random weights).
    captions: caption source for the text suite (COCO-length captions); None -> the NegCLIP
        file under ``data_dir`` when present, else synthetic captions.
    data_dir: folder of the public reference files (``negclip/valid_neg_clip.tsv``,
        ``hard_positives/``); None -> ``$HARDPOS_REFERENCE_DATA``; unset -> synthetic data.
    batch_size: captions per text batch / samples per train step.
    evaluate_rows / evaluate_repeats: REPLACE rows and alternating pairs of the evaluate
        suite (the naive evaluator alone takes ~0.2 s per row for ViT-B-32 on 2 CPU cores,
        so one pair of 2,000 rows is ~7 min; its min/max then equal the median).
    """

    output_dir: str = "outputs/benchmark"
    suite: Suite = "all"
    repeats: int = 5
    quick: bool = False
    text_arch: str = "ViT-B-32"
    captions: str | None = None
    data_dir: str | None = None
    batch_size: int = 64
    evaluate_rows: int = 2000
    evaluate_repeats: int = 1


# --------------------------------------------------------------------------- suites
def _bench_captions(cfg: Config, n: int) -> list[str]:
    source = cfg.captions
    root = reference_data_dir(cfg.data_dir)
    if source is None and root is not None:
        default = root / "negclip" / "valid_neg_clip.tsv"
        source = str(default) if default.is_file() else None
    if source is not None:
        caps = [r["caption"] for r in read_captions(source, limit=n) if r["caption"]]
        if caps:
            return (caps * (n // len(caps) + 1))[:n]
    words = "a man riding a red bike next to a small dog on a sunny street".split()
    return [" ".join(words[: 6 + i % 8]) for i in range(n)]


def text_suite(cfg: Config) -> list[dict[str, Any]]:
    """Batch-length text encoding vs open_clip's 77-token ``encode_text`` (outputs must match)."""
    arch = "hardpos-tiny" if cfg.quick else cfg.text_arch
    n = 8 if cfg.quick else cfg.batch_size
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch=arch))
    model = lm.model.eval()
    captions = _bench_captions(cfg, n)
    trimmed = tokenize(lm.tokenizer, captions)
    full = lm.tokenizer(captions)
    with torch.no_grad():
        diff = (encode_text(model, trimmed) - model.encode_text(full, normalize=True)).abs().max().item()
    if diff > 1e-4:
        raise AssertionError(f"batch-length text features differ from 77-token features by {diff}")

    def optimised():
        with torch.no_grad():
            encode_text(model, tokenize(lm.tokenizer, captions))

    def baseline():
        with torch.no_grad():
            model.encode_text(lm.tokenizer(captions), normalize=True)

    row = compare_alternating(optimised, baseline, repeats=1 if cfg.quick else cfg.repeats, work_items=n)
    row.update(suite="text", case=f"{arch} {n} captions, {trimmed.shape[1]} vs {full.shape[1]} tokens", max_abs_diff=diff)
    return [row]


def _optional_suite(module: str, function: str, *, data_dir: bool = False
                    ) -> Callable[[Config], list[dict[str, Any]]]:
    """Suites whose measuring code lives in its own module (imported only when the suite runs);
    ``data_dir`` passes ``cfg.data_dir`` on to functions that read reference files."""

    def suite(cfg: Config) -> list[dict[str, Any]]:
        fn = getattr(importlib.import_module(module), function)
        extra = {"data_dir": cfg.data_dir} if data_dir else {}
        rows = fn(quick=cfg.quick, repeats=1 if cfg.quick else cfg.repeats, **extra)
        return rows if isinstance(rows, list) else [rows]

    return suite


def _train_step_rows(suite: str, arch: str, batch_size: int, repeats: int, device: str = "cpu") -> list[dict[str, Any]]:
    out = bench_train_step(arch, batch_size=batch_size, repeats=repeats, device=device)
    labels = {
        "combined_vs_clip": "combined-loss step (batch-length) vs plain CLIP step (77 tokens)",
        "combined_padding": "combined-loss step: batch-length vs 77-token text",
        "fused_adamw": "combined-loss step: fused AdamW vs per-parameter AdamW",
        "text_tower_padding": f"text tower: {out['text_tokens_batch']} vs {out['text_tokens_full']} tokens",
    }
    rows = []
    for key, label in labels.items():
        row = {k.split("/", 1)[1]: v for k, v in out.items() if k.startswith(f"{key}/")}
        rows.append({"suite": suite, "case": f"{arch} b{batch_size} {device}: {label}", **row})
    return rows


def train_step_suite(cfg: Config) -> list[dict[str, Any]]:
    """Goal: the combined step (image + caption + negative + positive) costs no more than
    a plain open_clip 77-token CLIP step on the same model and batch."""
    if cfg.quick:
        return _train_step_rows("train_step", "hardpos-tiny", 8, 1)
    return (_train_step_rows("train_step", "hardpos-tiny", 32, cfg.repeats)
            + _train_step_rows("train_step", cfg.text_arch, 16, max(2, cfg.repeats // 2)))


def lora_suite(cfg: Config) -> list[dict[str, Any]]:
    """LoRA rank 4 (TSVLC's placement) vs full finetuning, one training step each on the same
    model and batch (ratio = full step time / LoRA step time), on the demo's model and on
    ``text_arch`` (ViT-B-32); CUDA when present (then with peak memory), else CPU."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [("hardpos-tiny", 8, 1)] if cfg.quick else [("hardpos-demo-sincos", 32, cfg.repeats),
                                                       (cfg.text_arch, 16, max(2, cfg.repeats // 2))]
    rows = []
    for arch, batch, repeats in cases:
        out = bench_lora_step(arch, batch_size=batch, repeats=repeats, device=device)
        mem = (f"; peak {out['lora_peak_bytes'] / 2**20:.0f} vs {out['full_peak_bytes'] / 2**20:.0f} MiB"
               if "lora_peak_bytes" in out else "")
        rows.append({"suite": "lora", "case": f"{arch} b{batch} {device}: LoRA r{out['rank']} "
                     f"({out['lora_trainable']:,} trainable) vs full ({out['full_trainable']:,}){mem}", **out})
    return rows


def evaluate_suite(cfg: Config) -> list[dict[str, Any]]:
    """The evaluator vs the paper-style per-row evaluator on the same REPLACE rows
    (:func:`benchmarks.eval_bench.evaluate_bench`); goal >= 4x, scores equal."""
    if cfg.quick:
        return evaluate_bench(quick=True, repeats=1, data_dir=cfg.data_dir)
    return evaluate_bench(repeats=cfg.evaluate_repeats, n_rows=cfg.evaluate_rows, data_dir=cfg.data_dir)


def gpu_suite(cfg: Config) -> list[dict[str, Any]]:
    """CUDA only: the Ray-free GPU suite (:mod:`benchmarks.gpu_standalone`: ``cfg.text_arch``
    bf16 training step at batch 256 vs the plain CLIP step, the evaluator's items/s, a
    replica's batch scoring at batch 1/16/64) as rows, plus vLLM captions/s through the
    generate stage when vllm is installed and ``$HARDPOS_VLLM_MODEL`` names a model that is
    already on the machine (nothing is downloaded). On the lent GPU machine (no Ray) run
    ``infra/device/gpu_suite.sh`` instead: the same measurements, written as JSON."""
    if not torch.cuda.is_available():
        return [{"suite": "gpu", "case": "skipped: no CUDA device", "value": None}]
    result = gpu_standalone.run(gpu_standalone.GpuSuiteConfig(
        arch=cfg.text_arch, device="cuda", steps=cfg.repeats, eval_rows=cfg.evaluate_rows,
        eval_repeats=max(1, cfg.evaluate_repeats), data_dir=cfg.data_dir))
    return _gpu_rows(result) + vllm_rows(2000, cfg.data_dir)


def _gpu_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`benchmarks.gpu_standalone.run`'s JSON as table rows."""
    arch, batch = result["config"]["arch"], result["config"]["batch"]
    train = result["train"]
    rows = [{"suite": "gpu", "case": f"{arch} b{batch} cuda bf16: combined-loss step vs plain CLIP step (image-samples/s)",
             "value": round(train["combined_samples_per_s"], 1), "baseline": round(train["clip_samples_per_s"], 1),
             "ratio": round(train["combined_over_clip"], 3), "goal": train.get("goal_samples_per_s")}]
    ev = result["evaluate"]
    rows += [{"suite": "gpu", "case": f"evaluate: {arch} REPLACE {ev['items']} rows on cuda {p} (items/s)",
              "value": round(ev[f"{p}_items_per_s"], 1), "seconds": ev[f"{p}_seconds"]}
             for p in ("fp32", "bf16") if f"{p}_items_per_s" in ev]
    rows += [{"suite": "gpu", "case": f"serve forward: {arch} {key.replace('_', ' ')} on cuda (items/s)",
              "value": round(fig["items_per_s"], 1), "forward_ms_per_item": fig["forward_ms_per_item"]}
             for key, fig in result["serve"].items() if key.startswith("batch_")]
    return rows


def evaluate_items_row(cfg: Config, device: str = "cuda", image_size: tuple[int, int] = (500, 375)
                       ) -> dict[str, Any]:
    """The evaluator's fp32 items/s on ``device``: ``cfg.text_arch`` over ``cfg.evaluate_rows``
    stand-in REPLACE rows, median of ``evaluate_repeats`` timed runs after one warm-up run
    (:func:`benchmarks.gpu_standalone.eval_figures`)."""
    figures = gpu_standalone.eval_figures(gpu_standalone.GpuSuiteConfig(
        arch=cfg.text_arch, eval_rows=cfg.evaluate_rows, eval_repeats=max(1, cfg.evaluate_repeats),
        image_size=image_size, data_dir=cfg.data_dir), device, precisions=("fp32",))
    seconds = figures["fp32_seconds"]
    return {"suite": "gpu", "case": f"evaluate: {cfg.text_arch} REPLACE {figures['items']} rows on {device} (items/s)",
            "value": round(figures["items"] / seconds, 1), "seconds": seconds}


def vllm_rows(n_captions: int, data_dir: str | None = None) -> list[dict[str, Any]]:
    """vLLM captions/s of the generate stage on ``n_captions`` NegCLIP captions (from
    ``data_dir`` / ``$HARDPOS_REFERENCE_DATA``; synthetic when absent), or a row
    saying why it was skipped (vllm not installed, no ``$HARDPOS_VLLM_MODEL``)."""
    model = os.environ.get("HARDPOS_VLLM_MODEL")
    if importlib.util.find_spec("vllm") is None:
        return [{"suite": "gpu", "case": "vLLM: skipped (not installed: pip install 'hardpos[vllm]')", "value": None}]
    if not model:
        return [{"suite": "gpu", "case": "vLLM: skipped (set HARDPOS_VLLM_MODEL to a local model path or cached id)",
                 "value": None}]

    with tempfile.TemporaryDirectory(prefix="hardpos-vllmbench-") as tmp:
        figures = measure_stage(caption_file(n_captions, tmp, data_dir), f"{tmp}/out",
                                ["engine.kind=vllm", f"engine.vllm.model_source={model}", "shard_size=1000"])
    return [{"suite": "gpu", "case": f"vLLM {model}: generate stage, {n_captions} captions (captions/s, end to end)",
             "value": figures["captions_per_s"], **{k: v for k, v in figures.items() if k != "captions_per_s"}}]


def resilience_suite(cfg: Config) -> list[dict[str, Any]]:
    """Node-loss scenarios on a simulated multi-node cluster (see :mod:`benchmarks.resilience`).

    Runs in a child process with a private RAY_TMPDIR: it starts and tears down its own
    cluster, which must not meet this process's Ray (if any).
    """
    out = Path(tempfile.mkdtemp(prefix="hardpos-resilience-"))
    env = child_env({"RAY_TMPDIR": str(out / "ray")})
    env.pop("RAY_ADDRESS", None)
    args = [sys.executable, "-m", "benchmarks.resilience", str(out / "run"), *(["--quick"] if cfg.quick else [])]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"resilience run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads((out / "run" / "summary.json").read_text())
    rows = [{"suite": "resilience", "case": "totals", "value": {k: summary.get(k) for k in
             ("failures_injected", "recovered", "rows_lost", "failed_requests")}}]
    for name, figures in summary.get("scenarios", {}).items():
        rows.append({"suite": "resilience", "case": name, "value": figures})
    return rows


SUITE_FUNCTIONS: dict[str, Callable[[Config], list[dict[str, Any]]]] = {
    "text": text_suite,
    "train_step": train_step_suite,
    "lora": lora_suite,
    "evaluate": evaluate_suite,
    "serve": _optional_suite("benchmarks.loadgen", "serve_bench"),
    "generate": _optional_suite("benchmarks.generate_bench", "generate_bench", data_dir=True),
    "gpu": gpu_suite,
    "resilience": resilience_suite,
    "tracking": _optional_suite("benchmarks.tracking_bench", "tracking_bench"),
}


def machine_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def run(cfg: Config, ctx: JobContext) -> dict:
    names = SUITES if cfg.suite == "all" else (cfg.suite,)
    rows: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for name in names:
        try:
            suite_rows = SUITE_FUNCTIONS[name](cfg)
        except Exception as exc:  # noqa: BLE001 - one broken suite must not hide the others
            if cfg.suite != "all":
                raise
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        for row in suite_rows:
            row.setdefault("suite", name)
        rows.extend(suite_rows)
        for row in suite_rows:
            if "ratio_median" in row:
                ctx.log_metrics({f"{name}/{_slug(row['case'])}/ratio": row["ratio_median"]})
    table = format_table(rows)
    print(table)
    if errors:
        print("suites that failed: " + "; ".join(f"{k}: {v}" for k, v in errors.items()), file=sys.stderr)
    return {"machine": machine_info(), "rows": rows, "table": table, "failed_suites": errors}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)[:60].strip("_")


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); 0 when the run finished, 2 on a config error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config_file, overrides, print_config, want_help = parse_args(argv)
        cfg = load_config(Config, config_file, overrides)
    except ConfigError as exc:
        print(f"benchmarks.suites: config error: {exc}", file=sys.stderr)
        return 2
    if want_help:
        print(f"{__doc__.strip()}\n\nconfig keys:\n" + "\n".join(describe_config(cfg)))
        return 0
    if print_config:
        print(dump_yaml(cfg))
        return 0
    summary = execute("benchmark", cfg, run_fn=run)
    return 0 if summary.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
