"""Error texts through a server: the operation the user called, said once, on one line.

Written once for asyncio and generated for threads. Each test drives one kind
of failure through the public API (a server stopped, the client's pool
exhausted, a hold not owned, a key of another type, a script the server
failed, an ACL, too few masters or replicas) and checks every text with
:func:`tests.error_texts.assert_clear`: one line, no Lua script's name (the
name is the error's ``script`` instead), no context said twice. The texts
that need no server are ``tests/test_error_texts.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenure import (
    AcquireTimeoutError,
    AlreadyHeldError,
    AsyncCache,
    AsyncClusterLock,
    AsyncConnectionLock,
    AsyncFencedKey,
    AsyncHerdCache,
    AsyncIdSet,
    AsyncIngestJob,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncRedlock,
    AsyncSemaphore,
    AsyncStreamConsumer,
    BackendError,
    CacheReentryError,
    CallableSource,
    ConnectionPoolExhaustedError,
    NotOwnedError,
    PermissionDeniedError,
    PrimitiveError,
    QuorumError,
    ReplicationError,
    SemaphoreLimitError,
    ServerUnavailableError,
    WrongTypeError,
)
from tests._async.test_pool import _free, _occupy
from tests.conftest import ServerFactory
from tests.error_texts import SCRIPT_NAMES, assert_clear

pytestmark = pytest.mark.topologies("standalone", "cluster")

Call = Callable[[], Any]
"""An awaited call of the public API (a plain one in the sync twin)."""


def _rows(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
    for key in range(first, last + 1):
        yield key, {"id": key}


def _job(client: Any, name: str) -> AsyncIngestJob:
    return AsyncIngestJob(client, name, CallableSource(_rows, low=1, high=10, name="rows"))


async def _load() -> int:
    return 1


async def _failure(call: Call, kind: type[BaseException]) -> BaseException:
    """The error ``call`` raises, of ``kind``, its text checked."""
    with pytest.raises(kind) as failed:
        await call()
    assert_clear(failed.value)
    return failed.value


async def _backend_failures(
    cases: dict[str, list[Call]], kind: type[BackendError], said: str
) -> None:
    """Each call of ``cases[words]`` raises ``kind``, saying ``said while <words>: ``."""
    for words, calls in cases.items():
        for call in calls:
            error = await _failure(call, kind)
            assert isinstance(error, BackendError)
            assert f"{said} while {words}: " in str(error), str(error)
            assert error.script is None or error.script in SCRIPT_NAMES


def _fragile(server: Any) -> redis.asyncio.Redis:
    """A client that gives up at once: the failure's text, not redis-py's retries, is tested."""
    client: redis.asyncio.Redis = server.async_client(
        retry=Retry(NoBackoff(), 0), socket_connect_timeout=2, socket_timeout=2
    )
    return client


async def test_a_stopped_server_is_reported_as_the_operation_called(
    tenure_server_factory: ServerFactory,
) -> None:
    server = tenure_server_factory()
    client = _fragile(server)
    lock = AsyncLock(client, "held", timeout=30)
    permit = AsyncSemaphore(client, "held", limit=2, timeout=30)
    rw = AsyncReadWriteLock(client, "held", timeout=30)
    booked = AsyncConnectionLock(client, "held")
    assert await lock.acquire() and await permit.acquire()
    assert await rw.write.acquire() and await booked.acquire()
    server.stop()
    cache = AsyncCache(client, "cache")
    cases: dict[str, list[Call]] = {
        "acquiring": [
            lambda: AsyncLock(client, "free").acquire(blocking=False),
            lambda: AsyncSemaphore(client, "free", limit=2).acquire(blocking=False),
            lambda: AsyncReadWriteLock(client, "free").read.acquire(blocking=False),
            lambda: AsyncConnectionLock(client, "free").acquire(blocking=False),
        ],
        "releasing": [lock.release, permit.release, rw.write.release, booked.release],
        "extending the lease": [lambda: lock.extend(5), lambda: permit.extend(5)],
        "downgrading to a read lock": [rw.write.downgrade],
        "writing the fenced key": [lambda: AsyncFencedKey(client, "fenced").write("v", 1)],
        "fetching from the cache": [
            lambda: AsyncHerdCache(client, "herd", ttl=5, fallback=False).fetch("k", _load)
        ],
        "reading a cache entry": [lambda: cache.get("k")],
        "writing a cache entry": [lambda: cache.set("k", 1)],
        "creating the consumer group": [lambda: AsyncStreamConsumer(client, "s", "g").read()],
        "writing to the id set": [lambda: AsyncIdSet(client, "ids").add(1)],
        "reading the id set": [lambda: AsyncIdSet(client, "ids").contains(1)],
        "reading the job's status": [lambda: _job(client, "job").status()],
    }
    try:
        await _backend_failures(cases, ServerUnavailableError, "server unavailable")
        error = await _failure(lambda: AsyncLock(client, "free").acquire(blocking=False), Exception)
        assert isinstance(error, BackendError)
        assert error.script in SCRIPT_NAMES  # kept for debugging, out of the text
        assert "Connect call failed" not in str(error)  # asyncio's words: the address again
    finally:
        await client.aclose()


async def test_an_exhausted_pool_is_reported_as_the_operation_called(
    tenure_server_factory: ServerFactory,
) -> None:
    server = tenure_server_factory()
    admin = server.async_client()
    client = server.async_client(max_connections=1)
    lock = AsyncLock(client, "held", timeout=30)
    assert await lock.acquire()
    occupiers = await _occupy(client, admin, 1)
    cache = AsyncCache(client, "cache")
    cases: dict[str, list[Call]] = {
        "acquiring": [
            lambda: AsyncLock(client, "free").acquire(blocking=False),
            lambda: AsyncSemaphore(client, "free", limit=2).acquire(blocking=False),
        ],
        "releasing": [lock.release],
        "writing the fenced key": [lambda: AsyncFencedKey(client, "fenced").write("v", 1)],
        "fetching from the cache": [
            lambda: AsyncHerdCache(client, "herd", ttl=5, fallback=False).fetch("k", _load)
        ],
        "reading a cache entry": [lambda: cache.get("k")],
        "creating the consumer group": [lambda: AsyncStreamConsumer(client, "s", "g").read()],
        "writing to the id set": [lambda: AsyncIdSet(client, "ids").add(1)],
        "reading the job's status": [lambda: _job(client, "job").status()],
    }
    try:
        await _backend_failures(
            cases, ConnectionPoolExhaustedError, "the client's connection pool is exhausted"
        )
    finally:
        await _free(admin, occupiers)
        await lock.release()
        await client.aclose()
        await admin.aclose()


async def test_holds_not_owned_and_other_broken_rules_say_so_once(
    tenure_async_client: redis.asyncio.Redis, topology: str
) -> None:
    client = tenure_async_client
    rw = AsyncReadWriteLock(client, "rw")
    lost = AsyncLock(client, "lost", timeout=30)
    assert await lost.acquire()
    await client.delete(*lost.keys)  # what the server held is gone
    for call in (
        AsyncLock(client, "free").release,
        lambda: AsyncLock(client, "free").extend(1),
        AsyncLock(client, "free").reacquire,
        AsyncSemaphore(client, "free", limit=2).release,
        rw.write.release,
        rw.write.downgrade,
        lost.release,
    ):
        await _failure(call, NotOwnedError)
    if topology == "standalone":  # for standalone servers only
        await _failure(AsyncRedlock([client], "free").release, NotOwnedError)
        await _failure(AsyncConnectionLock(client, "free").release, NotOwnedError)
        await _failure(AsyncConnectionLock(client, "free").refresh, NotOwnedError)
    held = AsyncLock(client, "held", timeout=30, blocking_timeout=0.05)
    assert await held.acquire()

    async def enter_taken() -> None:
        async with AsyncLock(client, "held", blocking_timeout=0.05):
            pass

    await _failure(held.acquire, AlreadyHeldError)
    await _failure(enter_taken, AcquireTimeoutError)
    await held.release()
    two = AsyncSemaphore(client, "limited", limit=2)
    assert await two.acquire()
    await _failure(
        lambda: AsyncSemaphore(client, "limited", limit=3).acquire(), SemaphoreLimitError
    )
    await two.release()
    herd = AsyncHerdCache(client, "reentry", ttl=5)

    async def asks_for_itself() -> object:
        return await herd.fetch("k", asks_for_itself)

    error = await _failure(lambda: herd.fetch("k", asks_for_itself), CacheReentryError)
    assert isinstance(error, PrimitiveError)


async def test_a_key_of_another_type_names_the_operation(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    client = tenure_async_client
    lock = AsyncLock(client, "typed")
    permit = AsyncSemaphore(client, "typed", limit=2)
    ids = AsyncIdSet(client, "typed")
    fenced = AsyncFencedKey(client, "typed")
    cache = AsyncCache(client, "typed")
    herd = AsyncHerdCache(client, "typed", ttl=5, fallback=False)
    for key in (lock.keys.owner, permit.keys.owner, ids.keys.meta, "{typed}-stream"):
        await client.set(key, "not what the primitive keeps")
    for key in (fenced.key, cache.key_of("k"), herd.key_of("k")):
        await client.rpush(key, "not what the primitive keeps")
    cases: dict[str, list[Call]] = {
        "acquiring": [lambda: lock.acquire(blocking=False), lambda: permit.acquire(blocking=False)],
        "writing to the id set": [lambda: ids.add(1)],
        "writing the fenced key": [lambda: fenced.write("v", 1)],
        "reading a cache entry": [lambda: cache.get("k")],
        "fetching from the cache": [lambda: herd.fetch("k", _load)],
        "creating the consumer group": [
            lambda: AsyncStreamConsumer(client, "{typed}-stream", "g").read()
        ],
    }
    await _backend_failures(cases, WrongTypeError, "a key holds another type")


async def test_a_script_the_server_fails_names_the_operation(
    tenure_server_factory: ServerFactory,
) -> None:
    server = tenure_server_factory()
    client = _fragile(server)
    await client.config_set("maxmemory-policy", "noeviction")
    await client.config_set("maxmemory", "1")  # every write refused: out of memory
    try:
        for words, call in (
            ("acquiring", lambda: AsyncLock(client, "oom").acquire(blocking=False)),
            ("writing to the id set", lambda: AsyncIdSet(client, "oom").add(1)),
            ("writing the fenced key", lambda: AsyncFencedKey(client, "oom").write("v", 1)),
        ):
            error = await _failure(call, BackendError)
            assert f" while {words}: " in str(error), str(error)
            assert "the server is out of memory (its maxmemory)" in str(error), str(error)
            assert "script" not in str(error) and "(name 'oom')" in str(error), str(error)
    finally:
        await client.config_set("maxmemory", "0")
        await client.aclose()


async def test_an_acl_refusal_names_the_operation(tenure_server_factory: ServerFactory) -> None:
    server = tenure_server_factory()
    admin = server.async_client()
    await admin.acl_setuser(
        "no-scripts",
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-evalsha", "-eval"],
    )
    client = server.async_client(username="no-scripts", password="secret")
    try:
        await _backend_failures(
            {
                "acquiring": [lambda: AsyncLock(client, "acl").acquire(blocking=False)],
                # The first read is a plain SET, which the ACL allows: the loader runs,
                # and its write-back (a script) is refused.
                "writing a cache entry": [
                    lambda: AsyncHerdCache(client, "acl", ttl=5, fallback=False).fetch("k", _load)
                ],
            },
            PermissionDeniedError,
            "the server's ACL refused a command",
        )
    finally:
        await client.aclose()
        await admin.aclose()


async def test_too_few_masters_or_replicas_say_which_operation_fell_short(
    tenure_server_factory: ServerFactory,
) -> None:
    servers = [tenure_server_factory() for _ in range(3)]
    clients = [_fragile(server) for server in servers]
    for server in servers[1:]:
        server.stop()
    redlock = AsyncRedlock(clients, "quorum")
    short = AsyncClusterLock(clients[0], "short", min_replicas=5, replica_timeout=0.05)
    try:
        error = await _failure(lambda: redlock.acquire(blocking=False), QuorumError)
        assert str(error).startswith("acquiring: 2 of 3 masters failed")
        try:  # False, or a QuorumError, as the dead masters' answers come in
            await redlock.locked()
        except QuorumError as unsure:
            assert_clear(unsure)
        error = await _failure(lambda: short.acquire(blocking=False), ReplicationError)
        assert str(error).startswith("not acknowledged while acquiring: 0 of 5 required")
    finally:
        for client in clients:
            await client.aclose()
