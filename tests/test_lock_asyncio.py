"""asyncio-only lock behaviour: cancellation, the lost-lock guard, broken connections."""

from __future__ import annotations

import asyncio
import functools
import gc
import random
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenure import (
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    Lock,
    LockLostError,
    LockNotOwnedError,
    ServerUnavailableError,
)
from tenure._async._line import _lines
from tenure._async._watchdog import Deferred, Job, watchdog
from tenure.server import FaultProxy, ServerProcess
from tests._backend_asyncio import in_line, until
from tests.conftest import ServerFactory, upstream_bytes


async def test_cancelled_waiter_leaves_the_queue(tenure_async_client: redis.asyncio.Redis) -> None:
    holder = AsyncLock(tenure_async_client, "cancel", thread_local=False)
    await holder.acquire()
    waiter = AsyncLock(tenure_async_client, "cancel")
    task = asyncio.create_task(waiter.acquire())
    await until(lambda: in_line(tenure_async_client, holder, 1), 5, "the waiter in line")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await tenure_async_client.zcard(holder.keys.queue) == 0
    await holder.release()
    assert not await holder.locked()


async def test_cancel_after_the_grant_passes_the_lock_on(tenure_server: ServerProcess) -> None:
    sync_client = tenure_server.client()
    holder = Lock(sync_client, "granted")
    assert holder.acquire()
    waiter_client = tenure_server.async_client()
    third_client = tenure_server.async_client()
    try:
        waiter = AsyncLock(waiter_client, "granted")
        third = AsyncLock(third_client, "granted", thread_local=False)
        task = asyncio.create_task(waiter.acquire())
        await until(lambda: in_line(third_client, third, 1), 5, "the waiter in line")
        third_task = asyncio.create_task(third.acquire(blocking_timeout=5))
        await until(lambda: in_line(third_client, third, 2), 5, "the third in line")
        # A blocking release: the server hands the lock to the waiter, and the
        # waiter is cancelled before the loop lets it see the grant. Its
        # cleanup must pass the lock on to the next in line.
        holder.release()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await third_task
        assert await third.owned()
        await third.release()
    finally:
        await waiter_client.aclose()
        await third_client.aclose()
        sync_client.close()


