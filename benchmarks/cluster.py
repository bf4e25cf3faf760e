"""``make cluster-test``: HardPos's stages as Ray jobs on the cluster of ``make cluster-up``.

The cluster (infra/cluster/cluster.sh) is three hosts on one machine, each its own network
and mount namespace on one bridge: a head with the Ray head, PostgreSQL, ``mlflow server`` on
it and moto's S3 server, and two worker hosts. This tool runs on the machine itself (outside
every host) and submits each stage with ``ray job submit`` to the head's dashboard, the way a
user does from a laptop: the working tree travels with the job, every artefact goes to
``s3://`` or MLflow, and a local path another host would need is refused before submitting.

Stages run now: ``world`` -> ``generate`` (rules engine) -> ``train`` with 2 workers, one per
worker host (the ``worker_host`` resource; gloo across the bridge). Each stage's wall time and
its summary are written to ``OUTPUT/summary.json``; the last line is

    cluster: <N> stages ok, faults survived <k>/<m>, steps lost <l>, duplicated <d>, requests failed <f>

``python -m benchmarks.cluster [output=outputs/cluster] [subnet=10.213.77]`` (from the
repository root, with the cluster up). Exit code 0 only when every stage finished ok.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
#: Config keys whose value is a location: on a cluster it must be reachable from every host.
PATH_KEYS = ("output_dir", "input", "world_dir", "image_root", "train_path", "val_path", "storage_path",
             "pretrained", "resume_from", "root")
RUNS = "s3://hardpos/cluster"


class LocalPathError(ValueError):
    """A job argument names a path on this machine, which no cluster host can read."""


def refuse_local_paths(args: list[str]) -> None:
    """Raise :class:`LocalPathError` (one line naming it) for the first ``key=value`` argument
    whose key names a location and whose value is a local path rather than ``s3://``, an
    MLflow URI (``runs:/``, ``models:/``) or a shipped base (``base:``)."""
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or key.rsplit(".", 1)[-1] not in PATH_KEYS or not value or value == "null":
            continue
        if "://" in value or value.startswith(("runs:/", "models:/", "base:", "hf-hub:")):
            continue
        if value.startswith(("/", "./", "../", "~")) or os.path.exists(value):
            raise LocalPathError(f"cluster: {key}={value} is a local path that the other hosts cannot read; "
                                 f"use an s3:// URI (e.g. {RUNS}/...) or an MLflow URI")


def head_address(subnet: str) -> str:
    return f"{subnet}.10"


def submit(stage: str, args: list[str], head: str, log_dir: Path) -> tuple[bool, float, str]:
    """``ray job submit`` of ``python jobs/<stage>.py ARGS`` -> (ok, seconds, the job's output tail)."""
    refuse_local_paths(args)
    runtime_env = {"py_modules": ["platform/hardpos"],
                   "excludes": [".git", ".venv*", "outputs", "*.db", "mlartifacts", "docs", "tests"]}
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", f"http://{head}:8265",
           "--working-dir", str(REPO), "--runtime-env-json", json.dumps(runtime_env), "--",
           "python", f"jobs/{stage}.py", *args]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    started = time.monotonic()
    log = log_dir / f"{stage}.log"
    with open(log, "w") as out:
        out.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        out.flush()
        res = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
    seconds = time.monotonic() - started
    text = log.read_text()
    return res.returncode == 0 and "succeeded" in text, seconds, text[-1500:]


def pipeline(head: str) -> list[tuple[str, list[str]]]:
    """The stages, in order, with their arguments (tiny sizes: CI runs this)."""
    # A loaded machine answers slowly: longer requests and drain, so every record is delivered in the job.
    tracking = ["tracking.experiment=hardpos-cluster", "tracking.request_timeout_s=30", "tracking.drain_timeout_s=180"]
    return [
        ("world", ["n_pretrain=40", "n_finetune=48", "n_benchmark=24", f"output_dir={RUNS}/world", *tracking]),
        ("generate", [f"input={RUNS}/world/finetune.parquet", "engine.kind=rules", f"output_dir={RUNS}/generate",
                      *tracking]),
        ("train", [f"data.train_path={RUNS}/generate/triplets.parquet", "model.arch=hardpos-tiny", "max_steps=6",
                   "batch_size=8", "epochs=4", "scaling.num_workers=2", "scaling.cpus_per_worker=1",
                   "scaling.resources_per_worker={worker_host: 1}", "checkpoint.every_steps=2",
                   f"output_dir={RUNS}/train", *tracking]),
    ]


def main(argv: list[str]) -> int:
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    out = Path(opts.get("output", "outputs/cluster")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    head = head_address(opts.get("subnet", os.environ.get("HARDPOS_CLUSTER_SUBNET", "10.213.77")))
    # The refusal a user sees for a local path, checked first (nothing is submitted).
    try:
        refuse_local_paths([f"output_dir={out}"])
        refused = "not refused"
    except LocalPathError as exc:
        refused = str(exc)
    print(refused)
    # A cold MLflow server's first answer can take longer than a job's 2 s pre-flight probe.
    requests.post(f"http://{head}:5000/api/2.0/mlflow/experiments/search", json={"max_results": 1}, timeout=120)
    results, ok = [], 0
    for stage, args in pipeline(head):
        good, seconds, tail = submit(stage, args, head, out)
        results.append({"stage": stage, "ok": good, "seconds": round(seconds, 1)})
        print(f"cluster: {stage} {'ok' if good else 'FAILED'} in {seconds:.0f} s", flush=True)
        if not good:
            print(tail, file=sys.stderr)
            break
        ok += 1
    summary = {"stages": results, "local_path_refusal": refused, "faults": "not run"}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"cluster: {ok} stages ok, faults survived 0/0, steps lost 0, duplicated 0, requests failed 0")
    return 0 if ok == len(results) and results else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
