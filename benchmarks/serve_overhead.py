"""What Ray Serve adds to every HTTP request: one do-nothing FastAPI handler in a Serve replica
and in a plain uvicorn process, side by side at one client.

    python -m benchmarks.serve_overhead                          # 6 rounds of up to 8 s each
    python -m benchmarks.serve_overhead rounds=10 seconds_per_round=10

The handler reads the request body (the load generator's score request: a base64 JPEG and
its captions, :func:`benchmarks.load_client.make_payloads`) and answers its length, so the
two servers differ only in what runs around it. The Serve replica is reached on its own port
(Serve's direct ingress: no proxy or HAProxy in front), runs the app's code on Ray's event
loop as the HardPos app's model replicas do (:func:`hardpos.serve.app.model_replica_env`)
and writes no access log; the plain process is ``uvicorn`` at the replica's niceness, access
log off. What is left between them is Serve's own handling of a request (its ASGI wrapper,
request bookkeeping, metrics and the client-disconnect watch).

Per round (the order alternating) each server takes one closed-loop client for
``seconds_per_round`` (at most :data:`benchmarks.load_client.HARD_MAX_REQUESTS` requests);
it prints each server's requests/s, p50 and CPU milliseconds per request of its process
(:mod:`benchmarks.process_cpu`), then Serve's cost: the per-round differences (CPU and p50,
Serve minus plain) and ratios (:func:`benchmarks.serve_compare.versus`), each as mean ± std
with a 95% confidence interval over the rounds. A request of ``t`` ms in the plain process
then takes about ``t`` + the p50 difference in a replica, which is what one client sees.

Loopback only; the local Ray cluster is this run's own (refused where Ray is already running
or ``RAY_ADDRESS`` is set) and is shut down at the end, the uvicorn process stopped by its PID.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
from fastapi import FastAPI, Query, Request
from ray import serve

from benchmarks.harness import run_cli
from benchmarks.load_client import HARD_MAX_REQUESTS, HARD_MAX_SECONDS, LoadgenConfig, make_payloads, measure_level
from benchmarks.process_cpu import cpu_by_group, cpu_snapshot
from benchmarks.serve_compare import (
    at_niceness,
    direct_ingress_url,
    mean_ci,
    process_groups,
    ratio_cell,
    ray_worker_niceness,
    start_direct_ingress_cluster,
    start_http_child,
    stop_plain,
    versus,
    wait_until_healthy,
)
from hardpos.config import ConfigError
from hardpos.markdown import table
from hardpos.serve.app import model_replica_env
from hardpos.serve.config import BatchingConfig
from tests.support import free_port

APP_NAME = "hardpos-serve-overhead"
ROUTE_PREFIX = "/overhead"
PATH = "/echo"
TARGETS = ("serve", "plain")
MAX_WORK_MS = 1000.0


@dataclasses.dataclass
class OverheadConfig:
    """python -m benchmarks.serve_overhead [key=value ...]

    rounds: measuring rounds; each measures both servers, the order alternating.
    seconds_per_round: how long one server takes the client in a round (one client, closed loop).
    warmup_requests: requests to each server before the rounds.
    image_size, captions_per_request: the request body (the load generator's score request).
    work_ms: CPU time the handler spends on each request before it answers (a busy loop on
        the event loop, as the app's forward pass is): whether what Serve adds depends on
        how long the handler runs.
    wait_ms: time the handler awaits (``asyncio.sleep``, no CPU) before its work: whether it
        depends on the time a request is in flight rather than on the handler's CPU.
    """

    rounds: int = 6
    seconds_per_round: float = 8.0
    warmup_requests: int = 300
    image_size: int = 224
    captions_per_request: int = 4
    work_ms: float = 0.0
    wait_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ConfigError(f"rounds must be >= 1, got {self.rounds}")
        if not 0 < self.seconds_per_round <= HARD_MAX_SECONDS:
            raise ConfigError(f"seconds_per_round must be in (0, {HARD_MAX_SECONDS:g}], got {self.seconds_per_round}")
        if self.warmup_requests < 0:
            raise ConfigError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        for key in ("work_ms", "wait_ms"):
            if not 0 <= getattr(self, key) <= MAX_WORK_MS:
                raise ConfigError(f"{key} must be in [0, {MAX_WORK_MS:g}], got {getattr(self, key)}")

    @property
    def path(self) -> str:
        """The route the client loads, with the handler's work and wait."""
        query = "&".join(f"{key}={getattr(self, key):g}" for key in ("work_ms", "wait_ms") if getattr(self, key))
        return f"{PATH}?{query}" if query else PATH


def busy(ms: float) -> None:
    """Spend ``ms`` milliseconds of this thread's CPU (holding the GIL)."""
    end = time.thread_time() + ms / 1000.0
    while time.thread_time() < end:
        pass


def build_echo_app() -> FastAPI:
    """The handler both servers run (pure construction): ``POST /echo`` reads the body, awaits
    ``wait_ms`` and spends ``work_ms`` of CPU (queries, default 0, at most :data:`MAX_WORK_MS`)
    and answers ``{"bytes": <its length>}``; ``GET /healthz`` answers ``{"status": "ok"}``."""
    app = FastAPI(title="HardPos serve-overhead echo", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post(PATH)
    async def echo(request: Request, work_ms: float = Query(0.0, ge=0.0, le=MAX_WORK_MS),
                   wait_ms: float = Query(0.0, ge=0.0, le=MAX_WORK_MS)) -> dict[str, int]:
        body = await request.body()
        if wait_ms:
            await asyncio.sleep(wait_ms / 1000.0)
        busy(work_ms)
        return {"bytes": len(body)}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def echo_deployment():
    """The echo app as a Serve deployment: one replica, one CPU, the HardPos model replicas'
    one-loop environment, no access log."""
    @serve.deployment(name="Echo", max_ongoing_requests=64, logging_config={"enable_access_log": False},
                      ray_actor_options={"num_cpus": 1,
                                         "runtime_env": {"env_vars": model_replica_env(BatchingConfig())}})
    @serve.ingress(build_echo_app())
    class Echo:
        pass

    return Echo.bind()


def start_plain_echo(niceness: int | None, log_path: Path) -> tuple[subprocess.Popen, str]:
    """``uvicorn benchmarks.serve_overhead:build_echo_app`` on 127.0.0.1 at ``niceness``
    (:func:`benchmarks.serve_compare.at_niceness`), its output in ``log_path``; waits for
    ``/healthz``. Returns (process, base URL); the caller stops it
    (:func:`benchmarks.serve_compare.stop_plain`)."""
    port = free_port()
    args = at_niceness([sys.executable, "-m", "uvicorn", "benchmarks.serve_overhead:build_echo_app", "--factory",
                        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"],
                       niceness)
    return start_http_child(args, port, log_path, "the plain uvicorn echo")


def overhead_report(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Both servers' rounds -> each one's means, and Serve's cost paired round by round (pure):
    ``cpu_ms_added`` and ``p50_ms_added`` (Serve minus plain), and :func:`versus`'s ratios of
    Serve against plain (``throughput_ratio``: Serve's req/s over plain's)."""
    report: dict[str, Any] = {}
    for t in TARGETS:
        rs = rounds[t]
        report[t] = {key: round(statistics.fmean(r[key] for r in rs), 3)
                     for key in ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_ms") if all(r.get(key) is not None
                                                                                               for r in rs)}
        report[t]["requests"] = sum(r["requests"] for r in rs)
        report[t]["errors"] = sum(r["errors"] for r in rs)
    for key, name in (("server_cpu_ms", "cpu_ms_added"), ("p50_ms", "p50_ms_added")):
        added = [s[key] - p[key] for s, p in zip(rounds["serve"], rounds["plain"])
                 if s.get(key) is not None and p.get(key) is not None]
        report[name] = mean_ci(added, digits=4)
    report["serve_vs_plain"] = versus(rounds["serve"], rounds["plain"])
    return report


def _interval(entry: dict[str, Any], unit: str = "") -> str:
    if entry.get("mean") is None:
        return ""
    cell = f"{entry['mean']:+.3f}{unit}"
    if "ci95" in entry:
        lo, hi = entry["ci95"]
        cell += f" ± {entry['std']:.3f} ({lo:+.3f} to {hi:+.3f})"
    return cell


def format_overhead(report: dict[str, Any]) -> str:
    """Markdown: the two servers, then Serve's cost per request."""
    rows = [[t, report[t].get("requests_per_s"), report[t].get("p50_ms"), report[t].get("p99_ms"),
             report[t].get("server_cpu_ms"), report[t]["requests"], report[t]["errors"]] for t in TARGETS]
    servers = table(["server", "req/s", "p50 ms", "p99 ms", "server CPU ms per request", "requests", "errors"], rows)
    vs = report["serve_vs_plain"]
    cost = table(["Serve minus plain, per request: CPU ms", "p50 ms", "Serve vs plain req/s", "p50 (plain/Serve)"],
                 [[_interval(report["cpu_ms_added"]), _interval(report["p50_ms_added"]),
                   ratio_cell(vs, "throughput_ratio"), ratio_cell(vs, "p50_ratio")]])
    return servers + "\n\n" + cost


def measure_overhead(cfg: OverheadConfig | None = None) -> dict[str, Any]:
    """Start both servers, measure them side by side (:class:`OverheadConfig`), stop them, and
    return :func:`overhead_report` with each round's figures (``rounds``) and the run's settings."""
    cfg = cfg or OverheadConfig()
    payloads = make_payloads(LoadgenConfig(image_size=cfg.image_size, captions_per_request=cfg.captions_per_request))
    plain = None
    started_ray = False
    workdir = Path(tempfile.mkdtemp(prefix="hardpos-overhead-"))
    try:
        start_direct_ingress_cluster()
        started_ray = True
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
        serve.run(echo_deployment(), name=APP_NAME, route_prefix=ROUTE_PREFIX, blocking=False)
        urls = {"serve": direct_ingress_url(APP_NAME, ROUTE_PREFIX)}
        wait_until_healthy(urls["serve"])
        niceness = ray_worker_niceness()
        plain, urls["plain"] = start_plain_echo(niceness, workdir / "plain.log")
        # the server is the echo app's replica (by its process title) or the uvicorn process
        group = process_groups(list(TARGETS), {"serve": APP_NAME}, plain)
        for t in TARGETS:
            if cfg.warmup_requests:
                measure_level(urls[t], payloads, 1, cfg.warmup_requests, cfg.seconds_per_round, path=cfg.path)
        rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in TARGETS}
        for r in range(cfg.rounds):
            for t in (TARGETS if r % 2 == 0 else TARGETS[::-1]):
                before = cpu_snapshot()
                figures = measure_level(urls[t], payloads, 1, HARD_MAX_REQUESTS, cfg.seconds_per_round, path=cfg.path)
                cpu = cpu_by_group(before, cpu_snapshot(), figures["requests"], group[t])
                figures["server_cpu_ms"] = cpu.get("server")
                rounds[t].append(figures)
    finally:
        if plain is not None:
            stop_plain(plain)
        if started_ray:
            serve.shutdown()
            ray.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    return {**overhead_report(rounds), "rounds": rounds, "niceness": niceness,
            "config": dataclasses.asdict(cfg), "body_bytes": len(json.dumps(payloads[0]))}


def main(argv: list[str] | None = None) -> int:
    """``key=value`` arguments of :class:`OverheadConfig`; exit 2 on a bad config."""
    def run(cfg: OverheadConfig) -> None:
        result = measure_overhead(cfg)
        print(format_overhead(result))
        print(json.dumps(result, indent=2))

    return run_cli(OverheadConfig, argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
