"""Tracking as a side channel (hardpos.tracking): a dead or slow MLflow server never
stalls or fails a job; records are written to a journal on disk first, sent in order when it
returns, never twice, and replayed later (by the same shipper) when it does not. Units run against a real SQLite
store behind a switchable transport; the end-to-end tests stop and restart a real
``mlflow server`` by PID during a real 2-worker Ray Train run (and a sweep)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from hardpos import runtime, tracking
from hardpos.config import ConfigError, JobConfig, TrackingConfig, load_config
from tests.support import free_port, write_triplets
from tests.support.mlflow_server import LocalMlflowServer  # noqa: F401  (annotations)


# --------------------------------------------------------------------------- helpers
class Switch:
    """A transport in front of a real SQLite store that the test can take down, hang, or
    make ambiguous (the request is committed, then the answer is 'lost')."""

    def __init__(self, uri: str) -> None:
        self.real = tracking.ClientTransport(uri, 5.0)
        self.down = False
        self.ambiguous = 0          # the next N batches commit, then fail as if the answer was lost
        self.gate = threading.Event()
        self.gate.set()             # cleared: every request hangs (a stalled server)
        self.calls: list[list[int]] = []  # steps of each metric batch that reached the store

    def _check(self) -> None:
        self.gate.wait()
        if self.down:
            raise tracking.Transient("connection refused (test)")

    def log_batch(self, run_id, metrics, params, tags):
        self._check()
        self.real.log_batch(run_id, metrics, params, tags)
        self.calls.append([m["step"] for m in metrics])
        if self.ambiguous:
            self.ambiguous -= 1
            raise tracking.Transient("read timed out (test): committed, answer lost")

    def terminate(self, run_id, status, end_time):
        self._check()
        self.real.terminate(run_id, status, end_time)

    def upload(self, run_id, local, artifact_path):
        self._check()
        self.real.upload(run_id, local, artifact_path)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the unit tests (creating one costs seconds); each test has its own run."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlruns.db'}"
    MlflowClient(uri).search_experiments()  # creates the schema once
    return uri


@pytest.fixture
def tracking_uri(store, monkeypatch) -> str:
    """The shared store, as the environment's default too (overrides conftest's per-test one)."""
    from mlflow.tracking._tracking_service import utils as mlflow_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setattr(mlflow_uri, "_tracking_uri", None)
    return store


@pytest.fixture
def switch(tracking_uri, monkeypatch):
    sw = Switch(tracking_uri)
    monkeypatch.setattr(tracking.transport, "transport_for", lambda uri, timeout_s: sw)
    yield sw
    sw.gate.set()
    tracking.close_all(timeout=0)


def _wait(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _steps(uri: str, run_id: str, key: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def _start(tmp_path, uri: str, **options) -> tracking.RunLogger:
    cfg = TrackingConfig(tracking_uri=uri, experiment="outage", **options)
    return tracking.start_run(cfg, "r", spill_dir=str(tmp_path / "tracking"))


# --------------------------------------------------------------------------- units
def test_logging_never_waits_for_a_hung_server(tmp_path, tracking_uri, switch):
    run = _start(tmp_path, tracking_uri)
    switch.gate.clear()  # every request now hangs
    done = threading.Event()

    def loop():
        for step in range(1, 301):
            run.log_metrics({"loss": 1.0 / step}, step=step)
        done.set()

    threading.Thread(target=loop, daemon=True).start()
    assert done.wait(10), "log_metrics blocked on a hung tracking server"
    assert tracking.existing_queue(run.tracking_uri, run.run_id, run.spill_dir).pending() >= 299
    switch.gate.set()
    report = tracking.end_run(run, timeout=30)
    assert report["undelivered"] == 0
    assert _steps(tracking_uri, run.run_id, "loss") == list(range(1, 301))


def test_every_record_is_on_disk_before_it_is_sent_and_flushes_in_order(tmp_path, tracking_uri, switch):
    run = _start(tmp_path, tracking_uri)
    switch.down = True
    for step in range(1, 176):
        run.log_metrics({"loss": float(step)}, step=step)
    q = tracking.existing_queue(run.tracking_uri, run.run_id, run.spill_dir)
    journal = list((tmp_path / "tracking").glob("*.log.jsonl"))
    assert journal == [q.path]
    header, *rows = tracking.read_jsonl(q.path)     # everything is on disk already
    assert header["run_id"] == run.run_id and [r["step"] for r in rows] == list(range(1, 176))
    assert _steps(tracking_uri, run.run_id, "loss") == []
    switch.down = False
    _wait(lambda: q.pending() == 0, what="the journal to be sent")
    sent = [s for call in switch.calls for s in call]
    assert sent == list(range(1, 176))               # in order, each once
    assert _steps(tracking_uri, run.run_id, "loss") == list(range(1, 176))
    assert tracking.end_run(run)["undelivered"] == 0
    assert not list((tmp_path / "tracking").glob("*.jsonl*"))  # journal and cursor gone once sent


def test_a_killed_process_leaves_its_journal_and_replay_sends_it(tmp_path, tracking_uri, switch, monkeypatch):
    run = _start(tmp_path, tracking_uri)
    switch.down = True
    for step in range(1, 31):
        run.log_metrics({"loss": float(step)}, step=step)
    q = tracking.existing_queue(run.tracking_uri, run.run_id, run.spill_dir)
    # what a SIGKILL leaves: the journal as written, no close, no undelivered file
    orphan = tmp_path / "orphan.log.jsonl"
    orphan.write_bytes(q.path.read_bytes())
    monkeypatch.undo()  # replay through the real transport; the live queue stays cut off
    out = tracking.replay(orphan)
    assert out.left == 0 and out.delivered == 30 and not orphan.exists()
    assert _steps(tracking_uri, run.run_id, "loss") == list(range(1, 31))


def test_a_replay_that_stops_resumes_at_its_cursor(tmp_path, tracking_uri, switch):
    run = _start(tmp_path, tracking_uri)
    switch.down = True
    for step in range(1, 2501):   # three requests of at most 1,000 metrics
        run.log_metrics({"loss": float(step)}, step=step)
    report = tracking.end_run(run, timeout=0)
    assert report["undelivered"] == 2501     # + the end record
    switch.down = False
    real = switch.log_batch
    calls = []

    def second_request_fails(*args):
        calls.append(1)
        if len(calls) == 2:
            raise tracking.Transient("connection refused (test)")
        return real(*args)

    switch.log_batch = second_request_fails
    first = tracking.replay(tmp_path / "tracking")
    assert first.delivered == 1000 and first.left == 1501
    switch.log_batch = real
    second = tracking.replay(tmp_path / "tracking")
    assert second.delivered == 1501 and second.left == 0
    assert [s for call in switch.calls for s in call] == list(range(1, 2501))  # nothing sent twice


def test_a_resend_after_an_ambiguous_failure_is_not_a_duplicate(tmp_path, tracking_uri, switch):
    run = _start(tmp_path, tracking_uri)
    switch.ambiguous = 2  # the first two batches are committed but reported as failed
    for step in range(1, 21):
        run.log_metrics({"loss": 0.5 * step, "lr": 0.1}, step=step)
    report = tracking.end_run(run, timeout=30)
    assert report["undelivered"] == 0
    sent = [s for call in switch.calls for s in call]
    assert len(sent) > 2 * 20, "the ambiguous batches were sent again"
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri).get_metric_history(run.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 0.5 * s) for s in range(1, 21)]
    assert _steps(tracking_uri, run.run_id, "lr") == list(range(1, 21))


def test_a_refused_record_is_dropped_and_the_rest_still_go(tmp_path, tracking_uri, switch):
    run = _start(tmp_path, tracking_uri)
    run.log_params({"a": 1})
    run.log_params({"a": 2, "b": 3})  # MLflow params are write-once: 'a' is refused, 'b' is kept
    run.log_metrics({"x": 1.0}, step=1)
    report = tracking.end_run(run)
    from mlflow.tracking import MlflowClient

    got = MlflowClient(tracking_uri).get_run(run.run_id)
    assert got.data.params == {"a": "1", "b": "3"} and got.data.metrics == {"x": 1.0}
    assert report["rejected"] == 1 and report["undelivered"] == 0 and got.info.status == "FINISHED"


def test_close_gives_up_after_its_timeout_and_replay_delivers_once(tmp_path, tracking_uri, switch, monkeypatch):
    run = _start(tmp_path, tracking_uri)
    run.log_params({"p": "v"})
    for step in range(1, 41):
        run.log_metrics({"loss": float(step)}, step=step)
    run.set_tags({"t": "x"})
    run.log_text("hello", "note.txt")
    switch.down = True
    t0 = time.monotonic()
    report = tracking.end_run(run, timeout=1.0)
    assert time.monotonic() - t0 < 10
    files = [Path(f) for f in report["undelivered_files"]]
    assert report["undelivered"] > 0 and len(files) == 1 and files[0].parent == tmp_path / "tracking"
    header, *rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert header["run_id"] == run.run_id and header["tracking_uri"] == tracking_uri
    assert len(rows) == report["undelivered"] and rows[-1]["kind"] == "end"
    assert report["replay"] == f"hardpos track replay {tmp_path / 'tracking'}"
    # whatever went before the outage is in the run once; the rest only after the replay
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    assert client.get_run(run.run_id).info.status == "RUNNING"
    switch.down = False
    monkeypatch.undo()  # replay through the real transport
    out = tracking.replay(tmp_path / "tracking")
    assert out.left == 0 and out.errors == [] and out.runs == {run.run_id: run.run_id}
    got = client.get_run(run.run_id)
    assert _steps(tracking_uri, run.run_id, "loss") == list(range(1, 41))
    assert got.info.status == "FINISHED" and got.data.params == {"p": "v"} and got.data.tags["t"] == "x"
    assert "note.txt" in {a.path for a in client.list_artifacts(run.run_id)}
    assert not files[0].exists() and not (tmp_path / "tracking" / "artifacts").exists()
    assert tracking.replay(tmp_path / "tracking").delivered == 0  # nothing is sent twice


def test_a_restarted_worker_adopts_the_leftovers_and_skips_logged_steps(tmp_path, tracking_uri, switch):
    run = _start(tmp_path, tracking_uri)
    # attempt 1 (rank 0): steps 1-5 delivered, 6-8 queued while the server is down, then it raises
    for step in range(1, 6):
        run.log_metrics({"loss/total": 1.0}, step=step)
    q = tracking.existing_queue(run.tracking_uri, run.run_id, run.spill_dir)
    _wait(lambda: q.pending() == 0)
    switch.down = True
    for step in range(6, 9):
        run.log_metrics({"loss/total": 1.0}, step=step)
    left = run.close(timeout=0, hand_off=True)
    assert left.undelivered == 3 and len(left.undelivered_files) == 1
    # attempt 2: resumes from a checkpoint at step 4, the server still down; the ledger
    # knows steps up to 8 were logged, so steps 5-8 are retrained but not logged again
    assert run.last_step("loss/total") == 8
    assert not Path(left.undelivered_files[0]).exists()  # adopted into the new process's journal
    for step in range(5, 11):
        if step > 8:
            run.log_metrics({"loss/total": 2.0}, step=step)
    switch.down = False
    assert tracking.end_run(run, timeout=30)["undelivered"] == 0
    assert _steps(tracking_uri, run.run_id, "loss/total") == list(range(1, 11))


def test_start_fails_fast_when_the_server_is_down_unless_not_required(tmp_path, tracking_uri):
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = TrackingConfig(tracking_uri=dead, experiment="outage", request_timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(tracking.TrackingUnavailableError, match="unreachable.*tracking.required=false"):
        tracking.start_run(cfg, "r", spill_dir=str(tmp_path / "t"))
    assert time.monotonic() - t0 < 15  # MLflow's own retries would take minutes

    cfg.required = False
    run = tracking.start_run(cfg, "offline", tags={"hardpos.stage": "x"}, spill_dir=str(tmp_path / "t"))
    assert run.local and run.run_id.startswith("local-")
    run.log_params({"lr": 0.1})
    run.log_metrics({"loss": 0.25}, step=3)
    report = tracking.end_run(run)
    assert report["undelivered"] == 4  # create, param, metric, end
    out = tracking.replay(tmp_path / "t", tracking_uri=tracking_uri)
    assert out.left == 0 and run.run_id in out.runs
    from mlflow.tracking import MlflowClient

    got = MlflowClient(tracking_uri).get_run(out.runs[run.run_id])
    assert got.info.run_name == "offline" and got.info.status == "FINISHED"
    assert got.data.params == {"lr": "0.1"} and got.data.tags["hardpos.stage"] == "x"
    assert _steps(tracking_uri, got.info.run_id, "loss") == [3]


def test_a_job_finishes_ok_and_its_summary_says_what_was_not_delivered(tmp_path, tracking_uri, switch):
    from hardpos.cli import main

    cfg = load_config(JobConfig, None, [f"output_dir={tmp_path / 'out'}", "tracking.experiment=outage",
                                        "tracking.drain_timeout_s=0.5"])

    def stage(cfg, ctx):
        for step in range(1, 11):
            ctx.log_metrics({"loss": float(step)}, step=step)
        switch.down = True  # the server dies mid-job
        for step in range(11, 21):
            ctx.log_metrics({"loss": float(step)}, step=step)
        return {"steps": 20}

    summary = runtime.execute("world", cfg, run_fn=stage, quiet=True)
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["status"] == "ok" and on_disk["tracking"] == summary["tracking"]
    t = summary["tracking"]
    assert t["undelivered"] >= 10 and all(Path(f).parent == tmp_path / "out" / "tracking" for f in t["undelivered_files"])
    switch.down = False
    tracking.close_all(timeout=0)
    assert main(["track", "replay", str(tmp_path / "out")]) == 0
    assert _steps(tracking_uri, summary["mlflow_run_id"], "loss") == list(range(1, 21))
    assert main(["track", "replay", str(tmp_path / "nope")]) == 2


def test_tracking_config_is_validated():
    for bad, msg in (("tracking.drain_timeout_s=-1", "drain_timeout_s must be >= 0"),
                     ("tracking.request_timeout_s=0", "request_timeout_s must be > 0")):
        with pytest.raises(ConfigError, match=msg):
            load_config(JobConfig, None, [bad])
    assert load_config(JobConfig, None, ["tracking.required=false"]).tracking.required is False


def test_next_unit_respects_log_batch_limits():
    metrics = [{"kind": "metric"}] * 1500
    assert tracking.next_unit(metrics) == 1000
    mixed = [{"kind": "param"}] * 150 + [{"kind": "metric"}] * 3
    assert tracking.next_unit(mixed) == 100
    assert tracking.next_unit([{"kind": "tag"}, {"kind": "end"}, {"kind": "tag"}]) == 1
    assert tracking.next_unit([{"kind": "end"}, {"kind": "tag"}]) == 1
    assert tracking.next_unit([]) == 0


# --------------------------------------------------------------------------- a real server
def _train_cfg(tmp_path: Path, uri: str, n_rows: int, extra: list[str] = ()):
    from hardpos.train.config import TrainConfig

    path, _ = write_triplets(tmp_path / "data", n=n_rows)
    return load_config(TrainConfig, None, [
        "model.arch=hardpos-tiny", "batch_size=4", "optim.lr=0.001", "optim.warmup_steps=2", "log_every=1",
        "data.shuffle_buffer=0", "fault.max_failures=0", "data.val_fraction=0", "epochs=1",
        f"data.train_path={path}", f"output_dir={tmp_path / 'out'}", f"tracking.tracking_uri={uri}",
        "tracking.experiment=outage", *extra])


def _kill_after_first_step(server: LocalMlflowServer, box: dict) -> threading.Thread:
    """Crash the server as soon as training has logged a step (read from its database)."""
    from mlflow.tracking import MlflowClient

    def watch():
        client = MlflowClient(server.store)
        deadline = time.time() + 600
        while time.time() < deadline:
            exp = client.get_experiment_by_name("outage")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            if any(client.get_metric_history(r.info.run_id, "loss/total") for r in runs):
                server.kill()
                box["down_at_ms"] = int(time.time() * 1000)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def crash_and_restart(mlflow_server) -> dict:
    """The server is SIGKILLed as soon as training has logged a step and started again 3 s
    later, while the job runs. The dict gets ``down_at_ms`` (when it went down)."""
    box: dict = {}
    watcher = _kill_after_first_step(mlflow_server, box)

    def restart_later():
        watcher.join()
        time.sleep(3)
        mlflow_server.start(wait=False)

    threading.Thread(target=restart_later, daemon=True).start()
    return box


@pytest.mark.slow  # ~110 s here (server start ~20 s, Ray Train ~40 s, the restart ~20 s): over the default suite's budget
def test_train_survives_a_server_crash_and_restart(ray_session, tmp_path, mlflow_server, crash_and_restart):
    """2 Ray Train workers; the server is SIGKILLed after the first logged step and brought
    back while the job drains: the job finishes, every step is in the run exactly once."""
    server, box = mlflow_server, crash_and_restart
    cfg = _train_cfg(tmp_path, server.url, n_rows=160, extra=["tracking.drain_timeout_s=300"])
    summary = runtime.execute("train", cfg, quiet=True)
    assert summary["status"] == "ok" and "down_at_ms" in box
    assert summary["tracking"]["undelivered"] == 0, summary["tracking"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.store)
    run_id = summary["mlflow_run_id"]
    history = client.get_metric_history(run_id, "loss/total")
    total = summary["total_steps"]
    assert sorted(m.step for m in history) == list(range(1, total + 1))  # every step, exactly once
    assert any(m.timestamp > box["down_at_ms"] for m in history), "no step was logged during the outage"
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and "plan.total_steps" in got.data.params
    assert sorted(m.step for m in client.get_metric_history(run_id, "epoch")) == [1]
    # The exactly-once argument, against the server itself: resending a delivered record
    # as it was queued (same key, value, timestamp, step), as after an ambiguous failure,
    # stores nothing new.
    first = min(history, key=lambda m: m.step)
    tracking.HttpTransport(server.url, 30).log_batch(run_id, [{
        "key": "loss/total", "value": first.value, "timestamp": first.timestamp, "step": first.step}], [], [])
    assert len(client.get_metric_history(run_id, "loss/total")) == total


@pytest.mark.slow
def test_train_with_a_server_that_never_returns_then_replay(ray_session, tmp_path, mlflow_server):
    """The server dies after the first step and stays down: the job still finishes (exit
    status ok), summary.json counts what was not delivered, and ``hardpos track replay``
    sends it into the same run once the server is back (model included)."""
    from hardpos.cli import main

    server = mlflow_server
    cfg = _train_cfg(tmp_path, server.url, n_rows=96, extra=["tracking.drain_timeout_s=3"])
    box: dict = {}
    _kill_after_first_step(server, box).join(timeout=0)
    summary = runtime.execute("train", cfg, quiet=True)
    assert summary["status"] == "ok" and "down_at_ms" in box
    t = summary["tracking"]
    assert t["undelivered"] > 0 and t["undelivered_files"] and summary["model_deferred"] is True
    run_id = summary["mlflow_run_id"]
    server.start()
    tracking.close_all(timeout=0)
    assert main(["track", "replay", str(tmp_path / "out" / "tracking")]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.url)
    steps = sorted(m.step for m in client.get_metric_history(run_id, "loss/total"))
    assert steps == list(range(1, summary["total_steps"] + 1))
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.data.tags["hardpos.model_uri"] == summary["model_uri"]
    assert "summary.json" in {a.path for a in client.list_artifacts(run_id)}


@pytest.mark.slow
def test_a_sweep_trial_outage_neither_fails_the_trial_nor_loses_its_metrics(ray_session, tmp_path, mlflow_server,
                                                                           crash_and_restart, monkeypatch):
    """Two trials; the server crashes during the first one and is back a few seconds later
    (the next trial may start while it is down: it records locally, sent at the sweep's end)."""
    from mlflow.tracking import MlflowClient

    server, box = mlflow_server, crash_and_restart
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    triplets, _ = write_triplets(tmp_path / "data", n=96)
    bench = {"kind": "triplets", "path": str(triplets)}
    overrides = {"data.train_path": str(triplets), "data.val_fraction": 0.0, "epochs": 1, "batch_size": 8,
                 "log_every": 1, "scaling.num_workers": 1, "scaling.cpus_per_worker": 0.5, "optim.warmup_steps": 1,
                 "eval_benchmarks": [{"name": "replace", **bench}, {"name": "swap", **bench}]}
    cfg = load_config(runtime.stage_module("sweep").Config, None, [
        f"output_dir={tmp_path / 'sweep'}", "train_config=jobs/configs/train.yaml",
        f"train_overrides={json.dumps(overrides)}",
        'search_space={"loss.w_neg": {"grid_search": [0.0, 1.0]}, "loss.w_pos": 1.0}', "extra_trials=[]",
        f"tracking.tracking_uri={server.url}", "tracking.experiment=outage", "tracking.drain_timeout_s=300",
        "register=false"])
    summary = runtime.execute("sweep", cfg, quiet=True)
    assert "down_at_ms" in box
    assert summary["finished"] == 2 and summary["failed"] == [] and summary["tracking"]["undelivered"] == 0
    client = MlflowClient(server.store)
    exp = client.get_experiment_by_name("outage")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{summary['mlflow_run_id']}'")
    assert sorted(float(c.data.params["loss.w_neg"]) for c in children) == [0.0, 1.0]
    for child in children:
        assert child.info.status == "FINISHED"
        steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, "loss/total"))
        assert steps == list(range(1, len(steps) + 1)) and len(steps) == (96 // 8), child.info.run_name
        assert len(client.get_metric_history(child.info.run_id, "replace/aug_acc")) == 1
        assert "objective" in child.data.metrics


# --------------------------------------------------------------------------- the REST client
def test_rest_calls_carry_mlflows_documented_auth_settings(monkeypatch):
    import http.server

    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            seen.append({"path": self.path, "auth": self.headers.get("Authorization")})
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/prefix"
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t0k")
        tracking.HttpTransport(base, 2.0).log_batch("r1", [], [], [{"key": "a", "value": "b"}])
        monkeypatch.delenv("MLFLOW_TRACKING_TOKEN")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "u")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "p")
        assert tracking.probe(base, 2.0) is None
    finally:
        server.shutdown()
    assert seen[0] == {"path": "/prefix/api/2.0/mlflow/runs/log-batch", "auth": "Bearer t0k"}
    assert seen[1] == {"path": "/prefix/api/2.0/mlflow/experiments/search", "auth": "Basic dTpw"}  # base64 u:p


def test_artifact_proxy_urls_follow_the_tracking_uri():
    from hardpos.tracking.transport import artifacts_url

    assert artifacts_url("mlflow-artifacts:/1/abc/artifacts", "http://h:5000") == \
        "http://h:5000/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts"
    assert artifacts_url("mlflow-artifacts://other:9/1/x", "https://h/mlflow") == \
        "https://other:9/mlflow/api/2.0/mlflow-artifacts/artifacts/1/x"


def test_fail_fast_mlflow_sets_once_and_leaves_a_users_settings(monkeypatch):
    from hardpos.tracking import transport

    monkeypatch.setattr(transport, "_FAIL_FAST_SET", False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")
    transport.fail_fast_mlflow()
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0" and os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "77"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    transport.fail_fast_mlflow()          # once per process: never flips a value back
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"
