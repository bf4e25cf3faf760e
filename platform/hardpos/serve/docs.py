"""The API's ``/docs`` page from files shipped in the package, so it works offline.

FastAPI's default ``/docs`` loads Swagger UI from a public CDN: blank on a cluster without
internet access. :func:`add_offline_docs` serves the vendored Swagger UI (under
``hardpos/resources/swagger-ui``, Apache-2.0, licence beside it) instead. Asset URLs are
relative to the page, so the page works under any Serve ``route_prefix``.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(__file__).resolve().parent.parent / "resources" / "swagger-ui"
ASSETS_ROUTE = "/docs-assets"


def add_offline_docs(app: FastAPI) -> FastAPI:
    """Serve ``GET /docs`` (Swagger UI) and its assets from the package; returns ``app``.

    Build the app with ``docs_url=None`` (FastAPI's CDN page off) before calling this.
    """
    app.mount(ASSETS_ROUTE, StaticFiles(directory=ASSETS), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        # relative URLs: /<prefix>/docs loads /<prefix>/docs-assets/... and /<prefix>/openapi.json
        return get_swagger_ui_html(openapi_url="openapi.json", title=f"{app.title} - docs",
                                   swagger_js_url="docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="docs-assets/swagger-ui.css",
                                   swagger_favicon_url="docs-assets/favicon-32x32.png")

    return app
