"""Cache and HerdCache contract tests, written once for asyncio and generated for threads."""

from __future__ import annotations

import logging
import os
import pickle
import time
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio
import redis.asyncio.cluster

from tenure import (
    ArgumentError,
    AsyncCache,
    AsyncHerdCache,
    ClientTypeError,
    MsgpackSerializer,
    PickleSerializer,
    ZstdCompressor,
)
from tenure._core.cache import WAIT_RECHECK, CacheKeys
from tests._backend_asyncio import gather, join, sleep, spawn, subscribed, until

pytestmark = pytest.mark.topologies("standalone", "cluster")


class Loader:
    """A loader that counts its calls and takes ``seconds`` (a slow database query)."""

    def __init__(self, value: Any, seconds: float = 0.0) -> None:
        self.value = value
        self.seconds = seconds
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.seconds:
            await sleep(self.seconds)
        return self.value


class GatedLoader:
    """A loader that holds its value until the test sets ``opened`` (at most 10 s)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.calls = 0
        self.opened = False
        self.returned = False

    async def _is_open(self) -> bool:
        return self.opened

    async def __call__(self) -> Any:
        self.calls += 1
        await until(self._is_open, 10, "the gate opening")
        self.returned = True
        return self.value


# -- Cache -----------------------------------------------------------------------


async def test_cache_round_trip(tenure_async_client: redis.asyncio.Redis) -> None:
    cache = AsyncCache(tenure_async_client, "pages", ttl=30)
    assert await cache.get("home") is None
    assert await cache.get("home", default="none") == "none"
    assert await cache.set("home", {"title": "Hi", "n": [1, 2.5, None]})
    assert await cache.get("home") == {"title": "Hi", "n": [1, 2.5, None]}
    assert await cache.exists("home")
    left = await cache.ttl("home")
    assert left is not None and 29 < left <= 30
    assert await cache.delete("home")
    assert not await cache.exists("home")
    assert await cache.ttl("home") is None


async def test_cache_params_name_entries_canonically(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncCache(tenure_async_client, "search")
    await cache.set("q", "first", param={"page": 1, "sort": ["a", "b"], "tags": {"x", "y"}})
    # the same param built in another order names the same entry
    assert (
        await cache.get("q", param={"tags": {"y", "x"}, "sort": ["a", "b"], "page": 1}) == "first"
    )
    assert await cache.get("q", param={"page": 2, "sort": ["a", "b"], "tags": {"x", "y"}}) is None
    assert await cache.get("q") is None
    assert await cache.ttl("q", param={"page": 1, "sort": ["a", "b"], "tags": {"x", "y"}}) == float(
        "inf"
    )
    with pytest.raises(ArgumentError, match="stable cache key"):
        await cache.get("q", param=object())


async def test_cache_many_and_clear(tenure_async_client: redis.asyncio.Redis) -> None:
    cache = AsyncCache(tenure_async_client, "items", ttl=60)
    other = AsyncCache(tenure_async_client, "items-other")
    assert await cache.set_many({f"k{i}": i for i in range(1200)})
    await other.set("k1", "kept")
    assert await cache.get_many(["k1", "nope", "k1199"], default=-1) == [1, -1, 1199]
    assert await cache.delete_many(["k0", "k1", "nope"]) == 2
    assert await cache.clear() == 1198
    assert await cache.get("k5") is None
    assert await other.get("k1") == "kept"


async def test_cache_expires(tenure_async_client: redis.asyncio.Redis) -> None:
    cache = AsyncCache(tenure_async_client, "short", ttl=0.2)
    set_at = time.monotonic()  # the server runs the SET after this: its ttl counts from later
    await cache.set("a", 1)
    await cache.set("b", 2, ttl=5)

    async def a_gone() -> bool:
        return await cache.get("a") is None

    await until(a_gone, 5, "the 0.2 s entry expiring")
    assert time.monotonic() - set_at >= 0.2 - 0.01  # not before its ttl
    assert await cache.get("b") == 2


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"compressor": None},
        {"serializer": MsgpackSerializer()},
        {"serializer": PickleSerializer(b"0123456789abcdef"), "compressor": ZstdCompressor()},
    ],
    ids=["json-zlib", "json-raw", "msgpack", "pickle-zstd"],
)
async def test_every_value_kind_round_trips(
    tenure_async_client: redis.asyncio.Redis, options: dict[str, Any]
) -> None:
    cache = AsyncCache(tenure_async_client, "kinds", **options)
    values: list[Any] = [
        None,
        True,
        0,
        -(2**53),
        3.25,
        "",
        "ünïcode ✓",
        [1, [2, [3]]],
        {"a": {"b": None}},
        "x" * 5000,  # compressed
    ]
    if "serializer" in options:
        values += [b"\x00\xffbytes"]
    if isinstance(options.get("serializer"), PickleSerializer):
        values += [{1, 2, 3}, (1, "two"), complex(1, 2)]
    for index, value in enumerate(values):
        await cache.set(f"v{index}", value)
        assert await cache.get(f"v{index}") == value, value


async def test_raw_bytes_without_a_serializer(tenure_async_client: redis.asyncio.Redis) -> None:
    cache = AsyncCache(tenure_async_client, "raw", serializer=None, compressor=None)
    await cache.set("a", b"\x00\x01")
    assert await cache.get("a") == b"\x00\x01"
    with pytest.raises(ArgumentError, match="must be bytes"):
        await cache.set("b", 12)


async def test_undecodable_value_is_a_miss_with_one_warning(
    tenure_async_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    cache = AsyncCache(tenure_async_client, "mixed")
    await tenure_async_client.set(cache.key_of("garbage"), b"not ours")
    await AsyncCache(tenure_async_client, "mixed", serializer=MsgpackSerializer()).set("mp", [1])
    with caplog.at_level(logging.WARNING, logger="tenure.cache"):
        assert await cache.get("garbage", default="miss") == "miss"
        assert await cache.get("mp", default="miss") == "miss"
    assert sum("cannot decode" in r.message for r in caplog.records) == 1
    assert cache.statistics().decode_errors == 2


class _Planted:
    """Unpickling this creates a file: the side effect a planted payload must never have."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


