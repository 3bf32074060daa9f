"""Batch reads (``get_many``), written once for asyncio and generated.

A batch of warm entries is one round trip (an MGET; on a cluster, a
pipeline of GETs per node), whatever its size; the entries that are not
surely fresh take one more for them all (a pipeline of ``cache_fetch``
calls), each following the single-key rules; with ``near=`` the entries
answered from memory make none.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio

from tenure import ArgumentError, AsyncCache, AsyncHerdCache, WrongTypeError
from tenure.server import ServerProcess
from tests._backend_asyncio import sleep, until

COUNTED = ("get", "mget", "pttl", "evalsha", "eval", "set", "time")


async def _commands(server: ServerProcess) -> dict[str, int]:
    """Calls of the commands a cache read may send, so far (INFO commandstats)."""
    admin = server.async_client()
    try:
        stats = await admin.info("commandstats")
    finally:
        await admin.aclose()
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in COUNTED}


async def _sent(server: ServerProcess, before: dict[str, int]) -> dict[str, int]:
    """The calls made since ``before`` (the commands that were called only)."""
    now = await _commands(server)
    return {name: now[name] - before[name] for name in COUNTED if now[name] > before[name]}


@pytest.mark.topologies("standalone")
async def test_a_warm_herd_batch_is_one_mget(
    tenure_async_client: redis.asyncio.Redis, tenure_server: ServerProcess
) -> None:
    writer = AsyncHerdCache(tenure_async_client, "batch-warm", ttl=60)
    keys = [f"k{n}" for n in range(100)]
    assert await writer.set_many({key: {"n": n} for n, key in enumerate(keys)})
    cache = AsyncHerdCache(tenure_async_client, "batch-warm", ttl=60)  # as a new process's
    before = await _commands(tenure_server)
    assert await cache.get_many(keys) == [{"n": n} for n in range(100)]
    # No script: the server's clock learnt with TIME (once: its estimate lasts), one MGET.
    assert await _sent(tenure_server, before) == {"time": 1, "mget": 1}
    before = await _commands(tenure_server)
    assert await cache.get_many(keys) == [{"n": n} for n in range(100)]
    assert await _sent(tenure_server, before) == {"mget": 1}
    assert cache.statistics().hits == 200


@pytest.mark.topologies("standalone")
async def test_stale_and_missing_entries_follow_the_single_key_rules(
    tenure_async_client: redis.asyncio.Redis,
    other_client: redis.asyncio.Redis,
    tenure_server: ServerProcess,
) -> None:
    cache = AsyncHerdCache(tenure_async_client, "batch-rules", ttl=0.3, herd_timeout=30)
    other = AsyncHerdCache(other_client, "batch-rules", ttl=0.3, herd_timeout=30)
    assert await cache.set_many({"stale": "old", "fresh": "x"})
    await sleep(0.35)  # "stale" is past its freshness; "fresh" is written again
    assert await cache.set("fresh", "new", ttl=60)
    assert await cache.get("fresh") == "new"  # a script call: the script loaded, the clock learnt
    keys = ["fresh", "stale", "missing", "fresh"]
    before = await _commands(tenure_server)
    assert await cache.get_many(keys, default=0) == ["new", 0, 0, "new"]
    sent = await _sent(tenure_server, before)
    # One MGET, then one pipeline of two scripts.
    assert sent.get("evalsha", 0) == 2 and "eval" not in sent, sent
    # This object refreshes "stale" and loads "missing"; anyone else is served the
    # stale value, and waits for the missing one (gets the default).
    assert await other.get_many(keys, default=0) == ["new", "old", 0, "new"]
    assert await cache.set("stale", "refreshed")
    assert await cache.set("missing", "loaded")
    assert await other.get_many(keys) == ["new", "refreshed", "loaded", "new"]
    assert await other.set("missing", "late")  # not its load: an explicit write, it lands
    statistics = cache.statistics()
    assert statistics.misses >= 2


@pytest.mark.topologies("standalone")
async def test_a_lost_script_is_loaded_again_in_a_batch(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncHerdCache(tenure_async_client, "batch-noscript", ttl=60)
    assert await cache.set("a", 1)
    await tenure_async_client.script_flush()
    assert await cache.get_many(["a", "b"], default=-1) == [1, -1]
    assert await cache.set("b", 2)
    await tenure_async_client.script_flush()
    assert await cache.get_many(["a", "b", "c"], default=-1) == [1, 2, -1]


@pytest.mark.topologies("standalone", "cluster")
async def test_batches_on_every_topology(tenure_async_client: Any, other_client: Any) -> None:
    """On a cluster the keys spread over the primaries: a pipeline per node."""
    cache = AsyncHerdCache(tenure_async_client, "batch-spread", ttl=60)
    other = AsyncHerdCache(other_client, "batch-spread", ttl=60)
    keys = [f"k{n}" for n in range(40)]
    assert await cache.set_many({key: n for n, key in enumerate(keys[:30])})
    assert await cache.get_many(keys, default=None) == [*range(30), *[None] * 10]
    assert await other.get_many(keys, default=None) == [*range(30), *[None] * 10]
    for key in keys[30:]:  # this object was elected to load each missing one
        assert await cache.set(key, key)
    assert await other.get_many(keys) == [*range(30), *keys[30:]]
    plain = AsyncCache(tenure_async_client, "batch-spread-plain")
    assert await plain.set_many({key: n for n, key in enumerate(keys[:30])})
    assert await plain.get_many(keys, default=-1) == [*range(30), *[-1] * 10]


@pytest.mark.topologies("standalone", "cluster")
async def test_a_key_of_another_type_in_a_batch(tenure_async_client: Any) -> None:
    """A herd cache refuses it, as its get does; a plain cache's batch reads it as
    missing, as MGET does (its get refuses it)."""
    cache = AsyncHerdCache(tenure_async_client, "batch-type", ttl=60)
    plain = AsyncCache(tenure_async_client, "batch-type-plain")
    near = AsyncCache(tenure_async_client, "batch-type-plain", near=True)
    await tenure_async_client.rpush(cache.key_of("list"), "a")
    await tenure_async_client.rpush(plain.key_of("list"), "a")
    assert await cache.set("a", 1) and await plain.set("a", 1)
    with pytest.raises(WrongTypeError):
        await cache.get_many(["a", "list"])
    assert await plain.get_many(["a", "list"], default=-1) == [1, -1]
    assert await near.get_many(["a", "list"], default=-1) == [1, -1]
    with pytest.raises(WrongTypeError):
        await plain.get("list")
    assert await cache.get_many([]) == [] and await plain.get_many([]) == []


@pytest.mark.topologies("standalone")
async def test_near_batches_read_only_what_memory_cannot_answer(
    tenure_async_client: redis.asyncio.Redis,
    other_client: redis.asyncio.Redis,
    tenure_server: ServerProcess,
) -> None:
    herd = AsyncHerdCache(tenure_async_client, "batch-near", ttl=60, near=True)
    plain = AsyncCache(tenure_async_client, "batch-near-plain", near=True)
    writer = AsyncCache(other_client, "batch-near-plain")
    keys = [f"k{n}" for n in range(20)]
    assert await herd.set_many({key: n for n, key in enumerate(keys)})
    assert await plain.set_many({key: n for n, key in enumerate(keys)})
    await herd.get("k0")  # the server's clock learnt

    async def all_near(cache: Any) -> bool:
        before = cache.statistics().near_hits
        values = await cache.get_many(keys)
        return bool(values == list(range(20)) and cache.statistics().near_hits == before + 20)

    await until(lambda: all_near(herd), 5, "the herd batch answered from memory")
    await until(lambda: all_near(plain), 5, "the plain batch answered from memory")
    before = await _commands(tenure_server)
    assert await herd.get_many(keys) == list(range(20))
    assert await plain.get_many(keys) == list(range(20))
    assert await _sent(tenure_server, before) == {}
    await writer.set("k3", 33)  # another client's write: announced, dropped, read again

    async def seen() -> bool:
        return bool((await plain.get_many(keys))[3] == 33)

    await until(seen, 2, "the write seen in a batch")
    before = await _commands(tenure_server)
    started = time.monotonic()
    while time.monotonic() - started < 0.2:  # kept near again once read
        assert (await plain.get_many(keys))[3] == 33
    sent = await _sent(tenure_server, before)
    assert sent.get("get", 0) <= 1, sent


async def test_a_batch_is_an_iterable_of_keys(tenure_async_client: Any) -> None:
    """A str is an iterable of one-letter keys: refused, as None is, naming the argument."""
    cache = AsyncHerdCache(tenure_async_client, "batch-bad", ttl=60)
    plain = AsyncCache(tenure_async_client, "batch-bad-plain")
    bads: list[Any] = ["ab", b"ab", None, 3]
    for bad in bads:
        for call in (cache.get_many, plain.get_many, plain.delete_many, cache.delete_many):
            with pytest.raises(ArgumentError, match="keys"):
                await call(bad)
    assert await plain.get_many(key for key in ("a", "b")) == [None, None]
