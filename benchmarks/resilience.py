"""Resilience run: kill Ray nodes under real HardPos work and count what survives.

A multi-node Ray cluster is simulated on one machine with ``ray.cluster_utils.Cluster``
(every node is its own raylet + object store on this machine; the head takes no tasks). Each
scenario starts real work, kills one worker node (SIGKILL of that node's processes, by the
PIDs Ray recorded for it), adds a fresh node (the "restarted resources"), and checks the
result:

* ``train``: a 2-worker Ray Train run with one worker per node (a custom resource forces
  the spread); a worker node dies mid-epoch; the run must resume from its last checkpoint
  and finish with exactly ``total_steps`` steps. Duplicated MLflow steps (steps logged
  before the failure and logged again after the resume) are counted.
* ``generate``: the rules engine over a few thousand captions on Ray Data; a node dies
  mid-run; Ray's task retries (or a rerun, which resumes from the finished shards) must
  end with ``inputs == accepted + rejected`` and every request exactly once.
* ``serve``: the scoring app with two model replicas on two nodes under a bounded,
  loopback-only request loop; the node of one replica dies; requests must succeed again
  after recovery. Failed requests during the failover are counted and reported.

``run_resilience(output_dir, scenarios, quick)`` returns the figures (the benchmark harness
calls it); ``python -m benchmarks.resilience OUTPUT_DIR [scenario ...] [--quick]`` writes
them to ``OUTPUT_DIR/summary.json``. It must run in a process with no Ray initialised (it
starts its own cluster); use a private ``RAY_TMPDIR`` so the cluster's address file does
not replace another local Ray's. The cluster runs with ``RAY_AUTH_MODE=disabled``
(loopback only, torn down at the end).

The environment variables the simulated cluster needs (``RAY_ADDRESS``, ``RAY_AUTH_MODE``, the train scenario's
``MLFLOW_TRACKING_URI``) are set only inside :func:`scoped_environ` and restored on exit, so
a caller's ``os.environ`` is left as it was. The Serve app is :mod:`hardpos.serve.app`.
The simulated cluster itself is :mod:`benchmarks.simcluster`.
"""
from __future__ import annotations

import base64
import collections
import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import pyarrow.parquet as pq
import requests
import torch
from mlflow.tracking import MlflowClient
from PIL import Image
from ray import serve
from ray._private import state as ray_state

from benchmarks.simcluster import SimCluster, in_thread, kill_when, scoped_environ, wait_for
from hardpos import runtime
from hardpos.config import ModelConfig, load_config
from hardpos.generate import planning, shard_files
from hardpos.generate.prompts import load_prompts
from hardpos.models.clip import load_model, save_checkpoint
from hardpos.runtime import stage_module
from hardpos.serve.app import build_app
from tests.support import free_port, write_triplets

SCENARIOS = ("train", "generate", "serve")


# --------------------------------------------------------------------------- pure checks
def duplicated_steps(steps: Iterable[int]) -> list[int]:
    """Steps that appear more than once in a metric history (sorted)."""
    counts = collections.Counter(int(s) for s in steps)
    return sorted(s for s, n in counts.items() if n > 1)


def missing_steps(steps: Iterable[int], total: int, every: int = 1) -> list[int]:
    """Steps of ``every, 2*every, ..., total`` (and ``total``) that were never logged."""
    want = set(range(every, total + 1, every)) | ({total} if total else set())
    return sorted(want - {int(s) for s in steps})


def exactly_once(expected_ids: Iterable[str], accepted_ids: Iterable[str], rejected_ids: Iterable[str]) -> dict[str, int]:
    """Row accounting of a generation run.

    ``rows_lost``: expected ids in neither output; ``duplicates``: ids written more than
    once (within or across the outputs); ``unexpected``: ids nobody asked for.
    """
    expected = set(expected_ids)
    seen = collections.Counter(list(accepted_ids) + list(rejected_ids))
    return {
        "expected": len(expected),
        "written": sum(seen.values()),
        "rows_lost": len(expected - set(seen)),
        "duplicates": sum(n - 1 for n in seen.values() if n > 1),
        "unexpected": len(set(seen) - expected),
    }


