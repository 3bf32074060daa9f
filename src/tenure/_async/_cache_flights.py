"""The herd cache's requests in flight: callers of one entry in this process share one.

The first caller of an entry in this process (or event loop) asks the
server; callers that come while it does wait for its answer instead of
asking too (one connection, not one each), and count as ``shared``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenure._backends.for_asyncio import Event, Mutex, scope_key
from tenure._core.cache import CacheCounters

__all__ = ["ABANDONED", "AsyncFlights"]

ABANDONED = object()
"""What a follower gets when its leader was cancelled or interrupted: ask again."""


class _Flight:
    """One request for an entry in this process, shared by every caller of it.

    Its event is made only when a second caller joins (under the flights'
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


class AsyncFlights:
    """One cache's requests in flight, by event loop and entry."""

    def __init__(self, counters: CacheCounters) -> None:
        self._counters = counters
        self._flights: dict[tuple[object, str], _Flight] = {}
        self._mutex = Mutex()

    async def share(self, stored: str, lead: Callable[..., Any], *args: Any) -> Any:
        """``lead(*args)``'s value, run by the first caller of ``stored``, shared with the rest.

        A caller that joins gets the leader's value or its error, or
        :data:`ABANDONED` if the leader was cancelled (that is not its own).
        """
        flight_key = (scope_key(), stored)
        mine = _Flight()
        flight = self._flights.setdefault(flight_key, mine)  # atomic: one leader
        if flight is not mine:
            with self._mutex:  # followers share one event, made by the first of them
                if flight.event is None:
                    flight.event = Event()
                event = flight.event
            self._counters.add("shared")
            # The leader marks the flight finished before it looks for an event
            # to set, and a follower makes the event before it looks at finished:
            # one of them sees the other.
            while not flight.finished and not await event.wait(3600.0):
                pass
            if flight.abandoned:  # its caller's cancellation is not this caller's
                return ABANDONED
            if flight.error is not None:
                raise flight.error
            return flight.value
        try:
            flight.value = await lead(*args)
        except Exception as exc:
            flight.error = exc
            raise
        except BaseException:
            flight.abandoned = True
            raise
        finally:
            self._flights.pop(flight_key, None)
            flight.finished = True
            with self._mutex:
                waiting = flight.event
            if waiting is not None:
                waiting.set()
        return flight.value
