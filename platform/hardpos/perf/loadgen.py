"""A bounded, loopback-only HTTP load generator for the scoring service, and its benchmark.

Two entry points:

* :func:`measure` -- closed-loop load against a server that is already running on
  127.0.0.1: for each concurrency level, ``concurrency`` clients send requests back to back
  until ``requests_per_level`` have been sent or ``max_seconds_per_level`` has passed.
  Returns throughput (requests/s and scores/s) and p50/p99 latency per level.
* :func:`compare_batching` -- deploys the app twice on a local Ray (``@serve.batch`` on,
  and off = max batch size 1) side by side, then measures both at every concurrency level
  alternately (on, off, off, on, ...: background load on a shared machine hits both alike)
  and reports the ratios from that one run. :func:`serve_bench` adapts it to the
  ``benchmark`` stage's row format.

    python -m hardpos.perf.loadgen                                  # compare_batching, defaults
    python -m hardpos.perf.loadgen concurrency=[1,8,32] requests_per_level=300
    python -m hardpos.perf.loadgen url=http://127.0.0.1:8000 token_env=HARDPOS_SERVE_TOKEN

Safety: only loopback URLs are accepted (127.0.0.0/8, ::1, localhost), every level is
bounded in requests and seconds, and the whole run in seconds (``max_total_s``). This is a
measuring tool for one's own server, not a traffic generator.

Moved from ``hardpos.loadgen`` (issue 16: measuring tools live in :mod:`hardpos.perf`); the
app now comes from :mod:`hardpos.serve.app` instead of a ``serve/`` folder added to the import path.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import ipaddress
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import numpy as np
import ray
import requests
import torch
from PIL import Image
from ray import serve
from ray.serve.context import _get_global_client

from hardpos import runtime
from hardpos.config import ConfigError, load_config
from hardpos.model import ModelConfig, load_model, save_checkpoint
from hardpos.report import table
from hardpos.serve.app import build_app
from hardpos.testing import free_port

HARD_MAX_REQUESTS = 20_000  # per level, whatever the config says
HARD_MAX_SECONDS = 300.0  # per level, whatever the config says


@dataclasses.dataclass
class LoadgenConfig:
    """Load generation settings (``python -m hardpos.perf.loadgen key=value ...``).

    url: a running server to measure (loopback only); None -> deploy the app twice on a
        local Ray (batching on / off) and compare them.
    path: the route to load (``/v1/score``).
    concurrency: closed-loop client counts, one level each.
    requests_per_level: requests sent per level and mode (bounded by 20000).
    max_seconds_per_level: a level stops after this long even if requests remain (<= 300).
    max_total_s: levels not started within this many seconds are skipped (reported).
    warmup_requests: unmeasured requests per mode before the first level.
    repeats: alternating on/off rounds per level (median ratio reported) in compare mode.
    images: distinct images in the request pool; image_size: their side in pixels (JPEG).
    captions_per_request: captions per request (scores/s = requests/s x this).
    caption_pool: distinct captions the requests draw from (repeats exercise the cache).
    token_env: environment variable with a bearer token to send (None: no auth header).
    model / arch: model source for compare mode; "random" = random weights of ``arch``.
    num_cpus / num_gpus: per model replica in compare mode (two replicas run at once).
    max_batch_size / batch_wait_timeout_s: the batched app's settings.
    seed: payload randomness.
    """

    url: str | None = None
    path: str = "/v1/score"
    concurrency: list[int] = dataclasses.field(default_factory=lambda: [1, 8, 32])
    requests_per_level: int = 200
    max_seconds_per_level: float = 30.0
    max_total_s: float = 600.0
    warmup_requests: int = 8
    repeats: int = 1
    images: int = 16
    image_size: int = 224
    captions_per_request: int = 4
    caption_pool: int = 64
    token_env: str | None = None
    model: str = "random"
    arch: str = "hardpos-tiny"
    num_cpus: float = 0.5
    num_gpus: float = 0.0
    max_batch_size: int = 32
    batch_wait_timeout_s: float = 0.0
    seed: int = 0


# --------------------------------------------------------------------------- pure helpers
def check_loopback(url: str) -> str:
    """Return ``url`` if its host is a loopback address, else raise ValueError."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"loadgen: {url!r} is not an http(s) URL")
    host = (parsed.hostname or "").lower()
    if host == "localhost":
        return url
    try:
        if ipaddress.ip_address(host).is_loopback:
            return url
    except ValueError:
        pass
    raise ValueError(f"loadgen only targets loopback servers (127.0.0.0/8, ::1, localhost), not {host!r}")


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(latencies_s: list[float], statuses: list[int], elapsed_s: float, concurrency: int, scores_per_request: int) -> dict[str, Any]:
    """Figures for one level: throughput over the level's wall time and latency of the
    successful requests (errors are counted by status, never hidden)."""
    ok = sum(1 for s in statuses if s == 200)
    counts: dict[str, int] = {}
    for s in statuses:
        counts[str(s)] = counts.get(str(s), 0) + 1
    rps = ok / elapsed_s if elapsed_s > 0 else 0.0
    p50, p99 = percentile(latencies_s, 50), percentile(latencies_s, 99)
    return {
        "concurrency": concurrency,
        "requests": len(statuses),
        "ok": ok,
        "errors": len(statuses) - ok,
        "status_counts": counts,
        "elapsed_s": round(elapsed_s, 4),
        "requests_per_s": round(rps, 3),
        "scores_per_s": round(rps * scores_per_request, 3),
        "p50_ms": round(p50 * 1000, 3) if p50 is not None else None,
        "p99_ms": round(p99 * 1000, 3) if p99 is not None else None,
        "mean_ms": round(statistics.fmean(latencies_s) * 1000, 3) if latencies_s else None,
    }


