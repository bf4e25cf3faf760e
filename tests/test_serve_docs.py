"""The scoring API's /docs page works offline: Swagger UI comes from the package, not a CDN."""
from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import uvicorn

from hardpos.serve.app import api

CHROMIUM = os.environ.get("HARDPOS_CHROMIUM", "/usr/bin/chromium")  # the browser test's Chromium


@pytest.fixture(scope="module")
def base_url():
    """The real ingress app on a real HTTP server on 127.0.0.1 (no Ray: /docs needs no model)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.headers.get("content-type", ""), resp.read()


def test_docs_page_loads_its_assets_from_the_server_not_a_cdn(base_url):
    status, _, body = get(f"{base_url}/docs")
    page = body.decode()
    assert status == 200 and "docs-assets/swagger-ui-bundle.js" in page and "docs-assets/swagger-ui.css" in page
    assert "cdn" not in page.lower() and "https://" not in page.split("<body>")[0]
    for asset, kind, size in (("swagger-ui-bundle.js", "javascript", 1_000_000), ("swagger-ui.css", "css", 100_000)):
        status, ctype, data = get(f"{base_url}/docs-assets/{asset}")
        assert status == 200 and kind in ctype and len(data) > size, (asset, ctype, len(data))
    _, _, spec = get(f"{base_url}/openapi.json")
    assert b'"/v1/score"' in spec  # what the page renders
    licence = Path(__file__).resolve().parents[1] / "platform/hardpos/resources/swagger-ui/LICENSE"
    assert "Apache License" in licence.read_text()


@pytest.mark.browser
def test_docs_page_renders_the_operation_list_in_headless_chromium(base_url):
    """Swagger UI really runs from the packaged files: Chromium with every non-local request
    blocked renders the API's operations."""
    try:
        # lazy: the browser driver is an optional test dependency
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("pip package playwright is not installed")
    if not Path(CHROMIUM).exists():
        if os.environ.get("HARDPOS_REQUIRE_BROWSER"):
            pytest.fail(f"HARDPOS_REQUIRE_BROWSER is set but {CHROMIUM} is absent")
        pytest.skip(f"{CHROMIUM} is absent (apt-get install chromium, or set HARDPOS_CHROMIUM)")
    outside: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                                    "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()

            def route(r):
                if r.request.url.startswith(base_url):
                    r.continue_()
                else:  # an offline cluster: nothing outside this server answers
                    outside.append(r.request.url)
                    r.abort()

            page.route("**/*", route)
            page.goto(f"{base_url}/docs")
            page.wait_for_selector(".opblock-summary-path", timeout=30_000)
            paths = page.locator(".opblock-summary-path").all_inner_texts()
        finally:
            browser.close()
    assert any("/score" in p.replace("\u200b", "") for p in paths), paths
    assert not outside, outside


def test_the_page_shows_the_models_that_validate_the_bodies():
    """/docs draws each request body from the pydantic model that parses it (no second
    description that could drift), and the page's promises are what validation enforces."""
    import base64

    from serve_util import png_bytes

    from hardpos.serve import requests, schemas
    from hardpos.serve.config import ServingLimits
    from hardpos.serve.errors import ServingError

    paths = api.openapi()["paths"]
    for path, model, form in (("/v1/score", schemas.ScoreRequest, schemas.ScoreForm), ("/v1/score/batch", schemas.BatchRequest, None),
                              ("/v1/compare", schemas.CompareRequest, schemas.CompareForm)):
        content = paths[path]["post"]["requestBody"]["content"]
        assert content["application/json"]["schema"] == _without_nulls(schemas.inline_schema(model)), path
        if form is not None:
            multipart = content["multipart/form-data"]["schema"]
            assert set(multipart["properties"]) == {"image", *form.model_fields} and "image_b64" not in multipart["properties"]
            assert multipart["required"] == ["image", *schemas.inline_schema(form).get("required", [])]
    score = paths["/v1/score"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert list(score["properties"]) == ["image_b64", "captions", "softmax"] and score["required"] == ["image_b64", "captions"]
    assert score["additionalProperties"] is False and score["properties"]["captions"]["minItems"] == 1
    image = base64.b64encode(png_bytes(0)).decode()
    for body, message in (({"captions": ["a"]}, "image_b64 is missing: expected " + score["properties"]["image_b64"]["description"]),
                          ({"image_b64": image, "captions": []}, "captions is empty: give 1..64 captions"),
                          ({"image_b64": image, "captions": ["a"], "x": 1}, "request: unknown field(s) 'x'; allowed: captions, image_b64, softmax")):
        with pytest.raises(ServingError) as info:
            requests.parse_score_payload(body, ServingLimits())
        assert info.value.status == 400 and info.value.message == message


def _without_nulls(node):
    """As the OpenAPI page has it (FastAPI leaves out null values: ``"default": null``)."""
    if isinstance(node, dict):
        return {k: _without_nulls(v) for k, v in node.items() if v is not None}
    return [_without_nulls(v) for v in node] if isinstance(node, list) else node
