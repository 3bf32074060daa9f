"""Lock-family names as redis-py takes them: a name's own hash tag is kept (all the
keys land in the tag's slot), ``bytes`` names are the same lock as their text.

Written once for asyncio and generated for threads; runs on the cluster too.
"""

from __future__ import annotations

import pytest
import redis.asyncio
from redis.crc import key_slot

from tenure import AsyncLock, AsyncReadWriteLock, AsyncSemaphore

pytestmark = pytest.mark.topologies("standalone", "cluster")


async def _slots(client: redis.asyncio.Redis) -> set[int]:
    return {key_slot(key) async for key in client.scan_iter(match="tenure:*")}


async def test_a_name_with_a_hash_tag_keeps_its_slot(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    name = "lock:{user42}"
    await tenure_async_client.set("{user42}:profile", "x")  # the user's data
    lock = AsyncLock(tenure_async_client, name, timeout=10)
    assert await lock.acquire()
    rival = AsyncLock(other_client, name, timeout=10)
    assert await rival.acquire(blocking=False) is False
    semaphore = AsyncSemaphore(tenure_async_client, name, limit=2, timeout=10)
    assert await semaphore.acquire()
    rwlock = AsyncReadWriteLock(tenure_async_client, name, timeout=10)
    assert await rwlock.read.acquire()
    assert await _slots(tenure_async_client) == {key_slot(b"user42")}
    assert key_slot(b"{user42}:profile") == key_slot(name.encode())
    await lock.release()
    assert await rival.acquire(blocking=False)
    await rival.release()
    await semaphore.release()
    await rwlock.read.release()


async def test_a_plain_name_and_a_tagged_one_are_different_locks(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    plain = AsyncLock(tenure_async_client, "user42", timeout=10)
    tagged = AsyncLock(tenure_async_client, "{user42}", timeout=10)
    assert await plain.acquire(blocking=False)
    assert await tagged.acquire(blocking=False)
    await plain.release()
    await tagged.release()


async def test_a_bytes_name_is_the_same_lock_as_its_text(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    by_bytes = AsyncLock(tenure_async_client, b"orders", timeout=10)
    assert by_bytes.name == "orders"
    assert await by_bytes.acquire()
    by_text = AsyncLock(other_client, "orders", timeout=10)
    assert await by_text.locked()
    assert await by_text.acquire(blocking=False) is False
    await by_bytes.release()
    assert await by_text.acquire(blocking=False)
    await by_text.release()
    permit = AsyncSemaphore(tenure_async_client, "caf\u00e9".encode(), limit=1, timeout=10)
    assert permit.name == "caf\u00e9"
    assert await permit.acquire()
    assert await AsyncSemaphore(other_client, "caf\u00e9", limit=1).acquire(blocking=False) is False
    await permit.release()
