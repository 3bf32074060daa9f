"""Caches under hostile input: the right answer or one clear typed error, at once.

Each case is a value or a use a careless or unlucky user tries; what it gets
is documented in docs/caches.md ("What bad input gets"). New findings land here.
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tenure import (
    ArgumentError,
    AsyncCache,
    AsyncHerdCache,
    BackendError,
    CacheReentryError,
    ServerUnavailableError,
    cached,
)
from tenure.testing import ProxyFactory, ServerFactory
from tests._backend_asyncio import sleep, until


class _Text(str):
    """A str subclass: JSON brings it back as a plain str."""


class _Level(enum.IntEnum):
    HIGH = 3


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


_CIRCULAR: list[Any] = [1, []]
_CIRCULAR[1].append(_CIRCULAR[1])
_DEEP = _nested(600)

REFUSED_BY_JSON = [
    pytest.param({1: "a"}, r"value has the key 1 \(int\).*come back as \"1\"", id="int-key"),
    pytest.param({True: 1}, r"value has the key True \(bool\).*\"true\"", id="bool-key"),
    pytest.param({1: "a", "1": "b"}, r"value has the key 1 \(int\)", id="colliding-keys"),
    pytest.param((1, 2), r"value is a tuple: JSON would bring it back as a list", id="tuple"),
    pytest.param({"a": [1, (2, 3)]}, r"value\['a'\]\[1\] is a tuple", id="nested-tuple"),
    pytest.param({"s": {1, 2}}, r"value\['s'\] is of type set", id="set"),
    pytest.param([b"raw"], r"value\[0\] is of type bytes", id="bytes"),
    # Subclasses would come back as their base type.
    pytest.param({"k": _Text("x")}, r"value\['k'\] is of type _Text.*back as str", id="str-sub"),
    pytest.param([_Level.HIGH], r"value\[0\] is of type _Level.*back as int", id="int-enum"),
    pytest.param(OrderedDict(a=1), r"value is of type OrderedDict.*back as dict", id="ordered"),
    pytest.param(_CIRCULAR, r"value\[1\] contains itself", id="circular"),
    pytest.param(_DEEP, r"nested 500 lists or dicts deep", id="too-deep"),
    pytest.param(["\udcff"], r"value\[0\] is a string with a lone surrogate", id="surrogate"),
    pytest.param({"n": 10**5000}, r"value\['n'\] is an int of \d+ bits", id="huge-int"),
]


@pytest.mark.parametrize(("value", "message"), REFUSED_BY_JSON)
async def test_json_refuses_what_it_would_not_bring_back_exactly(
    tenure_async_client: redis.asyncio.Redis, value: Any, message: str
) -> None:
    cache = AsyncCache(tenure_async_client, "json-strict")
    with pytest.raises(ArgumentError, match=message):
        await cache.set("k", value)
    assert await cache.get("k") is None  # nothing written


async def test_json_keeps_what_it_brings_back_exactly(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    cache = AsyncCache(tenure_async_client, "json-exact")
    for value in (
        {"1": "a"},
        [1, 2.5, "x", None, True, {"k": [{}]}],
        float("inf"),
        -0.0,
        _nested(500),
        "é\u2603",
    ):
        await cache.set("k", value)
        assert await cache.get("k") == value


async def test_an_unstorable_loaded_value_frees_the_entry_at_once(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    """The loader returns a set (JSON cannot store it): its caller gets the
    error, and the next caller's loader runs at once (no wait for the load lease)."""
    cache = AsyncHerdCache(tenure_async_client, "unstorable", ttl=10, load_lease=5)
    other = AsyncHerdCache(other_client, "unstorable", ttl=10, load_lease=5)

    async def a_set() -> Any:
        return {1, 2}

    async def a_list() -> Any:
        return [1, 2]

    for _ in range(2):  # the first call, and every later one, fails at once
        started = time.monotonic()
        with pytest.raises(ArgumentError, match="value is of type set"):
            await cache.fetch("k", a_set)
        assert time.monotonic() - started < 1.0
    started = time.monotonic()
    assert await other.fetch("k", a_list) == [1, 2]
    assert time.monotonic() - started < 1.0  # not the 5 s load lease


@pytest.mark.parametrize("name", ["users:{eu", "a}b", "", "{x}"])
async def test_cache_names_follow_the_lock_rules(
    tenure_async_client: redis.asyncio.Redis, name: str
) -> None:
    with pytest.raises(ArgumentError, match="name"):
        AsyncCache(tenure_async_client, name)