async def test_planted_pickle_is_never_unpickled(
    tenure_async_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    cache = AsyncCache(tenure_async_client, "signed", serializer=PickleSerializer(b"k" * 32))
    evil = pickle.dumps(_Planted(str(marker)))
    forged = AsyncCache(tenure_async_client, "signed", serializer=PickleSerializer(b"x" * 32))
    await forged.set("wrong-key", _Planted(str(marker)))
    await tenure_async_client.set(cache.key_of("unsigned"), b"tn1pickle::" + evil)
    await tenure_async_client.set(cache.key_of("short"), b"tn1pickle::" + evil[:10])
    for key in ("wrong-key", "unsigned", "short"):
        assert await cache.get(key, default="refused") == "refused"
    assert not marker.exists()
    pickle.loads(evil).close()  # the payload does have the side effect when unpickled
    assert marker.exists()
    os.unlink(marker)
    with pytest.raises(ArgumentError, match="16 bytes"):
        PickleSerializer(b"short")


async def test_caches_check_their_arguments(tenure_async_client: redis.asyncio.Redis) -> None:
    with pytest.raises(ArgumentError, match="ttl"):
        AsyncCache(tenure_async_client, "x", ttl=-1)
    with pytest.raises(ArgumentError, match="serialize"):
        AsyncCache(tenure_async_client, "x", serializer=object())
    with pytest.raises(ArgumentError, match="herd_timeout"):
        AsyncHerdCache(tenure_async_client, "x", herd_timeout=float("nan"))
    with pytest.raises(ArgumentError, match="identity_generator"):
        await AsyncCache(tenure_async_client, "x", identity_generator=None).get("k", param=1)
    with pytest.raises(ClientTypeError, match="client"):
        AsyncCache(object(), "x")  # type: ignore[arg-type]
    decoding = redis.asyncio.Redis(decode_responses=True)
    with pytest.raises(ClientTypeError, match="decode_responses=False"):
        AsyncHerdCache(decoding, "x")
    await decoding.aclose()


# -- HerdCache: fetch ----------------------------------------------------------------


async def test_cold_key_loads_once_for_every_caller(
    tenure_async_client: redis.asyncio.Redis, clients: list[redis.asyncio.Redis]
) -> None:
    loader = Loader({"report": 42}, seconds=0.3)
    caches = [AsyncHerdCache(client, "reports", ttl=10) for client in clients[:4]]

    async def caller(index: int) -> tuple[Any, float]:
        started = time.monotonic()
        value = await caches[index % 4].fetch("monthly", loader)
        return value, time.monotonic() - started

    results = await gather(*(lambda i=i: caller(i) for i in range(20)))
    assert loader.calls == 1
    assert all(value == {"report": 42} for value, _ in results)
    # woken when the value lands (0.3 s), or at worst by the 1 s re-check; a busy
    # 2-core machine may add about a second more
    assert max(waited for _, waited in results) < 0.3 + 1.0 + 1.0
    assert sum(c.statistics().loads for c in caches) == 1


async def test_stale_key_is_served_at_once_while_one_caller_refreshes(
    tenure_async_client: redis.asyncio.Redis, clients: list[redis.asyncio.Redis]
) -> None:
    caches = [AsyncHerdCache(client, "prices", ttl=0.2) for client in clients[:4]]
    first = Loader("old")
    assert await caches[0].fetch("eur", first) == "old"
    await until(lambda: _stale(tenure_async_client, caches[0], "eur"), 5, "the 0.2 s ttl passing")
    loader = GatedLoader("new")

    results = await gather(
        *(lambda i=i: caches[i % 4].fetch("eur", loader, ttl=10) for i in range(20))
    )
    assert results == ["old"] * 20
    # every caller has its answer while the refresh is still held at its gate:
    # nobody waited for the load
    assert loader.calls == 1 and not loader.returned
    loader.opened = True

    async def refreshed() -> bool:
        return bool(await caches[1].get("eur") == "new")

    await until(refreshed, 10, "the refreshed value being stored")
    assert await caches[2].fetch("eur", loader) == "new"
    assert loader.calls == 1


async def test_a_lapsed_refresher_cannot_overwrite_newer_data(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    slow = AsyncHerdCache(tenure_async_client, "rates", ttl=0.1, load_lease=0.2)
    fast = AsyncHerdCache(other_client, "rates", ttl=10, load_lease=0.2)
    await slow.set("usd", "v1")
    await until(lambda: _stale(tenure_async_client, slow, "usd"), 5, "the 0.1 s ttl passing")
    assert await slow.get("usd") is None  # stale: this caller is elected to refresh
    assert await fast.get("usd") == "v1"  # the others are served stale
    # The slow refresher's 0.2 s lease runs out.
    await until(lambda: _lease_gone(tenure_async_client, slow, "usd"), 5, "the lease running out")
    assert await fast.fetch("usd", Loader("v3")) == "v1"  # fast takes the lease over...

    async def stored() -> bool:
        return bool(await fast.get("usd") == "v3")

    await until(stored, 5, "fast's refresh being stored")  # ...and stores
    assert await slow.set("usd", "v2-late") is False
    assert await fast.get("usd") == "v3"
    assert slow.statistics().refused == 1


async def test_loader_error_stores_nothing_and_passes_the_load_on(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    cache = AsyncHerdCache(tenure_async_client, "flaky", ttl=10)
    other = AsyncHerdCache(other_client, "flaky", ttl=10)

    async def failing() -> Any:
        await sleep(0.2)
        raise RuntimeError("database down")

    good = Loader("fine")
    failing_call = spawn(lambda: cache.fetch("k", failing))
    await until(
        lambda: _load_leased(tenure_async_client, cache, "k"), 5, "the failing load's lease"
    )
    started = time.monotonic()
    waiting_call = spawn(lambda: other.fetch("k", good))  # waits for the failing load
    with pytest.raises(RuntimeError, match="database down"):
        await join(failing_call)
    assert await join(waiting_call) == "fine"
    assert time.monotonic() - started < 1.0  # woken when the lease was given back, not at 5 s
    assert good.calls == 1
    assert await cache.fetch("k", Loader("unused")) == "fine"


async def test_a_long_load_renews_its_lease(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    cache = AsyncHerdCache(tenure_async_client, "slow", ttl=10, load_lease=0.3)
    other = AsyncHerdCache(other_client, "slow", ttl=10, load_lease=0.3)
    slow = Loader("computed", seconds=1.0)
    racer = Loader("racer")
    first = spawn(lambda: cache.fetch("k", slow))
    await until(lambda: _load_leased(tenure_async_client, cache, "k"), 5, "the slow load's lease")
    assert await other.fetch("k", racer) == "computed"
    assert await join(first) == "computed"
    assert (slow.calls, racer.calls) == (1, 0)


async def test_a_dead_loader_delays_others_by_its_lease_at_most(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    dead = AsyncHerdCache(tenure_async_client, "orphan", ttl=10, load_lease=0.4)
    assert await dead.get("k") is None  # elected to load, then never stores (a crash)
    other = AsyncHerdCache(other_client, "orphan", ttl=10, load_lease=0.4)
    started = time.monotonic()
    assert await other.fetch("k", Loader("recovered")) == "recovered"
    assert 0.2 < time.monotonic() - started < 1.5  # not the default 5 s lease


async def test_callers_in_one_process_share_one_request(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncHerdCache(tenure_async_client, "shared", ttl=10)
    loader = Loader("v", seconds=0.5)  # every caller starts within it, on a busy machine too
    results = await gather(*(lambda: cache.fetch("k", loader) for _ in range(10)))
    assert results == ["v"] * 10
    stats = cache.statistics()
    assert (loader.calls, stats.loads, stats.shared) == (1, 1, 9)


async def test_herd_get_and_set_keep_aredis_behaviour(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncHerdCache(tenure_async_client, "legacy", ttl=0.1, herd_timeout=5)
    assert await cache.get("k") is None  # missing: this caller loads
    assert await cache.set("k", "v1")
    assert await cache.get("k") == "v1"
    await until(lambda: _stale(tenure_async_client, cache, "k"), 5, "the 0.1 s ttl passing")
    assert await cache.get("k") is None  # stale: the first caller refreshes...
    assert await cache.get("k") == "v1"  # ...everyone else is served the stale value
    assert await cache.set("k", "v2")
    assert await cache.get("k") == "v2"
    left = await cache.ttl("k")
    assert left is not None and 4.5 < left <= 5.1
    assert await cache.exists("k")
    assert await cache.set_many({"a": 1, "b": 2}, ttl=10)
    assert await cache.get_many(["a", "b", "c"], default=0) == [1, 2, 0]
    assert not await cache.exists("c")  # the get elected this caller to load "c"...
    assert await cache.clear() == 4  # ...so its lease is an entry too, cleared with k, a, b


async def test_an_entry_whose_first_load_runs_does_not_exist_yet(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """While a missing entry's first load runs, its key holds the loader's mark (its
    lease): not a value to ``exists``, ``ttl`` or another caller."""
    cache = AsyncHerdCache(tenure_async_client, "marked", ttl=10)
    gate = GatedLoader("v")
    call = spawn(lambda: cache.fetch("k", gate))
    await until(lambda: _load_leased(tenure_async_client, cache, "k"), 5, "the load's mark")
    assert not await cache.exists("k")
    assert await cache.ttl("k") is None
    gate.opened = True
    assert await join(call) == "v"
    assert await cache.exists("k")
    left = await cache.ttl("k")
    assert left is not None and 69 < left <= 70  # freshness + herd_timeout


async def test_a_delete_during_a_first_load_keeps_its_value_out(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    """``delete`` while the first load runs (the data changed under it): that load's
    value goes to its callers but is not stored, and a caller waiting in another
    process is woken at once and loads again."""
    cache = AsyncHerdCache(tenure_async_client, "invalidated", ttl=10)
    other = AsyncHerdCache(other_client, "invalidated", ttl=10)
    gate = GatedLoader("read before the change")
    first = spawn(lambda: cache.fetch("k", gate))
    await until(lambda: _load_leased(tenure_async_client, cache, "k"), 5, "the load's mark")
    fresh = Loader("read after the change")
    waiting = spawn(lambda: other.fetch("k", fresh))

    async def other_waits() -> bool:
        return other.statistics().waits == 1

    await until(other_waits, 5, "the other process waiting")
    assert not await cache.delete("k")  # a mark, no value: the load is cut short all the same
    gate.opened = True
    assert await join(first) == "read before the change"
    started = time.monotonic()
    assert await join(waiting) == "read after the change"
    assert time.monotonic() - started < WAIT_RECHECK  # woken, not asking again at 1 s
    assert (cache.statistics().refused, fresh.calls) == (1, 1)
    assert await cache.fetch("k", Loader("unused")) == "read after the change"


@pytest.mark.topologies("standalone")  # one server's commandstats
async def test_a_first_read_is_one_plain_command_hit_or_miss(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """A cache whose reads mostly miss elects its loader in its first read (SET NX
    GET: a miss is two round trips); once they mostly hit, a hit is one GET."""
    cache = AsyncHerdCache(tenure_async_client, "paths", ttl=60)

    async def commands() -> dict[str, int]:
        stats: Any = await tenure_async_client.info("commandstats")
        return {name: int(entry["calls"]) for name, entry in stats.items()}

    before = await commands()
    for index in range(50):
        assert await cache.fetch(f"k{index}", Loader(index)) == index
    after = await commands()
    sent = {name: after[name] - before.get(name, 0) for name in after}
    assert sent["cmdstat_set"] >= 50  # the 50 marks (and the scripts' SETs)
    assert sent["cmdstat_evalsha"] + sent.get("cmdstat_eval", 0) <= 52  # commits only
    for _ in range(200):
        assert await cache.fetch("k0", Loader("unused")) == 0
    before = await commands()
    for _ in range(100):
        assert await cache.fetch("k0", Loader("unused")) == 0
    after = await commands()
    assert after["cmdstat_get"] - before["cmdstat_get"] == 100
    assert after.get("cmdstat_set", 0) == before.get("cmdstat_set", 0)
    # A miss of a hot cache still elects exactly one loader (the script decides).
    loader = Loader("late", seconds=0.1)
    assert await gather(*(lambda: cache.fetch("late", loader) for _ in range(5))) == ["late"] * 5
    assert loader.calls == 1


async def test_herd_cache_on_a_cluster(
    tenure_async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    cache = AsyncHerdCache(tenure_async_cluster_client, "spread", ttl=10)
    loader = Loader("v", seconds=0.1)
    for index in range(30):
        assert await cache.fetch(f"k{index}", loader) == "v"
    assert loader.calls == 30
    plain = AsyncCache(tenure_async_cluster_client, "spread-plain")
    assert await plain.set_many({f"k{i}": i for i in range(30)})
    assert await plain.get_many([f"k{i}" for i in range(30)]) == list(range(30))
    assert await cache.clear() == 30
    assert await plain.clear() == 30


async def test_early_refresh_renews_a_hot_entry_before_it_goes_stale(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    eager = AsyncHerdCache(tenure_async_client, "eager", ttl=30, early=1e9)
    loader = Loader("v", seconds=0.05)
    assert await eager.fetch("k", loader) == "v"
    # 50 ms loads x beta 1e9: due for early refresh unless -ln(u) < 6e-7 (p ~ 6e-7)
    assert await eager.fetch("k", loader) == "v"  # served at once, refreshed in the background

    async def refreshed() -> bool:
        return loader.calls == 2

    await until(refreshed, 5, "the background refresh")
    assert eager.statistics().refreshes == 1
    calm = AsyncHerdCache(tenure_async_client, "calm", ttl=30)  # early=0: never early
    other = Loader("v", seconds=0.05)
    for _ in range(3):
        assert await calm.fetch("k", other) == "v"
    await sleep(0.1)  # a window in which no background refresh may start
    assert other.calls == 1


async def test_a_lost_wake_up_costs_a_waiter_at_most_a_recheck(
    no_channels_client: redis.asyncio.Redis, tenure_async_client: redis.asyncio.Redis
) -> None:
    # The loader's client may not PUBLISH (an ACL without channels): its commit
    # stores the value, but nobody hears of it. The waiter asks again within
    # WAIT_RECHECK (1 s), long before the loader's 5 s lease would run out.
    loading = AsyncHerdCache(no_channels_client, "muted", ttl=60)
    waiting = AsyncHerdCache(tenure_async_client, "muted", ttl=60)
    gate = GatedLoader("value")
    load = spawn(lambda: loading.fetch("k", gate))
    await until(lambda: _load_leased(tenure_async_client, waiting, "k"), 5, "the load's lease")

    async def wait() -> tuple[Any, float]:
        value = await waiting.fetch("k", Loader("never"))
        return value, time.monotonic()

    waiter = spawn(wait)
    await until(lambda: subscribed(tenure_async_client), 5, "the waiter listening")
    gate.opened = True  # the load returns; its commit's PUBLISH is refused
    assert await join(load) == "value"
    stored = time.monotonic()
    value, got = await join(waiter)
    assert value == "value"
    assert got - stored < WAIT_RECHECK + 1.0  # a re-check, not the lease's end (5 s)
    assert waiting.statistics().waits == 1


async def _stale(client: redis.asyncio.Redis, cache: AsyncHerdCache, key: str) -> bool:
    """Whether ``key``'s entry is past its freshness on the server's clock.

    A herd entry's stored value opens with ``h<fresh until, ms>:`` (``lua/lib/cache.lua``).
    """
    value = cast("bytes | None", await client.get(cache.key_of(key)))
    if value is None:
        return False
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000 > int(value[1:].split(b":")[0])


async def _lease_gone(client: redis.asyncio.Redis, cache: AsyncHerdCache, key: str) -> bool:
    return not await _load_leased(client, cache, key)


async def _load_leased(client: redis.asyncio.Redis, cache: AsyncHerdCache, key: str) -> bool:
    """Whether someone holds the load of ``key``'s entry: its load mark or refresh lease."""
    keys = CacheKeys.for_entry(cache.key_of(key))
    entry = await client.get(keys.entry)
    return (entry is not None and entry[:1] == b"l") or bool(await client.exists(keys.lease))
