"""Flow control of the HTTP engine: how many requests one actor keeps open, and when it may
send the next one. Pure: no I/O, no asyncio, no clock of its own (every call takes ``now``,
in seconds of any monotonic clock), so every rule is unit-tested without a server or Ray.

* :class:`Window` -- the in-flight window, AIMD as TCP's congestion avoidance: it starts at
  its ceiling (``engine.http.max_in_flight``), grows by one request per window of successful
  replies (additive increase) and halves on an overload signal (multiplicative decrease): a
  429 or 503 reply, or a request that timed out. Replies to requests sent before the last
  decrease do not decrease it again: one overload event costs one halving, not one per
  request that was already in flight when the endpoint filled up.
* :class:`TokenBucket` -- a rate limit (requests per second, tokens per minute): each request
  reserves its cost and learns how long to wait before sending; reservations queue in
  arrival order, so a burst of waiters is spread over time instead of all retrying at once.
* :class:`FlowControl` -- the window, the two rate limits and a pause that a ``Retry-After``
  header starts (no new request on this actor until it ends), with counters for reports.
* :func:`retry_after_s` -- a ``Retry-After`` header value (seconds or an HTTP date) in seconds.
"""
from __future__ import annotations

import dataclasses
import email.utils
import math

# The statuses that say "the endpoint is full": slow down, then retry.
OVERLOAD_STATUSES = (429, 503)
# A Retry-After longer than this is taken as this: a misconfigured header must not park a job for hours.
RETRY_AFTER_CAP_S = 60.0


def retry_after_s(value: str | None, now_epoch_s: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), capped at
    :data:`RETRY_AFTER_CAP_S`; None when absent or unreadable. ``now_epoch_s``: wall-clock
    seconds since the epoch, for the date form."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - now_epoch_s
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)


@dataclasses.dataclass
class Window:
    """The AIMD in-flight window (see the module docstring).

    ceiling: the most requests open at once (``engine.http.max_in_flight``); also the start.
    floor: the least the window shrinks to (one request keeps probing the endpoint).
    factor: what a decrease multiplies the window by.
    """

    ceiling: int
    floor: int = 1
    factor: float = 0.5
    size: float = dataclasses.field(init=False)
    epoch: int = dataclasses.field(default=0, init=False)  # bumped by every decrease
    decreases: int = dataclasses.field(default=0, init=False)
    smallest: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if self.ceiling < 1 or not 1 <= self.floor <= self.ceiling or not 0 < self.factor < 1:
            raise ValueError(f"bad window: ceiling {self.ceiling}, floor {self.floor}, factor {self.factor}")
        self.size = float(self.ceiling)
        self.smallest = self.ceiling

    def limit(self) -> int:
        """Requests that may be open now."""
        return max(self.floor, min(self.ceiling, int(self.size)))

    def on_success(self) -> None:
        """A reply that was not an overload: +1/size, i.e. +1 per window of replies."""
        self.size = min(float(self.ceiling), self.size + 1.0 / max(self.size, 1.0))

    def on_overload(self, sent_epoch: int) -> bool:
        """An overload reply to a request sent in ``sent_epoch``: halve unless a decrease
        already happened since that request was sent. Returns whether it decreased."""
        if sent_epoch < self.epoch:
            return False
        self.size = max(float(self.floor), self.size * self.factor)
        self.epoch += 1
        self.decreases += 1
        self.smallest = min(self.smallest, self.limit())
        return True


@dataclasses.dataclass
class TokenBucket:
    """A rate of ``rate_per_s`` units a second with bursts of up to ``burst`` units.

    :meth:`reserve` takes a request's cost at once, going into debt when the bucket is short,
    and returns how long the request must wait for the debt to refill; later requests queue
    behind that debt. A cost larger than ``burst`` is allowed (it waits longer), so no request
    can block forever.
    """

    rate_per_s: float
    burst: float
    level: float = dataclasses.field(init=False)
    stamp: float | None = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0 or not self.burst > 0:
            raise ValueError(f"bad bucket: rate {self.rate_per_s}/s, burst {self.burst}")
        self.level = float(self.burst)

    def reserve(self, cost: float, now: float) -> float:
        """Take ``cost`` units at ``now``; seconds to wait before using them (0: at once)."""
        if self.stamp is not None:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate_per_s)
        self.stamp = now
        self.level -= cost
        return 0.0 if self.level >= 0 else -self.level / self.rate_per_s


