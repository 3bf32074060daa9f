"""Near caching (``near=``) against a real server, written once for asyncio and generated.

A near hit makes no round trip; a write by any client is announced and
drops the entry; this process's own writes drop it at once; a tracking
connection gone silent stops near hits within ``max_staleness``.
"""

from __future__ import annotations

import time
from typing import Any, cast

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenure import (
    ArgumentError,
    AsyncCache,
    AsyncHerdCache,
    NearCache,
    ServerUnavailableError,
    WrongTypeError,
    cached,
)
from tenure.server import FaultProxy, ServerProcess
from tests._backend_asyncio import sleep, until

pytestmark = pytest.mark.topologies("standalone")


async def _gets(server: ServerProcess) -> int:
    """GET calls the server has run so far (INFO commandstats)."""
    admin = server.async_client()
    try:
        stats = await admin.info("commandstats")
    finally:
        await admin.aclose()
    return int(stats.get("cmdstat_get", {}).get("calls", 0))


async def _settled(cache: Any) -> None:
    """Wait until ``cache``'s tracking connection confirms (its first PING answered)."""

    async def confirmed() -> bool:
        near = cache._store.near
        assert near is not None
        entries = near.entries
        return entries.tracked and bool(entries.confirmation.covers(time.monotonic(), 0.05))

    await until(confirmed, 5, "the tracking connection up")


async def _near(cache: AsyncCache, key: str) -> None:
    """Read ``key`` until a read is answered from memory (at most 2 s)."""

    async def answered_near() -> bool:
        before = cache.statistics().near_hits
        await cache.get(key)
        return cache.statistics().near_hits > before

    await until(answered_near, 2, f"{key!r} answered from memory")


async def test_a_near_hit_makes_no_round_trip(
    tenure_async_client: redis.asyncio.Redis, tenure_server: ServerProcess
) -> None:
    cache = AsyncCache(tenure_async_client, "near-rates", near=True)
    await _settled(cache)
    await cache.set("eur", {"rate": 1.08})
    await _near(cache, "eur")  # (the announcement of its own write may drop the first read)
    before, near_before = await _gets(tenure_server), cache.statistics().near_hits
    for _ in range(100):
        assert await cache.get("eur") == {"rate": 1.08}
    assert await _gets(tenure_server) == before
    assert cache.statistics().near_hits == near_before + 100
    value = await cache.get("eur")
    value["rate"] = 0  # each hit is decoded anew: a caller's change stays its own
    assert await cache.get("eur") == {"rate": 1.08}


