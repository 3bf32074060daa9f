"""asyncio: a release or a downgrade cancelled past its shield is finished in the background.

Found by a hostile review: a release waiting for a pooled connection, cancelled
twice, left the hold on the server for its whole lease with nobody owning it;
a downgrade cancelled mid-call left a read hold its owner could not release.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio

from tenure import AsyncLock, AsyncReadWriteLock, AsyncReentrantLock, AsyncSemaphore
from tenure.server import ServerProcess

KINDS: dict[str, Callable[[Any, str], Any]] = {
    "lock": lambda client, name: AsyncLock(client, name),
    "reentrant": lambda client, name: AsyncReentrantLock(client, name),
    "semaphore": lambda client, name: AsyncSemaphore(client, name, limit=1),
    "write": lambda client, name: AsyncReadWriteLock(client, name).write,
}


async def _free_within(
    make: Callable[[Any, str], Any], client: Any, name: str, seconds: float
) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        other = make(client, name)
        if await other.acquire(blocking=False):
            await other.release()
            return True
        await asyncio.sleep(0.05)
    return False


async def _busy(client: Any) -> None:
    """Keep the client's one pooled connection for a second."""
    await client.blpop(["nothing"], timeout=1)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_release_cancelled_twice_while_it_waits_for_a_connection_still_happens(
    tenure_server: ServerProcess, kind: str
) -> None:
    make = KINDS[kind]
    name = f"cancelled-release-{kind}"
    pool = redis.asyncio.BlockingConnectionPool(
        port=tenure_server.port, max_connections=1, timeout=10
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    other = tenure_server.async_client()
    try:
        held = make(client, name)
        assert await held.acquire()
        blocker = asyncio.ensure_future(_busy(client))  # the one connection
        await asyncio.sleep(0.05)
        releasing = asyncio.create_task(held.release())  # waits for that connection
        await asyncio.sleep(0.05)
        releasing.cancel()
        await asyncio.sleep(0.01)
        releasing.cancel()  # past the shield: the call is cancelled before it was sent
        with pytest.raises(asyncio.CancelledError):
            await releasing
        await blocker
        # Not held for its 30 s lease: released by the background finish.
        assert await _free_within(make, other, name, 5)
    finally:
        await client.aclose()
        await other.aclose()


async def test_a_downgrade_cancelled_past_its_shield_leaves_a_hold_its_owner_can_release(
    tenure_server: ServerProcess,
) -> None:
    pool = redis.asyncio.BlockingConnectionPool(
        port=tenure_server.port, max_connections=1, timeout=10
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    other = tenure_server.async_client()
    try:
        rw = AsyncReadWriteLock(client, "cancelled-downgrade")
        assert await rw.write.acquire()
        blocker = asyncio.ensure_future(_busy(client))
        await asyncio.sleep(0.05)
        downgrading = asyncio.create_task(rw.write.downgrade())
        await asyncio.sleep(0.05)
        downgrading.cancel()
        await asyncio.sleep(0.01)
        downgrading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await downgrading
        await blocker
        deadline = time.monotonic() + 5
        while not await rw.write.owned() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await rw.write.owned()  # the hold followed the downgrade made in the background
        reader = AsyncReadWriteLock(other, "cancelled-downgrade").read
        assert await reader.acquire(blocking=False)  # a read hold now: readers may join
        await reader.release()
        await rw.write.release()
        writer = AsyncReadWriteLock(other, "cancelled-downgrade").write
        assert await writer.acquire(blocking=False)  # released: nothing left behind
        await writer.release()
    finally:
        await client.aclose()
        await other.aclose()
