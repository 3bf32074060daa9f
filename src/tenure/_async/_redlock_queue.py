"""AsyncRedlockQueue: how a Redlock acquires — attempts on every master, a fair line, give-backs.

The queue part of :class:`~tenure.AsyncRedlock` (in the place
:class:`~tenure._async._queue.AsyncQueue` takes for a lock on one server):

* one attempt sends the acquire script to every master at once and counts
  if a quorum granted it with validity left (lease - the attempt's time -
  drift); otherwise whatever it took is given back at once, and a grant
  that comes in later is given back when it comes;
* a caller that finds the lock taken waits in a line kept on every master,
  ordered by a ticket (its clock when it began), so every master grants the
  free lock to the same caller; a release wakes the first in line on its
  process's wake-up channel, and waiters re-check on their own timers;
* when too many masters fail for a quorum, in two attempts in a row, it
  raises :class:`~tenure.QuorumError` at once;
* a holder's fencing token is the largest of its quorum's; the others'
  counters are raised to it before the acquisition counts.
"""

from __future__ import annotations

import random
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tenure._async._holds import AsyncHolds
from tenure._async._lease import AsyncLease
from tenure._async._masters import RELEASE_PATIENCE, RETRY_PAUSE, AsyncMasters, positive
from tenure._async._redlock_rules import AsyncRedlockRules
from tenure._async._wakeups import AsyncWaiter, listen
from tenure._backends.for_asyncio import (
    Event,
    Mutex,
    before_waiting,
    current_holder,
    scope_key,
    shielded,
    sleep,
    start_background,
)
from tenure._backends.tracing import AcquireSpan
from tenure._core.exceptions import BackendError, PrimitiveError, QuorumError
from tenure._core.leased import (
    IDLE_TTL_MS,
    OWNER_EXPIRY_SLACK,
    WAITER_REFRESH,
    Acquired,
    Acquiring,
    Hold,
)
from tenure._core.redlock import FENCE_LIFETIME_MS, Tally, drift_ms

__all__ = ["AsyncRedlockQueue"]

_RANDOM = random.SystemRandom()  # not the global one: its seed and state are the application's


def _granted(reply: Any) -> bool:
    return isinstance(reply, list) and int(reply[0]) == 1


@dataclass
class _Attempt:
    """One round of an acquisition, as it ended."""

    fence: int | None = None  # the acquisition counted
    free_in: float | None = None  # seconds until a quorum's leases run out
    split: bool = False  # it took some masters, not enough
    done: bool = False  # decided: grants that come later are judged on arrival
    unreachable: QuorumError | None = None  # too many masters failed for a quorum
    slow: bool = False  # ... but a quorum may answer: those it lacks were only slow
    crowded: bool = False  # ... only for want of a free connection in this client's pools
    undecided: bool = False  # short of a quorum, refused nowhere: masters slow to answer
    late: list[int] = field(default_factory=list)  # grants that came in while deciding


SLOW_PATIENCE = 4
"""Attempts' timeouts an acquisition keeps trying while the masters failing it were only slow."""

CROWDED_PATIENCE = 30.0
"""Seconds an acquisition keeps trying while its attempts fail only for want of a
free connection in the client's pools (``max_connections`` in use by this process's
own calls: a burst of acquirers larger than the pools; the connections come free as
those calls end). Past it, :class:`~tenure.QuorumError` says the pools are exhausted."""

CROWDED_PAUSE = 1.0
"""Seconds, at most, between two attempts that found the pools without a free connection."""

LEAVE_PATIENCE = 600.0
"""Seconds a waiter that gave up keeps telling the masters that did not hear it."""

LEAVE_PAUSE = 0.5
"""Seconds between those tries."""

FIRST_SILENCE = 1.0
"""Seconds an acquisition's first attempt waits, while no master has answered at all.

At most a tenth of the lease, and never past ``blocking_timeout``. Every
master silent at once is most likely this process: a burst of callers each
opening a connection per master, or a starved event loop. Failing the
attempt at ``master_timeout`` would send a give-back and another attempt
while its calls still run, each on a new connection, until the pools ran
out. Masters all cut off from this process take that much longer to tell
(``QuorumError`` in about 1.5 s, not 0.5 s).
"""

