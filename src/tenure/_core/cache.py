"""The caches' sans-IO half: key naming, durations, the fetch script's replies, statistics.

Every function here is pure and tested without a server
(``tests/test_cache_core.py``). The I/O lives in :mod:`tenure._async._cache`
(the public classes) and the parts they compose, ``tenure._async._cache_*``
(and their generated sync twins); the rules those parts share are here:

* :class:`CacheNaming` — a cache's name, prefix, identity generator and
  default ``ttl``, checked once; an entry's server key; a ttl in ms.
* :class:`CacheCounters` — one cache object's counters (its
  :class:`CacheStatistics`), outages and their ends counted once each.
* :class:`CacheKeys`, :func:`parse_fetch`, :class:`ServerClock`,
  :func:`early_factor` — the herd cache's scripts, their replies, and when
  a plain GET may be trusted.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

from tenure._core.codec import IdentityGenerator
from tenure._core.exceptions import (
    ArgumentError,
    ConnectionPoolExhaustedError,
    ServerUnavailableError,
)
from tenure._core.leased import check_name, lone_surrogate
from tenure._core.values import check_seconds, to_ms

__all__ = [
    "DEFAULT_HERD_TIMEOUT",
    "DEFAULT_LOAD_LEASE",
    "UNREACHABLE",
    "WAIT_RECHECK",
    "CacheCounters",
    "CacheKeys",
    "CacheNaming",
    "CacheStatistics",
    "Entry",
    "EntryParts",
    "Fetched",
    "Loaded",
    "ServerClock",
    "Status",
    "as_bytes",
    "check_herd_timeout",
    "early_factor",
    "entry_key",
    "entry_parts",
    "new_counters",
    "parse_fetch",
    "split_entry",
    "unwrap_loaded",
]

_RANDOM = random.SystemRandom()  # not the global one: its seed and state are the application's

WAIT_RECHECK = 1.0
"""A fetch waiting for another caller's load asks again at least this often (seconds).

It is woken when the value lands; asking again bounds what a wake-up lost on
the way costs (a dropped connection, a starved reader) to this, not to the
loader's whole lease. One call per waiting entry and process: callers of one
entry share a request.
"""

DEFAULT_HERD_TIMEOUT = 60.0
"""Seconds a herd-cache entry outlives its freshness, to be served stale meanwhile."""

DEFAULT_LOAD_LEASE = 5.0
"""Seconds a loader's lease lasts unless renewed (renewed every third of it)."""

UNREACHABLE = (ServerUnavailableError, ConnectionPoolExhaustedError)
"""The server cannot be asked now: the fallback's (and a lost commit's) cases."""


def entry_key(prefix: str, name: str, identity: str) -> str:
    """The server key of one entry: ``{prefix}{name}:{{identity}}``.

    The identity is the cluster hash tag, so an entry's keys share one slot
    while entries spread over the cluster.
    """
    return f"{prefix}{name}:{{{identity}}}"


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class CacheNaming:
    """How one cache names its entries: name, prefix, identity generator, default ``ttl``.

    Each is checked once, when the cache is made; :meth:`key_of` names an
    entry, :meth:`ttl_ms` gives a write's expiry.
    """

    __slots__ = ("_plain", "default_ttl", "identity_generator", "name", "prefix")

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None,
        identity_generator: Any,
        prefix: str | None,
        default_prefix: str,
    ) -> None:
        # A lock's naming rules: a brace would also let one cache's clear()
        # match another's keys ('users' and 'users:{eu').
        check_name(name)
        if identity_generator is not None and not callable(
            getattr(identity_generator, "generate", None)
        ):
            raise ArgumentError(
                "identity_generator", "needs a generate(key, param) method, or None"
            )
        self.name = name
        self.default_ttl = check_seconds("ttl", ttl, name=name, allow_none=True, positive=True)
        self.identity_generator = identity_generator
        # key -> server key of the entries without a param, named by tenure's own
        # generator (a user's may not give the same identity twice)
        self._plain: dict[str, str] | None = (
            {} if identity_generator is None or _is_tenures(identity_generator) else None
        )
        self.prefix: str = default_prefix if prefix is None else prefix
        if not isinstance(self.prefix, str):
            raise ArgumentError("prefix", "must be a str", name=name)
        if "{" in self.prefix or "}" in self.prefix:
            # the entries' hash tag comes after it: a brace would take its place
            raise ArgumentError(
                "prefix", f"must not contain '{{' or '}}': {self.prefix!r}", name=name
            )

    def keys_of(self, keys: Iterable[str], param: Any = None) -> list[str]:
        """:meth:`key_of` of each of ``keys``: a batch's, refused whole if it is not one."""
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
            raise ArgumentError(
                "keys",
                f"must be an iterable of keys (a list, say), got {type(keys).__name__} "
                f"{keys!r:.60}",
                name=self.name,
            )
        return [self.key_of(key, param) for key in keys]

    def key_of(self, key: str, param: Any = None) -> str:
        """The server key of the entry named by ``key`` and ``param``."""
        plain = self._plain
        if plain is not None and param is None and type(key) is str:
            stored = plain.get(key)
            if stored is None:
                stored = self._key_of(key, None)
                if len(plain) >= PLAIN_KEYS:
                    plain.clear()
                plain[key] = stored
            return stored
        return self._key_of(key, param)

    def _key_of(self, key: str, param: Any) -> str:
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

    def check_ttl(self, ttl: float | None) -> float | None:
        """A write's ``ttl`` checked as the cache's own is (None: the cache's default)."""
        return check_seconds("ttl", ttl, name=self.name, allow_none=True, positive=True)

    def ttl_ms(self, ttl: float | None) -> int:
        """A write's expiry in ms: ``ttl`` checked, or the default (0: none)."""
        return to_ms(self.default_ttl if ttl is None else self.check_ttl(ttl))

    def pattern(self) -> str:
        """The SCAN pattern of every entry of this cache (and nothing else)."""
        return _glob_escape(f"{self.prefix}{self.name}:") + "{*"


