"""Waiting without the user's connections, redis-py drop-in, ownership and leftovers.

Written once for asyncio and generated for threads (issue 9's contract).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster

from tenure import (
    AcquireTimeoutError,
    ArgumentError,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    LockLostError,
    LockNotOwnedError,
    SemaphoreLimitError,
)
from tenure._async import _line
from tenure._async._wakeups import AsyncWakeups, wakeups_for
from tenure._backends.for_asyncio import IS_ASYNC
from tenure._core.leased import IDLE_TTL_MS
from tenure.server import ServerProcess
from tests._backend_asyncio import gather, in_line, join, sleep, spawn, subscribed, until

pytestmark = pytest.mark.topologies("standalone", "cluster")

_blocking_pool: Any = redis.asyncio.BlockingConnectionPool  # untyped in redis-py


def _bounded_client(server: ServerProcess, connections: int) -> redis.asyncio.Redis:
    pool = _blocking_pool(
        host=server.host, port=server.port, max_connections=connections, timeout=10
    )
    return redis.asyncio.Redis(connection_pool=pool)


def _closed(wakeups: AsyncWakeups) -> bool:
    return wakeups.closed


async def _client_count(admin: redis.asyncio.Redis) -> int:
    return len(await admin.client_list())


async def test_waiters_never_take_the_users_pooled_connections(
    tenure_server: ServerProcess, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = _bounded_client(tenure_server, 3)
    held: list[float] = []

    async def worker() -> None:
        lock = AsyncLock(client, "bounded", blocking_timeout=10)
        for _ in range(3):
            async with lock:
                held.append(time.monotonic())

    started = time.monotonic()
    await gather(*[worker for _ in range(6)])
    elapsed = time.monotonic() - started
    assert len(held) == 18
    # The old BLPOP waiters took 50 s here; redis-py's Lock about 0.5 s.
    assert elapsed < 8, elapsed
    await client.aclose()
    await client.connection_pool.disconnect()


async def test_a_single_connection_client_releases_without_delay(
    tenure_server: ServerProcess,
) -> None:
    holder_client = redis.asyncio.Redis(
        host=tenure_server.host, port=tenure_server.port, single_connection_client=True
    )
    waiter_client = redis.asyncio.Redis(
        host=tenure_server.host, port=tenure_server.port, single_connection_client=True
    )
    holder = AsyncLock(holder_client, "single", thread_local=False)
    waiter = AsyncLock(waiter_client, "single", blocking_timeout=5)
    assert await holder.acquire()
    before = wakeups_for(waiter_client).messages

    async def wait_for_it() -> float:
        assert await waiter.acquire()
        return time.monotonic()

    async def release_soon() -> float:
        await until(lambda: in_line(holder_client, holder, 1), 5, "the waiter in line")
        await holder.release()
        return time.monotonic()

    got, released = await gather(wait_for_it, release_soon)
    assert got - released < 0.5
    assert wakeups_for(waiter_client).messages > before  # woken by the grant, not a re-check
    await waiter.release()
    await holder_client.aclose()
    await waiter_client.aclose()


async def test_many_waiters_share_one_connection(
    tenure_server: ServerProcess, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = _bounded_client(tenure_server, 4)
    holder = AsyncLock(tenure_async_client, "crowded", thread_local=False)
    assert await holder.acquire()
    baseline = await _client_count(tenure_async_client)
    seen: list[int] = []
    waiters = 40

    async def wait_in_line() -> None:
        lock = AsyncLock(client, "crowded", blocking_timeout=20)
        assert await lock.acquire()
        await lock.release()

    async def watch() -> None:
        await until(lambda: in_line(tenure_async_client, holder, waiters), 20, "every waiter")
        seen.append(await _client_count(tenure_async_client))
        await holder.release()

    await gather(watch, *[wait_in_line for _ in range(waiters)])
    # The user's pool (4) plus tenure's one subscriber connection.
    assert seen[0] - baseline <= 4 + 2, (seen, baseline)
    await client.aclose()
    await client.connection_pool.disconnect()


async def _script_calls(admin: redis.asyncio.Redis) -> int:
    stats = await admin.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("calls", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )


def _one_of(kind: str, client: Any, name: str, **options: Any) -> Any:
    """A lock, a permit of a semaphore with one permit, or a read-write lock's write side."""
    if kind == "semaphore":
        return AsyncSemaphore(client, name, limit=1, **options)
    if kind == "write":
        return AsyncReadWriteLock(client, name, **options).write
    return AsyncLock(client, name, **options)


