"""Semaphore contract tests, written once for asyncio and generated for threads."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster

from tenure import (
    AlreadyHeldError,
    ArgumentError,
    AsyncReadWriteLock,
    AsyncSemaphore,
    SemaphoreLostError,
    SemaphoreNotOwnedError,
)
from tests._backend_asyncio import gather, in_line, join, sleep, spawn, until

pytestmark = pytest.mark.topologies("standalone", "cluster")


async def test_at_most_limit_holders(clients: list[redis.asyncio.Redis]) -> None:
    permits = [AsyncSemaphore(client, "pool", limit=3) for client in clients[:4]]
    assert await permits[0].acquire()
    assert await permits[1].acquire()
    assert await permits[2].acquire()
    assert not await permits[3].acquire(blocking=False)
    assert await permits[0].holders() == 3
    fences = [p.fencing_token for p in permits[:3]]
    assert len(set(fences)) == 3
    await permits[1].release()
    assert await permits[3].acquire(blocking=False)
    for permit in (permits[0], permits[2], permits[3]):
        await permit.release()
    assert await permits[0].holders() == 0


async def test_concurrent_holders_never_exceed_the_limit(
    clients: list[redis.asyncio.Redis],
) -> None:
    inside = 0
    most = 0

    def worker(index: int) -> object:
        async def job() -> None:
            nonlocal inside, most
            permit = AsyncSemaphore(clients[index], "bounded", limit=3, timeout=10)
            for _ in range(15):
                async with permit:
                    inside += 1
                    most = max(most, inside)
                    await sleep(0.002)  # the hold: others must stay out meanwhile
                    inside -= 1

        return job

    await gather(*(worker(i) for i in range(8)))  # type: ignore[arg-type]
    assert most == 3


async def test_release_wakes_the_first_waiter(clients: list[redis.asyncio.Redis]) -> None:
    holder = AsyncSemaphore(clients[0], "wake", limit=1, thread_local=False)
    await holder.acquire()
    order: list[int] = []

    def waiter(index: int) -> Any:
        async def job() -> float:
            # arrive in index order: each once those before it are in line
            await until(lambda: in_line(clients[0], holder, index - 1), 10, f"{index} in line")
            permit = AsyncSemaphore(clients[index], "wake", limit=1)
            assert await permit.acquire(blocking_timeout=10)
            got = time.monotonic()
            order.append(index)
            await permit.release()
            return got

        return job

    handles = [spawn(waiter(i)) for i in range(1, 5)]
    await until(lambda: in_line(clients[0], holder, 4), 10, "every waiter in line")
    released = time.monotonic()
    await holder.release()
    times = [await join(handle) for handle in handles]
    assert order == [1, 2, 3, 4]
    assert times[0] - released < 0.4  # handed over, not found at a refresh (0.8 s away)


async def test_expired_permit_returns_and_refresh_fails(
    clients: list[redis.asyncio.Redis],
) -> None:
    stale = AsyncSemaphore(clients[0], "leased", limit=1, timeout=0.2)
    fresh = AsyncSemaphore(clients[1], "leased", limit=1)
    assert await stale.acquire()
    began = time.monotonic()
    assert await fresh.acquire(blocking_timeout=2)
    assert time.monotonic() - began < 0.2 + 0.4  # at the lease's end, not a refresh (0.8 s)
    with pytest.raises(SemaphoreNotOwnedError):
        await stale.refresh()
    with pytest.raises(SemaphoreNotOwnedError):
        await stale.release()
    await fresh.release()


async def test_refresh_extends_the_lease(clients: list[redis.asyncio.Redis]) -> None:
    # Three pauses of 0.4 s outlast the 1 s lease: only the refreshes keep it. (With a
    # 0.3 s lease and 0.15 s pauses, a loaded CI machine stretched one pause past it.)
    permit = AsyncSemaphore(clients[0], "refreshed", limit=1, timeout=1.0)
    other = AsyncSemaphore(clients[1], "refreshed", limit=1)
    await permit.acquire()
    for _ in range(3):
        await sleep(0.4)  # the duration under test: 0.4 of the lease between refreshes
        assert await permit.refresh()
    assert not await other.acquire(blocking=False)
    assert await permit.owned()
    await permit.release()


async def test_auto_refresh_and_lost_notice(clients: list[redis.asyncio.Redis]) -> None:
    lost: list[str] = []
    permit = AsyncSemaphore(
        clients[0],
        "watched",
        limit=2,
        timeout=0.3,
        auto_renew=True,
        on_lost=lambda s: lost.append(s.name),
    )
    with pytest.raises(SemaphoreLostError):
        async with permit:
            taken = time.monotonic()

            async def refreshed() -> bool:  # refreshed every 0.1 s
                return permit.statistics().renewals >= 4

            await until(refreshed, 5, "four refreshes")
            assert time.monotonic() - taken > 0.3  # past its lease
            assert await permit.owned()  # refreshed past its lease
            await clients[1].delete(permit.keys.owner)  # someone wipes it

            async def told() -> bool:  # (on_lost runs in the watchdog, just after the flag)
                return permit.lost and lost == ["watched"]

            await until(told, 5, "the loss being noticed and told")
    assert lost == ["watched"]


async def test_blocking_timeout_and_queue_cleanup(clients: list[redis.asyncio.Redis]) -> None:
    holder = AsyncSemaphore(clients[0], "busy", limit=1)
    waiter = AsyncSemaphore(clients[1], "busy", limit=1)
    await holder.acquire()
    began = time.monotonic()
    assert not await waiter.acquire(blocking_timeout=0.2)
    # never early; late by no more than a busy 2-core machine delays a timer
    assert 0.2 <= time.monotonic() - began < 0.2 + 1.0
    assert await clients[0].exists(holder.keys.queue) == 0
    await holder.release()
    assert await waiter.acquire(blocking=False)
    await waiter.release()


async def test_one_permit_per_owner_and_bad_arguments(
    clients: list[redis.asyncio.Redis],
) -> None:
    permit = AsyncSemaphore(clients[0], "args", limit=2)
    async with permit:
        with pytest.raises(AlreadyHeldError):
            await permit.acquire()
    for bad in (0, -1, 1.5, True, 2**31 - 1):  # 2**31 - 1: a read-write lock's
        with pytest.raises(ArgumentError, match="limit"):
            AsyncSemaphore(clients[0], "args", limit=bad)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="timeout"):
        AsyncSemaphore(clients[0], "args", limit=2, timeout=-1)


async def test_a_chosen_token_is_a_permit_like_any_other(
    clients: list[redis.asyncio.Redis],
) -> None:
    """A read-write lock's writer token starts with "w": a semaphore's does not hold alone."""
    first, second = (AsyncSemaphore(c, "chosen", limit=3) for c in clients[:2])
    assert await first.acquire(blocking=False, token="worker-1")
    assert await second.acquire(blocking=False, token="reader-2")
    assert await first.holders() == 2
    third = AsyncSemaphore(clients[2], "chosen", limit=3)
    assert await third.acquire(blocking=False, token="writer-3")
    await first.release()
    await second.release()
    await third.release()


async def test_cluster_client(
    tenure_async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    for name in ("s1", "s2", "s3"):
        first = AsyncSemaphore(tenure_async_cluster_client, name, limit=2)
        second = AsyncSemaphore(tenure_async_cluster_client, name, limit=2, thread_local=False)
        async with first:
            assert await second.acquire()
            assert await first.holders() == 2
            await second.release()


@pytest.mark.parametrize("side", ["semaphore", "write"])
async def test_a_second_owner_of_a_chosen_token_gets_no_permit_of_its_own(
    tenure_async_client: redis.asyncio.Redis, side: str
) -> None:
    """Two objects acquiring with the same chosen token: one permit, not two holders."""

    def make() -> Any:
        if side == "semaphore":
            return AsyncSemaphore(tenure_async_client, "chosen", limit=2)
        return AsyncReadWriteLock(tenure_async_client, "chosen").write

    token = "worker-1" if side == "semaphore" else "w-worker-1"  # a write token starts "w"
    first, second = make(), make()
    assert await first.acquire(token=token)
    fence = first.statistics().fencing_token
    assert fence is not None
    assert not await second.acquire(blocking=False, token=token)
    assert not await second.acquire(blocking_timeout=0.1, token=token)
    assert await first.owned() and second.statistics().fencing_token is None
    waiting = spawn(lambda: second.acquire(blocking_timeout=10, token=token))
    await first.release()
    assert await join(waiting)  # once the first let go, in its turn
    await second.release()  # adopted from the task that took it
    assert second.statistics().acquisitions == 1
    assert not await first.owned() and not await second.owned()
    third = make()
    assert await third.acquire(blocking=False, token=token)  # nothing left behind
    assert third.statistics().fencing_token is not None
    await third.release()


async def test_a_second_owner_of_a_chosen_token_waits_out_of_the_queue_then_takes_it(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """The second owner waits in its process's line, which does not queue its token
    while the first owner's permit holds it (one token, one permit), and asks again
    with each refresh: it takes the permit once the first let go, and nothing of
    either is left behind."""
    client = tenure_async_client

    def make() -> AsyncSemaphore:
        return AsyncSemaphore(client, "chosen-parked", limit=2, waiter_lease=0.5)

    first, second = make(), make()
    assert await first.acquire(token="worker-1")
    waiting = spawn(lambda: second.acquire(blocking_timeout=10, token="worker-1"))
    await sleep(0.6)  # its line asked (and asked again with a refresh)
    assert await client.zcard(first.keys.queue) == 0  # not queued: the token holds
    assert await first.owned() and second.statistics().fencing_token is None
    await first.release()
    assert await join(waiting)  # at the next refresh (0.2 s) at the latest
    assert await second.owned()
    await second.release()
    assert await client.zcard(first.keys.queue) == 0
    assert await client.zcard(first.keys.owner) == 0
