"""The scaling suite: each stage at three sizes, its throughput and the driver's peak memory.

    python -m benchmarks.scaling [output_dir=outputs/scaling] [quick=true] [stages=[generate,train]]
        [generate_sizes=[20000,200000,2000000]] [evaluate_sizes=[...]] [train_sizes=[...]]

A superlinear cost shows as throughput falling with size; a memory leak, or a driver that
holds the data, as peak memory growing with it. Cases:

* ``generate``: the generate stage (rules engine, join on) over N captions (a jsonl of
  NegCLIP-like captions, :func:`caption_file`); throughput in captions/s.
* ``evaluate``: the evaluate stage (``hardpos-tiny``) over N benchmark items of a
  synthetic world; throughput in items/s.
* ``train``: the train stage (``hardpos-tiny``, one worker, one epoch, batch 16) over N
  triplets of a synthetic world, so the step count grows with the data; throughput in
  samples/s (N / wall).

Every case runs in a fresh child process (``--case``), which runs the stage through
:func:`hardpos.runtime.execute` and reports its own wall time and peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``): the driver's memory, Ray's workers excluded. The
wall time includes starting Ray in that process. Results go to ``output_dir/scaling.json``
and a table is printed (:func:`format_rows`). Out of the default test run: a unit test
checks the rows on tiny sizes (tests/test_benchmarks_scaling.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

from benchmarks import child_env
from hardpos.config import ConfigError, load_config
from hardpos.world.build import generate_world
from hardpos.world.scene import WorldConfig
from hardpos.runtime import execute, stage_module

STAGES = ("generate", "evaluate", "train")
UNITS = {"generate": "captions", "evaluate": "items", "train": "samples"}


@dataclasses.dataclass
class Config:
    """The scaling suite.

    output_dir: where inputs, stage outputs and scaling.json go.
    stages: which of generate / evaluate / train to run.
    generate_sizes / evaluate_sizes / train_sizes: the three sizes of each stage.
    quick: small sizes (a few minutes on a laptop) instead of the configured ones.
    image_size: side of the synthetic world's images (evaluate, train).
    """

    output_dir: str = "outputs/scaling"
    stages: list[str] = dataclasses.field(default_factory=lambda: list(STAGES))
    generate_sizes: list[int] = dataclasses.field(default_factory=lambda: [20_000, 200_000, 2_000_000])
    evaluate_sizes: list[int] = dataclasses.field(default_factory=lambda: [250, 1000, 4000])
    train_sizes: list[int] = dataclasses.field(default_factory=lambda: [256, 1024, 4096])
    quick: bool = False
    image_size: int = 32

    def __post_init__(self) -> None:
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise ConfigError(f"stages: unknown {unknown}; choose from {list(STAGES)}")
        for name in ("generate_sizes", "evaluate_sizes", "train_sizes"):
            sizes = getattr(self, name)
            if not sizes or any(n < 1 for n in sizes) or sorted(sizes) != list(sizes):
                raise ConfigError(f"{name}: sizes must be positive and increasing, got {sizes}")

    def sizes(self, stage: str) -> list[int]:
        if self.quick:
            return {"generate": [2000, 8000, 32000], "evaluate": [100, 200, 400], "train": [64, 128, 256]}[stage]
        return list(getattr(self, f"{stage}_sizes"))


# --------------------------------------------------------------------------- inputs
def caption_file(path: Path, n: int) -> Path:
    """``n`` varied captions as jsonl (REPLACE applies to all, SWAP to the "X and Y" ones),
    written line by line: this process never holds them."""
    colours = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
    things = ["dog", "cat", "car", "chair", "ball", "cup", "bike", "bird", "table", "lamp"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i in range(n):
            a, b = colours[i % 8], colours[(i * 3 + 1) % 8]
            x, y = things[(i // 8) % 10], things[(i // 3 + 4) % 10]
            caption = f"a {a} {x} and a {b} {y}" if i % 2 else f"a {a} {x} next to a small {y} on the grass"
            fh.write(json.dumps({"caption_id": f"c{i}", "caption": caption, "image": f"img{i % 50}.jpg"}) + "\n")
    return path


def _world(root: Path, n_finetune: int, n_benchmark: int, image_size: int) -> Path:
    out = root / f"world-{n_finetune}-{n_benchmark}-{image_size}"
    if not (out / "world.json").is_file():
        generate_world(WorldConfig(n_pretrain=8, n_finetune=n_finetune, n_benchmark=n_benchmark,
                                   image_size=image_size), str(out))
    return out


def slice_parquet(src: Path, dst: Path, n: int) -> Path:
    """The first ``n`` rows of a parquet file (fewer when it has fewer)."""
    if not dst.is_file():
        pq.write_table(pq.read_table(src).slice(0, n), dst)
    return dst


# --------------------------------------------------------------------------- one case (child process)
def case_overrides(stage: str, size: int, inputs: dict[str, str], out_dir: str) -> list[str]:
    """The stage's config overrides for one case. Pure."""
    common = [f"output_dir={out_dir}", "tracking.enabled=false"]
    if stage == "generate":
        return [*common, f"input={inputs['captions']}", "engine.kind=rules", "overwrite=true"]
    if stage == "evaluate":
        bench = json.dumps([{"name": "replace", "kind": "triplets", "path": inputs["benchmark"], "limit": size}])
        return [*common, "model.arch=hardpos-tiny", f"benchmarks={bench}", "device=cpu", "batch_size=64"]
    if stage == "train":
        return [*common, "model.arch=hardpos-tiny", f"data.train_path={inputs['triplets']}", "data.val_fraction=0.0",
                "epochs=1", "batch_size=16", "scaling.num_workers=1", "scaling.cpus_per_worker=1",
                "log_every=50"]
    raise ConfigError(f"unknown stage {stage!r}")


