"""A server found out of reach, and the probe that finds it again (the caches' fallback).

A cache with ``fallback`` computes without the server while it is out of
reach. Left to the client, every such call would first spend the client's own
retries (redis-py's default ``Retry`` makes a call to a dead server take
seconds), call after call. Here, once one call finds the server out of reach,
an outage is recorded for its client in this process (or event loop): the
caches of that client go straight to their loaders, and one background probe
asks the server (``PING`` on a connection of its own, short timeouts, no
retries) every :data:`PROBE_EVERY` seconds until it answers; then the outage
ends. Each outage is logged once when it starts and once when it ends
(logger ``tenure.cache``).

Only an outage going on is kept: ended ones are forgotten.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

from tenure._async._wakeups import own_settings, server_target
from tenure._backends.for_asyncio import Mutex, scope_key, sleep, start_background

__all__ = ["PROBE_EVERY", "PROBE_TIMEOUT", "AsyncOutage", "outage_found", "outage_of"]

logger = logging.getLogger("tenure.cache")

PROBE_EVERY = 0.25
"""Seconds between two probes of a server out of reach."""

PROBE_TIMEOUT = 0.25
"""Seconds a probe waits to connect, and then for the server's answer."""


class AsyncOutage:
    """One client's server out of reach, from when a call found it until a probe reaches it."""

    def __init__(self, client: Any, error: BaseException) -> None:
        _, self._connect, self.server = server_target(client, _probe_settings)
        self.started = time.monotonic()
        self.error = error
        self.ended = False
        self.fallbacks = 0  # calls answered without the server meanwhile (for the log)
        self._job: Any = None  # the probe, referenced while it runs

    async def _probe(self, forget: Callable[[], None], client: Callable[[], Any]) -> None:
        try:
            while True:
                await sleep(PROBE_EVERY)
                if client() is None:
                    return  # the client is gone: nobody to tell
                if await self._answers():
                    break
        finally:
            self.ended = True
            forget()
        logger.warning(
            "tenure: the server %s answers again, %.1f s after it was found out of reach "
            "(%d call(s) computed without the cache meanwhile); caches use it again",
            self.server,
            time.monotonic() - self.started,
            self.fallbacks,
        )

    async def _answers(self) -> bool:
        try:
            conn = self._connect()
        except Exception:  # a cluster client without nodes: out of reach still
            return False
        try:
            await conn.connect()
            await conn.send_command("PING")
            await conn.read_response()
        except Exception:
            return False
        finally:
            with contextlib.suppress(Exception):
                await conn.disconnect()
        return True


def _probe_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The user's connection settings, for a probe: short timeouts, no retries."""
    kwargs = own_settings(settings)
    kwargs.update(
        socket_timeout=PROBE_TIMEOUT,
        socket_connect_timeout=PROBE_TIMEOUT,
        socket_keepalive=False,
        retry=None,
        retry_on_timeout=False,
    )
    kwargs.pop("retry_on_error", None)
    return kwargs


_outages: weakref.WeakKeyDictionary[Any, dict[object, AsyncOutage]] = weakref.WeakKeyDictionary()
_outages_mutex = Mutex()


def outage_of(client: Any) -> AsyncOutage | None:
    """The outage of ``client``'s server going on in this process (or event loop), or None."""
    if not _outages:  # the common case, asked at every cache fetch
        return None
    found = _outages.get(client)
    return None if found is None else found.get(scope_key())


def outage_found(client: Any, error: BaseException) -> AsyncOutage:
    """A call found ``client``'s server out of reach (``error``): the outage going on.

    The first call to find it starts the outage: logged, and probed in the
    background until the server answers.
    """
    scope = scope_key()
    with _outages_mutex:
        per_scope = _outages.setdefault(client, {})
        outage = per_scope.get(scope)
        if outage is not None:
            return outage
        outage = per_scope[scope] = AsyncOutage(client, error)
    logger.warning(
        "tenure: the server %s is out of reach (%s); caches with fallback compute without "
        "it until it answers again (asked every %.2f s)",
        outage.server,
        error,
        PROBE_EVERY,
    )
    owner = weakref.ref(client)

    def forget() -> None:
        with _outages_mutex:
            found = owner()
            per = None if found is None else _outages.get(found)
            if per is not None and per.get(scope) is outage:
                del per[scope]
                if not per:
                    del _outages[found]

    outage._job = start_background(lambda: outage._probe(forget, owner), "tenure-outage-probe")
    return outage
