"""AsyncLease: the lease part of a leased primitive — taking, renewing, extending holds.

A hold is a lease on the server's clock. This part turns a script's grant
into a hold (with a conservative local expiry, measured from before the
call was sent), schedules its renewals on the watchdog
(:mod:`tenure._async._watchdog`), reads their outcome (renewed, failed and
retried, or lost), and sets or extends the lease on request (``extend``,
``reacquire``, re-entry, the confirmation of a handed-over hold).

* ``timeout=None`` means "held until released": a 30 s lease renewed every
  10 s, so a crashed holder frees it within 30 s. A hold handed over on the
  short handoff lease is confirmed at a third of it, as a renewal.
* Renewals hold only weak references to the primitive object: a hold whose
  object was garbage-collected (nobody can release it any more) is not
  renewed and ends with its lease.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from tenure._async._holds import AsyncHolds
from tenure._async._rules import AsyncRules, extended
from tenure._async._watchdog import Deferred, Job, watchdog
from tenure._backends.for_asyncio import shielded
from tenure._core.leased import (
    RENEW_AT,
    RENEW_RETRY,
    RENEW_RETRY_MIN,
    Acquired,
    Acquiring,
    Hold,
)
from tenure._core.values import to_ms

__all__ = ["AsyncLease"]

logger = logging.getLogger("tenure.lock")

ENDING_MS = 1
"""The lease the call at the end of ``max_hold`` leaves: the hold ends as the holder is told."""


class AsyncLease:
    """Takes, renews and extends the holds of one primitive object."""

    def __init__(self, rules: AsyncRules, holds: AsyncHolds) -> None:
        self._rules = rules
        self._holds = holds

    def took(self, acquiring: Acquiring, answer: Acquired, sent: float, call: str = "") -> None:
        """Record the hold ``acquiring`` took (its lease set by a call sent at ``sent``).

        ``call``: a Redlock's acquire call id (its masters' fences differ), kept on the hold.
        """
        now = time.monotonic()
        hold = Hold(
            call=call,
            token=acquiring.token,
            fence=answer.fence,
            acquired_at=now,
            expires_at=sent + answer.lease_ms / 1000,
            holder=acquiring.holder,
            waited=now - acquiring.started,
        )
        settings = self._rules.settings
        with self._holds.mutex:
            self._holds.record(hold, contended=acquiring.queued)
            if answer.lease_ms < settings.lease_ms:
                # Handed over on a short lease: confirm the full lease at a third
                # of it. A short hold is released before then and never pays.
                self._schedule(hold, sent + answer.lease_ms / 1000 * RENEW_AT)
            elif settings.max_hold is not None:
                self._schedule(hold, sent + settings.lease * RENEW_AT)
            elif settings.auto_renew:
                self._defer(hold, sent + settings.lease * RENEW_AT, now)

    def ran_out(self, hold: Hold) -> bool:
        """Whether ``hold``'s lease ran out: a fixed lease (or one past ``max_hold``) ended.

        A lease the watchdog renews for ever is not judged here: its renewal
        tells when it is lost.
        """
        settings = self._rules.settings
        if settings.auto_renew and settings.max_hold is None:
            return False
        return time.monotonic() >= hold.expires_at

    # -- setting the lease on request ---------------------------------------------

    async def set(self, hold: Hold, ms: int, mode: str) -> bool:
        """Set (``mode`` "set") or add ``ms`` to ("add") the lease of ``hold``; raise if lost."""
        rules = self._rules
        sent = time.monotonic()
        keys, args = rules.extend_call(hold.token, ms, mode, hold.fence, hold.call)
        reply = int(await rules.run_taking(rules.scripts.extend, keys, args, extended))
        if reply <= 0:
            self._holds.mark_lost(hold)
            raise rules.refused(f"the {rules.noun} is no longer held by this owner")
        with self._holds.mutex:
            hold.expires_at = sent + reply / 1000
            self._end_later(hold)
        return True

    async def reenter(self, hold: Hold) -> bool:
        """Enter a hold again: the count is kept here; the server checks the hold, resets its lease.

        Nothing is counted on the server, so a resent call, a cancelled one or
        one whose replicas fell short leaves nothing to take back.
        """
        rules = self._rules
        sent = time.monotonic()
        answer = await shielded(rules.reenter_now(hold.token))
        # Another fence: the token's hold is another acquisition's (a second owner
        # that chose the token took it after this hold's lease ran out).
        if answer is None or (hold.fence and answer.fence != hold.fence):
            self._holds.mark_lost(hold)
            raise rules.refused(f"re-entry found the {rules.noun} lost")
        with self._holds.mutex:
            hold.count += 1
            hold.expires_at = sent + answer.lease_ms / 1000
            self._end_later(hold)
        return True

    async def confirm_grant(
        self, token: str, granted: Acquired, at: float
    ) -> tuple[Acquired, float] | None:
        """Make a hold handed over by another's release (at ``at``) this owner's own.

        Returns the hold's answer and when its lease started, or None if it
        lapsed first. A hold handed over on the short handoff lease is
        confirmed now, in one round trip, before ``acquire()`` returns: a new
        owner that is busy (or stopped) right after would otherwise lose it
        when that short lease ran out, while a waiter that died at its turn
        still stalls the line no longer than the handoff lease. A hold taken
        by the waiter's own call already has the full lease. Replica-acknowledged
        kinds confirm every grant.
        """
        rules = self._rules
        # A full lease heard within the first third of it is trusted as it is;
        # one heard later (at = -inf: granted before this waiter's last call,
        # which found it gone, so it lapsed meanwhile) is confirmed first.
        heard_in_time = at + granted.lease_ms / 1000 * RENEW_AT > time.monotonic()
        if (
            not rules.confirm_every_grant
            and granted.lease_ms >= rules.settings.lease_ms
            and heard_in_time
        ):
            return granted, at
        sent = time.monotonic()
        confirmed = await rules.confirm_now(token, granted)
        return None if confirmed is None else (confirmed, sent)

    def resume(self, hold: Hold, renewal: Job | Deferred | None) -> None:
        """Track ``hold`` again after a release that never left the client.

        It is renewed from where its last renewal job (``renewal``, None if it
        had none) stood, so the watchdog keeps it until it is released.
        Nothing is resumed if this owner took another hold meanwhile.
        """
        with self._holds.mutex:
            if self._holds.peek() is not None:
                return
            self._holds.track(hold)
            if renewal is not None:
                self._schedule(hold, renewal.due)  # at once if it fell due meanwhile

    # -- renewal -----------------------------------------------------------------

    def _defer(self, hold: Hold, due: float, now: float) -> None:
        """Plan ``hold``'s first renewal (due at ``due``) only once its window opens.

        Most holds are released long before: they never cost a job. The
        window opens halfway to ``due``, as a planned job's slack would (the
        mutex held).
        """
        bucket = self._rules.settings.lease_ms
        hold.renewal = watchdog().defer(
            Deferred(bucket, due, now + (due - now) / 2, self._start_deferred, hold)
        )

    def _start_deferred(self, deferred: Deferred) -> None:
        """A deferred renewal's window opened: plan it, if its hold is still held."""
        hold = deferred.hold
        with self._holds.mutex:
            if hold.renewal is deferred and self._holds.holds(hold):
                self._schedule(hold, deferred.due)

    def _schedule(self, hold: Hold, due: float) -> None:
        ms, due = self._plan(hold, self._renewal_ms(hold), due)
        # (weak: the object nobody holds any more is not renewed)
        primitive = self._holds.primitive
        kind = self._holds.kind
        lease = self

        def wanted() -> bool:
            if primitive() is not None:
                return True
            logger.warning(
                "tenure: a %s of %r was garbage-collected while held; it ends with its lease",
                kind,
                job.name,
            )
            return False

        def on_result(reply: Any, error: BaseException | None) -> float | None:
            if primitive() is None:
                return None
            return lease._renewed(hold, job, reply, error)

        rules = self._rules
        keys, args = rules.extend_call(hold.token, ms, "set", hold.fence, hold.call)
        job = Job(
            due=due,
            client=rules.client,
            script=rules.scripts.extend,
            keys=keys,
            args=args,
            on_result=on_result,
            name=rules.name,
            slack=0.0 if hold.ending else (due - time.monotonic()) / 2,
            runner=rules.renewal_runner(hold),
            wanted=wanted,
        )
        hold.renewal = watchdog().schedule(job)

    def _end_later(self, hold: Hold) -> None:
        """A lease set on request past ``max_hold``: its end (and the tell) moves with it."""
        if hold.ending and hold.renewal is not None:
            watchdog().replan(hold.renewal, hold.expires_at)

    def _plan(self, hold: Hold, ms: int | None, due: float) -> tuple[int, float]:
        """The next call's lease and when it is due.

        A renewal of ``ms`` at ``due`` or, when no renewal comes before ``max_hold``
        ends (``ms`` None: used up), one last call at its end that ends the lease on
        the server and tells the holder.
        """
        end = self._max_hold_end(hold)
        if ms is not None and due < end:
            return ms, due
        hold.ending = True
        return ENDING_MS, min(hold.expires_at, end)

    def _max_hold_end(self, hold: Hold) -> float:
        """When ``max_hold`` ends ``hold`` (monotonic; infinity without one)."""
        max_hold = self._rules.settings.max_hold
        return math.inf if max_hold is None else hold.acquired_at + max_hold

    def _renewal_ms(self, hold: Hold) -> int | None:
        """The lease the next renewal sets, or None once ``max_hold`` is used up."""
        lease_ms = self._rules.settings.lease_ms
        end = self._max_hold_end(hold)
        if end == math.inf:
            return lease_ms
        left = end - time.monotonic()
        if left <= 0:
            return None
        return min(lease_ms, to_ms(left))

    def _renewed(
        self, hold: Hold, job: Job, reply: Any, error: BaseException | None
    ) -> float | None:
        """Handle a renewal's outcome; return when the next one is due (or None)."""
        holds = self._holds
        with holds.mutex:
            if not holds.holds(hold) or hold.renewal is not job:
                return None  # released (or replaced) while the renewal was in flight
            if job.args[0] != hold.token:
                # The hold changed its token while the renewal was in flight (a
                # write lock downgraded): renew under the new token now.
                ms = int(job.args[1])
                call = self._rules.extend_call(hold.token, ms, "set", hold.fence, hold.call)
                job.args = call[1]
                return time.monotonic()
            ending = hold.ending
            if not ending:
                next_due, lost = self._next_renewal(hold, job, reply, error)
        if ending:
            max_hold = self._rules.settings.max_hold
            holds.mark_lost(hold, f"its max_hold of {max_hold:g}s ran out")
            return None
        if lost:
            holds.mark_lost(hold)
        return next_due

    def _next_renewal(
        self, hold: Hold, job: Job, reply: Any, error: BaseException | None
    ) -> tuple[float | None, bool]:
        """When the next renewal is due (None: no more), and whether the hold was lost."""
        now = time.monotonic()
        rules = self._rules
        settings = rules.settings
        if error is not None:
            self._holds.renewed(False)
            if now >= hold.expires_at:
                return None, True
            logger.warning("tenure: renewing %r failed, retrying: %s", rules.name, error)
            retry = max(RENEW_RETRY_MIN, settings.lease * RENEW_RETRY)
            return min(hold.expires_at, now + retry), False
        granted_ms = int(reply)
        if granted_ms <= 0:
            self._holds.renewed(False)
            return None, True
        self._holds.renewed(True)
        # The job was sent no earlier than it was due: a conservative expiry.
        hold.expires_at = job.due + granted_ms / 1000
        if not settings.auto_renew and settings.max_hold is None:
            return None, False
        ms = self._renewal_ms(hold)
        # Due within the lease just granted: ``timeout`` set longer meanwhile is
        # set by the next renewal, which must come before the old lease ends.
        call_ms, next_due = self._plan(hold, ms, now + min(ms or 0, granted_ms) / 1000 * RENEW_AT)
        job.args = rules.extend_call(hold.token, call_ms, "set", hold.fence, hold.call)[1]
        if hold.ending:
            job.slack = 0.0  # the end is on time, not batched with other renewals
        return next_due, False
