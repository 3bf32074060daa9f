"""AsyncHolds: the ownership part of a leased primitive.

Who holds what in this process (one hold per owner, by the rules of
:mod:`tenure._backends.owners`), the counters the statistics report, and
the notice of a hold found lost: ``lost``, ``on_lost``, and the
cancellation of an ``async with`` body that asked for it. The other parts
(:mod:`tenure._async._lease`, :mod:`tenure._async._queue`) record here what
they took and learned; the watchdog's renewals and the owners' threads
share this state under one mutex.
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from tenure._async._rules import AsyncRules
from tenure._async._watchdog import watchdog
from tenure._backends.for_asyncio import (
    Mutex,
    OwnerSlot,
    cancel_holder,
    current_holder,
    dropped_on_loop,
    is_cancellation,
    taken_on_loop,
)
from tenure._backends.telemetry import (
    lock_gave_up,
    lock_held,
    lock_lost_found,
    lock_waited,
    metrics,
)
from tenure._core.leased import (
    Hold,
)
from tenure._core.statistics import (
    Counters,
    LeasedStatistics,
)
from tenure._core.telemetry import ACQUIRED, TIMEOUT

__all__ = ["AsyncHolds"]

logger = logging.getLogger("tenure.lock")

_MUTEX = Mutex()
"""What the watchdog and the owners' threads take to read or change holds and counters:
one for every primitive of the process (each section is a few field updates, and
nothing waits while holding it), so a primitive costs no lock of its own."""


class AsyncHolds(OwnerSlot[Hold], Counters):
    """The holds of one primitive object in this process (one per owner), and its counters.

    It is the primitive's owner slot (:mod:`tenure._backends.owners`): ``get``,
    ``set``, ``holds`` and ``clear`` are the slot's, per owner.
    """

    def __init__(
        self,
        rules: AsyncRules,
        primitive: object,
        *,
        per_owner: bool,
        on_lost: Callable[[Any], None] | None,
        cancel_on_lost: bool,
    ) -> None:
        self._rules = rules
        self.primitive = weakref.ref(primitive)
        """The primitive (weak: renewals reach the holds, and must not keep it alive)."""
        self.kind = type(primitive).__name__
        """The primitive's class name, for messages."""
        self.subject = rules.subject
        """Who its metrics are about."""
        OwnerSlot.__init__(self, per_owner=per_owner)
        self.mutex = _MUTEX
        self.on_lost = on_lost
        self.cancel_on_lost = cancel_on_lost
        self.forgetting: Callable[[Hold], None] | None = None
        """Told of each hold forgotten (Redlock stops keeping its late grants)."""

    def current(self) -> Hold | None:
        """The current owner's hold (adopting one its finished owner left), or None."""
        return self.get()

    def peek(self) -> Hold | None:
        """The current owner's hold, without adopting one; or None."""
        return self.get(adopt=False)

    def record(self, hold: Hold, contended: bool) -> None:
        """Make ``hold``, just taken, the current owner's (the mutex held)."""
        self.track(hold)
        self.record_acquired(hold.waited, contended=contended)
        if (recorder := metrics()) is not None:
            recorder.lock_wait(self.subject, hold.waited, ACQUIRED)

    def track(self, hold: Hold) -> None:
        """Make ``hold`` the current owner's (the mutex held)."""
        self.set(hold)
        hold.loop_thread = taken_on_loop(self._rules.keys.owner)

    def renewed(self, ok: bool) -> None:
        """Count a renewal of a hold (``ok``), or one that failed (an error, the hold gone)."""
        if ok:
            self.renewals += 1
        if (recorder := metrics()) is not None:
            recorder.lock_renewal(self.subject, ok)

    def add_waiter(self, count: int) -> None:
        """Count a waiter in line (``count`` 1) or out of it (-1)."""
        with self.mutex:
            self.waiters += count

    def timed_out(self, started: float) -> bool:
        """Count a waiter that gave up at its deadline; False, what ``acquire()`` returns.

        ``started``: when its acquire was called (monotonic).
        """
        with self.mutex:
            self.timeouts += 1
        lock_waited(self.subject, started, TIMEOUT)
        return False

    def gave_up(self, started: float, exc: BaseException) -> None:
        """Tell the metrics of an acquire that ended with ``exc`` (cancelled, or an error)."""
        lock_gave_up(self.subject, started, exc, is_cancellation(exc))

    # -- redis-py's local.token -----------------------------------------------------

    def current_token(self) -> str | None:
        """The current owner's token, or None."""
        hold = self.get()
        return None if hold is None else hold.token

    def take_token(self, value: bytes | str | None) -> None:
        """Make the current owner's hold the one with token ``value`` (None: none)."""
        held = self.get(adopt=False)
        if value is None:
            if held is not None:
                self.forget(held)
            return
        token = self._rules.checked_token(value)
        if held is not None:
            if held.token == token:
                return
            self.forget(held)  # this object no longer tracks it (nor renews it)
        now = time.monotonic()
        hold = Hold(
            token=token, fence=0, acquired_at=now, expires_at=math.inf, holder=current_holder()
        )
        with self.mutex:
            self.set(hold)

    # -- ending holds -------------------------------------------------------------

    def mark_lost(self, hold: Hold, why: str = "it was lost while held") -> None:
        """Record that ``hold`` was lost while held (only a live hold, once), and tell."""
        with self.mutex:
            if hold.lost or not self.holds(hold):
                return
            hold.lost = True
            self.lost += 1
        lock_lost_found(self.subject)
        rules = self._rules
        logger.warning("tenure: %s %r: %s (fence %s)", rules.noun, rules.name, why, hold.fence)
        if self.cancel_on_lost and hold.guarded:
            cancel_holder(hold.holder)
        primitive = self.primitive()
        if self.on_lost is not None and primitive is not None:
            self.on_lost(primitive)

    def found_gone(self, hold: Hold) -> None:
        """A release found ``hold`` gone: count it lost (without telling: the caller raises)."""
        with self.mutex:
            if hold.lost:
                return
            hold.lost = True
            self.lost += 1
        lock_lost_found(self.subject)

    def forget(self, hold: Hold) -> None:
        """Stop tracking (and renewing) ``hold``."""
        if self.forgetting is not None:
            self.forgetting(hold)
        with self.mutex:
            if hold.renewal is not None:
                watchdog().cancel(hold.renewal)
                hold.renewal = None
            if hold.loop_thread:
                dropped_on_loop(hold.loop_thread, self._rules.keys.owner)
                hold.loop_thread = 0
            self.clear(hold)

    def leave_inner(self, hold: Hold) -> bool:
        """An inner release of a re-entered hold: count it down; whether it was one."""
        if hold.count <= 1:  # the usual case (only the owner changes the count)
            return False
        with self.mutex:
            inner = hold.count > 1 and not hold.lost
            if inner:
                hold.count -= 1  # the outer hold goes on
        return inner

    def released(self, hold: Hold) -> None:
        """Count ``hold``'s release."""
        with self.mutex:
            self.record_released(hold)
        lock_held(self.subject, hold.acquired_at)

    # -- reporting --------------------------------------------------------------

    def statistics(self) -> LeasedStatistics:
        """An immutable snapshot of the counters and the current hold."""
        hold = self.get(adopt=False)
        with self.mutex:
            counters = asdict(self)
        rules = self._rules
        return rules.statistics_type(
            name=rules.name,
            held=hold is not None and not hold.lost,
            fencing_token=None if hold is None or not hold.fence else hold.fence,
            **counters,
            **rules.statistics_extra(),
        )

    def describe(self) -> str:
        """The current hold, as ``repr()`` shows it."""
        hold = self.get(adopt=False)
        if hold is None:
            return "not held"
        if hold.lost:
            return f"LOST fence={hold.fence}"
        if not hold.fence:
            return "held by a token taken over (local.token)"
        left = max(0.0, hold.expires_at - time.monotonic())
        state = f"held fence={hold.fence} lease~{left:.1f}s"
        if hold.count > 1:
            state += f" count={hold.count}"
        return state