def failover_stats(events: list[tuple[float, bool]], kill_t: float) -> dict[str, Any]:
    """Summarise a request log ``[(t, ok)]`` around a node kill at ``kill_t``.

    ``recovered_after_s``: from the kill to the first success after which every request
    succeeded (None if the log never settles); ``failed_during_failover``: failures
    between the kill and that point; ``failed_after_recovery`` must be 0 by definition.
    """
    events = sorted(events)
    before = [ok for t, ok in events if t < kill_t]
    after = [(t, ok) for t, ok in events if t >= kill_t]
    last_fail = max((i for i, (_, ok) in enumerate(after) if not ok), default=-1)
    settled = after[last_fail + 1:]
    recovered_t = settled[0][0] if settled else None
    return {
        "requests": len(events),
        "ok_before_kill": sum(before),
        "failed_before_kill": len(before) - sum(before),
        "requests_after_kill": len(after),
        "failed_during_failover": sum(1 for _, ok in after[:last_fail + 1] if not ok),
        "ok_after_recovery": len(settled),
        "recovered_after_s": None if recovered_t is None else round(recovered_t - kill_t, 3),
    }




# --------------------------------------------------------------------------- train
def train_scenario(sim: SimCluster, workdir: Path, quick: bool) -> dict[str, Any]:
    """Kill the node of one of two DDP workers mid-epoch; the run must resume and finish."""
    rows = 48 if quick else 96
    data, _ = write_triplets(workdir / "train-data", rows)
    out = workdir / "train-out"
    uri = f"sqlite:///{workdir / 'mlruns.db'}"
    cfg = load_config(stage_module("train").Config, None, [
        f"output_dir={out}", f"data.train_path={data}", "data.val_fraction=0", "data.shuffle_buffer=0",
        "batch_size=4", "epochs=2", "log_every=1", "optim.warmup_steps=1", "checkpoint.every_steps=2",
        "scaling.num_workers=2", "scaling.cpus_per_worker=0.5", "scaling.resources_per_worker={hp_train: 1}",
        "fault.max_failures=3", f"tracking.tracking_uri={uri}", "tracking.experiment=resilience-train",
    ])
    spe = (rows // 2) // 4
    total = 2 * spe
    # Kill in epoch 2 as soon as its first mid-epoch checkpoint folder appears
    # (checkpoint.every_steps=2): the run must resume from the last checkpoint Ray Train had
    # committed by then (that one, or the end of epoch 1), never from step 0.
    kill_after = spe + 2
    seen: dict[str, Any] = {}

    def checkpoint_step() -> int:
        steps = [int(p.name.rsplit("_", 1)[1]) for p in out.glob("ray_train/*/checkpoint_*")
                 if p.name.rsplit("_", 1)[1].isdigit()]
        return max(steps, default=0)

    def ready() -> bool:
        seen["step"] = checkpoint_step()
        return seen["step"] >= kill_after

    started = time.time()
    with scoped_environ(MLFLOW_TRACKING_URI=uri):  # the run's workers inherit it; the caller's env is untouched
        thread, result = in_thread(lambda: runtime.execute("train", cfg, quiet=True))
        box = kill_when(sim, thread, ready, lambda: sim.nodes[-1], 600, f"a checkpoint at step {kill_after}")
        box["killed_after_checkpoint"] = seen.get("step")
        thread.join()
    if "error" in result:
        raise result["error"]
    summary = result["result"]
    client = MlflowClient(uri)
    steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "loss/total")]
    fm = summary.get("final_metrics", {})
    return {
        "failures_injected": 1 if "kill_t" in box else 0,
        "killer_error": box.get("killer_error"),
        "killed_after_checkpoint": box.get("killed_after_checkpoint"),
        "resumed_from_step": fm.get("resumed_from_step"),
        "recovered": summary.get("status") == "ok" and summary.get("steps") == total,
        "steps": summary.get("steps"),
        "expected_steps": total,
        "mlflow_duplicated_steps": len(duplicated_steps(steps)),
        "mlflow_missing_steps": len(missing_steps(steps, total)),
        "wall_s": round(time.time() - started, 1),
    }


