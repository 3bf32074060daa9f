"""asyncio-only lock behaviour: cancellation, the lost-lock guard, broken connections."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenure import AsyncLock, Lock, LockLostError, LockNotOwnedError, ServerUnavailableError
from tenure.server import ServerProcess
from tests.conftest import ServerFactory


async def test_cancelled_waiter_leaves_the_queue(tenure_async_client: redis.asyncio.Redis) -> None:
    holder = AsyncLock(tenure_async_client, "cancel", thread_local=False)
    await holder.acquire()
    waiter = AsyncLock(tenure_async_client, "cancel")
    task = asyncio.create_task(waiter.acquire())
    await asyncio.sleep(0.1)
    assert await tenure_async_client.zcard(holder.keys.queue) == 1
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
        await asyncio.sleep(0.1)
        third_task = asyncio.create_task(third.acquire(blocking_timeout=5))
        await asyncio.sleep(0.1)
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
            await asyncio.sleep(5)
            reached_end = True
    assert not reached_end
    # The task is not left half-cancelled.
    current = asyncio.current_task()
    assert current is not None
    assert getattr(current, "cancelling", lambda: 0)() == 0  # Python 3.11+
    await asyncio.sleep(0.01)


async def test_cancelled_release_still_releases(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "release-cancel", thread_local=False)
    await lock.acquire()
    task = asyncio.create_task(lock.release())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert not await lock.locked()


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
