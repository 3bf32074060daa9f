"""Every duration argument is refused as a lock refuses its own: one bound, one text.

A cache (its ``ttl``, ``herd_timeout`` and ``load_lease``, at construction
and in each call that takes one), ``@cached``, a stream consumer
and a cluster lock's ``replica_timeout`` go through the one checker,
``check_seconds``: a value that is not a number of seconds from 0 to ten years
raises the :class:`ArgumentError` a :class:`AsyncLock` raises for its
``waiter_lease``, with the argument's own name (a negative value is told the
argument's own bound: ``> 0`` where 0 is refused too, else ``>= 0``), before anything reaches the
server (a loader is not run, nothing is written). An id set takes no duration;
``early`` is a factor, not a duration: checked by the same function, unbounded.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from tenure import (
    ArgumentError,
    AsyncCache,
    AsyncClusterLock,
    AsyncHerdCache,
    AsyncLock,
    AsyncStreamConsumer,
    cached,
)

REFUSED = [
    pytest.param(sys.maxsize, id="maxsize"),
    pytest.param(1e16, id="1e16"),
    pytest.param(math.inf, id="inf"),
    pytest.param(math.nan, id="nan"),
    pytest.param(-1, id="negative"),
    pytest.param("5", id="str"),
    pytest.param(True, id="bool"),
]

Use = Callable[[redis.asyncio.Redis, Any], Awaitable[Any]]


class _Loader:
    """A loader that must not run: the call is refused before it would."""

    calls = 0

    async def __call__(self) -> str:
        _Loader.calls += 1
        return "loaded"


async def _cache(client: redis.asyncio.Redis, value: Any) -> Any:
    return AsyncCache(client, "durations", ttl=value)


async def _cache_set(client: redis.asyncio.Redis, value: Any) -> Any:
    return await AsyncCache(client, "durations").set("k", 1, ttl=value)


async def _cache_set_many(client: redis.asyncio.Redis, value: Any) -> Any:
    return await AsyncCache(client, "durations").set_many({"k": 1}, ttl=value)


async def _herd(client: redis.asyncio.Redis, value: Any) -> Any:
    return AsyncHerdCache(client, "durations", ttl=value)


async def _herd_timeout(client: redis.asyncio.Redis, value: Any) -> Any:
    return AsyncHerdCache(client, "durations", herd_timeout=value)


async def _herd_load_lease(client: redis.asyncio.Redis, value: Any) -> Any:
    return AsyncHerdCache(client, "durations", load_lease=value)


async def _herd_set(client: redis.asyncio.Redis, value: Any) -> Any:
    return await AsyncHerdCache(client, "durations").set("k", 1, ttl=value)


async def _herd_set_herd_timeout(client: redis.asyncio.Redis, value: Any) -> Any:
    return await AsyncHerdCache(client, "durations").set("k", 1, herd_timeout=value)


async def _herd_set_many(client: redis.asyncio.Redis, value: Any) -> Any:
    return await AsyncHerdCache(client, "durations").set_many({"k": 1}, ttl=value)


async def _herd_fetch(client: redis.asyncio.Redis, value: Any) -> Any:
    return await AsyncHerdCache(client, "durations").fetch("k", _Loader(), ttl=value)


async def _herd_fetch_herd_timeout(client: redis.asyncio.Redis, value: Any) -> Any:
    cache = AsyncHerdCache(client, "durations")
    return await cache.fetch("k", _Loader(), herd_timeout=value)


def _decorated(argument: str) -> Use:
    async def use(client: redis.asyncio.Redis, value: Any) -> Any:
        options: dict[str, Any] = {"ttl": 60, argument: value}
        return cached(client, **options)

    return use


async def _consumer_block(client: redis.asyncio.Redis, value: Any) -> Any:
    return AsyncStreamConsumer(client, "durations", "g", block=value)


async def _consumer_claim_idle(client: redis.asyncio.Redis, value: Any) -> Any:
    return AsyncStreamConsumer(client, "durations", "g", claim_idle=value)


async def _cluster_lock(client: redis.asyncio.Redis, value: Any) -> Any:
    return AsyncClusterLock(client, "durations", replica_timeout=value)


USES = [
    pytest.param("ttl", _cache, id="Cache(ttl)"),
    pytest.param("ttl", _cache_set, id="Cache.set(ttl)"),
    pytest.param("ttl", _cache_set_many, id="Cache.set_many(ttl)"),
    pytest.param("ttl", _herd, id="HerdCache(ttl)"),
    pytest.param("herd_timeout", _herd_timeout, id="HerdCache(herd_timeout)"),
    pytest.param("load_lease", _herd_load_lease, id="HerdCache(load_lease)"),
    pytest.param("ttl", _herd_set, id="HerdCache.set(ttl)"),
    pytest.param("herd_timeout", _herd_set_herd_timeout, id="HerdCache.set(herd_timeout)"),
    pytest.param("ttl", _herd_set_many, id="HerdCache.set_many(ttl)"),
    pytest.param("ttl", _herd_fetch, id="HerdCache.fetch(ttl)"),
    pytest.param("herd_timeout", _herd_fetch_herd_timeout, id="HerdCache.fetch(herd_timeout)"),
    *(
        pytest.param(argument, _decorated(argument), id=f"cached({argument})")
        for argument in ("ttl", "herd_timeout", "load_lease", "error_ttl")
    ),
    pytest.param("block", _consumer_block, id="StreamConsumer(block)"),
    pytest.param("claim_idle", _consumer_claim_idle, id="StreamConsumer(claim_idle)"),
    pytest.param("replica_timeout", _cluster_lock, id="ClusterLock(replica_timeout)"),
]


def _as_a_lock_says(client: redis.asyncio.Redis, argument: str, value: Any) -> str:
    """What a lock says of ``value`` as its ``waiter_lease``, said of ``argument``."""
    with pytest.raises(ArgumentError) as refused:
        AsyncLock(client, "durations", waiter_lease=value)
    said = str(refused.value.message)
    assert said.startswith("waiter_lease: ")
    return argument + said.removeprefix("waiter_lease")


@pytest.mark.parametrize("value", REFUSED)
@pytest.mark.parametrize(("argument", "use"), USES)
async def test_every_duration_is_refused_as_a_lock_refuses_it(
    tenure_async_client: redis.asyncio.Redis, argument: str, use: Use, value: Any
) -> None:
    negative = type(value) is int and value < 0
    expected = "" if negative else _as_a_lock_says(tenure_async_client, argument, value)
    before = _Loader.calls
    with pytest.raises(ArgumentError) as refused:
        await use(tenure_async_client, value)
    assert refused.value.argument == argument
    if negative:  # the argument's own bound (0 refused or not), not waiter_lease's 0.2 s
        bound = r"must be >=? 0 seconds, got -1"
        assert re.fullmatch(f"{re.escape(argument)}: {bound}", str(refused.value.message))
    else:
        assert refused.value.message == expected
    assert _Loader.calls == before  # refused before any loading
    assert await tenure_async_client.dbsize() == 0  # and before any write


async def test_the_longest_duration_is_ten_years_everywhere(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """Ten years is accepted where the locks accept it; a second more is not."""
    ten_years = 10 * 365 * 86400
    cache = AsyncHerdCache(
        tenure_async_client, "longest", ttl=ten_years, herd_timeout=ten_years, load_lease=ten_years
    )
    assert await cache.fetch("k", _Loader()) == "loaded"
    assert await cache.ttl("k") == pytest.approx(2 * ten_years, rel=1e-6)
    assert await AsyncCache(tenure_async_client, "longest").set("k", 1, ttl=ten_years)
    AsyncStreamConsumer(tenure_async_client, "longest", "g", block=ten_years, claim_idle=ten_years)
    for use in (_herd, _cache_set, _consumer_claim_idle):
        with pytest.raises(ArgumentError, match=r"at most 315360000 seconds \(ten years\)"):
            await use(tenure_async_client, ten_years + 1)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"timeout": -1}, "timeout: must be > 0 seconds, got -1"),
        ({"timeout": 0}, "timeout: must be > 0 seconds, got 0"),
        ({"max_hold": -2.5}, "max_hold: must be > 0 seconds, got -2.5"),
        ({"waiter_lease": -1}, "waiter_lease: must be at least 0.2 seconds, got -1"),
        ({"waiter_lease": 0.1}, "waiter_lease: must be at least 0.2 seconds, got 0.1"),
        ({"handoff_lease": 0}, "handoff_lease: must be at least 0.05 seconds, got 0"),
        ({"blocking_timeout": -1}, "blocking_timeout: must be >= 0 seconds, got -1"),
    ],
)
def test_a_value_below_the_bound_is_told_the_bound_it_missed(
    tenure_async_client: redis.asyncio.Redis, given: dict[str, float], said: str
) -> None:
    """A negative lease is not told ">= 0" where 0 is refused too, nor where 0.2 s is the least."""
    with pytest.raises(ArgumentError) as refused:
        AsyncLock(tenure_async_client, "bounds", **given)  # type: ignore[arg-type]
    assert refused.value.message == said
