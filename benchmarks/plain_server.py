"""The peer the Serve app is measured against: the same model in ONE FastAPI + uvicorn process.

What a user would build instead of Ray Serve: ``POST /v1/score`` with the same request and
response shapes as :mod:`hardpos.serve.app`, the same validation
(:mod:`hardpos.serve.requests`) and the same model work (:func:`hardpos.serve.scoring.load_state`
and :func:`~hardpos.serve.scoring.compute_batch` on one item), so a load test of the two
differs only in what Serve adds (its proxy, the ingress-to-model hop, ``@serve.batch``).
No batching, no auth, no reload: each request is scored alone in a worker thread, the way a
plain FastAPI app runs blocking work. ``GET /healthz``; ``GET /v1/model`` returns the model
facts and the same per-stage timings as the Serve app (``timing``). No ``/docs`` page.

    python -m benchmarks.plain_server model=/path/to/checkpoint arch=hardpos-tiny port=8100

Binds 127.0.0.1 only (a measuring peer, not a product server). Keys are
:class:`PlainServerConfig`'s; importing this module loads nothing.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Literal

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from benchmarks.harness import run_cli
from hardpos.serve.config import ServeAppConfig, ServingLimits, load_app_config
from hardpos.serve.errors import ServingError
from hardpos.serve.requests import (
    check_image_header,
    check_token_lengths,
    parse_json_body,
    parse_score_payload,
    read_body,
)
from hardpos.serve.scoring import ModelState, StageTimes, compute_batch, load_state, softmax

HOST = "127.0.0.1"


@dataclasses.dataclass
class PlainServerConfig:
    """The peer server (``python -m benchmarks.plain_server key=value ...``).

    model / arch: as in :class:`hardpos.serve.config.ServeAppConfig` (checkpoint, registry
        URI, open_clip tag, or ``random`` with ``arch``).
    tracking_uri: MLflow tracking URI for registry sources.
    port: TCP port on 127.0.0.1.
    device: auto (the GPU when torch sees one) | cpu | cuda.
    torch_threads: intra-op threads (None: torch's default, one per core).
    text_cache_size: caption-embedding LRU entries (the Serve replica's default).
    max_captions: captions per request.
    """

    model: str = "random"
    arch: str = "hardpos-tiny"
    tracking_uri: str | None = None
    port: int = 8100
    device: Literal["auto", "cpu", "cuda"] = "auto"
    torch_threads: int | None = None
    text_cache_size: int = 10_000
    max_captions: int = 64

    def app_config(self) -> ServeAppConfig:
        """The equivalent Serve app settings (validation limits, cache, device)."""
        return load_app_config({"model": self.model, "arch": self.arch, "tracking_uri": self.tracking_uri,
                                "device": self.device, "text_cache_size": self.text_cache_size,
                                "limits": {"max_captions": self.max_captions}})


def build_plain_app(state: ModelState, limits: ServingLimits) -> FastAPI:
    """The FastAPI app over a loaded ``state`` (pure construction; no I/O)."""
    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN, and a measuring peer
    # needs neither.
    app = FastAPI(title="HardPos plain peer (FastAPI + uvicorn, no Ray)", docs_url=None, redoc_url=None)
    times = StageTimes()

    @app.exception_handler(ServingError)
    async def _serving_error(_: Request, exc: ServingError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.post("/v1/score")
    async def score(request: Request) -> dict[str, Any]:
        with times.time("server"):
            with times.time("parse"):
                body = await read_body(request, limits.max_body_bytes)
                image, captions, want_probs = parse_score_payload(parse_json_body(body), limits)
                check_image_header(image, limits)
                check_token_lengths(state.loaded.tokenizer, captions, state.loaded.context_length, checked=state.cache)
            with times.time("model_call"):
                (result,) = await asyncio.to_thread(compute_batch, state, [(image, captions)], limits, times)
            if "error" in result:
                raise ServingError(result["error"]["status"], result["error"]["detail"])
            probs = softmax(result["scores"], result["logit_scale"]) if want_probs else None
            return {"model": result["model"], "scores": result["scores"], "probs": probs,
                    "logit_scale": result["logit_scale"]}

    @app.get("/v1/model")
    async def model_info() -> dict[str, Any]:
        return {"loaded": True, "model": {k: v for k, v in state.info.items() if k != "tags"},
                "timing": times.snapshot(),
                # read in a worker thread, where compute_batch runs (as the Serve replica does)
                "torch_threads": await asyncio.to_thread(torch.get_num_threads),
                "text_cache": state.cache.stats()}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "model": state.info.get("source"), "version": state.info.get("version")}

    return app


def run_plain_server(cfg: PlainServerConfig) -> None:
    """Load the model and serve it on 127.0.0.1:``cfg.port`` until interrupted."""
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    app_cfg = cfg.app_config()
    want_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    state = load_state(app_cfg, want_cuda=want_cuda)
    uvicorn.run(build_plain_app(state, app_cfg.limits), host=HOST, port=cfg.port, log_level="warning",
                access_log=False)


def main(argv: list[str] | None = None) -> int:
    """``key=value`` arguments of :class:`PlainServerConfig`; exit 2 on a bad config."""
    return run_cli(PlainServerConfig, argv, run_plain_server)


if __name__ == "__main__":
    raise SystemExit(main())
