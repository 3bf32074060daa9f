"""ClusterLock: a Lock acknowledged by replicas (asyncio source; sync generated).

Shortfalls are real: replicas are paused with SIGSTOP, so WAIT times out on
a live primary exactly as it does when replication is cut.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster

from tenure import (
    ArgumentError,
    AsyncClusterLock,
    AsyncLock,
    BackendError,
    LockLostError,
    ReplicationError,
)
from tenure.server import Cluster, Engine, Replicated, ServerProcess
from tests._backend_asyncio import in_line, join, spawn, until


@pytest.fixture
async def primary(replicated_pair: Replicated) -> AsyncIterator[redis.asyncio.Redis]:
    """A client of the two-replica primary, flushed."""
    client = replicated_pair.async_client()
    await client.flushall()
    replicated_pair.wait_replication()
    yield client
    await client.aclose()


@pytest.fixture
async def second(replicated_pair: Replicated) -> AsyncIterator[redis.asyncio.Redis]:
    """Another client of that primary, as another process would have."""
    client = replicated_pair.async_client()
    yield client
    await client.aclose()


class paused:  # lower case: used like a function, ``with paused(...)``
    """SIGSTOP the given servers for the block, SIGCONT them after."""

    def __init__(self, *servers: ServerProcess) -> None:
        self.servers = servers

    def __enter__(self) -> None:
        for server in self.servers:
            server.pause()

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.resume()


@pytest.fixture
def replicas(replicated_pair: Replicated) -> Iterator[tuple[ServerProcess, ...]]:
    """The primary's replicas; resumed and caught up again after the test."""
    yield replicated_pair.replicas
    for replica in replicated_pair.replicas:
        if replica.paused:
            replica.resume()
    replicated_pair.wait_replication()


async def test_acquisition_counts_once_a_majority_acknowledged(
    primary: redis.asyncio.Redis,
) -> None:
    lock = AsyncClusterLock(primary, "acked")
    assert await lock.acquire()
    first = lock.fencing_token
    stats = lock.statistics()
    assert (stats.required_replicas, stats.acknowledged_replicas) == (2, 2)
    assert stats.shortfalls == 0
    await lock.release()
    async with lock:
        assert lock.fencing_token is not None and first is not None
        assert lock.fencing_token > first
        assert await lock.owned()
    assert not await lock.locked()


async def test_shortfall_gives_the_lock_back_and_names_the_counts(
    primary: redis.asyncio.Redis,
    second: redis.asyncio.Redis,
    replicas: tuple[ServerProcess, ...],
) -> None:
    lock = AsyncClusterLock(primary, "short", replica_timeout=0.3)
    with paused(*replicas):
        started = time.monotonic()
        with pytest.raises(ReplicationError) as caught:
            await lock.acquire()
        took = time.monotonic() - started
        assert (caught.value.acknowledged, caught.value.required) == (0, 2)
        assert "0 of 2" in str(caught.value)
        assert 0.25 <= took < 2.0
        assert not await lock.locked()  # given back, not left held on the primary
        assert lock.statistics().shortfalls == 1
        assert not lock.statistics().held
        # The plain Lock's documented behaviour: it counts with the primary alone.
        plain = AsyncLock(second, "short")
        assert await plain.acquire(blocking=False)
        await plain.release()
    assert await lock.acquire()  # replication back: acknowledged again
    await lock.release()


async def test_an_explicit_policy_tolerates_a_minority_down(
    primary: redis.asyncio.Redis, replicas: tuple[ServerProcess, ...]
) -> None:
    lock = AsyncClusterLock(primary, "one-of-two", min_replicas=1, replica_timeout=0.3)
    with paused(replicas[0]):
        assert await lock.acquire()
        stats = lock.statistics()
        assert (stats.required_replicas, stats.acknowledged_replicas) == (1, 1)
        await lock.release()
    too_many = AsyncClusterLock(primary, "three", min_replicas=3, replica_timeout=0.1)
    with pytest.raises(ReplicationError) as caught:
        await too_many.acquire()
    assert (caught.value.acknowledged, caught.value.required) == (2, 3)
    assert not await too_many.locked()


async def test_a_waiter_handed_the_lock_confirms_it_with_its_own_write(
    primary: redis.asyncio.Redis, second: redis.asyncio.Redis
) -> None:
    holder = AsyncClusterLock(primary, "handoff", timeout=20)
    waiter = AsyncClusterLock(second, "handoff", timeout=20)
    assert await holder.acquire()
    fence = holder.fencing_token
    assert fence is not None

    async def wait() -> int | None:
        assert await waiter.acquire(blocking_timeout=5)
        return waiter.fencing_token

    handle = spawn(wait)
    await until(lambda: in_line(primary, waiter, 1), 5, "the waiter in line")
    await holder.release()
    assert await join(handle) == fence + 1
    # The handoff's short lease was replaced by the full one, acknowledged.
    assert await primary.pttl(waiter.keys.owner) > 15_000
    assert waiter.statistics().acknowledged_replicas == 2
    await waiter.release()


async def test_a_renewal_that_is_never_acknowledged_ends_as_lost(
    primary: redis.asyncio.Redis, replicas: tuple[ServerProcess, ...]
) -> None:
    told: list[AsyncClusterLock] = []
    lock = AsyncClusterLock(
        primary, "renew", timeout=1.2, auto_renew=True, replica_timeout=0.2, on_lost=told.append
    )

    async def lost() -> bool:  # marked lost, and told (in either order)
        return lock.lost and bool(told)

    with pytest.raises(LockLostError):
        async with lock:
            with paused(*replicas):
                await until(lost, 10, "the unacknowledged lock being lost")
                assert lock.lost
                assert told == [lock]
    assert lock.statistics().shortfalls >= 1


