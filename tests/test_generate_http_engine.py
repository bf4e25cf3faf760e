"""The HTTP engine's client (hardpos.generate.http_engine) against real HTTP servers on
127.0.0.1: many requests in flight give the same rows and verdicts as one at a time,
429 / 503 / Retry-After / timeouts shrink the window and every row still ends with an
answer, and the batching stub the benchmark measures against behaves like a full server.
No Ray here (the stage's own runs are in tests/test_generate_stage.py)."""
from __future__ import annotations

import collections
import concurrent.futures
import re
import time

import pytest
import requests

from hardpos.config import ConfigError, load_config
from hardpos.generate import engine_config, http_engine
from hardpos.generate.prompts import load_prompts
from tests.support import free_port
from tests.support.batching_stub import BatchingStub, steady
from tests.support.openai_stub import OpenAIStub, behaviour

WORDS = ["man", "woman", "dog", "cat", "bus", "table", "child", "plate", "street", "picture"]


def request_rows(n: int, prompts: str = "chat") -> tuple[dict, list[dict]]:
    """(templates by kind, request rows) for n captions, SWAP for those with "and"."""
    templates = {t.kind: t for t in load_prompts(prompts)}
    rows = []
    for i in range(n):
        caption = (f"A {WORDS[i % 10]} and a {WORDS[(i + 3) % 10]} near a red car number {i}." if i % 2
                   else f"A small {WORDS[i % 10]} sitting on a big table number {i}.")
        for kind, t in templates.items():
            if t.applies(caption):
                rows.append({"request_id": f"{i}:{kind}", "shard": i // 50, "caption_id": str(i), "caption": caption,
                             "kind": kind, "polarity": t.polarity})
    return templates, rows


def spec_for(url: str, templates: dict, **http) -> http_engine.HttpSpec:
    cfg = engine_config.EngineConfig(kind="http", http=engine_config.HttpEngineConfig(
        url=url, model="stub-llm", retry_wait_s=0.01, **http))
    return http_engine.http_spec(cfg, templates, environ={})


# --------------------------------------------------------------------------- the stub
def test_batching_stub_serves_capacity_at_once_queues_then_answers_429():
    with BatchingStub(capacity=2, latency_s=0.0, queue_limit=1, retry_after_s=2) as stub:
        stub.hold()
        body = {"model": "m", "messages": [{"role": "user", "content": "Replace one word.\nSentence: A red bus."}]}
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(requests.post, stub.url, json=body, timeout=60) for _ in range(5)]
            stub.wait_for(lambda s: s.active == 2 and s.queued == 1 and s.rejected == 2)
            # The stub counts a 429 when it decides it; its reply reaches the client a moment
            # later. The held three cannot finish, so wait for the two answered ones.
            deadline = time.monotonic() + 30
            while sum(f.done() for f in futures) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            rejected = [f.result() for f in futures if f.done()]
            stub.release()
            replies = [f.result() for f in futures]
        assert [r.status_code for r in rejected] == [429, 429]
        assert all(r.headers["Retry-After"] == "2" for r in rejected)
        assert sorted(r.status_code for r in replies) == [200, 200, 200, 429, 429]
        assert stub.counters()["served"] == 3 and stub.peak_active == 2 and stub.peak_queued == 1
        assert stub.requests == 3  # a 429 never reaches the canned answers: their attempt counts stay exact


def test_batching_stub_utilisation_is_the_fraction_of_slots_busy():
    with BatchingStub(capacity=4, latency_s=0.01) as stub:
        with requests.Session() as s:
            for _ in range(5):
                s.post(stub.completions_url, json={"model": "m", "prompt": "Input: A dog.\nOutput:"}, timeout=60)
        one_at_a_time = stub.utilisation()
        stub.reset_counters()
        stub.hold()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(requests.post, stub.completions_url, json={"model": "m", "prompt": "Input: A cat."},
                                   timeout=60) for _ in range(4)]
            stub.wait_for(lambda s: s.active == 4)
            stub.release()
            assert [f.result().status_code for f in futures] == [200] * 4
        full = stub.utilisation()
    assert 0 < one_at_a_time <= 0.25 + 1e-9  # one of four slots, at most
    assert stub.peak_active == 4 and 0 < full <= 1.0


