"""A client whose own connection pool is exhausted: its own error, not a server outage.

Written once for asyncio (tasks) and generated for threads.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenure import (
    AsyncLock,
    AsyncSemaphore,
    BackendError,
    ConnectionPoolExhaustedError,
    QuorumError,
    ServerUnavailableError,
)
from tenure._backends.for_asyncio import IS_ASYNC
from tenure.server import ServerProcess
from tests._async.test_already_held import KINDS
from tests._backend_asyncio import gather, join, spawn, until
from tests.conftest import ServerFactory

_blocking_pool: Any = redis.asyncio.BlockingConnectionPool  # untyped in redis-py

BLOCKED = "tenure-test:blocked"
"""The list the pool's occupiers wait on in BLPOP, each holding one connection."""


def _client(server: ServerProcess, connections: int) -> redis.asyncio.Redis:
    """A client over redis-py's plain pool: it refuses a call when all are in use."""
    return server.async_client(max_connections=connections)


async def _occupy(client: redis.asyncio.Redis, admin: redis.asyncio.Redis, count: int) -> list[Any]:
    """Start ``count`` BLPOPs on ``client`` and return once the server has them all blocked."""
    occupiers = [spawn(lambda: client.blpop([BLOCKED], timeout=20)) for _ in range(count)]

    async def blocked() -> bool:
        return bool((await admin.info("clients"))["blocked_clients"] >= count)

    await until(blocked, 10, "the occupiers blocking")
    return occupiers


async def _free(admin: redis.asyncio.Redis, occupiers: list[Any]) -> None:
    await admin.rpush(BLOCKED, *range(len(occupiers)))
    for occupier in occupiers:
        await join(occupier)


