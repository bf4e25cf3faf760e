"""``make cluster-test``: HardPos's stages as Ray jobs on the cluster of ``make cluster-up``.

The cluster (infra/cluster/cluster.sh) is three hosts on one machine, each its own network
and mount namespace on one bridge: a head with the Ray head, PostgreSQL, ``mlflow server`` on
it and moto's S3 server, and two worker hosts. This tool runs on the machine itself (outside
every host) and submits each stage with ``ray job submit`` to the head's dashboard, the way a
user does from a laptop: the working tree travels with the job, every artefact goes to
``s3://`` or MLflow, and a local path another host would need is refused before submitting.

Stages run now: ``world`` -> ``generate`` (rules engine) -> ``generate`` (http engine, against
an OpenAI-compatible stub on worker host w1) -> ``generate`` again (http engine against a slow
batching stub on w1, a generating worker host's link cut mid-run: :func:`generate_with_a_host_cut`,
every input row then checked to be in the output or the rejects exactly once) -> ``train`` with 2 workers, one per worker host
(the ``worker_host`` resource; gloo across the bridge), with three faults injected mid-run
(:func:`train_with_faults`) -> ``sweep`` (2 trials, each 2 workers: the clean training runs)
-> ``register`` (the sweep's best trial as ``hardpos-cluster@champion``) -> ``evaluate`` (the
champion, read from the registry) -> Serve (``serve deploy`` to the head, 2 replicas placed on
the worker hosts, scored over HTTP from outside, one host cut under load). Each step's wall
time is written to ``OUTPUT/summary.json``; the last line is

    cluster: <N> stages ok, faults survived <k>/<m>, steps lost <l>, duplicated <d>, rows lost <r>, duplicated <s>, requests failed <f>

``python -m benchmarks.cluster [output=outputs/cluster] [subnet=10.213.77] [steps=a,b,...]``
(from the repository root, with the cluster up; ``steps=`` runs a subset, e.g.
``steps=train,serve`` after a full run left its artefacts). Exit code 0 only when every
step finished ok and every fault was survived.
"""
from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml

from benchmarks.serve_compare import healthy
from benchmarks.simcluster import wait_for

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
#: The last byte of each worker host's address on the cluster's subnet (infra/cluster/cluster.sh).
HOST_SUFFIX = {"w1": 11, "w2": 12}
#: The generation fault's batching stub on w1 (tests/support/batching_stub.py): this port, this
#: latency per request, so that the job is still generating when the cut comes.
GEN_STUB_PORT = 8002
GEN_STUB_LATENCY_S = 2.0
#: The generation fault: injected once the stub has answered this many requests, a cut this
#: long: past Ray's node-death detection (about 25 s), so the head declares the host's node
#: dead and Ray Data moves its actor and unfinished batches to the other host (a 30 s cut
#: was ridden out by the engine's retries, the node never declared dead).
GEN_FAULT_AFTER = 6
GEN_CUT_S = 45


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


def worker_address(head: str, host: str) -> str:
    """A worker host's address (``w1``, ``w2``) on the subnet of the head at ``head``."""
    return f"{head.rsplit('.', 1)[0]}.{HOST_SUFFIX[host]}"


def _runtime_env() -> dict:
    """What travels with every job: the working tree (jobs/), the library as a py_module."""
    return {"working_dir": str(REPO), "py_modules": [str(REPO / "platform" / "hardpos")],
            "excludes": [".git", ".venv*", "outputs", "*.db", "mlartifacts", "docs", "tests"]}


def submit(stage: str, args: list[str], head: str, log: Path) -> tuple[bool, float, str]:
    """``ray job submit`` of ``python jobs/<stage>.py ARGS``, its output in ``log`` -> (ok,
    seconds, the output's tail)."""
    refuse_local_paths(args)
    runtime_env = _runtime_env()
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
    """The training run every sweep trial makes: hardpos-tiny, 2 workers, one per worker host,
    2 epochs of 2 steps (the objective reported after each), checkpoints every 2 steps."""
    return {"data.train_path": f"{RUNS}/generate/triplets.parquet", "model.arch": "hardpos-tiny", "max_steps": 4,
            "batch_size": 8, "epochs": 2, "scaling.num_workers": 2, "scaling.cpus_per_worker": 1,
            "scaling.resources_per_worker": {"worker_host": 1}, "checkpoint.every_steps": 2}