@pytest.mark.standalone_only  # INFO reaches one node
@pytest.mark.parametrize("kind", ["lock", "semaphore", "write"])
async def test_waiters_of_one_process_keep_their_places_with_one_call(
    kind: str, tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    """However many wait in one process, their places cost one call per
    refresh (the process's line), and outlive twice their waiter lease."""
    admin = other_client
    calls: dict[int, int] = {}
    for count in (4, 60):
        name = f"one-line-{kind}-{count}"
        holder = _one_of(kind, admin, name, thread_local=False)
        assert await holder.acquire()
        order: list[int] = []

        async def wait_in_line(i: int, name: str = name, order: list[int] = order) -> None:
            lock = _one_of(kind, tenure_async_client, name, waiter_lease=0.5, blocking_timeout=30)
            assert await lock.acquire()
            order.append(i)
            await lock.release()

        async def watch(count: int = count, holder: Any = holder) -> None:
            await until(lambda: in_line(admin, holder, count), 10, "every waiter in line")
            before = await _script_calls(admin)
            await sleep(1.5)  # three waiter leases: refreshes only
            calls[count] = await _script_calls(admin) - before
            await holder.release()

        await gather(watch, *[lambda i=i: wait_in_line(i) for i in range(count)])
        assert sorted(order) == list(range(count))
    # Per waiter, 60 waiters would make about 450 refresh calls in 1.5 s.
    assert calls[60] <= calls[4] + 4, calls
    assert calls[60] <= 20, calls


@pytest.mark.parametrize("kind", ["lock", "semaphore", "write"])
async def test_the_first_to_call_acquire_stays_first_in_its_process(
    kind: str, tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    """The first acquirer tries the lock; those who call acquire() while its
    try is on its way join the process's line: it is still served first, and
    they in the order they called."""
    name = f"first-stays-first-{kind}"
    holder = _one_of(kind, other_client, name, thread_local=False)
    assert await holder.acquire()
    order: list[int] = []
    # asyncio: all in one go (the others call while the first one's try is on
    # its way); threads: a little apart, so they call in their order.
    apart = 0.0 if IS_ASYNC else 0.01

    async def take(i: int) -> None:
        await sleep(i * apart)
        lock = _one_of(kind, tenure_async_client, name, blocking_timeout=20)
        assert await lock.acquire()
        order.append(i)
        await lock.release()

    async def release_later() -> None:
        await until(lambda: in_line(other_client, holder, 30), 10, "every waiter in line")
        await holder.release()

    await gather(release_later, *[lambda i=i: take(i) for i in range(30)])
    if IS_ASYNC:
        assert order == list(range(30))
    else:  # a loaded machine may run a thread late: only the first is sure to call first
        assert order[0] == 0 and sorted(order) == list(range(30)), order


@pytest.mark.parametrize("kind", ["lock", "semaphore", "write"])
async def test_acquirers_held_back_behind_a_try_join_once_it_is_in_line(
    kind: str,
    tenure_async_client: redis.asyncio.Redis,
    other_client: redis.asyncio.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Those who call acquire() while the first acquirer's try is on its way wait
    for it to be in line (end_try), then join at once, not after HOLD_JOINS."""
    monkeypatch.setattr(_line, "HOLD_JOINS", 60.0)  # a join held back until then: plain to see
    name = f"held-back-{kind}"
    holder = _one_of(kind, other_client, name, thread_local=False)
    assert await holder.acquire()
    # A waiter lease of 60 s: the line's refresh rounds (every 24 s) cannot join them instead.
    locks = [
        _one_of(kind, tenure_async_client, name, blocking_timeout=60, waiter_lease=60)
        for _ in range(6)
    ]

    async def take(lock: Any) -> bool:
        got = bool(await lock.acquire())
        if got:
            await lock.release()
        return got

    waiting = [spawn(functools.partial(take, lock)) for lock in locks]
    try:
        await until(lambda: in_line(other_client, holder, 6), 10, "every waiter in line")
    finally:
        await holder.release()
        assert [await join(handle) for handle in waiting] == [True] * 6


async def test_a_waiting_second_owner_of_a_chosen_token_holds_nobody_back(
    tenure_async_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A semaphore with a permit free: an acquirer that came after a second owner of
    a held chosen token (refused, waiting on its own) takes the free permit at once."""
    monkeypatch.setattr(_line, "HOLD_JOINS", 60.0)
    first, second, third = (
        AsyncSemaphore(tenure_async_client, "second-owner", limit=2, timeout=10) for _ in range(3)
    )
    assert await first.acquire(token="worker-1")
    waiting = spawn(lambda: second.acquire(token="worker-1", blocking_timeout=30))
    await until(lambda: _waiting(second), 10, "the second owner refused, waiting")
    assert await third.acquire(blocking_timeout=10)
    assert third.statistics().wait_max < 5  # not held back until HOLD_JOINS (60 s)
    await third.release()
    await first.release()
    assert await join(waiting)
    await second.release()


async def _waiting(primitive: Any) -> bool:
    return bool(primitive.statistics().waiters)


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
async def test_many_waiters_timing_out_together_leave_in_one_call(
    kind: str, client_with: Any, other_client: Any
) -> None:
    """60 waiters of one process reach their deadline together on a client
    with 8 connections: each returns False in time (no pool exhausted by 60
    leaves of their own), and the queue is empty."""
    client = await client_with(max_connections=8)
    name = f"mass-timeout-{kind}"
    holder = _one_of(kind, other_client, name, thread_local=False)
    assert await holder.acquire()
    took: list[float] = []

    async def wait_out() -> None:
        lock = _one_of(kind, client, name, blocking_timeout=1.0)
        started = time.monotonic()
        assert not await lock.acquire()
        took.append(time.monotonic() - started)

    await gather(*[wait_out for _ in range(60)])
    assert len(took) == 60
    assert min(took) >= 1.0
    assert max(took) <= 1.5, sorted(took)[-5:]
    assert await other_client.zcard(holder.keys.queue) == 0
    await holder.release()


async def test_the_wakeup_connection_closes_when_idle(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    holder = AsyncLock(tenure_async_client, "idle", thread_local=False)
    waiter = AsyncLock(other_client, "idle", blocking_timeout=5)
    assert await holder.acquire()

    async def release_soon() -> None:
        await until(lambda: in_line(tenure_async_client, holder, 1), 5, "the waiter in line")
        await holder.release()

    async def take() -> None:
        assert await waiter.acquire()
        await waiter.release()

    await gather(release_soon, take)
    wakeups = wakeups_for(other_client, waiter.keys.owner)
    assert not _closed(wakeups)

    async def closed() -> bool:
        return _closed(wakeups)

    await until(closed, 4, "the idle wake-up connection's close")


async def test_lock_class_hook_and_redis_py_signature(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    client: Any = tenure_async_client  # redis-py's stubs expect its own Lock class here
    lock = client.lock("hooked", lock_class=AsyncLock, raise_on_release_error=False)
    assert isinstance(lock, AsyncLock)
    assert lock.redis is tenure_async_client
    assert lock.raise_on_release_error is False
    assert lock.thread_local is True
    positional = AsyncLock(tenure_async_client, "pos", 5, 0.01, False, 2.0, False, False)
    assert (positional.timeout, positional.sleep, positional.blocking) == (5, 0.01, False)
    assert (positional.blocking_timeout, positional.thread_local) == (2.0, False)
    assert positional.raise_on_release_error is False
    assert await lock.acquire(sleep=0.05, blocking=False)
    await lock.release()
    with pytest.raises(redis.exceptions.LockNotOwnedError):
        await lock.release()
    with pytest.raises(redis.exceptions.LockError):
        await lock.release()
    positional.blocking_timeout = 0.1
    assert positional.blocking_timeout == 0.1


async def test_with_block_reports_a_release_inside_it(
    tenure_async_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lock = AsyncLock(tenure_async_client, "inside")
    with pytest.raises(LockNotOwnedError, match="released inside"):
        async with lock:
            await lock.release()
    quiet = AsyncLock(tenure_async_client, "inside", raise_on_release_error=False)
    with caplog.at_level(logging.WARNING, logger="tenure.lock"):
        async with quiet:
            await quiet.release()
    assert "released inside" in caplog.text


async def test_a_lost_lease_in_a_with_block_is_a_lock_not_owned_error(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "short", timeout=0.2)
    with pytest.raises(redis.exceptions.LockNotOwnedError) as caught:
        async with lock:

            async def taken_by_another() -> bool:  # the 0.2 s lease runs out in the block
                return await AsyncLock(tenure_async_client, "short").acquire(blocking=False)

            await until(taken_by_another, 5, "another taking the lock")
    assert isinstance(caught.value, LockLostError)
    quiet = AsyncLock(tenure_async_client, "short2", timeout=0.2, raise_on_release_error=False)
    async with quiet:

        async def ran_out() -> bool:
            return quiet.lost

        await until(ran_out, 5, "the 0.2 s lease running out")  # lost: logged, not raised


async def test_semaphore_limit_is_stored_on_the_server(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    one = AsyncSemaphore(tenure_async_client, "limited", limit=1)
    five = AsyncSemaphore(tenure_async_client, "limited", limit=5)
    assert await one.acquire()
    with pytest.raises(SemaphoreLimitError) as caught:
        await five.acquire(blocking=False)
    assert (caught.value.stored, caught.value.given) == (1, 5)
    with pytest.raises(SemaphoreLimitError):
        await five.acquire(blocking_timeout=1)
    assert await one.holders() == 1
    # Changing it is an explicit call, for everyone.
    assert await five.set_limit(5) == 1
    assert await five.acquire(blocking=False)
    with pytest.raises(SemaphoreLimitError):
        await AsyncSemaphore(tenure_async_client, "limited", limit=1).acquire(blocking=False)
    await five.release()
    await one.release()


async def test_a_larger_limit_lets_waiters_in(tenure_async_client: redis.asyncio.Redis) -> None:
    sem = AsyncSemaphore(tenure_async_client, "grow", limit=1, thread_local=False)
    assert await sem.acquire()
    other = AsyncSemaphore(tenure_async_client, "grow", limit=1, blocking_timeout=5)

    async def wait() -> float:
        assert await other.acquire()
        return time.monotonic()

    async def grow() -> float:
        await until(lambda: in_line(tenure_async_client, sem, 1), 5, "the waiter in line")
        await AsyncSemaphore(tenure_async_client, "grow", limit=1).set_limit(2)
        return time.monotonic()

    got, grown = await gather(wait, grow)
    assert got - grown < 0.5
    assert await sem.holders() == 2


async def test_an_idle_primitive_leaves_no_key_without_expiry(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    await tenure_async_client.flushdb()
    lock = AsyncLock(tenure_async_client, "idle-lock")
    sem = AsyncSemaphore(tenure_async_client, "idle-sem", limit=2)
    rw = AsyncReadWriteLock(tenure_async_client, "idle-rw")
    for primitive in (lock, sem, rw.read, rw.write):
        async with primitive:
            pass
    keys = await tenure_async_client.keys("*")
    assert keys
    for key in keys:
        ttl = await tenure_async_client.pttl(key)
        assert 0 < ttl <= IDLE_TTL_MS, (key, ttl)


async def test_fencing_tokens_grow_after_the_counter_is_gone(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "reborn")
    sem = AsyncSemaphore(tenure_async_client, "reborn", limit=1)
    for primitive in (lock, sem):
        seen: list[int] = []
        for _ in range(3):
            async with primitive:
                assert primitive.fencing_token is not None
                seen.append(primitive.fencing_token)
            # The idle expiry (or a restart without persistence) removed the
            # counter (a semaphore's key; a lock's marker, its owner hash).
            await tenure_async_client.delete(
                primitive.keys.owner if isinstance(primitive, AsyncLock) else primitive.keys.fence
            )
        assert seen == sorted(seen) and len(set(seen)) == 3


async def test_waiters_are_woken_on_a_cluster(
    tenure_async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    holder = AsyncLock(tenure_async_cluster_client, "cluster-wake", thread_local=False)
    waiter = AsyncLock(tenure_async_cluster_client, "cluster-wake", blocking_timeout=5)
    assert await holder.acquire()
    # The waiter listens on the node that serves the lock's key.
    wakeups = wakeups_for(tenure_async_cluster_client, waiter.keys.owner)
    cluster: Any = tenure_async_cluster_client  # the sync client's method is untyped
    node = cluster.get_node_from_key(waiter.keys.owner)
    assert node is not None and f"cluster node {node.host}:{node.port}" in repr(wakeups)
    before = wakeups.messages

    async def take() -> None:
        assert await waiter.acquire()

    async def release_soon() -> None:
        await until(lambda: in_line(cluster, holder, 1), 5, "the waiter in line")
        await holder.release()

    await gather(take, release_soon)
    assert wakeups.messages > before
    await waiter.release()


@pytest.mark.standalone_only  # CLIENT KILL reaches one node; the subscriber may be on another
async def test_a_lost_wakeup_costs_at_most_a_recheck(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    holder = AsyncLock(tenure_async_client, "lost-wake", thread_local=False)
    waiter = AsyncLock(other_client, "lost-wake", blocking_timeout=5)
    assert await holder.acquire()

    async def take() -> float:
        assert await waiter.acquire()
        return time.monotonic()

    async def cut_and_release() -> float:
        # Once the waiter listens (a loaded machine may take longer than a
        # moment to subscribe), its subscriber connection goes (a proxy
        # restart, a network blip): the grant published meanwhile is heard by
        # nobody.
        await until(lambda: subscribed(tenure_async_client), 5, "the waiter's subscription")
        await until(lambda: in_line(tenure_async_client, holder, 1), 5, "the waiter in line")
        killed = await tenure_async_client.client_kill_filter(_type="pubsub")
        assert killed >= 1
        await holder.release()
        return time.monotonic()

    got, released = await gather(take, cut_and_release)
    assert got - released < 1.5  # the reconnect (or the 0.8 s re-check) found the grant
    await waiter.release()


async def test_an_acl_without_channels_still_hands_over(
    no_channels_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    holder = AsyncLock(no_channels_client, "acl", thread_local=False)
    waiter = AsyncLock(no_channels_client, "acl", blocking_timeout=5)
    assert await holder.acquire()

    async def take() -> float:
        assert await waiter.acquire()
        return time.monotonic()

    async def release_soon() -> float:
        await until(lambda: in_line(no_channels_client, holder, 1), 5, "the waiter in line")
        await holder.release()  # its PUBLISH is refused: the release still works
        return time.monotonic()

    with caplog.at_level(logging.WARNING, logger="tenure.wakeups"):
        got, released = await gather(take, release_soon)
    assert got - released < 1.5  # by a re-check
    assert "refused the wake-up channel" in caplog.text
    await waiter.release()


async def test_acquire_takes_redis_pys_positional_order(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    holder = AsyncLock(tenure_async_client, "order", thread_local=False)
    assert await holder.acquire()
    other = AsyncLock(tenure_async_client, "order")
    acquire: Any = other.acquire
    if IS_ASYNC:  # redis-py's asyncio acquire(blocking, blocking_timeout, token)
        assert await acquire(False) is False
    else:  # redis-py's sync acquire(sleep, blocking, blocking_timeout, token)
        assert await acquire(0.01, False) is False
    with pytest.raises(ArgumentError, match="token"):
        await other.acquire(blocking=False, token=b"\xff\xfe")
    with pytest.raises(AcquireTimeoutError, match="without waiting"):
        async with AsyncLock(tenure_async_client, "order", blocking=False):
            pass
    await holder.release()