def make_payloads(cfg: LoadgenConfig) -> list[dict[str, Any]]:
    """Request bodies: ``images`` distinct JPEGs (smooth random colour fields, ~photo-sized
    files) x captions drawn from a pool of ``caption_pool`` synthetic-world captions."""
    rng = np.random.default_rng(cfg.seed)
    colours = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
    shapes = ["circle", "square", "triangle", "star"]
    pool = []
    while len(pool) < cfg.caption_pool:
        a, b = rng.choice(colours, 2, replace=False)
        s, t = rng.choice(shapes, 2)
        rel = rng.choice(["and", "left of", "above", "next to"])
        pool.append(f"a {a} {s} {rel} a {b} {t}")
    images = []
    for _ in range(cfg.images):
        small = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        img = Image.fromarray(small, "RGB").resize((cfg.image_size, cfg.image_size), Image.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        images.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    payloads = []
    for i in range(max(cfg.images * 4, 32)):
        caps = [pool[int(j)] for j in rng.choice(len(pool), cfg.captions_per_request, replace=False)]
        payloads.append({"image_b64": images[i % len(images)], "captions": caps})
    return payloads


# --------------------------------------------------------------------------- measuring
async def _run_level(base_url: str, path: str, payloads: list[dict], concurrency: int, n_requests: int,
                     max_seconds: float, headers: dict[str, str]) -> tuple[list[float], list[int], float]:
    n_requests = max(0, min(int(n_requests), HARD_MAX_REQUESTS))
    max_seconds = min(float(max_seconds), HARD_MAX_SECONDS)
    latencies: list[float] = []
    statuses: list[int] = []
    next_index = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(max(5.0, max_seconds))
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=timeout) as client:
        start = time.perf_counter()
        deadline = start + max_seconds

        async def worker() -> None:
            nonlocal next_index
            while next_index < n_requests and time.perf_counter() < deadline:
                body = payloads[next_index % len(payloads)]
                next_index += 1
                t0 = time.perf_counter()
                try:
                    resp = await client.post(path, json=body)
                    status = resp.status_code
                except httpx.HTTPError:
                    status = 0  # connection error / timeout: counted, not raised
                statuses.append(status)
                if status == 200:
                    latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
        elapsed = time.perf_counter() - start
    return latencies, statuses, elapsed


