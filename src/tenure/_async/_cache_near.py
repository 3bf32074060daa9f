"""AsyncNearLayer: a cache's entries in this process's memory, kept recent by the server.

The layer answers from memory what its entries and its trackers'
confirmation allow (:mod:`tenure._core.near`), and reads the rest from the
server with the entry's time to live, protected against an invalidation
that overtakes the reply. A tracker (:mod:`tenure._backends.near_tracking`)
is the process's invalidation connection to one server: the cache's
server, each primary of a cluster (a key may move between them, so every
primary's connection must confirm a read), or each server of a Sentinel
service (:mod:`tenure._backends.near_sentinel`: a failover moves the
master). A cluster's primaries, or a service's servers, are looked at
again, at most once a second, when a read goes to the server (and at each
such read while none is known): a new one (a failover, a node added) gets
its tracker before anything is served again. This process's own writes
drop their entries at once.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tenure._async._scripting import AsyncClient
from tenure._backends.near_tracking import (
    Tracker,
    dropped_here,
    master_check,
    servers_of,
    tracker_for,
)
from tenure._core.cache import as_bytes
from tenure._core.clients import is_cluster
from tenure._core.near import Confirmations, NearCache, NearEntries

__all__ = ["AsyncNearLayer", "Reading", "written"]

Reading = tuple[float, tuple[int, int]]
"""A read in flight: when it began (monotonic), and its ticket."""

LOOK_AGAIN = 1.0
"""Seconds between two looks at a cluster's primaries or a Sentinel service's servers
(on reads that go to the server)."""


class AsyncNearLayer:
    """One cache object's near entries (keys under ``prefix``) on ``client``'s servers."""

    def __init__(self, client: AsyncClient, prefix: str, settings: NearCache, name: str) -> None:
        self._client = client
        self._prefix = prefix
        # a Sentinel client: entries are kept and served only while it reads from the master
        self._master = master_check(client)
        self._seen: Any = None  # the master check's state at the last read from the server
        self._agreed: Any = None  # that state, if it agreed (a read compares with it)
        # several servers, which may change: a cluster's primaries, a Sentinel service's servers
        self._many = is_cluster(client) or self._master is not None
        self._trackers = self._find_trackers()  # (a cluster client not yet used: none)
        confirmation: Any
        if self._many:
            confirmation = Confirmations(tuple(t.confirmation for t in self._trackers))
        else:
            confirmation = self._trackers[0].confirmation
        self.entries = NearEntries(settings, confirmation, threading.Lock())
        self._looked = time.monotonic() if self._trackers else -math.inf
        for tracker in self._trackers:
            tracker.register(prefix, self.entries)

    @property
    def client(self) -> AsyncClient:
        """The client whose servers the entries are kept for."""
        return self._client

    def _find_trackers(self) -> list[Tracker]:
        return [tracker_for(kind, settings) for kind, settings in servers_of(self._client)]

    def _look_again(self) -> None:
        """Track every server known now (a cluster's primaries; a Sentinel service's servers)."""
        self._looked = time.monotonic()
        trackers = self._find_trackers()
        if [id(t) for t in trackers] == [id(t) for t in self._trackers]:
            return
        for gone in set(self._trackers) - set(trackers):
            gone.unregister(self.entries)  # (its thread idles once no cache is left)
        self._trackers = trackers
        for tracker in trackers:
            tracker.register(self._prefix, self.entries)
        confirmations = self.entries.confirmation
        assert isinstance(confirmations, Confirmations)
        confirmations.replace(tuple(t.confirmation for t in trackers))
        self.entries.flush()

    def get(self, stored: str) -> tuple[bool, Any]:
        """``(True, data)`` if ``stored`` is answered from memory now, else ``(False, None)``."""
        if self._master is not None and self._master.state() != self._agreed:
            return False, None  # a Sentinel client not on the master, or something changed
        return self.entries.get(stored, time.monotonic())

    def _check_master(self) -> None:
        """A Sentinel client: a change of its server or of the master drops every entry."""
        assert self._master is not None
        state = self._master.state()
        if state != self._seen:
            self._seen = state
            self._agreed = state if self._master.agreed(state) else None
            self.entries.flush()

    def begin(self, stored: str) -> Reading:
        """A read of ``stored`` goes to the server now: give its answer to :meth:`finish`."""
        now = time.monotonic()
        if self._many and (now - self._looked >= LOOK_AGAIN or not self._trackers):
            self._look_again()
        if self._master is not None:
            self._check_master()
        for tracker in self._trackers:
            tracker.start()
        return now, self.entries.begin(stored)

    def finish(self, stored: str, reading: Reading, data: Any, until: float = math.inf) -> None:
        """The read of ``stored`` answered ``data`` (None: nothing to keep), valid until."""
        began, ticket = reading
        if self._master is not None and self._master.state() != self._agreed:
            data = None  # (read from a server the sentinels no longer name, or just changed)
        self.entries.finish(stored, ticket, began, data, until)

    async def read(self, stored: str) -> bytes | None:
        """Read ``stored`` from the server (GET and PTTL, one round trip), keeping it near."""
        reply = (await self.read_many((stored,)))[0]
        if isinstance(reply, Exception):
            raise reply  # the server's own error (WRONGTYPE...), not the pipeline's
        return reply  # type: ignore[no-any-return]

    async def read_many(
        self,
        stored: Sequence[str],
        *,
        expiry: bool = True,
        kept: Callable[[bytes], Any] | None = None,
    ) -> list[Any]:
        """Read every key of ``stored`` in one round trip (one pipeline), keeping them near.

        Each key's data (None: no entry), or the server's error for it. With
        ``expiry``, a PTTL beside each GET bounds its near entry by the key's
        time to live (a herd entry carries its freshness: no need).
        ``kept(data)`` is what is kept of a reply (None: nothing; no ``kept``:
        the data itself).
        """
        readings = [self.begin(key) for key in stored]
        answers: list[Any] = []
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in stored:
                    pipe.get(key)
                    if expiry:
                        pipe.pttl(key)
                answers = await pipe.execute(raise_on_error=False)
        finally:  # a read that failed keeps nothing, and its ticket ends all the same
            replies = [
                self._finished(key, reading, answers, index, expiry, kept)
                for index, (key, reading) in enumerate(zip(stored, readings, strict=True))
            ]
        return replies

    def _finished(
        self,
        key: str,
        reading: Reading,
        answers: list[Any],
        index: int,
        expiry: bool,
        kept: Callable[[bytes], Any] | None,
    ) -> Any:
        """Key ``index`` of :meth:`read_many`'s ``answers`` (none: it failed), kept near."""
        began = reading[0]
        if not answers:
            self.finish(key, reading, None, began)
            return None
        step = 2 if expiry else 1
        raw = answers[index * step]
        left = answers[index * step + 1] if expiry else -1
        for reply in (raw, left):
            if isinstance(reply, Exception):  # the server's own error (WRONGTYPE...)
                self.finish(key, reading, None, began)
                return reply
        data = as_bytes(raw)
        left = int(left)
        until = math.inf if left == -1 else began + max(0, left) / 1000
        self.finish(key, reading, data if data is None or kept is None else kept(data), until)
        return data

    def dropped(self, *stored: str) -> None:
        """Drop ``stored`` now: this process wrote or deleted it."""
        for key in stored:
            self.entries.invalidate(key)

    def flush(self) -> None:
        """Every entry goes (the cache was cleared)."""
        self.entries.flush()


def written(near: AsyncNearLayer | None, stored: Sequence[str]) -> None:
    """Drop every near entry of ``stored`` in this process, in every cache, at once.

    This process wrote or deleted them through a cache object with ``near``
    (or without: None).
    """
    if near is not None:
        near.dropped(*stored)
    dropped_here(stored)
