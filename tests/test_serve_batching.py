"""hardpos.serve.batching.Batcher without Ray: batches form when the model is free.

Deterministic: the handler blocks on an event the test sets, so "requests arrived while
the model was busy" is arranged, not timed.
"""
from __future__ import annotations

import asyncio

import pytest

from hardpos.serve.batching import ARRIVAL_TURNS, Batcher


def test_requests_that_queue_while_a_batch_runs_form_the_next_batch():
    async def scenario():
        sizes, release = [], asyncio.Event()

        async def handler(items):
            sizes.append(len(items))
            if len(sizes) == 1:
                await release.wait()  # the model is busy with the first batch
            return [x * 10 for x in items]

        b = Batcher(handler, max_batch_size=8)
        first = asyncio.ensure_future(b.submit(0))
        while not sizes:  # the first batch is running
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(b.submit(i)) for i in range(1, 12)]  # 11 arrive while it runs
        await asyncio.sleep(0)
        assert b.queued() == 11
        release.set()
        results = await asyncio.gather(first, *rest)
        await b.close()
        return sizes, results

    sizes, results = asyncio.run(scenario())
    # Ray's @serve.batch with no wait would have made 11 batches of 1 here.
    assert sizes == [1, 8, 3]
    assert results == [i * 10 for i in range(12)]


def test_an_idle_batcher_runs_a_lone_request_at_once_and_a_wait_collects_more():
    async def scenario(wait):
        sizes = []

        async def handler(items):
            sizes.append(len(items))
            return items

        b = Batcher(handler, max_batch_size=4, wait_timeout_s=wait)
        first = asyncio.ensure_future(b.submit("a"))
        await asyncio.sleep(0.01 if wait == 0 else 0)  # no wait: "a" runs alone before "b" arrives
        second = asyncio.ensure_future(b.submit("b"))
        out = await asyncio.gather(first, second)
        await b.close()
        return sizes, out

    assert asyncio.run(scenario(0.0)) == ([1, 1], ["a", "b"])
    assert asyncio.run(scenario(5.0)) == ([2], ["a", "b"])  # the wait ends early: b arrives at once


def test_a_failing_batch_fails_its_items_only_and_settings_are_validated():
    async def scenario():
        async def handler(items):
            if "bad" in items:
                raise ValueError("boom")
            return items

        b = Batcher(handler, max_batch_size=1)
        with pytest.raises(ValueError, match="boom"):
            await b.submit("bad")
        assert await b.submit("good") == "good"  # the worker survived

        async def short(items):
            return []

        s = Batcher(short)
        with pytest.raises(RuntimeError, match="0 results for 1 items"):
            await s.submit("x")
        await b.close()
        await s.close()

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="max_batch_size must be >= 1"):
        Batcher(lambda items: items, max_batch_size=0)
    with pytest.raises(ValueError, match="wait_timeout_s must be >= 0"):
        Batcher(lambda items: items, wait_timeout_s=-1)


def test_a_cancelled_request_is_dropped_before_its_batch_runs():
    async def scenario():
        seen, release = [], asyncio.Event()

        async def handler(items):
            seen.append(list(items))
            if len(seen) == 1:
                await release.wait()
            return items

        b = Batcher(handler, max_batch_size=8)
        first = asyncio.ensure_future(b.submit(0))
        while not seen:  # the first batch is running
            await asyncio.sleep(0)
        gone, kept = asyncio.ensure_future(b.submit(1)), asyncio.ensure_future(b.submit(2))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        assert await first == 0 and await kept == 2
        await b.close()
        return seen

    assert asyncio.run(scenario()) == [[0], [2]]


def test_requests_a_few_loop_turns_behind_the_first_join_its_batch():
    # An HTTP request the loop has read takes a few turns of the loop (routing, parsing) to
    # reach the queue: those join the batch; a request that comes later runs in the next one.
    async def scenario():
        sizes = []

        async def handler(items):
            sizes.append(len(items))
            return items

        b = Batcher(handler, max_batch_size=8)

        async def after(turns, item):
            for _ in range(turns):
                await asyncio.sleep(0)
            return await b.submit(item)

        out = await asyncio.gather(b.submit(0), after(1, 1), after(2, 2))
        # one that comes more than ARRIVAL_TURNS idle turns after the first: the next batch
        out += await asyncio.gather(b.submit(3), after(2 * ARRIVAL_TURNS + 2, 4))
        await b.close()
        return sizes, out

    assert asyncio.run(scenario()) == ([3, 1, 1], [0, 1, 2, 3, 4])
