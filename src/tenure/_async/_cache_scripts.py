"""The herd cache's entry on the server: one plain command first, then its three scripts.

* :meth:`AsyncHerdScripts.first_read` — ``SET entry l<token> NX PX lease
  GET``: the stored entry, as a GET gives it, trusted when this process's
  estimate of the server's clock (:class:`~tenure._core.cache.ServerClock`)
  finds it surely fresh; on a missing entry the same call puts this
  caller's load mark in its place, electing it to load (a miss costs the
  bare loop's two round trips: this one and the write-back);
* ``cache_fetch`` — the value, and who loads: one script call decides;
* ``cache_commit`` — the write-back, accepted only from the lease's
  current holder, so a refresher whose lease ran out cannot overwrite
  newer data;
* ``cache_lease`` — a lease renewed while its load runs (a watchdog job),
  or given back.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors

from tenure._async._cache_near import AsyncNearLayer, written
from tenure._async._cache_store import read_values
from tenure._async._scripting import AsyncClient, registry_for
from tenure._async._watchdog import Job, watchdog
from tenure._backends.for_asyncio import shielded
from tenure._backends.owners import new_token
from tenure._core.cache import (
    UNREACHABLE,
    CacheCounters,
    CacheKeys,
    CacheNaming,
    Fetched,
    ServerClock,
    as_bytes,
    check_herd_timeout,
    early_factor,
    entry_parts,
    parse_fetch,
)
from tenure._core.clients import map_exceptions, translate_error
from tenure._core.codec import Codec
from tenure._core.exceptions import CacheDecodeError, ServerUnavailableError
from tenure._core.values import to_ms

__all__ = ["MISS", "AsyncHerdScripts", "Elected"]

logger = logging.getLogger("tenure.cache")

MISS = object()
"""Not a fresh hit: ask the script."""


class Elected:
    """The entry was missing and this read's load mark went in: its caller loads it."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token
        """The mark's token: the load lease's, for the renewals and the write-back."""


PLAIN_READS = 1.0
"""Seconds the first read is a plain GET after the server refused its SET (out of
memory, say): a fresh hit is still served in one round trip meanwhile."""

HOT = 0.94
"""Above this share of fresh hits among a cache's recent first reads, they are
plain GETs: a hit then costs a GET (the SET's write path costs the server a few
µs more), a miss a third round trip (the script elects the loader). Below it,
SET NX GET: a miss costs two round trips, as a bare GET + SET does. The
break-even share is 1 / (1 + the SET's extra share of a round trip, ~6%)."""

HOT_MEMORY = 32
"""The share of fresh hits is an average over about this many recent first reads."""


