"""The herd cache's fallback: the loader alone, when the server cannot be asked.

With ``fallback`` on, a fetch that finds the server out of reach (or the
client's connection pool exhausted) returns its loader's value instead of
raising. An outage found by one call sends every cache of that client
straight to the loaders until a background probe finds the server again
(:mod:`tenure._async._outage`); an exhausted pool is this process's own
limit, not an outage, and is logged once. While an outage goes on, the
calls that have no loader to fall back on (``get``, ``get_many``, ``set``)
raise :class:`~tenure.ServerUnavailableError` at once (:meth:`asking`)
instead of spending the client's retries again.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from tenure._async import _cache_reentry as reentry
from tenure._async._outage import PROBE_EVERY, AsyncOutage, outage_found, outage_of
from tenure._core.cache import CacheCounters, unwrap_loaded
from tenure._core.codec import Codec
from tenure._core.exceptions import ServerUnavailableError, TenureError

__all__ = ["AsyncCacheFallback", "call_loader"]

logger = logging.getLogger("tenure.cache")


class AsyncCacheFallback:
    """What one herd cache does without the server (``enabled``: its ``fallback``)."""

    def __init__(
        self, client: Any, name: str, enabled: bool, codec: Codec, counters: CacheCounters
    ) -> None:
        self.enabled = enabled
        self._client = client
        self._name = name
        self._codec = codec
        self._counters = counters
        self._exhaustion_logged = False  # the client's pool was exhausted (logged once)

    def outage(self) -> AsyncOutage | None:
        """The client's outage going on, if this cache falls back (None: ask the server)."""
        return outage_of(self._client) if self.enabled else None

    def unreachable(self, error: TenureError) -> AsyncOutage | None:
        """A call found the server unreachable (``error``): the outage, if it is one.

        An exhausted connection pool is this process's own limit, not an
        outage: logged once, until a fetch gets through again.
        """
        if isinstance(error, ServerUnavailableError):
            return outage_found(self._client, error)
        if not self._exhaustion_logged:
            self._exhaustion_logged = True
            logger.warning("tenure cache %r: %s; computing without the cache", self._name, error)
        return None

    @contextlib.contextmanager
    def asking(self) -> Iterator[None]:
        """Around a call without a loader that asks the server (``get``, ``set``).

        While the client's outage goes on (``fallback`` on), the call raises
        :class:`~tenure.ServerUnavailableError` at once, the outage's first
        error as its cause; a call that finds the server out of reach starts
        the outage, so the next ones do not spend the client's retries again.
        Each outage met is counted once (``outages``), and its end when a call
        gets through again (``recoveries``).
        """
        outage = self.outage()
        if outage is not None:
            self._counters.met(outage)
            since = time.monotonic() - outage.started
            error = ServerUnavailableError(
                f"the server is out of reach (found {since:.1f} s ago by an earlier call; "
                f"it is asked again every {PROBE_EVERY:g} s, and calls go to it once it answers)",
                name=self._name,
            )
            error.never_sent = True  # (nothing was sent: the same call can be made again)
            raise error from outage.error
        try:
            yield
        except ServerUnavailableError as exc:
            if self.enabled:
                self._counters.met(outage_found(self._client, exc))
            raise
        self._counters.recovered()

    def reached(self) -> None:
        """A fetch got through: an exhausted pool met again is logged again."""
        self._exhaustion_logged = False

    async def fall_back(
        self, loader: Callable[[], Any], outage: AsyncOutage | None, stored: str
    ) -> Any:
        """The loader's value, computed without the cache (``fallback``).

        A value the cache could not store is refused as it would be with the
        server up: the outcome does not depend on the server.
        """
        if outage is not None:
            outage.fallbacks += 1
        self._counters.fell_back(outage)
        value = unwrap_loaded(await call_loader(loader, stored), None)[0]
        self._codec.encode(value)
        return value


async def call_loader(loader: Callable[[], Any], stored: str) -> Any:
    """Call ``stored``'s ``loader`` and return its value (async loaders too, in the async twin).

    The loader runs with ``stored`` marked as loaded here
    (:mod:`tenure._async._cache_reentry`): asking for it again fails at once.
    """
    entered = reentry.enter(stored)
    try:
        value = loader()
        # unasync: async-only
        if inspect.isawaitable(value):
            value = await value
        # unasync: sync-only
        # unasync: end
    finally:
        reentry.leave(entered)
    return value