async def test_reentry_that_falls_short_is_counted_down(
    primary: redis.asyncio.Redis, replicas: tuple[ServerProcess, ...]
) -> None:
    lock = AsyncClusterLock(primary, "again", reentrant=True, timeout=10, replica_timeout=0.2)
    assert await lock.acquire()
    with paused(*replicas), pytest.raises(ReplicationError):
        await lock.acquire()
    await lock.release()  # the one acknowledged acquisition is the whole hold
    assert not await lock.locked()


async def test_lock_class_hook(primary: redis.asyncio.Redis) -> None:
    client: Any = primary  # redis-py's stubs expect its own Lock class here
    lock = client.lock("hooked", timeout=5, lock_class=AsyncClusterLock)
    assert isinstance(lock, AsyncClusterLock)
    async with lock:
        assert lock.statistics().acknowledged_replicas == 2
    positional = AsyncClusterLock(primary, "pos", 5, 0.01, False, 2.0, False, False, aof=False)
    assert (positional.timeout, positional.sleep, positional.blocking) == (5, 0.01, False)
    assert (positional.blocking_timeout, positional.thread_local) == (2.0, False)
    assert positional.raise_on_release_error is False
    policy = (positional.min_replicas, positional.replica_timeout, positional.aof)
    assert policy == (None, 0.5, False)


async def test_lone_primary_needs_no_acknowledgement(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    # aredis' ClusterLock never succeeds without replicas; a majority of none is none.
    lock = AsyncClusterLock(tenure_async_client, "alone")
    async with lock:
        stats = lock.statistics()
        assert (stats.required_replicas, stats.acknowledged_replicas) == (0, 0)


async def test_a_replica_client_is_refused_clearly(replicated_pair: Replicated) -> None:
    client = replicated_pair.async_replica_client(0)
    try:
        with pytest.raises(BackendError, match="client of the primary; this node is a slave"):
            await AsyncClusterLock(client, "on-replica").acquire()
    finally:
        await client.aclose()


async def test_aof_policy(primary: redis.asyncio.Redis, tenure_engine: Engine) -> None:
    lock = AsyncClusterLock(primary, "aof", aof=True)
    if tenure_engine.name == "redis" and tenure_engine.version_info < (7, 2):
        with pytest.raises(BackendError, match="aof=True needs WAITAOF"):
            await lock.acquire()
    else:  # the primary runs without appendonly
        with pytest.raises(BackendError, match="appendonly yes"):
            await lock.acquire()
    assert not await lock.locked()


async def test_aof_policy_with_appendonly(tenure_engine: Engine) -> None:
    if tenure_engine.name == "redis" and tenure_engine.version_info < (7, 2):
        pytest.skip("WAITAOF needs Redis 7.2+ (this engine's refusal is tested above)")
    with Replicated(replicas=1, appendonly=True, engine=tenure_engine) as topology:
        client = topology.async_client()
        try:
            # appendfsync everysec: an fsync may be a second away.
            lock = AsyncClusterLock(
                client, "fsynced", aof=True, replica_timeout=1.5, waiter_lease=6
            )
            async with lock:
                stats = lock.statistics()
                assert (stats.required_replicas, stats.acknowledged_replicas) == (1, 1)
        finally:
            await client.aclose()


async def test_every_slot_primary_is_asked(replicated_cluster: Cluster) -> None:
    client = replicated_cluster.async_client()
    try:
        names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
        primaries = set()
        for name in names:
            lock = AsyncClusterLock(client, name)
            primaries.add(replicated_cluster.node_for_key(lock.keys.owner).port)
            async with lock:
                stats = lock.statistics()
                assert (stats.required_replicas, stats.acknowledged_replicas) == (1, 1)
        assert len(primaries) >= 2  # the names spread over several masters
    finally:
        await client.aclose()


async def test_bad_policy_arguments_are_named(primary: redis.asyncio.Redis) -> None:
    with pytest.raises(ArgumentError, match="^min_replicas"):
        AsyncClusterLock(primary, "x", min_replicas=-1)
    with pytest.raises(ArgumentError, match="^min_replicas"):
        AsyncClusterLock(primary, "x", min_replicas=True)
    with pytest.raises(ArgumentError, match="^replica_timeout"):
        AsyncClusterLock(primary, "x", replica_timeout=0)
    with pytest.raises(ArgumentError, match="^replica_timeout.*waiter_lease"):
        AsyncClusterLock(primary, "x", replica_timeout=1.0, waiter_lease=2.0)
    # An option the user did not set adapts to the one they did.
    derived = AsyncClusterLock(primary, "x", replica_timeout=1.0)
    assert derived._rules.settings.waiter_lease == 4.0
    with pytest.raises(ArgumentError, match="^replica_timeout.*lease"):
        derived.timeout = 0.5  # a lease shorter than the acknowledgement wait
    assert derived.timeout is None
    with pytest.raises(ArgumentError, match="^replica_timeout.*lease"):
        AsyncClusterLock(primary, "x", timeout=0.2, replica_timeout=0.3)
    with pytest.raises(ArgumentError, match="^aof"):
        AsyncClusterLock(primary, "x", aof="yes")  # type: ignore[arg-type]
