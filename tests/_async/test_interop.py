"""``interop="redis-py"``: a tenure lock that also holds redis-py's own key of the
lock, so processes on redis-py's ``Lock`` and on tenure exclude each other
during a migration.

Written once for asyncio and generated for threads; runs on the cluster too.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
import redis.asyncio

from tenure import (
    ArgumentError,
    AsyncClusterLock,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncReentrantLock,
    AsyncSemaphore,
    LockNotOwnedError,
)
from tests._backend_asyncio import in_line, join, spawn, until

pytestmark = pytest.mark.topologies("standalone", "cluster")


def _redis_py_lock(client: redis.asyncio.Redis, name: str, timeout: float | None = 10) -> Any:
    return client.lock(name, timeout=timeout, sleep=0.01, thread_local=False)


async def test_a_hold_is_also_redis_pys_key(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    lock = AsyncLock(tenure_async_client, "orders", timeout=10, interop="redis-py")
    assert await lock.acquire()
    token = lock.local.token
    assert await tenure_async_client.get("orders") == token
    assert 9_000 < await tenure_async_client.pttl("orders") <= 10_000
    theirs = _redis_py_lock(other_client, "orders")
    assert await theirs.acquire(blocking=False) is False
    assert await lock.extend(20)
    assert 29_000 < await tenure_async_client.pttl("orders") <= 30_000
    await lock.release()
    assert await tenure_async_client.exists("orders") == 0
    assert await theirs.acquire(blocking=False)
    await theirs.release()


async def test_a_redis_py_holder_keeps_tenure_out_until_it_releases(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    theirs = _redis_py_lock(other_client, "orders", timeout=None)  # a key that never expires
    assert await theirs.acquire()
    ours = AsyncLock(tenure_async_client, "orders", timeout=10, sleep=0.05, interop="redis-py")
    assert await ours.locked()
    assert await ours.acquire(blocking=False) is False
    assert await ours.acquire(blocking_timeout=0.3) is False
    waiting = spawn(lambda: ours.acquire(blocking_timeout=10))
    await until(lambda: in_line(tenure_async_client, ours, 1), 5, "the waiter in line")
    released = time.monotonic()
    await theirs.release()
    assert await join(waiting)
    assert time.monotonic() - released < 5  # it looks again every `sleep`, not at a refresh
    assert await tenure_async_client.get("orders") == ours.local.token
    await ours.release()


async def test_a_handoff_moves_redis_pys_key_to_the_next_holder(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    first = AsyncLock(tenure_async_client, "orders", timeout=10, interop="redis-py")
    second = AsyncLock(other_client, "orders", timeout=10, interop="redis-py")
    assert await first.acquire()
    waiting = spawn(lambda: second.acquire(blocking_timeout=10))
    await until(lambda: in_line(tenure_async_client, first, 1), 5, "the waiter in line")
    await first.release()
    assert await join(waiting)
    assert await tenure_async_client.get("orders") == second.local.token
    theirs = _redis_py_lock(other_client, "orders")
    assert await theirs.acquire(blocking=False) is False
    await second.release()
    assert await tenure_async_client.exists("orders") == 0


async def test_a_renewed_hold_keeps_redis_pys_key_alive(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    # A 1.5 s lease, renewed every 0.5 s: a busy CI worker starved for up to a second keeps it.
    lock = AsyncLock(
        tenure_async_client, "orders", timeout=1.5, auto_renew=True, interop="redis-py"
    )
    assert await lock.acquire()
    taken = time.monotonic()

    async def renewed_past_the_lease() -> bool:
        return lock.statistics().renewals >= 4

    await until(renewed_past_the_lease, 10, "four renewals")
    assert time.monotonic() - taken > 1.5  # past the first lease
    assert await tenure_async_client.get("orders") == lock.local.token
    assert not lock.lost
    await lock.release()


async def test_redis_pys_key_taken_from_under_a_hold_loses_it(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "orders", timeout=10, interop="redis-py")
    assert await lock.acquire()
    await tenure_async_client.set("orders", b"someone-else")  # not redis-py's protocol: a theft
    with pytest.raises(LockNotOwnedError):
        await lock.extend(5)
    assert lock.lost
    assert await tenure_async_client.get("orders") == b"someone-else"  # not released by us
    again = AsyncLock(tenure_async_client, "orders-2", timeout=10, interop="redis-py")
    assert await again.acquire()
    await tenure_async_client.set("orders-2", b"someone-else")
    with pytest.raises(LockNotOwnedError):
        await again.release()
    assert await tenure_async_client.exists(again.keys.owner) == 0  # tenure's side cleared
    assert await tenure_async_client.get("orders-2") == b"someone-else"


async def test_without_interop_redis_pys_key_is_not_touched(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "orders", timeout=10)
    assert await lock.acquire()
    assert await tenure_async_client.exists("orders") == 0
    await lock.release()


async def test_the_family_that_takes_interop(tenure_async_client: redis.asyncio.Redis) -> None:
    for made in (
        AsyncReentrantLock(tenure_async_client, "orders", timeout=10, interop="redis-py"),
        AsyncClusterLock(tenure_async_client, "orders", timeout=10, interop="redis-py"),
    ):
        assert await made.acquire()
        assert await tenure_async_client.get("orders") == made.local.token
        await made.release()
    with pytest.raises(ArgumentError, match="^interop: must be None or 'redis-py', got 'redis'"):
        AsyncLock(tenure_async_client, "orders", interop="redis")
    with pytest.raises(ArgumentError, match="^sleep: must be > 0 with interop"):
        AsyncLock(tenure_async_client, "orders", sleep=0, interop="redis-py")
    with pytest.raises(TypeError):
        AsyncSemaphore(tenure_async_client, "orders", limit=2, interop="redis-py")  # type: ignore[call-arg]
    with pytest.raises(ArgumentError, match="^interop: redis-py has no read-write lock"):
        AsyncReadWriteLock(tenure_async_client, "orders", interop="redis-py")
    # redis-py's lock_class hook takes a class made with interop by functools.partial
    interop_lock: Any = functools.partial(AsyncLock, interop="redis-py")
    by_hook: Any = tenure_async_client.lock("orders", timeout=10, lock_class=interop_lock)
    assert isinstance(by_hook, AsyncLock) and by_hook.interop == "redis-py"


async def test_tenure_waiters_behind_a_redis_py_holder_keep_their_order(
    tenure_async_client: redis.asyncio.Redis, clients: list[redis.asyncio.Redis]
) -> None:
    theirs = _redis_py_lock(clients[0], "orders")
    assert await theirs.acquire()
    order: list[int] = []
    queued = AsyncLock(tenure_async_client, "orders")  # its keys.queue: the waiters' line

    def waiter(index: int) -> Any:
        async def job() -> int:
            lock = AsyncLock(clients[index], "orders", timeout=10, sleep=0.02, interop="redis-py")
            assert await lock.acquire(blocking_timeout=20)
            order.append(index)
            fence = lock.fencing_token
            assert fence is not None
            await lock.release()
            return fence

        return job

    handles = []
    for index in range(1, 6):
        handles.append(spawn(waiter(index)))
        lined = functools.partial(in_line, tenure_async_client, queued, index)
        await until(lined, 10, f"waiter {index} in line")  # in line, in this order
    await theirs.release()
    fences = [await join(handle) for handle in handles]
    assert order == [1, 2, 3, 4, 5]
    assert fences == sorted(fences)


async def test_a_hold_whose_redis_py_key_was_taken_is_not_owned_and_not_entered_again(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    lock = AsyncReentrantLock(tenure_async_client, "orders", timeout=10, interop="redis-py")
    assert await lock.acquire()
    assert await lock.owned()
    await tenure_async_client.delete("orders")  # from outside: then a redis-py process takes it
    theirs = _redis_py_lock(other_client, "orders")
    assert await theirs.acquire(blocking=False)
    assert not await lock.owned()
    with pytest.raises(LockNotOwnedError):
        await lock.acquire(blocking=False)  # a re-entry: it finds the hold lost
    assert await tenure_async_client.exists(lock.keys.owner) == 0  # tenure's side cleared
    rival = AsyncLock(tenure_async_client, "orders", timeout=10, interop="redis-py")
    assert await rival.acquire(blocking=False) is False  # redis-py's holder keeps it
    await theirs.release()
    assert await rival.acquire(blocking=False)
    await rival.release()
