"""HardPos scoring service on Ray Serve: raw CLIP cosine scores over HTTP.

Build: ``build_app(args) -> Application`` (``args`` is :class:`hardpos.serving.ServeAppConfig`
as a dict); nothing is loaded at import time. Run it with

    serve run serve/config.yaml                 # from the repository root
    serve run serve.app:build_app model=models:/hardpos-clip@champion

Two deployments:

* ``ScoringModel`` -- loads the model (MLflow registry alias, checkpoint dir / s3://, or an
  open_clip tag) on GPU when one is assigned (bf16 autocast) else CPU, and answers
  ``score(image_bytes, captions)``. Requests are batched with ``@serve.batch``: one forward
  pass encodes every image of the batch and every caption not already in the replica's
  LRU text-embedding cache. A replica that cannot load its model stays up and answers
  404/503 with the reason (``/healthz`` says 503) and keeps retrying on its poll.
  Reload without downtime: the new version loads in a thread while the old one serves,
  then one reference swap (a batch always uses a single model: scores never mix versions).
  Triggers: the registry alias moved (polled every ``reload_poll_s``), ``POST /v1/reload``,
  or a new ``reload_token`` in the user_config (``serve deploy``: every replica).
* ``ScoringAPI`` -- the FastAPI ingress: input validation (400/413 with specific messages,
  see :mod:`hardpos.serving`), optional bearer auth, request timeout (503, never a hang),
  and fan-out of ``/v1/score/batch`` items so they batch on the model deployment.

Routes: ``POST /v1/score`` (JSON with base64, or multipart upload), ``POST /v1/score/batch``,
``POST /v1/compare``, ``GET /v1/model``, ``POST /v1/reload``, ``GET /healthz``; OpenAPI at
``/docs``.

How Ray workers import this module: :func:`build_app` registers it for pickling *by
value*, so ``serve.run(build_app(...))`` from any driver ships the deployment classes
without workers needing ``serve/`` on their path. ``serve run serve/config.yaml`` imports
``serve.app`` in the cluster: run it from the repository root (Ray puts the driver's
working directory on local workers' path) or give the app a ``runtime_env.working_dir``
(a zip URI) when deploying to a remote cluster.
"""
# No `from __future__ import annotations`: Serve re-registers the class-based FastAPI routes and
# must see real annotations (a string "Request" becomes a required query parameter).

import asyncio
import dataclasses
import logging
import os
import sys
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from hardpos import serving as S

log = logging.getLogger("ray.serve")

# --------------------------------------------------------------------------- API models
# Documented request/response schemas (OpenAPI). Bodies are parsed by hardpos.serving so
# every listed mistake is a 400 naming its field rather than FastAPI's generic 422.


class ScoreRequest(BaseModel):
    image_b64: str = Field(description="the image bytes (PNG/JPEG/WEBP/GIF/BMP/TIFF) as base64, or a data: URL")
    captions: list[str] = Field(min_length=1, description="1..max_captions captions to score against the image")
    softmax: bool = Field(False, description="also return softmax(logit_scale * cosine) over the captions")


class ModelRef(BaseModel):
    name: str | None = None
    version: str | None = None
    source: str
    alias: str | None = None


class ScoreResponse(BaseModel):
    model: ModelRef
    scores: list[float] = Field(description="cosine similarity of the image with each caption, in order")
    probs: list[float] | None = Field(None, description="softmax over the captions (when requested)")
    logit_scale: float


class BatchItem(BaseModel):
    image_b64: str
    captions: list[str] = Field(min_length=1)


class BatchRequest(BaseModel):
    items: list[BatchItem] = Field(min_length=1)
    softmax: bool = False


class ItemError(BaseModel):
    status: int
    detail: str


class BatchResult(BaseModel):
    index: int
    scores: list[float] | None = None
    probs: list[float] | None = None
    error: ItemError | None = Field(None, description="this item was rejected (the others are still scored)")


class BatchResponse(BaseModel):
    model: ModelRef | None
    results: list[BatchResult]
    n_ok: int
    n_rejected: int


class CompareRequest(BaseModel):
    image_b64: str
    caption: str
    hard_negative: str
    hard_positive: str | None = None


class CompareResponse(BaseModel):
    model: ModelRef
    scores: dict[str, float] = Field(description="cosine of caption, hard_negative (and hard_positive)")
    correct_original: bool = Field(description="s_caption > s_hard_negative")
    correct_augmented: bool | None = Field(None, description="s_c > s_n and s_p > s_n (needs hard_positive)")
    brittle: bool | None = Field(None, description="(s_c > s_n > s_p) or (s_p > s_n > s_c) (needs hard_positive)")


