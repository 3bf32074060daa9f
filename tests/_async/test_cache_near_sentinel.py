"""Near caching on a client of ``Sentinel.master_for``, written once for asyncio and generated.

Every server of the service is tracked (the master and each replica): a
write to any of them is announced, so a failover that moves the master
loses no announcement; a client left reading the old master gets nothing
from memory. The history across failovers is in
``tests/test_near_history.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tenure import ArgumentError, AsyncCache, AsyncHerdCache, AsyncIdSet
from tenure.server import Engine, Sentinel
from tests._backend_asyncio import sleep, until

pytestmark = pytest.mark.topologies("standalone")


@pytest.fixture
def sentinel_service(tenure_sentinel: Sentinel) -> Sentinel:
    """The session's Sentinel service (a primary, one replica), which no test here fails over."""
    return tenure_sentinel


async def _closed(client: Any) -> None:
    """Close a client of the service and its pool (a pool given to a client outlives it)."""
    await client.aclose()
    await client.connection_pool.disconnect()
    for sentinel in client.connection_pool.sentinel_manager.sentinels:
        await sentinel.aclose()


@pytest.fixture
async def master(sentinel_service: Sentinel) -> AsyncIterator[Any]:
    client = sentinel_service.async_master_client()
    yield client
    await _closed(client)


async def _near_hits(cache: Any, key: str) -> bool:
    before = cache.statistics().near_hits
    await cache.get(key)
    return bool(cache.statistics().near_hits > before)


async def test_every_server_of_the_service_is_tracked(
    sentinel_service: Sentinel, master: Any
) -> None:
    cache = AsyncCache(master, "near-sentinel", near=True)
    other = sentinel_service.async_master_client()
    elsewhere = AsyncCache(other, "near-sentinel")
    try:
        await elsewhere.set("k", 1)

        async def near() -> bool:
            return await _near_hits(cache, "k")

        await until(near, 5, "a read answered from memory")
        layer = cache._store.near
        assert layer is not None
        tracked = sorted(tracker.where for tracker in layer._trackers)
        servers = (p.address for p in sentinel_service.replication.processes)
        assert tracked == sorted(f"{host}:{port}" for host, port in servers)  # master, replica
        await elsewhere.set("k", 2)

        async def seen() -> bool:
            return bool(await cache.get("k") == 2)

        await until(seen, 2, "another client's write seen")
        await until(near, 2, "near again")
    finally:
        await _closed(other)


async def test_a_herd_cache_and_an_id_set_take_near_on_a_sentinel_client(
    master: Any,
) -> None:
    herd = AsyncHerdCache(master, "near-sentinel-herd", ttl=60, near=True)
    await herd.set("k", {"v": 1})

    async def load() -> dict[str, int]:
        return {"v": 0}

    async def herd_near() -> bool:
        before = herd.statistics().near_hits
        assert await herd.fetch("k", load) == {"v": 1}
        return bool(herd.statistics().near_hits > before)

    await until(herd_near, 5, "a herd fetch answered from memory")
    ids = AsyncIdSet(master, "near-sentinel-ids", near=True)
    await ids.add_many([1, 2, 3])

    async def ids_near() -> bool:
        before = ids.statistics().near_reads
        assert await ids.count() == 3
        return bool(ids.statistics().near_reads > before)

    await until(ids_near, 5, "an id set query answered from memory")


async def test_a_client_of_slave_for_is_refused(sentinel_service: Sentinel) -> None:
    sentinel: Any = sentinel_service.async_sentinel()
    replica = sentinel.slave_for(sentinel_service.service_name)
    try:
        with pytest.raises(ArgumentError, match="slave_for"):
            AsyncCache(replica, "near-sentinel", near=True)
    finally:
        await _closed(replica)


async def test_a_client_left_on_the_old_master_gets_nothing_from_memory(
    tenure_engine: Engine,
) -> None:
    """redis-py's client keeps its connection to the old master after ``SENTINEL FAILOVER``
    until Sentinel reconfigures that server, seconds later: its reads are stale meanwhile,
    near or not. Within a second of the sentinels naming the new master, nothing is served
    from memory; near reads come back once the client reads from the new master."""
    with Sentinel(replicas=1, sentinels=1, engine=tenure_engine) as topology:
        name = topology.service_name
        sentinel: Any = topology.async_sentinel()
        client = sentinel.master_for(name)
        admin: Any = topology.sentinels[0].async_client()
        try:
            cache = AsyncCache(client, "near-old-master", near=True)
            await cache.set("k", 1)

            async def near() -> bool:
                return await _near_hits(cache, "k")

            await until(near, 5, "a read answered from memory")
            old = await sentinel.discover_master(name)
            await admin.execute_command("SENTINEL", "FAILOVER", name)

            async def switched() -> bool:
                return bool(await sentinel.discover_master(name) != old)

            await until(switched, 30, "the sentinels naming the new master")
            await sleep(1.5)  # (tenure asks the sentinels once a second)
            assert client.connection_pool.master_address == old  # still reads the old one
            before = cache.statistics().near_hits
            for _ in range(50):
                assert await cache.get("k") == 1
            assert cache.statistics().near_hits == before  # all from the (old) server
            await client.connection_pool.disconnect()  # its next connection: the new master
            await until(near, 5, "near reads again, from the new master")
            assert client.connection_pool.master_address != old
        finally:
            await admin.aclose()
            await _closed(client)