PLAIN_KEYS = 4096
"""How many server keys of entries without a param a cache remembers (then starts over)."""


def _is_tenures(generator: Any) -> bool:
    return type(generator) is IdentityGenerator


def check_herd_timeout(herd_timeout: float, name: str) -> float:
    """``herd_timeout`` checked: a number of seconds, 0 to ten years, as every duration is."""
    return check_seconds("herd_timeout", herd_timeout, name=name, allow_none=False)


def as_bytes(data: Any) -> bytes | None:
    """A stored value as bytes (a client with decode_responses=True gives str)."""
    if data is None or isinstance(data, bytes):
        return data
    return str(data).encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class CacheKeys:
    """The three keys of one herd-cache entry (one hash tag; see ``lua/lib/cache.lua``)."""

    entry: str
    lease: str
    waiters: str

    @classmethod
    def for_entry(cls, key: str) -> CacheKeys:
        """The keys of the entry stored at ``key``."""
        return cls(entry=key, lease=f"{key}:lease", waiters=f"{key}:waiters")

    def as_tuple(self) -> tuple[str, str, str]:
        """KEYS of every cache script, in order."""
        return (self.entry, self.lease, self.waiters)


class Entry(NamedTuple):
    """A stored herd-cache entry: ``h<fresh until>:<load ms>:<value>``.

    A named tuple, not a frozen dataclass: one is made on every cache hit.
    """

    fresh_until: int  # ms on the server's clock; 0: fresh for ever
    took_ms: int  # how long the load that stored it took
    value: bytes  # the codec's bytes


def split_entry(raw: bytes) -> Entry:
    """Parse a stored entry; :class:`ValueError` if it is not one."""
    if not raw.startswith(b"h"):
        raise ValueError("not a herd-cache entry")
    parts = raw.split(b":", 2)
    if len(parts) != 3:
        raise ValueError("truncated herd-cache entry")
    return Entry(fresh_until=int(parts[0][1:]), took_ms=int(parts[1]), value=parts[2])