def _inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its ``$defs`` references inlined (openapi_extra has no
    components section of its own)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.split("/")[-1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for a route whose JSON body is parsed by hand."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _inline_schema(model)}}}}


def _json_or_multipart(model: type[BaseModel], file_field: str = "image") -> dict[str, Any]:
    """openapi_extra for a route that takes JSON or a multipart upload (file field ``image``)."""
    schema = _inline_schema(model)
    form_props = {k: v for k, v in schema.get("properties", {}).items() if k != "image_b64"}
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema},
        "multipart/form-data": {"schema": {"type": "object", "required": [file_field],
                                           "properties": {file_field: {"type": "string", "format": "binary"}, **form_props}}},
    }}}


# --------------------------------------------------------------------------- model deployment


@dataclasses.dataclass
class _ModelState:
    """One loaded model version (swapped as a whole on reload)."""

    loaded: Any
    device: Any
    autocast_bf16: bool
    cache: S.LRUCache
    info: dict[str, Any]
    logit_scale: float


@serve.deployment
class ScoringModel:
    """Holds one model version and scores (image bytes, captions) requests in batches."""

    def __init__(self, config: dict[str, Any]):
        self.cfg = S.load_app_config(config)
        self.stats = S.BatchStats()
        self._state: _ModelState | None = None
        self._error: S.ServingError | None = None
        self._poller: asyncio.Task | None = None
        self._reload_lock: asyncio.Lock | None = None
        self._reload_token: str | None = None  # set by the first reconfigure() (Serve calls it after __init__)
        self._apply_batching(self.cfg.batching)
        try:
            self._state = self._load()
            log.info("hardpos serve: loaded %s", self._state.info)
        except Exception as exc:  # noqa: BLE001 - stay up and say why (404/503), keep retrying
            self._error = S.classify_load_error(self.cfg.model, exc)
            log.error("hardpos serve: %s", self._error.message)

    # ---- configuration
    def _apply_batching(self, batching: S.BatchingConfig) -> None:
        self._batching = batching
        self._score_batch.set_max_batch_size(batching.effective_max_batch_size)
        self._score_batch.set_batch_wait_timeout_s(batching.batch_wait_timeout_s if batching.enabled else 0.0)

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """user_config: ``{"reload_token": str, "batching": {...}}``; a new token reloads."""
        user_config = dict(user_config or {})
        if "batching" in user_config:
            from hardpos.config import from_dict

            self._apply_batching(from_dict(S.BatchingConfig, user_config["batching"]))
        token = str(user_config.get("reload_token", self._reload_token or ""))
        previous, self._reload_token = self._reload_token, token
        if previous is not None and token != previous:  # not on the first call, right after __init__
            await self.reload(force=True)

    # ---- loading (hardpos.serving: MLflow sources resolve in cfg.tracking_uri, never a global URI)
    def _current_version(self) -> str | None:
        return S.current_version(self.cfg)

    def _load(self) -> _ModelState:
        import ray
        import torch

        want_cuda = self.cfg.device == "cuda" or (self.cfg.device == "auto" and bool(ray.get_gpu_ids()))
        if want_cuda and not torch.cuda.is_available():
            raise RuntimeError("device=cuda but no CUDA device is visible to this replica")
        device = torch.device("cuda" if want_cuda else "cpu")
        loaded, info = S.load_model(self.cfg, device)
        info.update(arch=loaded.arch, device=str(device), bf16=bool(want_cuda and self.cfg.bf16),
                    context_length=loaded.context_length, loaded_at=time.time())
        scale = float(loaded.model.logit_scale.exp().item()) if hasattr(loaded.model, "logit_scale") else 100.0
        return _ModelState(loaded, device, bool(want_cuda and self.cfg.bf16), S.LRUCache(self.cfg.text_cache_size), info, scale)

    async def reload(self, force: bool = False) -> dict[str, Any]:
        """Load the source again if the alias moved (or ``force``), without stopping service."""
        self._ensure_poller()
        assert self._reload_lock is not None
        async with self._reload_lock:
            old = self._state.info.get("version") if self._state else None
            if not force and self._state is not None:
                current = await asyncio.to_thread(self._current_version)
                if current is None or current == old:
                    return {"reloaded": False, "version": old, "reason": "already the current version"}
            try:
                state = await asyncio.to_thread(self._load)
            except Exception as exc:  # noqa: BLE001 - keep serving the old model; report why
                err = S.classify_load_error(self.cfg.model, exc)
                if self._state is None:
                    self._error = err
                log.error("hardpos serve: reload failed: %s", err.message)
                return {"reloaded": False, "version": old, "error": err.to_dict()}
            self._state, self._error = state, None  # one reference swap: no downtime
            log.info("hardpos serve: reloaded %s -> %s", old, state.info.get("version"))
            return {"reloaded": True, "previous_version": old, "version": state.info.get("version")}

    def _ensure_poller(self) -> None:
        if self._reload_lock is None:
            self._reload_lock = asyncio.Lock()
        if self._poller is None and self.cfg.reload_poll_s > 0:
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.reload_poll_s)
            try:
                await self.reload(force=self._state is None)
            except Exception as exc:  # noqa: BLE001 - the poller must never die
                log.warning("hardpos serve: alias poll failed: %s", exc)

    async def check_health(self) -> None:
        # Serve calls this every few seconds: a convenient place to start the poller. An
        # unloadable model is NOT unhealthy here (restarting would not help); /healthz says 503.
        self._ensure_poller()

    # ---- info
    async def info(self) -> dict[str, Any]:
        self._ensure_poller()
        state = self._state
        out: dict[str, Any] = {
            "loaded": state is not None,
            "model": {k: v for k, v in (state.info if state else {"source": self.cfg.model}).items() if k != "tags"},
            "batching": {"enabled": self._batching.enabled,
                         "max_batch_size": self._batching.effective_max_batch_size,
                         "batch_wait_timeout_s": self._batching.batch_wait_timeout_s if self._batching.enabled else 0.0,
                         **self.stats.summary()},
            "text_cache": state.cache.stats() if state else None,
            "replica": serve.get_replica_context().replica_id.unique_id,
        }
        if self._error is not None:
            out["error"] = self._error.to_dict()
        return out

    # ---- scoring
    async def score(self, image: bytes, captions: list[str]) -> dict[str, Any]:
        """Cosine scores of one image with each caption, or ``{"error": {status, detail}}``."""
        self._ensure_poller()
        state = self._state
        if state is None:
            err = self._error or S.ServingError(503, "model is not loaded yet")
            return {"error": err.to_dict()}
        try:
            S.check_token_lengths(state.loaded.tokenizer, captions, state.loaded.context_length)
        except S.ServingError as exc:
            return {"error": exc.to_dict()}
        return await self._score_batch((image, captions))

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def _score_batch(self, items: list[tuple[bytes, list[str]]]) -> list[dict[str, Any]]:
        state = self._state
        self.stats.record(len(items))
        # The forward pass runs in a thread so the replica keeps accepting (and queueing)
        # requests meanwhile: the next batch fills while this one computes.
        return await asyncio.to_thread(_compute_batch, state, items, self.cfg.limits)


