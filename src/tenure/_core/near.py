"""Near caching: a cache's entries kept in process memory, dropped when the server says.

A near layer answers a read from memory only while it can prove the answer
is recent: the server tells this process of every write under the cache's
prefix (Redis client-side caching, ``CLIENT TRACKING ... BCAST``, on a
connection of tenure's own: :mod:`tenure._backends.near_tracking`), and that
connection is pinged often. A PING's answer comes after every invalidation
the server sent before it, so once the answer to a PING sent at ``s`` is in,
no write that ended before ``s`` can still be unannounced. A near read at
``t`` is served from memory only if such an answer, for a PING sent at or
after ``t - max_staleness``, is in (:class:`Confirmation`): a value it
returns was replaced, if at all, less than ``max_staleness`` before the read.

This module is the bookkeeping (sans-IO): the settings (:class:`NearCache`),
the entries of one cache with their reads in flight (:class:`NearEntries`),
and the confirmation of a tracking connection. Times are monotonic seconds,
passed in.
"""

from __future__ import annotations

import collections
import contextlib
import math
from dataclasses import dataclass
from typing import Any

from tenure._core.exceptions import ArgumentError

__all__ = ["Confirmation", "Confirmations", "NearCache", "NearEntries", "near_settings"]


TEN_YEARS = 10 * 365 * 86400.0


def _check_range(argument: str, value: object, low: float, high: float) -> None:
    """Refuse anything but a number of seconds from ``low`` to ``high``, in one message."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise ArgumentError(
            argument, f"must be a number of seconds from {low:g} to {high:g}, got {value!r}"
        )


@dataclass(frozen=True)
class NearCache:
    """How a cache keeps entries in this process's memory (``near=``).

    * ``max_entries`` — entries kept per cache object; the least recently
      read goes first.
    * ``max_staleness`` — seconds: no near read returns a value that was
      replaced more than this before the read began. The invalidation
      connection is pinged four times per this; while its answers are late,
      reads go to the server.
    * ``max_age`` — seconds an entry is kept at most, however quiet the
      server (and never past its expiry on the server).
    """

    max_entries: int = 10_000
    max_staleness: float = 0.1
    max_age: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.max_entries, bool) or not isinstance(self.max_entries, int):
            raise ArgumentError("max_entries", f"must be an int, got {self.max_entries!r}")
        if not 1 <= self.max_entries <= 10_000_000:
            raise ArgumentError("max_entries", f"must be 1..10,000,000, got {self.max_entries}")
        _check_range("max_staleness", self.max_staleness, 0.005, 60.0)
        _check_range("max_age", self.max_age, 0.001, TEN_YEARS)

    @property
    def ping_every(self) -> float:
        """Seconds between two pings of the invalidation connection."""
        return self.max_staleness / 4


def near_settings(near: object, name: str) -> NearCache | None:
    """``near=`` as given to a cache: True, False/None, or a :class:`NearCache`."""
    if near is None or near is False:
        return None
    if near is True:
        return NearCache()
    if isinstance(near, NearCache):
        return near
    raise ArgumentError(
        "near", f"must be True, False or a tenure.NearCache, got {near!r}", name=name
    )


class Confirmation:
    """What one tracking connection has proved: since when, and up to when.

    ``epoch`` counts the connection's lives (each reconnection is a new one,
    and entries of an older one are never served); ``up_since`` is when the
    current life began tracking (reads begun earlier may have missed an
    invalidation); ``confirmed`` is the send time of the latest PING whose
    answer came in (every write ended before it was announced).
    """

    __slots__ = ("confirmed", "epoch", "up_since")

    def __init__(self) -> None:
        self.epoch = 0
        self.up_since = math.inf  # not tracking
        self.confirmed = -math.inf

    def began(self, now: float) -> None:
        """A new life: tracking since ``now`` (its subscription confirmed)."""
        self.epoch += 1
        self.up_since = now
        self.confirmed = now

    def ended(self) -> None:
        """The connection was lost: nothing is proved until a new life begins."""
        self.epoch += 1
        self.up_since = math.inf
        self.confirmed = -math.inf

    def answered(self, sent: float) -> None:
        """The answer to a PING sent at ``sent`` came in."""
        if sent > self.confirmed:
            self.confirmed = sent

    def covers(self, now: float, staleness: float) -> bool:
        """Whether a read at ``now`` may be served from memory, ``staleness`` allowed."""
        return now - self.confirmed <= staleness

    @property
    def members(self) -> tuple[Confirmation, ...]:
        """The connections' confirmations this one is made of: itself."""
        return (self,)


class Confirmations:
    """Several connections' confirmations as one: a cluster's, one per primary.

    A read is served from memory only while every primary's connection
    covers it (a key may move to another primary), and its ``epoch``
    changes when any member's does, or when the members change.
    """

    __slots__ = ("_version", "members")

    def __init__(self, members: tuple[Confirmation, ...] = ()) -> None:
        self.members = members
        self._version = 0

    def replace(self, members: tuple[Confirmation, ...]) -> None:
        """The primaries changed: these are the confirmations now."""
        self.members = members
        self._version += 1

    @property
    def epoch(self) -> int:
        """A number that changes whenever a member's life or the members change."""
        return self._version * 1_000_000_000 + sum(m.epoch for m in self.members)

    @property
    def up_since(self) -> float:
        """Since when every member has tracked (``inf``: one does not)."""
        return max((m.up_since for m in self.members), default=math.inf)

    def covers(self, now: float, staleness: float) -> bool:
        """Whether every member covers a read at ``now``."""
        return bool(self.members) and all(m.covers(now, staleness) for m in self.members)


