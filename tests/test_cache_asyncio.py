"""asyncio-only cache behaviour: cancellation of callers sharing one request, or of a first read."""

from __future__ import annotations

import asyncio

import redis.asyncio

from tenure import AsyncHerdCache
from tenure.server import FaultProxy
from tests._backend_asyncio import until


async def test_a_cancelled_caller_does_not_cancel_those_sharing_its_request(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """Task A loads an entry, task B shares A's request; A is cancelled.
    B is not: it asks again itself, and gets the value."""
    cache = AsyncHerdCache(tenure_async_client, "cancel-shared", ttl=30, load_lease=5)
    started = asyncio.Event()
    loads: list[str] = []

    async def slow() -> str:
        loads.append("slow")
        started.set()
        await asyncio.sleep(30)  # the load's work, cut short by the cancellation
        return "never"

    async def quick() -> str:
        loads.append("quick")
        return "value"

    first = asyncio.create_task(cache.fetch("k", slow))
    await started.wait()
    second = asyncio.create_task(cache.fetch("k", quick))

    async def sharing() -> bool:  # the second shares the first's request
        return cache.statistics().shared == 1

    await until(sharing, 5, "the second fetch sharing the first's request")
    first.cancel()
    assert await asyncio.wait_for(second, 5) == "value"
    assert not second.cancelled()
    assert first.cancelled()
    assert loads == ["slow", "quick"]
    assert cache.statistics().shared == 1


async def test_a_fetch_cancelled_in_its_first_read_gives_its_mark_back(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    """Cancelled (``asyncio.timeout``, say) after its first read reached the server and
    before the reply came back, a fetch gives back the load mark that read put in
    place: the next caller loads at once, not after the 30 s lease."""
    slow = tenure_proxy.async_client()
    try:
        cache = AsyncHerdCache(slow, "cancelled-first-read", ttl=30, load_lease=30)
        stored = cache.key_of("k")

        async def loaded() -> str:
            return "never"

        tenure_proxy.set_latency(0.3)
        task = asyncio.create_task(cache.fetch("k", loaded))

        async def marked() -> bool:
            return (await tenure_async_client.getrange(stored, 0, 0)) == b"l"

        await until(marked, 5, "the first read's mark in place")
        task.cancel()
        tenure_proxy.set_latency(0)  # the give-back's own round trips quick again
        try:
            await task
        except asyncio.CancelledError:
            pass

        async def given_back() -> bool:
            return not await tenure_async_client.exists(stored)

        await until(given_back, 3, "the mark given back")
        other = AsyncHerdCache(tenure_async_client, "cancelled-first-read", ttl=30)

        async def fresh() -> str:
            return "fresh"

        assert await asyncio.wait_for(other.fetch("k", fresh), 2) == "fresh"
        assert other.statistics().waits == 0
    finally:
        tenure_proxy.set_latency(0)
        await slow.aclose()
