"""redis-py's lock tests that read or write its key ``foo``, translated to tenure's keys.

Each test here is one of redis-py 8.1's ``tests/test_lock.py`` /
``tests/test_asyncio/test_lock.py`` that the "tenure" run of
``scripts/redis_py_lock_tests.py`` lists as "key layout": the same steps and
assertions, with redis-py's string key ``foo`` replaced by tenure's owner hash
``tenure:lock:{foo}`` (field ``token``; its TTL is the lease). (With
``interop="redis-py"`` the originals pass as they are: that run has them.)

Written once for asyncio and generated for threads.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import LockError, LockNotOwnedError

from tenure import AsyncLock

OWNER = "tenure:lock:{foo}"


def get_lock(client: redis.asyncio.Redis, name: str, **kwargs: Any) -> AsyncLock:
    """As redis-py's tests build their locks: ``client.lock(name, lock_class=...)``."""
    kwargs.setdefault("lock_class", AsyncLock)
    lock: Any = client.lock(name, **kwargs)  # redis-py annotates its own Lock
    assert isinstance(lock, AsyncLock)
    return lock


async def token_of(client: redis.asyncio.Redis) -> Any:
    """What redis-py's ``r.get("foo")`` reads: the holder's token, or None."""
    return await client.hget(OWNER, "token")


async def steal(client: redis.asyncio.Redis) -> None:
    """What redis-py's ``r.set("foo", "a")`` does to a hold: another token holds now."""
    await client.hset(OWNER, "token", "a")


async def fake_holder(client: redis.asyncio.Redis) -> None:
    """What redis-py's ``r.set("foo", "bar")`` does to a free lock: a holder appears."""
    await client.hset(OWNER, mapping={"token": "bar", "fence": 1})


async def test_lock(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo")
    assert await lock.acquire(blocking=False)
    assert await token_of(r) == lock.local.token
    assert 29 < await r.ttl(OWNER) <= 30  # timeout=None: a 30 s lease, renewed (not -1)
    await lock.release()
    assert await token_of(r) is None


@pytest.mark.parametrize("thread_local", [True, False])
async def test_lock_token(tenure_async_client: redis.asyncio.Redis, thread_local: bool) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", thread_local=thread_local)
    assert await lock.acquire(blocking=False, token="test")
    assert await token_of(r) == b"test"
    assert lock.local.token == b"test"
    assert 29 < await r.ttl(OWNER) <= 30  # timeout=None: a 30 s lease, renewed (not -1)
    await lock.release()
    assert await token_of(r) is None
    assert lock.local.token is None


async def test_timeout(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=10)
    assert await lock.acquire(blocking=False)
    assert 8 < await r.ttl(OWNER) <= 10
    await lock.release()


async def test_float_timeout(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=9.5)
    assert await lock.acquire(blocking=False)
    assert 8 < await r.pttl(OWNER) <= 9500
    await lock.release()


async def test_context_manager(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    async with get_lock(r, "foo", blocking_timeout=0.2) as lock:
        assert await token_of(r) == lock.local.token
    assert await token_of(r) is None


async def test_context_manager_raises_when_locked_not_acquired(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    r = tenure_async_client
    await fake_holder(r)
    with pytest.raises(LockError):
        async with get_lock(r, "foo", blocking_timeout=0.1):
            pass


async def test_lock_error_gives_correct_lock_name(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    await fake_holder(r)
    with pytest.raises(LockError) as excinfo:
        async with get_lock(r, "foo", blocking_timeout=0.1):
            pass
    assert excinfo.value.lock_name == "foo"  # (redis-py's test asserts it inside the block)


async def test_releasing_lock_no_longer_owned_raises_error(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo")
    await lock.acquire(blocking=False)
    await steal(r)
    with pytest.raises(LockNotOwnedError):
        await lock.release()
    # even though we errored, the token is still cleared
    assert lock.local.token is None


async def test_extend_lock(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=10)
    assert await lock.acquire(blocking=False)
    assert 8000 < await r.pttl(OWNER) <= 10000
    assert await lock.extend(10)
    assert 16000 < await r.pttl(OWNER) <= 20000
    await lock.release()


async def test_extend_lock_replace_ttl(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=10)
    assert await lock.acquire(blocking=False)
    assert 8000 < await r.pttl(OWNER) <= 10000
    assert await lock.extend(10, replace_ttl=True)
    assert 8000 < await r.pttl(OWNER) <= 10000
    await lock.release()


async def test_extend_lock_float(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=10.5)
    assert await lock.acquire(blocking=False)
    assert 10000 < await r.pttl(OWNER) <= 10500
    old_ttl = await r.pttl(OWNER)
    assert await lock.extend(10.5)
    assert old_ttl + 10000 < await r.pttl(OWNER) <= old_ttl + 10500
    await lock.release()


async def test_extending_lock_no_longer_owned_raises_error(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=10)
    assert await lock.acquire(blocking=False)
    await steal(r)
    with pytest.raises(LockNotOwnedError):
        await lock.extend(10)


async def test_reacquire_lock(tenure_async_client: redis.asyncio.Redis) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=10)
    assert await lock.acquire(blocking=False)
    assert await r.pexpire(OWNER, 5000)
    assert await r.pttl(OWNER) <= 5000
    assert await lock.reacquire()
    assert 8000 < await r.pttl(OWNER) <= 10000
    await lock.release()


async def test_reacquiring_lock_no_longer_owned_raises_error(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    r = tenure_async_client
    lock = get_lock(r, "foo", timeout=10)
    assert await lock.acquire(blocking=False)
    await steal(r)
    with pytest.raises(LockNotOwnedError):
        await lock.reacquire()


async def test_context_manager_reacquiring_lock_no_longer_owned_raises_error(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    r = tenure_async_client
    with pytest.raises(LockNotOwnedError):
        async with get_lock(r, "foo", timeout=10, blocking=False):
            await steal(r)
