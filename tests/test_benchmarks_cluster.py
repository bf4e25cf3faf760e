"""The one-machine cluster (infra/cluster/cluster.sh, ``make cluster-*``, benchmarks.cluster):
what can be checked without bringing it up (a fast test), and the real up/down (``slow``: it
needs root, iproute2 and PostgreSQL's binaries, and takes minutes on 2 cores)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.cluster import (
    GEN_CUT_S,
    HEAL_STABLE_S,
    HEAL_STUCK_S,
    LocalPathError,
    heal_action,
    pipeline,
    refuse_local_paths,
    row_accounting,
    serve_config,
    step_accounting,
    worker_address,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "infra" / "cluster" / "cluster.sh"


def test_a_local_path_is_refused_in_one_line_naming_it(tmp_path):
    with pytest.raises(LocalPathError) as err:
        refuse_local_paths(["n_pretrain=40", f"output_dir={tmp_path}/out"])
    assert str(err.value).startswith(f"cluster: output_dir={tmp_path}/out is a local path") and "\n" not in str(err.value)
    with pytest.raises(LocalPathError, match="data.train_path=./triplets.parquet"):
        refuse_local_paths(["data.train_path=./triplets.parquet"])
    # what every host can read passes
    refuse_local_paths(["output_dir=s3://hardpos/x", "model.pretrained=runs:/abc/model", "model.pretrained=base:hardpos-base",
                        "input=s3://b/world/finetune.parquet", "resume_from=null", "engine.kind=rules"])


def test_a_local_path_inside_a_mapping_or_list_value_is_refused_naming_its_key():
    overrides = '{"data.train_path": "s3://b/t.parquet", "eval_benchmarks": [{"name": "r", "path": "/data/r.parquet"}]}'
    with pytest.raises(LocalPathError, match=r"^cluster: train_overrides.eval_benchmarks\[0\].path=/data/r.parquet is a local"):
        refuse_local_paths([f"train_overrides={overrides}"])
    with pytest.raises(LocalPathError, match="train_overrides.data.train_path=./t.parquet"):
        refuse_local_paths(['train_overrides={"data.train_path": "./t.parquet"}'])
    refuse_local_paths(['search_space={"loss.w_neg": {"grid_search": [0.5, 1.0]}}', "extra_trials=[]"])


def test_every_step_of_the_cluster_pipeline_names_only_shared_locations():
    steps = pipeline("http://10.213.77.11:8001/v1/chat/completions", "http://10.213.77.11:8002/v1/chat/completions")
    assert [name for name, _, _ in steps] == ["world", "generate-rules", "generate-http", "generate-fault", "train",
                                              "sweep", "register", "evaluate"]
    for _, stage, args in steps:
        assert (REPO / "jobs" / f"{stage}.py").exists()
        refuse_local_paths(args)  # nothing local: every host reads every location
    # the generation fault's job: the slow stub, one request open per actor, retries that outlast the cut
    gen = dict(a.split("=", 1) for a in steps[3][2])
    assert gen["engine.http.url"] == "http://10.213.77.11:8002/v1/chat/completions"
    assert (gen["engine.http.concurrency"], gen["engine.http.max_in_flight"], gen["output_dir"]) == (
        "2", "1", "s3://hardpos/cluster/generate-fault")
    assert sum(int(gen["engine.http.retry_wait_s"]) * 2 ** i for i in range(int(gen["engine.http.max_retries"]))) > GEN_CUT_S
    train = dict(a.split("=", 1) for a in steps[4][2])  # the fault-injected run: 30 steps, every one logged
    assert (train["max_steps"], train["batch_size"], train["log_every"], train["output_dir"]) == (
        "30", "2", "1", "s3://hardpos/cluster/train")
    sweep = dict(a.split("=", 1) for a in steps[5][2])
    assert '"scaling.resources_per_worker": {"worker_host": 1}' in sweep["train_overrides"]
    assert dict(a.split("=", 1) for a in steps[7][2])["model.pretrained"] == "models:/hardpos-cluster@champion"


def test_the_cluster_serve_config_places_the_replica_on_a_worker_host():
    from ray.serve.schema import ServeDeploySchema

    from hardpos.serve.config import load_app_config

    cfg = serve_config("10.213.77.10", replicas=2)
    ServeDeploySchema.model_validate(cfg)
    app = load_app_config(cfg["applications"][0]["args"])
    assert app.model == "models:/hardpos-cluster@champion" and app.model_deployment.resources == {"worker_host": 1}
    assert app.model_deployment.num_replicas == 2  # one a worker host: each host has one worker_host
    assert cfg["http_options"]["host"] == "0.0.0.0"
    # the replicas' hosts, as the Serve step and the supervisor address them (cluster.sh's layout)
    assert [worker_address("10.213.77.10", h) for h in ("w1", "w2")] == ["10.213.77.11", "10.213.77.12"]


def test_step_accounting_counts_steps_lost_and_duplicated():
    assert step_accounting([1, 2, 3, 4], 4) == (0, 0)
    assert step_accounting([1, 2, 2, 3, 5, 5, 5], 5) == (1, 3)  # 4 lost; 2 once and 5 twice again
    assert step_accounting([], 3) == (3, 0)


def test_row_accounting_counts_generated_rows_lost_duplicated_and_unexpected():
    planned = ["0:replace", "0:swap", "1:replace", "2:input"]
    assert row_accounting(planned, ["0:swap", "0:replace", "2:input", "1:replace"]) == (0, 0, 0)
    assert row_accounting(planned, ["0:replace", "0:replace", "1:replace", "9:replace"]) == (2, 1, 1)


def test_a_node_counts_as_healed_only_after_staying_alive_past_rays_death_detection():
    # right after a 30 s link cut the head may still list the node alive: not healed yet
    assert heal_action(True, True, alive_for_s=1, dead_for_s=0) == "wait"
    assert heal_action(True, True, alive_for_s=HEAL_STABLE_S, dead_for_s=0) == "done"
    # the head declared it dead and its raylet exited: a new node; one that lingers is killed
    assert heal_action(False, False, alive_for_s=0, dead_for_s=5) == "restart"
    assert heal_action(False, True, alive_for_s=HEAL_STABLE_S, dead_for_s=0) == "restart"
    assert heal_action(True, False, alive_for_s=0, dead_for_s=HEAL_STUCK_S - 1) == "wait"
    assert heal_action(True, False, alive_for_s=0, dead_for_s=HEAL_STUCK_S) == "kill"
    # a dashboard that does not answer decides nothing
    assert heal_action(True, None, alive_for_s=0, dead_for_s=HEAL_STUCK_S * 2) == "wait"


def test_the_openai_stub_binds_the_address_it_is_given():
    import requests

    from tests.support.openai_stub import OpenAIStub, canned

    assert canned("a man riding a bus", "replace", 0) == (200, "a guy riding a bus")  # a "good" caption
    with OpenAIStub(host="127.0.0.2") as stub:
        assert stub.url == f"http://127.0.0.2:{stub.port}/v1/chat/completions"
        reply = requests.post(stub.url, timeout=10,
                              json={"messages": [{"role": "user", "content": "Sentence: a man riding a bus"}]})
        assert (reply.status_code, stub.requests) == (200, 1)
        assert reply.json()["choices"][0]["message"]["content"] == "a guy riding a bus"


def test_script_and_make_targets():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert os.access(SCRIPT, os.X_OK)
    make = (REPO / "Makefile").read_text()
    for target in ("cluster-up", "cluster-test", "cluster-down"):
        assert re.search(rf"^{target}:", make, re.M), target
    text = SCRIPT.read_text()
    # private addresses of its own, and never a machine-wide stop
    assert re.search(r'NET="\$\{HARDPOS_CLUSTER_SUBNET:-10\.\d+\.\d+\}"', text)
    assert "ray stop" not in text.replace("ray stop[", "") and "pkill" not in text and "killall" not in text
    assert "infra/cluster/cluster.sh" in (REPO / "infra" / "README.md").read_text()
    # the node supervisor's probe names the hosts it knows
    res = subprocess.run(["bash", str(SCRIPT), "pids", "nohost", "raylet"], capture_output=True, text=True)
    assert res.returncode == 1 and "pids HOST NAME (HOST: head w1 w2)" in res.stderr


def _can_run_cluster() -> str:
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    for tool in ("ip", "nsenter", "unshare", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    from tests.support.postgres import binaries

    return binaries()[1]


def test_a_repository_under_tmp_is_refused_before_anything_starts():
    """Every host mounts a private tmpfs on /tmp: a checkout there would vanish inside the
    hosts, so `up` refuses it in one line naming it, before it creates anything."""
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="hp-cluster-repo-", dir="/tmp"))
    try:
        (root / "infra" / "cluster").mkdir(parents=True)
        script = root / "infra" / "cluster" / "cluster.sh"
        shutil.copy2(SCRIPT, script)
        env = {**os.environ, "HARDPOS_CLUSTER_PYTHON": sys.executable, "HARDPOS_CLUSTER_NAME": "hp-refused"}
        res = subprocess.run(["bash", str(script), "up"], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1
        assert res.stderr.strip() == (f"cluster: error: {root} is under /tmp, which every host of the cluster "
                                      "replaces with a private tmpfs: put the repository and its venv outside /tmp")
        assert not Path("/run/hp-refused").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.integration
def test_up_then_down_leaves_nothing(tmp_path):
    why = _can_run_cluster()
    if why:
        pytest.skip(why)
    import sys

    env = {**os.environ, "HARDPOS_CLUSTER_PYTHON": sys.executable, "HARDPOS_CLUSTER_NAME": "hpt",
           "HARDPOS_CLUSTER_SUBNET": "10.213.78"}
    try:
        up = subprocess.run([str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stderr[-3000:]
        status = subprocess.run([str(SCRIPT), "status"], env=env, capture_output=True, text=True, timeout=60)
        assert status.stderr.count("process(es)") == 3, status.stderr
        # the hosts are separate machines: their own /tmp, the services on the head's address
        probe = subprocess.run([str(SCRIPT), "exec", "w1", "sh", "-c", "touch /tmp/only-on-w1 && ls /tmp"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert "only-on-w1" in probe.stdout and not Path("/tmp/only-on-w1").exists()
        other = subprocess.run([str(SCRIPT), "exec", "w2", "ls", "/tmp"], env=env, capture_output=True, text=True,
                               timeout=60)
        assert "only-on-w1" not in other.stdout
        import requests

        assert requests.get("http://10.213.78.10:5000/health", timeout=30).ok
    finally:
        down = subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=300)
    assert down.returncode == 0 and "nothing left" in down.stderr, down.stderr[-2000:]


def test_generated_rows_checks_a_generate_run_on_s3_exactly_once(ray_session, s3_env, tmp_path):
    """The generation fault's verdict, on a real run written to (moto's) S3: every planned
    row in the output or the rejects once; a duplicated or missing row is counted."""
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.cluster import generated_rows
    from hardpos.config import load_config
    from hardpos.runtime import execute
    from hardpos.generate import stage as generate

    s3 = boto3.client("s3", endpoint_url=os.environ["HARDPOS_S3_ENDPOINT_URL"], region_name="us-east-1")
    caps = tmp_path / "finetune.parquet"
    pq.write_table(pa.table({"caption": [f"A red car and a small dog {i}." for i in range(10)] + [""]}), caps)
    s3.upload_file(str(caps), s3_env, "world/finetune.parquet")
    source, out = f"s3://{s3_env}/world/finetune.parquet", f"s3://{s3_env}/gen"
    execute("generate", load_config(generate.Config, None, [f"input={source}", f"output_dir={out}", "engine.kind=rules",
                                                            "shard_size=4", "tracking.enabled=false"]), quiet=True)
    rows = generated_rows(s3, out, source)
    assert rows["inputs"] == rows["outputs"] == 10 * 2 + 1  # REPLACE and SWAP per caption, the empty one a reject
    assert (rows["rows_lost"], rows["rows_duplicated"], rows["rows_unexpected"]) == (0, 0, 0)
    assert rows["complete"] and rows["conserved"]
    import io

    table = pq.read_table(io.BytesIO(s3.get_object(Bucket=s3_env, Key="gen/rejects.parquet")["Body"].read()))
    buf = pa.BufferOutputStream()  # as if a run had written one of its rejects twice
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), buf)
    s3.put_object(Bucket=s3_env, Key="gen/rejects.parquet", Body=buf.getvalue().to_pybytes())
    assert generated_rows(s3, out, source)["rows_duplicated"] == 1
