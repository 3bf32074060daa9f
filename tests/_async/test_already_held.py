"""Acquiring what one holds: False when non-blocking; a blocking acquire raises
AlreadyHeldError, whose hint suggests only what the primitive has. A fixed lease
that ran out ends the hold: the object acquires again.

Written once for asyncio and generated for threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
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
    LockLostError,
    LockNotOwnedError,
)
from tests._backend_asyncio import until


async def _second_acquire(primitive: Any) -> str:
    """Acquire twice on one owner: non-blocking, False (as redis-py); blocking, refused."""
    assert await primitive.acquire()
    try:
        assert await primitive.acquire(blocking=False) is False
        with pytest.raises(AlreadyHeldError) as caught:
            await primitive.acquire()
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


async def server_ms(client: redis.asyncio.Redis) -> int:
    """The server's clock (TIME) in ms: the one its leases expire by."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


KINDS: dict[str, Callable[..., Any]] = {
    "lock": lambda client, name, **kw: AsyncLock(client, name, **kw),
    "reentrant": lambda client, name, **kw: AsyncReentrantLock(client, name, **kw),
    "cluster-lock": lambda client, name, **kw: AsyncClusterLock(
        client, name, replica_timeout=0.05, **kw
    ),
    "semaphore": lambda client, name, **kw: AsyncSemaphore(client, name, limit=1, **kw),
    "read": lambda client, name, **kw: AsyncReadWriteLock(client, name, **kw).read,
    "write": lambda client, name, **kw: AsyncReadWriteLock(client, name, **kw).write,
    "redlock": lambda client, name, **kw: AsyncRedlock([client], name, **kw),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_lease_that_ran_out_ends_the_hold(
    tenure_async_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Acquire with a fixed lease and let it run out (the throttle idiom): the
    object acquires again, and the lost notice says what happened."""
    notices: list[Any] = []
    # A 0.6 s lease: a CI worker starved for 0.2 s saw a 0.2 s one end before it looked.
    primitive = KINDS[kind](
        tenure_async_client, f"ran-out-{kind}", timeout=0.6, on_lost=notices.append
    )
    before = time.monotonic()
    assert await primitive.acquire()
    lease_end = await server_ms(tenure_async_client) + 600  # it began before this TIME
    lost_at_once = primitive.lost
    if time.monotonic() < before + 0.6:
        # Not yet lost, unless this process stalled past the lease itself (a
        # starved CI worker did once): then it is rightly lost already.
        assert not lost_at_once

    async def ran_out() -> bool:  # for the object, and on the server's clock
        return primitive.lost and await server_ms(tenure_async_client) > lease_end

    await until(ran_out, 5, "the 0.6 s lease running out")
    assert primitive.lost  # its lease ran out
    with caplog.at_level(logging.WARNING, logger="tenure"):
        assert await primitive.acquire(blocking=False)
    assert not primitive.lost  # a new hold
    assert notices == [primitive]
    assert primitive.statistics().lost == 1
    assert any("lease ran out before it was released" in r.getMessage() for r in caplog.records)
    await primitive.release()


async def test_a_reentrant_lock_does_not_reenter_a_hold_found_lost(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """Re-entering would start a new hold under the outer one and hide the gap
    in which this owner held nothing: refused, until the lost hold is let go."""
    lock = AsyncReentrantLock(tenure_async_client, "reenter-lost", timeout=0.6, auto_renew=True)
    assert await lock.acquire()
    await tenure_async_client.delete(lock.keys.owner)  # gone: a flush, a failover

    async def found_lost() -> bool:
        return lock.lost

    await until(found_lost, 5, "the renewal finding the hold gone")
    with pytest.raises(LockLostError, match="cannot re-enter"):
        await lock.acquire(blocking=False)
    assert lock.lost  # nothing changed
    with pytest.raises(LockNotOwnedError):
        await lock.release()  # let go (its release is refused: it was lost)
    assert await lock.acquire(blocking=False)  # afresh
    assert await lock.owned()
    await lock.release()
