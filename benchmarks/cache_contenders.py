"""The caches under test, each reduced to one cached call of one key.

A contender is made in the process (and, for asyncio ones, the event loop)
that uses it: ``make(url, fresh, loader)`` returns the cached call. The
loader is the benchmark's (it sleeps and counts its calls on the server);
each library wraps it its own way, with ``fresh`` seconds of freshness:

* tenure ``@cached(ttl=fresh)``, on threads and on asyncio;
* dogpile.cache's redis backend with ``distributed_lock=True``
  (``expiration_time=fresh``), on threads;
* cashews ``@cache(ttl=fresh, lock=True)`` and ``@cache.early(ttl=10*fresh,
  early_ttl=fresh)``, on asyncio;
* aiocache ``@cached_stampede(ttl=fresh, lease=2)``, on asyncio.

The peers are imported only when their contender is made, so a missing one
says what to install.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import redis
import redis.asyncio

import tenure
from benchmarks import require_peer

__all__ = ["CACHES", "VALUE", "CacheContender", "bare_async", "bare_sync", "by_key"]

VALUE = {"id": 7, "name": "Ada Lovelace", "roles": ["admin", "author"], "score": 98.5}
"""What every loader returns: a small JSON document, as a typical cached row."""

SyncLoader = Callable[[], Any]
AsyncLoader = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class CacheContender:
    """One cache library with its settings, as one row of the report."""

    key: str
    label: str
    is_async: bool
    make: Callable[[str, float, Any], Any]  # (url, fresh, loader) -> the cached call


def _tenure_sync(url: str, fresh: float, loader: SyncLoader) -> Callable[[], Any]:
    client = redis.Redis.from_url(url, max_connections=256)

    @tenure.cached(client, ttl=fresh, name="bench")
    def call(key: str) -> Any:
        return loader()

    return lambda: call("k")


def _tenure_async(url: str, fresh: float, loader: AsyncLoader) -> Callable[[], Awaitable[Any]]:
    client = redis.asyncio.Redis.from_url(url)

    @tenure.cached(client, ttl=fresh, name="bench")
    async def call(key: str) -> Any:
        return await loader()

    return lambda: call("k")


def _dogpile(url: str, fresh: float, loader: SyncLoader) -> Callable[[], Any]:
    dogpile = require_peer("dogpile.cache", "dogpile.cache")
    region = dogpile.make_region().configure(
        "dogpile.cache.redis",
        expiration_time=fresh,
        arguments={
            "url": url,
            "distributed_lock": True,
            "thread_local_lock": False,  # the lock is taken and released by different threads
            "lock_timeout": 10,
            "redis_expiration_time": int(fresh * 10) + 1,
        },
    )
    return lambda: region.get_or_create("bench:k", loader)


def _cashews(early: bool) -> Callable[[str, float, AsyncLoader], Callable[[], Awaitable[Any]]]:
    def make(url: str, fresh: float, loader: AsyncLoader) -> Callable[[], Awaitable[Any]]:
        cashews = require_peer("cashews", "cashews")
        cache = cashews.Cache()
        cache.setup(url)
        if early:
            decorate = cache.early(ttl=fresh * 10, early_ttl=fresh, key="bench:{key}")
        else:
            decorate = cache(ttl=fresh, lock=True, key="bench:{key}")

        @decorate  # type: ignore[untyped-decorator]
        async def call(key: str) -> Any:
            return await loader()

        return lambda: call("k")

    return make


def _aiocache(url: str, fresh: float, loader: AsyncLoader) -> Callable[[], Awaitable[Any]]:
    aiocache = require_peer("aiocache", "aiocache")
    where = urlparse(url)

    @aiocache.cached_stampede(  # type: ignore[untyped-decorator]
        lease=2,
        ttl=fresh,
        cache=aiocache.Cache.REDIS,
        endpoint=where.hostname or "127.0.0.1",
        port=where.port or 6379,
        namespace="bench",
    )
    async def call(key: str) -> Any:
        return await loader()

    return lambda: call("k")


CACHES: tuple[CacheContender, ...] = (
    CacheContender("tenure-async", "tenure `@cached` (asyncio)", True, _tenure_async),
    CacheContender("tenure-threads", "tenure `@cached` (threads)", False, _tenure_sync),
    CacheContender("dogpile", "dogpile.cache (redis, distributed_lock)", False, _dogpile),
    CacheContender("cashews-lock", "cashews `lock=True`", True, _cashews(early=False)),
    CacheContender("cashews-early", "cashews `early`", True, _cashews(early=True)),
    CacheContender("aiocache", "aiocache `cached_stampede`", True, _aiocache),
)


def by_key(key: str) -> CacheContender:
    """The contender named ``key``."""
    for contender in CACHES:
        if contender.key == key:
            return contender
    raise KeyError(key)


def bare_sync(url: str) -> Callable[[], Any]:
    """The floor: one GET and ``json.loads``, no cache library."""
    client = redis.Redis.from_url(url)
    client.set("bench:bare", json.dumps(VALUE))
    return lambda: json.loads(client.get("bench:bare") or b"null")


async def bare_async(url: str) -> Callable[[], Awaitable[Any]]:
    """The floor on asyncio: one awaited GET and ``json.loads``."""
    client = redis.asyncio.Redis.from_url(url)
    await client.set("bench:bare", json.dumps(VALUE))

    async def call() -> Any:
        return json.loads(await client.get("bench:bare") or b"null")

    return call