class AsyncHerdScripts:
    """One herd cache's calls to the server, with its lease and herd settings."""

    def __init__(
        self,
        client: AsyncClient,
        naming: CacheNaming,
        codec: Codec,
        counters: CacheCounters,
        *,
        herd_timeout: float,
        load_lease: float,
        near: AsyncNearLayer | None = None,
    ) -> None:
        self._client = client
        self._name = naming.name
        self._naming = naming
        self._codec = codec
        self._counters = counters
        self.near = near
        """The cache's near entries (``near=``, its store's), or None."""
        self.herd_timeout = herd_timeout
        self.load_lease = load_lease
        self._lease_ms = to_ms(load_lease)
        self._registry = registry_for(client)
        self._clock = ServerClock()
        self._plain_until = float("-inf")  # monotonic: until then, first reads are plain GETs
        self._hit_share = 0.0  # of recent first reads (see HOT); a new cache's first ones miss

    def near_hit(self, stored: str, early: float) -> Any:
        """The value from this process's memory if it is surely fresh (``near=``); else MISS.

        The near entry is the entry as the server stores it: its freshness is
        judged as a first read's is, on this process's estimate of the
        server's clock, with the same chance of an early refresh.
        """
        near = self.near
        if near is None:
            return MISS
        found, raw = near.get(stored)
        if not found:
            return MISS
        payload = self._clock.fresh_part(
            raw, time.monotonic(), early_factor(early) if early else 0.0
        )
        if payload is None:
            return MISS
        try:
            value = self._codec.decode(payload)
        except CacheDecodeError:
            return MISS
        self._counters.add("near_hits")
        return value

    async def first_read(self, stored: str, early: float) -> Any:
        """:meth:`_first_read`, answered from memory when it may be (``near=``), else kept."""
        near = self.near
        if near is None:
            return (await self._first_read(stored, early))[0]
        value = self.near_hit(stored, early)
        if value is not MISS:
            return value
        reading = near.begin(stored)
        raw = None
        try:
            value, raw = await self._first_read(stored, early)
        finally:  # kept parsed: a near hit only compares numbers
            near.finish(stored, reading, None if raw is None else entry_parts(raw))
        return value

    async def _first_read(self, stored: str, early: float) -> tuple[Any, bytes | None]:
        """The value if the entry is surely fresh; an :class:`Elected` or :data:`MISS` if not.

        With it, the entry as read (None: no entry, or a load mark).

        One command, no script: ``SET stored l<token> NX PX load_lease GET``
        (or a GET, below). A stored entry comes back as a GET would give it,
        unchanged, and is served if this process's estimate of the server's
        clock (:class:`~tenure._core.cache.ServerClock`) finds it surely
        fresh. A missing entry gets the new token's load mark: its caller is
        :class:`Elected` to load it. Anything else (near its deadline, stale,
        another caller's mark, any doubt) is :data:`MISS`: ``cache_fetch``
        decides on the server's clock. While this cache's recent first reads
        are mostly fresh hits (:data:`HOT`), and for :data:`PLAIN_READS`
        seconds after the server refused the write (out of memory), it is a
        plain GET.
        """
        share = self._hit_share
        try:
            if share > HOT or time.monotonic() < self._plain_until:
                raw = await self._client.get(stored)
            else:
                token = new_token()
                mark = "l" + token
                try:
                    raw = await self._client.execute_command(  # type: ignore[no-untyped-call,unused-ignore]
                        "SET", stored, mark, "NX", "PX", self._lease_ms, "GET", get=True
                    )
                except BaseException as exc:
                    if not isinstance(exc, Exception):  # cancelled or interrupted: its mark
                        # may be in place, sent before the reply was awaited: given back,
                        # so the next caller loads at once, not after the lease
                        with contextlib.suppress(Exception):  # the interruption is raised
                            await shielded(self.give_back(CacheKeys.for_entry(stored), token))
                    raise
                if raw is None or raw == mark.encode():  # (resent: its own mark)
                    self._hit_share = share - share / HOT_MEMORY
                    return Elected(token), None
        except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
            # Out of reach (the client's retries spent): the caller falls back or raises.
            raise translate_error(exc, name=self._name, doing="fetching from the cache") from exc
        except redis_errors.RedisError as exc:
            # Out of memory: the SET refused, a GET is not. (Another type at this
            # one key, say, is this key's own matter: the other keys go on.)
            if isinstance(exc, redis_errors.OutOfMemoryError) or "OOM" in str(exc)[:8]:
                self._plain_until = time.monotonic() + PLAIN_READS
            return MISS, None  # the script path decides, and raises a translated error
        value = MISS
        data = None
        if raw is not None:
            data = raw if type(raw) is bytes else as_bytes(raw) or b""
            factor = early_factor(early) if early else 0.0
            payload = self._clock.fresh_value(data, time.monotonic(), factor)
            if payload is not None:
                try:
                    value = self._codec.decode(payload)
                except CacheDecodeError:
                    pass  # the script path counts and reports it
                else:
                    self._counters.add("hits")
        self._hit_share = share + ((value is not MISS) - share) / HOT_MEMORY
        return value, data if data and data[:1] == b"h" else None

    async def first_reads(self, stored: Sequence[str]) -> list[Any]:
        """:meth:`first_read` of many keys: each value if surely fresh, else :data:`MISS`.

        Answered from memory where it may be (``near=``); the rest are plain
        GETs in one round trip (a pipeline; on a cluster, one per node). No
        load mark is put: the keys not surely fresh go to :meth:`fetch_many`.
        """
        values: list[Any] = [MISS] * len(stored)
        if stored and not self._clock.trusted(time.monotonic()):
            await self._calibrate()  # (else every entry of the batch would go to a script)
        near = self.near
        ask = list(range(len(stored)))
        if near is not None:
            for index, key in enumerate(stored):
                values[index] = self.near_hit(key, 0.0)
            ask = [index for index in ask if values[index] is MISS]
        if not ask:
            return values
        keys = [stored[index] for index in ask]
        with map_exceptions(name=self._name, doing="reading cache entries"):
            if near is not None:  # kept parsed, as a first read keeps them
                replies = await near.read_many(keys, expiry=False, kept=entry_parts)
            else:  # (a key of another type reads None: the script raises its error)
                replies = await read_values(self._client, keys)
        # Missing, not surely fresh, or the key's own error (another type): MISS, and the
        # script decides (or raises). A value that fails to decode too: the script counts it.
        hits = 0
        decode = self._codec.decode
        fresh = self._clock.fresh_values(replies, time.monotonic())
        for index, payload in zip(ask, fresh, strict=True):
            if payload is not None:
                try:
                    values[index] = decode(payload)
                except CacheDecodeError:
                    continue
                hits += 1
        if hits:
            self._counters.add("hits", hits)
        return values

    async def _calibrate(self) -> None:
        """Learn the server's clock from ``TIME`` (a batch's entries are judged by it)."""
        sent = time.monotonic()
        with map_exceptions(name=self._name, doing="reading the server's clock"):
            found: Any = await self._client.time()
        if isinstance(found, dict):  # (a cluster client's: one node's answer)
            found = next(iter(found.values()))
        seconds, micros = found
        self._clock.observe(int(seconds) * 1000 + int(micros) // 1000, sent, time.monotonic())

    async def fetch_many(self, keys: Sequence[CacheKeys], tokens: Sequence[str]) -> list[Fetched]:
        """:meth:`fetch` of many entries (no channel, no early refresh), in one round trip."""
        sent = time.monotonic()
        replies = await self._registry.run_many(
            "cache_fetch",
            [
                (each.as_tuple(), (token, self._lease_ms, "", "0.0"))
                for each, token in zip(keys, tokens, strict=True)
            ],
            name=self._name,
            doing="reading cache entries",
        )
        received = time.monotonic()
        fetched = [parse_fetch(reply) for reply in replies]
        for each in fetched:
            self._clock.observe(each.server_ms, sent, received)
        return fetched

    async def fetch(self, keys: CacheKeys, token: str, channel: str, early: float) -> Fetched:
        """``cache_fetch``: the entry, and whether ``token`` loads it (or waits on ``channel``)."""
        sent = time.monotonic()
        with map_exceptions(name=self._name, doing="reading a cache entry"):
            reply = await self._registry.run(
                "cache_fetch",
                keys.as_tuple(),
                (token, self._lease_ms, channel, repr(early)),
                name=self._name,
            )
        fetched = parse_fetch(reply)
        self._clock.observe(fetched.server_ms, sent, time.monotonic())
        return fetched

    async def commit(
        self,
        keys: CacheKeys,
        token: str,
        data: bytes,
        took: float,
        ttl: float | None,
        herd: float | None,
    ) -> bool:
        """``cache_commit``: store ``data`` if ``token`` holds the lease (or if it is "")."""
        fresh_ms = self._naming.ttl_ms(ttl)
        herd_s = self.herd_timeout if herd is None else check_herd_timeout(herd, self._name)
        keep_ms = fresh_ms + to_ms(herd_s) if fresh_ms else 0
        try:
            with map_exceptions(name=self._name, doing="writing a cache entry"):
                stored = await self._registry.run(
                    "cache_commit",
                    keys.as_tuple(),
                    (token, data, fresh_ms, keep_ms, round(took * 1000)),
                    name=self._name,
                )
        finally:
            written(self.near, (keys.entry,))  # this process reads its own write at once
        if int(stored) != 1:
            self._counters.add("refused")
            return False
        return True

    async def give_back(self, keys: CacheKeys, token: str) -> bool:
        """``cache_lease`` with no time left (a mark or lease): the next caller loads at once.

        False if ``token`` held neither, or the server was out of reach.
        """
        try:
            with map_exceptions(name=self._name, doing="giving back a cache lease"):
                given = await self._registry.run(
                    "cache_lease", keys.as_tuple(), (token, 0), name=self._name
                )
        except UNREACHABLE:
            return False  # the lease runs out by itself
        return int(given) == 1

    async def give_back_after(self, error: BaseException, keys: CacheKeys, token: str) -> None:
        """Give ``token``'s lease back after its commit failed with ``error``.

        The value did not land, so the entry's next caller (in any process)
        loads at once instead of waiting the lease out. Not when the server
        is out of reach: the give-back would fail the same way, after the
        same wait, and the lease ends by itself. A give-back that fails is
        logged: the caller raises ``error``, not it.
        """
        if isinstance(error, ServerUnavailableError):
            return
        try:
            await self.give_back(keys, token)
        except Exception as exc:
            logger.warning(
                "tenure cache %r: the lease of %s was not given back: %s",
                self._name,
                keys.entry,
                exc,
            )

    def renew_while_loading(self, keys: CacheKeys, token: str) -> Job:
        """The watchdog's job renewing ``token``'s lease every third of it (cancel it after)."""
        lease_ms = to_ms(self.load_lease)
        every = self.load_lease / 3

        def renewed(reply: Any, error: BaseException | None) -> float | None:
            if error is None and int(reply) == 1:
                return time.monotonic() + every
            return None  # lost (or an error): the commit will tell

        return watchdog().schedule(
            Job(
                due=time.monotonic() + every,
                client=self._client,
                script="cache_lease",
                keys=keys.as_tuple(),
                args=(token, lease_ms),
                on_result=renewed,
                name=self._name,
                slack=every / 4,
            )
        )
