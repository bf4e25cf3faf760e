"""Tracking-outage benchmark: the training loop's step time with the tracking server dead
vs alive (called by the benchmark harness, ``python -m benchmarks.suites suite=tracking``, or
``python -m benchmarks.tracking_bench``; never timed in tests).

One process, one model, one batch; each timed unit is ``steps`` training steps of the
combined loss (hardpos-tiny, fused AdamW, one torch thread as in a Ray Train CPU worker,
whose OMP_NUM_THREADS Ray sets to its CPU share) each followed by the
rank-0 logging call of ``train/loop.py`` with ``log_every=1`` (``RunLogger.log_metrics``:
the loss terms, lr and logit scale at the global step), the paths alternated side by side
(:func:`benchmarks.harness.compare_alternating`, median of per-pair ratios):

* ``dead_vs_live``: logging into a run whose server was killed (SIGKILL, by PID) after
  the run was created, vs logging into a run on a live server. The ratio is
  live time / dead time: 1.0 means the dead server costs the loop nothing; above 1 the
  dead server is *cheaper* (a live server on the same 2 cores also spends CPU answering).
* ``dead_vs_off``: logging into the dead server vs not logging at all: off time / dead
  time, 1.0 when a dead server costs the loop nothing (no live server on the machine
  competing for the CPU either, so this is the cleanest reading).
* ``live_vs_live``: the same live path on both sides: the noise floor of the ratios.
* ``queued_vs_sync``: the queued path vs the synchronous ``MlflowClient.log_batch`` per
  step that the loop used before (both into a live server).

Plus two figures outside the ratios, which load on a shared machine does not blur: the
time of one ``log_metrics`` call itself (microseconds, dead and live server), and how long
a single synchronous ``log_batch`` into the dead server blocks with MLflow's default HTTP
retries (capped; the old loop paid it on every logging step, then failed the worker).

The server runs on 127.0.0.1 in a child process (SQLite backend in a temporary folder)
and is stopped by its process-group id; nothing else is touched.
"""
from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from benchmarks.harness import compare_alternating
from benchmarks.tiny_step import step_setup
from hardpos import tracking
from hardpos.config import TrackingConfig
from hardpos.train.config import LossConfig
from hardpos.train.loss import loss_metrics
from hardpos.train.step import model_batch, train_step
from tests.support.mlflow_server import LocalMlflowServer


def _step_fn(batch_size: int):
    """One combined-loss training step of hardpos-tiny (THE training step) -> step() -> its metrics."""
    setup = step_setup("hardpos-tiny", batch_size)
    batch = model_batch(setup.images, *setup.trimmed)
    model = setup.lm.model

    def step() -> dict[str, float]:
        terms = train_step(setup.net, batch, LossConfig(), setup.opt, grad_clip=setup.optim.grad_clip)
        return {**loss_metrics({k: v for k, v in terms.items() if not k.startswith("_")}), "lr": setup.optim.lr,
                "logit_scale": float(model.logit_scale.detach().exp())}

    return step


def _sync_log(uri: str, run_id: str, metrics: dict[str, float], step: int) -> None:
    """What the loop did before: one blocking ``log_batch`` per logging step."""
    now = int(time.time() * 1000)
    MlflowClient(uri).log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])


def call_us(logger, metrics: dict[str, float], calls: int = 1000, rounds: int = 5) -> float:
    """Median microseconds of one ``logger.log_metrics(metrics, step)`` call."""
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in range(calls):
            logger.log_metrics(metrics, step=10_000_000 + r * calls + i)
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def blocked_seconds(uri: str, run_id: str, cap_s: float) -> tuple[float, bool]:
    """Seconds one synchronous ``log_batch`` into ``uri`` blocks with MLflow's defaults,
    measured up to ``cap_s`` -> (seconds, returned?). The call is left running in a
    daemon thread when it does not return within the cap."""
    done = threading.Event()

    def call():
        try:
            _sync_log(uri, run_id, {"probe": 1.0}, 0)
        except Exception:  # noqa: BLE001 - the failure is the point; its time is what is measured
            pass
        done.set()

    t0 = time.perf_counter()
    threading.Thread(target=call, daemon=True).start()
    returned = done.wait(cap_s)
    return time.perf_counter() - t0, returned


