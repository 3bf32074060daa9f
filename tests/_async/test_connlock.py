"""ConnectionLock contract tests, written once for asyncio and generated for threads."""

from __future__ import annotations

import time

import pytest
import redis.asyncio
import redis.asyncio.cluster

from tenure import (
    AlreadyHeldError,
    AsyncConnectionLock,
    ClientTypeError,
    LockNotOwnedError,
    PermissionDeniedError,
)
from tenure.server import ServerProcess
from tests._backend_asyncio import until


async def test_one_connection_holds_it(clients: list[redis.asyncio.Redis]) -> None:
    first = AsyncConnectionLock(clients[0], "job-7")
    second = AsyncConnectionLock(clients[1], "job-7")
    assert await first.acquire()
    assert await first.locked()
    assert await first.owned() and not await second.owned()
    with pytest.raises(AlreadyHeldError):  # as the other locks: not re-entrant
        await first.acquire()
    assert not await second.acquire(blocking=False)
    assert first.owner_id is not None
    assert await clients[2].get(first.key) == first.owner_id.encode()
    await first.release()
    assert not await first.locked() and not await first.owned()
    assert await second.acquire(blocking=False)
    await second.release()
    with pytest.raises(LockNotOwnedError):
        await second.release()


async def test_closed_connection_frees_it_at_once(clients: list[redis.asyncio.Redis]) -> None:
    holder = AsyncConnectionLock(clients[0], "conn")
    waiter = AsyncConnectionLock(clients[1], "conn")
    assert await holder.acquire()
    # The holder's connection dies (as when its process is killed).
    await clients[2].client_kill_filter(_id=holder.owner_id)
    assert not await holder.owned()  # its connection is gone: so is its hold
    began = time.monotonic()
    assert await waiter.acquire(blocking_timeout=2)
    assert time.monotonic() - began < 0.5  # at once: its poll finds the owner gone
    await waiter.release()
    with pytest.raises(LockNotOwnedError):
        await holder.release()  # its booking went with its connection


async def test_blocking_timeout(clients: list[redis.asyncio.Redis]) -> None:
    holder = AsyncConnectionLock(clients[0], "timed")
    waiter = AsyncConnectionLock(clients[1], "timed", poll_interval=0.02)
    await holder.acquire()
    began = time.monotonic()
    assert not await waiter.acquire(blocking_timeout=0.15)
    # never early; late by no more than a busy 2-core machine delays a timer
    assert 0.15 <= time.monotonic() - began < 0.15 + 1.0
    await holder.release()


async def test_opt_in_lease_frees_a_hung_holder(clients: list[redis.asyncio.Redis]) -> None:
    hung = AsyncConnectionLock(clients[0], "hung", lease=0.5)
    other = AsyncConnectionLock(clients[1], "hung")
    assert await hung.acquire()

    async def lease_left() -> int:
        return int(await clients[2].pttl(hung.key))  # -2 once the booking is gone

    async def running_down() -> bool:
        return 0 < await lease_left() < 350

    async def gone() -> bool:
        return await lease_left() == -2

    await until(running_down, 5, "the lease running down")
    await hung.refresh()
    assert await lease_left() > 350  # the lease began again
    assert not await other.acquire(blocking=False)  # refreshed, still held
    await until(gone, 5, "the lease running out")  # connected but silent
    assert await other.acquire(blocking=False)
    with pytest.raises(LockNotOwnedError):
        await hung.refresh()
    with pytest.raises(LockNotOwnedError):
        await hung.release()
    await other.release()


async def test_acl_refusal_is_named(tenure_server: ServerProcess) -> None:
    admin = tenure_server.async_client()
    await admin.acl_setuser(
        "no-client", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-client"]
    )
    limited = tenure_server.async_client(username="no-client", password="pw")
    try:
        with pytest.raises(PermissionDeniedError, match="CLIENT"):
            await AsyncConnectionLock(limited, "acl").acquire()
    finally:
        await limited.aclose()
        await admin.acl_deluser("no-client")
        await admin.aclose()


async def test_cluster_client_is_refused(
    tenure_async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    with pytest.raises(ClientTypeError, match="standalone.*CLIENT ID.*use Lock or ClusterLock"):
        AsyncConnectionLock(tenure_async_cluster_client, "x")  # type: ignore[arg-type]