def _compute_batch(state: _ModelState, items: list[tuple[bytes, list[str]]], limits: S.ServingLimits) -> list[dict[str, Any]]:
    """Score a batch with ONE model state: one image forward, one forward for uncached captions.
    A bad item gets its own error; it never fails the batch."""
    import contextlib

    import torch

    from hardpos.model import encode_image, encode_text, trim_tokens

    results: list[dict[str, Any] | None] = [None] * len(items)
    tensors, ok = [], []
    for i, (raw, _) in enumerate(items):
        try:
            img = S.open_image(raw, limits)
            tensors.append(state.loaded.preprocess_val(img))
            ok.append(i)
        except S.ServingError as exc:
            results[i] = {"error": exc.to_dict()}
        except Exception as exc:  # noqa: BLE001 - a preprocessing failure is this item's problem only
            results[i] = {"error": {"status": 400, "detail": f"image could not be preprocessed: {type(exc).__name__}: {exc}"}}
    if not ok:
        return results  # type: ignore[return-value]
    model, device = state.loaded.model, state.device
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if state.autocast_bf16 else contextlib.nullcontext()

    def encode_captions(texts: list[str]) -> list[torch.Tensor]:
        # Length-sorted chunks keep each forward trimmed to its own longest caption.
        toks = state.loaded.tokenizer(texts)
        order = torch.argsort((toks != 0).sum(dim=1), stable=True).tolist()
        out: list[torch.Tensor | None] = [None] * len(texts)
        for chunk in S.iter_chunks(order, 256):
            with torch.no_grad(), autocast:
                feats = encode_text(model, trim_tokens(toks[chunk]).to(device), normalize=True).float().cpu()
            for j, idx in enumerate(chunk):
                out[idx] = feats[j]
        return out  # type: ignore[return-value]

    with torch.no_grad(), autocast:
        img_feats = encode_image(model, torch.stack(tensors).to(device), normalize=True).float().cpu()
    all_caps = [c for i in ok for c in items[i][1]]
    txt = S.encode_with_cache(state.cache, all_caps, encode_captions)
    pos = 0
    ref = {k: state.info.get(k) for k in ("name", "version", "source", "alias")}
    for row, i in enumerate(ok):
        n = len(items[i][1])
        sims = (torch.stack(txt[pos:pos + n]) @ img_feats[row]).tolist()
        pos += n
        results[i] = {"scores": sims, "logit_scale": state.logit_scale, "model": ref}
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------- ingress

