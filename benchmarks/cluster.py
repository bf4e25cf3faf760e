"""``make cluster-test``: HardPos's stages as Ray jobs on the cluster of ``make cluster-up``.

The cluster (infra/cluster/cluster.sh) is three hosts on one machine, each its own network
and mount namespace on one bridge: a head with the Ray head, PostgreSQL, ``mlflow server`` on
it and moto's S3 server, and two worker hosts. This tool runs on the machine itself (outside
every host) and submits each stage with ``ray job submit`` to the head's dashboard, the way a
user does from a laptop: the working tree travels with the job, every artefact goes to
``s3://`` or MLflow, and a local path another host would need is refused before submitting.

Stages run now: ``world`` -> ``generate`` (rules engine) -> ``generate`` (http engine, against
an OpenAI-compatible stub on worker host w1) -> ``train`` with 2 workers, one per worker host
(the ``worker_host`` resource; gloo across the bridge) -> ``sweep`` (2 trials, each 2 workers)
-> ``register`` (the sweep's best trial as ``hardpos-cluster@champion``) -> ``evaluate`` (the
champion, read from the registry) -> Serve (``serve deploy`` to the head, the replica placed on
a worker host, scored over HTTP from outside). Each step's wall time is written to
``OUTPUT/summary.json``; the last line is

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

import base64
import io

import requests
import yaml

REPO = Path(__file__).resolve().parent.parent
#: Config keys whose value is a location: on a cluster it must be reachable from every host.
PATH_KEYS = ("output_dir", "input", "world_dir", "image_root", "train_path", "val_path", "storage_path",
             "pretrained", "resume_from", "root", "path", "train_config")
RUNS = "s3://hardpos/cluster"
#: The registered model the sweep's best trial becomes, and the experiment its trials log to.
MODEL_NAME = "hardpos-cluster"
SWEEP_EXPERIMENT = "hardpos-cluster-sweep"
#: The OpenAI-compatible stub's address: worker host w1 (``<subnet>.11``), this port.
STUB_PORT = 8001


class LocalPathError(ValueError):
    """A job argument names a path on this machine, which no cluster host can read."""


def _located(key: str, value) -> list[tuple[str, str]]:
    """(dotted key, value) of every location inside one argument's value: the value itself
    when ``key`` names a location, and the location keys of a JSON/YAML mapping or list value
    (a sweep's ``train_overrides``, a stage's ``eval_benchmarks``) at any depth."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            return []
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _located(f"{key}.{k}", v)]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in _located(f"{key}[{i}]", v)]
    if isinstance(value, str) and key.rsplit(".", 1)[-1] in PATH_KEYS:
        return [(key, value)]
    return []


def refuse_local_paths(args: list[str]) -> None:
    """Raise :class:`LocalPathError` (one line naming it) for the first location in a
    ``key=value`` argument (the value itself, or inside a mapping or list value) that is a
    local path rather than ``s3://``, an MLflow URI (``runs:/``, ``models:/``) or a shipped
    base (``base:``)."""
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep:
            continue
        for name, value in _located(key, raw):
            if not value or value == "null" or "://" in value or value.startswith(
                    ("runs:/", "models:/", "base:", "hf-hub:")):
                continue
            if value.startswith(("/", "./", "../", "~")) or os.path.exists(value):
                raise LocalPathError(f"cluster: {name}={value} is a local path that the other hosts cannot read; "
                                     f"use an s3:// URI (e.g. {RUNS}/...) or an MLflow URI")


def head_address(subnet: str) -> str:
    return f"{subnet}.10"


def submit(stage: str, args: list[str], head: str, log: Path) -> tuple[bool, float, str]:
    """``ray job submit`` of ``python jobs/<stage>.py ARGS``, its output in ``log`` -> (ok,
    seconds, the output's tail)."""
    refuse_local_paths(args)
    runtime_env = {"py_modules": ["platform/hardpos"],
                   "excludes": [".git", ".venv*", "outputs", "*.db", "mlartifacts", "docs", "tests"]}
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", f"http://{head}:8265",
           "--working-dir", str(REPO), "--runtime-env-json", json.dumps(runtime_env), "--",
           "python", f"jobs/{stage}.py", *args]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    started = time.monotonic()
    with open(log, "w") as out:
        out.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        out.flush()
        res = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
    seconds = time.monotonic() - started
    text = log.read_text()
    return res.returncode == 0 and "succeeded" in text, seconds, text[-1500:]