async def test_names_keys_and_prefixes_the_server_cannot_hold_are_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    with pytest.raises(ArgumentError, match="name: must be UTF-8 text"):
        AsyncCache(tenure_async_client, "users\udcff")
    with pytest.raises(ArgumentError, match="prefix: must not contain"):
        AsyncCache(tenure_async_client, "users", prefix="app:{eu}:")
    cache = AsyncHerdCache(tenure_async_client, "users")
    with pytest.raises(ArgumentError, match="key: must be UTF-8 text"):
        await cache.set("k\udcff", 1)
    with pytest.raises(ArgumentError, match="key: must not be empty"):
        await cache.fetch("", _one)  # no hash tag: a cluster would split the entry's keys
    assert await cache.fetch("", _one, param={"page": 1}) == 1  # a param names it


async def _one() -> int:
    return 1


async def test_clear_never_touches_another_caches_keys(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    users, nested, longer = (
        AsyncCache(tenure_async_client, name) for name in ("users", "users:eu", "users2")
    )
    for cache in (users, nested, longer):
        await cache.set("k", cache.name)
    assert await users.clear() == 1
    assert await nested.get("k") == "users:eu" and await longer.get("k") == "users2"


async def test_closures_of_one_factory_cache_apart(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """make_scaler(3) and make_scaler(5) share a qualified name (one cache): the
    plain values they captured name their entries too."""
    loads: list[int] = []

    def make_scaler(factor: int) -> Any:
        @cached(tenure_async_client, ttl=30)
        async def scale(x: int) -> int:
            loads.append(factor)  # an object captured: context, not part of the name
            return x * factor

        return scale

    assert await make_scaler(3)(2) == 6
    assert await make_scaler(5)(2) == 10
    assert await make_scaler(3)(2) == 6  # the first one's entry
    assert loads == [3, 5]


async def test_two_functions_of_one_name_are_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """Two functions with one qualified name (two lambdas of a scope, a
    function defined again with another body) would share entries: the
    second is refused unless named; the same code again is the same function."""

    def define(double: bool) -> Any:
        if double:

            async def twin(x: int) -> int:
                return x * 2

        else:

            async def twin(x: int) -> int:
                return x + 100

        return twin

    doubled = cached(tenure_async_client, ttl=30)(define(True))
    assert await doubled(4) == 8
    assert await cached(tenure_async_client, ttl=30)(define(True))(4) == 8  # the same code
    with pytest.raises(ArgumentError, match="another function is cached as .*twin"):
        cached(tenure_async_client, ttl=30)(define(False))
    named = cached(tenure_async_client, ttl=30, name="twin-plus-100")(define(False))
    assert await named(4) == 104
    with pytest.raises(ArgumentError, match="needs name= for a partial"):
        cached(tenure_async_client, ttl=30)(functools.partial(define(True), 1))


async def test_a_loader_asking_for_its_own_entry_fails_at_once(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """Directly, or through another function: it would wait on its own load."""

    @cached(tenure_async_client, ttl=30)
    async def factorial(n: int) -> int:  # other arguments: fine
        return 1 if n <= 1 else n * await factorial(n - 1)

    @cached(tenure_async_client, ttl=30)
    async def ping(n: int) -> int:
        return await pong(n)

    @cached(tenure_async_client, ttl=30)
    async def pong(n: int) -> int:
        return await ping(n)

    assert await factorial(6) == 720
    for _ in range(2):  # the lease was given back: the second call fails at once too
        started = time.monotonic()
        with pytest.raises(CacheReentryError, match="asked for that same entry"):
            await ping(1)
        assert time.monotonic() - started < 1.0


def _outage_records(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    """How many outages started, and ended, in tenure.cache's log."""
    messages = [r.getMessage() for r in caplog.records if r.name == "tenure.cache"]
    return (
        sum("is out of reach" in m for m in messages),
        sum("answers again," in m for m in messages),
    )


async def _until_the_cache_answers(cache: AsyncHerdCache, seconds: float) -> float:
    """Fetch one entry twice until the second comes from the cache; when it did."""
    counter = iter(range(1_000_000))

    async def load() -> int:
        return next(counter)

    async def answers() -> bool:
        return bool(await cache.fetch("probe", load) == await cache.fetch("probe", load))

    await until(answers, seconds, "the cache being used again")
    return time.monotonic()


@pytest.mark.parametrize("fault", ["killed", "blackholed"])
async def test_an_outage_costs_one_call_then_fetches_go_straight_to_the_loader(
    tenure_server_factory: ServerFactory,
    tenure_proxy_factory: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    """The server dies (or a partition cuts it off): the first fetch spends the
    client's retries (redis-py's default Retry, or many) and computes without the cache;
    every later fetch of every cache of that client goes straight to its loader,
    until a probe finds the server again. Logged once each way, and counted."""
    caplog.set_level(logging.WARNING, logger="tenure.cache")
    server = tenure_server_factory()
    proxy = tenure_proxy_factory(server)
    if fault == "killed":  # redis-py's default Retry
        client = proxy.async_client(socket_timeout=0.5, socket_connect_timeout=0.5)
    else:
        # A partition leaves connections open: without a socket timeout, a
        # redis-py client waits for ever (its default), which no cache can help.
        # Many retries: however many, only the first fetch spends them.
        retry = Retry(ExponentialBackoff(cap=0.05, base=0.01), 12)
        client = proxy.async_client(socket_timeout=0.1, socket_connect_timeout=0.1, retry=retry)
    try:
        cache = AsyncHerdCache(client, "outage", ttl=60)
        other = AsyncHerdCache(client, "outage-other", ttl=60)  # same client, same outage
        loads: list[str] = []

        async def load(key: str) -> str:
            loads.append(key)
            return key.upper()

        assert await cache.fetch("a", lambda: load("a")) == "A"
        if fault == "killed":
            server.kill()
        else:
            proxy.blackhole()
        assert await cache.fetch("a", lambda: load("a")) == "A"  # found out of reach: retried
        slowest = 0.0
        for key in ["a", "b", "c", "d"]:
            for each in (cache, other):
                started = time.monotonic()
                assert await each.fetch(key, functools.partial(load, key)) == key.upper()
                slowest = max(slowest, time.monotonic() - started)
        assert slowest <= 0.5, f"a fetch during the outage took {slowest:.2f} s"
        assert _outage_records(caplog) == (1, 0)
        mine, theirs = cache.statistics(), other.statistics()
        assert (mine.fallbacks, mine.outages, mine.recoveries) == (5, 1, 0)
        assert (theirs.fallbacks, theirs.outages, theirs.recoveries) == (4, 1, 0)

        async def a_tuple() -> Any:
            return (1, 2)

        with pytest.raises(ArgumentError, match="tuple"):  # refused as with the server up
            await cache.fetch("t", a_tuple)

        if fault == "killed":
            server.restart()
        else:
            proxy.clear()
        await _until_the_cache_answers(cache, 5.0)
        assert _outage_records(caplog) == (1, 1)
        assert cache.statistics().recoveries == 1
        assert await other.fetch("e", lambda: load("e")) == "E"
        assert other.statistics().recoveries == 1
    finally:
        proxy.clear()
        await client.aclose()


async def test_during_an_outage_get_and_set_raise_at_once(
    tenure_server_factory: ServerFactory,
) -> None:
    """Calls with no loader to fall back on (get, get_many, set) raise the typed error at
    once while an outage goes on, instead of spending the client's retries each time
    (redis-py's default Retry makes each take seconds); after the probe finds the server
    again, they ask it as before."""
    server = tenure_server_factory()
    client = server.async_client(socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        cache = AsyncHerdCache(client, "outage-get", ttl=60)
        await cache.set("k", 1)
        server.kill()
        with pytest.raises(ServerUnavailableError):
            await cache.get("k")  # finds the outage: the client's retries spent once
        calls: list[Callable[[], Any]] = [
            lambda: cache.get("k"),
            lambda: cache.get_many(["k", "j"]),
            lambda: cache.set("k", 2),
            lambda: cache.set_many({"k": 2}),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(ServerUnavailableError, match="out of reach") as raised:
                await call()
            assert time.monotonic() - started < 0.2
            assert isinstance(raised.value.__cause__, ServerUnavailableError)

        async def load() -> int:
            return 3

        assert await cache.fetch("k", load) == 3  # straight to the loader
        assert (cache.statistics().outages, cache.statistics().recoveries) == (1, 0)
        server.restart()

        async def answers() -> bool:
            try:
                return await cache.get("k") is None  # (the restarted server kept nothing)
            except ServerUnavailableError:
                return False

        await until(answers, 5, "get asking the server again")
        assert await cache.set("k", 4) and await cache.get("k") == 4
        assert (cache.statistics().outages, cache.statistics().recoveries) == (1, 1)
    finally:
        await client.aclose()


async def test_without_fallback_an_outage_is_the_callers_error(
    tenure_server_factory: ServerFactory,
) -> None:
    """``fallback=False``: every fetch asks the server and raises its typed error."""
    server = tenure_server_factory()
    client = server.async_client(retry=None)
    try:
        cache = AsyncHerdCache(client, "no-fallback", fallback=False)

        async def load() -> int:
            return 1

        assert await cache.fetch("k", load) == 1
        server.kill()
        for _ in range(2):
            with pytest.raises(ServerUnavailableError):
                await cache.fetch("k", load)
        assert cache.statistics().fallbacks == 0
    finally:
        await client.aclose()


async def test_a_value_tenure_did_not_write_is_a_miss_loaded_over(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """Another writer's value at an entry's key (one that looks like a load mark but
    never expires, or any other string) is a miss: loaded and replaced at once,
    never waited on or raised."""
    cache = AsyncHerdCache(tenure_async_client, "foreign", ttl=30)

    async def loaded() -> str:
        return "loaded"

    for planted in ("legacy value", "l" + "0" * 32, "hello world", "hxyz", "h12:x:"):
        key = f"k-{planted[:6]}"
        await tenure_async_client.set(cache.key_of(key), planted)  # no expiry
        started = time.monotonic()
        assert await cache.fetch(key, loaded) == "loaded", planted
        assert time.monotonic() - started < 1.0, planted
        assert await cache.fetch(key, loaded) == "loaded"  # stored as an entry now
        assert (await tenure_async_client.get(cache.key_of(key)) or b"")[:1] == b"h"
    assert cache.statistics().loads == 5


async def test_a_delete_during_a_refresh_keeps_the_refreshed_value_out(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """``delete`` (``@cached``'s ``invalidate``) while a stale entry refreshes in the
    background: the refresh read the data before the change, so its write-back is
    refused, and the next caller loads the new data."""
    cache = AsyncHerdCache(tenure_async_client, "refreshed", ttl=0.05, herd_timeout=30)

    async def old() -> str:
        return "old"

    assert await cache.fetch("k", old) == "old"
    await sleep(0.1)  # stale
    opened = False
    refreshes: list[str] = []

    async def is_open() -> bool:
        return opened

    async def refresh_before_the_change() -> str:
        refreshes.append("started")
        await until(is_open, 10, "the gate opening")
        return "read before the change"

    async def refreshing() -> bool:
        return bool(refreshes)

    assert await cache.fetch("k", refresh_before_the_change) == "old"  # stale, refreshing
    await until(refreshing, 5, "the background refresh starting")
    assert await cache.delete("k")  # the stale entry, and its refresh lease
    opened = True

    async def refused() -> bool:
        return cache.statistics().refused == 1

    await until(refused, 5, "the refresh's write-back refused")

    async def new() -> str:
        return "new"

    assert await cache.fetch("k", new) == "new"


async def test_a_commit_the_server_refuses_gives_the_load_lease_back(
    tenure_server_factory: ServerFactory,
) -> None:
    """The server fills up while a value loads (``maxmemory``, ``noeviction``): the
    write-back is refused and raised, and the load lease goes back with it, so the
    entry's next caller (another client: another process) loads at once instead of
    waiting out a 30 s lease. The same for a ``set`` after ``get`` handed a refresh."""
    server = tenure_server_factory()  # its own: its memory limit is changed
    client, admin = server.async_client(), server.async_client()
    try:
        await admin.config_set("maxmemory-policy", "noeviction")
        cache = AsyncHerdCache(client, "full", ttl=60, load_lease=30)
        other = AsyncHerdCache(admin, "full", ttl=60, load_lease=30)

        async def marked(key: str) -> bool:  # a missing entry's load mark: its lease
            return (await admin.getrange(cache.key_of(key), 0, 0)) == b"l"

        async def warm() -> str:
            return "warm"

        async def never() -> str:
            raise AssertionError("a warm entry was loaded again")

        assert await cache.fetch("w", warm) == "warm"

        async def load_as_memory_runs_out() -> str:
            assert await marked("k")  # this load's mark, 30 s long
            await admin.config_set("maxmemory", 1)  # full from here on: writes refused
            return "computed"

        with pytest.raises(BackendError, match="the server is out of memory .*maxmemory"):
            await cache.fetch("k", load_as_memory_runs_out)
        assert not await marked("k")  # given back
        # A hit is served all the same: the first read's SET is refused, a GET is not.
        for _ in range(3):
            assert await cache.fetch("w", never) == "warm"
        await admin.config_set("maxmemory", 0)

        async def second() -> str:
            return "second"

        assert await other.fetch("k", second) == "second"
        assert (other.statistics().loads, other.statistics().waits) == (1, 0)

        # get() hands this object the load of a missing entry; its set() is refused.
        assert await cache.get("g") is None
        assert await marked("g")
        await admin.config_set("maxmemory", 1)
        with pytest.raises(BackendError, match="the server is out of memory .*maxmemory"):
            await cache.set("g", "refreshed")
        await admin.config_set("maxmemory", 0)
        assert not await marked("g")
        assert await other.fetch("g", second) == "second"
        assert other.statistics().waits == 0
    finally:
        await admin.config_set("maxmemory", 0)
        await client.aclose()
        await admin.aclose()