class ServerClock:
    """The server's clock as this process estimates it (from the scripts' replies).

    Each script call that reports the server's time gives ``offset = server
    - midpoint of the call`` with an error of at most half the call's
    duration; the estimate with the smallest error of the last
    :data:`MAX_AGE` seconds is kept. A fresh hit read with a plain GET is
    trusted only while the estimate is that recent, and only up to
    ``error + margin`` before the entry's deadline; anything closer goes
    through the script, which decides on the server's own clock.
    """

    MAX_AGE = 10.0
    MARGIN_MS = 1.0

    def __init__(self) -> None:
        self._offset_ms = 0.0
        self._error_ms = float("inf")
        self._at = float("-inf")

    def observe(self, server_ms: int, sent: float, received: float) -> None:
        """Learn from a reply carrying ``server_ms``, sent and received at monotonic times."""
        error = (received - sent) * 500  # half the call, in ms
        midpoint = (sent + received) * 500
        expired = received - self._at > self.MAX_AGE
        if expired or error <= self._error_ms:
            self._offset_ms, self._error_ms, self._at = server_ms - midpoint, error, received

    def trusted(self, now: float) -> bool:
        """Whether the estimate is recent enough to judge a hit by at monotonic ``now``."""
        return now - self._at <= self.MAX_AGE

    def _fresh(self, fresh_until: int, took_ms: int, now: float, early: float) -> bool:
        if fresh_until == 0:
            return True
        if now - self._at > self.MAX_AGE:
            return False
        server_now = now * 1000 + self._offset_ms + self._error_ms + self.MARGIN_MS
        return server_now + took_ms * early < fresh_until

    def fresh_value(self, raw: bytes, now: float, early: float = 0.0) -> bytes | None:
        """The value stored in entry ``raw`` if it is surely fresh at monotonic ``now``; else None.

        None too for anything that is not an entry (a load mark, another
        format): the script decides. Every hit comes here: it parses the
        header in place, with no :class:`Entry` made.
        """
        parts = entry_parts(raw)
        return None if parts is None else self.fresh_part(parts, now, early)

    def fresh_values(self, raws: Sequence[Any], now: float) -> list[bytes | None]:
        """:meth:`fresh_value` of each of ``raws`` (no early refresh), the clock read once.

        A batch's hits come here: anything but an entry's bytes is None.
        """
        trusted = now - self._at <= self.MAX_AGE
        server_now = now * 1000 + self._offset_ms + self._error_ms + self.MARGIN_MS
        found: list[bytes | None] = []
        for raw in raws:
            parts = entry_parts(raw) if type(raw) is bytes else None
            fresh = parts is not None and (parts[0] == 0 or (trusted and server_now < parts[0]))
            found.append(parts[2] if fresh and parts is not None else None)
        return found

    def fresh_part(self, parts: EntryParts, now: float, early: float = 0.0) -> bytes | None:
        """:meth:`fresh_value` of an entry parsed by :func:`entry_parts` (a near entry)."""
        fresh_until, took_ms, value = parts
        return value if self._fresh(fresh_until, took_ms, now, early) else None


EntryParts = tuple[int, int, bytes]
"""A herd entry parsed: (fresh until, in server ms; its load's ms; the stored value)."""


def entry_parts(raw: bytes) -> EntryParts | None:
    """Entry ``raw`` parsed, or None if it is not an entry (a load mark, another format)."""
    head, _, rest = raw.partition(b":")
    took, found, value = rest.partition(b":")
    if not found or head[:1] != b"h":
        return None
    try:
        return int(head[1:]), int(took), value
    except ValueError:
        return None


class Status(enum.IntEnum):
    """What ``cache_fetch`` found (see ``tenure/lua/cache_fetch.lua``)."""

    FRESH = 1
    """A fresh value."""
    REFRESH = 2
    """A stale value (or one due for early refresh); this caller refreshes it."""
    STALE = 3
    """A stale value another caller is refreshing."""
    LOAD = 4
    """No value; this caller loads it."""
    WAIT = 5
    """No value; another caller loads it."""


@dataclass(frozen=True)
class Fetched:
    """One reply of ``cache_fetch``: status, the entry (if any), a time in ms, the server's now.

    ``ms`` is the freshness left (FRESH; -1: for ever), the lease granted
    (REFRESH, LOAD), or how long the current lease still runs (STALE, WAIT).
    """

    status: Status
    entry: Entry | None
    ms: int
    server_ms: int

    @property
    def value(self) -> bytes | None:
        """The stored value's bytes, if the entry has one."""
        return None if self.entry is None else self.entry.value