def measure_level(base_url: str, payloads: list[dict], concurrency: int, n_requests: int, max_seconds: float, *,
                  path: str = "/v1/score", token: str | None = None) -> dict[str, Any]:
    """One closed-loop level against ``base_url`` (loopback only) -> :func:`summarize`."""
    check_loopback(base_url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    lat, st, elapsed = asyncio.run(_run_level(base_url, path, payloads, concurrency, n_requests, max_seconds, headers))
    per_request = len(payloads[0].get("captions", [])) or 1
    return summarize(lat, st, elapsed, concurrency, per_request)


def measure(cfg: LoadgenConfig, base_url: str | None = None, payloads: list[dict] | None = None) -> dict[str, Any]:
    """Every concurrency level of ``cfg`` against one running server."""
    base_url = check_loopback(base_url or cfg.url or "")
    payloads = payloads or make_payloads(cfg)
    token = os.environ.get(cfg.token_env) if cfg.token_env else None
    if cfg.warmup_requests:
        measure_level(base_url, payloads, 1, cfg.warmup_requests, cfg.max_seconds_per_level, path=cfg.path, token=token)
    started, levels = time.perf_counter(), []
    for c in cfg.concurrency:
        if time.perf_counter() - started > cfg.max_total_s:
            levels.append({"concurrency": c, "skipped": f"max_total_s={cfg.max_total_s} reached"})
            continue
        levels.append(measure_level(base_url, payloads, c, cfg.requests_per_level, cfg.max_seconds_per_level,
                                    path=cfg.path, token=token))
    return {"url": base_url, "path": cfg.path, "captions_per_request": cfg.captions_per_request, "levels": levels}


# --------------------------------------------------------------------------- batching on vs off
def _model_source(cfg: LoadgenConfig, workdir: Path) -> str:
    """``random`` weights are saved once as a checkpoint so both apps load the same model."""
    if cfg.model != "random":
        return cfg.model

    torch.manual_seed(cfg.seed)
    loaded = load_model(ModelConfig(arch=cfg.arch))
    return str(save_checkpoint(loaded.model, loaded.model_cfg, workdir / "model", {"arch": cfg.arch, "source": "random"}))


def compare_batching(cfg: LoadgenConfig | None = None) -> dict[str, Any]:
    """Deploy the app with batching on and off on a local Ray (loopback HTTP), measure both at
    every concurrency level alternately, and return per-level figures and on/off ratios.

    Ratios: ``throughput_ratio`` = batched req/s / unbatched req/s (>1: batching helps),
    ``p50_ratio`` / ``p99_ratio`` = unbatched latency / batched latency (>1: batched is faster).
    With ``repeats`` > 1 each ratio is the median over the alternating rounds (min/max kept).
    """
    cfg = cfg or LoadgenConfig()
    runtime.init_ray()
    # Two apps (model + ingress each) must fit at once, or the second never starts and its
    # warm-up requests wait forever: say so now instead.
    need = {"CPU": 2 * (cfg.num_cpus + 0.1), "GPU": 2 * cfg.num_gpus}
    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
    if short:
        raise ValueError("loadgen: batched and unbatched apps need " + ", ".join(
            f"{v:g} {k} (cluster has {h:g})" for k, (v, h) in short.items())
            + "; lower num_cpus / num_gpus per replica")
    workdir = Path(tempfile.mkdtemp(prefix="hardpos-loadgen-"))
    source = _model_source(cfg, workdir)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    port = _serve_port(port)
    base = {
        "model": source, "arch": cfg.arch, "reload_poll_s": 0, "auth_token_env": "", "access_log": False,
        "limits": {"max_captions": max(64, cfg.captions_per_request)},
        "model_deployment": {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus,
                             "max_ongoing_requests": max(64, 2 * cfg.max_batch_size, 2 * max(cfg.concurrency))},
        "ingress_deployment": {"num_cpus": 0.1, "max_ongoing_requests": max(256, 2 * max(cfg.concurrency))},
    }
    apps = {
        "batched": {**base, "batching": {"enabled": True, "max_batch_size": cfg.max_batch_size,
                                         "batch_wait_timeout_s": cfg.batch_wait_timeout_s}},
        "unbatched": {**base, "batching": {"enabled": False}},
    }
    names = {mode: f"hardpos-loadgen-{mode}" for mode in apps}
    try:
        for mode, app_cfg in apps.items():
            serve.run(build_app(app_cfg), name=names[mode], route_prefix=f"/{mode}", blocking=False)
        urls = {mode: f"http://127.0.0.1:{port}/{mode}" for mode in apps}
        payloads = make_payloads(cfg)
        for mode in apps:
            measure_level(urls[mode], payloads, 1, max(1, cfg.warmup_requests), cfg.max_seconds_per_level, path=cfg.path)
        started, levels = time.perf_counter(), []
        for c in cfg.concurrency:
            if time.perf_counter() - started > cfg.max_total_s:
                levels.append({"concurrency": c, "skipped": f"max_total_s={cfg.max_total_s} reached"})
                continue
            rounds: dict[str, list[dict[str, Any]]] = {"batched": [], "unbatched": []}
            for r in range(max(1, cfg.repeats)):
                order = ("batched", "unbatched") if r % 2 == 0 else ("unbatched", "batched")
                for mode in order:
                    rounds[mode].append(measure_level(urls[mode], payloads, c, cfg.requests_per_level,
                                                      cfg.max_seconds_per_level, path=cfg.path))
            levels.append(_level_report(c, rounds))
        stats = {}
        for mode in apps:
            stats[mode] = requests.get(f"{urls[mode]}/v1/model", timeout=30).json().get("batching")
    finally:
        for name in names.values():
            try:
                serve.delete(name)
            except Exception:  # noqa: BLE001 - best effort cleanup of what we deployed
                pass

    return {
        "model": cfg.model, "arch": cfg.arch, "device": "cuda" if cfg.num_gpus > 0 else "cpu",
        "gpu": torch.cuda.get_device_name(0) if cfg.num_gpus > 0 and torch.cuda.is_available() else None,
        "captions_per_request": cfg.captions_per_request, "image_size": cfg.image_size,
        "max_batch_size": cfg.max_batch_size, "requests_per_level": cfg.requests_per_level,
        "levels": levels, "server_batch_stats": stats,
    }


def _serve_port(default: int) -> int:
    """The port Serve's proxy actually listens on (an already running Serve keeps its own)."""
    try:
        return int(_get_global_client().http_config.port)
    except Exception:  # noqa: BLE001 - private API; fall back to what we asked for
        return default


def _level_report(concurrency: int, rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def ratios(key: str, invert: bool) -> list[float]:
        out = []
        for on, off in zip(rounds["batched"], rounds["unbatched"]):
            a, b = on.get(key), off.get(key)
            if a and b:
                out.append(b / a if invert else a / b)
        return out

    report: dict[str, Any] = {"concurrency": concurrency,
                              "batched": _median_round(rounds["batched"]),
                              "unbatched": _median_round(rounds["unbatched"])}
    for name, key, invert in (("throughput_ratio", "requests_per_s", False), ("p50_ratio", "p50_ms", True),
                              ("p99_ratio", "p99_ms", True)):
        vals = ratios(key, invert)
        report[name] = round(statistics.median(vals), 3) if vals else None
        if len(vals) > 1:
            report[f"{name}_min"], report[f"{name}_max"] = round(min(vals), 3), round(max(vals), 3)
    return report


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput (keeps its p50/p99 consistent with it)."""
    ordered = sorted(rounds, key=lambda r: r["requests_per_s"])
    return ordered[len(ordered) // 2]


def serve_bench(quick: bool = False, repeats: int = 3) -> list[dict[str, Any]]:
    """Rows for the ``benchmark`` stage: per concurrency level, batched (optimised) vs
    unbatched (baseline) seconds per request, throughput ratio, and p50/p99 values."""
    cfg = LoadgenConfig(repeats=max(1, repeats))
    if quick:
        cfg = dataclasses.replace(cfg, concurrency=[1, 4], requests_per_level=12, warmup_requests=2, repeats=1,
                                  images=4, image_size=64, max_seconds_per_level=20)
    elif torch.cuda.is_available():
        cfg = dataclasses.replace(cfg, arch="ViT-B-32", num_gpus=0.5, num_cpus=1, max_batch_size=64,
                                  concurrency=[1, 8, 32, 128], requests_per_level=1000)
    result = compare_batching(cfg)
    rows = []
    for level in result["levels"]:
        if "skipped" in level:
            rows.append({"case": f"serve c={level['concurrency']}", "value": level["skipped"]})
            continue
        on, off = level["batched"], level["unbatched"]
        rows.append({
            "case": f"/v1/score {cfg.arch} c={level['concurrency']} batched vs unbatched (s/request)",
            "optimised_s": 1.0 / on["requests_per_s"] if on["requests_per_s"] else None,
            "baseline_s": 1.0 / off["requests_per_s"] if off["requests_per_s"] else None,
            "ratio_median": level["throughput_ratio"],
            "ratio_min": level.get("throughput_ratio_min", level["throughput_ratio"]),
            "ratio_max": level.get("throughput_ratio_max", level["throughput_ratio"]),
            "batched": on, "unbatched": off,
        })
        rows.append({"case": f"  c={level['concurrency']} batched p50/p99 ms; scores/s",
                     "value": f"{on['p50_ms']}/{on['p99_ms']}; {on['scores_per_s']}"})
        rows.append({"case": f"  c={level['concurrency']} unbatched p50/p99 ms; scores/s",
                     "value": f"{off['p50_ms']}/{off['p99_ms']}; {off['scores_per_s']}"})
    return rows


def format_report(result: dict[str, Any]) -> str:
    """A Markdown table of :func:`compare_batching` (or :func:`measure`) output."""
    rows = []
    for level in result["levels"]:
        if "skipped" in level:
            rows.append([level["concurrency"], f"skipped: {level['skipped']}"] + [""] * 8)
            continue
        modes = [(m, level[m]) for m in ("batched", "unbatched") if m in level] or [("-", level)]
        for i, (mode, r) in enumerate(modes):
            ratios = ([level.get("throughput_ratio"), level.get("p50_ratio"), level.get("p99_ratio")]
                      if i == 0 and "throughput_ratio" in level else ["", "", ""])
            rows.append([level["concurrency"], mode, r["requests_per_s"], r["scores_per_s"], r["p50_ms"], r["p99_ms"],
                         r["errors"], *ratios])
    return table(["concurrency", "mode", "req/s", "scores/s", "p50 ms", "p99 ms", "errors", "throughput ratio",
                  "p50 ratio", "p99 ratio"], rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(LoadgenConfig.__doc__)
        return 0
    try:
        cfg = load_config(LoadgenConfig, None, argv)
        if cfg.url:
            check_loopback(cfg.url)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = measure(cfg) if cfg.url else compare_batching(cfg)
    print(format_report(result))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
