"""How full the generate stage's http engine keeps a batching endpoint, beside a plain asyncio client.

    python -m benchmarks.generate_inflight                                   # the four settings
    python -m benchmarks.generate_inflight "settings=[0.5:64]" seconds=10    # one setting
    python -m benchmarks.generate_inflight --help

For each setting (per-request latency : capacity C of the batching stub,
:mod:`tests.support.batching_stub`, run as its own process), one run side by side of:

* ``peer`` -- :func:`peer_requests`, a ~30-line asyncio + aiohttp client: one session, a semaphore
  of the in-flight bound, the same payloads to the same routes, a 429/503 retried after a
  backoff;
* ``engine`` -- the stage's http engine on Ray Data (:func:`hardpos.generate.http_engine.apply_http`)
  over the same request rows, the rows consumed on the driver as the stage consumes them;
* ``stage`` -- the whole generate stage on the same captions: the engine, the validator, the
  join and the parquet shards and merge.

Same stub, same captions (NegCLIP's under ``data_dir`` / ``$HARDPOS_REFERENCE_DATA`` when
there, else generated ones), same in-flight bound: the engine's ``concurrency x
max_in_flight``, which is the defaults (2 x 64 = 128) or C when C is larger. Printed per
setting: requests/s over the stub's busy period (first request in to last reply out, as the
server saw it) and over the client's wall time (Ray Data's actor start included), each as a
ratio to the peer; the fraction of the stub's capacity used over its busy period; the
driver's peak RSS growth during the run; and the whole stage's wall time against the
engine's. The request count per setting is ``seconds`` of the stub's full capacity, at most
``max_requests``. Ends with the JSON of every figure.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import requests

from benchmarks.harness import run_cli

REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class InflightConfig:
    """python -m benchmarks.generate_inflight [key=value ...]

    settings: "latency_s:capacity" pairs of the batching stub, one measured block each.
    seconds: how long each run would take at the stub's full capacity (sizes the request count).
    max_requests: the most requests per run (the short-latency settings need many per second).
    min_requests: the fewest requests per run.
    concurrency: the engine's actors (engine.http.concurrency).
    max_in_flight: requests open per actor (engine.http.max_in_flight); None: the default 64,
        or capacity / concurrency when that is larger (so the bound can fill the stub).
    batch_size: rows per Ray Data batch (engine.http.batch_size; None: the engine's default).
    prompts: the stage's prompt preset (paper: raw prompts to /v1/completions, the default).
    repeats: runs of each of the three per setting, alternating (ratios: median [min, max]).
    data_dir: folder with negclip/valid_neg_clip.tsv (None: $HARDPOS_REFERENCE_DATA, else
        generated captions).
    output: also write the JSON here (None: print only).
    """

    settings: list[str] = dataclasses.field(default_factory=lambda: ["0.05:64", "0.05:256", "0.5:64", "0.5:256"])
    seconds: float = 12.0
    max_requests: int = 5000
    min_requests: int = 600
    concurrency: int = 2
    max_in_flight: int | None = None
    batch_size: int | None = None
    prompts: str = "paper"
    repeats: int = 1
    data_dir: str | None = None
    output: str | None = None


# --------------------------------------------------------------------------- the peer
async def peer_requests(work: list[tuple[str, dict]], bound: int) -> list[int]:
    """The plain asyncio client: every (url, body) once, ``bound`` open at once; statuses."""
    import aiohttp  # lazy: only the peer's process needs it

    gate = asyncio.Semaphore(bound)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=bound)) as session:
        async def one(url: str, body: dict) -> int:
            async with gate:
                for attempt in range(4):
                    async with session.post(url, json=body) as reply:
                        await reply.read()
                        if reply.status not in (429, 503):
                            return reply.status
                    await asyncio.sleep(0.1 * 2 ** attempt)
                return reply.status

        return await asyncio.gather(*(one(url, body) for url, body in work))


def peer_run(work: list[tuple[str, dict]], bound: int) -> list[int]:
    return asyncio.run(peer_requests(work, bound))


# --------------------------------------------------------------------------- the stub process
class StubProcess:
    """The batching stub as a child process (killed by its PID on exit; it also stops by itself)."""

    def __init__(self, capacity: int, latency_s: float, lifetime_s: float = 3600.0):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.batching_stub", str(capacity), str(latency_s), str(capacity),
             str(lifetime_s)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.close()
            raise RuntimeError(f"the batching stub did not start (printed {self.url!r})")
        self.base = self.url.rsplit("/v1/", 1)[0]

    def reset(self) -> None:
        requests.post(f"{self.base}/stub/reset", timeout=30).raise_for_status()

    def counters(self) -> dict[str, Any]:
        return requests.get(f"{self.base}/stub/counters", timeout=30).json()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> "StubProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- driver memory
def rss_mb() -> float:
    """This process's resident set size (Linux /proc)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measured(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn's result, wall seconds, peak RSS growth in MB sampled every 50 ms while it ran)."""
    start_rss, peak, done = rss_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss_mb() - start_rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        result = fn()
    finally:
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
    return result, wall, max(peak[0], rss_mb() - start_rss)


# --------------------------------------------------------------------------- one setting
def captions_for(n_requests: int, templates: list, tmp: str, data_dir: str | None) -> tuple[str, list[dict]]:
    """(a jsonl of captions, their request rows) with about ``n_requests`` requests."""
    from benchmarks.generate_bench import caption_file  # lazy: loads the stage's modules
    from hardpos.data.captions.formats import read_captions  # lazy: as above
    from hardpos.generate.planning import plan_shard  # lazy: as above

    probe = read_captions(caption_file(400, tmp, data_dir))
    per_caption = len(plan_shard([{**c, "index": i} for i, c in enumerate(probe)], templates, 0, "x").requests) / 400
    path = caption_file(max(1, round(n_requests / per_caption)), tmp, data_dir)
    rows = [{**c, "index": i} for i, c in enumerate(read_captions(path))]
    return path, plan_shard(rows, templates, 0, "x").requests


def engine_run(request_rows: list[dict], engine_cfg, templates: dict) -> int:
    """The http engine alone over Ray Data, rows in the object store as the stage puts them
    (and its console filtered as the stage filters it)."""
    import pyarrow as pa  # lazy: with Ray below
    import ray  # lazy: Ray starts only for the measured runs

    from hardpos import logs  # lazy: as above
    from hardpos.generate.engine_config import REQUEST_COLUMNS  # lazy: as above
    from hardpos.generate.http_engine import apply_http  # lazy: as above

    refs = [ray.put(pa.Table.from_pylist([{c: r[c] for c in REQUEST_COLUMNS} for r in request_rows[i:i + 1000]]))
            for i in range(0, len(request_rows), 1000)]
    ds = apply_http(ray.data.from_arrow_refs(refs), engine_cfg, templates)
    seen = set()
    with logs.quiet_native_stderr("info"):
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            seen.update(batch.column("request_id").to_pylist())
    if len(seen) != len(request_rows):
        raise RuntimeError(f"the engine returned {len(seen)} of {len(request_rows)} rows")
    return len(seen)


def stage_run(src: str, out: str, stub_url: str, cfg: InflightConfig, max_in_flight: int) -> dict:
    from benchmarks.generate_bench import measure_stage  # lazy: loads the stage

    return measure_stage(src, out, [
        f"prompts={cfg.prompts}", "engine.kind=http", f"engine.http.url={stub_url}", "engine.http.model=stub-llm",
        f"engine.http.concurrency={cfg.concurrency}", f"engine.http.max_in_flight={max_in_flight}",
        "engine.http.preflight=false", *([f"engine.http.batch_size={cfg.batch_size}"] if cfg.batch_size else [])])


def ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" + (f" [{min(values):.2f}, {max(values):.2f}]" if len(values) > 1 else "")


def measure_setting(latency_s: float, capacity: int, cfg: InflightConfig, tmp: str) -> dict[str, Any]:
    from hardpos.generate.engine_config import EngineConfig, HttpEngineConfig  # lazy: the stage's modules
    from hardpos.generate.http_engine import http_spec, request_payload  # lazy: as above
    from hardpos.generate.prompts import load_prompts  # lazy: as above

    max_in_flight = cfg.max_in_flight or max(64, -(-capacity // cfg.concurrency))
    bound = cfg.concurrency * max_in_flight
    n = int(min(cfg.max_requests, max(cfg.min_requests, cfg.seconds * capacity / latency_s)))
    templates = load_prompts(cfg.prompts)
    by_kind = {t.kind: t for t in templates}
    src, rows = captions_for(n, templates, tmp, cfg.data_dir)
    runs: dict[str, list[dict]] = {"peer": [], "engine": [], "stage": []}
    with StubProcess(capacity, latency_s) as stub:
        engine_cfg = EngineConfig(kind="http", http=HttpEngineConfig(
            url=stub.url, model="stub-llm", concurrency=cfg.concurrency, max_in_flight=max_in_flight,
            **({"batch_size": cfg.batch_size} if cfg.batch_size else {})))
        spec = http_spec(engine_cfg, by_kind)
        work = [(spec.urls[r["kind"]], request_payload("stub-llm", by_kind[r["kind"]], r["caption"], engine_cfg.sampling))
                for r in rows]
        for _ in range(cfg.repeats):
            for name, fn in (("peer", lambda: peer_run(work, bound)),
                             ("engine", lambda: engine_run(rows, engine_cfg, by_kind)),
                             ("stage", lambda: stage_run(src, f"{tmp}/stage", stub.url, cfg, max_in_flight))):
                stub.reset()
                _, wall, rss = measured(fn)
                c = stub.counters()
                runs[name].append({"wall_s": round(wall, 3), "served": c["served"], "rejected_429": c["rejected_429"],
                                   "utilisation": c["utilisation"], "peak_active": c["peak_active"],
                                   "busy_period_s": c["busy_period_s"],
                                   "requests_per_s_busy": round(c["served"] / max(c["busy_period_s"], 1e-9), 1),
                                   "requests_per_s_wall": round(c["served"] / wall, 1), "driver_rss_growth_mb": round(rss, 1)})
                print(f"[bench] latency {latency_s:g} s, C={capacity}, {name}: {runs[name][-1]}", file=sys.stderr)
    peer, engine, stage = runs["peer"], runs["engine"], runs["stage"]
    return {
        "latency_s": latency_s, "capacity": capacity, "requests": len(rows), "in_flight_bound": bound,
        "concurrency": cfg.concurrency, "max_in_flight": max_in_flight,
        "ratio_busy": ratio([e["requests_per_s_busy"] / p["requests_per_s_busy"] for e, p in zip(engine, peer)]),
        "ratio_wall": ratio([e["requests_per_s_wall"] / p["requests_per_s_wall"] for e, p in zip(engine, peer)]),
        "capacity_engine": ratio([e["utilisation"] for e in engine]),
        "capacity_peer": ratio([p["utilisation"] for p in peer]),
        "capacity_stage": ratio([s["utilisation"] for s in stage]),
        "stage_vs_engine_wall": ratio([s["wall_s"] / e["wall_s"] for s, e in zip(stage, engine)]),
        "driver_rss_growth_mb": {k: max(r["driver_rss_growth_mb"] for r in v) for k, v in runs.items()},
        "runs": runs,
    }


def table(rows: list[dict]) -> str:
    head = ("| latency | C | requests | in flight | engine / peer (busy) | engine / peer (wall) | capacity used: "
            "engine / peer / stage | stage wall / engine wall | driver RSS growth MB: engine / stage |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        rss = r["driver_rss_growth_mb"]
        lines.append(f"| {r['latency_s']:g} s | {r['capacity']} | {r['requests']} | {r['in_flight_bound']} | "
                     f"{r['ratio_busy']} | {r['ratio_wall']} | {r['capacity_engine']} / {r['capacity_peer']} / "
                     f"{r['capacity_stage']} | {r['stage_vs_engine_wall']} | {rss['engine']} / {rss['stage']} |")
    return "\n".join(lines)


def run(cfg: InflightConfig) -> int:
    from hardpos import logs  # lazy: the stage's modules load once the config is good
    from hardpos.generate.prompts import load_prompts  # lazy: as above
    from hardpos.runtime import init_ray  # lazy: as above

    settings = []
    for item in cfg.settings:
        latency, _, capacity = item.partition(":")
        try:
            settings.append((float(latency), int(capacity)))
        except ValueError:
            print(f"error: settings: {item!r} is not latency_s:capacity", file=sys.stderr)
            return 2
    logs.setup("info")
    init_ray(log_level="info")
    rows = []
    with tempfile.TemporaryDirectory(prefix="hardpos-inflight-") as tmp:
        # one small stage run first: the driver's first run imports the stage's modules and
        # sizes Arrow's memory pool, which is not memory that grows with a run's size
        src, _ = captions_for(cfg.min_requests, load_prompts(cfg.prompts), tmp, cfg.data_dir)
        with StubProcess(64, 0.0) as stub:
            stage_run(src, f"{tmp}/warm", stub.url, cfg, 64)
        for latency, capacity in settings:
            rows.append(measure_setting(latency, capacity, cfg, tmp))
    print(table(rows))
    text = json.dumps({"settings": rows, "cpus": os.cpu_count()}, indent=1)
    print(text)
    if cfg.output:
        Path(cfg.output).write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(InflightConfig, argv, run)


if __name__ == "__main__":
    sys.exit(main())
