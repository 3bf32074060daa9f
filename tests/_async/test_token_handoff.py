"""redis-py's hand-the-token idiom: ``lock.local.token`` read on one object (or in
one process) and set on another, whose ``release()`` / ``extend()`` / ``owned()``
then act on that hold.

Written once for asyncio and generated for threads.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import redis.asyncio

from tenure import ArgumentError, AsyncLock, AsyncSemaphore
from tenure.server import ServerProcess


async def test_a_token_set_on_another_object_acts_on_that_hold(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    first = AsyncLock(tenure_async_client, "travel", timeout=10, thread_local=False)
    assert _token(first) is None
    assert await first.acquire()
    token = _token(first)
    assert isinstance(token, bytes) and token
    second = AsyncLock(other_client, "travel", timeout=10, thread_local=False)
    second.local.token = token
    assert second.local.token == token
    assert await second.owned()
    assert second.fencing_token is None  # known to the acquiring side only
    assert await second.extend(5)
    await second.release()
    assert _token(second) is None
    assert not await first.owned()
    assert await AsyncLock(other_client, "travel").acquire(blocking=False)
    # The token's release happened: a second one reads as a resent call, answered
    # as the first was (no error), and releases nothing of the new holder's.
    await first.release()
    assert await AsyncLock(other_client, "travel").locked()


def _token(primitive: Any) -> bytes | None:
    token: bytes | None = primitive.local.token
    return token


async def test_a_token_given_to_acquire_is_the_holds_token(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "travel-given", timeout=10)
    assert await lock.acquire(token=b"order-42")
    assert lock.local.token == b"order-42"
    await lock.release()
    permit = AsyncSemaphore(tenure_async_client, "travel-sem", limit=2, timeout=10)
    assert await permit.acquire(token="permit-7")
    other = AsyncSemaphore(tenure_async_client, "travel-sem", limit=2, timeout=10)
    other.local.token = "permit-7"
    await other.release()
    assert await permit.holders() == 0


async def test_a_token_set_to_none_forgets_the_hold_here_only(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "travel-none", timeout=10)
    assert await lock.acquire()
    token = lock.local.token
    lock.local.token = None
    assert not await lock.owned()  # nothing held here any more
    other = AsyncLock(tenure_async_client, "travel-none", timeout=10)
    other.local.token = token
    assert await other.owned()  # the hold itself is untouched
    await other.release()


async def test_a_bad_token_is_refused(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "travel-bad")
    for bad in (b"", "", b"\xff", 5):
        with pytest.raises(ArgumentError, match="token"):
            lock.local.token = bad  # type: ignore[assignment]
    assert lock.local.token is None


async def test_a_token_released_in_another_process(
    tenure_server: ServerProcess, tenure_async_client: redis.asyncio.Redis
) -> None:
    # a lease the other process's start-up (seconds on a busy machine) cannot outlast
    lock = AsyncLock(tenure_async_client, "travel-process", timeout=60)
    assert await lock.acquire()
    token = lock.local.token
    assert token is not None
    script = textwrap.dedent(
        f"""
        import redis
        from tenure import Lock
        lock = Lock(redis.Redis(host={tenure_server.host!r}, port={tenure_server.port}),
                    "travel-process", timeout=60)
        lock.local.token = {token!r}
        assert lock.owned()
        lock.release()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)  # noqa: ASYNC221
    assert not await lock.owned()
