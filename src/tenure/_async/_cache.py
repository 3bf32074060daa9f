"""AsyncCache and AsyncHerdCache: values on the server, named by key and param.

:class:`AsyncCache` is aredis's ``Cache``: a value per entry, written with
an expiry (SET with PX) and read with GET, each stored value headed by its
format (:mod:`tenure._core.codec`).

:class:`AsyncHerdCache` keeps each entry for its freshness *plus*
``herd_timeout``, with the freshness deadline on the server's clock inside the
entry, and decides who loads in one script call (``cache_fetch``): a fresh
value is served, a stale one too while exactly one caller refreshes it, and a
missing one is loaded by one caller while the others wait to be woken. The
write-back (``cache_commit``) is accepted only from the lease's current holder.

The public classes here check their arguments and compose small parts,
each holding one concern (the sans-IO rules in :mod:`tenure._core.cache`):

* ``_cache_store`` — reading and writing through the codec, the key-level
  commands, decode failures read as misses;
* ``_cache_scripts`` — the herd entry on the server: a plain GET trusted
  on the estimated server clock, then ``cache_fetch``, ``cache_commit``
  and ``cache_lease``;
* ``_cache_loading`` — who loads, how waiters are woken and ask again
  (``WAIT_RECHECK``), refreshes in the background, the load lease renewed;
* ``_cache_flights`` — callers of one entry in this process share one
  request before anything goes to the server;
* ``_cache_fallback`` — the loader alone when the server cannot be asked;
* ``_cache_reentry`` — a loader asking for its own entry fails at once;
* :class:`~tenure._core.cache.CacheCounters` — the statistics.

``@cached`` (:mod:`tenure._cached`) reaches an entry by its server key through
:meth:`AsyncHerdCache._fetch_key`, ``_store_key`` and ``_delete_key``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tenure._async import _cache_reentry as reentry
from tenure._async._cache_fallback import AsyncCacheFallback
from tenure._async._cache_flights import ABANDONED, AsyncFlights
from tenure._async._cache_loading import AsyncHerdLoading
from tenure._async._cache_near import AsyncNearLayer
from tenure._async._cache_scripts import MISS, AsyncHerdScripts, Elected
from tenure._async._cache_store import AsyncCacheStore
from tenure._async._scripting import AsyncClient
from tenure._backends.for_asyncio import IS_ASYNC, Mutex, refuse_awaited_call
from tenure._backends.owners import new_token
from tenure._backends.telemetry import subject
from tenure._core.cache import (
    DEFAULT_HERD_TIMEOUT,
    DEFAULT_LOAD_LEASE,
    CacheCounters,
    CacheKeys,
    CacheNaming,
    CacheStatistics,
    Fetched,
    Status,
    check_herd_timeout,
    unwrap_loaded,
)
from tenure._core.clients import require_bytes_replies, require_client
from tenure._core.codec import (
    DEFAULT_COMPRESSOR,
    DEFAULT_SERIALIZER,
    Codec,
    IdentityGenerator,
)
from tenure._core.exceptions import ArgumentError, CacheDecodeError
from tenure._core.near import NearCache, near_settings
from tenure._core.values import check_seconds

__all__ = ["AsyncCache", "AsyncHerdCache"]

_DEFAULT_IDENTITY = IdentityGenerator()


class _AsyncCacheBase:
    """What both caches share: their arguments checked, naming, statistics, key-level commands.

    Each is held by a part (:class:`~tenure._core.cache.CacheNaming`,
    :class:`~tenure._core.cache.CacheCounters`, :class:`AsyncCacheStore`),
    and the methods here hand over to it.
    """

    _default_prefix = "tenure:cache:"
    _marks = False  # whether a missing entry's key may hold a load mark (the herd cache's)

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
        metric_name: str | None = None,
        near: bool | NearCache | None = None,
    ) -> None:
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        require_bytes_replies(
            client,
            owner=type(self).__name__,
            stores="binary entries (serialized values, compressed when large)",
            name=str(name),
        )
        self._naming = CacheNaming(
            name,
            ttl=ttl,
            identity_generator=identity_generator,
            prefix=prefix,
            default_prefix=self._default_prefix,
        )
        self._client = client
        self._codec = Codec(serializer, compressor)
        self._counters = CacheCounters(subject(None, self._naming.name, metric_name))
        self._store = AsyncCacheStore(
            client, self._naming, self._codec, self._counters, marks=self._marks
        )
        settings = near_settings(near, self._naming.name)
        if settings is not None:
            prefix_of_keys = f"{self._naming.prefix}{self._naming.name}:"
            self._store.near = AsyncNearLayer(client, prefix_of_keys, settings, self.name)

    # Read-only: the parts were made with these; a new value would be ignored.

    @property
    def client(self) -> AsyncClient:
        """The client the cache was made with."""
        return self._client

    @property
    def name(self) -> str:
        """The cache's name (its keys are ``{prefix}{name}:{{identity}}``)."""
        return self._naming.name

    @property
    def default_ttl(self) -> float | None:
        """Seconds an entry lives unless ``set`` says otherwise (None: no expiry)."""
        return self._naming.default_ttl

    @property
    def identity_generator(self) -> Any:
        """What names an entry from its key and param."""
        return self._naming.identity_generator

    @property
    def codec(self) -> Codec:
        """How values become bytes: the serializer, then the compressor."""
        return self._codec

    @property
    def prefix(self) -> str:
        """The prefix of every key of this cache."""
        return self._naming.prefix

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.default_ttl} codec={self.codec!r}>"

    def statistics(self) -> CacheStatistics:
        """An immutable snapshot of this cache object's counters."""
        return self._counters.snapshot()

    def key_of(self, key: str, param: Any = None) -> str:
        """The server key of the entry named by ``key`` and ``param``."""
        return self._naming.key_of(key, param)

    async def exists(self, key: str, param: Any = None) -> bool:
        """Whether the entry holds a value (fresh or stale)."""
        return await self._store.exists(key, param)

    async def delete(self, key: str, param: Any = None) -> bool:
        """Delete the entry; True if there was one."""
        refuse_awaited_call(type(self).__name__, "delete", 1)
        return await self._store.delete_key(self._naming.key_of(key, param))

    async def _delete_key(self, stored: str) -> bool:
        return await self._store.delete_key(stored)

    async def delete_many(self, keys: Iterable[str], param: Any = None) -> int:
        """Delete the entries of ``keys`` (all with the same ``param``); how many there were."""
        refuse_awaited_call(type(self).__name__, "delete_many", 1)
        return await self._store.delete_many(keys, param)

    async def ttl(self, key: str, param: Any = None) -> float | None:
        """Seconds the entry still lives on the server.

        ``None`` if it does not exist, ``math.inf`` if it never expires.
        """
        return await self._store.ttl(key, param)

    async def clear(self) -> int:
        """Delete every entry of this cache (SCAN on every primary, never KEYS); how many."""
        refuse_awaited_call(type(self).__name__, "clear", 1)
        return await self._store.clear()


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
    * ``near`` — ``True`` or a :class:`~tenure.NearCache`: keep entries read
      in this process's memory too, answered there with no round trip while
      the server confirms no write replaced them more than ``max_staleness``
      ago (docs/caches.md, "Near caching"). Standalone, replicated and
      cluster servers, and clients of ``Sentinel.master_for``.
    * ``metric_name`` — report this cache's measurements with ``tenure.name``
      set to it (docs/observability.md); by default no name is reported
      unless :func:`~tenure.set_metric_names` matches ``name``.

    A stored value that fails to decode (another serializer, tampered,
    corrupt) reads as a miss, with one logged warning.

    A ``ttl``, here or in a call, is a number of seconds above 0 and at most
    ten years, as every duration tenure takes; anything else (NaN, an
    infinity, a bool, a string) raises :class:`~tenure.ArgumentError` naming
    it, before anything is written.
    """

    async def get(self, key: str, param: Any = None, default: Any = None) -> Any:
        """The value of the entry, or ``default`` if there is none (or it cannot be decoded)."""
        return await self._store.get(key, param, default)

    async def get_many(
        self, keys: Iterable[str], param: Any = None, default: Any = None
    ) -> list[Any]:
        """The values of ``keys`` (with one ``param``), in order; ``default`` for misses."""
        return await self._store.get_many(keys, param, default)

    async def set(self, key: str, value: Any, param: Any = None, ttl: float | None = None) -> bool:
        """Store ``value``, expiring after ``ttl`` seconds (default: the cache's ``ttl``)."""
        refuse_awaited_call(type(self).__name__, "set", 1)
        return await self._store.set(key, value, param, ttl)

    async def set_many(
        self, values: Mapping[str, Any], param: Any = None, ttl: float | None = None
    ) -> bool:
        """Store every ``key: value`` of ``values`` (one round trip per node)."""
        refuse_awaited_call(type(self).__name__, "set_many", 1)
        return await self._store.set_many(values, param, ttl)


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
      returns its value (the outage logged once) instead of raising; while
      an outage goes on, :meth:`get`, :meth:`get_many` and :meth:`set`
      raise :class:`~tenure.ServerUnavailableError` at once.

    ``ttl``, ``herd_timeout`` and ``load_lease`` are bounded like every
    duration tenure takes: at most ten years, ``ttl`` and
    ``load_lease`` above 0; anything else raises
    :class:`~tenure.ArgumentError` naming it, here or, for a call's own
    ``ttl`` and ``herd_timeout``, before anything is loaded or written.

    Use :meth:`fetch` (value or load, with every guarantee); :meth:`get` and
    :meth:`set` keep aredis's ``HerdCache`` behaviour.
    """

    _default_prefix = "tenure:herd:"
    _marks = True

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
        metric_name: str | None = None,
        near: bool | NearCache | None = None,
    ) -> None:
        super().__init__(
            client,
            name,
            ttl=ttl,
            identity_generator=identity_generator,
            serializer=serializer,
            compressor=compressor,
            prefix=prefix,
            metric_name=metric_name,
            near=near,
        )
        self._herd_timeout = check_herd_timeout(herd_timeout, name)
        self._load_lease = check_seconds(
            "load_lease", load_lease, name=name, allow_none=False, positive=True
        )
        # A factor, not a duration: any finite one works (1e9: always early).
        self._early = check_seconds("early", early, name=name, allow_none=False, longest=None)
        self._fallback_on = bool(fallback)
        counters = self._counters
        self._scripts = AsyncHerdScripts(
            client,
            self._naming,
            self.codec,
            counters,
            herd_timeout=self.herd_timeout,
            load_lease=self.load_lease,
            near=self._store.near,
        )
        self._fallback = AsyncCacheFallback(client, name, self.fallback, self.codec, counters)
        self._loading = AsyncHerdLoading(
            client,
            name,
            scripts=self._scripts,
            store=self._store,
            fallback=self._fallback,
            codec=self.codec,
            counters=counters,
            early=self.early,
        )
        self._flights = AsyncFlights(counters)
        self._leases: dict[str, str] = {}  # entry key -> lease token handed out by get()
        self._mutex = Mutex()

    @property
    def herd_timeout(self) -> float:
        """Seconds past its freshness an entry is kept (served stale while refreshed)."""
        return self._herd_timeout

    @property
    def load_lease(self) -> float:
        """Seconds the caller elected to load holds that right without renewing it."""
        return self._load_lease

    @property
    def early(self) -> float:
        """XFetch's beta: above 0, fresh entries are refreshed early (0: never)."""
        return self._early

    @property
    def fallback(self) -> bool:
        """Whether :meth:`fetch` calls the loader, not raises, when the server is unavailable."""
        return self._fallback_on

    # -- aredis's get / set ----------------------------------------------------

    async def get(self, key: str, param: Any = None, default: Any = None) -> Any:
        """The value, fresh or stale, as aredis's ``HerdCache.get`` gives it.

        The one caller who must refresh a stale entry (or load a missing one)
        gets ``default`` instead, and its next :meth:`set` of the entry is
        the refresh.
        """
        stored = self._naming.key_of(key, param)
        with self._fallback.asking():
            first = await self._scripts.first_read(stored, 0.0)
            if type(first) is Elected:
                with self._mutex:
                    self._leases[stored] = first.token
                self._counters.add("misses")
                return default
            if first is not MISS:
                return first  # a fresh hit, counted
            token = new_token()
            fetched = await self._scripts.fetch(CacheKeys.for_entry(stored), token, "", 0.0)
        return self._read(stored, token, fetched, default)

    def _read(self, stored: str, token: str, fetched: Fetched, default: Any) -> Any:
        """What :meth:`get` returns for ``cache_fetch``'s answer to ``token``."""
        if fetched.status in (Status.REFRESH, Status.LOAD):
            with self._mutex:
                self._leases[stored] = token
        if fetched.status in (Status.REFRESH, Status.LOAD, Status.WAIT):
            self._counters.add("misses")
            return default
        try:
            value = self._store.decode(fetched.value or b"", stored)
        except CacheDecodeError:
            self._counters.add("misses")
            return default
        self._counters.add("stale_hits" if fetched.status == Status.STALE else "hits")
        return value

    async def get_many(
        self, keys: Iterable[str], param: Any = None, default: Any = None
    ) -> list[Any]:
        """:meth:`get` of each of ``keys`` (all with the same ``param``), in order.

        One round trip for the entries surely fresh (a pipeline of GETs; on a
        cluster, one per node), none for those answered from memory
        (``near=``); the others (stale, missing, loading) take one more for
        them all, and each follows :meth:`get`'s rules: the one caller who
        must refresh or load an entry, across processes, gets ``default`` and
        its next :meth:`set` of it is the refresh. A key given twice is read
        once.
        """
        stored = self._naming.keys_of(keys, param)
        unique = list(dict.fromkeys(stored))
        with self._fallback.asking():
            found = dict(zip(unique, await self._scripts.first_reads(unique), strict=True))
            rest = [key for key, value in found.items() if value is MISS]
            if rest:
                tokens = [new_token() for _ in rest]
                fetched = await self._scripts.fetch_many(
                    [CacheKeys.for_entry(key) for key in rest], tokens
                )
                for key, token, each in zip(rest, tokens, fetched, strict=True):
                    found[key] = self._read(key, token, each, default)
        return [found[key] for key in stored]

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
        refuse_awaited_call(type(self).__name__, "set", 1)
        self._check_write(ttl, herd_timeout)
        with self._fallback.asking():
            return await self._store_key(self._naming.key_of(key, param), value, ttl, herd_timeout)

    def _check_write(self, ttl: float | None, herd_timeout: float | None) -> None:
        """A call's ``ttl`` and ``herd_timeout`` checked before anything is loaded or written."""
        self._naming.check_ttl(ttl)
        if herd_timeout is not None:
            check_herd_timeout(herd_timeout, self.name)

    async def _store_key(
        self, stored: str, value: Any, ttl: float | None, herd_timeout: float | None
    ) -> bool:
        """:meth:`set` of the entry at server key ``stored``.

        A write the server refuses gives back the lease :meth:`get` handed
        this object, so the entry's next caller loads at once.
        """
        value, ttl = unwrap_loaded(value, ttl)
        self._check_write(ttl, herd_timeout)  # refused: nothing written, a lease taken stays
        data = self.codec.encode(value)  # the same
        keys = CacheKeys.for_entry(stored)
        with self._mutex:
            token = self._leases.pop(stored, "")
        try:
            return await self._scripts.commit(keys, token, data, 0.0, ttl, herd_timeout)
        except BaseException as exc:
            if token:
                await self._scripts.give_back_after(exc, keys, token)
            raise

    async def set_many(
        self,
        values: Mapping[str, Any],
        param: Any = None,
        ttl: float | None = None,
        herd_timeout: float | None = None,
    ) -> bool:
        """:meth:`set` of every ``key: value`` of ``values``; True if all were stored."""
        refuse_awaited_call(type(self).__name__, "set_many", 1)
        self._check_write(ttl, herd_timeout)
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

        A loaded value the server does not store (it is out of memory, say)
        raises that error, and the load lease is given back: the entry's
        next caller, in any process, loads at once rather than wait it out.
        """
        refuse_awaited_call(type(self).__name__, "fetch", 1)
        if not callable(loader):
            raise ArgumentError(
                "loader",
                f"must be a function of no arguments, got {type(loader).__name__}",
                name=self._naming.name,
            )
        return await self._fetch_key(
            self._naming.key_of(key, param), loader, ttl=ttl, herd_timeout=herd_timeout
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
        if ttl is not None or herd_timeout is not None:
            self._check_write(ttl, herd_timeout)
        if self._scripts.near is not None:
            value = self._scripts.near_hit(stored, self._early)
            if value is not MISS:
                return value
        if stored in reentry.LOADING.get():
            reentry.refuse(stored, self._naming.name)
        outage = self._fallback.outage()
        if outage is not None:
            # Not even a request of this process begun before the outage is waited for.
            return await self._fallback.fall_back(loader, outage, stored)
        value = await self._flights.share(
            stored, self._loading.fetched, stored, loader, ttl, herd_timeout
        )
        if value is ABANDONED:  # its caller's cancellation is not this caller's
            return await self._fetch_key(stored, loader, ttl=ttl, herd_timeout=herd_timeout)
        return value
