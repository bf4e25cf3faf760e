"""An OpenAI-compatible stub that behaves like a batching server (vLLM, a hosted API): at
most ``capacity`` sequences are generated at once, each for ``latency_s``; requests beyond
that wait in a FIFO queue of ``queue_limit``; beyond the queue the server answers 429 with a
``Retry-After`` header, as vLLM's server and hosted APIs do when full.

The requests are read and answered by :mod:`tests.support.openai_stub`'s code (the same routes,
request checks, error bodies and canned, deterministic replies from
:func:`tests.support.openai_stub.canned` or any other ``responder``; only the HTTP server and
the admission are this module's); a 429 is decided before a request is looked at, so it never
counts as one of a (caption, kind)'s attempts and the canned replies stay deterministic.

Counters, for "what fraction of the endpoint's capacity did the client use":

* ``utilisation()`` -- sequences generated over the busy period (first admission to last
  completion), as a fraction of ``capacity``: 1.0 is every slot busy the whole time;
* ``served``, ``rejected`` (429s), ``peak_active``, ``peak_queued``, ``busy_s`` (time with
  a sequence in a slot), ``busy_period_s`` (first admission to last completion).

The server is aiohttp on its own event loop in a daemon thread (thousands of requests a
second on one core; a thread per connection would not keep up with C = 256), bound to
127.0.0.1 on a port the OS picks; it stops on :meth:`stop`, on leaving its ``with`` block,
after ``max_lifetime_s`` whatever happens, and with the process. For tests that must not
depend on timing, :meth:`hold` keeps every admitted request in its slot until
:meth:`release` (and :meth:`wait_for` polls the counters until a condition holds).

    with BatchingStub(capacity=64, latency_s=0.5) as stub:
        stub.url                # http://127.0.0.1:PORT/v1/chat/completions
        stub.utilisation()      # 0.0 .. 1.0

As its own process (a benchmark's endpoint should not share the client's interpreter):
``python -m tests.support.batching_stub capacity latency_s [queue_limit [max_lifetime_s [host [port]]]]``
prints the chat URL, serves ``GET /stub/counters`` and ``POST /stub/reset``, and exits after
``max_lifetime_s`` (default 1 h) or on SIGTERM/SIGINT. Its replies are :func:`steady`'s.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Callable

from tests.support.openai_stub import (INVALID_JSON, PATHS, Endpoint, OpenAIStub, canned, error_body, models_body,
                                       parse_body)


def steady(caption: str, kind: str, attempt: int) -> tuple[int, str | None]:
    """The canned answers without their one-off 503s: a 503 means "full" to a client that
    backs off, so a benchmark of how full a client keeps a server must not send any it
    did not cause. The 500s, empty, chatty and multi-edit answers stay."""
    return canned(caption, kind, max(attempt, 1))


class BatchingStub(Endpoint):
    """See the module docstring. ``queue_limit`` None: as many as ``capacity``;
    ``retry_after_s`` None: 429s carry no Retry-After header."""

    def __init__(self, capacity: int = 64, latency_s: float = 0.5, queue_limit: int | None = None,
                 retry_after_s: float | None = 1.0,
                 responder: Callable[[str, str, int], tuple[int, str | None]] = canned, model: str = "stub-llm",
                 host: str = "127.0.0.1", port: int = 0, max_lifetime_s: float = 3600.0,
                 keep_received: bool = False):
        if capacity < 1 or latency_s < 0:
            raise ValueError(f"capacity must be >= 1 and latency_s >= 0, got {capacity}, {latency_s}")
        self.capacity, self.latency_s = capacity, latency_s
        self.queue_limit = capacity if queue_limit is None else queue_limit
        self.retry_after_s = retry_after_s
        self.host, self.bind_port, self.max_lifetime_s = host, port, max_lifetime_s
        self.content = OpenAIStub(responder=responder, model=model, keep_received=keep_received)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None
        self._port: int | None = None
        self._gate: asyncio.Event | None = None
        self.reset_counters()

    # ------------------------------------------------------------------ counters
    def reset_counters(self) -> None:
        """Zero the counters (between two measured runs against one server)."""
        self.served = self.rejected = self.peak_active = self.peak_queued = 0
        self._active = 0
        self._queue: collections.deque = collections.deque()
        self._area = 0.0  # integral of active slots over time
        self._changed: float | None = None
        self._first: float | None = None
        self._last: float | None = None
        self.busy_s = 0.0

    def _account(self, now: float) -> None:
        if self._changed is not None:
            dt = now - self._changed
            self._area += self._active * dt
            if self._active:
                self.busy_s += dt
        self._changed = now

    def utilisation(self) -> float:
        """Slot-seconds used over ``capacity`` x the busy period (first admission to last
        completion); 0.0 before any request completed."""
        if self._first is None or self._last is None or self._last <= self._first:
            return 0.0
        return self._area / (self.capacity * (self._last - self._first))

    def counters(self) -> dict:
        period = (self._last - self._first) if self._first is not None and self._last is not None else 0.0
        return {"served": self.served, "rejected_429": self.rejected, "peak_active": self.peak_active,
                "peak_queued": self.peak_queued, "busy_s": round(self.busy_s, 3), "busy_period_s": round(period, 3),
                "utilisation": round(self.utilisation(), 4)}

    @property
    def requests(self) -> int:
        """Requests answered (any status but this server's own 429s)."""
        return self.content.requests

    @property
    def attempts(self) -> dict:
        return self.content.attempts

    @property
    def received(self) -> list:
        return self.content.received

    # ------------------------------------------------------------------ admission
    async def _admit(self) -> bool:
        """A slot for this request (waiting in the queue if need be); False: the queue is full."""
        now = time.perf_counter()
        if self._active < self.capacity:
            self._account(now)
            self._active += 1
            self.peak_active = max(self.peak_active, self._active)
            if self._first is None:
                self._first = now
            return True
        if len(self._queue) >= self.queue_limit:
            self.rejected += 1
            return False
        waiter = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        self.peak_queued = max(self.peak_queued, len(self._queue))
        try:
            await waiter  # the slot is handed over by _release: active stays as it is
        except asyncio.CancelledError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self._release()
            raise
        return True

    def _release(self) -> None:
        now = time.perf_counter()
        self._last = now
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)  # hand the slot to the next in line
                return
        self._account(now)
        self._active -= 1

    async def _handle(self, request, route: str):
        from aiohttp import web  # lazy: only a started server needs it

        body = parse_body(await request.read())
        if body is None:
            status, reply = INVALID_JSON
            return web.json_response(reply, status=status)
        if not await self._admit():
            headers = {"Retry-After": f"{self.retry_after_s:g}"} if self.retry_after_s is not None else {}
            return web.json_response(error_body("Too many requests: the server is at capacity", "rate_limit_error", 429),
                                     status=429, headers=headers)
        try:
            assert self._gate is not None
            await self._gate.wait()
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            status, reply = self.content.reply(body, route)
            self.served += 1
        finally:
            self._release()
        return web.json_response(reply, status=status)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "BatchingStub":
        from aiohttp import web  # lazy: see _handle

        async def chat(request):
            return await self._handle(request, "chat")

        async def completions(request):
            return await self._handle(request, "completions")

        async def models(request):
            return web.json_response(models_body(self.content.model))

        async def counters(request):
            return web.json_response(self.counters())

        async def reset(request):
            self.reset_counters()  # on the server's loop: no request is half-counted
            return web.json_response(self.counters())

        app = web.Application()
        app.router.add_get("/stub/counters", counters)
        app.router.add_post("/stub/reset", reset)
        app.router.add_post(PATHS["chat"], chat)
        app.router.add_post(PATHS["completions"], completions)
        app.router.add_get("/v1/models", models)
        ready = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._gate = asyncio.Event()
            self._gate.set()
            try:
                runner = web.AppRunner(app, access_log=None, handle_signals=False)
                loop.run_until_complete(runner.setup())
                site = web.TCPSite(runner, self.host, self.bind_port, backlog=1024)
                loop.run_until_complete(site.start())
                self._runner = runner
                self._port = runner.addresses[0][1]
                loop.call_later(self.max_lifetime_s, loop.stop)  # stops by itself, whatever the caller does
            except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
                failed.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True, name="batching-stub")
        self._thread.start()
        ready.wait(30)
        if failed:
            raise failed[0]
        return self

    def hold(self) -> None:
        """From now on, admitted requests stay in their slots until :meth:`release`."""
        assert self._loop is not None and self._gate is not None, "stub not started"
        self._loop.call_soon_threadsafe(self._gate.clear)

    def release(self) -> None:
        """Let held requests (and every later one) through."""
        assert self._loop is not None and self._gate is not None, "stub not started"
        self._loop.call_soon_threadsafe(self._gate.set)

    def wait_for(self, condition: Callable[["BatchingStub"], bool], timeout_s: float = 60.0) -> None:
        """Poll until ``condition(self)`` holds; AssertionError with the counters after ``timeout_s``
        (a bound for a broken test, not a timing the test relies on)."""
        deadline = time.monotonic() + timeout_s
        while not condition(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"stub never reached the condition: {self.counters()}")
            time.sleep(0.01)

    @property
    def active(self) -> int:
        return self._active

    @property
    def queued(self) -> int:
        return len(self._queue)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop = None

    @property
    def port(self) -> int:
        assert self._port is not None, "stub not started"
        return self._port


if __name__ == "__main__":  # see the module docstring
    import signal
    import sys

    argv = sys.argv[1:]
    stub = BatchingStub(capacity=int(argv[0]), latency_s=float(argv[1]),
                        queue_limit=int(argv[2]) if len(argv) > 2 else None,
                        max_lifetime_s=float(argv[3]) if len(argv) > 3 else 3600.0, responder=steady,
                        host=argv[4] if len(argv) > 4 else "127.0.0.1", port=int(argv[5]) if len(argv) > 5 else 0).start()
    print(stub.url, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while stub._thread is not None and stub._thread.is_alive():
            stub._thread.join(1.0)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        stub.stop()