SPLIT_GRACE = 0.01
"""Seconds an attempt split with another contender waits, at least, for its other masters."""


class _Listener:
    """A waiter's wake-ups from every master, on one event."""

    def __init__(self) -> None:
        self.event = Event()
        self.waiters: list[AsyncWaiter] = []

    async def wait(self, timeout: float) -> None:
        await self.event.wait(max(0.0, timeout))
        self.event.clear()

    def stop(self) -> None:
        for waiter in self.waiters:
            waiter.stop()

    @staticmethod
    async def up(masters: AsyncMasters, token: str) -> _Listener:
        """Listen for wake-ups for ``token`` from every master.

        Waits (a master timeout at most) until a quorum of the subscriptions
        is up: a master that is down must not delay every waiter.
        """
        listener = _Listener()
        for client in masters.clients:
            waiter = await listen(client, token, 0.0, None, listener.event)
            listener.waiters.append(waiter)
        deadline = time.monotonic() + masters.call_timeout
        up = 0
        for waiter in sorted(listener.waiters, key=lambda w: not w.up):
            if up >= masters.quorum:
                break
            up += await waiter.subscribed(deadline - time.monotonic())
        return listener


class _Turns:
    """Acquirers of one Redlock name in this process take turns at attempts, in arrival order.

    At most :func:`_attempts_at_once` attempts at a time: each takes a
    connection on every master, and a burst of acquirers larger than the
    clients' pools used to exhaust them, which failed every one of them. Those
    who lost an attempt wait in the masters' line, not here.
    """

    __slots__ = ("__weakref__", "_free", "_mutex", "_waiting")

    def __init__(self, at_once: int) -> None:
        self._mutex = Mutex()
        self._free = at_once
        self._waiting: deque[Event] = deque()

    async def take(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for this caller's turn; True: its."""
        with self._mutex:
            if self._free > 0:
                self._free -= 1
                return True
            turn = Event()
            self._waiting.append(turn)
        try:
            if await turn.wait(timeout):
                return True
        except BaseException:
            self._leave(turn)
            raise
        self._leave(turn)
        return False

    def give(self) -> None:
        """The attempt is over: the next caller's turn."""
        with self._mutex:
            self._pass()

    def _leave(self, turn: Event) -> None:
        """A caller stops waiting (its deadline, a cancellation): a turn it was given goes on."""
        with self._mutex:
            if turn.is_set():
                self._pass()
            else:
                self._waiting.remove(turn)

    def _pass(self) -> None:
        if self._waiting:
            self._waiting.popleft().set()
        else:
            self._free += 1


_turns: weakref.WeakValueDictionary[tuple[object, ...], _Turns] = weakref.WeakValueDictionary()
_turns_mutex = Mutex()


def _turns_for(clients: tuple[Any, ...], name: str) -> _Turns:
    """The turns of this process (or event loop) at attempts on ``name`` on these masters."""
    key = (scope_key(), *map(id, clients), name)
    with _turns_mutex:
        turns = _turns.get(key)
        if turns is None:
            turns = _turns[key] = _Turns(_attempts_at_once(clients))
        return turns


def _attempts_at_once(clients: tuple[Any, ...]) -> int:
    """How many attempts on one name a process makes at once: a quarter of the smallest pool.

    (16 when no pool says: a cluster client's, or a pool without a limit.)
    """
    limits = [
        limit
        for client in clients
        if isinstance(
            limit := getattr(getattr(client, "connection_pool", None), "max_connections", None),
            int,
        )
        and 0 < limit < 2**31 - 1
    ]
    return max(1, min(limits) // 4) if limits else 16


class AsyncRedlockQueue:
    """Acquires a Redlock: attempts on every master, then the line kept on each."""

    def __init__(self, rules: AsyncRedlockRules, holds: AsyncHolds, lease: AsyncLease) -> None:
        self._rules = rules
        self._masters = rules.masters
        self._holds = holds
        self._lease = lease
        self.seen_busy = False  # the last acquire had to wait: listen from the start
        self._live: set[str] = set()  # tokens held now: a late grant of any other is given back
        holds.forgetting = self._forgotten

    def _forgotten(self, hold: Hold) -> None:
        with self._holds.mutex:
            self._live.discard(hold.token)

    async def acquire(
        self, wait: bool, blocking_timeout: float | None, token: str, attempt: str = ""
    ) -> bool:
        started = time.monotonic()
        deadline = None if blocking_timeout is None else started + blocking_timeout
        acquiring = Acquiring(token, attempt, started, deadline, current_holder())
        with AcquireSpan(self._holds.subject, started) as traced:
            return traced.ended(await self._acquire(acquiring, wait, traced), self._holds.peek())

    async def _acquire(self, acquiring: Acquiring, wait: bool, traced: AcquireSpan) -> bool:
        token, attempt, started, deadline = (
            acquiring.token, acquiring.attempt, acquiring.started, acquiring.deadline
        )  # fmt: skip
        ticket = time.time_ns() // 1000  # the same on every master: one order of waiters
        settings = self._rules.settings
        listener: _Listener | None = None
        unreachable = 0
        unreachable_since = 0.0
        slow_since = 0.0

        first = True  # the acquisition's first attempt waits longer for silent masters

        def patience_for_slow() -> float:
            return SLOW_PATIENCE * self._masters.attempt_timeout

        turn = _turns_for(self._masters.clients, self._rules.name)  # (kept alive while used)
        try:
            while True:
                if listener is None and wait and self.seen_busy:
                    listener = await _Listener.up(self._masters, token)
                sent = time.monotonic()
                silent = 0.0
                if first:
                    first = False
                    silent = min(self._masters.longest, FIRST_SILENCE)
                    if deadline is not None:  # never past the caller's deadline
                        silent = min(silent, deadline - time.monotonic())
                room = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not await turn.take(room):  # this process's other attempts took it all
                    await shielded(self._leave_now(token, attempt))
                    return self._holds.timed_out(started)
                try:
                    tried = await shielded(self._attempt(token, ticket, listener, attempt, silent))
                finally:
                    turn.give()
                if tried.unreachable is not None:
                    # Once may be a stall (of this process, or of the network):
                    # twice in a row, the masters are out of reach -- unless
                    # they were only slow to answer (a busy machine): then
                    # after a few attempts' time, while the attempts wait longer.
                    unreachable += 1
                    if unreachable == 1:
                        unreachable_since = time.monotonic()
                    patience = patience_for_slow() if tried.slow else 0
                    if tried.crowded:
                        patience = CROWDED_PATIENCE
                    now = time.monotonic()
                    given_up = unreachable > 1 and now - unreachable_since >= patience
                    if given_up or (deadline is not None and now >= deadline):
                        await shielded(self._leave_now(token, attempt))
                        if given_up:
                            raise tried.unreachable
                        return self._holds.timed_out(started)  # the deadline came first
                    if tried.crowded:
                        # The pools' connections carry this process's other calls: wait
                        # longer each time (with jitter), not in step with the others.
                        pause = min(CROWDED_PAUSE, RETRY_PAUSE * 2 ** min(unreachable, 8))
                        await sleep(_RANDOM.uniform(pause / 2, pause))
                    elif unreachable > 1:
                        await sleep(RETRY_PAUSE)  # a skipped master fails an attempt at once
                    continue
                unreachable = 0
                if tried.fence is not None:
                    drift = drift_ms(settings.lease_ms) / 1000
                    taken = Acquired(fence=tried.fence, lease_ms=settings.lease_ms)
                    self._lease.took(acquiring, taken, sent - drift, call=attempt)
                    self.seen_busy = acquiring.queued
                    return True
                if not wait:
                    # Not waiting means not waiting for the lock, held elsewhere;
                    # masters merely slow to answer (a busy machine) get a few
                    # attempts' time, as an acquisition they fail does.
                    if not tried.undecided:
                        return False
                    if not slow_since:
                        slow_since = time.monotonic()
                    if time.monotonic() - slow_since >= patience_for_slow():
                        return False
                    continue
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    await shielded(self._leave_now(token, attempt))
                    return self._holds.timed_out(started)
                if listener is None:
                    before_waiting(self._holds.kind, self._rules.keys.owner, self._rules.name)
                    self.seen_busy = True
                    listener = await _Listener.up(self._masters, token)
                    continue  # take a place in line at once
                if not acquiring.queued:
                    acquiring.queued = True
                    self._holds.add_waiter(1)
                    traced.queued()
                wake_at = now + settings.waiter_lease * WAITER_REFRESH
                if tried.free_in is not None:
                    wake_at = min(wake_at, now + tried.free_in + OWNER_EXPIRY_SLACK)
                if tried.split:  # another took the rest: try again soon, not in step
                    jitter = _RANDOM.uniform(0.0, self._masters.call_timeout / 4)
                    wake_at = min(wake_at, now + jitter)
                if deadline is not None:
                    wake_at = min(wake_at, deadline)
                await listener.wait(wake_at - now)
        except BaseException as exc:
            self._holds.gave_up(started, exc)
            # Failed, cancelled or interrupted: leave every line, give back any grant.
            with self._holds.mutex:
                self._live.discard(token)
            if not isinstance(exc, (PrimitiveError, QuorumError)):
                quiet = isinstance(exc, BackendError)
                await shielded(self._rules.leave_quietly(token, quiet=quiet, attempt=attempt))
            raise
        finally:
            if listener is not None:
                listener.stop()
            if acquiring.queued:
                self._holds.add_waiter(-1)

    async def _attempt(
        self, token: str, ticket: int, listener: _Listener | None, call: str, silent: float = 0.0
    ) -> _Attempt:
        """Send one attempt to every master; keep it if a quorum granted it in time.

        ``call``: the acquire call's id when the caller chose ``token`` (else ``""``).
        ``silent``: how long it waits, if longer than its timeout, while no
        master has answered at all (an acquisition's first attempt: see
        :data:`FIRST_SILENCE`).
        """
        masters, settings = self._masters, self._rules.settings
        sent = time.monotonic()
        self._rules.attempts += 1
        attempt = _Attempt()
        stay = "stay" if listener is not None else "leave"
        waiter_ms = settings.waiter_lease_ms if listener is not None else 0
        waiters = listener.waiters if listener is not None else []

        mark = f"{self._rules.attempts}"
        acquire_keys = (*self._rules.keys.queued, *self._rules.keys.receipts)

        def send(index: int) -> Any:
            channel = waiters[index].channel if waiters else ""
            args = (
                token,
                settings.lease_ms,
                waiter_ms,
                ticket,
                channel,
                FENCE_LIFETIME_MS,
                mark,
                self._rules.owner_name,
                call,
            )
            return masters.script("redlock_acquire", acquire_keys, args)(index)

        def late(index: int, reply: Any) -> None:
            # A grant after the attempt ended: part of the hold if it is still
            # held, else given back at once (this attempt's grant only: a later
            # attempt of the same token may have taken that master since).
            with self._holds.mutex:
                if not attempt.done:
                    attempt.late.append(index)
                    return
                keep = token in self._live
            if not keep:
                start_background(
                    lambda: self._give_back([index], token, "leave", mark, call=call),
                    "tenure-redlock-give-back",
                )

        def until(tally: Tally) -> bool | float:
            if tally.settled:
                return True
            if tally.good and tally.refused:
                # Split with another owner: waiting long on a slow master would
                # keep both stuck. Wait for the rest twice as long as the
                # answers so far took, then give back and let the line decide.
                return max(SPLIT_GRACE, 2 * (time.monotonic() - sent))
            return False

        tally = await masters.call(send, _granted, late=late, until=until, silent=silent)
        fence: int | None = None
        if tally.reached:
            fence = await self._seal(token, tally, sent)
        if fence is not None:
            attempt.fence = fence
            with self._holds.mutex:
                self._live.add(token)
                attempt.done = True
            return attempt
        with self._holds.mutex:
            attempt.done = True
            taken = sorted({*tally.good, *attempt.late})
        self._rules.short_attempts += 1
        if taken:
            # Marked with this attempt: a give-back that is still on its way
            # when a later attempt of the same token takes that master again
            # must not release the later grant.
            await self._give_back(taken, token, stay, mark, call=call)
        answered = {*taken, *tally.refused}
        unanswered = [index for index in range(len(self._masters.clients)) if index not in answered]
        if unanswered:
            # Failed, or still on its way when the attempt was decided: the
            # call may yet land (slow, or resent by the client). A
            # give-back that arrives first leaves a receipt that refuses it,
            # one that arrives after releases its grant. In the background: a
            # master that is down must not hold up the next attempt.
            start_background(
                lambda: self._give_back(unanswered, token, stay, mark, call=call),
                "tenure-redlock-give-back",
            )
        if tally.unreachable:
            attempt.unreachable = tally.error("acquiring", self._rules.name)
            attempt.slow = tally.may_recover
            attempt.crowded = tally.crowded
        elif not tally.refused and tally.failed and tally.may_recover:
            attempt.undecided = True  # no master refused: only slow ones kept it short
        attempt.split = bool(tally.good)
        attempt.free_in = self._free_in(tally)
        return attempt

    async def _seal(self, token: str, tally: Tally, sent: float) -> int | None:
        """The fence of a quorum's grant, once a quorum's counters are at least it.

        None if the lease left is used up (or too few masters could be raised).
        """
        settings = self._rules.settings
        fences = {index: int(reply[1]) for index, reply in tally.good.items()}
        fence = max(fences.values())
        behind = [index for index, f in fences.items() if f < fence]
        if len(fences) - len(behind) < self._masters.quorum:
            args = (token, fence, FENCE_LIFETIME_MS)
            keys = (self._rules.keys.owner, self._rules.keys.fence)
            raised = await self._masters.call(
                self._masters.script("redlock_fence", keys, args), positive, only=behind
            )
            if len(fences) - len(behind) + len(raised.good) < self._masters.quorum:
                return None
        elapsed_ms = (time.monotonic() - sent) * 1000
        if settings.lease_ms - elapsed_ms - drift_ms(settings.lease_ms) <= 0:
            return None
        return fence

    def _free_in(self, tally: Tally) -> float | None:
        """Seconds until a quorum of masters has no owner, by the leases they reported.

        A master that is free but has someone ahead in line counts as never:
        that one takes it, and its release wakes the next.
        """
        left = [0.0 for _ in tally.good]
        for reply in tally.refused.values():
            ttl = int(reply[1])
            left.append(ttl / 1000 if ttl >= 0 else float("inf"))
        left.sort()
        if len(left) < self._masters.quorum or left[self._masters.quorum - 1] == float("inf"):
            return None
        return left[self._masters.quorum - 1]

    async def _leave_now(self, token: str, call: str) -> bool:
        """Leave every master's line (and give back any grant) without waiting on a slow one.

        A master that does not answer at once (paused, cut off) is told in the
        background until it hears: it would keep this token first in its line
        while this process's other waiters keep its waiter lease alive. Returns
        whether every master heard at once.
        """
        heard = await self._give_back(None, token, "leave", call=call, patient=False)
        if not heard:
            self._leave_later(token, call)
        return heard

    def _leave_later(self, token: str, call: str) -> None:
        """Take ``token`` out of every master's line in the background, until all heard."""
        give_up = time.monotonic() + LEAVE_PATIENCE

        async def leave() -> None:
            while not await self._give_back(None, token, "leave", call=call):
                if time.monotonic() >= give_up:
                    return
                await sleep(LEAVE_PAUSE)

        start_background(leave, "tenure-redlock-give-back")

    async def _give_back(
        self,
        only: list[int] | None,
        token: str,
        mode: str,
        mark: str = "",
        *,
        call: str = "",
        patient: bool = True,
    ) -> bool:
        """Release ``token``'s grants (attempt ``mark``'s only, if given) without raising.

        ``call``: the acquire call's id when the caller chose ``token``: only
        that call's grants are released.

        Returns whether every master asked answered (one that did not keeps
        a grant until its lease ends). Waits up to the settle timeout, or
        only ``master_timeout`` if not ``patient`` (the masters are known to
        be out of reach).
        """
        keys, args = self._rules.release_keys(), (token, mode, mark, IDLE_TTL_MS, call)
        masters = self._masters
        if patient:
            within = min(self._rules.settings.lease, RELEASE_PATIENCE)
            tally = await masters.settle("redlock_release", keys, args, within, only=only)
        else:
            tally = await masters.call(
                masters.script("redlock_release", keys, args),
                positive,
                only=only,
                timeout=masters.call_timeout,
            )
        return not tally.failed
