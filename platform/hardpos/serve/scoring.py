"""What a model replica does, without Ray: load the configured model, cache caption
embeddings, score a batch, and turn scores into the paper's per-item verdicts.

* :func:`load_model`, :func:`current_version` -- the model a replica loads and the version
  its alias points at now, looked up in the config's ``tracking_uri`` only (the registry
  work is :func:`hardpos.models.uri.pin_model_uri`; MLflow's global URI is never set).
* :class:`ModelState`, :func:`load_state`, :func:`compute_batch` -- one loaded version and one batched forward
  pass over it (a bad item gets its own error; it never fails the batch).
* :class:`LRUCache`, :func:`encode_with_cache` -- the bounded text-embedding cache.
* :class:`BatchStats` -- what batch sizes the deployment actually ran.
* :class:`StageTimes` -- cumulative seconds per stage (parse, model call, decode, forward):
  where a request's time goes, read from ``/v1/model`` by the load generator.
* :func:`softmax`; the app's per-item verdicts are :func:`hardpos.eval.metrics.verdicts`:
  one definition, the benchmark's.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import threading
import time
from typing import Any, Callable, Hashable, Iterable, Sequence

from hardpos.config import ModelConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.models.uri import current_alias_version, pin_model_uri, split_registry_uri
from hardpos.serve.config import ServeAppConfig, ServingLimits
from hardpos.serve.errors import ServingError
from hardpos.serve.requests import open_image

# --------------------------------------------------------------------------- model loading


def _store(cfg: ServeAppConfig) -> str:
    return resolve_tracking_uri(cfg.tracking_uri)


def load_model(cfg: ServeAppConfig, device: Any = "cpu") -> tuple[Any, dict[str, Any]]:
    """(the :class:`hardpos.models.clip.LoadedModel` in eval mode, registry facts for ``/v1/model``):
    what a model replica loads for ``cfg`` on ``device``.

    A registry alias is pinned to its current version first, so the facts name the version
    actually loaded. MLflow sources resolve in ``cfg.tracking_uri`` (None: the environment's
    store). Raises :class:`hardpos.models.uri.ModelNotFoundError` for an unknown model.
    """
    # lazy: torch and open_clip load where a model does (a model replica), not in an ingress
    # replica that only imports this module through the app (seconds and memory per replica)
    from hardpos.models.clip import load_model as _load_model  # this module's load_model wraps it

    if split_registry_uri(cfg.model) is None:
        uri, info = cfg.model, {"source": cfg.model}  # no store needed (checkpoint, tag, runs:/)
    else:
        uri, info = pin_model_uri(cfg.model, _store(cfg))
    loaded = _load_model(ModelConfig(arch=cfg.arch, pretrained=None if uri in ("", "random") else uri,
                              force_quick_gelu=cfg.force_quick_gelu),
                  device=device, tracking_uri=cfg.tracking_uri)
    loaded.model.eval()
    return loaded, info


def current_version(cfg: ServeAppConfig) -> str | None:
    """The version the configured alias points at now (None: the source is not an alias)."""
    if split_registry_uri(cfg.model) is None:
        return None
    return current_alias_version(cfg.model, _store(cfg))


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



class StageTimes:
    """Cumulative wall seconds and counts per named stage (thread-safe, bounded by the
    number of stage names). ``snapshot()`` of two moments, subtracted, gives the mean time
    per stage over a load test: the server-side half of a latency profile."""

    def __init__(self) -> None:
        self._seconds: collections.Counter[str] = collections.Counter()
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def add(self, stage: str, seconds: float, count: int = 1) -> None:
        with self._lock:
            self._seconds[stage] += float(seconds)
            self._counts[stage] += int(count)

    @contextlib.contextmanager
    def time(self, stage: str, count: int = 1):
        """Add the wall time of the ``with`` body to ``stage``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - t0, count)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{stage: {"s": total seconds, "n": count}}``."""
        with self._lock:
            return {k: {"s": round(self._seconds[k], 6), "n": self._counts[k]} for k in sorted(self._seconds)}


def stage_means_ms(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean milliseconds per stage between two :meth:`StageTimes.snapshot` results."""
    out = {}
    for stage, now in after.items():
        was = before.get(stage, {"s": 0.0, "n": 0})
        n = now["n"] - was["n"]
        if n > 0:
            out[stage] = round(1000.0 * (now["s"] - was["s"]) / n, 3)
    return out


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


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    """Consecutive slices of ``items`` of at most ``size`` elements."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


# --------------------------------------------------------------------------- batched scoring


@dataclasses.dataclass
class ModelState:
    """One loaded model version; a replica swaps it as a whole on reload, so a batch always
    scores with a single version (scores never mix versions)."""

    loaded: Any
    device: Any
    autocast_bf16: bool
    cache: LRUCache
    info: dict[str, Any]
    logit_scale: float


def load_state(cfg: ServeAppConfig, want_cuda: bool) -> ModelState:
    """Load ``cfg``'s model as a :class:`ModelState` on the GPU (``want_cuda``) or the CPU:
    what a Serve replica and the plain peer server (``benchmarks/plain_server.py``) both run."""
    import torch  # lazy: see load_model

    if want_cuda and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is visible to this replica")
    device = torch.device("cuda" if want_cuda else "cpu")
    loaded, info = load_model(cfg, device)
    info.update(arch=loaded.arch, device=str(device), bf16=bool(want_cuda and cfg.bf16),
                context_length=loaded.context_length, loaded_at=time.time())
    scale = float(loaded.model.logit_scale.exp().item()) if hasattr(loaded.model, "logit_scale") else 100.0
    return ModelState(loaded, device, bool(want_cuda and cfg.bf16), LRUCache(cfg.text_cache_size), info, scale)


def compute_batch(state: ModelState, items: list[tuple[bytes, list[str]]], limits: ServingLimits,
                  times: StageTimes | None = None) -> list[dict[str, Any]]:
    """Score a batch with ONE model state: one image forward, one forward for uncached captions.

    Returns, per item in order, ``{"scores": [cosine per caption], "logit_scale", "model"}``
    or ``{"error": {"status", "detail"}}``: a bad item gets its own error, never the batch.
    ``times`` (optional) gets ``decode`` (image decode + preprocessing) and ``forward``
    (towers, cache look-ups, similarities) seconds, counted per item (a batch's forward is
    shared by its items, so batching lowers the per-item mean).
    """
    import torch  # lazy: see load_model

    from hardpos.models.clip import encode_image, encode_text, trim_tokens

    times = times or StageTimes()
    t0 = time.perf_counter()
    results: list[dict[str, Any] | None] = [None] * len(items)
    tensors, ok = [], []
    for i, (raw, _) in enumerate(items):
        try:
            img = open_image(raw, limits)
            tensors.append(state.loaded.preprocess_val(img))
            ok.append(i)
        except ServingError as exc:
            results[i] = {"error": exc.to_dict()}
        except Exception as exc:  # noqa: BLE001 - a preprocessing failure is this item's problem only
            results[i] = {"error": {"status": 400, "detail": f"image could not be preprocessed: {type(exc).__name__}: {exc}"}}
    t1 = time.perf_counter()
    times.add("decode", t1 - t0, len(items))
    if not ok:
        return results  # type: ignore[return-value]
    model, device = state.loaded.model, state.device
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if state.autocast_bf16 else contextlib.nullcontext()

    def encode_captions(texts: list[str]) -> list[torch.Tensor]:
        # Length-sorted chunks keep each forward trimmed to its own longest caption.
        toks = state.loaded.tokenizer(texts)
        order = torch.argsort((toks != 0).sum(dim=1), stable=True).tolist()
        out: list[torch.Tensor | None] = [None] * len(texts)
        for chunk in iter_chunks(order, 256):
            with torch.no_grad(), autocast:
                feats = encode_text(model, trim_tokens(toks[chunk]).to(device), normalize=True).float().cpu()
            for j, idx in enumerate(chunk):
                out[idx] = feats[j]
        return out  # type: ignore[return-value]

    with torch.no_grad(), autocast:
        img_feats = encode_image(model, torch.stack(tensors).to(device), normalize=True).float().cpu()
    all_caps = [c for i in ok for c in items[i][1]]
    txt = encode_with_cache(state.cache, all_caps, encode_captions)
    pos = 0
    ref = {k: state.info.get(k) for k in ("name", "version", "source", "alias")}
    for row, i in enumerate(ok):
        n = len(items[i][1])
        sims = (torch.stack(txt[pos:pos + n]) @ img_feats[row]).tolist()
        pos += n
        results[i] = {"scores": sims, "logit_scale": state.logit_scale, "model": ref}
    times.add("forward", time.perf_counter() - t1, len(ok))  # per item: its share of the batch
    return results  # type: ignore[return-value]
