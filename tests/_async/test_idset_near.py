"""Id sets with ``near=``: a warm query with no round trip, a write seen within the bound.

Written once for asyncio and generated. The server announces writes to
the sets' keys (client-side caching, as near caches have it); a copy it has
announced nothing to is answered from memory.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import redis.asyncio

from tenure import ArgumentError, AsyncIdSet, IdSetCorruptError, NearCache
from tenure.server import FaultProxy, ServerProcess
from tests._backend_asyncio import until


async def _scripts(server: ServerProcess) -> int:
    """Script calls the server has run so far (INFO commandstats)."""
    admin = server.async_client()
    try:
        stats = await admin.info("commandstats")
    finally:
        await admin.aclose()
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def _near_count(ids: AsyncIdSet, other: AsyncIdSet, expected: int) -> None:
    """Query until a query is answered from memory (the tracking connection up)."""

    async def answered_near() -> bool:
        before = ids.statistics().near_reads
        assert await ids.intersection_count(other) == expected
        return ids.statistics().near_reads > before

    await until(answered_near, 5, "a query answered from memory")


@pytest.mark.topologies("standalone")
async def test_a_warm_query_makes_no_round_trip(
    tenure_async_client: redis.asyncio.Redis, tenure_server: ServerProcess
) -> None:
    ids = AsyncIdSet(tenure_async_client, "near-a", near=True)
    other = AsyncIdSet(tenure_async_client, "near-b", near=True)
    await ids.add_many(np.arange(0, 100_000, dtype=np.uint32))
    await other.add_many(np.arange(50_000, 150_000, dtype=np.uint32))
    await _near_count(ids, other, 50_000)
    before = await _scripts(tenure_server)
    for _ in range(50):
        assert await ids.intersection_count(other) == 50_000
        assert await ids.contains(7) and await ids.count() == 100_000
    assert await ids.jaccard(other) == pytest.approx(50_000 / 150_000)
    assert await _scripts(tenure_server) == before
    assert ids.statistics().near_reads >= 150


@pytest.mark.topologies("standalone", "cluster")
async def test_another_clients_write_is_seen_and_own_writes_at_once(
    tenure_async_client: Any, other_client: Any
) -> None:
    ids = AsyncIdSet(tenure_async_client, "near-seen", near=True)
    other = AsyncIdSet(tenure_async_client, "near-seen-other", near=True)
    elsewhere = AsyncIdSet(other_client, "near-seen")  # another process's object
    await ids.add_many([1, 2, 3])
    await other.add_many([2, 3, 4])
    await _near_count(ids, other, 2)
    await elsewhere.add(4)  # announced by the server

    async def seen() -> bool:
        return bool(await ids.intersection_count(other) == 3)

    await until(seen, 2, "another client's write seen")
    await ids.remove(2)  # this process's own write: at once
    assert await ids.intersection_count(other) == 2
    plain = AsyncIdSet(tenure_async_client, "near-seen-other")  # without near=, same process
    await plain.add(1)
    assert await ids.intersection_count(other) == 3
    await plain.clear()
    assert await ids.intersection_count(other) == 0


@pytest.mark.topologies("standalone")
async def test_a_write_to_any_key_of_the_set_is_seen(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    """A client not tenure's that touches only the set's log (or its compact form)."""
    ids = AsyncIdSet(tenure_async_client, "near-keys", near=True)
    other = AsyncIdSet(tenure_async_client, "near-keys-other", near=True)
    await ids.add_many([1, 2, 3])
    await other.add_many([2, 3])
    await _near_count(ids, other, 2)
    await other_client.rpush(ids.keys.log, b"garbage")  # only the log: announced, read again

    async def refused() -> bool:
        try:
            await ids.intersection_count(other)
        except IdSetCorruptError:
            return True
        return False

    await until(refused, 2, "the corrupt log element read and refused")


@pytest.mark.topologies("standalone")
async def test_a_silent_tracking_connection_stops_near_reads_within_the_bound(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = tenure_proxy.async_client(socket_timeout=0.5)
    try:
        ids = AsyncIdSet(client, "near-cut", near=NearCache(max_staleness=0.1))
        other = AsyncIdSet(client, "near-cut-other", near=NearCache(max_staleness=0.1))
        await ids.add_many([1, 2])
        await other.add_many([2, 3])
        await _near_count(ids, other, 1)
        tenure_proxy.blackhole()
        cut = last_near = time.monotonic()
        while time.monotonic() - cut < 5:
            before = ids.statistics().near_reads
            try:
                assert await ids.intersection_count(other) == 1
            except Exception:
                break  # read from the server, which cannot answer: the bound holds
            if ids.statistics().near_reads > before:
                last_near = time.monotonic()
        else:
            raise AssertionError("near reads went on past the bound")
        assert last_near - cut <= 0.1 + 0.05
    finally:
        tenure_proxy.clear()
        await client.aclose()


async def test_bad_near_values_are_refused(tenure_async_client: Any) -> None:
    for bad in ("yes", 1, {"max_staleness": 1}):
        with pytest.raises(ArgumentError, match="near"):
            AsyncIdSet(tenure_async_client, "near-bad", near=bad)  # type: ignore[arg-type]