def _flat(args: dict[str, object]) -> list[str]:
    return [f"{k}={json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in args.items()]


def generate_fault_args(stub_url: str) -> list[str]:
    """The generation fault's job, from scratch (an earlier run's finished shards would be
    skipped): the http engine over the world's finetune captions, 2 actors with one request
    open each (about a request a second against the 2 s stub: a minute of generating),
    retries spanning a minute (a request cut off is answered once the link is back, unless
    Ray has moved its batch to another host first), small shards."""
    return [f"input={RUNS}/world/finetune.parquet", "engine.kind=http", f"engine.http.url={stub_url}",
            "engine.http.model=stub-llm", "engine.http.concurrency=2", "engine.http.max_in_flight=1",
            "engine.http.batch_size=4", "engine.http.max_retries=6", "engine.http.retry_wait_s=1",
            "engine.http.timeout_s=30", "shard_size=12", f"output_dir={RUNS}/generate-fault", "overwrite=true",
            "tracking.experiment=hardpos-cluster", "tracking.request_timeout_s=30", "tracking.drain_timeout_s=180"]


def pipeline(stub_url: str, gen_stub_url: str | None = None) -> list[tuple[str, str, list[str]]]:
    """(step name, stage, arguments) in order (tiny sizes: CI runs this). ``train`` is run by
    :func:`train_with_faults`, ``generate-fault`` by :func:`generate_with_a_host_cut` (against
    ``gen_stub_url``, the slow stub; None: ``stub_url``), every other step by :func:`submit`."""
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
        ("generate-fault", "generate", generate_fault_args(gen_stub_url or stub_url)),
        ("train", "train", fault_run_args()),
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
def serve_config(head: str, replicas: int = 1) -> dict:
    """serve/config.yaml for this cluster: the registered champion, the proxy on every host's
    own address, ``replicas`` replicas placed on worker hosts (each needs one ``worker_host``,
    so at most one a host), no registry polling."""
    cfg = yaml.safe_load((REPO / "serve" / "config.yaml").read_text())
    cfg["http_options"]["host"] = "0.0.0.0"  # inside the hosts: reachable on the bridge only
    args = cfg["applications"][0]["args"]
    args.update(model=f"models:/{MODEL_NAME}@champion", arch="hardpos-tiny", reload_poll_s=0, access_log=False)
    args["model_deployment"].update(num_cpus=1, num_replicas=replicas, resources={"worker_host": 1})
    return cfg


def _serve_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
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


def serve_step(head: str, out: Path, timeout_s: float = 900) -> tuple[bool, float, str, dict | None]:
    """``serve deploy`` the champion to the cluster with 2 replicas (one per worker host: each
    needs the host's one ``worker_host``), wait until it answers on the head's proxy, score one
    image over HTTP from outside, check where the replicas run, then measure the requests lost
    while one replica's host is cut (:func:`serve_under_a_host_cut`), then ``serve shutdown``.
    -> (ok, seconds, what happened, the cut's figures or None)."""
    started = time.monotonic()
    path = out / "serve.yaml"
    path.write_text(yaml.safe_dump(serve_config(head, replicas=2), sort_keys=False))
    res = _serve_cli("deploy", str(path), "--address", f"http://{head}:8265")
    if res.returncode != 0:
        return False, time.monotonic() - started, f"serve deploy failed: {res.stderr[-800:]}", None
    url = f"http://{head}:8000"
    workers = {worker_address(head, host) for host in HOST_SUFFIX}
    try:
        try:
            wait_for(lambda: healthy(url) and replica_hosts(head) == sorted(workers), timeout_s,
                     "2 healthy replicas, one on each worker host", poll=3)
        except TimeoutError as exc:
            return False, time.monotonic() - started, str(exc), None
        reply = requests.post(f"{url}/v1/score", timeout=60,
                              json={"image_b64": _image_b64(), "captions": ["a red square", "a blue circle"]})
        hosts = replica_hosts(head)
        scores = reply.json().get("scores") if reply.ok else None
        good = reply.status_code == 200 and isinstance(scores, list) and len(scores) == 2 and hosts == sorted(workers)
        what = f"POST /v1/score -> {reply.status_code} {scores}; replicas on {hosts}"
        seconds = time.monotonic() - started
        cut = serve_under_a_host_cut(head) if good else None
        return good, seconds, what, cut
    finally:
        _serve_cli("shutdown", "-y", "--address", f"http://{head}:8265")


# --------------------------------------------------------------------------- faults
FAULT_EXPERIMENT = "hardpos-cluster-faults"
#: (fault, the training step at or after which it is injected, its cluster.sh command)
TRAIN_FAULTS = (("raylet-kill", 6, ("kill-raylet", "w2")), ("link-down-30s", 14, ("link-down", "w2")),
                ("postgres-restart", 22, ("restart-postgres",)))
#: 30 steps of 2 examples a worker: the world's training set is then about 10 steps an epoch,
#: so the run is 3 epochs, not the 15 of the stages' batch of 8 (each epoch's end, validation
#: and Ray Data's next pass, takes 10-20 s), and every fault still lands mid-epoch.
FAULT_STEPS = 30
FAULT_BATCH_SIZE = 2


def cluster_sh(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``infra/cluster/cluster.sh ARGS`` (root; acts on this cluster's hosts only), with this
    tool's own Python as the cluster's (``make cluster-up`` passes the venv's the same way;
    the script's default, ``.venv`` of the checkout, need not exist)."""
    env = {**os.environ, "HARDPOS_CLUSTER_PYTHON": os.environ.get("HARDPOS_CLUSTER_PYTHON", sys.executable)}
    return subprocess.run(["bash", str(REPO / "infra" / "cluster" / "cluster.sh"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def cut_link(host: str, seconds: float) -> tuple[int, str]:
    """``host``'s link down for ``seconds``, then up again -> (the worse exit code of the two
    commands, so a failed link-down is not hidden by a good link-up; the link-up's stderr)."""
    down = cluster_sh("fault", "link-down", host)
    time.sleep(seconds)
    up = cluster_sh("fault", "link-up", host)
    return max(down.returncode, up.returncode), up.stderr


def step_accounting(steps: list[int], expected: int) -> tuple[int, int]:
    """(steps lost, steps duplicated) of a metric history's step numbers against 1..expected."""
    return len(set(range(1, expected + 1)) - set(steps)), len(steps) - len(set(steps))


def _mlflow(head: str):
    from mlflow.tracking import MlflowClient  # lazy: only the fault checks read MLflow from outside

    return MlflowClient(f"http://{head}:5000")


def _latest_run_step(client, experiment: str, metric: str = "loss/total") -> tuple[str | None, int]:
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None, 0
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return None, 0
    history = client.get_metric_history(runs[0].info.run_id, metric)
    return runs[0].info.run_id, max((m.step for m in history), default=0)


#: A host's node counts as healed once the head has seen it alive, its raylet running, this
#: long without a break: longer than Ray's own node-death detection (health checks every 3 s,
#: dead after 5 misses and a 10 s timeout), so a node that looks alive right after its link
#: comes back, before the head declares it dead, is not taken for a survivor.
HEAL_STABLE_S = 30.0
#: A raylet still running this long after the head declared its node dead is stuck: killed,
#: as a node supervisor would, so that a new node can start on the host.
HEAL_STUCK_S = 60.0


def heal_action(raylet_running: bool, alive_in_head: bool | None, alive_for_s: float, dead_for_s: float) -> str:
    """What the node supervisor does next for one host: ``restart`` (no raylet: start a new
    node), ``done`` (its node has been alive for :data:`HEAL_STABLE_S`), ``kill`` (its raylet
    runs while the head has declared its node dead for :data:`HEAL_STUCK_S`) or ``wait``.
    ``alive_in_head`` is None when the head's dashboard does not answer."""
    if not raylet_running:
        return "restart"
    if alive_in_head and alive_for_s >= HEAL_STABLE_S:
        return "done"
    if alive_in_head is False and dead_for_s >= HEAL_STUCK_S:
        return "kill"
    return "wait"


def _heal(head: str, host: str, log: list[str], timeout_s: float = 420) -> None:
    """After a fault on ``host``, the node supervisor's part: start a new Ray node there when
    its raylet is gone (killed, or exited once the head declared the node dead), kill one that
    lingers after its node was declared dead, and return once the host's node has been alive
    for :data:`HEAL_STABLE_S` (:func:`heal_action`). A node that does not come back within
    ``timeout_s`` is recorded in ``log``, not raised: the job's own outcome still counts."""
    ip = worker_address(head, host)
    started = time.monotonic()
    alive_since = dead_since = None
    while time.monotonic() - started < timeout_s:
        now = time.monotonic()
        alive = _host_alive(head, ip)
        alive_since = (alive_since or now) if alive else None
        dead_since = (dead_since or now) if alive is False else None
        running = bool(cluster_sh("pids", host, "raylet").stdout.strip())
        action = heal_action(running, alive, now - (alive_since or now), now - (dead_since or now))
        if action == "done":
            log.append(f"{host}: Ray node alive {HEAL_STABLE_S:g} s straight, {now - started:.0f} s after the fault")
            return
        if action == "restart":
            res = cluster_sh("fault", "restart-node", host)
            if res.returncode == 0:
                log.append(f"{host}: Ray node restarted {time.monotonic() - started:.0f} s after the fault")
                alive_since = dead_since = None
            elif "still running" not in res.stderr:  # a raylet that appeared meanwhile: the next round decides
                raise RuntimeError(f"cluster: restarting {host}'s node failed: {res.stderr[-500:]}")
        elif action == "kill":
            cluster_sh("fault", "kill-raylet", host)
            log.append(f"{host}: raylet still running {HEAL_STUCK_S:g} s after its node was declared dead: killed")
        time.sleep(3)
    log.append(f"{host}: its node was not alive {HEAL_STABLE_S:g} s straight within {timeout_s:g} s")


def _host_alive(head: str, ip: str) -> bool | None:
    """Whether the head lists a live Ray node at ``ip`` (None when its dashboard does not answer)."""
    from ray.util.state import list_nodes  # lazy: Ray's state client

    try:
        # every node, filtered here: with a state filter Ray's state API raises once dead nodes
        # outnumber the live ones ("data truncation"), which every restarted node makes happen
        nodes = list_nodes(address=f"http://{head}:8265", limit=1000, raise_on_missing_output=False)
    except Exception:  # noqa: BLE001 - the head's dashboard can be slow while a node dies
        return None
    return any(n.node_ip == ip and n.state == "ALIVE" for n in nodes)


def fault_run_args() -> list[str]:
    """The ``train`` step's arguments: :func:`_train_args` for :data:`FAULT_STEPS` steps of
    :data:`FAULT_BATCH_SIZE`, every step logged, 6 restarts allowed, its own experiment."""
    return [*_flat({**_train_args(), "max_steps": FAULT_STEPS, "epochs": 100, "batch_size": FAULT_BATCH_SIZE}),
            "log_every=1", "fault.max_failures=6", f"output_dir={RUNS}/train", f"tracking.experiment={FAULT_EXPERIMENT}",
            "tracking.request_timeout_s=30", "tracking.drain_timeout_s=300"]


def train_with_faults(head: str, out: Path, args: list[str], timeout_s: float = 2400) -> dict:
    """One training job (``args``: 2 workers on w1 and w2, checkpoints on S3 every 2 steps)
    with the three training faults injected at fixed steps: w2's raylet SIGKILLed, w2's link
    down for 30 s, PostgreSQL restarted. Then MLflow's loss history is checked for steps lost
    and duplicated. -> {faults: [...], steps_lost, steps_duplicated, ok, seconds}."""
    from ray.job_submission import JobStatus, JobSubmissionClient  # lazy: the SDK only for this step

    client = JobSubmissionClient(f"http://{head}:8265")
    mlflow = _mlflow(head)
    refuse_local_paths(args)
    started = time.monotonic()
    job = client.submit_job(entrypoint=shlex.join(["python", "jobs/train.py", *args]),
                            runtime_env=_runtime_env(), metadata={"step": "train"})
    faults, log, pending = [], [], list(TRAIN_FAULTS)
    status = None
    while time.monotonic() - started < timeout_s:
        status = client.get_job_status(job)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            break
        try:
            run_id, step = _latest_run_step(mlflow, FAULT_EXPERIMENT)
        except Exception:  # noqa: BLE001 - MLflow is down while PostgreSQL restarts
            run_id, step = None, 0
        if pending and run_id and step >= pending[0][1]:
            name, at, command = pending.pop(0)
            t0 = time.monotonic()
            if command[0] == "link-down":  # down for 30 s, then up again
                rc, said = cut_link(command[1], 30)
            else:
                res = cluster_sh("fault", *command)
                rc, said = res.returncode, res.stderr
            if command[0] in ("kill-raylet", "link-down"):  # a Ray node's fault: the supervisor's part
                _heal(head, command[1], log)
            faults.append({"fault": name, "injected_at_step": step, "rc": rc,
                           "seconds_to_heal": round(time.monotonic() - t0, 1)})
            print(f"cluster: fault {name} at step {step}: {said.strip().splitlines()[-1:]}", flush=True)
        time.sleep(2)
    (out / "train.log").write_text(client.get_job_logs(job))
    run_id, _ = _latest_run_step(mlflow, FAULT_EXPERIMENT)
    steps = [m.step for m in mlflow.get_metric_history(run_id, "loss/total")] if run_id else []
    lost, duplicated = step_accounting(steps, FAULT_STEPS)
    ok = status == JobStatus.SUCCEEDED and not pending
    for f in faults:  # a fault whose command failed was not injected, so not survived either
        f["survived"] = ok and lost == 0 and duplicated == 0 and f["rc"] == 0
    return {"ok": ok, "status": str(status), "seconds": round(time.monotonic() - started, 1), "faults": faults,
            "steps_lost": lost, "steps_duplicated": duplicated, "run_id": run_id, "heal": log}


def row_accounting(expected: list[str], got: list[str]) -> tuple[int, int, int]:
    """(rows lost, rows duplicated, rows unexpected) of a generate run's output and reject row
    ids (accepted + rejects) against the request ids its input plans."""
    want, have = set(expected), set(got)
    return len(want - have), len(got) - len(have), len(have - want)


def _s3_client(head: str):
    import boto3  # lazy: only the generation fault reads S3 from outside

    # moto's server on the head takes any key (the hosts read a credentials file; this tool is outside)
    return boto3.client("s3", endpoint_url=f"http://{head}:9000", region_name="us-east-1",
                        aws_access_key_id="cluster", aws_secret_access_key="cluster")


def _s3_bytes(s3, uri: str) -> bytes:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def generated_rows(s3, output_dir: str, source: str, prompts: str = "paper") -> dict:
    """Exactly-once check of a finished generate run on S3 (``s3``: a boto3 client): the
    request ids its input plans (the stage's own planning of ``source``) against the ids in
    its merged accepted and rejects files, and its summary's conservation."""
    import tempfile  # lazy: as _s3_client

    import pyarrow.parquet as pq  # lazy: as above

    from hardpos.generate.planning import load_inputs, plan  # lazy: as above
    from hardpos.generate.prompts import load_prompts  # lazy: as above

    summary = json.loads(_s3_bytes(s3, f"{output_dir}/summary.json"))
    got = []
    for what in ("accepted", "rejects"):
        got += pq.read_table(io.BytesIO(_s3_bytes(s3, f"{output_dir}/{what}.parquet"))).column("request_id").to_pylist()
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / source.rsplit("/", 1)[-1]
        local.write_bytes(_s3_bytes(s3, source))
        shards = plan(load_inputs(str(local)), load_prompts(prompts), 10**9, "x")
    expected = [r["request_id"] for s in shards for r in [*s.requests, *s.input_rejects]]
    lost, duplicated, unexpected = row_accounting(expected, got)
    return {"inputs": len(expected), "outputs": len(got), "rows_lost": lost, "rows_duplicated": duplicated,
            "rows_unexpected": unexpected, "complete": summary.get("complete"),
            "conserved": summary.get("inputs") == summary.get("accepted", 0) + summary.get("rejected", 0) == len(expected),
            "rejected_by_reason": summary.get("rejected_by_reason")}


def http_actor_hosts(head: str) -> list[str]:
    """The addresses of the nodes running the http engine's actors (Ray's state API, from outside)."""
    from ray.util.state import list_actors, list_nodes  # lazy: Ray's state client

    address = f"http://{head}:8265"
    ips = {n.node_id: n.node_ip for n in list_nodes(address=address, limit=1000, raise_on_missing_output=False)}
    actors = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000, raise_on_missing_output=False)
    return sorted({ips.get(a.node_id, "?") for a in actors if "HttpGenerate" in a.class_name})


def generate_with_a_host_cut(head: str, out: Path, args: list[str], stub: "StubOnWorker",
                             timeout_s: float = 1200) -> dict:
    """The http engine generating on the worker hosts against the slow stub on w1; once the
    stub has answered :data:`GEN_FAULT_AFTER` requests, the link of a host that runs one of the
    engine's actors (w2 when it runs one: the stub's host stays reachable) is cut for
    :data:`GEN_CUT_S`, and the node supervisor heals it (:func:`_heal`). Then every planned input row must be in the
    output or the rejects exactly once (:func:`generated_rows`).
    -> {ok, survived, injected, cut_host, actor_hosts, rows..., seconds}."""
    from ray.job_submission import JobStatus, JobSubmissionClient  # lazy: the SDK only for this step

    client = JobSubmissionClient(f"http://{head}:8265")
    refuse_local_paths(args)
    stub.reset()  # count this job's requests only
    started = time.monotonic()
    job = client.submit_job(entrypoint=shlex.join(["python", "jobs/generate.py", *args]),
                            runtime_env=_runtime_env(), metadata={"step": "generate-fault"})
    result: dict = {"injected": False, "cut_host": None, "actor_hosts": [], "rc": None, "heal": []}
    status = None
    while time.monotonic() - started < timeout_s:
        status = client.get_job_status(job)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            break
        if not result["injected"]:
            try:
                served = stub.counters()["served"]
                hosts = http_actor_hosts(head)
            except Exception:  # noqa: BLE001 - the stub or the dashboard is slow: the next round asks again
                served, hosts = 0, []
            if served >= GEN_FAULT_AFTER and hosts:
                by_ip = {worker_address(head, h): h for h in HOST_SUFFIX}
                cut = "w2" if worker_address(head, "w2") in hosts else by_ip.get(hosts[0], "w2")
                result.update(injected=True, cut_host=cut, actor_hosts=hosts, served_before_cut=served)
                rc, said = cut_link(cut, GEN_CUT_S)
                result["rc"] = rc
                print(f"cluster: fault generate-host-cut-{GEN_CUT_S}s on {cut} after {served} requests "
                      f"(http actors on {hosts}): {said.strip().splitlines()[-1:]}", flush=True)
                _heal(head, cut, result["heal"])
        time.sleep(2)
    (out / "generate-fault.log").write_text(client.get_job_logs(job))
    ok = status == JobStatus.SUCCEEDED
    rows = generated_rows(_s3_client(head), f"{RUNS}/generate-fault", f"{RUNS}/world/finetune.parquet") if ok else {}
    survived = bool(ok and result["injected"] and result["rc"] == 0 and rows.get("complete") and rows.get("conserved")
                    and rows.get("rows_lost") == 0 and rows.get("rows_duplicated") == 0 and rows.get("rows_unexpected") == 0)
    return {"ok": ok, "status": str(status), "survived": survived, "seconds": round(time.monotonic() - started, 1),
            **result, **rows}


def serve_under_a_host_cut(head: str, clients: int = 4, before_s: float = 15, cut_s: float = 30,
                           after_s: float = 90) -> dict:
    """Score over HTTP from outside with ``clients`` closed-loop clients while w2 (one of the
    two replicas' hosts) loses its link for ``cut_s`` seconds. -> requests, failed (5xx, no
    answer), the first and last failure after the cut, and ``recovered``: no failure in the
    load's last 20 s."""
    url = f"http://{head}:8000/v1/score"
    body = {"image_b64": _image_b64(), "captions": ["a red square", "a blue circle"]}
    t_start = time.monotonic()
    stop_at = t_start + before_s + cut_s + after_s
    records: list[tuple[float, int]] = []  # (seconds since start, status; 0 = no answer)

    def client_loop() -> None:
        while time.monotonic() < stop_at:
            t = time.monotonic()
            try:
                status = requests.post(url, json=body, timeout=30).status_code
            except requests.RequestException:
                status = 0
            records.append((t - t_start, status))

    log: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client_loop) for _ in range(clients)]
        time.sleep(before_s)
        cut_at = time.monotonic() - t_start
        cut_rc, _ = cut_link("w2", cut_s)
        _heal(head, "w2", log)
        for f in futures:
            f.result()
    failed = [(t, s) for t, s in records if s != 200]
    ends_after_cut = before_s + cut_s + after_s - cut_at
    last = max((t for t, _ in failed), default=None)
    # recovered: the cut happened (both commands worked) and no request failed in the load's last 20 s
    return {"recovered": cut_rc == 0 and bool(records) and (last is None or last - cut_at < ends_after_cut - 20),
            "rc": cut_rc,
            "load_ends_after_cut_s": round(ends_after_cut, 1), "requests": len(records), "failed": len(failed), "5xx": sum(1 for _, s in failed if s >= 500),
            "no_answer": sum(1 for _, s in failed if s == 0), "cut_at_s": round(cut_at, 1), "cut_s": cut_s,
            "first_failure_after_cut_s": round(min(t for t, _ in failed) - cut_at, 1) if failed else None,
            "last_failure_after_cut_s": round(last - cut_at, 1) if last is not None else None,
            "statuses": sorted({s for _, s in records}), "heal": log}


class StubOnWorker:
    """An OpenAI-compatible stub on worker host w1's own address, started through ``cluster.sh
    exec`` and stopped by its PID: the plain one (tests/support/openai_stub.py, no delay), or
    with ``latency_s`` the batching one (tests/support/batching_stub.py, its counters over HTTP)."""

    def __init__(self, subnet: str, log: Path, port: int = STUB_PORT, latency_s: float | None = None):
        self.host = f"{subnet}.11"
        self.port, self.latency_s = port, latency_s
        self.url = f"http://{self.host}:{port}/v1/chat/completions"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        # inside a host the working directory is the host's root, not the repository: by path
        # (the plain stub), or as a module with the repository on PYTHONPATH (the batching one)
        run = ["bash", str(REPO / "infra" / "cluster" / "cluster.sh"), "exec", "w1"]
        if self.latency_s is None:
            return [*run, sys.executable, str(REPO / "tests" / "support" / "openai_stub.py"), "0", self.host,
                    str(self.port)]
        return [*run, "env", f"PYTHONPATH={REPO}", sys.executable, "-m", "tests.support.batching_stub", "64",
                str(self.latency_s), "64", "7200", self.host, str(self.port)]

    def counters(self) -> dict:
        return requests.get(f"http://{self.host}:{self.port}/stub/counters", timeout=10).json()

    def reset(self) -> None:
        requests.post(f"http://{self.host}:{self.port}/stub/reset", timeout=10).raise_for_status()

    def __enter__(self) -> "StubOnWorker":
        with open(self.log, "w") as out:  # nsenter and env exec: this PID is the stub's own
            self.proc = subprocess.Popen(self.command(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"http://{self.host}:{self.port}/", timeout=2)
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
    faults: list[dict] = []
    train_faults: dict = {}
    cut: dict | None = None
    gen_fault: dict = {}
    with StubOnWorker(subnet, out / "openai-stub.log") as stub, \
            StubOnWorker(subnet, out / "batching-stub.log", GEN_STUB_PORT, GEN_STUB_LATENCY_S) as slow_stub:
        steps = [*pipeline(stub.url, slow_stub.url), ("serve", "serve", None)]
        if opts.get("steps"):  # a subset, e.g. steps=train,serve (earlier steps' artefacts on S3 / MLflow)
            chosen = opts["steps"].split(",")
            unknown = sorted(set(chosen) - {name for name, _, _ in steps})
            if unknown:
                raise SystemExit(f"cluster: unknown steps {unknown}; the steps: {[name for name, _, _ in steps]}")
            steps = [step for step in steps if step[0] in chosen]
        for name, stage, args in steps:
            if name == "generate-fault":
                gen_fault = generate_with_a_host_cut(head, out, args, slow_stub)
                good, seconds, tail = gen_fault["ok"], gen_fault["seconds"], json.dumps(gen_fault)
                faults.append({"fault": f"generate-host-cut-{GEN_CUT_S}s", **gen_fault})
                print(f"cluster: generate-fault: {gen_fault.get('inputs')} inputs, {gen_fault.get('outputs')} outputs "
                      f"and rejects, {gen_fault.get('rows_lost')} lost, {gen_fault.get('rows_duplicated')} duplicated",
                      flush=True)
            elif name == "train":
                train_faults = train_with_faults(head, out, args)
                good, seconds, tail = train_faults["ok"], train_faults["seconds"], json.dumps(train_faults)
                faults += train_faults["faults"]
            elif name == "serve":
                good, seconds, tail, cut = serve_step(head, out)
                print(f"cluster: serve: {tail}", flush=True)
                if cut is not None:  # survived: no failed request in the load's last 20 s
                    faults.append({"fault": "serve-host-cut-30s", "survived": cut["recovered"], **cut})
            else:
                good, seconds, tail = submit(stage, args, head, out / f"{name}.log")
            results.append({"step": name, "ok": good, "seconds": round(seconds, 1)})
            print(f"cluster: {name} {'ok' if good else 'FAILED'} in {seconds:.0f} s", flush=True)
            if not good:
                print(tail, file=sys.stderr)
                break
            ok += 1
    survived = sum(1 for f in faults if f.get("survived"))
    lost, duplicated = train_faults.get("steps_lost", 0), train_faults.get("steps_duplicated", 0)
    failed = cut["failed"] if cut else 0
    rows_lost, rows_duplicated = gen_fault.get("rows_lost", 0), gen_fault.get("rows_duplicated", 0)
    summary = {"steps": results, "local_path_refusal": refused, "faults": faults, "train_faults": train_faults,
               "generate_fault": gen_fault, "serve_cut": cut}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    planned = (len(TRAIN_FAULTS) * any(n == "train" for n, _, _ in steps) + any(n == "serve" for n, _, _ in steps)
               + any(n == "generate-fault" for n, _, _ in steps))
    print(f"cluster: {ok} stages ok, faults survived {survived}/{planned}, steps lost {lost}, "
          f"duplicated {duplicated}, rows lost {rows_lost}, duplicated {rows_duplicated}, requests failed {failed}")
    return 0 if ok == len(steps) and survived == planned else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