def tracking_bench(quick: bool = False, repeats: int = 5, steps: int = 10, batch_size: int = 16,
                   blocked_cap_s: float = 30.0) -> list[dict[str, Any]]:
    """Rows for the harness: three alternating ratios and the synchronous blocking figure."""
    if quick:
        repeats, steps, blocked_cap_s = 1, 2, 0.0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="hardpos-trackbench-"))
    live_srv, dead_srv = LocalMlflowServer(root / "live"), LocalMlflowServer(root / "dead")
    live_srv.start(wait=False)
    dead_srv.start()
    live_srv.wait_ready()
    loggers = []
    try:
        def start(url: str, name: str) -> tracking.RunLogger:
            cfg = TrackingConfig(tracking_uri=url, experiment="tracking-bench", drain_timeout_s=0.0)
            logger = tracking.start_run(cfg, name, spill_dir=str(root / name))
            loggers.append(logger)
            return logger

        live, live2, sync_run = start(live_srv.url, "live"), start(live_srv.url, "live2"), start(live_srv.url, "sync")
        dead = start(dead_srv.url, "dead")
        dead_srv.kill()  # the run exists; from now on every request to it is refused
        train_step = _step_fn(batch_size)
        counters: dict[str, int] = {}

        def loop(name: str, log) -> callable:
            def run_steps() -> None:
                for _ in range(steps):
                    metrics = train_step()
                    counters[name] = counters.get(name, 0) + 1
                    log(metrics, counters[name])
            return run_steps

        queued = {n: loop(n, lambda m, s, lg=lg: lg.log_metrics(m, step=s))
                  for n, lg in (("live", live), ("live2", live2), ("dead", dead))}
        sync = loop("sync", lambda m, s: _sync_log(live_srv.url, sync_run.run_id, m, s))
        off = loop("off", lambda m, s: None)
        cases = {
            "dead_vs_live": ("log_metrics per step, server dead vs alive (ratio = alive / dead)", queued["dead"],
                             queued["live"]),
            "dead_vs_off": ("log_metrics per step into the dead server vs no logging (ratio = off / dead)",
                            queued["dead"], off),
            "live_vs_live": ("log_metrics per step, alive vs alive (noise floor of the ratio above)", queued["live2"],
                             queued["live"]),
            "queued_vs_sync": ("log_metrics per step (queued) vs synchronous log_batch per step, server alive",
                               queued["live"], sync),
        }
        rows = []
        for key, (label, fast, slow) in cases.items():
            row = compare_alternating(fast, slow, repeats=repeats, work_items=steps)
            row.update(suite="tracking", case=f"hardpos-tiny b{batch_size}, {steps} steps: {label}", key=key)
            rows.append(row)
        metrics = train_step()
        for name, logger in (("dead", dead), ("live", live)):
            rows.append({"suite": "tracking", "key": f"call_us_{name}", "value": round(call_us(logger, metrics), 1),
                         "case": f"one log_metrics call ({len(metrics)} metrics), server {name} (microseconds, "
                                 "median of 5 x 1000 calls)"})
        backlog = tracking.existing_queue(dead.tracking_uri, dead.run_id, dead.spill_dir)
        rows[0]["dead_server_backlog_records"] = backlog.pending() if backlog else None
        if blocked_cap_s > 0:
            seconds, returned = blocked_seconds(dead.tracking_uri, dead.run_id, blocked_cap_s)
            rows.append({"suite": "tracking", "key": "sync_dead_blocked_s", "value": round(seconds, 1),
                         "case": "one synchronous log_batch into the dead server, MLflow's default retries (s)"
                                 + ("" if returned else f": still blocked when measuring stopped at {blocked_cap_s:.0f} s")})
        return rows
    finally:
        for logger in loggers:
            logger.close(timeout=0)
        live_srv.kill()
        dead_srv.kill()
        shutil.rmtree(root, ignore_errors=True)
        torch.set_num_threads(threads)


if __name__ == "__main__":  # python -m benchmarks.tracking_bench [--quick] [repeats] [steps]
    import json

    from benchmarks.harness import format_table

    args = [a for a in sys.argv[1:] if a != "--quick"]
    out = tracking_bench(quick="--quick" in sys.argv, repeats=int(args[0]) if args else 5,
                         steps=int(args[1]) if len(args) > 1 else 10)
    print(format_table(out))
    print(json.dumps(out, indent=1, default=str))