api = FastAPI(
    title="HardPos scoring API",
    version="1",
    description=(
        "Raw CLIP cosine scores for image-caption pairs from the registered HardPos model. "
        "Scores are NOT calibrated across models: hard-negative finetuning lowers the absolute "
        "score of correct captions, which this API shows as it is. Errors: 400 bad input, "
        "401 auth, 404 unknown model, 413 image too large, 503 model unavailable or timed out."
    ),
)


@api.exception_handler(S.ServingError)
async def _serving_error(_: Request, exc: S.ServingError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    # Only routes with declared parameters reach this; the body routes parse by hand.
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
    return JSONResponse({"detail": "; ".join(parts) or "invalid request"}, status_code=400)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise S.ServingError(413, f"request body is {declared} bytes; the limit is {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise S.ServingError(413, f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_multipart(request: Request, limits: S.ServingLimits, text_fields: tuple[str, ...]) -> dict[str, Any]:
    """A multipart form -> ``{"image": bytes, <text fields>...}`` (captions: repeated fields
    or one JSON list)."""
    import json

    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise S.ServingError(413, f"request body is {declared} bytes; the limit is {limits.max_body_bytes} bytes")
    try:
        form = await request.form(max_files=1, max_fields=limits.max_captions + 8)
    except AssertionError as exc:  # starlette: python-multipart is not installed
        raise S.ServingError(415, f"multipart uploads are not available on this server ({exc}); send JSON with image_b64") from None
    except Exception as exc:  # noqa: BLE001 - malformed multipart body
        raise S.bad_request(f"malformed multipart body: {type(exc).__name__}: {exc}") from None
    try:
        upload = form.get("image")
        if upload is None or isinstance(upload, str):
            raise S.bad_request("multipart: the image file field 'image' is missing")
        raw = await upload.read(limits.max_image_bytes + 1)
        if len(raw) > limits.max_image_bytes:
            raise S.ServingError(413, f"image is over the limit of {limits.max_image_bytes} bytes")
        if not raw:
            raise S.bad_request("multipart: the image file is empty")
        out: dict[str, Any] = {"image": raw}
        for field in text_fields:
            values = form.getlist(field)
            if any(not isinstance(v, str) for v in values):
                raise S.bad_request(f"multipart: {field} must be text fields, not files")
            if field == "captions":
                if len(values) == 1 and values[0].lstrip().startswith("["):
                    try:
                        values = json.loads(values[0])
                    except json.JSONDecodeError as exc:
                        raise S.bad_request(f"multipart: captions is not a valid JSON list: {exc.msg}") from None
                out[field] = values if values else None
            else:
                out[field] = values[0] if values else None
        unknown = sorted(set(form.keys()) - {"image", *text_fields})
        if unknown:
            raise S.bad_request(f"multipart: unknown field(s) {', '.join(map(repr, unknown))}")
        return out
    finally:
        await form.close()


async def _await(response: Any) -> Any:
    return await response


def _is_multipart(request: Request) -> bool:
    return request.headers.get("content-type", "").lower().startswith("multipart/form-data")


@serve.deployment
@serve.ingress(api)
class ScoringAPI:
    """HTTP front door: validates, authenticates, times out, and calls ``ScoringModel``."""

    def __init__(self, model_handle, config: dict[str, Any], auth_digest: str | None = None):
        self.cfg = S.load_app_config(config)
        self.limits = self.cfg.limits
        self.model = model_handle
        token = os.environ.get(self.cfg.auth_token_env) if self.cfg.auth_token_env else None
        # (Serve freezes a copy of `api` at decoration time, so auth state lives here.)
        self.auth_digest = S.token_digest(token) if token else auth_digest

    def _auth(self, request: Request) -> None:
        S.check_bearer(request.headers.get("authorization"), self.auth_digest)

    async def _call(self, method: str, *args: Any) -> Any:
        response = getattr(self.model, method).remote(*args)
        try:
            return await asyncio.wait_for(_await(response), timeout=self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            response.cancel()
            raise S.ServingError(503, f"the model did not answer within {self.limits.request_timeout_s:g} s; retry later") from None
        except BackPressureError:
            raise S.ServingError(503, "the model deployment is at capacity (max_ongoing_requests); retry later") from None
        except RayActorError as exc:  # replica died / restarting: the client should retry, not see a 500
            raise S.ServingError(503, f"the model replica is unavailable ({type(exc).__name__}); retry later") from None

    async def _score_one(self, image: bytes, captions: list[str]) -> dict[str, Any]:
        # Header checks here (size, format, pixel count: no pixels decoded) keep oversized and
        # non-image input away from the model replicas; the replica decodes once, and reports a
        # truncated/corrupt image as this item's 400.
        S.check_image_header(image, self.limits)
        return await self._call("score", image, captions)

    @staticmethod
    def _raise_item_error(result: dict[str, Any]) -> None:
        if "error" in result:
            raise S.ServingError(result["error"]["status"], result["error"]["detail"])

    @api.post("/v1/score", response_model=ScoreResponse,
              openapi_extra=_json_or_multipart(ScoreRequest), summary="Score one image against 1..N captions")
    async def score(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        if _is_multipart(request):
            form = await _read_multipart(request, self.limits, ("captions", "softmax"))
            captions = S.validate_captions(form["captions"], self.limits)
            image, softmax = form["image"], S.parse_flag(form["softmax"], "softmax")
        else:
            body = await _read_body(request, self.limits.max_body_bytes)
            image, captions, softmax = S.parse_score_payload(S.parse_json_body(body), self.limits)
        result = await self._score_one(image, captions)
        self._raise_item_error(result)
        probs = S.softmax(result["scores"], result["logit_scale"]) if softmax else None
        return {"model": result["model"], "scores": result["scores"], "probs": probs, "logit_scale": result["logit_scale"]}

    @api.post("/v1/score/batch", response_model=BatchResponse,
              openapi_extra=_json_body(BatchRequest),
              summary="Score many (image, captions) items; a bad item is rejected on its own")
    async def score_batch(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        body = await _read_body(request, self.limits.max_body_bytes)
        items, softmax = S.parse_batch_payload(S.parse_json_body(body), self.limits)

        async def one(item):
            if isinstance(item, S.ServingError):
                return {"error": item.to_dict()}
            try:
                return await self._score_one(*item)
            except S.ServingError as exc:
                if exc.status in (400, 413):
                    return {"error": exc.to_dict()}
                raise  # 503/404 concern the whole request

        results = await asyncio.gather(*(one(item) for item in items))
        model_errors = [r["error"] for r in results if "error" in r and r["error"]["status"] in (404, 503)]
        if model_errors and len(model_errors) == len(results):
            raise S.ServingError(model_errors[0]["status"], model_errors[0]["detail"])
        out, model_ref = [], None
        for i, r in enumerate(results):
            if "error" in r:
                out.append({"index": i, "error": r["error"]})
            else:
                model_ref = r["model"]
                out.append({"index": i, "scores": r["scores"],
                            "probs": S.softmax(r["scores"], r["logit_scale"]) if softmax else None})
        n_ok = sum(1 for r in out if "error" not in r)
        return {"model": model_ref, "results": out, "n_ok": n_ok, "n_rejected": len(out) - n_ok}

    @api.post("/v1/compare", response_model=CompareResponse,
              openapi_extra=_json_or_multipart(CompareRequest),
              summary="caption vs hard negative (vs hard positive): scores and DESIGN section 5 verdicts")
    async def compare(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        if _is_multipart(request):
            form = await _read_multipart(request, self.limits, ("caption", "hard_negative", "hard_positive"))
            payload = {k: v for k, v in form.items() if k != "image"}
            image = form["image"]
            texts = [S.validate_caption(payload.get("caption"), self.limits, "caption"),
                     S.validate_caption(payload.get("hard_negative"), self.limits, "hard_negative")]
            if payload.get("hard_positive"):
                texts.append(S.validate_caption(payload["hard_positive"], self.limits, "hard_positive"))
        else:
            body = await _read_body(request, self.limits.max_body_bytes)
            image, texts = S.parse_compare_payload(S.parse_json_body(body), self.limits)
        result = await self._score_one(image, texts)
        self._raise_item_error(result)
        s = result["scores"]
        names = ["caption", "hard_negative", "hard_positive"][: len(s)]
        return {"model": result["model"], "scores": dict(zip(names, s)),
                **S.verdicts(s[0], s[1], s[2] if len(s) > 2 else None)}

    @api.get("/v1/model", summary="The loaded model, its registered metrics, batching and cache stats")
    async def model_info(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        info = await self._call("info")
        info["limits"] = dataclasses.asdict(self.limits)
        return info

    @api.post("/v1/reload",
              summary="Reload if the registry alias moved (force=true: reload anyway). Reaches one model replica; "
                      "the others follow within reload_poll_s")
    async def reload(self, request: Request, force: bool = False) -> dict[str, Any]:
        self._auth(request)
        return await self._call("reload", force)

    @api.get("/healthz", summary="200 when a model is loaded, else 503 with the reason")
    async def healthz(self) -> JSONResponse:
        try:
            info = await self._call("info")
        except S.ServingError as exc:
            return JSONResponse({"status": "unavailable", "detail": exc.message}, status_code=503)
        if not info.get("loaded"):
            err = info.get("error") or {"detail": "model is not loaded yet"}
            return JSONResponse({"status": "unavailable", "detail": err["detail"]}, status_code=503)
        model = info["model"]
        return JSONResponse({"status": "ok", "model": model.get("source"), "version": model.get("version")})


# --------------------------------------------------------------------------- builder


def _deployment_kwargs(opts: S.DeploymentOptions, default_max_ongoing: int, access_log: bool = True) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus},
        "max_ongoing_requests": opts.max_ongoing_requests or default_max_ongoing,
        "logging_config": {"enable_access_log": access_log},
    }
    if opts.autoscaling.enabled:
        a = opts.autoscaling
        kwargs["autoscaling_config"] = {"min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
                                        "target_ongoing_requests": a.target_ongoing_requests}
    else:
        kwargs["num_replicas"] = opts.num_replicas
    return kwargs


def build_app(args: dict[str, Any] | None = None):
    """The Serve application for ``args`` (a :class:`hardpos.serving.ServeAppConfig` dict).

    Validates the config (``ConfigError`` naming the key), resolves the MLflow tracking URI
    and the bearer token digest here (in the process that builds the app) so every replica
    agrees, and binds ``ScoringAPI(ScoringModel)``. Loads nothing.
    """
    import ray.cloudpickle

    from hardpos import tracking

    cfg = S.load_app_config(args)
    if cfg.model.startswith(("runs:/", "models:/", "mlflow-artifacts:")):
        cfg = dataclasses.replace(cfg, tracking_uri=tracking.resolve_tracking_uri(cfg.tracking_uri))
    token = os.environ.get(cfg.auth_token_env) if cfg.auth_token_env else None
    digest = S.token_digest(token) if token else None
    # Ship this module's classes by value: replicas then need only the installed `hardpos`
    # package, not the repository's serve/ folder on their path.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # What can change without restarting replicas (reload_token, batching) travels only in the
    # model's user_config: a `serve deploy` that changes just those reconfigures in place.
    config = dataclasses.asdict(dataclasses.replace(cfg, reload_token="", batching=S.BatchingConfig(max_batch_size=1)))
    batch = cfg.batching.effective_max_batch_size
    model_kwargs = _deployment_kwargs(cfg.model_deployment, max(64, 2 * batch), cfg.access_log)
    model_kwargs["user_config"] = {"reload_token": cfg.reload_token, "batching": dataclasses.asdict(cfg.batching)}
    model = ScoringModel.options(name="ScoringModel", **model_kwargs).bind(config)
    # The ingress holds many requests in flight (they wait on the model), hence its higher cap.
    ingress_kwargs = _deployment_kwargs(cfg.ingress_deployment, max(256, 4 * batch), cfg.access_log)
    return ScoringAPI.options(name="ScoringAPI", **ingress_kwargs).bind(model, config, digest)

