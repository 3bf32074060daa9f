"""AlreadyHeldError's hint suggests only what the primitive has.

Written once for asyncio and generated for threads.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio

from tenure import (
    AlreadyHeldError,
    ArgumentError,
    AsyncClusterLock,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncRedlock,
    AsyncReentrantLock,
    AsyncSemaphore,
)


async def _second_acquire(primitive: Any) -> str:
    assert await primitive.acquire()
    try:
        with pytest.raises(AlreadyHeldError) as caught:
            await primitive.acquire(blocking=False)
    finally:
        await primitive.release()
    return str(caught.value)


async def test_a_lock_suggests_its_reentrant_option_and_it_works(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    text = await _second_acquire(AsyncLock(tenure_async_client, "held"))
    assert "reentrant=True" in text and "AsyncReentrantLock" in text
    for lock in (
        AsyncLock(tenure_async_client, "held", reentrant=True),
        AsyncReentrantLock(tenure_async_client, "held"),
    ):
        assert await lock.acquire() and await lock.acquire(blocking=False)
        await lock.release()
        await lock.release()


async def test_a_cluster_lock_suggests_reentrant_and_it_works(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    text = await _second_acquire(AsyncClusterLock(tenure_async_client, "held-c"))
    assert "reentrant=True" in text and "ReentrantLock" not in text
    lock = AsyncClusterLock(tenure_async_client, "held-c", reentrant=True)
    assert await lock.acquire() and await lock.acquire(blocking=False)
    await lock.release()
    await lock.release()


async def test_a_semaphore_suggests_a_second_object_and_it_works(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    text = await _second_acquire(AsyncSemaphore(tenure_async_client, "held-s", limit=2))
    assert "reentrant" not in text
    assert "not re-entrant" in text and "second AsyncSemaphore object" in text
    with pytest.raises(TypeError):
        AsyncSemaphore(tenure_async_client, "held-s", limit=2, reentrant=True)  # type: ignore[call-arg]
    first = AsyncSemaphore(tenure_async_client, "held-s", limit=2)
    second = AsyncSemaphore(tenure_async_client, "held-s", limit=2)
    assert await first.acquire() and await second.acquire(blocking=False)
    assert await first.holders() == 2
    await first.release()
    await second.release()


async def test_a_redlock_says_it_is_not_reentrant(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    text = await _second_acquire(AsyncRedlock([tenure_async_client], "held-r"))
    assert "reentrant" not in text and "not re-entrant" in text
    with pytest.raises(TypeError):
        AsyncRedlock([tenure_async_client], "held-r", reentrant=True)  # type: ignore[call-arg]


async def test_a_read_write_lock_says_it_is_not_reentrant_and_refuses_the_option(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    rw = AsyncReadWriteLock(tenure_async_client, "held-rw")
    for side in (rw.read, rw.write):
        text = await _second_acquire(side)
        assert "reentrant" not in text and "not re-entrant" in text
    with pytest.raises(ArgumentError, match="reentrant"):
        AsyncReadWriteLock(tenure_async_client, "held-rw", reentrant=True)
    assert AsyncReadWriteLock(tenure_async_client, "held-rw", reentrant=False).name == "held-rw"
