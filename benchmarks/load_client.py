"""The client side of the load generator: settings, payloads, closed-loop levels, figures.

No Ray and no server code here (:mod:`benchmarks.serve_compare` deploys what it measures;
:mod:`benchmarks.loadgen` is the command line):

* :class:`LoadgenConfig` -- every knob of ``python -m benchmarks.loadgen key=value ...``.
* :func:`check_loopback` -- only 127.0.0.0/8, ::1 and localhost are ever targeted.
* :func:`make_payloads` -- ``/v1/score`` bodies (JPEG as base64 + captions).
* :func:`measure_level`, :func:`measure` -- closed-loop load: ``concurrency`` clients send
  requests back to back until ``requests_per_level`` were sent or ``max_seconds_per_level``
  passed; throughput (requests/s, scores/s) and p50/p99 latency of the successful requests.
* :func:`percentile`, :func:`summarize` -- the pure figures.

Safety: every level is bounded in requests (<= 20,000) and seconds (<= 300), the whole run
in seconds (``max_total_s``). This measures one's own server; it is not a traffic generator.
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
import time
from typing import Any
from urllib.parse import urlparse

import aiohttp
import numpy as np
from PIL import Image

HARD_MAX_REQUESTS = 20_000  # per level, whatever the config says
HARD_MAX_SECONDS = 300.0  # per level, whatever the config says


@dataclasses.dataclass
class LoadgenConfig:
    """Load generation settings (``python -m benchmarks.loadgen key=value ...``).

    url: a running server to measure (loopback only); None -> deploy ``targets`` side by
        side on this machine and compare them (:func:`benchmarks.serve_compare.compare_servers`).
    targets: what compare mode deploys: ``batched`` (the documented default Serve app: one
        deployment, batching on), ``unbatched`` (the same, max batch size 1), ``colocated``
        (one deployment named explicitly: the default's shape, a second copy shows the noise),
        ``two_deployments`` (ingress -> model handle, ``colocate_model: false``), ``scaled``
        (the default app with 2 model replicas), ``direct`` (the default app addressed on its
        replica's own HTTP port, no HAProxy or proxy hop: Ray Serve's direct ingress),
        ``plain`` (the same model, validation and scoring in one FastAPI + uvicorn process,
        :mod:`benchmarks.plain_server`: the peer), ``plain_haproxy`` (the peer behind a bare
        HAProxy with the HTTP options of Serve's, loopback only: what the hop alone costs) and
        ``direct_haproxy`` (the ``direct`` target's replica behind the same bare HAProxy:
        against ``plain_haproxy``, the two servers through identical hops).
    ingress: what the Serve targets (all but ``direct``) are reached through: ``haproxy`` (the
        documented default: Ray Serve's HAProxy ingress, turned on for a local Ray cluster the
        run starts; HAProxy binds its stats and metrics ports on every interface, so the run
        must be in a loopback-only network namespace: ``unshare --net sh -c 'ip link set lo up
        && python -m benchmarks.loadgen ...'``) or ``proxy`` (Serve's Python proxy).
    path: the route to load (``/v1/score``).
    concurrency: closed-loop client counts, one level each.
    requests_per_level: requests sent per level and mode (bounded by 20000).
    max_seconds_per_level: a level stops after this long even if requests remain (<= 300).
    max_total_s: levels not started within this many seconds are skipped (reported).
    warmup_requests: unmeasured requests per mode before the first level.
    repeats: rounds per level in compare mode, the targets' order reversed every other
        round (each ratio: the median over the rounds with min and max, their mean ± std and
        the 95% confidence interval of the mean).
    images: distinct images in the request pool; image_size: their side in pixels (JPEG).
    captions_per_request: captions per request (scores/s = requests/s x this).
    caption_pool: distinct captions the requests draw from (repeats exercise the cache).
    token_env: environment variable with a bearer token to send (None: no auth header).
    model / arch: model source for compare mode; "random" = random weights of ``arch``.
    num_cpus / num_gpus: per model replica in compare mode (every target's replicas run at once).
    torch_threads: intra-op threads of every target's model (Serve replicas and the peer
        alike, so they compute with the same threads); None -> each one's default.
    max_batch_size / batch_wait_timeout_s / forward_thread: the batched app's settings
        (``batching.*`` of the Serve app).
    match_niceness: run the plain peer at the CPU priority of Ray's worker processes (Ray
        starts Serve's proxy and replicas at +15 niceness by default), so on a machine where
        anything else runs both get the same share; False: the peer runs at this process's
        niceness (measured without it, the replica's forward looked 1.8x slower).
    seed: payload randomness.
    """

    url: str | None = None
    targets: list[str] = dataclasses.field(default_factory=lambda: ["batched", "unbatched", "plain"])
    ingress: str = "haproxy"
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
    forward_thread: bool = False
    torch_threads: int | None = 2
    match_niceness: bool = True
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
    # aiohttp, bodies encoded once: the client shares the server's cores, so its CPU per
    # request is taken from the server under test (httpx's client cost ~10 ms of CPU a
    # request at 32 connections, most of a core at 100 requests/s).
    n_requests = max(0, min(int(n_requests), HARD_MAX_REQUESTS))
    max_seconds = min(float(max_seconds), HARD_MAX_SECONDS)
    latencies: list[float] = []
    statuses: list[int] = []
    next_index = 0
    bodies = [json.dumps(p).encode() for p in payloads]
    url = base_url.rstrip("/") + path
    send_headers = {**headers, "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=max(1, concurrency))
    timeout = aiohttp.ClientTimeout(total=max(5.0, max_seconds))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        deadline = start + max_seconds

        async def worker() -> None:
            nonlocal next_index
            while next_index < n_requests and time.perf_counter() < deadline:
                body = bodies[next_index % len(bodies)]
                next_index += 1
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=send_headers) as resp:
                        await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, asyncio.TimeoutError):
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
