"""The herd cache's loads: who loads an entry, and how the others wait or are served.

A fetch's first read (:meth:`~tenure._async._cache_scripts.AsyncHerdScripts.first_read`,
one plain command) serves a surely fresh entry, and elects its caller to
load a missing one. ``cache_fetch`` answers each fetch it could not:

* fresh: the value;
* stale: the value, and to exactly one caller a refresh lease (a token with
  a short expiry): that caller refreshes it in the background while everyone
  else keeps being served the stale value;
* missing: the lease to one caller, who runs the loader; the others wait to
  be woken (on tenure's one wake-up connection per process,
  :mod:`tenure._async._wakeups`) when the value lands; a waiter asks again
  after at most ``WAIT_RECHECK`` (1 s), so a wake-up lost on the way costs
  no more than that.

A long load renews its lease in the background (the watchdog); a loader
that fails, or a value the server does not store, gives the lease back at
once, for the next caller's loader to run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tenure._async._cache_fallback import AsyncCacheFallback, call_loader
from tenure._async._cache_scripts import MISS, AsyncHerdScripts, Elected
from tenure._async._cache_store import AsyncCacheStore
from tenure._async._scripting import AsyncClient
from tenure._async._wakeups import listen
from tenure._async._watchdog import watchdog
from tenure._backends.for_asyncio import Mutex, is_cancellation, start_background
from tenure._backends.owners import new_token
from tenure._backends.telemetry import metrics
from tenure._backends.tracing import span
from tenure._core.cache import (
    UNREACHABLE,
    WAIT_RECHECK,
    CacheCounters,
    CacheKeys,
    Status,
    early_factor,
    unwrap_loaded,
)
from tenure._core.codec import Codec
from tenure._core.exceptions import CacheDecodeError
from tenure._core.telemetry import CACHE_LOAD_SPAN

__all__ = ["AsyncHerdLoading"]

logger = logging.getLogger("tenure.cache")


class _Background:
    """A background refresh, kept alive by the cache until it ends."""

    __slots__ = ("handle",)

    def __init__(self) -> None:
        self.handle: Any = None


class AsyncHerdLoading:
    """One herd cache's fetches past this process's sharing: served, waited for, or loaded."""

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        scripts: AsyncHerdScripts,
        store: AsyncCacheStore,
        fallback: AsyncCacheFallback,
        codec: Codec,
        counters: CacheCounters,
        early: float,
    ) -> None:
        self._client = client
        self._name = name
        self._scripts = scripts
        self._store = store
        self._fallback = fallback
        self._codec = codec
        self._counters = counters
        self.early = early
        self._mutex = Mutex()
        self._background: set[_Background] = set()  # refreshes in flight, strongly referenced

    async def fetched(
        self, stored: str, loader: Callable[[], Any], ttl: float | None, herd: float | None
    ) -> Any:
        """The entry's value: from the server (the first read, else the script), or the loader."""
        if self._counters.outage is not None:  # (a call less on every hit)
            self._counters.recovered()
        try:
            value = await self._scripts.first_read(stored, self.early)
        except UNREACHABLE as exc:
            if not self._fallback.enabled:
                raise
            return await self._fallback.fall_back(loader, self._fallback.unreachable(exc), stored)
        if type(value) is Elected:
            self._fallback.reached()
            self._counters.add("misses")
            self._counters.add("loads")
            return await self._load(CacheKeys.for_entry(stored), value.token, loader, ttl, herd)
        if value is MISS:
            value = await self._fetch_or_load(stored, new_token(), loader, ttl, herd)
        return value

    async def _fetch_or_load(
        self,
        stored: str,
        token: str,
        loader: Callable[[], Any],
        ttl: float | None,
        herd: float | None,
    ) -> Any:
        keys = CacheKeys.for_entry(stored)
        scripts = self._scripts
        try:
            fetched = await scripts.fetch(keys, token, "", early_factor(self.early))
            waiter = None
            waited = fetched.status == Status.WAIT  # (the request's result, told once)
            if waited:
                self._counters.add("waits")
            try:
                while fetched.status == Status.WAIT:
                    if waiter is None:  # listen first, then ask again with the channel
                        waiter = await listen(
                            self._client, token, fetched.ms / 1000 + 0.1, keys.entry
                        )
                        fetched = await scripts.fetch(keys, token, waiter.channel, 0.0)
                        continue
                    # woken when the value lands; asks again at least every WAIT_RECHECK
                    await waiter.wait(min(fetched.ms / 1000 + 0.05, WAIT_RECHECK))
                    fetched = await scripts.fetch(keys, token, waiter.channel, 0.0)
            finally:
                if waiter is not None:
                    waiter.stop()
        except UNREACHABLE as exc:
            if not self._fallback.enabled:
                raise
            return await self._fallback.fall_back(loader, self._fallback.unreachable(exc), stored)
        self._fallback.reached()
        if fetched.status in (Status.FRESH, Status.STALE, Status.REFRESH):
            try:
                value = self._store.decode(fetched.value or b"", stored)
            except CacheDecodeError:
                if fetched.status == Status.REFRESH:
                    await scripts.give_back(keys, token)
                self._counters.add("misses", tell=not waited)
                # not written back: another writer's format
                return unwrap_loaded(await call_loader(loader, stored), None)[0]
            if fetched.status == Status.FRESH:
                self._counters.add("hits", tell=not waited)
            else:
                self._counters.add("stale_hits", tell=not waited)
            if fetched.status == Status.REFRESH:
                self._refresh_in_background(keys, token, loader, ttl, herd)
            return value
        self._counters.add("misses", tell=not waited)
        self._counters.add("loads")
        return await self._load(keys, token, loader, ttl, herd)

    async def _load(
        self,
        keys: CacheKeys,
        token: str,
        loader: Callable[[], Any],
        ttl: float | None,
        herd: float | None,
    ) -> Any:
        renewal = self._scripts.renew_while_loading(keys, token)
        started = time.monotonic()
        try:
            with span(CACHE_LOAD_SPAN, self._counters.subject, current=True):
                value, ttl = unwrap_loaded(await call_loader(loader, keys.entry), ttl)
                # A value the serializer refuses fails like its loader: the lease
                # is given back at once, for the next caller's loader to run.
                data = self._codec.encode(value)
        except BaseException as exc:
            watchdog().cancel(renewal)
            await self._scripts.give_back(keys, token)
            if not is_cancellation(exc) and (recorder := metrics()) is not None:
                recorder.cache_load_error(self._counters.subject)
            raise
        watchdog().cancel(renewal)
        took = time.monotonic() - started
        if (recorder := metrics()) is not None:
            recorder.cache_load(self._counters.subject, took)
        try:
            await self._scripts.commit(keys, token, data, took, ttl, herd)
        except BaseException as exc:
            # Not stored (the server full, a value refused, ...): the lease goes
            # back, so the next caller, in any process, loads at once.
            await self._scripts.give_back_after(exc, keys, token)
            if not isinstance(exc, UNREACHABLE):
                raise
            logger.warning("tenure cache %r: the loaded value was not stored: %s", self._name, exc)
        return value

    def _refresh_in_background(
        self,
        keys: CacheKeys,
        token: str,
        loader: Callable[[], Any],
        ttl: float | None,
        herd: float | None,
    ) -> None:
        self._counters.add("refreshes")

        job = _Background()

        async def refresh() -> None:
            try:
                await self._load(keys, token, loader, ttl, herd)
            except Exception as exc:
                logger.warning(
                    "tenure cache %r: refreshing %s failed: %r", self._name, keys.entry, exc
                )
            finally:
                with self._mutex:
                    self._background.discard(job)

        with self._mutex:
            self._background.add(job)  # before it starts: it may end at once
        job.handle = start_background(refresh, "tenure-cache-refresh")
