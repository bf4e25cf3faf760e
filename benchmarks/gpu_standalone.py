"""The GPU suite, runnable with torch + open_clip alone: no Ray, no MLflow, one process.

Why a module of its own: the lent GPU machine has torch, torchvision, timm and numpy/PIL but
no package registry, and only small wheels can be carried there (open_clip_torch, ftfy,
wcwidth; see ``infra/device/gpu_suite.sh``), so Ray and MLflow cannot be installed. This
suite therefore imports only what runs there: the product's training step and loss
(:mod:`hardpos.train.step`, :mod:`hardpos.train.loss`), model loading (:mod:`hardpos.models.clip`),
the evaluator (:mod:`hardpos.eval.evaluator`, whose benchmark loader also loads pyarrow,
which the machine's image has) and the Serve replica's batch scoring
(:func:`hardpos.serve.scoring.compute_batch`). ``modules_loaded`` in the result lists which
of :data:`WATCHED` were imported; ray, mlflow and pandas must not be
(``tests/test_benchmarks_gpu_standalone.py`` runs it in a fresh interpreter and checks).

What it measures, each side by side in one run (random weights: the cost is the same):

* ``train``: THE training step (:func:`hardpos.train.step.train_step`: combined loss, bf16
  autocast on CUDA, clipping, fused AdamW, scheduler, clamp) at ``--batch`` images against
  a plain open_clip CLIP step (``ClipLoss`` at 77 tokens) on the same model and batch,
  alternating (:func:`benchmarks.train_bench.bench_train_step`, which also times
  batch-length vs 77-token text, fused vs per-parameter AdamW and the text tower alone).
  Image-samples/s per GPU; the issue's goal is >= 1,500 for ViT-B-32 bf16 on one H100.
* ``evaluate``: the evaluator's items/s on REPLACE-shaped rows (the paper's file format,
  ~3 items per image; synthetic unless ``$HARDPOS_REFERENCE_DATA`` holds the real files)
  with stand-in JPEGs, in fp32 (the product default) and, on CUDA, bf16.
* ``serve``: a Serve replica's batch scoring (decode + preprocess + image tower + text tower
  for 3 captions per image, the text cache emptied before each call so every caption is
  encoded) at batch 1, 16 and 64: items/s and the forward's ms per item.
* ``compile`` (opt-in: ``--sections train,evaluate,serve,compile``): the same training step
  with the wrapper under ``torch.compile`` vs eager, alternating, so a GPU session can
  measure the first optimisation the issue lists in the same call.

    python -m benchmarks.gpu_standalone --arch ViT-B-32 --batch 256 --device cuda --steps 10 --out gpu.json

Medians over ``--steps`` timed repeats after ``--warmup`` untimed ones; CUDA work is timed
to ``torch.cuda.synchronize()``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Sequence

import numpy as np
import open_clip
import torch
from PIL import Image

from benchmarks.eval_bench import stand_in_replace
from benchmarks.harness import compare_alternating
from benchmarks.tiny_step import step_setup
from benchmarks.train_bench import bench_train_step
from hardpos.config import ModelConfig
from hardpos.eval.evaluator import evaluate_benchmarks
from hardpos.models.clip import load_model
from hardpos.serve.config import ServingLimits
from hardpos.serve.scoring import LRUCache, ModelState, StageTimes, compute_batch
from hardpos.train.config import LossConfig
from hardpos.train.step import build_scheduler, model_batch, train_step

#: Modules whose presence after a run is reported (ray, mlflow, pandas must stay absent).
WATCHED = ("ray", "mlflow", "pandas", "pyarrow", "boto3", "fastapi", "vllm", "transformers")
SECTIONS = ("train", "evaluate", "serve")
OPTIONAL_SECTIONS = ("compile",)
#: The issue's goal for ViT-B-32 bf16 on one H100 (the paper's setup: ~70 per A100).
GOAL_SAMPLES_PER_S = 1500


@dataclasses.dataclass
class GpuSuiteConfig:
    """What one run measures.

    arch: open_clip / HardPos architecture (random weights).
    batch: images per training step.
    device: "cuda", "cpu" or "auto" (cuda when visible).
    steps / warmup: timed / untimed repeats of each measurement.
    eval_rows / eval_repeats: REPLACE rows the evaluator scores (items/s), and timed passes
        over them (after one warm-up pass).
    data_dir: folder holding the real ``hard_positives/`` files (None: ``$HARDPOS_REFERENCE_DATA``,
        else synthetic rows in their format).
    serve_batches: the serving batch sizes timed.
    image_size: stand-in JPEG size (width, height); REPLACE's Visual Genome images are ~500x375.
    sections: which of "train", "evaluate", "serve" (and the opt-in "compile") to run.
    compile_backend: ``torch.compile``'s backend for the "compile" section ("inductor";
        "eager" only checks the wiring).
    """

    arch: str = "ViT-B-32"
    batch: int = 256
    device: str = "auto"
    steps: int = 10
    warmup: int = 2
    eval_rows: int = 2000
    eval_repeats: int = 2
    data_dir: str | None = None
    serve_batches: tuple[int, ...] = (1, 16, 64)
    image_size: tuple[int, int] = (500, 375)
    sections: tuple[str, ...] = SECTIONS
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        if self.batch < 1 or self.steps < 1 or self.warmup < 0 or self.eval_rows < 2 or self.eval_repeats < 1:
            raise ValueError(f"batch, steps and eval_repeats must be >= 1, warmup >= 0, eval_rows >= 2; got "
                             f"batch={self.batch}, steps={self.steps}, warmup={self.warmup}, "
                             f"eval_repeats={self.eval_repeats}, eval_rows={self.eval_rows}")
        if not self.serve_batches or min(self.serve_batches) < 1:
            raise ValueError(f"serve_batches must be positive sizes, got {self.serve_batches}")
        unknown = [s for s in self.sections if s not in SECTIONS + OPTIONAL_SECTIONS]
        if unknown or not self.sections:
            raise ValueError(f"sections must be a non-empty subset of {SECTIONS + OPTIONAL_SECTIONS}, "
                             f"got {self.sections}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")


def resolve_device(name: str) -> str:
    """``auto`` -> cuda when visible, else cpu; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    return name


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _median_seconds(fn, steps: int, warmup: int, device: str) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine(device: str) -> dict[str, Any]:
    """The facts a figure needs to be compared: device, library versions, commit."""
    info: dict[str, Any] = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
                            "open_clip": getattr(open_clip, "__version__", "?"),
                            "open_clip_from": os.path.dirname(open_clip.__file__),  # the carried wheel, on the GPU machine
                            "cpu_threads": torch.get_num_threads(),
                            "commit": os.environ.get("HARDPOS_COMMIT") or _git_commit()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                    multiprocessors=props.multi_processor_count)
    return info


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"  # the device machine gets a copy of the tree without .git: pass HARDPOS_COMMIT