async def test_an_exhausted_pool_is_its_own_error_for_every_worker(
    tenure_server: ServerProcess, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = _client(tenure_server, 10)
    occupiers = await _occupy(client, tenure_async_client, 10)
    failures: list[BaseException] = []

    async def worker(index: int) -> None:
        try:
            async with AsyncLock(client, f"pool-{index}", timeout=5, blocking_timeout=1):
                pass
        except Exception as exc:
            failures.append(exc)

    try:
        await gather(*(lambda i=i: worker(i) for i in range(190)))  # 200 with the occupiers
    finally:
        await _free(tenure_async_client, occupiers)
        await client.aclose()
    assert len(failures) == 190
    for exc in failures:
        assert type(exc) is ConnectionPoolExhaustedError, repr(exc)
        assert isinstance(exc, redis.ConnectionError)
        assert isinstance(exc, redis.exceptions.MaxConnectionsError)
        assert not isinstance(exc, ServerUnavailableError)
        assert exc.max_connections == 10
        text = str(exc)
        assert "\n" not in text
        assert "max_connections=10" in text
        assert "redis.asyncio.BlockingConnectionPool" in text
        assert "waits for a free connection" in text
        assert isinstance(exc.__cause__, redis.ConnectionError)
    # The server was fine all along: the same client works once its connections are back.
    assert await tenure_async_client.ping()


async def test_a_semaphore_on_an_exhausted_pool_says_so(
    tenure_server: ServerProcess, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = _client(tenure_server, 2)
    occupiers = await _occupy(client, tenure_async_client, 2)
    try:
        with pytest.raises(ConnectionPoolExhaustedError, match=r"max_connections=2") as caught:
            await AsyncSemaphore(client, "pool-sem", limit=3, blocking_timeout=1).acquire()
    finally:
        await _free(tenure_async_client, occupiers)
        await client.aclose()
    assert caught.value.name == "pool-sem"


async def test_a_blocking_pool_that_timed_out_is_exhausted_too(
    tenure_server: ServerProcess, tenure_async_client: redis.asyncio.Redis
) -> None:
    pool = _blocking_pool(
        host=tenure_server.host, port=tenure_server.port, max_connections=2, timeout=0.05
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    occupiers = await _occupy(client, tenure_async_client, 2)
    try:
        with pytest.raises(ConnectionPoolExhaustedError) as caught:
            await AsyncLock(client, "pool-blocking", timeout=5, blocking_timeout=1).acquire()
    finally:
        await _free(tenure_async_client, occupiers)
        await client.aclose()
    text = str(caught.value)
    assert "max_connections=2" in text
    assert "timeout=0.05" in text
    assert isinstance(caught.value, redis.ConnectionError)
    assert caught.value.max_connections == 2


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_release_the_pool_refused_leaves_the_hold_held_and_renewed(
    tenure_server: ServerProcess, tenure_async_client: redis.asyncio.Redis, kind: str
) -> None:
    """The command never left: the hold is still this owner's, renewed, and released later."""
    client = _client(tenure_server, 1)
    name = f"unsent-{kind}"
    primitive = KINDS[kind](client, name, timeout=1, auto_renew=True)
    try:
        assert await primitive.acquire()
        fence = primitive.statistics().fencing_token
        occupiers = await _occupy(client, tenure_async_client, 1)
        try:
            with pytest.raises(BackendError) as caught:
                await primitive.release()
        finally:
            await _free(tenure_async_client, occupiers)
        # A Redlock's masters failing is a QuorumError, which says so too.
        assert type(caught.value) is (
            QuorumError if kind == "redlock" else ConnectionPoolExhaustedError
        )
        assert caught.value.never_sent
        assert await primitive.owned()
        assert primitive.statistics().fencing_token == fence
        renewed = primitive.statistics().renewals

        async def renewed_twice() -> bool:
            return bool(primitive.statistics().renewals >= renewed + 2)

        # Renewed by the watchdog past its 1 s lease, as if the release was never tried.
        await until(renewed_twice, 10, "two more renewals of the kept hold")
        assert await primitive.owned() and not primitive.statistics().lost
        await primitive.release()  # the same call, again: it succeeds
        assert not await primitive.owned()
        other = KINDS[kind](tenure_async_client, name, timeout=1)
        assert await other.acquire(blocking=False)  # released at once, not at its lease's end
        await other.release()
    finally:
        await client.aclose()


async def test_a_release_to_a_server_that_died_was_never_sent_and_keeps_the_hold(
    tenure_server_factory: ServerFactory,
) -> None:
    """redis-py's sync pool connects a connection as it hands it out: a dead server fails
    there, before anything is sent, so the hold is kept (its lease decides). redis-py's
    asyncio pool hands connections out as they are and finds the server dead while
    sending (and retrying): sent or not is unknown, so the hold is forgotten."""
    server = tenure_server_factory()
    client = server.async_client()
    lock = AsyncLock(client, "unsent-dead", timeout=30)
    try:
        assert await lock.acquire()
        server.kill()
        with pytest.raises(ServerUnavailableError) as caught:
            await lock.release()
        assert caught.value.never_sent is not IS_ASYNC
        assert lock.statistics().held is not IS_ASYNC
    finally:
        await client.aclose()


class _CountingConnection(redis.asyncio.connection.Connection):
    """Counts its attempts to connect (each of the client's retries makes one)."""

    attempts = 0

    async def _connect(self) -> None:
        type(self).attempts += 1
        connect: Any = super()._connect  # (untyped in redis-py)
        await connect()


async def test_an_acquire_a_dead_server_refused_costs_the_clients_retries_once(
    tenure_server_factory: ServerFactory,
) -> None:
    """redis-py's pools connect a new connection as they hand it out: an acquire whose
    connection the server refused never ran and took nothing, so nothing is given back,
    and it costs the client's retries once, as a GET does (the give-back after it cost
    them a second time)."""
    server = tenure_server_factory()
    host, port = server.address
    pool = redis.asyncio.ConnectionPool(
        connection_class=_CountingConnection, host=host, port=port, retry=Retry(NoBackoff(), 2)
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        server.kill()
        with pytest.raises(redis.ConnectionError):
            await client.get("baseline")
        per_call, _CountingConnection.attempts = _CountingConnection.attempts, 0
        assert per_call >= 1
        with pytest.raises(ServerUnavailableError):
            await AsyncLock(client, "refused").acquire(blocking=False)
        assert _CountingConnection.attempts == per_call
    finally:
        await client.aclose()
        await pool.disconnect()
