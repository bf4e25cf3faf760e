"""``ScoringModel``: the Ray Serve deployment that holds one model version and scores batches.

Contract:

* Health tells the truth: a replica that cannot load the model tries ``load_retries`` more
  times; then ``check_health`` fails, naming the status (404 unknown model, 503 unloadable)
  and the load error. Serve runs that check before a replica counts as started, so the
  replica never starts: Serve retries it (``max_constructor_retry_count``), then marks the
  deployment DEPLOY_FAILED with that message, a RayService upgrade to a model that cannot
  load is never promoted, and the ingress answers 503/404 with the reason at once. A
  replica that is serving keeps its model through failed reloads and stays healthy.
* ``score(image, captions)`` goes through a :class:`hardpos.serve.batching.Batcher`: a batch
  is formed when the model is free (everything that queued while the previous batch ran, up
  to ``max_batch_size``), and one forward pass encodes every image of the batch and every
  caption not in the replica's LRU text-embedding cache
  (:func:`hardpos.serve.scoring.compute_batch`). (Not ``@serve.batch``: Ray's queue forms
  the next batch while the previous one still runs, so under load its batches stay at ~1;
  see :mod:`hardpos.serve.batching`.)
* Reload without downtime: the new version loads in a thread while the old one serves, then
  one reference swap. Triggers: the registry alias moved (polled every ``reload_poll_s``),
  ``reload(force)`` (``POST /v1/reload``), or a new ``reload_token`` in the user_config. A
  reload that fails keeps the previous version serving and is reported in ``info()``
  (``last_reload_error``).
* The device is the GPU when Ray assigned one (bf16 autocast when ``bf16``), else the CPU.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray import serve

from hardpos.config import from_dict
from hardpos.serve.batching import Batcher
from hardpos.serve.config import BatchingConfig, load_app_config
from hardpos.serve.errors import ServingError, classify_load_error
from hardpos.serve.ingress import current_ingress
from hardpos.serve.requests import check_token_lengths
from hardpos.serve.scoring import BatchStats, ModelState, StageTimes, compute_batch, current_version, load_state

log = logging.getLogger("ray.serve")
# Ray Serve's switch (default "1"): "0" runs the app's code on Ray's own event loop, not in a
# second thread (hardpos.serve.app.model_replica_env sets it for forward_thread: false).
USER_CODE_THREAD_ENV = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"


@serve.deployment
class ScoringModel:
    """Holds one model version and scores (image bytes, captions) requests in batches."""

    def __init__(self, config: dict[str, Any]):
        self.cfg = load_app_config(config)
        self.stats = BatchStats()
        self.times = StageTimes()
        self._state: ModelState | None = None
        self._error: ServingError | None = None
        self._reload_error: dict[str, Any] | None = None
        self._poller: asyncio.Task | None = None
        self._reload_lock: asyncio.Lock | None = None
        self._reload_token: str | None = None  # set by the first reconfigure() (Serve calls it after __init__)
        self._batcher: Batcher[tuple[ModelState, bytes, list[str]], dict[str, Any]] = Batcher(
            self._score_batch, on_batch=self.stats.record)
        self._apply_batching(self.cfg.batching)
        if self.cfg.torch_threads:
            import torch  # lazy: an ingress replica imports this module through the app and never loads a model

            torch.set_num_threads(self.cfg.torch_threads)
        for attempt in range(self.cfg.load_retries + 1):
            if attempt:
                time.sleep(self.cfg.load_retry_backoff_s * attempt)
            try:
                self._state = self._load()
                self._error = None
                log.info("hardpos serve: loaded %s", self._state.info)
                break
            except Exception as exc:  # noqa: BLE001 - stay up and say why (404/503), keep retrying
                self._error = classify_load_error(self.cfg.model, exc)
                log.error("hardpos serve: load attempt %d/%d: %s", attempt + 1, self.cfg.load_retries + 1,
                          self._error.message)

    # ---- configuration
    def _apply_batching(self, batching: BatchingConfig) -> None:
        self._batching = batching
        self._batcher.max_batch_size = batching.effective_max_batch_size
        self._batcher.wait_timeout_s = batching.batch_wait_timeout_s if batching.enabled else 0.0

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """user_config: ``{"reload_token": str, "batching": {...}}``; a new token reloads."""
        user_config = dict(user_config or {})
        if "batching" in user_config:
            self._apply_batching(from_dict(BatchingConfig, user_config["batching"]))
        token = str(user_config.get("reload_token", self._reload_token or ""))
        previous, self._reload_token = self._reload_token, token
        if previous is not None and token != previous:  # not on the first call, right after __init__
            await self.reload(force=True)

    # ---- loading (hardpos.serve.scoring: MLflow sources resolve in cfg.tracking_uri, never a global URI)
    def _current_version(self) -> str | None:
        return current_version(self.cfg)

    def _load(self) -> ModelState:
        want_cuda = self.cfg.device == "cuda" or (self.cfg.device == "auto" and bool(ray.get_gpu_ids()))
        return load_state(self.cfg, want_cuda)

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
                err = classify_load_error(self.cfg.model, exc)
                if self._state is None:
                    self._error = err
                self._reload_error = {**err.to_dict(), "at": time.time(), "kept_version": old}
                log.error("hardpos serve: reload failed, still serving version %s: %s", old, err.message)
                return {"reloaded": False, "version": old, "error": err.to_dict()}
            self._state, self._error, self._reload_error = state, None, None  # one reference swap: no downtime
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
        """Serve calls this once before the replica counts as started, then every
        ``health_check_period_s``: raises while no model is loaded.

        Reached only after construction (the first load and its retries), so a replica that
        is still loading is never called unhealthy. A failed *reload* leaves the previous
        version loaded: healthy. The message format (``no model loaded (<status>): ...``)
        is what the ingress reads back from Serve's status. (It also starts the alias poller.)
        """
        self._ensure_poller()
        if self._state is None:
            err = self._error or ServingError(503, "model is not loaded yet")
            raise RuntimeError(f"no model loaded ({err.status}): {err.message}")

    # ---- info
    async def info(self) -> dict[str, Any]:
        self._ensure_poller()
        state = self._state
        out: dict[str, Any] = {
            "loaded": state is not None,
            "model": {k: v for k, v in (state.info if state else {"source": self.cfg.model}).items() if k != "tags"},
            "batching": {"enabled": self._batching.enabled,
                         "max_batch_size": self._batching.effective_max_batch_size,
                         "forward_thread": self._batching.forward_thread,
                         # False once the replica started with the one-loop environment
                         # (hardpos.serve.app.model_replica_env): what Ray itself reads
                         "user_code_thread": os.environ.get(USER_CODE_THREAD_ENV, "1") == "1",
                         "batch_wait_timeout_s": self._batching.batch_wait_timeout_s if self._batching.enabled else 0.0,
                         **self.stats.summary()},
            "text_cache": state.cache.stats() if state else None,
            "timing": self.times.snapshot(),
            # what carries HTTP to this replica: the cluster's choice, read from the environment
            # the replica inherited (Ray reads the same variable)
            "ingress": current_ingress(),
            # Read where forward passes run (compute_batch goes through asyncio.to_thread), not
            # on this event loop's thread: the figure a load test's forward timings depend on.
            "torch_threads": await asyncio.to_thread(_torch_threads),
            "replica": serve.get_replica_context().replica_id.unique_id,
        }
        if self._error is not None:
            out["error"] = self._error.to_dict()
        if self._reload_error is not None:
            out["last_reload_error"] = self._reload_error
        return out

    # ---- scoring
    async def score(self, image: bytes, captions: list[str]) -> dict[str, Any]:
        """Cosine scores of one image with each caption, or ``{"error": {status, detail}}``."""
        self._ensure_poller()
        state = self._state
        if state is None:
            err = self._error or ServingError(503, "model is not loaded yet")
            return {"error": err.to_dict()}
        try:
            check_token_lengths(state.loaded.tokenizer, captions, state.loaded.context_length, checked=state.cache)
        except ServingError as exc:
            return {"error": exc.to_dict()}
        with self.times.time("replica"):  # batch queue + decode + forward, inside this replica
            return await self._batcher.submit((state, image, captions))

    async def _score_batch(self, items: list[tuple[ModelState, bytes, list[str]]]) -> list[dict[str, Any]]:
        """Score each request with the model version its captions were checked on: a reload
        between a request's check and its batch swaps the state, and a caption checked on the
        old model must not enter the new one's text cache (a cached caption skips the check).
        One forward per version in the batch; after a reload, briefly two."""
        results: list[dict[str, Any]] = [{}] * len(items)
        by_state: dict[int, tuple[ModelState, list[int]]] = {}
        for i, (state, _, _) in enumerate(items):
            by_state.setdefault(id(state), (state, []))[1].append(i)
        for state, rows in by_state.values():
            scored = await self._compute(state, [items[i][1:] for i in rows])
            for i, result in zip(rows, scored):
                results[i] = result
        return results

    async def _compute(self, state: ModelState, items: list[tuple[bytes, list[str]]]) -> list[dict[str, Any]]:
        if not self._batching.forward_thread:
            # On this loop (with model_replica_env, Ray's one loop): what arrives meanwhile
            # waits in the socket, then joins the next batch whole.
            return compute_batch(state, items, self.cfg.limits, self.times)
        # In a thread, so the replica keeps accepting (and queueing) requests meanwhile: the
        # next batch fills while this one computes.
        return await asyncio.to_thread(compute_batch, state, items, self.cfg.limits, self.times)


def _torch_threads() -> int:
    import torch  # lazy: see ScoringModel.__init__

    return torch.get_num_threads()