# --------------------------------------------------------------------------- the three measurements
def train_figures(cfg: GpuSuiteConfig, device: str) -> dict[str, Any]:
    """THE training step vs the plain CLIP step (and the step's own ablations), image-samples/s."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out = bench_train_step(cfg.arch, batch_size=cfg.batch, repeats=cfg.steps, warmup=cfg.warmup, device=device)
    out["combined_over_clip"] = out["combined_samples_per_s"] / out["clip_samples_per_s"]
    out["precision"] = "bf16 autocast" if device == "cuda" else "fp32"
    if device == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["goal_samples_per_s"] = GOAL_SAMPLES_PER_S
        out["meets_goal"] = out["combined_samples_per_s"] >= GOAL_SAMPLES_PER_S
    return out


def eval_figures(cfg: GpuSuiteConfig, device: str, precisions: Sequence[str] | None = None) -> dict[str, Any]:
    """The evaluator's items/s on REPLACE-shaped rows with stand-in JPEGs, per precision
    (default: fp32, plus bf16 on CUDA): ``<precision>_items_per_s`` and ``<precision>_seconds``
    (median of ``eval_repeats`` timed passes over all rows, after one warm-up pass)."""
    precisions = precisions or (("fp32", "bf16") if device == "cuda" else ("fp32",))
    out: dict[str, Any] = {}
    with stand_in_replace(arch=cfg.arch, n_rows=cfg.eval_rows, data_dir=cfg.data_dir, device=device,
                          image_size=cfg.image_size) as (lm, spec, bench, n_images, _):
        out.update(items=len(bench.items), distinct_images=n_images)
        for precision in precisions:
            def score(precision=precision):
                evaluate_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, [spec], device=device,
                                    precision=precision)
            seconds = _median_seconds(score, cfg.eval_repeats, 1, device)
            out[f"{precision}_items_per_s"] = len(bench.items) / seconds
            out[f"{precision}_seconds"] = seconds
    return out


def _jpeg(rng: np.random.Generator, size: tuple[int, int]) -> bytes:
    small = rng.integers(0, 256, size=(max(1, size[1] // 8), max(1, size[0] // 8), 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize(size, Image.BILINEAR).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def serve_figures(cfg: GpuSuiteConfig, device: str) -> dict[str, Any]:
    """A replica's batch scoring (:func:`hardpos.serve.scoring.compute_batch`) per batch size."""
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch=cfg.arch), device=device)
    lm.model.eval()
    state = ModelState(lm, torch.device(device), device == "cuda", LRUCache(4096), {"name": cfg.arch},
                       float(lm.model.logit_scale.exp().item()))
    limits = ServingLimits()
    rng = np.random.default_rng(0)
    images = [_jpeg(rng, cfg.image_size) for _ in range(max(cfg.serve_batches))]
    out: dict[str, Any] = {"captions_per_item": 3, "bf16": state.autocast_bf16, "text_cache": "emptied per call"}
    for size in cfg.serve_batches:
        items = [(images[i], [f"a red thing number {i}", f"a blue thing number {i}", f"thing number {i} that is red"])
                 for i in range(size)]
        box = {"times": StageTimes()}

        def call():
            state.cache.clear()  # every caption through the text tower: the cost of a new request
            results = compute_batch(state, items, limits, box["times"])
            if any("error" in r for r in results):
                raise RuntimeError(f"serving batch failed: {[r['error'] for r in results if 'error' in r][:2]}")
        for _ in range(cfg.warmup):
            call()
        box["times"] = StageTimes()  # the stage means count the timed calls only
        seconds = _median_seconds(call, cfg.steps, 0, device)
        per_stage = box["times"].snapshot()
        out[f"batch_{size}"] = {
            "items_per_s": size / seconds,
            "seconds": seconds,
            **{f"{stage}_ms_per_item": 1000 * per_stage[stage]["s"] / max(1, per_stage[stage]["n"])
               for stage in ("decode", "forward")},
        }
    return out


