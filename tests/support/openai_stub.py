"""A small OpenAI-compatible chat/completions + completions server for tests and benchmarks
(the generate benchmark, :mod:`benchmarks.generate_bench`, measures against it).

Stdlib only (``http.server`` in a daemon thread), bound to 127.0.0.1 on a free port (``host`` /
``port`` choose others: the cluster test runs it on a worker host's own address).
``POST /v1/chat/completions`` (``messages``) and ``POST /v1/completions`` (a raw
``prompt`` string) answer like a real endpoint (``choices``, ``usage``), with
canned, realistic outputs chosen deterministically from the request's caption and kind:

* ``good``      a correct hard positive: one word swapped for a synonym (REPLACE), or the
                conjuncts around "and" exchanged (SWAP)
* ``chatter``   the right sentence wrapped in assistant chatter ("Sure! Here is ...")
* ``multi``     several words changed (too many edits)
* ``empty``     an empty completion
* ``identical`` the caption echoed back unchanged
* ``error500``  HTTP 500 with a JSON error body (what vLLM/hosted APIs send)
* ``flaky``     HTTP 503 on the first attempt, then a good answer (exercises retries)

``behaviour(caption, kind)`` is the pure function that picks the behaviour, so a test can
predict exact accepted/rejected counts. ``latency_s`` adds a fixed per-request delay (for
the benchmark). The caption is the text after the last "Sentence:" or "Input:" of the
last user turn or raw prompt (the formats of the bundled prompts), else the whole text.
A request of the wrong shape for its route (no ``messages`` on chat, no string ``prompt``
on completions) gets a 400, as vLLM's server answers. ``received`` keeps every
``(route, body)`` so a test can check the exact payloads.

What any OpenAI-compatible stub shares, whatever serves its HTTP (this module's thread per
connection, :mod:`tests.support.batching_stub`'s asyncio loop): the routes (:data:`PATHS`,
:func:`route_of`), reading a body (:func:`parse_body`), the error and model-list bodies
(:func:`error_body`, :func:`models_body`), the replies (:meth:`OpenAIStub.reply`) and the URLs
(:class:`Endpoint`).

    with OpenAIStub() as stub:
        stub.url              # http://127.0.0.1:PORT/v1/chat/completions
        stub.completions_url  # http://127.0.0.1:PORT/v1/completions
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, TypeVar

BEHAVIOURS = ("good", "good", "good", "good", "chatter", "multi", "empty", "identical", "error500", "flaky")

SYNONYMS = {
    "man": "guy", "woman": "lady", "large": "big", "big": "large", "small": "little", "little": "small",
    "picture": "photo", "photo": "picture", "sitting": "seated", "street": "road", "road": "street",
    "child": "kid", "boy": "lad", "girl": "lass", "people": "persons", "table": "desk", "plate": "dish",
    "holding": "grasping", "food": "meal", "riding": "on", "standing": "stood", "next": "close",
    "couple": "pair", "several": "many", "many": "numerous", "near": "beside", "bus": "coach",
}


def behaviour(caption: str, kind: str) -> str:
    """The canned behaviour for one (caption, kind), stable across runs and processes."""
    digest = hashlib.sha256(f"{kind}\x00{caption}".encode()).digest()
    return BEHAVIOURS[digest[0] % len(BEHAVIOURS)]


def kind_of(prompt: str) -> str:
    """Guess the request kind from the prompt text (the bundled prompts' wording)."""
    low = prompt.lower()
    negative = "no longer" in low or "different scene" in low
    base = "swap" if low.lstrip().startswith("swap") else "replace"
    return f"{base}_negative" if negative else base


def replace_one(caption: str) -> str:
    """One word replaced by a synonym (or the first article by 'one')."""
    words = caption.split(" ")
    for i, w in enumerate(words):
        core = w.strip(".,").lower()
        if core in SYNONYMS:
            new = SYNONYMS[core]
            if w[:1].isupper():
                new = new.capitalize()
            words[i] = w.replace(w.strip(".,"), new)
            return " ".join(words)
    for i, w in enumerate(words):
        if w.lower() in ("a", "an"):
            words[i] = "One" if w[:1].isupper() else "one"
            return " ".join(words)
    return caption + " too"


_DETS = {"a", "an", "the", "two", "three", "some", "his", "her", "their"}
_STOP = {"with", "on", "in", "of", "at", "near", "next", "to", "by", "from", "under", "over", "is", "are", "while",
         "filled", "holding", "sitting", "standing", "that", "who", "and"}


def swap_and(caption: str) -> str:
    """Exchange the phrases around the first 'and' (every word kept), like a careful LLM."""
    end = ""
    text = caption.rstrip()
    if text.endswith("."):
        text, end = text[:-1], "."
    words = text.split()
    lower = [w.lower().strip(",") for w in words]
    if "and" not in lower:
        return caption
    i = lower.index("and")
    j = i
    while j > 0 and i - j < 3 and lower[j - 1] not in _DETS and lower[j - 1] not in _STOP:
        j -= 1
    if j > 0 and lower[j - 1] in _DETS:
        j -= 1
    k = i + 1
    verbs = [n for n in range(i) if lower[n].endswith("ing")]
    if k < len(words) and lower[k].endswith("ing") and verbs:
        # "holding an umbrella and petting a yak": swap the two verb phrases
        j, k = verbs[-1], len(words)
    elif k < len(words) and lower[k] in _DETS:
        k += 1
        while k < len(words) and k - i <= 4 and lower[k] not in _STOP and not lower[k].endswith("ing"):
            k += 1
    elif j < i and lower[j] in _DETS:
        # "a yellow and blue hydrant", "a man and woman": the determiner is shared
        j += 1
        k = min(len(words), i + 1 + (i - j))
    else:
        while k < len(words) and k - i <= 2 and lower[k] not in _STOP:
            k += 1
    left, right = words[j:i], words[i + 1:k]
    if not left or not right:
        return caption
    out = words[:j] + right + ["and"] + left + words[k:]
    if j == 0 and words[0][:1].isupper():
        out[0] = out[0][:1].upper() + out[0][1:]
        pos = len(right) + 1
        if lower[0] in _DETS:
            out[pos] = out[pos].lower()
    return " ".join(out) + end


def multi_edit(caption: str) -> str:
    words = caption.split(" ")
    for i in range(0, len(words), 2):
        words[i] = "thing"
    return " ".join(words)


def canned(caption: str, kind: str, attempt: int) -> tuple[int, str | None]:
    """(HTTP status, completion text) for one request."""
    b = behaviour(caption, kind)
    good = swap_and(caption) if kind.startswith("swap") else replace_one(caption)
    if b == "error500":
        return 500, None
    if b == "flaky" and attempt == 0:
        return 503, None
    if b in ("good", "flaky"):
        return 200, good
    if b == "chatter":
        return 200, f"Sure! Here is the changed sentence:\n\n{good}\n\nI replaced one word while keeping the meaning."
    if b == "multi":
        return 200, multi_edit(caption)
    if b == "empty":
        return 200, ""
    return 200, caption  # identical


def caption_in(prompt: str) -> str:
    """The caption inside a prompt: after its last "Sentence:" (chat wording) or "Input:"
    (the paper's raw wording, whose few-shot examples come before it), else the prompt."""
    match = re.findall(r"(?:Sentence|Input):[ \t]*(.*)", prompt)
    return match[-1].strip() if match else prompt.strip()


def caption_of(messages: list[dict]) -> tuple[str, str]:
    """(caption, full last-user prompt) from chat messages."""
    users = [m.get("content", "") for m in messages if m.get("role") == "user"]
    prompt = users[-1] if users else ""
    return caption_in(prompt), prompt


# --------------------------------------------------------------------------- HTTP, for any stub
#: route -> its path (what :class:`Endpoint`'s URLs end in)
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def route_of(path: str) -> str | None:
    """"chat" or "completions" for a POST path (any prefix before ``/chat/completions`` or
    ``/completions``, a trailing slash allowed), None for any other path."""
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    return "completions" if path.endswith("/completions") else None


def error_body(message: str, kind: str = "invalid_request_error", code: int | None = None) -> dict:
    """An error reply as OpenAI-compatible servers send it: ``{"error": {message, type[, code]}}``."""
    return {"error": {"message": message, "type": kind, **({"code": code} if code is not None else {})}}


#: the reply to a body that is not JSON
INVALID_JSON = (400, error_body("invalid JSON"))


def parse_body(raw: bytes) -> dict | None:
    """A request's JSON body (an empty body is ``{}``); None when it is not JSON (answer
    :data:`INVALID_JSON`)."""
    try:
        return json.loads(raw or b"{}")
    except json.JSONDecodeError:
        return None


def models_body(model: str) -> dict:
    """``GET /v1/models``: the one model the stub serves."""
    return {"object": "list", "data": [{"id": model, "object": "model"}]}


class StubHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server with a real endpoint's listen backlog."""
    # socketserver's listen backlog is 5: a client opening 128 connections at once overflows
    # it, and a connection the kernel then holds half-open waits for SYN-ACK retransmits (up
    # to a minute). A real endpoint listens with a backlog of hundreds to thousands.
    request_queue_size = 1024
    daemon_threads = True


# typing.Self is Python 3.11+; the floor is 3.10.
_Server = TypeVar("_Server", bound="Endpoint")


class Endpoint:
    """The URLs and ``with`` block of a started stub; a subclass has ``host`` and ``port``
    and defines ``start()`` (returning itself) and ``stop()``."""

    host: str
    port: int

    def start(self: _Server) -> _Server:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{PATHS['chat']}"

    @property
    def completions_url(self) -> str:
        return f"http://{self.host}:{self.port}{PATHS['completions']}"


class OpenAIStub(Endpoint):
    """The server; a context manager (``start``/``stop`` also work). Thread-safe counters."""

    def __init__(self, latency_s: float = 0.0, responder: Callable[[str, str, int], tuple[int, str | None]] = canned,
                 model: str = "stub-llm", host: str = "127.0.0.1", port: int = 0, keep_received: bool = True):
        self.host, self.bind_port = host, port
        self.latency_s = latency_s
        self.responder = responder
        self.model = model
        self.keep_received = keep_received  # off for long benchmark runs: the bodies would pile up
        self.requests = 0
        self.received: list[tuple[str, dict]] = []
        self.attempts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "OpenAIStub":
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, models_body(stub.model))
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):  # noqa: N802
                body = parse_body(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                route = route_of(self.path)
                if body is None:
                    self._send(*INVALID_JSON)
                elif route is None:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                else:
                    self._send(*stub.answer(body, route))

        self._server = StubHTTPServer((self.host, self.bind_port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="openai-stub")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def port(self) -> int:
        assert self._server is not None, "stub not started"
        return self._server.server_address[1]

    # ------------------------------------------------------------------ behaviour
    def answer(self, body: dict, route: str = "chat") -> tuple[int, dict]:
        """(status, reply body) for one request on ``route`` ("chat" or "completions"), after
        ``latency_s``."""
        if self.latency_s:
            time.sleep(self.latency_s)
        return self.reply(body, route)

    def reply(self, body: dict, route: str = "chat") -> tuple[int, dict]:
        """:meth:`answer` without the wait (a server with its own timing calls this)."""
        if route == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list):
                return 400, error_body("'messages' is required")
            caption, prompt = caption_of(messages)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return 400, error_body("'prompt' must be a string")
            caption = caption_in(prompt)
        kind = kind_of(prompt)
        with self._lock:
            self.requests += 1
            if self.keep_received:
                self.received.append((route, body))
            attempt = self.attempts.get((caption, kind), 0)
            self.attempts[(caption, kind)] = attempt + 1
        status, text = self.responder(caption, kind, attempt)
        if status != 200:
            return status, error_body("The server had an error while processing your request.", "server_error", status)
        prompt_tokens = len(prompt.split()) if route == "completions" else \
            sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        completion_tokens = len((text or "").split())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        if route == "completions":
            return 200, {
                "id": f"cmpl-{hashlib.sha1(prompt.encode()).hexdigest()[:12]}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or self.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
                "usage": usage,
            }
        return 200, {
            "id": f"chatcmpl-{hashlib.sha1(prompt.encode()).hexdigest()[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        }


if __name__ == "__main__":  # python -m tests.support.openai_stub [latency_s [host [port]]]: until stopped
    import sys

    argv = sys.argv[1:]
    with OpenAIStub(latency_s=float(argv[0]) if argv else 0.0, host=argv[1] if len(argv) > 1 else "127.0.0.1",
                    port=int(argv[2]) if len(argv) > 2 else 0) as s:
        print(s.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
