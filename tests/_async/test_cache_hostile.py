"""Caches under hostile input: the right answer or one clear typed error, at once.

Each case is a value or a use a careless or unlucky user tries; what it gets
is documented in docs/caches.md ("What bad input gets"). New findings land here.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio

from tenure import ArgumentError, AsyncCache, AsyncHerdCache, CacheReentryError, cached

REFUSED_BY_JSON = [
    pytest.param({1: "a"}, r"value has the key 1 \(int\).*come back as \"1\"", id="int-key"),
    pytest.param({True: 1}, r"value has the key True \(bool\).*\"true\"", id="bool-key"),
    pytest.param({1: "a", "1": "b"}, r"value has the key 1 \(int\)", id="colliding-keys"),
    pytest.param((1, 2), r"value is a tuple: JSON would bring it back as a list", id="tuple"),
    pytest.param({"a": [1, (2, 3)]}, r"value\['a'\]\[1\] is a tuple", id="nested-tuple"),
    pytest.param({"s": {1, 2}}, r"value\['s'\] is of type set", id="set"),
    pytest.param([b"raw"], r"value\[0\] is of type bytes", id="bytes"),
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
    for value in ({"1": "a"}, [1, 2.5, "x", None, True, {"k": [{}]}], float("inf"), -0.0):
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