def compile_figures(cfg: GpuSuiteConfig, device: str) -> dict[str, Any]:
    """THE training step with :class:`~hardpos.train.step.TripletCLIP` under ``torch.compile``
    (``cfg.compile_backend``) vs eager, on one model, optimiser and batch (alternating; the
    compiled side's first calls, which compile, are in the untimed warm-up)."""
    setup = step_setup(cfg.arch, cfg.batch, device)
    batch = model_batch(setup.images, *setup.trimmed)
    scheduler = build_scheduler(setup.opt, setup.optim.warmup_steps, 1_000_000)
    compiled = torch.compile(setup.net, backend=cfg.compile_backend)
    cuda = device == "cuda"

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def step(net):
        def call():
            train_step(net, batch, LossConfig(), setup.opt, scheduler, grad_clip=setup.optim.grad_clip,
                       autocast_ctx=autocast)
            _sync(device)
        return call

    t0 = time.perf_counter()
    step(compiled)()  # the compilation itself, timed on its own
    compile_s = time.perf_counter() - t0
    r = compare_alternating(step(compiled), step(setup.net), repeats=cfg.steps, warmup=cfg.warmup, work_items=cfg.batch)
    return {"backend": cfg.compile_backend, "first_call_s": compile_s,
            "compiled_samples_per_s": r["optimised_items_per_s"], "eager_samples_per_s": r["baseline_items_per_s"],
            "compiled_over_eager": r["ratio_median"], "ratio_min": r["ratio_min"], "ratio_max": r["ratio_max"]}