# --------------------------------------------------------------------------- generate
def write_captions(path: Path, n: int) -> Path:
    """``n`` varied captions (jsonl): REPLACE for all, SWAP for the "X and Y" ones."""
    colours = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
    things = ["dog", "cat", "car", "chair", "ball", "cup", "bike", "bird", "table", "lamp"]
    lines = []
    for i in range(n):
        a, b = colours[i % 8], colours[(i * 3 + 1) % 8]
        x, y = things[(i // 8) % 10], things[(i // 3 + 4) % 10]
        caption = f"a {a} {x} and a {b} {y}" if i % 2 else f"a {a} {x} next to a small {y} on the grass"
        lines.append(json.dumps({"caption_id": f"c{i}", "caption": caption, "image": f"img{i % 50}.jpg"}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def generate_scenario(sim: SimCluster, workdir: Path, quick: bool) -> dict[str, Any]:
    """Kill a node mid-run; Ray retries or a resuming rerun must give every row exactly once."""
    n = 2400 if quick else 6000
    shard_size = 50 if quick else 100
    src = write_captions(workdir / "gen-data" / "captions.jsonl", n)
    out = workdir / "gen-out"
    module = stage_module("generate")
    cfg = load_config(module.Config, None, [
        f"output_dir={out}", f"input={src}", "engine.kind=rules", f"shard_size={shard_size}",
        "tracking.enabled=false", "join.enabled=false",
    ])
    captions = planning.load_inputs(str(src))
    shards = planning.plan(captions, load_prompts(cfg.prompts, None), shard_size, "rule")
    expected = [r["request_id"] for s in shards for r in (*s.requests, *s.input_rejects)]
    kill_after = max(2, len(shards) // 6)
    seen: dict[str, Any] = {}

    def ready() -> bool:
        seen["shards"] = len(shard_files.done_shards(str(out)))
        return seen["shards"] >= kill_after

    def work():
        attempts, errors, summary = 0, [], {}
        while attempts < 3:
            attempts += 1
            try:
                summary = runtime.execute("generate", cfg, quiet=True)
                if summary.get("complete"):
                    break
            except Exception as exc:  # the run died with the node: a rerun resumes from the done shards
                errors.append(repr(exc)[:300])
        return attempts, errors, summary

    started = time.time()
    thread, result = in_thread(work)
    box = kill_when(sim, thread, ready, lambda: sim.nodes[-1], 300, f"{kill_after} shards")
    box["killed_after_shards"] = seen.get("shards")
    thread.join()
    if "error" in result:
        raise result["error"]
    attempts, errors, summary = result["result"]
    accepted = pq.read_table(out / "accepted.parquet").to_pylist() if (out / "accepted.parquet").exists() else []
    rejects = pq.read_table(out / "rejects.parquet").to_pylist() if (out / "rejects.parquet").exists() else []
    counts = exactly_once(expected, [r["request_id"] for r in accepted], [r["request_id"] for r in rejects])
    per_kind = collections.Counter((r["caption_id"], r["kind"]) for r in accepted + rejects)
    return {
        "failures_injected": 1 if "kill_t" in box else 0,
        "killer_error": box.get("killer_error"),
        "killed_after_shards": box.get("killed_after_shards"),
        "shards": len(shards),
        "runs_needed": attempts,
        "run_errors": errors,
        "recovered": bool(summary.get("complete")),
        "inputs": summary.get("inputs"),
        "accepted": len(accepted),
        "rejected": len(rejects),
        "conservation_ok": summary.get("inputs") == len(accepted) + len(rejects) == len(expected),
        "rows_lost": counts["rows_lost"],
        "duplicates": counts["duplicates"],
        "duplicate_caption_ids": sum(c - 1 for c in per_kind.values() if c > 1),
        "wall_s": round(time.time() - started, 1),
    }


# --------------------------------------------------------------------------- serve
def _png_b64() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def serve_scenario(sim: SimCluster, workdir: Path, quick: bool) -> dict[str, Any]:
    """Kill the node of one of two model replicas under a steady, bounded request loop."""
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    ckpt = save_checkpoint(lm.model, lm.model_cfg, workdir / "serve-model", {"step": 0})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    app = build_app({
        "model": str(ckpt), "reload_poll_s": 0, "auth_token_env": "",
        "model_deployment": {"num_replicas": 2, "num_cpus": 1, "num_gpus": 0},
        "ingress_deployment": {"num_replicas": 1, "num_cpus": 0, "num_gpus": 0},
    })
    serve.run(app, name="hardpos", route_prefix="/")
    url = f"http://127.0.0.1:{port}/v1/score"
    payload = {"image_b64": _png_b64(), "captions": ["a red square", "a blue circle"]}
    max_requests, max_seconds = (300, 90) if quick else (1200, 180)
    events: list[tuple[float, bool]] = []
    stop = threading.Event()

    def load():
        # Bounded in count and time, loopback only, one request at a time (steady load).
        deadline = time.monotonic() + max_seconds
        with requests.Session() as session:
            while not stop.is_set() and len(events) < max_requests and time.monotonic() < deadline:
                try:
                    ok = session.post(url, json=payload, timeout=10).status_code == 200
                except requests.RequestException:
                    ok = False
                events.append((time.time(), ok))
                time.sleep(0.02)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    wait_for(lambda: sum(ok for _, ok in events) >= 20, 120, "20 successful requests before the kill")
    # The GCS actor table (no dashboard needed): which nodes host a ScoringModel replica.
    table = ray_state.actors()
    replicas = [a for a in table.values()
                if a.get("State") == "ALIVE" and "ScoringModel" in (a.get("ActorClassName") or "")]
    nodes = {a["Address"]["NodeID"] for a in replicas}
    victim = next(n for n in list(sim.nodes) if n.node_id in nodes)
    kill_t = time.time()
    sim.kill(victim)
    # Recovery: Serve restarts the lost replica on the fresh node; keep loading for a while.
    try:
        wait_for(lambda: sum(ok for t, ok in events if t > kill_t + 1) >= 50, max_seconds,
                  "50 successful requests after the kill")
    except TimeoutError:
        pass
    time.sleep(2)
    stop.set()
    thread.join(timeout=15)
    stats = failover_stats(list(events), kill_t)
    serve.shutdown()
    return {
        "failures_injected": 1,
        "replicas_before": len(replicas),
        "recovered": stats["recovered_after_s"] is not None and stats["ok_after_recovery"] >= 20,
        **stats,
    }


# --------------------------------------------------------------------------- the run
RUNNERS = {"train": train_scenario, "generate": generate_scenario, "serve": serve_scenario}


def run_resilience(output_dir: str | os.PathLike, scenarios: Iterable[str] = SCENARIOS, quick: bool = False) -> dict[str, Any]:
    """Run the scenarios, each on a fresh simulated cluster; return (and write) the figures.

    Returns ``{"scenarios": {name: figures}, "failures_injected", "recovered",
    "rows_lost", "failed_requests"}`` and writes it to ``output_dir/summary.json``.
    """
    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name in scenarios:
        if name not in RUNNERS:
            raise ValueError(f"unknown scenario {name!r}; scenarios: {', '.join(SCENARIOS)}")
        workdir = out / name
        workdir.mkdir(parents=True, exist_ok=True)
        # Train: one DDP worker per node (hp_train), with CPU left for Ray Data's tasks.
        resources = {"hp_train": 1} if name == "train" else {}
        started = time.time()
        sim = None
        try:
            sim = SimCluster(node_cpus=2 if name == "train" else 1, node_resources=resources)
            results[name] = RUNNERS[name](sim, workdir, quick)
        except Exception as exc:
            results[name] = {"error": repr(exc)[:1000], "recovered": False,
                             "failures_injected": sim.killed if sim else 0}
        finally:
            if sim is not None:
                sim.close()
        results[name]["scenario_wall_s"] = round(time.time() - started, 1)
        print(f"[resilience] {name}: {json.dumps(results[name], default=str)}", file=sys.stderr)
    summary = {
        "stage": "resilience",
        "quick": quick,
        "scenarios": results,
        "failures_injected": sum(int(r.get("failures_injected", 0)) for r in results.values()),
        "recovered": sum(1 for r in results.values() if r.get("recovered")),
        "rows_lost": results.get("generate", {}).get("rows_lost"),
        "failed_requests": results.get("serve", {}).get("failed_during_failover"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (e.g. a test timeout) unwinds through the `finally` that stops the cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in args
    args = [a for a in args if a != "--quick"]
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m benchmarks.resilience OUTPUT_DIR [train|generate|serve ...] [--quick]")
        return 0 if args else 2
    summary = run_resilience(args[0], args[1:] or SCENARIOS, quick=quick)
    print(json.dumps({k: v for k, v in summary.items() if k != "scenarios"}))
    return 0 if summary["recovered"] == len(summary["scenarios"]) else 1


if __name__ == "__main__":
    sys.exit(main())
