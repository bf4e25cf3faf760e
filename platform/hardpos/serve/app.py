"""The HardPos scoring app on Ray Serve: raw CLIP cosine scores over HTTP.

``build_app(args) -> Application`` is the Serve application builder (``args`` is a
:class:`hardpos.serve.config.ServeAppConfig` as a dict); importing this module loads nothing.

    RAY_SERVE_ENABLE_HA_PROXY=1 serve run serve/config.yaml       # from the repository root
    serve run hardpos.serve.app:build_app model=models:/hardpos-clip@champion

One deployment by default: ``ScoringAPI``, the FastAPI ingress defined here, whose replicas
hold the model (:class:`hardpos.serve.deployment.ScoringModel`'s code: loads the model,
batches, reloads without downtime), so a request takes one hop, HAProxy (or Serve's Python
proxy: the cluster's choice, :mod:`hardpos.serve.ingress`) to the replica. The ingress does input validation (the request models of
:mod:`hardpos.serve.schemas`, which also draw ``/docs`` and ``/openapi.json``, the contract
with the app's configured limits; 400/413 with messages naming the field,
:mod:`hardpos.serve.requests`), optional bearer auth and a request timeout (503, never a
hang). With ``colocate_model: false`` it is two deployments instead: this ingress calls
``ScoringModel`` replicas through a handle (when the model deployment failed to deploy
because no model could be loaded, the ingress answers 503/404 with Serve's reason at once),
and ``/v1/score/batch`` items fan out so they batch on the model deployment.

Routes: ``POST /v1/score`` (JSON with base64, or multipart upload), ``POST /v1/score/batch``,
``POST /v1/compare``, ``GET /v1/model``, ``POST /v1/reload``, ``GET /healthz``; OpenAPI at
``/docs``.

Everything lives in the installed ``hardpos`` package, so Serve replicas import it like any
other library module: no ``PYTHONPATH`` entry and no pickling by value are needed.
"""
# No `from __future__ import annotations`: Serve re-registers the class-based FastAPI routes and
# must see real annotations (a string "Request" becomes a required query parameter).

import asyncio
import dataclasses
import os
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from hardpos.config.paths import resolve_tracking_uri
from hardpos.eval.metrics import verdicts
from hardpos.serve.config import BatchingConfig, DeploymentOptions, load_app_config
from hardpos.serve.deployment import USER_CODE_THREAD_ENV, ScoringModel
from hardpos.serve.docs import add_offline_docs
from hardpos.serve.errors import ServingError, check_bearer, token_digest
from hardpos.serve.requests import (check_image_header, is_multipart, parse_batch_payload, parse_compare_payload,
                                    parse_flag_query, parse_json_body, parse_score_payload, read_body, read_multipart)
from hardpos.serve.schemas import (BatchRequest, BatchResponse, CompareForm, CompareRequest, CompareResponse,
                                   HealthResponse, ScoreForm, ScoreRequest, ScoreResponse, contract_document,
                                   error_responses, json_body, json_or_multipart, set_contract, validation_message)
from hardpos.serve.scoring import StageTimes, softmax as softmax_probs

__all__ = ["ScoringAPI", "ScoringModel", "api", "build_app", "model_replica_env"]

MODEL_DEPLOYMENT = "ScoringModel"
PROBE_AFTER_S = 2.0  # a model call slower than this asks Serve whether the model deployment failed
PROBE_CACHE_S = 2.0
_NO_MODEL = re.compile(r"no model loaded \((\d{3})\): ([^\n]+)")

# --------------------------------------------------------------------------- ingress

api = FastAPI(
    title="HardPos scoring API",
    version="1",
    description=(
        "Raw CLIP cosine scores for image-caption pairs from the registered HardPos model. "
        "Scores are NOT calibrated across models: hard-negative finetuning lowers the absolute "
        "score of correct captions, which this API shows as it is. Errors: 400 bad input, "
        "401 auth, 404 unknown model, 413 image too large, 415 multipart unavailable, 503 model "
        "unavailable or timed out; every one with a JSON body {\"detail\": \"...\"}. Captions are "
        "also refused (400) when longer than the model's context length in tokens."
    ),
    docs_url=None,  # the CDN page; add_offline_docs serves Swagger UI from the package instead
    redoc_url=None,
    # /openapi.json is ScoringAPI.openapi_json: the document with the running app's limits and auth
    openapi_url=None,
)
BODY_ERRORS = error_responses(400, 401, 404, 413, 415, 503)  # routes that read an image (JSON or multipart)
MODEL_ERRORS = error_responses(401, 404, 503)  # routes that only ask the model
add_offline_docs(api)


