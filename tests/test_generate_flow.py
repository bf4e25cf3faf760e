"""The HTTP engine's flow control (hardpos.generate.flow): the AIMD in-flight window, the
rate limits, the Retry-After pause. Pure: every clock reading is passed in."""
from __future__ import annotations

import email.utils

import pytest

from hardpos.generate.flow import (
    RETRY_AFTER_CAP_S, FlowControl, TokenBucket, Window, prompt_tokens_estimate, retry_after_s,
)


def test_window_starts_full_halves_once_per_overload_event_and_grows_back_by_one_per_window():
    w = Window(ceiling=64)
    assert w.limit() == 64 and w.epoch == 0
    assert w.on_overload(sent_epoch=0) is True and w.limit() == 32 and w.epoch == 1
    # every request that was already in flight when the endpoint filled up answers 429 too:
    # they were sent in epoch 0, before the decrease, and cost nothing more
    assert [w.on_overload(sent_epoch=0) for _ in range(31)] == [False] * 31 and w.limit() == 32
    assert w.on_overload(sent_epoch=1) is True and w.limit() == 16  # a new event halves again
    for _ in range(16):  # +1/size each: a window's worth of successes is just short of +1
        w.on_success()
    assert w.limit() == 16 and w.size == pytest.approx(16.97, abs=0.01)
    w.on_success()
    assert w.limit() == 17
    for _ in range(10_000):
        w.on_success()
    assert w.limit() == 64 and w.size == 64.0  # never past the ceiling
    assert (w.decreases, w.smallest) == (2, 16)


def test_window_never_shrinks_below_its_floor():
    w = Window(ceiling=4, floor=2)
    for epoch in range(5):
        w.on_overload(epoch)
    assert w.limit() == 2 and w.smallest == 2
    with pytest.raises(ValueError):
        Window(ceiling=0)
    with pytest.raises(ValueError):
        Window(ceiling=4, factor=1.0)


def test_token_bucket_spreads_a_burst_over_time_in_arrival_order():
    b = TokenBucket(rate_per_s=10.0, burst=2.0)
    waits = [b.reserve(1.0, now=100.0) for _ in range(5)]
    assert waits == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3])  # the burst, then one every 0.1 s
    assert b.reserve(1.0, now=101.0) == 0.0  # a second later the debt is paid and the bucket refilled
    big = TokenBucket(rate_per_s=100.0, burst=50.0)
    assert big.reserve(250.0, now=0.0) == pytest.approx(2.0)  # larger than a burst: waits, never blocks


def test_flow_control_window_pause_and_rate_limits():
    flow = FlowControl.of(max_in_flight=2, retry_wait_s=0.5)
    assert flow.ready(0.0) == 0.0
    e1, wait1 = flow.start(100, 0.0)
    e2, wait2 = flow.start(100, 0.0)
    assert (e1, e2, wait1, wait2) == (0, 0, 0.0, 0.0)
    assert flow.ready(0.0) is None  # window full: wait for a reply
    flow.finish(e1, overloaded=True, now=1.0, retry_after=3.0)  # a 429 with Retry-After: 3
    assert flow.window.limit() == 1 and flow.in_flight == 1
    assert flow.ready(1.5) == pytest.approx(2.5)  # paused until t=4, whatever the window says
    flow.finish(e2, overloaded=True, now=1.6, retry_after=None)  # sent before the decrease: no second halving
    assert flow.window.limit() == 1 and flow.ready(4.0) == 0.0
    assert (flow.sent, flow.overloads, flow.peak_in_flight, flow.paused_s) == (2, 2, 2, 3.0)
    # backoff doubles per retry; a longer Retry-After wins
    assert [flow.retry_wait(a, None) for a in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert flow.retry_wait(1, 7.0) == 7.0

    limited = FlowControl.of(max_in_flight=100, qps=2.0, tokens_per_minute=600.0)
    waits = [limited.start(5, 0.0)[1] for _ in range(4)]
    # qps 2 (burst 2): 0, 0, 0.5, 1.0 s; 600 tokens/min = 10/s (burst 10): 5-token requests 0, 0, 0.5, 1.0 s
    assert waits == pytest.approx([0.0, 0.0, 0.5, 1.0])
    tokens = FlowControl.of(max_in_flight=100, tokens_per_minute=600.0)
    assert [tokens.start(20, 0.0)[1] for _ in range(2)] == pytest.approx([1.0, 3.0])  # 20 tokens at 10/s


def test_retry_after_reads_seconds_and_http_dates_and_caps_them():
    assert retry_after_s("2", 0.0) == 2.0 and retry_after_s(" 0.5 ", 0.0) == 0.5
    assert retry_after_s(None, 0.0) is None and retry_after_s("soon", 0.0) is None and retry_after_s("nan", 0) is None
    now = 1_800_000_000.0
    assert retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now) == pytest.approx(30.0)
    assert retry_after_s(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0  # already past
    assert retry_after_s("86400", 0.0) == RETRY_AFTER_CAP_S
    assert retry_after_s("-3", 0.0) == 0.0


def test_a_request_counts_its_prompt_at_four_characters_a_token_plus_max_tokens():
    assert prompt_tokens_estimate(400, 30) == 130
    assert prompt_tokens_estimate(401, 30) == 131
    assert prompt_tokens_estimate(0, 0) == 0