def _train_args() -> dict[str, object]:
    """The training run both ``train`` and every sweep trial make: hardpos-tiny, 2 workers, one
    per worker host, checkpoints every 2 steps."""
    return {"data.train_path": f"{RUNS}/generate/triplets.parquet", "model.arch": "hardpos-tiny", "max_steps": 6,
            "batch_size": 8, "epochs": 4, "scaling.num_workers": 2, "scaling.cpus_per_worker": 1,
            "scaling.resources_per_worker": {"worker_host": 1}, "checkpoint.every_steps": 2}


def _flat(args: dict[str, object]) -> list[str]:
    return [f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in args.items()]


def pipeline(stub_url: str) -> list[tuple[str, str, list[str]]]:
    """(step name, stage, arguments) in order (tiny sizes: CI runs this)."""
    # A loaded machine answers slowly: longer requests and drain, so every record is delivered in the job.
    timeouts = ["tracking.request_timeout_s=30", "tracking.drain_timeout_s=180"]
    tracking = ["tracking.experiment=hardpos-cluster", *timeouts]
    # The sweep's objective per epoch, on slices of the world's benchmarks (read from S3 by every trial).
    benchmarks = [{"name": n, "kind": "triplets", "path": f"{RUNS}/world/benchmark/{f}.parquet", "limit": 24}
                  for n, f in (("replace", "replace_attribute"), ("swap", "swap"))]
    return [
        ("world", "world", ["n_pretrain=40", "n_finetune=48", "n_benchmark=24", f"output_dir={RUNS}/world", *tracking]),
        ("generate-rules", "generate", [f"input={RUNS}/world/finetune.parquet", "engine.kind=rules", f"output_dir={RUNS}/generate",
                      *tracking]),
        ("generate-http", "generate", [f"input={RUNS}/world/finetune.parquet", "engine.kind=http", f"engine.http.url={stub_url}",
                      "engine.http.model=stub-llm", "engine.http.retry_wait_s=0.1", "engine.http.concurrency=2",
                      f"output_dir={RUNS}/generate-http", *tracking]),
        ("train", "train", [*_flat(_train_args()), f"output_dir={RUNS}/train", *tracking]),
        ("sweep", "sweep", ["train_config=null", f"train_overrides={json.dumps({**_train_args(), 'eval_benchmarks': benchmarks})}",
                   'search_space={"loss.w_neg": {"grid_search": [0.5, 1.0]}, "loss.w_pos": 1.0}', "extra_trials=[]",
                   "register=false", "max_concurrent_trials=1", f"output_dir={RUNS}/sweep",
                   f"tracking.experiment={SWEEP_EXPERIMENT}", *timeouts]),
        ("register", "register", [f"name={MODEL_NAME}", f"experiment={SWEEP_EXPERIMENT}", "metric=objective",
                      f"output_dir={RUNS}/register", f"tracking.experiment={SWEEP_EXPERIMENT}", *timeouts]),
        ("evaluate", "evaluate", [f"model.pretrained=models:/{MODEL_NAME}@champion", "model.arch=hardpos-tiny",
                      f"world_dir={RUNS}/world", f"output_dir={RUNS}/evaluate", *tracking]),
    ]


# --------------------------------------------------------------------------- Serve on the cluster
def serve_config(head: str) -> dict:
    """serve/config.yaml for this cluster: the registered champion, the proxy on every host's
    own address, the replica placed on a worker host (``worker_host``), no registry polling."""
    cfg = yaml.safe_load((REPO / "serve" / "config.yaml").read_text())
    cfg["http_options"]["host"] = "0.0.0.0"  # inside the hosts: reachable on the bridge only
    args = cfg["applications"][0]["args"]
    args.update(model=f"models:/{MODEL_NAME}@champion", arch="hardpos-tiny", reload_poll_s=0, access_log=False)
    args["model_deployment"].update(num_cpus=1, resources={"worker_host": 1})
    return cfg