async def test_guard_cancels_the_body_when_the_lock_is_lost(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(
        tenure_async_client, "guarded", timeout=0.3, auto_renew=True, cancel_on_lost=True
    )
    reached_end = False
    with pytest.raises(LockLostError):
        async with lock:
            await tenure_async_client.delete(lock.keys.owner)
            await asyncio.sleep(5)  # the body's work: cut short when the lock is lost
            reached_end = True
    assert not reached_end
    # The task is not left half-cancelled.
    current = asyncio.current_task()
    assert current is not None
    assert getattr(current, "cancelling", lambda: 0)() == 0  # Python 3.11+
    assert await tenure_async_client.ping()  # the next await is not cancelled either


async def test_guard_cancels_the_body_when_max_hold_ends(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(
        tenure_async_client, "guarded-bounded", timeout=0.3, max_hold=0.6, cancel_on_lost=True
    )
    taken = time.monotonic()
    with pytest.raises(LockLostError):
        async with lock:
            await asyncio.Event().wait()  # work with no end: cut short at max_hold's end
    assert time.monotonic() - taken >= 0.5

    async def ended() -> bool:  # at once, or within the few ms the server's lease is longer
        return not await lock.locked()

    await until(ended, 5, "the server's hold ended")


async def test_cancelled_release_still_releases(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "release-cancel", thread_local=False)
    await lock.acquire()
    begun = asyncio.Event()

    async def release() -> None:
        begun.set()
        await lock.release()  # runs to its first await before the test resumes

    task = asyncio.create_task(release())
    await begun.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def released() -> bool:
        return not await lock.locked()

    await until(released, 5, "the cancelled release's cleanup")


async def test_server_down_is_a_clear_error(tenure_server_factory: ServerFactory) -> None:
    server = tenure_server_factory()
    # No client-side retries, so the failure surfaces at once.
    client = server.async_client(socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        lock = AsyncLock(client, "down", thread_local=False)
        await lock.acquire()
        server.stop()
        with pytest.raises(ServerUnavailableError):
            await lock.release()
        with pytest.raises(LockNotOwnedError):
            await lock.release()  # the hold was forgotten: it expires within its lease
        with pytest.raises(ServerUnavailableError):
            await lock.acquire()
    finally:
        await client.aclose()


# -- ownership when asyncio runs the call in a task of its own --------------------


async def test_acquire_under_wait_for_then_release(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "wait-for")
    assert await asyncio.wait_for(lock.acquire(), 2)
    assert lock.fencing_token is not None
    assert await lock.owned()
    await lock.release()
    assert not await lock.locked()


async def test_acquire_under_gather_then_release(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "gathered")
    assert list(await asyncio.gather(lock.acquire())) == [True]
    await lock.release()
    assert not await lock.locked()


async def test_release_under_shield_and_create_task(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "shielded")
    assert await lock.acquire()
    await asyncio.shield(lock.release())
    assert not await lock.locked()
    assert await lock.acquire()
    await asyncio.create_task(lock.release())
    assert not await lock.locked()
    async with lock:
        await asyncio.create_task(lock.extend(1))
    assert not await lock.locked()


async def test_a_second_task_waits_instead_of_adopting(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "no-adopt", blocking_timeout=0.3)
    assert await asyncio.wait_for(lock.acquire(), 2)  # an orphaned hold (its task ended)

    async def other() -> bool:
        return await lock.acquire()  # must wait for it, not take it over

    assert await asyncio.create_task(other()) is False
    await lock.release()


async def _renewed(lock: AsyncLock, times: int) -> bool:
    """Whether ``lock`` was renewed ``times`` times, and is held."""
    return lock.statistics().renewals >= times and bool(await lock.locked())


async def test_a_hold_nobody_can_release_is_not_renewed(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "forgotten", timeout=0.3, auto_renew=True)
    assert await lock.acquire()
    renewed = functools.partial(_renewed, lock, 3)  # three: past its first 0.3 s lease
    await until(renewed, 5, "three renewals while its object lives")
    del renewed
    del lock
    gc.collect()

    async def expired() -> bool:
        return not await tenure_async_client.exists("tenure:lock:{forgotten}")

    await until(expired, 5, "the forgotten hold's expiry (its 0.3 s lease, not renewed)")


# -- cancellation after the server ran the script, reply in flight ------------------


async def test_cancelled_fast_path_acquire_leaves_no_hold(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = tenure_proxy.async_client()
    lock = AsyncLock(client, "in-flight", timeout=30)
    async with lock:  # the scripts are loaded, the connection is made
        pass
    tenure_proxy.set_latency(0.3, direction="downstream")
    task = asyncio.create_task(lock.acquire())

    async def taken() -> bool:  # the script ran on the server; its reply is delayed
        return bool(await tenure_async_client.hexists("tenure:lock:{in-flight}", "token"))

    await until(taken, 5, "the acquire's script on the server")
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await tenure_async_client.hexists("tenure:lock:{in-flight}", "token")
    assert lock.fencing_token is None
    tenure_proxy.clear()
    await client.aclose()


async def test_cancelled_queued_acquire_leaves_no_hold(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    holder = AsyncLock(tenure_async_client, "in-flight-2", thread_local=False)
    assert await holder.acquire()
    client = tenure_proxy.async_client()
    waiter = AsyncLock(client, "in-flight-2")
    task = asyncio.create_task(waiter.acquire())
    await until(lambda: in_line(tenure_async_client, holder, 1), 5, "the waiter in line")
    tenure_proxy.set_latency(0.3, direction="downstream")
    await holder.release()  # handed to the waiter inside the script
    task.cancel()  # the grant's notice is on its way (0.3 s late)
    with pytest.raises(asyncio.CancelledError):
        await task
    owner = await tenure_async_client.hget("tenure:lock:{in-flight-2}", "token")
    assert owner is None
    tenure_proxy.clear()
    await client.aclose()


async def test_a_cancelled_waiter_is_out_of_line_before_its_cancellation_goes_on(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    """Two waiters of one process in its line; the first is handed the lock and
    cancelled while the grant's notice is on its way: once its cancellation goes
    on, its line has told the server (the lock passed on to the second)."""
    holder = AsyncLock(tenure_async_client, "in-flight-3", thread_local=False)
    assert await holder.acquire()
    client = tenure_proxy.async_client()
    first = asyncio.create_task(AsyncLock(client, "in-flight-3").acquire())
    await until(lambda: in_line(tenure_async_client, holder, 1), 5, "the first waiter in line")
    second = asyncio.create_task(AsyncLock(client, "in-flight-3").acquire())
    await until(lambda: in_line(tenure_async_client, holder, 2), 5, "the second waiter in line")
    token = (await tenure_async_client.zrange(holder.keys.queue, 0, 0))[0]
    tenure_proxy.set_latency(0.3, direction="downstream")
    await holder.release()  # handed to the first inside the script
    first.cancel()  # the grant's notice is on its way (0.3 s late)
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await tenure_async_client.hget(holder.keys.owner, "token") != token
    assert await asyncio.wait_for(second, 10)  # passed on to the second
    tenure_proxy.clear()
    await client.aclose()


async def test_cancelled_reentry_is_counted_down(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = tenure_proxy.async_client()
    lock = AsyncLock(client, "re-in-flight", reentrant=True)
    assert await lock.acquire()
    tenure_proxy.set_latency(0.3, direction="downstream")
    before = upstream_bytes(tenure_proxy)
    task = asyncio.create_task(lock.acquire())

    async def sent() -> bool:  # its script went to the server; the reply is delayed
        return upstream_bytes(tenure_proxy) > before

    await until(sent, 5, "the re-entry's script sent")
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    tenure_proxy.clear()
    await lock.release()  # the one acquisition that returned
    assert not await tenure_async_client.hexists("tenure:lock:{re-in-flight}", "token")
    await client.aclose()


# -- races -----------------------------------------------------------------------


async def test_a_renewal_in_flight_during_downgrade_does_not_lose_the_hold(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = tenure_proxy.async_client()
    rw = AsyncReadWriteLock(client, "downgrade-race", timeout=3, auto_renew=True)
    for side in (rw.write, rw.read):  # the scripts are loaded
        async with side:
            pass
    await asyncio.gather(*(client.ping() for _ in range(3)))  # pooled connections are open
    lost: list[object] = []
    rw.write._holds.on_lost = lost.append
    assert await rw.write.acquire()
    deferred = rw.write._holds.peek().renewal  # type: ignore[union-attr]
    assert isinstance(deferred, Deferred)  # its first renewal is not planned yet: plan it now
    watchdog().cancel(deferred)
    deferred.start(deferred)
    renewal = rw.write._holds.peek().renewal  # type: ignore[union-attr]
    assert isinstance(renewal, Job)
    tenure_proxy.set_latency(0.2, direction="upstream")
    before = upstream_bytes(tenure_proxy)
    downgrade = asyncio.create_task(rw.write.downgrade())

    async def sent() -> bool:  # the downgrade is in the proxy (0.2 s on its way)
        return upstream_bytes(tenure_proxy) > before

    await until(sent, 5, "the downgrade sent")
    # The renewal goes out now, under the write token, and reaches the server
    # after the downgrade: the server answers "not held" for the write token.
    renewal.due, renewal.slack = time.monotonic(), 0.0
    watchdog().schedule(renewal)  # planned again: now
    await downgrade

    async def renewed_as_reader() -> bool:  # it renewed again, under the read token
        return str(renewal.args[0]).startswith("r")

    await until(renewed_as_reader, 5, "a renewal under the read token")
    tenure_proxy.clear()
    assert not lost and not rw.write.lost
    assert await rw.readers() == 1
    await rw.write.release()
    await client.aclose()


# The ended loops' sockets cannot be closed any more (redis-py's own case too):
# Python reports them when they are collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_client_reused_across_event_loops_keeps_working(tenure_server: ServerProcess) -> None:
    """Each ``asyncio.run()`` ends its loop; the client's pooled connections of
    that loop fail once each in redis-py. tenure's calls go through at once."""
    client = redis.asyncio.Redis.from_url(tenure_server.url)

    async def cycle(last: bool) -> None:
        lock = AsyncLock(client, "loops")
        assert not await lock.locked()
        async with lock:
            assert await lock.owned()
            assert await lock.extend(1)
        rw = AsyncReadWriteLock(client, "loops-rw")
        async with rw.read:
            assert await rw.readers() == 1
        contenders = [AsyncLock(client, "loops-contended", timeout=5) for _ in range(5)]

        async def take(one: AsyncLock) -> None:
            async with one:
                await asyncio.sleep(0.005)  # a hold's work: the others wait meanwhile

        await asyncio.gather(*(take(one) for one in contenders))  # several connections
        if last:
            await client.aclose()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for round in range(4):
            asyncio.run(cycle(last=round == 3))
        gc.collect()


async def test_waiters_cancelled_while_joining_leave_no_orphan(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """Waiters cancelled while their line's join may be on its way, and others
    timing out: once all are done, nobody is left in line and no permit is
    held (a leave of their own could overtake the join and leave an orphan,
    to be granted a permit nobody confirms)."""
    name = "cancelled-joining"
    holders = [
        AsyncSemaphore(tenure_async_client, name, limit=3, thread_local=False) for _ in range(3)
    ]
    for held in holders:
        assert await held.acquire()
    rng = random.Random(7)

    async def wait(timeout: float) -> None:
        sem = AsyncSemaphore(tenure_async_client, name, limit=3, blocking_timeout=timeout)
        if await sem.acquire():
            await sem.release()

    tasks = []
    for i in range(1500):
        timeout = rng.uniform(0.05, 2.0) if i % 3 == 1 else 30.0
        tasks.append(asyncio.ensure_future(wait(timeout)))
        if i % 50 == 0:
            await asyncio.sleep(0)  # a yield, not a wait: the tasks so far take a step
    for task in tasks[::3]:
        await asyncio.sleep(rng.uniform(0, 0.004))
        task.cancel()
    await asyncio.wait(tasks[::3])  # the cancelled ones are done

    async def in_line() -> bool:  # at least as many as wait 30 s (one in three)
        return int(await tenure_async_client.zcard(holders[0].keys.queue)) >= len(tasks) // 3

    await until(in_line, 30, "the 30 s waiters in line")
    for held in holders:
        await held.release()
    await asyncio.wait(tasks, timeout=30)
    assert all(task.done() for task in tasks)
    assert await tenure_async_client.zcard(holders[0].keys.queue) == 0
    assert await tenure_async_client.zcard(holders[0].keys.owner) == 0


class _RoundHook:
    """Stands in for a line's script registry: runs ``before`` ahead of each round it sends."""

    def __init__(self, registry: Any, before: Callable[[tuple[Any, ...]], None]) -> None:
        self._registry = registry
        self._before = before

    async def run(self, script: str, keys: Any, args: tuple[Any, ...], **kwargs: Any) -> Any:
        self._before(args)
        return await self._registry.run(script, keys, args, **kwargs)


async def test_a_waiter_that_took_the_lock_while_joining_again_leaves_no_token_in_line(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """A line joins a waiter again (a re-check); the waiter takes the lock and
    releases it before that join arrives, which then queues a token nobody
    waits on. The line takes it out of the queue with its next round (left
    there, it would be handed the lock in its turn, lost for a handoff lease)."""
    client = tenure_async_client
    holder = AsyncLock(client, "settle-rejoin", thread_local=False)
    assert await holder.acquire()

    async def queued(count: int) -> bool:
        return await client.zcard(holder.keys.queue) == count

    first = asyncio.create_task(AsyncLock(client, "settle-rejoin").acquire())
    await until(lambda: queued(1), 5, "the first waiter in line")
    task = asyncio.create_task(AsyncLock(client, "settle-rejoin").acquire())
    await until(lambda: queued(2), 5, "the second waiter in line")
    (line,) = [line for line in _lines.values() if not line.closed]
    _, token = line._members  # (in the order they joined)
    waiter = line._members[token]
    fired: list[bool] = []

    def took_meanwhile(args: tuple[Any, ...]) -> None:
        if not fired and token in args:
            fired.append(True)
            line.done(waiter)  # as if it had taken the lock, and released it, meanwhile

    line._registry = _RoundHook(line._registry, took_meanwhile)  # type: ignore[assignment]
    await client.zrem(holder.keys.queue, token)  # its place lost: the line joins it again
    line._joining[token] = "again"
    line.wake()

    async def joined() -> bool:
        return bool(fired) and not line._in_flight  # the join's round answered

    async def out_of_line() -> bool:
        return await client.zscore(holder.keys.queue, token) is None

    await until(joined, 5, "the join's round answered")
    await until(out_of_line, 1, "the token joined after its waiter took the lock out of line")
    task.cancel()
    await holder.release()
    assert await asyncio.wait_for(first, 5)
    await asyncio.gather(task, return_exceptions=True)


async def test_a_checked_waiter_gone_meanwhile_does_not_send_its_line_again(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """A round checks one waiter's place; that waiter takes the lock and
    releases it before the round arrives, so the round finds it neither in
    line nor holding. That says nothing of the others: they are not joined
    again (each such join may arrive after its waiter, in turn, took the
    lock and released it, and queue a token nobody waits on)."""
    client = tenure_async_client

    def lock() -> AsyncLock:
        return AsyncLock(client, "settle-check", waiter_lease=0.5, thread_local=False)

    holder = lock()
    assert await holder.acquire()

    async def queued(count: int) -> bool:
        return await client.zcard(holder.keys.queue) == count

    # The first waiter, on another client: in a line of its own, first in the queue.
    kwargs = client.connection_pool.connection_kwargs
    elsewhere = redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"])
    first = asyncio.create_task(
        AsyncLock(elsewhere, "settle-check", waiter_lease=0.5, thread_local=False).acquire()
    )
    await until(lambda: queued(1), 5, "the first waiter in line")
    tasks = [asyncio.create_task(lock().acquire()) for _ in range(2)]  # the process's line
    await until(lambda: queued(3), 5, "the line's waiters in line")
    (line,) = [
        line for line in _lines.values() if not line.closed and line._registry._client is client
    ]
    checked, other = line._members
    checked_waiter = line._members[checked]
    fired: list[bool] = []
    joined_again: list[bool] = []

    def hook(args: tuple[Any, ...]) -> None:
        if fired and other in args[8 : 8 + 2 * int(args[4])]:  # ARGV[5]: how many join
            joined_again.append(True)
        if not fired and args[6] == checked:  # ARGV[7]: the waiter checked
            fired.append(True)
            line.done(checked_waiter)  # as if it had taken the lock, and released it, meanwhile

    line._registry = _RoundHook(line._registry, hook)  # type: ignore[assignment]
    await client.zrem(holder.keys.queue, checked)  # gone from the queue, holding nothing

    async def checked_and_more() -> bool:
        return bool(fired) and line.rounds >= rounds + 3

    rounds = line.rounds
    await until(checked_and_more, 5, "a round checking the waiter, and two more")
    assert not joined_again
    for task in tasks:
        task.cancel()
    await holder.release()
    assert await asyncio.wait_for(first, 5)
    await asyncio.gather(*tasks, return_exceptions=True)
    await elsewhere.aclose()
