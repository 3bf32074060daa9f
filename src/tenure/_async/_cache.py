"""AsyncCache and AsyncHerdCache: values on the server, named by key and param.

:class:`AsyncCache` is aredis's ``Cache``: a value per entry, written with
an expiry (SET with PX) and read with GET, each stored value headed by its
format (:mod:`tenure._core.codec`).

:class:`AsyncHerdCache` keeps each entry for its freshness *plus*
``herd_timeout``, with the freshness deadline on the server's clock inside the
entry, and decides who loads in one script call (``cache_fetch``):

* fresh: the value;
* stale: the value, and to exactly one caller a refresh lease (a token with
  a short expiry); everyone else keeps being served the stale value;
* missing: the lease to one caller; the others wait to be woken (on tenure's
  one wake-up connection per process, :mod:`tenure._async._wakeups`) when
  the value lands; a waiter asks again after at most ``WAIT_RECHECK`` (1 s),
  so a wake-up lost on the way costs no more than that.

The write-back (``cache_commit``) is accepted only from the lease's current
holder, so a refresher whose lease ran out cannot overwrite newer data; a
long load renews its lease in the background (the watchdog). In one process,
callers of :meth:`AsyncHerdCache.fetch` for the same entry share one request
before anything goes to the server.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from redis import exceptions as redis_errors

from tenure._async._outage import AsyncOutage, outage_found, outage_of
from tenure._async._scripting import AsyncClient, registry_for
from tenure._async._wakeups import listen
from tenure._async._watchdog import Job, watchdog
from tenure._backends.for_asyncio import IS_ASYNC, Event, Mutex, scope_key, start_background
from tenure._core.cache import (
    WAIT_RECHECK,
    CacheKeys,
    CacheStatistics,
    Fetched,
    ServerClock,
    Status,
    early_factor,
    entry_key,
    new_counters,
    parse_fetch,
    split_entry,
    unwrap_loaded,
)
from tenure._core.clients import (
    map_exceptions,
    require_bytes_replies,
    require_client,
    translate_error,
)
from tenure._core.codec import (
    DEFAULT_COMPRESSOR,
    DEFAULT_SERIALIZER,
    Codec,
    IdentityGenerator,
)
from tenure._core.exceptions import (
    ArgumentError,
    CacheDecodeError,
    CacheReentryError,
    ConnectionPoolExhaustedError,
    ServerUnavailableError,
    TenureError,
)
from tenure._core.leased import check_name, lone_surrogate
from tenure._core.values import check_seconds, to_ms

__all__ = ["AsyncCache", "AsyncHerdCache"]

logger = logging.getLogger("tenure.cache")

_DEFAULT_IDENTITY = IdentityGenerator()

_UNREACHABLE = (ServerUnavailableError, ConnectionPoolExhaustedError)

_loading: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "tenure_cache_loading", default=frozenset()
)
"""The entries whose loads the current thread or task runs (a loader asking for one
of them would wait for itself)."""
"""The server cannot be asked now: the fallback's (and a lost commit's) cases."""

DEFAULT_HERD_TIMEOUT = 60.0
"""Seconds a herd-cache entry outlives its freshness, to be served stale meanwhile."""

DEFAULT_LOAD_LEASE = 5.0
"""Seconds a loader's lease lasts unless renewed (renewed every third of it)."""


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class _AsyncCacheBase:
    """What both caches share: naming, encoding, and the key-level commands."""

    _default_prefix = "tenure:cache:"

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        ttl: float | None = None,
        identity_generator: Any = _DEFAULT_IDENTITY,
        serializer: Any = DEFAULT_SERIALIZER,
        compressor: Any = DEFAULT_COMPRESSOR,
        prefix: str | None = None,
    ) -> None:
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        require_bytes_replies(
            client,
            owner=type(self).__name__,
            stores="bytes (compressed values among them)",
            name=str(name),
        )
        # A lock's naming rules: a brace would also let one cache's clear()
        # match another's keys ('users' and 'users:{eu').
        check_name(name)
        if identity_generator is not None and not callable(
            getattr(identity_generator, "generate", None)
        ):
            raise ArgumentError(
                "identity_generator", "needs a generate(key, param) method, or None"
            )
        self.client = client
        self.name = name
        self.default_ttl = check_seconds(
            "ttl", ttl, name=name, allow_none=True, longest=None, positive=True
        )
        self.identity_generator = identity_generator
        self.codec = Codec(serializer, compressor)
        self.prefix = self._default_prefix if prefix is None else prefix
        if not isinstance(self.prefix, str):
            raise ArgumentError("prefix", "must be a str", name=name)
        if "{" in self.prefix or "}" in self.prefix:
            # the entries' hash tag comes after it: a brace would take its place
            raise ArgumentError(
                "prefix", f"must not contain '{{' or '}}': {self.prefix!r}", name=name
            )
        self._counts = new_counters()
        self._warned_decode = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.default_ttl} codec={self.codec!r}>"

    def statistics(self) -> CacheStatistics:
        """An immutable snapshot of this cache object's counters."""
        return CacheStatistics(**self._counts)

    # -- naming and encoding ---------------------------------------------------

    def key_of(self, key: str, param: Any = None) -> str:
        """The server key of the entry named by ``key`` and ``param``."""
        if not isinstance(key, str):
            raise ArgumentError("key", f"must be a str, got {type(key).__name__}", name=self.name)
        if self.identity_generator is None:
            if param is not None:
                raise ArgumentError(
                    "param", "this cache has no identity_generator to name params", name=self.name
                )
            identity = key
        else:
            identity = self.identity_generator.generate(key, param)
        if not identity:
            # It would be no hash tag: on a cluster the entry's keys would
            # land in different slots.
            raise ArgumentError("key", "must not be empty (it names the entry)", name=self.name)
        at = lone_surrogate(identity)
        if at is not None:
            raise ArgumentError(
                "key", f"must be UTF-8 text: a lone surrogate at {at}", name=self.name
            )
        return entry_key(self.prefix, self.name, identity)

    def _ttl_ms(self, ttl: float | None) -> int:
        return to_ms(
            self.default_ttl
            if ttl is None
            else check_seconds(
                "ttl", ttl, name=self.name, allow_none=True, longest=None, positive=True
            )
        )

    def _decode(self, data: bytes, key: str) -> Any:
        try:
            return self.codec.decode(data)
        except CacheDecodeError as exc:
            self._counts["decode_errors"] += 1
            if not self._warned_decode:
                self._warned_decode = True
                logger.warning(
                    "tenure cache %r: cannot decode %s (%s); treated as a miss", self.name, key, exc
                )
            raise

    # -- key-level commands ----------------------------------------------------

    async def exists(self, key: str, param: Any = None) -> bool:
        """Whether the entry holds a value (fresh or stale)."""
        with map_exceptions(name=self.name, doing="checking a cache entry"):
            return bool(await self.client.exists(self.key_of(key, param)))

    async def delete(self, key: str, param: Any = None) -> bool:
        """Delete the entry; True if there was one."""
        return await self._delete_key(self.key_of(key, param))

    async def _delete_key(self, stored: str) -> bool:
        with map_exceptions(name=self.name, doing="deleting a cache entry"):
            return bool(await self.client.delete(stored))

    async def delete_many(self, keys: Iterable[str], param: Any = None) -> int:
        """Delete the entries of ``keys`` (all with the same ``param``); how many there were."""
        stored = [self.key_of(key, param) for key in keys]
        if not stored:
            return 0
        with map_exceptions(name=self.name, doing="deleting cache entries"):
            async with self.client.pipeline(transaction=False) as pipe:
                for key in stored:
                    pipe.execute_command("DEL", key)  # a cluster pipeline splits delete()
                return sum(int(n) for n in await pipe.execute())

    async def ttl(self, key: str, param: Any = None) -> float | None:
        """Seconds the entry still lives on the server.

        ``None`` if it does not exist, ``math.inf`` if it never expires.
        """
        with map_exceptions(name=self.name, doing="reading a cache entry's expiry"):
            left = int(await self.client.pttl(self.key_of(key, param)))
        if left == -2:
            return None
        return float("inf") if left == -1 else left / 1000

    async def clear(self) -> int:
        """Delete every entry of this cache (SCAN on every primary, never KEYS); how many."""
        pattern = _glob_escape(f"{self.prefix}{self.name}:") + "{*"
        deleted = 0
        batch: list[Any] = []
        with map_exceptions(name=self.name, doing="clearing the cache"):
            async for key in self.client.scan_iter(match=pattern, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += await self._unlink(batch)
                    batch = []
            if batch:
                deleted += await self._unlink(batch)
        return deleted

    async def _unlink(self, keys: list[Any]) -> int:
        async with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.execute_command("UNLINK", key)
            return sum(int(n) for n in await pipe.execute())


class AsyncCache(_AsyncCacheBase):
    """A cache of values on the server, named by ``key`` and an optional ``param``.

    * ``ttl`` — default expiry in seconds (``None``: none); ``set`` may override.
    * ``identity_generator`` — names an entry from ``key`` and ``param``
      (default: :class:`~tenure.IdentityGenerator`, canonical and stable).
    * ``serializer`` — :class:`~tenure.JsonSerializer` by default;
      :class:`~tenure.MsgpackSerializer`, :class:`~tenure.PickleSerializer`
      (signed) or any object with ``serialize``/``deserialize``; ``None``
      stores bytes as they are.
    * ``compressor`` — :class:`~tenure.ZlibCompressor` from 1 KiB by default;
      :class:`~tenure.ZstdCompressor`, any object with
      ``compress``/``decompress``, or ``None``.
    * ``prefix`` — key prefix (default ``tenure:cache:``); an entry is
      ``{prefix}{name}:{identity}`` with the identity as its hash tag.

    A stored value that fails to decode (another serializer, tampered,
    corrupt) reads as a miss, with one logged warning.
    """

    def _decoded_or_miss(self, data: bytes | None, key: str, default: Any) -> Any:
        if data is None:
            self._counts["misses"] += 1
            return default
        try:
            value = self._decode(data, key)
        except CacheDecodeError:
            self._counts["misses"] += 1
            return default
        self._counts["hits"] += 1
        return value

    async def get(self, key: str, param: Any = None, default: Any = None) -> Any:
        """The value of the entry, or ``default`` if there is none (or it cannot be decoded)."""
        stored = self.key_of(key, param)
        with map_exceptions(name=self.name, doing="reading a cache entry"):
            data = await self.client.get(stored)
        return self._decoded_or_miss(_as_bytes(data), stored, default)

    async def get_many(
        self, keys: Iterable[str], param: Any = None, default: Any = None
    ) -> list[Any]:
        """The values of ``keys`` (with one ``param``), in order; ``default`` for misses."""
        stored = [self.key_of(key, param) for key in keys]
        if not stored:
            return []
        with map_exceptions(name=self.name, doing="reading cache entries"):
            async with self.client.pipeline(transaction=False) as pipe:
                for key in stored:
                    pipe.get(key)
                replies = await pipe.execute()
        return [
            self._decoded_or_miss(_as_bytes(d), k, default)
            for d, k in zip(replies, stored, strict=True)
        ]

    async def set(self, key: str, value: Any, param: Any = None, ttl: float | None = None) -> bool:
        """Store ``value``, expiring after ``ttl`` seconds (default: the cache's ``ttl``)."""
        stored, data, ttl_ms = self.key_of(key, param), self.codec.encode(value), self._ttl_ms(ttl)
        with map_exceptions(name=self.name, doing="writing a cache entry"):
            return bool(await self.client.set(stored, data, px=ttl_ms or None))

    async def set_many(
        self, values: Mapping[str, Any], param: Any = None, ttl: float | None = None
    ) -> bool:
        """Store every ``key: value`` of ``values`` (one round trip per node)."""
        ttl_ms = self._ttl_ms(ttl)
        entries = [(self.key_of(key, param), self.codec.encode(v)) for key, v in values.items()]
        if not entries:
            return True
        with map_exceptions(name=self.name, doing="writing cache entries"):
            async with self.client.pipeline(transaction=False) as pipe:
                for stored, data in entries:
                    pipe.set(stored, data, px=ttl_ms or None)
                return all(await pipe.execute())


class _Flight:
    """One request for an entry in this process, shared by every caller of it.

    Its event is made only when a second caller joins (under the cache's
    mutex), so a lone hit pays for a dict entry and no more.
    """

    __slots__ = ("abandoned", "error", "event", "finished", "value")

    def __init__(self) -> None:
        self.event: Event | None = None
        self.finished = False
        self.value: Any = None
        self.error: Exception | None = None
        # Its caller was cancelled or interrupted: the others ask again themselves.
        self.abandoned = False


_MISS = object()  # not a fresh hit: ask the script


class _Background:
    """A background refresh, kept alive by the cache until it ends."""

    __slots__ = ("handle",)

    def __init__(self) -> None:
        self.handle: Any = None


class AsyncHerdCache(_AsyncCacheBase):
    """A cache that never stampedes: one caller loads, the rest are served or woken.

    The arguments are :class:`AsyncCache`'s, plus:

    * ``ttl`` — freshness in seconds (``None``: fresh until deleted).
    * ``herd_timeout`` — how long past its freshness an entry is kept to be
      served stale while one caller refreshes it (default 60 s).
    * ``load_lease`` — how long the caller elected to load holds that right
      without renewing it (default 5 s; renewed every third while loading).
      A caller that dies while loading delays the others by at most this.
    * ``early`` — XFetch's beta: above 0, a fresh entry is refreshed early,
      with a probability rising as its deadline nears and scaled by its last
      load time (1.0 is the paper's default). 0 (default) never refreshes early.
    * ``fallback`` — when the server is unavailable (or the client's
      connection pool is exhausted), :meth:`fetch` calls the loader and
      returns its value (the outage logged once) instead of raising.

    Use :meth:`fetch` (value or load, with every guarantee); :meth:`get` and
    :meth:`set` keep aredis's ``HerdCache`` behaviour.
    """

    _default_prefix = "tenure:herd:"

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        ttl: float | None = None,
        herd_timeout: float = DEFAULT_HERD_TIMEOUT,
        load_lease: float = DEFAULT_LOAD_LEASE,
        early: float = 0.0,
        fallback: bool = True,
        identity_generator: Any = _DEFAULT_IDENTITY,
        serializer: Any = DEFAULT_SERIALIZER,
        compressor: Any = DEFAULT_COMPRESSOR,
        prefix: str | None = None,
    ) -> None:
        super().__init__(
            client,
            name,
            ttl=ttl,
            identity_generator=identity_generator,
            serializer=serializer,
            compressor=compressor,
            prefix=prefix,
        )
        self.herd_timeout = check_seconds(
            "herd_timeout", herd_timeout, name=name, allow_none=False, longest=None
        )
        self.load_lease = check_seconds(
            "load_lease", load_lease, name=name, allow_none=False, longest=None, positive=True
        )
        self.early = check_seconds("early", early, name=name, allow_none=False, longest=None)
        self.fallback = bool(fallback)
        self._registry = registry_for(client)
        self._leases: dict[str, str] = {}  # entry key -> lease token handed out by get()
        self._flights: dict[tuple[object, str], _Flight] = {}
        self._mutex = Mutex()
        self._exhaustion_logged = False  # the client's pool was exhausted (logged once)
        self._outage_seen: AsyncOutage | None = None  # the last outage a fetch went through
        self._clock = ServerClock()
        self._background: set[_Background] = set()  # refreshes in flight, strongly referenced

    # -- aredis's get / set ----------------------------------------------------

    async def get(self, key: str, param: Any = None, default: Any = None) -> Any:
        """The value, fresh or stale, as aredis's ``HerdCache.get`` gives it.

        The one caller who must refresh a stale entry (or load a missing one)
        gets ``default`` instead, and its next :meth:`set` of the entry is
        the refresh.
        """
        stored = self.key_of(key, param)
        token = secrets.token_hex(8)
        fetched = await self._fetch(CacheKeys.for_entry(stored), token, "", 0.0)
        if fetched.status in (Status.REFRESH, Status.LOAD):
            with self._mutex:
                self._leases[stored] = token
        if fetched.status in (Status.REFRESH, Status.LOAD, Status.WAIT):
            self._counts["misses"] += 1
            return default
        try:
            value = self._decode(fetched.value or b"", stored)
        except CacheDecodeError:
            self._counts["misses"] += 1
            return default
        self._counts["stale_hits" if fetched.status == Status.STALE else "hits"] += 1
        return value

    async def get_many(
        self, keys: Iterable[str], param: Any = None, default: Any = None
    ) -> list[Any]:
        """:meth:`get` of each of ``keys`` (all with the same ``param``), in order."""
        return [await self.get(key, param, default) for key in keys]

    async def set(
        self,
        key: str,
        value: Any,
        param: Any = None,
        ttl: float | None = None,
        herd_timeout: float | None = None,
    ) -> bool:
        """Store ``value``, fresh for ``ttl`` seconds and kept ``herd_timeout`` longer.

        After :meth:`get` handed this object the refresh of the entry, the
        write goes through only if that lease is still its own (False if it
        passed on); otherwise it is an explicit write and always lands.
        """
        return await self._store_key(self.key_of(key, param), value, ttl, herd_timeout)

    async def _store_key(
        self, stored: str, value: Any, ttl: float | None, herd_timeout: float | None
    ) -> bool:
        """:meth:`set` of the entry at server key ``stored``."""
        value, ttl = unwrap_loaded(value, ttl)
        data = self.codec.encode(value)  # refused: nothing written, a lease taken stays
        with self._mutex:
            token = self._leases.pop(stored, "")
        return await self._commit(CacheKeys.for_entry(stored), token, data, 0.0, ttl, herd_timeout)

    async def set_many(
        self,
        values: Mapping[str, Any],
        param: Any = None,
        ttl: float | None = None,
        herd_timeout: float | None = None,
    ) -> bool:
        """:meth:`set` of every ``key: value`` of ``values``; True if all were stored."""
        results = [await self.set(k, v, param, ttl, herd_timeout) for k, v in values.items()]
        return all(results)

    # -- fetch: the value, or exactly one load ---------------------------------

    async def fetch(
        self,
        key: str,
        loader: Callable[[], Any],
        param: Any = None,
        *,
        ttl: float | None = None,
        herd_timeout: float | None = None,
    ) -> Any:
        """The entry's value; if it is missing, ``loader()``'s, loaded once across processes.

        Fresh: returned at once. Stale: returned at once, while one caller
        (across every process) refreshes it in the background. Missing: one
        caller runs ``loader`` and stores its value; the others wait for it
        and return it. A loader that raises stores nothing (the error goes to
        the callers that waited on this process's request; a waiting caller
        in another process takes the load over). ``ttl`` and
        ``herd_timeout`` override the cache's for this entry's write.
        """
        return await self._fetch_key(
            self.key_of(key, param), loader, ttl=ttl, herd_timeout=herd_timeout
        )

    async def _fetch_key(
        self,
        stored: str,
        loader: Callable[[], Any],
        *,
        ttl: float | None = None,
        herd_timeout: float | None = None,
    ) -> Any:
        """:meth:`fetch` of the entry at server key ``stored``.

        The first caller of an entry in this process (or event loop) asks
        the server; callers that come while it does wait for
        its answer instead of asking too (one connection, not one each).
        """
        loading = _loading.get()
        if stored in loading:
            raise CacheReentryError(
                f"the loader of {stored!r} asked for that same entry (directly or through "
                "another function): it would wait for its own load for ever; load it "
                "without the cache inside its loader (say the wrapper's .uncached)",
                name=self.name,
            )
        outage = outage_of(self.client) if self.fallback else None
        if outage is not None:
            # Not even a request of this process begun before the outage is waited for.
            entered = _loading.set(loading | {stored})
            try:
                return await self._fall_back(loader, outage)
            finally:
                _loading.reset(entered)
        flight_key = (scope_key(), stored)
        mine = _Flight()
        flight = self._flights.setdefault(flight_key, mine)  # atomic: one leader
        if flight is not mine:
            with self._mutex:  # followers share one event, made by the first of them
                if flight.event is None:
                    flight.event = Event()
                event = flight.event
            self._counts["shared"] += 1
            # The leader marks the flight finished before it looks for an event
            # to set, and a follower makes the event before it looks at finished:
            # one of them sees the other.
            while not flight.finished and not await event.wait(3600.0):
                pass
            if flight.abandoned:  # its caller's cancellation is not this caller's
                return await self._fetch_key(stored, loader, ttl=ttl, herd_timeout=herd_timeout)
            if flight.error is not None:
                raise flight.error
            return flight.value
        entered = _loading.set(loading | {stored})  # what this call's loader runs under
        try:
            flight.value = await self._fetched(stored, loader, ttl, herd_timeout)
        except Exception as exc:
            flight.error = exc
            raise
        except BaseException:
            flight.abandoned = True
            raise
        finally:
            _loading.reset(entered)
            self._flights.pop(flight_key, None)
            flight.finished = True
            with self._mutex:
                waiting = flight.event
            if waiting is not None:
                waiting.set()
        return flight.value

    async def _fetched(
        self, stored: str, loader: Callable[[], Any], ttl: float | None, herd: float | None
    ) -> Any:
        """The entry's value: from the server (a plain GET, else the script), or the loader."""
        if self._outage_seen is not None and self._outage_seen.ended:
            self._outage_seen = None
            self._counts["recoveries"] += 1
        try:
            value = await self._fresh_hit(stored)
        except _UNREACHABLE as exc:
            if not self.fallback:
                raise
            return await self._fall_back(loader, self._unreachable(exc))
        if value is _MISS:
            value = await self._fetch_or_load(stored, loader, ttl, herd)
        return value

    def _unreachable(self, error: TenureError) -> AsyncOutage | None:
        """A call found the server unreachable (``error``): the outage, if it is one.

        An exhausted connection pool is this process's own limit, not an
        outage: logged once, until a fetch gets through again.
        """
        if isinstance(error, ServerUnavailableError):
            return outage_found(self.client, error)
        if not self._exhaustion_logged:
            self._exhaustion_logged = True
            logger.warning("tenure cache %r: %s; computing without the cache", self.name, error)
        return None

    async def _fall_back(self, loader: Callable[[], Any], outage: AsyncOutage | None) -> Any:
        """The loader's value, computed without the cache (``fallback``).

        A value the cache could not store is refused as it would be with the
        server up: the outcome does not depend on the server.
        """
        self._counts["fallbacks"] += 1
        if outage is not None:
            outage.fallbacks += 1
            if self._outage_seen is not outage:
                self._outage_seen = outage
                self._counts["outages"] += 1
        value = unwrap_loaded(await _call(loader), None)[0]
        self.codec.encode(value)
        return value

    async def _fresh_hit(self, stored: str) -> Any:
        """The value if a plain GET finds it surely fresh (no script), else ``_MISS``.

        Freshness is judged on this process's estimate of the server's clock
        (:class:`~tenure._core.cache.ServerClock`); an entry near its deadline,
        or any doubt, goes to the script, which decides on the server's clock.
        """
        try:
            raw = await self.client.get(stored)
        except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
            # Out of reach (the client's retries spent): the caller falls back or raises.
            raise translate_error(exc, name=self.name, doing="reading an entry") from exc
        except redis_errors.RedisError:
            return _MISS  # the script path decides, and raises a translated error
        if raw is None:
            return _MISS
        try:
            entry = split_entry(_as_bytes(raw) or b"")
        except ValueError:
            return _MISS
        early = early_factor(self.early) if self.early else 0.0
        if not self._clock.fresh(entry, time.monotonic(), early):
            return _MISS
        try:
            value = self.codec.decode(entry.value)
        except CacheDecodeError:
            return _MISS  # the script path counts and reports it
        self._counts["hits"] += 1
        return value

    async def _fetch_or_load(
        self, stored: str, loader: Callable[[], Any], ttl: float | None, herd: float | None
    ) -> Any:
        keys = CacheKeys.for_entry(stored)
        token = secrets.token_hex(8)
        try:
            fetched = await self._fetch(keys, token, "", early_factor(self.early))
            waiter = None
            if fetched.status == Status.WAIT:
                self._counts["waits"] += 1
            try:
                while fetched.status == Status.WAIT:
                    if waiter is None:  # listen first, then ask again with the channel
                        waiter = await listen(
                            self.client, token, fetched.ms / 1000 + 0.1, keys.entry
                        )
                        fetched = await self._fetch(keys, token, waiter.channel, 0.0)
                        continue
                    # woken when the value lands; asks again at least every WAIT_RECHECK
                    await waiter.wait(min(fetched.ms / 1000 + 0.05, WAIT_RECHECK))
                    fetched = await self._fetch(keys, token, waiter.channel, 0.0)
            finally:
                if waiter is not None:
                    waiter.stop()
        except _UNREACHABLE as exc:
            if not self.fallback:
                raise
            return await self._fall_back(loader, self._unreachable(exc))
        self._exhaustion_logged = False
        if fetched.status in (Status.FRESH, Status.STALE, Status.REFRESH):
            try:
                value = self._decode(fetched.value or b"", stored)
            except CacheDecodeError:
                if fetched.status == Status.REFRESH:
                    await self._give_back(keys, token)
                self._counts["misses"] += 1
                # not written back: another writer's format
                return unwrap_loaded(await _call(loader), None)[0]
            if fetched.status == Status.FRESH:
                self._counts["hits"] += 1
            else:
                self._counts["stale_hits"] += 1
            if fetched.status == Status.REFRESH:
                self._refresh_in_background(keys, token, loader, ttl, herd)
            return value
        self._counts["misses"] += 1
        self._counts["loads"] += 1
        return await self._load(keys, token, loader, ttl, herd)

    async def _load(
        self,
        keys: CacheKeys,
        token: str,
        loader: Callable[[], Any],
        ttl: float | None,
        herd: float | None,
    ) -> Any:
        renewal = self._renew_while_loading(keys, token)
        started = time.monotonic()
        try:
            value, ttl = unwrap_loaded(await _call(loader), ttl)
            # A value the serializer refuses fails like its loader: the lease
            # is given back at once, for the next caller's loader to run.
            data = self.codec.encode(value)
        except BaseException:
            watchdog().cancel(renewal)
            await self._give_back(keys, token)
            raise
        watchdog().cancel(renewal)
        took = time.monotonic() - started
        try:
            await self._commit(keys, token, data, took, ttl, herd)
        except _UNREACHABLE as exc:
            logger.warning("tenure cache %r: the loaded value was not stored: %s", self.name, exc)
        return value

    def _refresh_in_background(
        self,
        keys: CacheKeys,
        token: str,
        loader: Callable[[], Any],
        ttl: float | None,
        herd: float | None,
    ) -> None:
        self._counts["refreshes"] += 1

        job = _Background()

        async def refresh() -> None:
            try:
                await self._load(keys, token, loader, ttl, herd)
            except Exception as exc:
                logger.warning(
                    "tenure cache %r: refreshing %s failed: %r", self.name, keys.entry, exc
                )
            finally:
                with self._mutex:
                    self._background.discard(job)

        with self._mutex:
            self._background.add(job)  # before it starts: it may end at once
        job.handle = start_background(refresh, "tenure-cache-refresh")

    def _renew_while_loading(self, keys: CacheKeys, token: str) -> Job:
        lease_ms = to_ms(self.load_lease)
        every = self.load_lease / 3

        def renewed(reply: Any, error: BaseException | None) -> float | None:
            if error is None and int(reply) == 1:
                return time.monotonic() + every
            return None  # lost (or an error): the commit will tell

        return watchdog().schedule(
            Job(
                due=time.monotonic() + every,
                client=self.client,
                script="cache_lease",
                keys=keys.as_tuple(),
                args=(token, lease_ms),
                on_result=renewed,
                name=self.name,
                slack=every / 4,
            )
        )

    # -- the scripts -----------------------------------------------------------

    async def _fetch(self, keys: CacheKeys, token: str, channel: str, early: float) -> Fetched:
        sent = time.monotonic()
        with map_exceptions(name=self.name, doing="reading a cache entry"):
            reply = await self._registry.run(
                "cache_fetch",
                keys.as_tuple(),
                (token, to_ms(self.load_lease), channel, repr(early)),
                name=self.name,
            )
        fetched = parse_fetch(reply)
        self._clock.observe(fetched.server_ms, sent, time.monotonic())
        return fetched

    async def _commit(
        self,
        keys: CacheKeys,
        token: str,
        data: bytes,
        took: float,
        ttl: float | None,
        herd: float | None,
    ) -> bool:
        fresh_ms = self._ttl_ms(ttl)
        herd_s = (
            self.herd_timeout
            if herd is None
            else check_seconds("herd_timeout", herd, name=self.name, allow_none=False, longest=None)
        )
        keep_ms = fresh_ms + to_ms(herd_s) if fresh_ms else 0
        with map_exceptions(name=self.name, doing="writing a cache entry"):
            stored = await self._registry.run(
                "cache_commit",
                keys.as_tuple(),
                (token, data, fresh_ms, keep_ms, round(took * 1000)),
                name=self.name,
            )
        if int(stored) != 1:
            self._counts["refused"] += 1
            return False
        return True

    async def _give_back(self, keys: CacheKeys, token: str) -> None:
        try:
            with map_exceptions(name=self.name, doing="giving back a cache lease"):
                await self._registry.run("cache_lease", keys.as_tuple(), (token, 0), name=self.name)
        except _UNREACHABLE:
            pass  # the lease runs out by itself


def _as_bytes(data: Any) -> bytes | None:
    """A stored value as bytes (a client with decode_responses=True gives str)."""
    if data is None or isinstance(data, bytes):
        return data
    return str(data).encode("utf-8", "surrogateescape")


async def _call(loader: Callable[[], Any]) -> Any:
    """Call ``loader`` and return its value (async loaders too, in the async twin)."""
    value = loader()
    # unasync: async-only
    if inspect.isawaitable(value):
        value = await value
    # unasync: sync-only
    # unasync: end
    return value
