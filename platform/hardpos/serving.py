"""Ray-free pieces of the HardPos scoring service (``serve/app.py`` is the Ray edge).

Everything here is a pure function or a small thread-safe class, unit-tested without Ray:

* :class:`ServeAppConfig` -- the typed app configuration (``build_app(args)`` validates
  its ``args`` dict with :func:`hardpos.config.from_dict`, so a typo fails at build time).
* :class:`ServingError` -- an HTTP status + a specific message; raised for every bad input
  so the HTTP layer never answers 500 for a client mistake.
* :func:`decode_base64_image`, :func:`open_image` -- base64 and image decoding with byte and
  pixel limits checked *before* pixels are decoded (decompression bombs: a 100-byte PNG
  claiming 50k x 50k pixels is refused from its header).
* :func:`validate_captions`, :func:`check_token_lengths` -- caption list rules.
* :class:`LRUCache` -- the bounded text-embedding cache (captions repeat across requests).
* :class:`BatchStats` -- what batch sizes the model deployment actually ran.
* :func:`verdicts` -- DESIGN section 5 per-item verdicts (strict inequalities; ties count
  against the model).
* :func:`check_bearer`, :func:`classify_load_error`, :func:`softmax`.
* :func:`resolve_model`, :func:`current_version`, :func:`load_model` -- what a model replica
  loads, looked up in the config's ``tracking_uri`` only.

Status codes: 400 bad input, 401 missing/wrong bearer token, 404 unknown model,
413 image over the byte/pixel limit, 503 model not loaded / overloaded / timed out.
"""
from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import hashlib
import hmac
import io
import math
import threading
import warnings
from typing import Any, Callable, Hashable, Iterable, Literal, Sequence