def run_case(stage: str, overrides: list[str]) -> dict[str, Any]:
    """Run one stage in THIS process; its wall time and this process's peak RSS."""

    module = stage_module(stage)
    cfg = load_config(module.Config, None, overrides)
    t0 = time.perf_counter()
    summary = execute(stage, cfg, quiet=True)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak_kb / 1024, 1), "summary": _small(summary)}


def _small(summary: dict) -> dict:
    keep = ("captions", "inputs", "accepted", "rejected", "complete", "triplets", "steps", "global_step", "items",
            "this_run")
    return {k: summary[k] for k in keep if k in summary}


def run_child(stage: str, overrides: list[str], result_path: Path, env: dict | None = None) -> dict[str, Any]:
    """:func:`run_case` in a fresh Python process (so peak RSS is this case's alone)."""
    cmd = [sys.executable, "-m", "benchmarks.scaling", "--case", stage, str(result_path), *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(env))
    if proc.returncode != 0 or not result_path.is_file():
        raise RuntimeError(f"scaling case {stage} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(result_path.read_text())


# --------------------------------------------------------------------------- rows
def make_row(stage: str, size: int, result: dict[str, Any]) -> dict[str, Any]:
    """One table row: size, wall, throughput (size / wall) and peak driver memory. Pure."""
    wall = max(float(result["wall_s"]), 1e-9)
    return {"stage": stage, "size": size, "unit": UNITS[stage], "wall_s": round(wall, 2),
            "per_s": round(size / wall, 1), "peak_rss_mb": float(result["peak_rss_mb"])}


def add_growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's throughput and memory relative to its stage's smallest size (1.0 there). Pure."""
    first: dict[str, dict] = {}
    out = []
    for row in rows:
        base = first.setdefault(row["stage"], row)
        out.append({**row, "per_s_vs_smallest": round(row["per_s"] / base["per_s"], 2) if base["per_s"] else None,
                    "rss_vs_smallest": round(row["peak_rss_mb"] / base["peak_rss_mb"], 2)
                    if base["peak_rss_mb"] else None})
    return out


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the rows."""
    lines = ["| stage | size | wall s | per s | driver peak RSS MB | per s vs smallest | RSS vs smallest |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['size']:,} {r['unit']} | {r['wall_s']} | {r['per_s']:,} | "
                     f"{r['peak_rss_mb']:.0f} | {r.get('per_s_vs_smallest')} | {r.get('rss_vs_smallest')} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the suite
def inputs_for(cfg: Config, stage: str, size: int) -> dict[str, str]:
    root = Path(cfg.output_dir) / "inputs"
    if stage == "generate":
        return {"captions": str(caption_file(root / f"captions-{size}.jsonl", size))
                if not (root / f"captions-{size}.jsonl").is_file() else str(root / f"captions-{size}.jsonl")}
    world = _world(root, max(cfg.sizes("train")) if "train" in cfg.stages else 8,
                   max(cfg.sizes("evaluate")) if "evaluate" in cfg.stages else 8, cfg.image_size)
    if stage == "evaluate":
        return {"benchmark": str(world / "benchmark" / "replace_attribute.parquet")}
    return {"triplets": str(slice_parquet(world / "finetune.parquet", root / f"triplets-{size}.parquet", size))}


def suite(cfg: Config, runner: Callable[[str, list[str], Path], dict] | None = None) -> list[dict[str, Any]]:
    """Every configured stage at its three sizes; rows in stage, size order."""
    runner = runner or (lambda stage, overrides, path: run_child(stage, overrides, path))
    rows = []
    for stage in cfg.stages:
        for size in cfg.sizes(stage):
            out = Path(cfg.output_dir) / "runs" / f"{stage}-{size}"
            out.mkdir(parents=True, exist_ok=True)
            result = runner(stage, case_overrides(stage, size, inputs_for(cfg, stage, size), str(out / "out")),
                            out / "result.json")
            rows.append(make_row(stage, size, result))
            print(f"[scaling] {stage} {size}: {rows[-1]['per_s']} {UNITS[stage]}/s, "
                  f"driver peak {rows[-1]['peak_rss_mb']} MB", file=sys.stderr)
    return add_growth(rows)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--case"]:
        stage, result_path, overrides = argv[1], Path(argv[2]), argv[3:]
        result = run_case(stage, overrides)
        result_path.write_text(json.dumps(result, indent=2))
        return 0
    cfg = load_config(Config, None, argv)
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    rows = suite(cfg)
    Path(cfg.output_dir, "scaling.json").write_text(json.dumps({"rows": rows, "machine": _machine()}, indent=2))
    print(format_rows(rows))
    return 0


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_avg_1m": round(os.getloadavg()[0], 1)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
