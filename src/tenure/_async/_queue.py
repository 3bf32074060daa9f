"""AsyncQueue: the waiting part of a leased primitive — the fast path and the FIFO line.

How it works (each step is one atomic Lua script, see ``tenure/lua``):

* **acquire** takes the primitive when it is free and nobody waits, in one
  round trip, and returns a fencing token (a counter that only grows).
  Otherwise the caller joins a FIFO queue with a short waiter lease and
  waits in memory: no sleep loop, and none of the user's connections is
  taken.
* **release** hands it straight to the first live waiter inside the script
  (so no newcomer can barge in) and publishes the grant on the channel of
  that waiter's process; its one subscriber connection per server
  (:mod:`tenure._async._wakeups`) hands it to the waiting thread or task,
  so the next waiter learns of the release within about one round trip.
  The handed-over lease is short (``handoff_lease``, 1 s) until the new
  owner confirms its full lease (:mod:`tenure._async._lease`), so a waiter
  that died just before its turn delays the queue by at most that.
* A waiter refreshes its place every ``waiter_lease / 2`` (1 s); a waiter
  that died is dropped from the queue within ``waiter_lease`` (2 s). The
  waiters of one process for one name share a line
  (:mod:`tenure._async._line`) that joins, refreshes and re-checks for all
  of them at once. A waiter that gives up (timeout, cancellation, error)
  leaves the queue at once and passes on what was handed to it meanwhile.
* Waiters also wake on their own timers: at their deadline, when the
  owner's lease runs out (a crashed owner), and to refresh their place,
  when they re-check with the server (so a lost wake-up message costs at
  most that interval, never the lock).
* Cancelling or interrupting ``acquire`` at any point leaves no hold
  without a local owner: each script call runs to its reply, and whatever
  it took is given back before the cancellation goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from tenure._async._deadline import GRACE, Overdue, answered, by_deadline, ignore_late, room_left
from tenure._async._holds import AsyncHolds
from tenure._async._lease import AsyncLease
from tenure._async._line import (
    AsyncLine,
    begin_try,
    end_try,
    line_for,
    start_waiting,
    stop_waiting,
)
from tenure._async._rules import AsyncRules
from tenure._async._wakeups import AsyncWaiter, listen
from tenure._backends.for_asyncio import (
    before_waiting,
    current_holder,
    race,
    shielded,
    start_background,
)
from tenure._backends.tracing import AcquireSpan
from tenure._core.exceptions import BackendError, PrimitiveError
from tenure._core.leased import (
    Acquired,
    Acquiring,
)

__all__ = ["AsyncQueue"]

logger = logging.getLogger("tenure.lock")

LEAVE_PATIENCE = 2.0
"""Seconds, at most, a cancelled or interrupted waiter waits for its line's round to
tell the server it left (passing on what was handed to it) before it goes on."""


def _giving_back(rules: AsyncRules, token: str, attempt: str) -> Callable[[int, Any], None]:
    """A late call's handler: give back whatever it took for ``token``, in the background."""

    def give_back_later(index: int, outcome: object) -> None:
        async def give_back() -> None:
            await rules.leave_quietly(token, quiet=True, attempt=attempt)

        start_background(give_back, "tenure-give-back")

    return give_back_later