# --------------------------------------------------------------------------- the run
def run(cfg: GpuSuiteConfig) -> dict[str, Any]:
    """Every section of ``cfg`` on one device; the result is JSON-ready."""
    device = resolve_device(cfg.device)
    result: dict[str, Any] = {"suite": "gpu_standalone", "config": dataclasses.asdict(cfg), "machine": machine(device)}
    runners = {"train": train_figures, "evaluate": eval_figures, "serve": serve_figures, "compile": compile_figures}
    for name in cfg.sections:
        t0 = time.perf_counter()
        result[name] = runners[name](cfg, device)
        result[name]["section_wall_s"] = round(time.perf_counter() - t0, 1)
    result["modules_loaded"] = sorted(m for m in WATCHED if m in sys.modules)
    return result


def parse_args(argv: Sequence[str] | None = None) -> tuple[GpuSuiteConfig, str | None]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_standalone", description=__doc__.split("\n")[0])
    d = GpuSuiteConfig()
    p.add_argument("--arch", default=d.arch, help=f"model architecture, random weights (default {d.arch})")
    p.add_argument("--batch", type=int, default=d.batch, help=f"images per training step (default {d.batch})")
    p.add_argument("--device", default=d.device, choices=("auto", "cuda", "cpu"), help="default: auto")
    p.add_argument("--steps", type=int, default=d.steps, help=f"timed repeats (default {d.steps})")
    p.add_argument("--warmup", type=int, default=d.warmup, help=f"untimed repeats first (default {d.warmup})")
    p.add_argument("--eval-rows", type=int, default=d.eval_rows, help=f"REPLACE rows scored (default {d.eval_rows})")
    p.add_argument("--eval-repeats", type=int, default=d.eval_repeats,
                   help=f"timed passes over them (default {d.eval_repeats})")
    p.add_argument("--serve-batches", default=",".join(map(str, d.serve_batches)),
                   help="comma-separated serving batch sizes (default 1,16,64)")
    p.add_argument("--image-size", default="x".join(map(str, d.image_size)), help="stand-in JPEG WxH (default 500x375)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help="comma-separated subset of train,evaluate,serve,compile (default: all but compile)")
    p.add_argument("--compile-backend", default=d.compile_backend, help="torch.compile backend (default inductor)")
    p.add_argument("--out", default=None, help="write the JSON here too (it is always printed)")
    a = p.parse_args(argv)
    try:
        w, h = (int(x) for x in a.image_size.lower().split("x"))
        cfg = GpuSuiteConfig(arch=a.arch, batch=a.batch, device=a.device, steps=a.steps, warmup=a.warmup,
                             eval_rows=a.eval_rows, eval_repeats=a.eval_repeats, serve_batches=tuple(int(x) for x in a.serve_batches.split(",")),
                             image_size=(w, h), sections=tuple(s.strip() for s in a.sections.split(",") if s.strip()),
                             compile_backend=a.compile_backend)
    except ValueError as exc:
        p.error(str(exc))
    return cfg, a.out


def main(argv: Sequence[str] | None = None) -> int:
    cfg, out = parse_args(argv)
    result = run(cfg)
    text = json.dumps(result, indent=1, default=float)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
