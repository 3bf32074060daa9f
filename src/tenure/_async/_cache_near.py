"""AsyncNearLayer: a cache's entries in this process's memory, kept recent by the server.

The layer answers from memory what its entries and its tracker's
confirmation allow (:mod:`tenure._core.near`), and reads the rest from the
server with the entry's time to live, protected against an invalidation
that overtakes the reply. The tracker (:mod:`tenure._backends.near_tracking`)
is the process's invalidation connection to the cache's server; this
process's own writes drop their entries at once, without waiting for it.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from tenure._async._scripting import AsyncClient
from tenure._backends.near_tracking import tracker_for
from tenure._core.cache import as_bytes
from tenure._core.clients import is_cluster
from tenure._core.exceptions import ArgumentError
from tenure._core.near import NearCache, NearEntries

__all__ = ["AsyncNearLayer", "Reading"]

Reading = tuple[float, tuple[int, int]]
"""A read in flight: when it began (monotonic), and its ticket."""


class AsyncNearLayer:
    """One cache object's near entries (keys under ``prefix``) on ``client``'s server."""

    def __init__(self, client: AsyncClient, prefix: str, settings: NearCache, name: str) -> None:
        if is_cluster(client):
            raise ArgumentError(
                "near",
                "near caching runs on a standalone or replicated server for now, "
                "not on a cluster client",
                name=name,
            )
        self._client = client
        self._tracker = tracker_for(client.connection_pool)  # type: ignore[union-attr]
        self.entries = NearEntries(settings, self._tracker.confirmation, threading.Lock())
        self._tracker.register(prefix, self.entries)

    def get(self, stored: str) -> tuple[bool, Any]:
        """``(True, data)`` if ``stored`` is answered from memory now, else ``(False, None)``."""
        return self.entries.get(stored, time.monotonic())

    def begin(self, stored: str) -> Reading:
        """A read of ``stored`` goes to the server now: give its answer to :meth:`finish`."""
        self._tracker.start()
        return time.monotonic(), self.entries.begin(stored)

    def finish(
        self, stored: str, reading: Reading, data: bytes | None, until: float = math.inf
    ) -> None:
        """The read of ``stored`` answered ``data`` (None: nothing to keep), valid until."""
        began, ticket = reading
        self.entries.finish(stored, ticket, began, data, until)

    async def read(self, stored: str) -> bytes | None:
        """Read ``stored`` from the server (GET and PTTL, one round trip), keeping it near."""
        reading = self.begin(stored)
        data: bytes | None = None
        until = reading[0]
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.get(stored)
                pipe.pttl(stored)
                raw, left = await pipe.execute()
            data = as_bytes(raw)
            left = int(left)
            until = math.inf if left == -1 else reading[0] + max(0, left) / 1000
        finally:
            self.finish(stored, reading, data, until)
        return data

    def dropped(self, *stored: str) -> None:
        """Drop ``stored`` now: this process wrote or deleted it."""
        for key in stored:
            self.entries.invalidate(key)

    def flush(self) -> None:
        """Every entry goes (the cache was cleared)."""
        self.entries.flush()