class _Entry:
    __slots__ = ("data", "epoch", "until")

    def __init__(self, data: Any, until: float, epoch: int) -> None:
        self.data = data
        self.until = until
        self.epoch = epoch


class NearEntries:
    """One cache object's entries in memory, and its reads in flight.

    :meth:`begin` before a read goes to the server, :meth:`finish` with its
    answer: the answer is kept only if no invalidation of its key (nor a
    flush) came in meanwhile, so an invalidation that overtakes the reply
    is never undone. Thread-safe: the tracking thread invalidates while the
    cache's callers read: ``mutex`` (a lock of the I/O layer's) guards it.
    """

    def __init__(
        self,
        settings: NearCache,
        confirmation: Confirmation | Confirmations,
        mutex: contextlib.AbstractContextManager[Any] | None = None,
    ) -> None:
        self.settings = settings
        self.confirmation = confirmation
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._mutex = contextlib.nullcontext() if mutex is None else mutex
        self._seq = 0  # invalidations seen while reads were in flight
        self._flushed = 0  # self._seq when everything was last dropped
        self._in_flight: dict[str, int] = {}  # key -> reads of it in flight
        self._invalidated: dict[str, int] = {}  # key in flight -> seq of its last invalidation
        # id(member confirmation) -> (its epoch that tracks us, since when: reads begun
        # earlier may have missed a write's announcement)
        self._tracked: dict[int, tuple[int, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def mark_tracked(self, confirmation: Confirmation, since: float | None = None) -> None:
        """``confirmation``'s connection, in its current life, tracks this cache's prefix.

        Only then are reads kept, and only those begun ``since`` (by default
        since the life began): a connection made before the cache was tracks
        other prefixes, and would announce none of its writes; one that took
        the prefix on later (a handover) announces the writes after that.
        """
        self._tracked[id(confirmation)] = (
            confirmation.epoch,
            confirmation.up_since if since is None else since,
        )

    @property
    def tracked(self) -> bool:
        """Whether every connection's current life tracks this cache's keys."""
        tracked = self._tracked
        return all(
            (found := tracked.get(id(m))) is not None and found[0] == m.epoch
            for m in self.confirmation.members
        )

    def _tracked_since(self) -> float:
        """Reads begun before this may have missed an announcement (see :meth:`mark_tracked`)."""
        tracked = self._tracked
        return max(
            (tracked[id(m)][1] for m in self.confirmation.members if id(m) in tracked),
            default=math.inf,
        )

    def get(self, key: str, now: float) -> tuple[bool, Any]:
        """``(True, data)`` if ``key`` may be answered from memory at ``now``; else no data."""
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        confirmation = self.confirmation
        if (
            entry.epoch != confirmation.epoch
            or now >= entry.until
            or not confirmation.covers(now, self.settings.max_staleness)
        ):
            return False, None
        try:  # (one step of the C OrderedDict: no lock needed against the other threads)
            self._entries.move_to_end(key)
        except KeyError:
            pass  # invalidated meanwhile: this read began before, and is served
        return True, entry.data

    def begin(self, key: str) -> tuple[int, int]:
        """A read of ``key`` goes to the server now: its ticket for :meth:`finish`."""
        with self._mutex:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            return self._seq, self.confirmation.epoch

    def finish(
        self, key: str, ticket: tuple[int, int], began: float, data: Any, until: float
    ) -> None:
        """The read of ``key`` begun at ``began`` answered ``data``, valid until ``until``.

        Kept unless ``key`` was invalidated (or everything dropped) since
        :meth:`begin`, the tracking connection is not the one it began under,
        or it did not yet track when the read began. ``data`` None: nothing
        kept, the read ends.
        """
        seq, epoch = ticket
        settings = self.settings
        with self._mutex:
            count = self._in_flight.get(key, 0) - 1
            overtaken = self._invalidated.get(key, 0) > seq or self._flushed > seq
            if count <= 0:
                self._in_flight.pop(key, None)
                self._invalidated.pop(key, None)
            else:
                self._in_flight[key] = count
            confirmation = self.confirmation
            if (
                data is None
                or overtaken
                or epoch != confirmation.epoch
                or not self.tracked
                or began < confirmation.up_since
                or began < self._tracked_since()
            ):
                return
            until = min(until, began + settings.max_age)
            self._entries[key] = _Entry(data, until, epoch)
            self._entries.move_to_end(key)
            while len(self._entries) > settings.max_entries:
                self._entries.popitem(last=False)

    def forget(self, key: str) -> None:
        """Drop ``key`` (this process wrote or deleted it)."""
        self.invalidate(key)

    def invalidate(self, key: str) -> None:
        """The server announced a write of ``key``."""
        with self._mutex:
            self._entries.pop(key, None)
            if key in self._in_flight:
                self._seq += 1
                self._invalidated[key] = self._seq

    def flush(self) -> None:
        """Drop everything, and the answers of the reads in flight."""
        with self._mutex:
            self._entries.clear()
            self._seq += 1
            self._flushed = self._seq