async def test_a_write_by_any_client_is_seen(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    cache = AsyncCache(tenure_async_client, "near-seen", near=True)
    elsewhere = AsyncCache(other_client, "near-seen")
    await _settled(cache)
    await elsewhere.set("k", 1)
    assert await cache.get("k") == 1
    assert await cache.get("k") == 1  # near now
    await elsewhere.set("k", 2)  # another process, through tenure

    async def sees(value: Any) -> bool:
        return bool(await cache.get("k") == value)

    await until(lambda: sees(2), 1, "the write seen")
    # a client that is not tenure: a raw SET of the entry's key, and a DEL
    await other_client.set(cache.key_of("k"), cache.codec.encode(3))
    await until(lambda: sees(3), 1, "the raw write seen")
    await other_client.delete(cache.key_of("k"))
    await until(lambda: sees(None), 1, "the delete seen")
    await other_client.set(cache.key_of("k"), cache.codec.encode(4))
    assert await cache.get("k") == 4
    await other_client.flushall()
    await until(lambda: sees(None), 1, "the flush seen")


async def test_this_process_reads_its_own_writes_at_once(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncCache(tenure_async_client, "near-own", near=True)
    await _settled(cache)
    await cache.set("k", "first")
    assert await cache.get("k") == "first"
    await cache.set("k", "second")
    assert await cache.get("k") == "second"
    await cache.set_many({"k": "third"})
    assert await cache.get("k") == "third"
    await cache.delete("k")
    assert await cache.get("k", default="gone") == "gone"
    await cache.set("k", "back")
    assert await cache.get("k") == "back"
    await cache.clear()
    assert await cache.get("k") is None


async def test_writes_through_any_cache_object_of_this_process_drop_near_entries_at_once(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    """Another object of this process (without ``near=``, on another client) writes:
    the near entries go at once, not when the server's announcement comes."""
    client = tenure_proxy.async_client(socket_timeout=2)
    try:
        cache = AsyncCache(client, "near-others", near=True)
        herd = AsyncHerdCache(client, "near-others-herd", ttl=60, near=True)
        plain = AsyncCache(tenure_async_client, "near-others")
        plain_herd = AsyncHerdCache(tenure_async_client, "near-others-herd", ttl=60)
        await _settled(cache)
        await plain.set("k", 1)
        await plain_herd.set("k", 1)
        await herd.get("k")  # (the server's clock learnt)
        await _near(cache, "k")

        async def herd_near() -> bool:
            before = herd.statistics().near_hits
            return await herd.get("k") == 1 and herd.statistics().near_hits > before

        await until(herd_near, 2, "the herd entry answered from memory")
        tenure_proxy.set_latency(0.3, "downstream")  # the announcements come late
        await plain.set("k", 2)
        await plain_herd.set("k", 2)
        assert await cache.get("k") == 2
        assert await herd.get("k") == 2
        await plain.delete("k")
        assert await cache.get("k") is None
    finally:
        tenure_proxy.clear()
        await client.aclose()


async def test_an_entry_expires_with_its_server_copy(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncCache(tenure_async_client, "near-ttl", near=True)
    await _settled(cache)
    await cache.set("k", "short", ttl=0.3)
    assert await cache.get("k") == "short"
    assert await cache.get("k") == "short"
    await sleep(0.35)
    assert await cache.get("k") is None


async def test_a_silent_tracking_connection_stops_near_hits_within_the_bound(
    tenure_proxy: FaultProxy, tenure_client: Any
) -> None:
    client = tenure_proxy.async_client(socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        cache = AsyncCache(client, "near-cut", near=NearCache(max_staleness=0.1))
        await _settled(cache)
        await cache.set("k", "v")
        await _near(cache, "k")
        tenure_proxy.blackhole()  # the tracking connection (and every other) goes silent
        cut = last_near = time.monotonic()
        while time.monotonic() - cut < 5:
            before = cache.statistics().near_hits
            try:
                assert await cache.get("k") == "v"
            except ServerUnavailableError:
                break  # read from the server, which cannot answer: the bound holds
            if cache.statistics().near_hits > before:
                last_near = time.monotonic()
        else:
            raise AssertionError("near hits went on past the bound")
        assert last_near - cut <= 0.1 + 0.05  # max_staleness (and the loop's own step)
        tenure_proxy.clear()

        async def near_again() -> bool:
            before = cache.statistics().near_hits
            return await cache.get("k") == "v" and cache.statistics().near_hits > before

        await until(near_again, 10, "near hits back once tracking is")
    finally:
        tenure_proxy.clear()
        await client.aclose()


async def test_resp3_clients_and_json_values_written_elsewhere(
    tenure_server: ServerProcess, tenure_client: Any
) -> None:
    client = tenure_server.async_client(protocol=3)
    try:
        cache = AsyncCache(client, "near-resp3", near=True)
        await _settled(cache)
        await client.set(cache.key_of("k"), cache.codec.encode([1, 2]))
        assert await cache.get("k") == [1, 2]
        await _near(cache, "k")
        await client.set(cache.key_of("k"), cache.codec.encode("changed"))
        await until(lambda: _equals(cache, "changed"), 1, "the write seen on RESP3")
    finally:
        await client.aclose()


async def _equals(cache: AsyncCache, value: Any) -> bool:
    return bool(await cache.get("k") == value)


async def test_a_key_of_another_type_is_refused_as_without_near(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncCache(tenure_async_client, "near-type", near=True)
    await tenure_async_client.rpush(cache.key_of("k"), "a")
    with pytest.raises(WrongTypeError):
        await cache.get("k")


async def test_bad_near_values_are_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    for bad in ("yes", 1, {"max_entries": 3}):
        with pytest.raises(ArgumentError, match="near"):
            AsyncCache(tenure_async_client, "near-bad", near=bad)  # type: ignore[arg-type]


async def _calls(server: ServerProcess) -> int:
    """Reads and writes the server has run so far (INFO commandstats)."""
    admin = server.async_client()
    try:
        stats = await admin.info("commandstats")
    finally:
        await admin.aclose()
    counted = ("get", "set", "pttl", "evalsha", "eval", "getrange")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in counted)


async def test_a_herd_cache_serves_fresh_entries_from_memory(
    tenure_async_client: redis.asyncio.Redis,
    other_client: redis.asyncio.Redis,
    tenure_server: ServerProcess,
) -> None:
    cache = AsyncHerdCache(tenure_async_client, "near-herd", ttl=0.5, near=True)
    elsewhere = AsyncHerdCache(other_client, "near-herd", ttl=0.5)
    await _settled(cache)
    loads = 0

    async def load() -> int:
        nonlocal loads
        loads += 1
        return loads

    assert await cache.fetch("k", load) == 1

    async def near_hit() -> bool:
        before = cache.statistics().near_hits
        await cache.fetch("k", load)
        return cache.statistics().near_hits > before

    await until(near_hit, 2, "a fetch answered from memory")
    before = await _calls(tenure_server)
    for _ in range(50):
        assert await cache.fetch("k", load) == 1
    assert await _calls(tenure_server) == before
    await elsewhere.set("k", 7)  # another process writes it

    async def sees(value: Any) -> bool:
        return bool(await cache.fetch("k", load) == value)

    await until(lambda: sees(7), 1, "the write seen")
    await sleep(0.55)  # past its freshness: not from memory, served stale and refreshed once
    assert await cache.fetch("k", load) == 7
    await until(lambda: sees(2), 2, "the refresh's value")
    assert loads == 2


async def test_cached_takes_near(tenure_async_client: redis.asyncio.Redis) -> None:
    calls = 0

    @cached(tenure_async_client, ttl=60, name="near-cached", near=True)
    async def square(x: int) -> int:  # (typed Any below: the wrapper's methods)
        nonlocal calls
        calls += 1
        return x * x

    assert await square(3) == 9
    await until(lambda: _near_square(square), 2, "a call answered from memory")
    assert calls == 1
    await cast(Any, square).invalidate(3)
    assert await square(3) == 9 and calls == 2


async def _near_square(square: Any) -> bool:
    before = square.cache.statistics().near_hits
    await square(3)
    return bool(square.cache.statistics().near_hits > before)


@pytest.mark.topologies("cluster")
async def test_a_cluster_is_tracked_on_every_primary(
    tenure_async_client: Any, other_client: Any
) -> None:
    cache = AsyncCache(tenure_async_client, "near-cluster", near=True)
    elsewhere = AsyncCache(other_client, "near-cluster")
    keys = [f"k{n}" for n in range(12)]  # spread over the three primaries' slots
    for n, key in enumerate(keys):
        await elsewhere.set(key, n)
    await cache.get(keys[0])  # the client learns its primaries; a tracker each

    async def all_near() -> bool:
        before = cache.statistics().near_hits
        values = [await cache.get(key) for key in keys]
        return values == list(range(12)) and cache.statistics().near_hits == before + 12

    await until(all_near, 5, "every key answered from memory")
    near = cache._store.near
    assert near is not None and len(near._trackers) == 3
    for n, key in enumerate(keys):
        await elsewhere.set(key, n + 100)

    async def all_seen() -> bool:
        return [await cache.get(key) for key in keys] == [n + 100 for n in range(12)]

    await until(all_seen, 2, "every primary's write seen")