@api.exception_handler(ServingError)
async def _serving_error(_: Request, exc: ServingError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=headers)


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    # Only declared parameters (/v1/reload's query) reach this: the body routes validate their
    # bodies themselves (hardpos.serve.requests), with the same messages.
    errors = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in exc.errors()]  # ("query", "force") -> force
    return JSONResponse({"detail": validation_message(errors)}, status_code=400)


@api.get("/openapi.json", include_in_schema=False)
async def _openapi_json() -> JSONResponse:
    """The contract of this app as configured: its limits as maxItems/maxLength, bearer auth
    as a security scheme when it is on (what schemathesis fuzzes in the tests). A module
    route, so the bare FastAPI app (``/docs`` without Serve) serves it too."""
    return JSONResponse(contract_document(api.openapi()))


async def _await(response: Any) -> Any:
    return await response


# --------------------------------------------------------------------------- ingress


@serve.deployment
@serve.ingress(api)
class ScoringAPI:
    """HTTP front door: validates, authenticates, times out, and calls ``ScoringModel``."""

    def __init__(self, model_handle, config: dict[str, Any], auth_digest: str | None = None):
        self.cfg = load_app_config(config)
        self.limits = self.cfg.limits
        self.model = model_handle
        # colocate_model: no handle; the model lives in this replica (no hop to another one).
        self.local = ScoringModel.func_or_class(config) if model_handle is None else None
        self._probe: tuple[float, tuple[int, str] | None] | None = None  # (when, _model_failure())
        token = os.environ.get(self.cfg.auth_token_env) if self.cfg.auth_token_env else None
        # (Serve freezes a copy of `api` at decoration time, so auth state lives here.)
        self.auth_digest = token_digest(token) if token else auth_digest
        set_contract(self.limits, auth=bool(self.auth_digest))  # what /openapi.json states
        self.times = StageTimes()

    def _auth(self, request: Request) -> None:
        check_bearer(request.headers.get("authorization"), self.auth_digest)

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve calls this only with colocate_model (the model's user_config is ours then)."""
        if self.local is not None:
            await self.local.reconfigure(user_config)

    async def check_health(self) -> None:
        """With colocate_model, the model's health is this replica's health."""
        if self.local is not None:
            await self.local.check_health()

    async def _call(self, method: str, *args: Any) -> Any:
        if self.local is not None:
            try:
                return await asyncio.wait_for(getattr(self.local, method)(*args), timeout=self.limits.request_timeout_s)
            except asyncio.TimeoutError:
                raise ServingError(503, f"the model did not answer within {self.limits.request_timeout_s:g} s; retry later") from None
        response = getattr(self.model, method).remote(*args)
        task = asyncio.ensure_future(_await(response))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.request_timeout_s
        try:
            # A slow answer may mean no model replica can start (it fails its health check
            # until a model loads): then Serve's status says why, and the client hears it now
            # instead of after the full timeout.
            done, _ = await asyncio.wait({task}, timeout=min(PROBE_AFTER_S, self.limits.request_timeout_s))
            while not done:
                why = await self._model_failure()
                if why is not None:
                    raise ServingError(*why)
                left = deadline - loop.time()
                if left <= 0:
                    raise ServingError(503, f"the model did not answer within {self.limits.request_timeout_s:g} s; retry later")
                done, _ = await asyncio.wait({task}, timeout=min(PROBE_AFTER_S, left))
            return task.result()
        except ServingError:
            task.cancel()
            response.cancel()
            raise
        except DeploymentUnavailableError:
            why = await self._model_failure()
            raise ServingError(*(why or (503, "the model deployment failed to deploy (no model could be loaded)"))) from None
        except BackPressureError:
            raise ServingError(503, "the model deployment is at capacity (max_ongoing_requests); retry later") from None
        except RayActorError as exc:  # replica died / restarting: the client should retry, not see a 500
            raise ServingError(503, f"the model replica is unavailable ({type(exc).__name__}); retry later") from None

    async def _model_failure(self) -> tuple[int, str] | None:
        """(status, message) when Serve reports that the model deployment cannot load its
        model (the replica's failed health check names the status and the load error); None
        when it says nothing of the kind. Asked only about slow or failed calls, and cached
        for PROBE_CACHE_S so a burst of slow requests costs one controller call."""
        now = asyncio.get_running_loop().time()
        if self._probe is not None and now - self._probe[0] < PROBE_CACHE_S:
            return self._probe[1]
        try:
            app = serve.get_replica_context().app_name
            dep = (await asyncio.to_thread(serve.status)).applications[app].deployments[MODEL_DEPLOYMENT]
            status = str(getattr(dep.status, "value", dep.status))
            found = _NO_MODEL.search(dep.message or "") if status != "HEALTHY" else None
            why = (int(found.group(1)), f"no model is loaded (model deployment {status}): {found.group(2).strip()}"
                   ) if found else None
        except Exception:  # noqa: BLE001 - the controller is unreachable: no reason to give
            why = None
        self._probe = (now, why)
        return why

    async def _score_one(self, image: bytes, captions: list[str]) -> dict[str, Any]:
        # Header checks here (size, format, pixel count: no pixels decoded) keep oversized and
        # non-image input away from the model replicas; the replica decodes once, and reports a
        # truncated/corrupt image as this item's 400.
        check_image_header(image, self.limits)
        with self.times.time("ingress_model_call"):  # the hop to the model replica and back, and its work
            return await self._call("score", image, captions)

    @staticmethod
    def _raise_item_error(result: dict[str, Any]) -> None:
        if "error" in result:
            raise ServingError(result["error"]["status"], result["error"]["detail"])

    @api.post("/v1/score", response_model=ScoreResponse, responses=BODY_ERRORS,
              openapi_extra=json_or_multipart(ScoreRequest, ScoreForm), summary="Score one image against 1..N captions")
    async def score(self, request: Request) -> dict[str, Any]:
        with self.times.time("ingress"):
            return await self._score_request(request)

    async def _score_request(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        if is_multipart(request):
            upload, fields = await read_multipart(request, self.limits, ScoreForm)
            image, captions, want_probs = parse_score_payload(fields, self.limits, image=upload)
        else:
            with self.times.time("ingress_parse"):
                body = await read_body(request, self.limits.max_body_bytes)
                image, captions, want_probs = parse_score_payload(parse_json_body(body), self.limits)
        result = await self._score_one(image, captions)
        self._raise_item_error(result)
        probs = softmax_probs(result["scores"], result["logit_scale"]) if want_probs else None
        return {"model": result["model"], "scores": result["scores"], "probs": probs, "logit_scale": result["logit_scale"]}

    @api.post("/v1/score/batch", response_model=BatchResponse, responses=error_responses(400, 401, 404, 413, 503),
              openapi_extra=json_body(BatchRequest),
              summary="Score many (image, captions) items; a bad item is rejected on its own")
    async def score_batch(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        body = await read_body(request, self.limits.max_body_bytes)
        items, want_probs = parse_batch_payload(parse_json_body(body), self.limits)

        async def one(item):
            if isinstance(item, ServingError):
                return {"error": item.to_dict()}
            try:
                return await self._score_one(*item)
            except ServingError as exc:
                if exc.status in (400, 413):
                    return {"error": exc.to_dict()}
                raise  # 503/404 concern the whole request

        results = await asyncio.gather(*(one(item) for item in items))
        model_errors = [r["error"] for r in results if "error" in r and r["error"]["status"] in (404, 503)]
        if model_errors and len(model_errors) == len(results):
            raise ServingError(model_errors[0]["status"], model_errors[0]["detail"])
        out, model_ref = [], None
        for i, r in enumerate(results):
            if "error" in r:
                out.append({"index": i, "error": r["error"]})
            else:
                model_ref = r["model"]
                out.append({"index": i, "scores": r["scores"],
                            "probs": softmax_probs(r["scores"], r["logit_scale"]) if want_probs else None})
        n_ok = sum(1 for r in out if "error" not in r)
        return {"model": model_ref, "results": out, "n_ok": n_ok, "n_rejected": len(out) - n_ok}

    @api.post("/v1/compare", response_model=CompareResponse, responses=BODY_ERRORS,
              openapi_extra=json_or_multipart(CompareRequest, CompareForm),
              summary="caption vs hard negative (vs hard positive): scores and the paper's per-item verdicts")
    async def compare(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        if is_multipart(request):
            upload, fields = await read_multipart(request, self.limits, CompareForm)
            image, texts = parse_compare_payload(fields, self.limits, image=upload)
        else:
            body = await read_body(request, self.limits.max_body_bytes)
            image, texts = parse_compare_payload(parse_json_body(body), self.limits)
        result = await self._score_one(image, texts)
        self._raise_item_error(result)
        s = result["scores"]
        names = ["caption", "hard_negative", "hard_positive"][: len(s)]
        return {"model": result["model"], "scores": dict(zip(names, s)),
                **verdicts(s[0], s[1], s[2] if len(s) > 2 else None)}

    @api.get("/v1/model", responses=MODEL_ERRORS,
             summary="The loaded model, its registered metrics, batching and cache stats")
    async def model_info(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        info = await self._call("info")
        info["limits"] = dataclasses.asdict(self.limits)
        info["ingress_timing"] = self.times.snapshot()
        return info

    @api.post("/v1/reload", responses={**error_responses(400), **MODEL_ERRORS},
              openapi_extra={"parameters": [{"name": "force", "in": "query", "required": False,
                                             "schema": {"type": "boolean", "default": False},
                                             "description": "true: reload even if the alias did not move"}]},
              summary="Reload if the registry alias moved (force=true: reload anyway). Reaches one model replica; "
                      "the others follow within reload_poll_s")
    async def reload(self, request: Request) -> dict[str, Any]:
        self._auth(request)
        return await self._call("reload", parse_flag_query(request.query_params.getlist("force"), "force"))

    @api.get("/healthz", response_model=HealthResponse, response_model_exclude_none=True,
             responses={503: {"model": HealthResponse, "description": "no model is loaded: detail says why"}},
             summary="200 when a model is loaded, else 503 with the reason")
    async def healthz(self) -> JSONResponse:
        try:
            info = await self._call("info")
        except ServingError as exc:
            return JSONResponse({"status": "unavailable", "detail": exc.message}, status_code=503)
        if not info.get("loaded"):
            err = info.get("error") or {"detail": "model is not loaded yet"}
            return JSONResponse({"status": "unavailable", "detail": err["detail"]}, status_code=503)
        model = info["model"]
        return JSONResponse({"status": "ok", "model": model.get("source"), "version": model.get("version")})


# --------------------------------------------------------------------------- builder


def _deployment_kwargs(opts: DeploymentOptions, default_max_ongoing: int, access_log: bool = True) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus,
                              **({"resources": dict(opts.resources)} if opts.resources else {})},
        "max_ongoing_requests": opts.max_ongoing_requests or default_max_ongoing,
        "logging_config": {"enable_access_log": access_log},
    }
    for key in ("health_check_period_s", "health_check_timeout_s", "max_constructor_retry_count"):
        if getattr(opts, key) is not None:
            kwargs[key] = getattr(opts, key)
    if opts.autoscaling.enabled:
        a = opts.autoscaling
        kwargs["autoscaling_config"] = {"min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
                                        "target_ongoing_requests": a.target_ongoing_requests}
    else:
        kwargs["num_replicas"] = opts.num_replicas
    return kwargs


def model_replica_env(batching: BatchingConfig) -> dict[str, str]:
    """Environment of the replicas that hold the model: with ``forward_thread: false`` Ray
    Serve runs the app's code on its own event loop (one Python thread for HTTP, the app and
    the forward pass) instead of a loop in a second thread. Read by Ray when a replica starts,
    so it travels in ``ray_actor_options`` (a change restarts the replicas), not user_config.
    Constant values of Ray's own switches: nothing of the driver's environment."""
    return {} if batching.forward_thread else {USER_CODE_THREAD_ENV: "0"}


def build_app(args: dict[str, Any] | None = None):
    """The Serve application for ``args`` (a :class:`hardpos.serve.config.ServeAppConfig` dict).

    Validates the config (``ConfigError`` naming the key), resolves the MLflow tracking URI
    and the bearer token digest here (in the process that builds the app) so every replica
    agrees, and binds ``ScoringAPI`` holding the model (one deployment, the default) or
    ``ScoringAPI(ScoringModel)`` (``colocate_model: false``). Loads nothing.
    """
    cfg = load_app_config(args)
    if cfg.model.startswith(("runs:/", "models:/", "mlflow-artifacts:")):
        cfg = dataclasses.replace(cfg, tracking_uri=resolve_tracking_uri(cfg.tracking_uri))
    token = os.environ.get(cfg.auth_token_env) if cfg.auth_token_env else None
    digest = token_digest(token) if token else None
    # What can change without restarting replicas (reload_token, batching) travels only in the
    # model's user_config: a `serve deploy` that changes just those reconfigures in place.
    config = dataclasses.asdict(dataclasses.replace(cfg, reload_token="", batching=BatchingConfig(max_batch_size=1)))
    batch = cfg.batching.effective_max_batch_size
    model_kwargs = _deployment_kwargs(cfg.model_deployment, max(64, 2 * batch), cfg.access_log)
    if model_replica_env(cfg.batching):  # Serve merges it into the app's runtime_env (its env_vars kept)
        model_kwargs["ray_actor_options"]["runtime_env"] = {"env_vars": model_replica_env(cfg.batching)}
    model_kwargs["user_config"] = {"reload_token": cfg.reload_token, "batching": dataclasses.asdict(cfg.batching)}
    if cfg.colocate_model:  # one deployment: the ingress holds the model (its replicas, resources, user_config)
        model_kwargs["max_ongoing_requests"] = cfg.model_deployment.max_ongoing_requests or max(256, 4 * batch)
        return ScoringAPI.options(name="ScoringAPI", **model_kwargs).bind(None, config, digest)
    model = ScoringModel.options(name=MODEL_DEPLOYMENT, **model_kwargs).bind(config)
    # The ingress holds many requests in flight (they wait on the model), hence its higher cap.
    ingress_kwargs = _deployment_kwargs(cfg.ingress_deployment, max(256, 4 * batch), cfg.access_log)
    return ScoringAPI.options(name="ScoringAPI", **ingress_kwargs).bind(model, config, digest)