def test_both_stubs_read_and_answer_a_request_alike():
    """The batching stub answers with the plain stub's request handling: the same replies
    (chat and completions), the same 400s for a body that is not JSON or has the wrong shape,
    the same model list; only its HTTP server and admission are its own."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "Replace one word.\nSentence: A man on a bus."}]}
    cases = [(lambda st: st.url, chat), (lambda st: st.completions_url, {"model": "m", "prompt": "Input: A man on a bus.\n"}),
             (lambda st: st.url, {"model": "m"}), (lambda st: st.completions_url, {"model": "m", "prompt": ["x"]}),
             (lambda st: st.url, b"{not json")]
    answers = []
    for stub in (OpenAIStub(), BatchingStub(capacity=2, latency_s=0.0)):
        with stub, requests.Session() as s:
            got = []
            for url, body in cases:
                kw = {"data": body} if isinstance(body, bytes) else {"json": body}
                r = s.post(url(stub), timeout=30, **kw)
                reply = r.json()
                reply.pop("created", None)  # a timestamp
                got.append((r.status_code, reply))
            got.append((200, s.get(f"{stub.base_url}/models", timeout=30).json()))
        answers.append(got)
    plain, batching = answers
    assert behaviour("A man on a bus.", "replace") == "good"  # no one-off 503 in the way
    assert plain == batching
    assert [status for status, _ in plain] == [200, 200, 400, 400, 400, 200]
    assert plain[4][1] == {"error": {"message": "invalid JSON", "type": "invalid_request_error"}}


# --------------------------------------------------------------------------- in flight == one at a time
def test_many_in_flight_give_the_rows_and_verdicts_of_one_at_a_time():
    """The same rows, byte for byte, whether each request waits for the one before it or
    64 are open at once over several calls (the canned answers include 500s, one-off 503s
    that shrink the window, empty and chatty replies)."""
    templates, rows = request_rows(120)
    outs = {}
    for name, max_in_flight, batch_size in (("serial", 1, 1), ("in_flight", 64, 16)):
        with BatchingStub(capacity=256, latency_s=0.0) as stub:  # a fresh stub: its flaky rows fail once each
            out, flow = http_engine.run_requests(spec_for(stub.url, templates, max_in_flight=max_in_flight), rows,
                                                 batch_size=batch_size)
            outs[name] = (out, flow.peak_in_flight, stub.requests)
    serial, in_flight = outs["serial"][0], outs["in_flight"][0]
    assert [r["request_id"] for r in in_flight] == [r["request_id"] for r in rows]  # input order, every row once
    assert in_flight == serial
    assert outs["serial"][1] == 1 and outs["in_flight"][1] > 1
    assert outs["serial"][2] == outs["in_flight"][2]  # the same requests were sent, retries included
    reasons = collections.Counter(r["engine_error"] for r in serial)
    assert reasons[None] > 0 and reasons["http_error"] > 0  # the stub's 500s are answers, not retried
    flaky = [r for r in rows if behaviour(r["caption"], r["kind"]) == "flaky"]
    assert flaky and all(o["engine_error"] is None for o, r in zip(serial, rows) if r in flaky)


def test_raw_templates_go_to_completions_with_the_releases_body():
    templates, rows = request_rows(6, prompts="paper")
    with BatchingStub(capacity=8, latency_s=0.0, keep_received=True) as stub:
        out, _ = http_engine.run_requests(spec_for(stub.url, templates), rows)
        received = list(stub.received)
    assert {route for route, _ in received} == {"completions"}
    sent = sorted((b["prompt"] for _, b in received))
    assert sent == sorted(templates[r["kind"]].raw_prompt(r["caption"]) for r in rows)
    assert all(o["source"] == "llm:stub-llm" and o["prompt_tokens"] > 0 for o in out if o["engine_error"] is None)


# --------------------------------------------------------------------------- backpressure
def test_429_with_retry_after_shrinks_the_window_and_every_row_still_ends():
    templates, rows = request_rows(60)
    with BatchingStub(capacity=4, latency_s=0.02, queue_limit=0, retry_after_s=0.05, responder=steady) as stub:
        stub.hold()  # the first 4 stay in their slots: the rest of the first window meets a full server
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(http_engine.run_requests, spec_for(stub.url, templates, max_in_flight=64,
                                                                     max_retries=8), rows, 16)
            stub.wait_for(lambda s: s.rejected > 0)
            stub.release()
            out, flow = running.result()
        counters = stub.counters()
    assert [r["request_id"] for r in out] == [r["request_id"] for r in rows]
    assert counters["rejected_429"] > 0 and flow.window.decreases >= 1 and flow.window.smallest < 64
    assert flow.paused_s > 0  # Retry-After paused the actor's new requests
    assert counters["served"] + counters["rejected_429"] == flow.sent  # nothing sent twice or lost on the way
    failed = [r for r in out if r["engine_error"]]
    # every row ends as an answer or as a reject with its reason: here only the canned 500s, or a 429 whose retries ran out
    assert all(r["engine_error"] == "http_error" and r["engine_detail"].startswith(("HTTP 500", "HTTP 429"))
               for r in failed)


def test_a_timeout_is_a_reject_with_its_reason_and_shrinks_the_window():
    templates, rows = request_rows(1)
    with BatchingStub(capacity=4, latency_s=0.0, responder=steady) as stub:
        stub.hold()  # no reply until the client has given up: no race with the timeout
        out, flow = http_engine.run_requests(spec_for(stub.url, templates, timeout_s=0.2, max_retries=1), rows[:1])
        stub.release()
    assert out[0]["engine_error"] == "request_failed"
    assert out[0]["engine_detail"] == "TimeoutError: no reply within 0.2 s after 2 attempt(s)"
    assert flow.overloads == 2 and flow.window.decreases == 2


def test_qps_spreads_requests_over_time():
    templates, rows = request_rows(15, prompts="chat")
    rows = [r for r in rows if r["kind"] == "replace"]  # 15 requests
    with BatchingStub(capacity=64, latency_s=0.0, responder=steady) as stub:
        start = time.perf_counter()
        out, _ = http_engine.run_requests(spec_for(stub.url, templates, qps=10.0, concurrency=2), rows)
        elapsed = time.perf_counter() - start
    # 2 actors share qps 10: this one may send 5 a second with bursts of 5, so 15 take >= 2 s
    assert len(out) == 15 and elapsed >= 1.9  # (asyncio may wake a timer a tick early)


def test_unreachable_endpoint_is_request_failed_after_its_retries():
    templates, rows = request_rows(1)
    out, flow = http_engine.run_requests(
        spec_for(f"http://127.0.0.1:{free_port()}/v1/chat/completions", templates, max_retries=2), rows[:1])
    assert out[0]["engine_error"] == "request_failed" and "after 3 attempt(s)" in out[0]["engine_detail"]
    assert flow.window.decreases == 0  # a refused connection is not a full endpoint


# --------------------------------------------------------------------------- config
def test_http_config_checks_each_value_and_maps_to_the_actor_pool():
    from hardpos.generate import stage as generate

    for key, value, message in (("max_in_flight", "0", "engine.http.max_in_flight must be >= 1, got 0"),
                                ("qps", "0", "engine.http.qps must be > 0 or null, got 0.0"),
                                ("tokens_per_minute", "0", "engine.http.tokens_per_minute must be >= 1 or null"),
                                ("timeout_s", "0", "engine.http.timeout_s must be > 0"),
                                ("url", "localhost:8000", "engine.http.url must be an http(s) URL"),
                                ("num_cpus", "0", "engine.http.num_cpus must be in (0, 64]")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(generate.Config, None, ["engine.kind=http", f"engine.http.{key}={value}"])
    cfg = engine_config.HttpEngineConfig(max_in_flight=64, batch_size=16, concurrency=3, num_cpus=0.5)
    kwargs = http_engine.http_map_kwargs(cfg)
    compute = kwargs["compute"]
    assert (compute.min_size, compute.max_size) == (3, 3)  # a fixed pool: every actor from the start
    assert compute.max_concurrent_calls_per_actor == 8  # 8 batches of 16 = twice the window of 64
    assert compute.max_tasks_in_flight_per_actor == 16
    assert (kwargs["batch_size"], kwargs["num_cpus"], kwargs["batch_format"]) == (16, 0.5, "pyarrow")
    assert http_engine.calls_per_actor(engine_config.HttpEngineConfig(max_in_flight=1, batch_size=16)) == 2
    assert http_engine.calls_per_actor(engine_config.HttpEngineConfig()) == 2  # 2 x 64 rows: twice the window of 64
    templates = {t.kind: t for t in load_prompts("paper")}
    full = engine_config.EngineConfig(kind="http", http=engine_config.HttpEngineConfig(
        url="http://h:8000/v1/chat/completions", api_key_env="MY_KEY", headers={"X-Team": "hardpos"}, qps=20,
        tokens_per_minute=90_000, concurrency=4))
    spec = http_engine.http_spec(full, templates, environ={"MY_KEY": "sk-test"})
    assert spec.urls == {"replace": "http://h:8000/v1/completions", "swap": "http://h:8000/v1/completions"}
    assert spec.headers == {"X-Team": "hardpos", "Authorization": "Bearer sk-test"}
    assert (spec.qps, spec.tokens_per_minute) == (5.0, 22_500.0)  # the job's limits shared by 4 actors
    assert http_engine.http_spec(full, templates, environ={}).headers == {"X-Team": "hardpos"}
    with pytest.raises(ConfigError, match="completions_url"):
        http_engine.http_spec(engine_config.EngineConfig(kind="http", http=engine_config.HttpEngineConfig(
            url="http://h/chat")), templates)


@pytest.mark.integration  # a subprocess: the stub as the benchmark runs it
def test_batching_stub_runs_as_its_own_process_with_counters_over_http():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.batching_stub", "2", "0", "2", "120"], cwd=root,
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1/chat/completions")
        base = url.rsplit("/v1/", 1)[0]
        body = {"model": "m", "messages": [{"role": "user", "content": "Sentence: A red bus."}]}
        assert requests.post(url, json=body, timeout=60).status_code in (200, 500)  # no one-off 503 here
        assert requests.get(f"{base}/stub/counters", timeout=60).json()["served"] == 1
        assert requests.post(f"{base}/stub/reset", timeout=60).json()["served"] == 0
    finally:
        proc.terminate()
        assert proc.wait(30) == 0  # SIGTERM is a clean stop


def test_the_benchmarks_peer_sends_every_request_once_within_its_bound():
    """benchmarks.generate_inflight's plain asyncio client, the engine's yardstick: the same
    payloads, each once, never more than its bound open (checked, not timed)."""
    from benchmarks.generate_inflight import peer_run, table

    templates, rows = request_rows(40)
    with BatchingStub(capacity=64, latency_s=0.0, responder=steady) as stub:
        spec = spec_for(stub.url, templates)
        work = [(spec.urls[r["kind"]], http_engine.request_payload("stub-llm", templates[r["kind"]], r["caption"],
                                                                    spec.sampling)) for r in rows]
        statuses = peer_run(work, bound=4)
        assert len(statuses) == len(rows) == stub.counters()["served"] and stub.peak_active <= 4
    assert set(statuses) <= {200, 500}
    row = {"latency_s": 0.5, "capacity": 64, "requests": 10, "in_flight_bound": 128, "ratio_busy": "1.00",
           "ratio_wall": "0.80", "capacity_engine": "0.97", "capacity_peer": "0.97", "capacity_stage": "0.97",
           "stage_vs_engine_wall": "1.20", "driver_rss_growth_mb": {"engine": 0.6, "stage": 1.0}}
    assert table([row]).splitlines()[-1] == "| 0.5 s | 64 | 10 | 128 | 1.00 | 0.80 | 0.97 / 0.97 / 0.97 | 1.20 | 0.6 / 1.0 |"