def parse_fetch(reply: Any) -> Fetched:
    """Interpret ``cache_fetch``'s reply; :class:`ValueError` for anything else."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 4:
        raise ValueError(f"unexpected cache_fetch reply: {reply!r}")
    status, raw, ms, server_ms = reply
    try:
        parsed = Status(int(status))
    except ValueError:
        raise ValueError(f"unexpected cache_fetch status: {reply!r}") from None
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    has_value = parsed in (Status.FRESH, Status.REFRESH, Status.STALE)
    if has_value != isinstance(raw, bytes):
        raise ValueError(f"cache_fetch reply {reply!r}: status and value disagree")
    entry = split_entry(raw) if isinstance(raw, bytes) else None
    return Fetched(status=parsed, entry=entry, ms=int(ms), server_ms=int(server_ms))


def early_factor(beta: float, rand: float | None = None) -> float:
    """XFetch's ``-beta * ln(u)`` for uniform ``u`` in (0, 1] (0 when beta is 0).

    A fresh entry is refreshed early once ``now + load_time * factor`` passes
    its freshness deadline (Vattani, Chierichetti, Lowenstein, VLDB 2015):
    the longer the load, the earlier; one caller at a time, since the
    refresh still takes the entry's one lease.
    """
    if beta <= 0:
        return 0.0
    u = 1.0 - (_RANDOM.random() if rand is None else rand)
    return -beta * math.log(u) if u > 0 else 0.0


@dataclass(frozen=True)
class CacheStatistics:
    """An immutable snapshot of one cache object's counters (this process only).

    * ``hits`` — reads answered with a fresh value from the server;
      ``near_hits`` from this process's memory (``near=``); ``stale_hits``
      with a stale one while someone refreshed it.
    * ``misses`` — reads that found nothing (``get``), or found nothing and
      loaded or waited (``fetch``).
    * ``loads`` / ``refreshes`` — loader calls for a missing / stale entry.
    * ``waits`` — fetches that waited for another caller's load.
    * ``shared`` — fetches that joined a request already in flight in this
      process instead of asking the server.
    * ``refused`` — write-backs refused because the lease had passed on.
    * ``decode_errors`` — stored values this cache could not decode.
    * ``fallbacks`` — fetches computed without the cache (server unavailable).
    * ``outages`` — outages of the server this cache's calls met: once one
      call finds it out of reach, the fetches of every cache of that client
      go straight to their loaders (``fallback``), and its ``get``,
      ``get_many`` and ``set`` raise at once, until a background probe finds
      the server again; ``recoveries`` — of those, the ones this cache saw
      end (a call asked the server again).
    """

    hits: int = 0
    near_hits: int = 0
    stale_hits: int = 0
    misses: int = 0
    loads: int = 0
    refreshes: int = 0
    waits: int = 0
    shared: int = 0
    refused: int = 0
    decode_errors: int = 0
    fallbacks: int = 0
    outages: int = 0
    recoveries: int = 0


@dataclass(frozen=True)
class Loaded:
    """What a loader may return to store ``value`` with its own freshness ``ttl``.

    ``@cached`` stores a cached error this way (for its ``error_ttl``).
    """

    value: Any
    ttl: float | None


def unwrap_loaded(result: Any, ttl: float | None) -> tuple[Any, float | None]:
    """A loader's ``(value, ttl)``: its :class:`Loaded`'s, or ``(result, ttl)``."""
    if isinstance(result, Loaded):
        return result.value, result.ttl
    return result, ttl


def new_counters() -> dict[str, int]:
    """Zeroed mutable counters, one per :class:`CacheStatistics` field."""
    return dict.fromkeys(CacheStatistics.__dataclass_fields__, 0)


class Outage(Protocol):
    """What the counters read of an outage (``tenure._async._outage.AsyncOutage``)."""

    ended: bool


REQUEST_RESULTS = {
    "hits": "hit",
    "near_hits": "near_hit",
    "misses": "miss",
    "stale_hits": "stale",
    "waits": "wait",
}
"""The counters that are a request's result, and the result each is (``fallback`` apart)."""


class CacheCounters:
    """One cache object's counters (this process only), shared by the parts of the cache.

    :meth:`add` counts one event of a :class:`CacheStatistics` field;
    :meth:`snapshot` is the statistics. An outage counts once however many
    fetches go around it (:meth:`fell_back`), and its end once, when a
    fetch sees it ended (:meth:`recovered`).
    """

    __slots__ = ("counts", "outage", "subject")

    told: ClassVar[Callable[[Any, str, int], None] | None] = None
    """Told each request's subject and result (``hit``, ``miss``...): the metrics' seam sets it."""

    def __init__(self, subject: Any = None) -> None:
        self.counts = new_counters()
        self.outage: Outage | None = None  # the last outage a fetch went through
        self.subject = subject
        """Who the metrics are about (the seam's subject for this cache)."""

    def add(self, field: str, count: int = 1, *, tell: bool = True) -> None:
        """Count ``count`` events of ``field``, and tell requests' results to the metrics.

        ``tell`` False: counted, not told (a waiter's hit, told as a wait).
        """
        self.counts[field] += count
        told = CacheCounters.told
        if told is not None and tell and field in REQUEST_RESULTS:
            told(self.subject, REQUEST_RESULTS[field], count)

    def snapshot(self) -> CacheStatistics:
        """An immutable snapshot of the counters."""
        return CacheStatistics(**self.counts)

    def fell_back(self, outage: Outage | None) -> None:
        """A fetch computed without the cache, around ``outage`` (None: not an outage)."""
        self.counts["fallbacks"] += 1
        told = CacheCounters.told
        if told is not None:
            told(self.subject, "fallback", 1)
        if outage is not None:
            self.met(outage)

    def met(self, outage: Outage) -> None:
        """A call of this cache met ``outage`` (each outage counted once)."""
        if self.outage is not outage:
            self.outage = outage
            self.counts["outages"] += 1

    def recovered(self) -> None:
        """A call asks the server again: the last outage, if it has ended, counts as over."""
        if self.outage is not None and self.outage.ended:
            self.outage = None
            self.counts["recoveries"] += 1