# --------------------------------------------------------------------------- config


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
    """Server-side batching of the model deployment (``@serve.batch``).

    enabled: False runs every request alone (max batch size 1): the baseline.
    max_batch_size: most requests encoded in one forward pass.
    batch_wait_timeout_s: how long the first request of a batch waits for others. 0 (the
        default): a batch is whatever queued while the model was busy, so an idle server
        adds no latency and batches grow with load by themselves. Measured with
        ``python -m hardpos.loadgen`` (hardpos-tiny, 2 CPUs, batched/unbatched throughput
        at concurrency 1/8/32): 1.02x/1.06x/1.16x at 0 vs 0.70x/0.99x/1.23x at 5 ms. Raise
        it (a few ms) for steady high load, where it buys ~6% more throughput.
    """

    enabled: bool = True
    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.0

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
    max_ongoing_requests: per-replica concurrency; None -> max(64, 2 x max_batch_size)
        (it must be >= the max batch size or batches starve).
    autoscaling: see :class:`AutoscalingOptions`.
    """

    num_replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_ongoing_requests: int | None = None
    autoscaling: AutoscalingOptions = dataclasses.field(default_factory=AutoscalingOptions)


@dataclasses.dataclass
class ServeAppConfig:
    """The scoring app (``serve/app.py:build_app(args)``; ``args`` is this, as a dict).

    model: model source: ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` (MLflow
        registry), ``runs:/<id>/model``, a checkpoint directory (local or s3://), or an
        open_clip pretrained tag (with ``arch``).
    arch: architecture for open_clip tags / random weights (checkpoints carry their own).
    force_quick_gelu: None = automatic (see hardpos.model).
    tracking_uri: MLflow tracking URI; None -> $MLFLOW_TRACKING_URI, else the local store
        (resolved when the app is built, so every replica uses the same one).
    reload_poll_s: every this many seconds each model replica checks whether the registry
        alias moved and, if so, loads the new version in the background and swaps it in
        (no downtime). 0 disables polling (``POST /v1/reload`` and user_config still work).
    reload_token: any change of this value (``serve deploy`` with a new user_config) makes
        every model replica reload in place.
    device: auto (GPU when one is assigned) | cpu | cuda.
    bf16: bf16 autocast on GPU.
    text_cache_size: LRU entries of caption embeddings per replica (0 disables).
    access_log: Serve's per-request access log lines (off for load tests: they cost CPU).
    auth_token_env: environment variable holding the bearer token; when it is set (in the
        process that builds the app or in the ingress replica) every /v1 route needs
        ``Authorization: Bearer <token>`` (401 otherwise). /healthz stays open.
    limits / batching: see :class:`ServingLimits`, :class:`BatchingConfig`.
    model_deployment / ingress_deployment: Serve options of the two deployments.
    """

    model: str = "models:/hardpos-clip@champion"
    arch: str = "hardpos-tiny"
    force_quick_gelu: bool | None = None
    tracking_uri: str | None = None
    reload_poll_s: float = 30.0
    reload_token: str = ""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = True
    text_cache_size: int = 10_000
    access_log: bool = True
    auth_token_env: str = "HARDPOS_SERVE_TOKEN"
    limits: ServingLimits = dataclasses.field(default_factory=ServingLimits)
    batching: BatchingConfig = dataclasses.field(default_factory=BatchingConfig)
    model_deployment: DeploymentOptions = dataclasses.field(default_factory=DeploymentOptions)
    ingress_deployment: DeploymentOptions = dataclasses.field(default_factory=lambda: DeploymentOptions(num_cpus=0.5))


def load_app_config(args: dict[str, Any] | ServeAppConfig | None) -> ServeAppConfig:
    """Validate ``args`` (the Serve config's ``args`` mapping) into :class:`ServeAppConfig`.

    Raises :class:`hardpos.config.ConfigError` naming the bad key. Numeric sanity is checked
    here too (a zero byte limit would reject everything and look like a bug).
    """
    from hardpos.config import ConfigError, from_dict

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
    return cfg


# --------------------------------------------------------------------------- model loading
# Ray-free, so the replica's loading path is tested without Serve. The store is always the
# config's tracking_uri (build_app resolves it once, so every replica, in its own process and
# working directory, looks in the same store); MLflow's process-global URI is never set.


def resolve_model(cfg: ServeAppConfig) -> tuple[str, dict[str, Any]]:
    """(the exact URI to load, registry facts for ``/v1/model``).

    A registry alias is pinned to its version now (``models:/name/<version>``), so the
    version reported is the version loaded even if the alias moves meanwhile. Raises
    :class:`hardpos.registry.ModelNotFoundError` naming the store for an unknown model,
    alias or version.
    """
    from hardpos import registry, tracking

    source = cfg.model
    ref = registry.split_registry_uri(source)
    if ref is None:
        return source, {"source": source}
    store = tracking.resolve_tracking_uri(cfg.tracking_uri)
    mv = registry.model_version(store, ref)
    info: dict[str, Any] = {"source": source, "name": ref.name, "alias": ref.alias, "version": str(mv.version),
                            "run_id": mv.run_id, "tags": dict(mv.tags or {})}
    metrics: dict[str, float] = {}
    for key, value in (mv.tags or {}).items():
        if key.startswith("metric."):
            try:
                metrics[key[len("metric."):]] = float(value)
            except ValueError:
                pass
    if mv.run_id:
        try:
            run_metrics = registry.mlflow_client(store).get_run(mv.run_id).data.metrics
            metrics.update({k: v for k, v in run_metrics.items() if k not in metrics})
        except Exception:  # noqa: BLE001 - the run may live in another store; metrics are optional
            pass
    info["metrics"] = dict(sorted(metrics.items())[:500])
    pinned = f"models:/{ref.name}/{mv.version}" + (f"/{ref.path}" if ref.path else "")
    return pinned, info


def current_version(cfg: ServeAppConfig) -> str | None:
    """The version the configured alias points at now (None: the source is not an alias)."""
    from hardpos import registry, tracking

    ref = registry.split_registry_uri(cfg.model)
    if ref is None or ref.alias is None:
        return None
    return registry.alias_version(tracking.resolve_tracking_uri(cfg.tracking_uri), ref.name, ref.alias)


def load_model(cfg: ServeAppConfig, device: Any = "cpu") -> tuple[Any, dict[str, Any]]:
    """(the :class:`hardpos.model.LoadedModel` in eval mode, registry facts): what a model
    replica loads for ``cfg`` on ``device``. MLflow sources resolve in ``cfg.tracking_uri``."""
    from hardpos.model import ModelConfig, load_model as load

    uri, info = resolve_model(cfg)
    loaded = load(ModelConfig(arch=cfg.arch, pretrained=None if uri in ("", "random") else uri,
                              force_quick_gelu=cfg.force_quick_gelu),
                  device=device, tracking_uri=cfg.tracking_uri)
    loaded.model.eval()
    return loaded, info


# --------------------------------------------------------------------------- errors


class ServingError(Exception):
    """A request the service refuses: ``status`` (HTTP code) and a specific ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = int(status)
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.message}


def bad_request(message: str) -> ServingError:
    return ServingError(400, message)


# --------------------------------------------------------------------------- images


def decode_base64_image(data: Any, limits: ServingLimits, field: str = "image_b64") -> bytes:
    """Base64 text (optionally a ``data:image/...;base64,`` URL) -> image bytes.

    The decoded size is estimated from the text length first, so a huge payload is refused
    (413) without allocating it twice. Only inline data is accepted: a URL is refused (400),
    the service never fetches anything on a client's behalf.
    """
    if data is None:
        raise bad_request(f"{field} is missing: send the image as base64 text (or as a multipart file)")
    if not isinstance(data, str):
        raise bad_request(f"{field} must be a base64 string, got {type(data).__name__}")
    text = data.strip()
    if text.startswith("data:"):
        head, sep, rest = text.partition(",")
        if not sep or ";base64" not in head:
            raise bad_request(f"{field}: a data URL must look like data:image/png;base64,<data>")
        text = rest
    elif text.lower().startswith(("http://", "https://", "ftp://", "file:", "s3://", "gs://")):
        raise bad_request(f"{field}: URLs are not fetched by this service; send the image bytes as base64")
    if not text:
        raise bad_request(f"{field} is empty")
    # Whitespace/newlines (MIME-style wrapping) are tolerated; everything else must be base64.
    text = "".join(text.split())
    if len(text) * 3 // 4 > limits.max_image_bytes + 3:
        raise ServingError(413, f"{field}: image is about {len(text) * 3 // 4} bytes; the limit is {limits.max_image_bytes} bytes")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        try:  # URL-safe alphabet (-_) is common from browsers and JS clients
            raw = base64.urlsafe_b64decode(text) if ("-" in text or "_" in text) and "+" not in text and "/" not in text else None
        except (binascii.Error, ValueError):
            raw = None
        if raw is None:
            raise bad_request(f"{field} is not valid base64: {exc}") from None
    if not raw:
        raise bad_request(f"{field} decodes to zero bytes")
    return raw


def check_image_header(raw: bytes, limits: ServingLimits, field: str = "image") -> tuple[int, int]:
    """Cheap checks that decode no pixels: byte size (413), format from the header (400 when
    not an image), width x height against ``max_image_pixels`` (413: the decompression-bomb
    guard). Returns (width, height). The HTTP ingress runs this; the model replica decodes."""
    return _open_checked(raw, limits, field, decode=False).size


def open_image(raw: bytes, limits: ServingLimits, field: str = "image"):
    """Decode ``raw`` into an RGB :class:`PIL.Image.Image`, refusing oversized or bogus input.

    Order matters: byte size (413), then the header only (format allowlist, 400 when not an
    image), then width x height against ``max_image_pixels`` (413, before any pixel is
    decoded: the decompression-bomb guard), then the actual decode (400 when truncated or
    corrupt). Multi-frame images use their first frame.
    """
    return _open_checked(raw, limits, field, decode=True)


def _open_checked(raw: bytes, limits: ServingLimits, field: str, decode: bool = False):
    from PIL import Image, UnidentifiedImageError

    if len(raw) > limits.max_image_bytes:
        raise ServingError(413, f"{field} is {len(raw)} bytes; the limit is {limits.max_image_bytes} bytes")
    with warnings.catch_warnings():
        # Pillow's own bomb check warns between MAX_IMAGE_PIXELS and 2x: make it an error.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(raw), formats=[f.upper() for f in limits.formats])
        except UnidentifiedImageError:
            raise bad_request(
                f"{field}: the bytes are not a decodable image (accepted formats: {', '.join(limits.formats)})") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ServingError(413, f"{field}: refused as a decompression bomb ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - any header parse failure is the client's bytes
            raise bad_request(f"{field}: the bytes are not a readable image ({type(exc).__name__}: {exc})") from None
        width, height = img.size
        if width <= 0 or height <= 0:
            raise bad_request(f"{field}: image has an empty size {width}x{height}")
        if width * height > limits.max_image_pixels:
            raise ServingError(
                413, f"{field} is {width}x{height} = {width * height} pixels; the limit is {limits.max_image_pixels} pixels")
        if not decode:
            return img  # header parsed, no pixels decoded
        try:
            img.seek(0)
            img.load()
            rgb = img.convert("RGB")
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ServingError(413, f"{field}: refused as a decompression bomb ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - truncated / corrupt pixel data
            raise bad_request(f"{field}: the image data is truncated or corrupt ({type(exc).__name__}: {exc})") from None
    return rgb


# --------------------------------------------------------------------------- captions


def validate_caption(value: Any, limits: ServingLimits, field: str) -> str:
    """One caption: a non-empty string of at most ``max_caption_chars`` characters."""
    if value is None:
        raise bad_request(f"{field} is missing")
    if not isinstance(value, str):
        raise bad_request(f"{field} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise bad_request(f"{field} is an empty caption")
    if len(value) > limits.max_caption_chars:
        raise bad_request(f"{field} is too long: {len(value)} characters; the limit is {limits.max_caption_chars}")
    return value


def validate_captions(captions: Any, limits: ServingLimits, field: str = "captions") -> list[str]:
    """A caption list: present, a list, 1..``max_captions`` strings, each valid."""
    if captions is None:
        raise bad_request(f"{field} is missing: give a list of 1..{limits.max_captions} caption strings")
    if isinstance(captions, str) or not isinstance(captions, (list, tuple)):
        raise bad_request(f"{field} must be a list of strings, got {type(captions).__name__}")
    if len(captions) == 0:
        raise bad_request(f"{field} is empty: give 1..{limits.max_captions} captions")
    if len(captions) > limits.max_captions:
        raise bad_request(f"too many captions: {len(captions)} in {field}; the limit is {limits.max_captions}")
    return [validate_caption(c, limits, f"{field}[{i}]") for i, c in enumerate(captions)]


def token_count(tokenizer: Any, text: str) -> int | None:
    """Tokens ``text`` needs including start/end tokens, or None if the tokenizer cannot say."""
    encode = getattr(tokenizer, "encode", None)
    if encode is None:
        return None
    try:
        ids = encode(text)
    except Exception:  # noqa: BLE001 - HF tokenizers etc. have other signatures
        return None
    sot = getattr(tokenizer, "sot_token_id", None)
    return len(ids) + (2 if sot is not None else 0)


def check_token_lengths(tokenizer: Any, captions: Sequence[str], context_length: int, field: str = "captions") -> None:
    """400 for a caption that would be truncated by the model (scores would silently be of
    a shorter caption). Tokenizers that cannot count are not checked."""
    for i, caption in enumerate(captions):
        n = token_count(tokenizer, caption)
        if n is not None and n > context_length:
            raise bad_request(f"{field}[{i}] is too long: {n} tokens; this model's context length is {context_length}")


# --------------------------------------------------------------------------- cache / stats


class LRUCache:
    """A bounded, thread-safe least-recently-used map (``max_entries`` 0 disables it)."""

    def __init__(self, max_entries: int):
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = int(max_entries)
        self._data: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            self.misses += 1
            return default

    def put(self, key: Hashable, value: Any) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def stats(self) -> dict[str, Any]:
        total = self.hits + self.misses
        return {"entries": len(self._data), "max_entries": self.max_entries, "hits": self.hits,
                "misses": self.misses, "hit_rate": round(self.hits / total, 4) if total else 0.0}


def encode_with_cache(cache: LRUCache, keys: Sequence[Hashable], encode: Callable[[list], Sequence[Any]]) -> list[Any]:
    """Values for ``keys`` in order: cached ones from ``cache``, the distinct misses encoded
    with ONE ``encode(misses)`` call and stored. ``encode`` is not called when all hit."""
    out: list[Any] = [None] * len(keys)
    missing: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        value = cache.get(key)
        if value is None:
            missing.setdefault(key, []).append(i)
        else:
            out[i] = value
    if missing:
        todo = list(missing)
        values = encode(todo)
        if len(values) != len(todo):
            raise RuntimeError(f"encode returned {len(values)} values for {len(todo)} keys")
        for key, value in zip(todo, values):
            cache.put(key, value)
            for i in missing[key]:
                out[i] = value
    return out


class BatchStats:
    """Counts of the batch sizes a deployment ran (bounded: one counter per size)."""

    def __init__(self) -> None:
        self._sizes: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def record(self, size: int) -> None:
        with self._lock:
            self._sizes[int(size)] += 1

    def summary(self) -> dict[str, Any]:
        with self._lock:
            sizes = dict(self._sizes)
        batches = sum(sizes.values())
        items = sum(k * v for k, v in sizes.items())
        return {
            "batches": batches,
            "items": items,
            "max_batch_size_seen": max(sizes) if sizes else 0,
            "mean_batch_size": round(items / batches, 3) if batches else 0.0,
            "histogram": {str(k): sizes[k] for k in sorted(sizes)},
        }


# --------------------------------------------------------------------------- scores


def softmax(scores: Sequence[float], scale: float) -> list[float]:
    """softmax(scale * scores): the model's own caption distribution (CLIP's logits)."""
    if not scores:
        return []
    logits = [scale * float(s) for s in scores]
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    total = sum(exps)
    return [e / total for e in exps]


def verdicts(s_c: float, s_n: float, s_p: float | None = None) -> dict[str, bool | None]:
    """DESIGN section 5 for one item (strict inequalities; a tie counts against the model).

    correct_original = s_c > s_n; correct_augmented = s_c > s_n and s_p > s_n;
    brittle = (s_c > s_n > s_p) or (s_p > s_n > s_c). Without a hard positive the last two
    are None.
    """
    out: dict[str, bool | None] = {"correct_original": s_c > s_n}
    if s_p is None:
        out.update(correct_augmented=None, brittle=None)
    else:
        out["correct_augmented"] = s_c > s_n and s_p > s_n
        out["brittle"] = (s_c > s_n > s_p) or (s_p > s_n > s_c)
    return out


# --------------------------------------------------------------------------- auth / load errors


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_bearer(authorization: str | None, expected_digest: str | None) -> None:
    """401 unless ``authorization`` is ``Bearer <token>`` with sha256(token) == expected.

    ``expected_digest`` None means auth is off. Only the digest is kept in memory and in the
    Serve config, compared in constant time.
    """
    if not expected_digest:
        return
    if not authorization:
        raise ServingError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ServingError(401, "malformed Authorization header: expected 'Bearer <token>'")
    if not hmac.compare_digest(token_digest(token.strip()), expected_digest):
        raise ServingError(401, "invalid bearer token")


def classify_load_error(source: str, exc: BaseException) -> ServingError:
    """A model that cannot be loaded: 404 when it does not exist (unknown registered model,
    alias, version, path or tag), 503 when it exists but cannot be loaded."""
    from hardpos.registry import ModelNotFoundError

    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "error_code", "") or ""
    lowered = text.lower()
    missing = (
        isinstance(exc, (FileNotFoundError, ModelNotFoundError))
        or "RESOURCE_DOES_NOT_EXIST" in str(code)
        or any(s in lowered for s in ("not found", "does not exist", "no such", "unknown model", "not registered"))
    )
    if missing:
        return ServingError(404, f"model {source!r} not found: {text}"[:2000])
    return ServingError(503, f"model {source!r} could not be loaded: {text}"[:2000])


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# --------------------------------------------------------------------------- request payloads
# The HTTP layer parses JSON itself (instead of letting FastAPI answer 422 with a generic
# schema dump) so each listed mistake gets 400 and a message naming the exact field.

SCORE_FIELDS = {"image_b64", "captions", "softmax"}
COMPARE_FIELDS = {"image_b64", "caption", "hard_negative", "hard_positive"}
BATCH_FIELDS = {"items", "softmax"}
BATCH_ITEM_FIELDS = {"image_b64", "captions"}


def _check_object(payload: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise bad_request(f"{where} must be a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise bad_request(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")
    return payload


def parse_flag(value: Any, field: str) -> bool:
    """A boolean field (JSON true/false; multipart 'true'/'false'/'1'/'0')."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no", ""):
        return value.strip().lower() in ("true", "1", "yes")
    raise bad_request(f"{field} must be a boolean, got {value!r}"[:300])


def parse_json_body(body: bytes) -> Any:
    """Request bytes -> JSON value; 400 naming the position of a syntax error."""
    import json

    if not body.strip():
        raise bad_request("the request body is empty: send a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def parse_score_payload(payload: Any, limits: ServingLimits) -> tuple[bytes, list[str], bool]:
    """``{"image_b64", "captions", "softmax"?}`` -> (image bytes, captions, softmax)."""
    payload = _check_object(payload, SCORE_FIELDS, "request")
    captions = validate_captions(payload.get("captions"), limits)
    image = decode_base64_image(payload.get("image_b64"), limits)
    return image, captions, parse_flag(payload.get("softmax"), "softmax")


def parse_compare_payload(payload: Any, limits: ServingLimits) -> tuple[bytes, list[str]]:
    """``{"image_b64", "caption", "hard_negative", "hard_positive"?}`` -> (image, [c, n(, p)])."""
    payload = _check_object(payload, COMPARE_FIELDS, "request")
    texts = [validate_caption(payload.get("caption"), limits, "caption"),
             validate_caption(payload.get("hard_negative"), limits, "hard_negative")]
    if payload.get("hard_positive") is not None:
        texts.append(validate_caption(payload["hard_positive"], limits, "hard_positive"))
    return decode_base64_image(payload.get("image_b64"), limits), texts


def parse_batch_payload(payload: Any, limits: ServingLimits) -> tuple[list[tuple[bytes, list[str]] | ServingError], bool]:
    """``{"items": [{"image_b64", "captions"}, ...], "softmax"?}``.

    The envelope must be valid (400 otherwise); each item is parsed on its own and a bad
    item becomes a :class:`ServingError` in its slot (a per-row reject), so one bad row
    neither fails nor silently drops the others.
    """
    payload = _check_object(payload, BATCH_FIELDS, "request")
    items = payload.get("items")
    if items is None:
        raise bad_request(f"items is missing: give a list of 1..{limits.max_batch_items} {{image_b64, captions}} objects")
    if not isinstance(items, list):
        raise bad_request(f"items must be a list, got {type(items).__name__}")
    if not items:
        raise bad_request("items is empty")
    if len(items) > limits.max_batch_items:
        raise bad_request(f"too many items: {len(items)}; the limit is {limits.max_batch_items}")
    parsed: list[tuple[bytes, list[str]] | ServingError] = []
    for i, item in enumerate(items):
        try:
            item = _check_object(item, BATCH_ITEM_FIELDS, f"items[{i}]")
            caps = validate_captions(item.get("captions"), limits, f"items[{i}].captions")
            parsed.append((decode_base64_image(item.get("image_b64"), limits, f"items[{i}].image_b64"), caps))
        except ServingError as exc:
            parsed.append(exc)
    return parsed, parse_flag(payload.get("softmax"), "softmax")
