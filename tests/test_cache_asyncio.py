"""asyncio-only cache behaviour: cancellation of callers sharing one request."""

from __future__ import annotations

import asyncio

import redis.asyncio

from tenure import AsyncHerdCache
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
