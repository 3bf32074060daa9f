"""The counters a leased primitive keeps, and the statistics records it reports.

Each primitive object counts in this process only (acquisitions, waits,
holds, renewals, losses); ``statistics()`` returns an immutable snapshot of
one of these records, a subclass per kind with the kind's own fields.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tenure._core.leased import Hold

__all__ = [
    "ClusterLockStatistics",
    "Counters",
    "LeasedStatistics",
    "LockStatistics",
    "ReadWriteStatistics",
    "SemaphoreStatistics",
]


@dataclass(kw_only=True, eq=False)
class Counters:
    """What one lock object has counted (this process only); times in seconds.

    ``contended`` counts acquisitions that had to wait; ``timeouts`` counts
    acquire calls that gave up; ``lost`` counts holds that were lost while
    held; ``waiters`` is how many of this object's acquisitions wait now.

    A primitive's holds count (they subclass it): until a field is first
    counted it is the class's default, so an object costs no record of its own.
    """

    acquisitions: int = 0
    contended: int = 0
    timeouts: int = 0
    releases: int = 0
    lost: int = 0
    renewals: int = 0
    wait_total: float = 0.0
    wait_max: float = 0.0
    hold_total: float = 0.0
    hold_max: float = 0.0
    waiters: int = 0

    def record_acquired(self, waited: float, contended: bool) -> None:
        """Count one acquisition that waited ``waited`` seconds."""
        self.acquisitions += 1
        self.contended += int(contended)
        self.wait_total += waited
        self.wait_max = max(self.wait_max, waited)

    def record_released(self, hold: Hold) -> None:
        """Count one release of ``hold``."""
        held_for = time.monotonic() - hold.acquired_at
        self.releases += 1
        self.hold_total += held_for
        self.hold_max = max(self.hold_max, held_for)


@dataclass(frozen=True, kw_only=True)
class LeasedStatistics:
    """A snapshot of one primitive object's counters (this process only), immutable.

    Times are in seconds. ``contended`` counts acquisitions that had to wait;
    ``timeouts`` counts acquire calls that gave up; ``lost`` counts holds that
    were lost while held; ``waiters`` is how many of this object's
    acquisitions wait now. ``held`` and ``fencing_token`` describe the calling
    thread's (or task's) hold.
    """

    name: str
    held: bool
    fencing_token: int | None
    acquisitions: int
    contended: int
    timeouts: int
    releases: int
    lost: int
    renewals: int
    wait_total: float
    wait_max: float
    hold_total: float
    hold_max: float
    waiters: int


@dataclass(frozen=True, kw_only=True)
class LockStatistics(LeasedStatistics):
    """A lock's statistics (:meth:`tenure.Lock.statistics`)."""


@dataclass(frozen=True, kw_only=True)
class ClusterLockStatistics(LockStatistics):
    """A :class:`~tenure.ClusterLock`'s statistics, with its last acknowledgement.

    ``required_replicas`` / ``acknowledged_replicas`` describe the last write
    that waited (None before the first); ``shortfalls`` counts the writes
    whose acknowledgements fell short (refused acquisitions, retried renewals).
    """

    required_replicas: int | None
    acknowledged_replicas: int | None
    shortfalls: int


@dataclass(frozen=True, kw_only=True)
class SemaphoreStatistics(LeasedStatistics):
    """A semaphore's statistics, with the limit this object knows."""

    limit: int


@dataclass(frozen=True, kw_only=True)
class ReadWriteStatistics(LeasedStatistics):
    """One side of a read-write lock: ``mode`` is ``"read"`` or ``"write"``."""

    mode: str
