"""The scoring app's typed configuration: what ``serve/config.yaml``'s ``args`` may hold.

:func:`load_app_config` turns that mapping into a :class:`ServeAppConfig` (unknown keys and
wrong types fail with :class:`hardpos.config.ConfigError` naming the key), so a typo fails
when the app is built, never in a replica. Pure dataclasses; nothing heavy is imported.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal

from hardpos.config import ConfigError, from_dict


@dataclasses.dataclass
class ServingLimits:
    """Input limits (every one is checked before any expensive work).

    max_image_bytes: largest encoded image accepted (after base64 decoding); larger -> 413.
    max_image_pixels: largest width*height accepted, read from the image header before
        decoding; larger -> 413 (this is the decompression-bomb guard).
    max_captions: most captions per image in one request; more -> 400.
    max_caption_chars: longest caption in characters; longer -> 400. Captions longer than
        the model's context length in tokens are also refused (400), never truncated.
    max_batch_items: most (image, captions) items in one ``/v1/score/batch`` request.
    max_body_bytes: largest HTTP request body read at all; larger -> 413.
    request_timeout_s: a request that the model has not answered in this time gets 503.
    formats: image formats Pillow may decode (others -> 400).
    """

    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 16_000_000
    max_captions: int = 64
    max_caption_chars: int = 1000
    max_batch_items: int = 64
    max_body_bytes: int = 64 * 1024 * 1024
    request_timeout_s: float = 30.0
    formats: list[str] = dataclasses.field(default_factory=lambda: ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])


@dataclasses.dataclass
class BatchingConfig:
    """Server-side batching of the model (:class:`hardpos.serve.batching.Batcher`).

    enabled: False runs every request alone (max batch size 1): the baseline.
    max_batch_size: most requests encoded in one forward pass.
    batch_wait_timeout_s: how long a batch that is not full waits for more requests before
        it runs. 0 (the default): a batch is whatever queued while the previous one ran, so
        an idle server adds no latency and batches grow with load by themselves. A few ms
        can help a steady load whose requests arrive just after each batch starts.
    forward_thread: False (the default) makes the replica one Python thread: the model's
        replicas start with Ray Serve's ``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``, so
        HTTP, the app's code and the forward pass share Ray's event loop; requests that
        arrive during a batch wait in the socket and all join the next one, and no thread
        waits for Python's GIL between the forward pass's kernels. The replica then answers
        nothing else (health, /v1/model) while a batch runs. True runs each forward pass in a
        worker thread, so the loop keeps admitting requests while a batch runs; on CPU it
        served less than one thread for both ViT-B-32 and the small demo model. Changing it
        restarts the model's replicas (the variable is read when a replica starts).
    """

    enabled: bool = True
    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.0
    forward_thread: bool = False

    @property
    def effective_max_batch_size(self) -> int:
        return self.max_batch_size if self.enabled else 1


@dataclasses.dataclass
class AutoscalingOptions:
    """Serve autoscaling (used instead of ``num_replicas`` when enabled).

    enabled: turn autoscaling on.
    min_replicas / max_replicas: replica bounds.
    target_ongoing_requests: requests per replica the autoscaler aims for.
    """

    enabled: bool = False
    min_replicas: int = 1
    max_replicas: int = 2
    target_ongoing_requests: float = 16.0


@dataclasses.dataclass
class DeploymentOptions:
    """Ray Serve options of one deployment.

    num_replicas: fixed replica count (ignored when autoscaling is enabled).
    num_cpus / num_gpus: ``ray_actor_options``; the model runs on GPU (bf16) when a GPU
        is assigned.
    resources: custom Ray resources each replica needs (``ray_actor_options.resources``),
        e.g. ``{worker_host: 1}`` to place replicas only on nodes started with that resource.
    max_ongoing_requests: per-replica concurrency; None -> max(64, 2 x max_batch_size)
        (it must be >= the max batch size or batches starve).
    autoscaling: see :class:`AutoscalingOptions`.
    health_check_period_s / health_check_timeout_s: how often Serve calls the replica's
        ``check_health`` and how long it waits (None: Serve's 10 s / 30 s). Serve marks a
        replica unhealthy after 3 failed checks in a row and replaces it.
    max_constructor_retry_count: replica start attempts (the first health check included)
        before Serve gives up on a new version: DEPLOY_FAILED (None: Serve's default, 3 per
        replica).
    """

    num_replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    max_ongoing_requests: int | None = None
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    max_constructor_retry_count: int | None = None
    autoscaling: AutoscalingOptions = dataclasses.field(default_factory=AutoscalingOptions)


@dataclasses.dataclass
class ServeAppConfig:
    """The scoring app (``hardpos.serve.app:build_app(args)``; ``args`` is this, as a dict).

    model: model source: ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` (MLflow
        registry), ``runs:/<id>/model``, a checkpoint directory (local or s3://), or an
        open_clip pretrained tag (with ``arch``).
    arch: architecture for open_clip tags / random weights (checkpoints carry their own).
    force_quick_gelu: None = automatic (see hardpos.models.clip).
    tracking_uri: MLflow tracking URI; None -> $MLFLOW_TRACKING_URI, else the local store
        (resolved when the app is built, so every replica uses the same one).
    reload_poll_s: every this many seconds each model replica checks whether the registry
        alias moved and, if so, loads the new version in the background and swaps it in
        (no downtime). 0 disables polling (``POST /v1/reload`` and user_config still work).
    reload_token: any change of this value (``serve deploy`` with a new user_config) makes
        every model replica reload in place.
    load_retries / load_retry_backoff_s: a replica that cannot load the model at start
        tries again this many times, waiting backoff x attempt seconds in between. After
        that its ``check_health`` fails with the reason, so the replica never starts: Serve
        retries it, then marks the deployment DEPLOY_FAILED (a RayService upgrade to a model
        that cannot load is never promoted) and the ingress answers 503 (404 for a model that
        does not exist) with that reason at once. A replica that is serving keeps its model
        through failed reloads and stays healthy.
    device: auto (GPU when one is assigned) | cpu | cuda.
    torch_threads: intra-op threads of the model's torch (None: Ray's default for the
        replica, OMP_NUM_THREADS = its num_cpus rounded, at least 1).
    bf16: bf16 autocast on GPU.
    text_cache_size: LRU entries of caption embeddings per replica (0 disables).
    access_log: Serve's per-request access log lines (off for load tests: they cost CPU).
    auth_token_env: environment variable holding the bearer token; when it is set (in the
        process that builds the app or in the ingress replica) every /v1 route needs
        ``Authorization: Bearer <token>`` (401 otherwise). /healthz stays open.
    limits / batching: see :class:`ServingLimits`, :class:`BatchingConfig`.
    model_deployment / ingress_deployment: Serve options of the model's deployment and (two
        deployments only) of the separate HTTP ingress.
    colocate_model: True (the default): ONE deployment, ``ScoringAPI``, whose replicas hold
        the model (FastAPI ingress + batching in one process; ``model_deployment``'s replicas,
        resources and user_config; ``ingress_deployment`` unused). False: two deployments, the
        ``ScoringAPI`` ingress (``ingress_deployment``) calling ``ScoringModel`` replicas
        through a handle. What two deployments give: HTTP handling scaled apart from the
        model, and an ingress that still answers, with the reason (404/503 at once), while no
        model replica can start; what they cost: a second hop and process per request, which
        measured slower at every load (docs/performance.md, "Serving").
    """

    model: str = "models:/hardpos-clip@champion"
    arch: str = "hardpos-tiny"
    force_quick_gelu: bool | None = None
    tracking_uri: str | None = None
    reload_poll_s: float = 30.0
    reload_token: str = ""
    load_retries: int = 2
    load_retry_backoff_s: float = 1.0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    torch_threads: int | None = None
    bf16: bool = True
    text_cache_size: int = 10_000
    access_log: bool = True
    auth_token_env: str = "HARDPOS_SERVE_TOKEN"
    limits: ServingLimits = dataclasses.field(default_factory=ServingLimits)
    batching: BatchingConfig = dataclasses.field(default_factory=BatchingConfig)
    model_deployment: DeploymentOptions = dataclasses.field(default_factory=DeploymentOptions)
    ingress_deployment: DeploymentOptions = dataclasses.field(default_factory=lambda: DeploymentOptions(num_cpus=0.5))
    colocate_model: bool = True


def load_app_config(args: dict[str, Any] | ServeAppConfig | None) -> ServeAppConfig:
    """Validate ``args`` (the Serve config's ``args`` mapping) into :class:`ServeAppConfig`.

    Raises :class:`hardpos.config.ConfigError` naming the bad key. Numeric sanity is checked
    here too (a zero byte limit would reject everything and look like a bug).
    """
    cfg = args if isinstance(args, ServeAppConfig) else from_dict(ServeAppConfig, dict(args or {}))
    lim = cfg.limits
    for key in ("max_image_bytes", "max_image_pixels", "max_captions", "max_caption_chars", "max_batch_items", "max_body_bytes"):
        if getattr(lim, key) <= 0:
            raise ConfigError(f"limits.{key} must be > 0, got {getattr(lim, key)}")
    if lim.request_timeout_s <= 0:
        raise ConfigError(f"limits.request_timeout_s must be > 0, got {lim.request_timeout_s}")
    if cfg.batching.max_batch_size < 1:
        raise ConfigError(f"batching.max_batch_size must be >= 1, got {cfg.batching.max_batch_size}")
    if cfg.batching.batch_wait_timeout_s < 0:
        raise ConfigError("batching.batch_wait_timeout_s must be >= 0")
    mor = cfg.model_deployment.max_ongoing_requests
    if mor is not None and mor < cfg.batching.effective_max_batch_size:
        raise ConfigError(
            f"model_deployment.max_ongoing_requests ({mor}) must be >= batching.max_batch_size "
            f"({cfg.batching.max_batch_size}), or batches can never fill")
    if cfg.text_cache_size < 0 or cfg.reload_poll_s < 0:
        raise ConfigError("text_cache_size and reload_poll_s must be >= 0")
    if cfg.load_retries < 0 or cfg.load_retry_backoff_s < 0:
        raise ConfigError("load_retries and load_retry_backoff_s must be >= 0")
    if cfg.torch_threads is not None and cfg.torch_threads < 1:
        raise ConfigError(f"torch_threads must be >= 1 (or null), got {cfg.torch_threads}")
    for name in ("model_deployment", "ingress_deployment"):
        opts = getattr(cfg, name)
        for key in ("health_check_period_s", "health_check_timeout_s", "max_constructor_retry_count"):
            value = getattr(opts, key)
            if value is not None and value <= 0:
                raise ConfigError(f"{name}.{key} must be > 0 (or null), got {value}")
        for res, amount in opts.resources.items():
            # Ray schedules CPU/GPU/memory through num_cpus / num_gpus, not ``resources``
            if res in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ConfigError(f"{name}.resources.{res}: set num_cpus / num_gpus instead")
            if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount <= 0:
                raise ConfigError(f"{name}.resources.{res} must be a number > 0, got {amount!r}")
    return cfg

