"""The Ray Serve scoring app, for real: serve.run on the session's local Ray, HTTP on 127.0.0.1.

One app (a tiny registered model, bearer auth on) serves every test in this module; a
second app points at a model that does not exist. (``_local_testing_mode`` cannot run
``@serve.batch`` in Ray 2.60, so nothing here is simulated.)
"""
from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest

from conftest import free_port
from serve_util import b64, bomb_png, png_bytes, register_checkpoint, tiny_checkpoint

MODEL_NAME = "hardpos-clip-test"
LATE_MODEL = "registered-later"
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
    # Polls its alias every second: it must come up by itself once the model is registered.
    missing_cfg = {**base_cfg, "model": f"models:/{LATE_MODEL}@champion", "auth_token_env": "", "reload_poll_s": 1.0,
                   "model_deployment": {"num_cpus": 0.1}, "ingress_deployment": {"num_cpus": 0.05}}
    os.environ[TOKEN_ENV] = TOKEN  # read by build_app (only its digest is baked into the app)
    try:
        main_app = build_app(base_cfg)
    finally:
        del os.environ[TOKEN_ENV]
    # Both apps deploy concurrently (replica start-up dominates this module's time).
    serve.run_many([serve.RunTarget(main_app, name="hardpos-test", route_prefix="/"),
                    serve.RunTarget(build_app(missing_cfg), name="hardpos-missing", route_prefix="/missing")])
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

    from hardpos.eval.evaluator import similarity_matrix
    from hardpos.model import ModelConfig, load_model

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
    from hardpos.serve.scoring import verdicts

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


def test_bearer_auth(app):
    import requests

    payload = {"image_b64": GOOD, "captions": ["a"]}
    assert _post(app, "/v1/score", payload, token=None).status_code == 401
    resp = _post(app, "/v1/score", payload, token="wrong")
    assert resp.status_code == 401 and resp.json()["detail"] == "invalid bearer token"
    assert resp.headers.get("www-authenticate") == "Bearer"
    assert requests.get(app["url"] + "/v1/model", timeout=30).status_code == 401
    assert requests.get(app["url"] + "/healthz", timeout=30).status_code == 200  # probes stay open


def test_unknown_model_is_404_then_served_once_registered(app):
    import time

    import requests

    health = requests.get(app["url"] + "/missing/healthz", timeout=30)
    assert health.status_code == 503 and LATE_MODEL in health.json()["detail"]
    resp = requests.post(app["url"] + "/missing/v1/score", json={"image_b64": GOOD, "captions": ["a"]}, timeout=30)
    assert resp.status_code == 404, resp.text
    assert f"models:/{LATE_MODEL}@champion" in resp.json()["detail"] and "not found" in resp.json()["detail"]
    # Register it: the replica's alias poll (reload_poll_s=1) loads it with no redeploy.
    version = register_checkpoint(app["uri"], LATE_MODEL, app["ckpt"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = requests.get(app["url"] + "/missing/healthz", timeout=30)
        if health.status_code == 200:
            break
        time.sleep(0.5)
    assert health.status_code == 200 and health.json()["version"] == version, health.text
    resp = requests.post(app["url"] + "/missing/v1/score", json={"image_b64": GOOD, "captions": ["a"]}, timeout=30)
    assert resp.status_code == 200 and resp.json()["model"]["name"] == LATE_MODEL


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
    from hardpos.perf.loadgen import LoadgenConfig, measure

    monkeypatch.setenv("HARDPOS_LOADGEN_TEST_TOKEN", TOKEN)
    cfg = LoadgenConfig(concurrency=[1, 4], requests_per_level=12, warmup_requests=2, images=3, image_size=40,
                        captions_per_request=3, caption_pool=8, token_env="HARDPOS_LOADGEN_TEST_TOKEN")
    result = measure(cfg, base_url=app["url"])
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 4]
    for level in result["levels"]:
        assert level["requests"] == 12 and level["ok"] == 12 and level["errors"] == 0
        assert level["scores_per_s"] == pytest.approx(3 * level["requests_per_s"], rel=1e-3)
        assert 0 < level["p50_ms"] <= level["p99_ms"]


def test_loadgen_refuses_replicas_the_cluster_cannot_hold(ray_session):
    from hardpos.perf.loadgen import LoadgenConfig, compare_batching

    # would deploy one app and wait forever for the second (seen with num_cpus=1 on 2 CPUs)
    with pytest.raises(ValueError, match=r"need 2\.2 CPU \(cluster has 2\); lower num_cpus"):
        compare_batching(LoadgenConfig(num_cpus=1.0))


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