class AsyncQueue:
    """Acquires for one primitive object: the fast path, then the line."""

    def __init__(self, rules: AsyncRules, holds: AsyncHolds, lease: AsyncLease) -> None:
        self._rules = rules
        self._holds = holds
        self._lease = lease
        self.seen_busy = False  # the last acquire had to wait: skip the fast path

    async def acquire(
        self, wait: bool, blocking_timeout: float | None, token: str, attempt: str = ""
    ) -> bool:
        """Take it for ``token``: at once if free, else in line until ``blocking_timeout``.

        ``attempt``: the call's id when the caller chose ``token`` (``""``: random).
        """
        started = time.monotonic()
        deadline = None if blocking_timeout is None else started + blocking_timeout
        call = Acquiring(token, attempt, started, deadline, current_holder())
        trying = self._may_try(wait)
        # An acquirer allowed to try is counted as this process's first waiter
        # (begin_try); the joins of those who came after it wait until it is
        # in line (end_try), so it stays ahead of them.
        tried = trying if isinstance(trying, tuple) else None
        counted = tried
        in_line = False  # the process's line takes the token out of line if this fails
        try:
            if trying is not False:
                # Free and nobody waiting: one round trip. Skipped while this
                # object keeps finding it busy, or this process's waiters for
                # it are in line (or one of them is trying), where it would be
                # wasted.
                sent = time.monotonic()
                rules = self._rules
                keys, args = rules.try_call(token, attempt)
                if deadline is None or not wait:  # the call runs to its reply
                    reply = await shielded(
                        rules.run_taking(rules.scripts.try_, keys, args, rules.took_on_try)
                    )
                else:
                    reply = await self._by(
                        call,
                        rules.run_taking,
                        rules.scripts.try_,
                        keys,
                        args,
                        rules.took_on_try,
                    )
                fence = rules.parse_try(reply)
                if fence > 0:
                    taken = Acquired(fence=fence, lease_ms=rules.settings.lease_ms)
                    self._lease.took(call, taken, sent)
                    self.seen_busy = False
                    return True
                if not wait:
                    return False
            before_waiting(self._holds.kind, self._rules.keys.owner, self._rules.name)
            if counted is None:
                counted = start_waiting(self._rules.registry, self._rules.keys.owner)
            in_line = True
            with AcquireSpan(self._holds.subject, started) as traced:
                traced.queued()
                got = await self._wait_in_line(call, tried)
                return traced.ended(got, self._holds.peek())
        except Overdue:
            # Given back in the background when the server answers.
            logger.warning(
                "tenure: %s %r: the server did not answer by the deadline of acquire() "
                "(blocking_timeout=%s, and %ss more): not acquired; what the call took "
                "is given back when it answers",
                self._rules.noun,
                self._rules.name,
                blocking_timeout,
                GRACE,
            )
            return self._holds.timed_out(started)
        except BaseException as exc:
            self._holds.gave_up(started, exc)
            # Cancelled, interrupted or failed after a script may have taken it
            # (or queued us) for this token: give back whatever it did. (A call
            # that never left the client, its server refusing the connection,
            # took nothing: no give-back, which would spend the client's
            # retries a second time.)
            never_sent = isinstance(exc, BackendError) and exc.never_sent
            if not isinstance(exc, PrimitiveError) and not in_line and not never_sent:
                quiet = isinstance(exc, BackendError)
                leave = partial(self._rules.leave_quietly, token, quiet=quiet, attempt=attempt)
                if deadline is None:
                    await shielded(leave())
                else:  # by the deadline: a leave the server does not answer goes on alone
                    await race(
                        [leave], room_left(deadline), answered, ignore_late, [self._rules.client]
                    )
            raise
        finally:
            if tried is not None:  # counted as this process's first waiter: one pass
                end_try(tried, stop=True)
            elif counted is not None:
                stop_waiting(counted)

    async def _wait_in_line(self, call: Acquiring, tried: tuple[object, ...] | None) -> bool:
        """Wait in this process's line for the lock (:mod:`tenure._async._line`).

        The line joins, refreshes and re-checks for every waiter of the process
        at once; this waiter only waits for its grant (on the wake-up channel,
        or named by a round's answer), or its deadline. ``tried``: this
        acquirer's try held back the joins of those who came after it
        (:func:`begin_try`): it joins ahead of them, then lets them go.
        """
        # The line waits for the wake-up subscription before it joins anyone.
        deadline = call.deadline
        waiter = await listen(
            self._rules.client, call.token, 0.0, self._rules.keys.owner, confirm=False
        )
        waiter.attempt = call.attempt
        line = self._line(waiter.channel)
        while not line.join(waiter, self._rules.owner_name, first=tried is not None):
            line = self._line(waiter.channel)  # it closed just now: a new one
        if tried is not None:
            end_try(tried)  # in line: the joins behind it may go
        self.seen_busy = True
        call.queued = True
        self._holds.add_waiter(1)
        left = True  # False: the line takes it out of the queue
        interrupted = False  # cancelled, interrupted or failed: waits for its leave to be heard
        try:
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    kept = await self._give_up_in_line(line, waiter, call)
                    if kept is None:
                        # No answer by the deadline: the line takes it out of
                        # the queue with its next rounds, passing on any grant.
                        left = False
                        return self._holds.timed_out(call.started)
                    return kept
                granted = await waiter.wait(None if deadline is None else deadline - now)
                if granted is None:
                    if waiter.recheck:
                        # Woken to re-check (the wake-up connection came back: a
                        # grant may have gone out unheard, and lapsed): join again,
                        # which keeps the place of a waiter still in line.
                        waiter.recheck = False
                        line.join(waiter, self._rules.owner_name)
                    continue
                if not await self._take_granted(call, granted, line.local_time(granted)):
                    line.join(waiter, self._rules.owner_name)  # the handoff lapsed: in line again
                    continue
                return True
        except BaseException:
            # Out of line through the line itself: after its join (which may
            # still be on its way), passing on what was handed to it; the
            # cancellation (or interrupt) goes on once the server heard it.
            left, interrupted = False, True
            raise
        finally:
            waiter.stop()
            told = line.done(waiter, left=left)
            self._holds.add_waiter(-1)
            if interrupted and told is not None:
                await told.wait(LEAVE_PATIENCE)

    async def _give_up_in_line(
        self, line: AsyncLine, waiter: AsyncWaiter, call: Acquiring
    ) -> bool | None:
        """The deadline passed: leave the line with the others giving up (one call).

        A lock (or permit) handed over meanwhile is kept and confirmed. None:
        the line did not answer within :data:`GRACE` (the server stalls): the
        caller leaves it to the line.
        """
        line.give_up(waiter)
        assert call.deadline is not None  # (only a call with a deadline gives up)
        patience = call.deadline + GRACE
        while True:
            # The line's round answers (a grant kept, then dismissed), or fails
            # (raised here); a grant heard on the channel may come first.
            granted = await waiter.wait(max(0.0, patience - time.monotonic()))
            if granted is not None and await self._take_granted(
                call, granted, line.local_time(granted)
            ):
                return True
            if waiter.dismissed:
                return self._holds.timed_out(call.started)
            if time.monotonic() >= patience:
                return None
            waiter.recheck = False

    async def _by(self, call: Acquiring, run: Callable[..., Any], *args: Any) -> Any:
        """``run(*args)``, which may take or queue for ``call``'s token, by its deadline.

        What a call answered late took for the token is given back when it ends
        (leaving the queue, passing on a hold; :func:`by_deadline`). Its
        arguments are passed along, not captured: a partial is made only for a
        call raced by a deadline (a closure's variables are cells made at every
        call: 10,000 waiting tasks would be 60,000 cells more for the garbage
        collector to trace).
        """
        if call.deadline is None:  # no deadline: the call runs to its reply (shielded)
            return await shielded(run(*args))
        return await by_deadline(
            call.deadline,
            partial(run, *args),
            _giving_back(self._rules, call.token, call.attempt),
            self._rules.client,
        )

    async def _take_granted(self, call: Acquiring, granted: Acquired, at: float) -> bool:
        """Make a grant (heard at ``at``) ``call``'s hold; False if it lapsed first.

        Confirmed by the call's deadline (:meth:`AsyncLease.confirm_grant`).
        """
        confirmed: tuple[Acquired, float] | None = await self._by(
            call, self._lease.confirm_grant, call.token, granted, at
        )
        if confirmed is None:
            return False
        self._lease.took(call, confirmed[0], confirmed[1])
        return True

    def _may_try(self, wait: bool) -> tuple[object, ...] | bool | None:
        """Whether to try before queueing.

        False: queue at once; None: try; a key: try, then :func:`end_try` it
        (other waiting acquirers of this process queue meanwhile).
        """
        if not wait:
            return None
        if self.seen_busy:
            return False
        key = begin_try(self._rules.registry, self._rules.keys.owner)
        return False if key is None else key

    def _line(self, channel: str) -> AsyncLine:
        settings = self._rules.settings
        keys, own_args = self._rules.line_call()
        return line_for(
            self._rules.registry,
            self._rules.line_script,
            keys,
            own_args,
            channel,
            settings.waiter_lease_ms,
            settings.handoff_ms,
            self._rules.name,
            self._rules.line_refusal,
            self._rules.outsider_poll,
        )