def _ray_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "serve"), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def _image_b64() -> str:
    from PIL import Image  # lazy: only the Serve step draws an image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def replica_hosts(head: str) -> list[str]:
    """The addresses of the nodes running the app's replicas (Ray's state API, from outside)."""
    from ray.util.state import list_actors, list_nodes  # lazy: Ray's state client only for this step

    address = f"http://{head}:8265"
    ips = {n.node_id: n.node_ip for n in list_nodes(address=address)}
    actors = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000)
    return sorted(ips.get(a.node_id, "?") for a in actors if a.class_name.startswith("ServeReplica:hardpos:"))


def serve_step(head: str, out: Path, timeout_s: float = 900) -> tuple[bool, float, str]:
    """``serve deploy`` the champion to the cluster, wait until it answers on the head's proxy,
    score one image over HTTP from outside, check the replica runs on a worker host, then
    ``serve shutdown``. -> (ok, seconds, what happened)."""
    started = time.monotonic()
    path = out / "serve.yaml"
    path.write_text(yaml.safe_dump(serve_config(head), sort_keys=False))
    res = _ray_cli("deploy", str(path), "--address", f"http://{head}:8265")
    if res.returncode != 0:
        return False, time.monotonic() - started, f"serve deploy failed: {res.stderr[-800:]}"
    url = f"http://{head}:8000"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                if requests.get(f"{url}/healthz", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                return False, time.monotonic() - started, f"no healthy replica after {timeout_s:g} s"
            time.sleep(3)
        reply = requests.post(f"{url}/v1/score", timeout=60,
                              json={"image_b64": _image_b64(), "captions": ["a red square", "a blue circle"]})
        hosts = replica_hosts(head)
        workers = {f"{head.rsplit('.', 1)[0]}.{i}" for i in (11, 12)}
        scores = reply.json().get("scores") if reply.ok else None
        good = reply.status_code == 200 and isinstance(scores, list) and len(scores) == 2 \
            and bool(hosts) and set(hosts) <= workers
        return good, time.monotonic() - started, f"POST /v1/score -> {reply.status_code} {scores}; replica on {hosts}"
    finally:
        _ray_cli("shutdown", "-y", "--address", f"http://{head}:8265")


class StubOnWorker:
    """The OpenAI-compatible stub (tests/support/openai_stub.py) on worker host w1's own
    address, started through ``cluster.sh exec`` and stopped by its PID."""

    def __init__(self, subnet: str, log: Path):
        self.host = f"{subnet}.11"
        self.url = f"http://{self.host}:{STUB_PORT}/v1/chat/completions"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "StubOnWorker":
        cmd = ["bash", str(REPO / "infra" / "cluster" / "cluster.sh"), "exec", "w1", sys.executable, "-m",
               "tests.support.openai_stub", "0", self.host, str(STUB_PORT)]
        with open(self.log, "w") as out:  # nsenter and env exec: this PID is the stub's own
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"http://{self.host}:{STUB_PORT}/", timeout=2)
                return self
            except requests.RequestException:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"cluster: the OpenAI stub on w1 did not start (log: {self.log})")
                time.sleep(0.5)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def main(argv: list[str]) -> int:
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    out = Path(opts.get("output", "outputs/cluster")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    subnet = opts.get("subnet", os.environ.get("HARDPOS_CLUSTER_SUBNET", "10.213.77"))
    head = head_address(subnet)
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
    with StubOnWorker(subnet, out / "openai-stub.log") as stub:
        for name, stage, args in [*pipeline(stub.url), ("serve", "serve", None)]:
            if args is None:
                good, seconds, tail = serve_step(head, out)
                print(f"cluster: serve: {tail}", flush=True)
            else:
                good, seconds, tail = submit(stage, args, head, out / f"{name}.log")
            results.append({"step": name, "ok": good, "seconds": round(seconds, 1)})
            print(f"cluster: {name} {'ok' if good else 'FAILED'} in {seconds:.0f} s", flush=True)
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