@dataclasses.dataclass
class FlowControl:
    """One actor's flow control: the window, the rate limits and the Retry-After pause.

    The caller (the actor's event loop) asks :meth:`ready` before each send, calls
    :meth:`start` when it sends and :meth:`finish` with the outcome; :meth:`retry_wait` says
    how long a request waits before its next attempt. Counters: ``sent``, ``overloads``,
    ``peak_in_flight``, ``paused_s`` (time the pauses asked for).
    """

    window: Window
    qps: TokenBucket | None = None
    tpm: TokenBucket | None = None
    retry_wait_s: float = 1.0
    in_flight: int = 0
    paused_until: float = 0.0
    sent: int = 0
    overloads: int = 0
    peak_in_flight: int = 0
    paused_s: float = 0.0

    @classmethod
    def of(cls, max_in_flight: int, qps: float | None = None, tokens_per_minute: float | None = None,
           retry_wait_s: float = 1.0) -> "FlowControl":
        """From an actor's share of the limits: ``qps`` requests a second (bursts of one
        second's worth, at least 1), ``tokens_per_minute`` (bursts of one second's worth, at
        least one request's); None: no limit."""
        return cls(window=Window(max_in_flight),
                   qps=TokenBucket(qps, max(1.0, qps)) if qps else None,
                   tpm=TokenBucket(tokens_per_minute / 60.0, max(1.0, tokens_per_minute / 60.0))
                   if tokens_per_minute else None,
                   retry_wait_s=retry_wait_s)

    def ready(self, now: float) -> float | None:
        """0.0: a request may start now; > 0: wait that long (a Retry-After pause); None:
        wait until a request in flight finishes (the window is full)."""
        if now < self.paused_until:
            return self.paused_until - now
        return 0.0 if self.in_flight < self.window.limit() else None

    def start(self, cost_tokens: float, now: float) -> tuple[int, float]:
        """A request starts: (its epoch for :meth:`finish`, seconds it waits for the rate
        limits before sending). It holds its window slot while it waits."""
        self.in_flight += 1
        self.sent += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        wait = 0.0
        if self.qps is not None:
            wait = max(wait, self.qps.reserve(1.0, now))
        if self.tpm is not None:
            wait = max(wait, self.tpm.reserve(cost_tokens, now))
        return self.window.epoch, wait

    def finish(self, epoch: int, overloaded: bool, now: float, retry_after: float | None = None) -> None:
        """The request sent in ``epoch`` ended: ``overloaded`` (429, 503 or a timeout) shrinks
        the window; a ``retry_after`` (seconds) pauses every new request until then."""
        self.in_flight -= 1
        if overloaded:
            self.overloads += 1
            self.window.on_overload(epoch)
        else:
            self.window.on_success()
        if retry_after:
            until = now + retry_after
            if until > self.paused_until:
                self.paused_s += until - max(now, self.paused_until)
                self.paused_until = until

    def retry_wait(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before retry number ``attempt`` (1 = the first retry): exponential backoff
        from ``retry_wait_s``, or the server's Retry-After when that is longer."""
        backoff = self.retry_wait_s * (2 ** (attempt - 1))
        return max(backoff, retry_after or 0.0)


def prompt_tokens_estimate(text_chars: int, max_tokens: int) -> int:
    """A request's cost against a tokens-per-minute limit before it is sent: its prompt at
    four characters a token (the usual rule of thumb for English) plus ``max_tokens``, the
    way hosted APIs count a request against the limit when it arrives."""
    return -(-text_chars // 4) + max(0, int(max_tokens))
