"""AsyncLine: one process's waiters for one lock, served by one call a round.

Every waiter of a process hands its token to the process's :class:`AsyncLine`
for the primitive, and one background job makes one call per round for all
of them (``lock_line`` or ``semaphore_line``, :data:`LINE_SCRIPTS`): thousands
of waiting tasks cost the calls of one. A round carries:

* **join** — the waiters that arrived since the last round, in their order
  (up to :data:`ROUND_SIZE`; the next round starts at once);
* **refresh** — the process's one waiter lease on the server, due every
  ``waiter_lease * 0.4``, whatever the number of waiters;
* **fix-up** — a free lock (free permits) with waiters in line (its owner
  crashed) is granted to the first; due when the owner's lease should end;
* **leave** — waiters cancelled or interrupted, after their join (a leave of
  their own could overtake it), passing on what was handed to them; sent
  again until the server hears (:meth:`AsyncLine.done` tells when);
* **give up** — waiters whose deadline passed, together, each told whether it
  was handed the lock meanwhile (then it keeps it);
* **settle** — a token joined again (a re-check) after its waiter took the lock
  and released it: taken out of the queue (a lock it holds is kept).

Grants reach their waiters on the wake-up channel (:mod:`tenure._async._wakeups`);
a round's answer names them too, so a lost message costs at most one round. A
failed round fails the waiters it carried joins for (every waiter, if a refresh).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tenure._async._scripting import AsyncScriptRegistry
from tenure._async._wakeups import CONFIRM_TIMEOUT, AsyncWaiter
from tenure._backends.for_asyncio import Event, Mutex, scope_key, start_background
from tenure._core.exceptions import TenureError, as_tenure_error
from tenure._core.leased import IDLE_TTL_MS, OWNER_EXPIRY_SLACK, WAITER_REFRESH, Acquired
from tenure._core.line import LINE_SCRIPTS, grant_time

__all__ = [
    "LINGER",
    "ROUND_SIZE",
    "AsyncLine",
    "begin_try",
    "end_try",
    "line_for",
    "start_waiting",
    "stop_waiting",
]

ROUND_SIZE = 1000
"""Joins (and leaves) one round carries at most."""

LINGER = 2.0
"""Seconds a line with no waiter left is kept for the next one, then closed."""

RETRY_AFTER = 0.05
"""Seconds before a round that failed is tried again (its waiters were told)."""

HOLD_JOINS = 1.0
"""Seconds, at most, a line holds back its joins while an acquirer of the
process that came before them tries the lock (and, if it is taken, joins)."""


@dataclass(slots=True)
class _Round:
    """What one round carries (each list at most :data:`ROUND_SIZE` long)."""

    joins: list[tuple[str, str]] = field(default_factory=list)  # (token, owner name)
    leaves: list[str] = field(default_factory=list)  # out of line, a grant passed on
    giving_up: list[AsyncWaiter] = field(default_factory=list)  # out of line, a grant kept
    unqueue: list[str] = field(default_factory=list)  # out of the queue only (see "settle")


class AsyncLine:
    """The waiters of one primitive in this process (or event loop); see the module docstring."""

    def __init__(
        self,
        registry: AsyncScriptRegistry,
        script: str,
        keys: tuple[str, ...],
        own_args: tuple[str | int, ...],
        channel: str,
        waiter_lease_ms: int,
        handoff_ms: int,
        name: str,
        forget: Callable[[AsyncLine], None],
        refuse: Callable[[int], TenureError] | None = None,
        outsider_poll: float = 0.1,
    ) -> None:
        self._registry = registry
        self._script = script
        self._read = LINE_SCRIPTS[script]
        self._keys = keys
        self._own_args = own_args
        self._refuse = refuse  # a semaphore's error for a stored limit not ours
        self._outsider_poll = outsider_poll  # look again this often while an outsider holds
        self.channel = channel
        self._waiter_lease_ms = waiter_lease_ms
        self._handoff_ms = handoff_ms
        self._name = name
        self._forget = forget
        self._mutex = Mutex()
        self._wakeup = Event()
        self._members: dict[str, AsyncWaiter] = {}  # token -> waiter (its owner_name with it)
        self._joining: dict[str, str] = {}  # token -> owner name, in arrival order
        self._leaving: list[str] = []  # tokens to take out of line (what they hold is passed on)
        self._giving_up: dict[str, AsyncWaiter] = {}  # deadline passed: out of line, keep grants
        self._unqueue: list[str] = []  # out of the queue only, a lock held kept ("settle")
        self._told: dict[str, Event] = {}  # a leaving waiter's entry -> set once the server heard
        # Token -> owner name of members whose token a permit of another call
        # holds (they chose it): joined again with the next refresh.
        self._parked: dict[str, str] = {}
        self._joins_out: set[str] = set()  # the tokens of the joins of the round on its way
        self._took_meanwhile: list[str] = []  # of those, the ones whose waiter took the lock
        self._next_round = 0.0
        self._pause_until = 0.0  # after a failed round: RETRY_AFTER
        self._in_flight = 0.0  # when the round on its way was sent (0: none)
        self._clock: tuple[float, int] | None = None  # (sent, server ms) of the last round
        self._heard = time.monotonic()  # when a round last reached the server
        self._worker: Any = None
        self._closed = False
        self._idle_since: float | None = None  # when its last waiter left (None: busy)
        self.scope = (scope_key(), id(registry), keys[0])  # as start_waiting's and begin_try's
        self.rounds = 0

    @property
    def closed(self) -> bool:
        """True once the line served its last waiter (a new one is made on demand)."""
        return self._closed

    def join(self, waiter: AsyncWaiter, name: str, *, first: bool = False) -> bool:
        """Queue ``waiter`` with the next round; False if this line just closed.

        Joining again is how a waiter re-checks its place: one already in
        line keeps it, one that is not (its grant lapsed unseen) joins at
        the back, one that holds the lock is left alone. ``first``: ahead of
        the joins not sent yet (the acquirer whose try held them back,
        :func:`begin_try`, came before them).
        """
        with self._mutex:
            if self._closed:
                return False
            waiter.owner_name = name
            self._members[waiter.token] = waiter
            if first:
                self._joining = {waiter.token: name, **self._joining}
            else:
                self._joining[waiter.token] = name
            if self._worker is None:
                self._worker = start_background(self._serve, "tenure-line")
        self._wakeup.set()
        return True

    def wake(self) -> None:
        """Look again at once (joins held back may go now)."""
        self._wakeup.set()

    def give_up(self, waiter: AsyncWaiter) -> None:
        """``waiter``'s deadline passed: take it out of line with the next round.

        The round answers on the waiter: a grant (the lock, or a permit, was
        handed to it meanwhile: it keeps it), :meth:`AsyncWaiter.dismiss`
        (out of line, holding nothing), or the round's error.
        """
        with self._mutex:
            self._members.pop(waiter.token, None)
            self._joining.pop(waiter.token, None)
            self._parked.pop(waiter.token, None)
            self._giving_up[waiter.token] = waiter
        self._wakeup.set()

    def done(self, waiter: AsyncWaiter, *, left: bool = True) -> Event | None:
        """``waiter`` waits no more: it holds the lock, or it left the queue (``left``).

        With ``left=False`` the line takes it out of the queue (passing on
        what was handed to it) with its next rounds, until the server hears;
        the event returned is set then (or when the line gives up on it:
        its waiter lease ran out, or the line closed).
        """
        told: Event | None = None
        token = waiter.token
        with self._mutex:
            if self._members.get(token) is waiter:
                del self._members[token]
            self._joining.pop(token, None)
            self._parked.pop(token, None)
            if not left:
                self._leaving.append(waiter.entry)
                told = self._told[waiter.entry] = Event()
            elif token in self._joins_out:
                # Its join is on its way: it may arrive after this waiter has
                # released, and queue its token again (settled after the round).
                self._took_meanwhile.append(token)
        if not left:
            self._wakeup.set()
        return told

    def _listening(self) -> bool:
        """Whether this line's waiters hear their grants (the channel's subscription is up)."""
        for waiter in self._members.values():
            return waiter.up
        return True

    def local_time(self, granted: Acquired) -> float:
        """When a grant happened, on this process's clock (``grant_time`` in _core/line.py)."""
        with self._mutex:
            clock, in_flight = self._clock, self._in_flight
        return grant_time(granted, clock, in_flight)

    # -- the rounds ---------------------------------------------------------------

    def _take_round(self) -> tuple[_Round, float | None]:
        """What the next round carries, or how long to sleep first (None: close)."""
        with self._mutex:
            self._wakeup.clear()
            now = time.monotonic()
            lone = (self._leaving or self._unqueue) and not self._members and not self._joining
            if lone and now - self._heard > self._waiter_lease_ms / 1000:
                # Out of reach for a whole waiter lease: the server dropped
                # these waiters with this process's lease. Nothing to send.
                self._leaving = []
                self._unqueue = []
                self._told = _tell_all(self._told)
            busy = self._members or self._joining or self._leaving or self._giving_up
            if not (busy or self._unqueue):
                # Idle: kept LINGER seconds for the next waiter (a lock taken
                # in turn by a few processes gets one waiter at a time), then
                # closed.
                if self._idle_since is None:
                    self._idle_since = now
                if now - self._idle_since >= LINGER:
                    self._closed = True
                    return _Round(), None
                return _Round(), self._idle_since + LINGER - now
            self._idle_since = None
            if now < self._pause_until:  # a round just failed
                return _Round(), self._pause_until - now
            held = _held_back(self.scope, now)  # joins wait for an earlier acquirer
            # A lock may be handed to those leaving, giving up or left in the queue.
            urgent = self._giving_up or self._leaving or self._unqueue
            if (held or not self._joining) and not urgent and now < self._next_round:
                wait = self._next_round - now
                return _Round(), min(wait, held) if held else wait
            if now >= self._next_round and self._parked:
                # Members whose token another call held: asked again with the refresh.
                for token, name in self._parked.items():
                    self._joining.setdefault(token, name)
                self._parked = {}
            if now >= self._next_round and not self._listening():
                # No wake-ups (the subscription is down, or refused): a grant
                # may go unheard and lapse, so each refresh re-checks every
                # waiter's place by joining it again (one in line keeps it).
                for token, member in self._members.items():
                    self._joining.setdefault(token, member.owner_name)
            taken = _Round()
            if not held:
                taken.joins = list(itertools.islice(self._joining.items(), ROUND_SIZE))
            for token, _ in taken.joins:
                del self._joining[token]
            taken.leaves, self._leaving = self._leaving[:ROUND_SIZE], self._leaving[ROUND_SIZE:]
            taken.giving_up = list(itertools.islice(self._giving_up.values(), ROUND_SIZE))
            for waiter in taken.giving_up:
                del self._giving_up[waiter.token]
            taken.unqueue, self._unqueue = self._unqueue[:ROUND_SIZE], self._unqueue[ROUND_SIZE:]
            self._in_flight = now
            return taken, 0.0

    async def _serve(self) -> None:
        try:
            while True:
                taken, wait = self._take_round()
                if wait is None:
                    return
                if wait > 0:
                    await self._wakeup.wait(wait)
                    continue
                if taken.joins:
                    # Joined waiters must hear their grants: the subscription
                    # first (at once when it is up; a waiter whose grant goes
                    # unheard meanwhile learns it from the next round).
                    await _joins_hear(self._members, taken.joins)
                await self._round(taken)
        finally:
            with self._mutex:
                self._closed = True
                self._told = _tell_all(self._told)
            self._forget(self)

    async def _round(self, taken: _Round) -> None:
        with self._mutex:
            # Waiters done while their subscription was awaited join no more.
            taken.joins = [entry for entry in taken.joins if entry[0] in self._members]
            self._joins_out = {token for token, _ in taken.joins}
            canary = _canary(self._members, (self._joining, self._parked, dict(taken.joins)))
            members = self._members
            joins, leaves, giving_up = taken.joins, taken.leaves, taken.giving_up
            args: list[str | int] = [
                self.channel,
                self._waiter_lease_ms,
                self._handoff_ms,
                IDLE_TTL_MS,
                len(joins),
                len(leaves),
                "" if canary is None else canary.entry,
                len(giving_up) + len(taken.unqueue),
                *self._own_args,
            ]
            for token, name in joins:
                args.append(members[token].entry)
                args.append(name)
        args.extend(leaves)
        args.extend(waiter.entry for waiter in giving_up)
        args.extend(taken.unqueue)  # out of line like those giving up, with nobody to answer
        sent = time.monotonic()
        self.rounds += 1
        try:
            answer = self._read(
                await self._registry.run(self._script, self._keys, tuple(args), name=self._name)
            )
        except Exception as error:  # tenure's, or the client's own (a redis-py race, say)
            self._failed(as_tenure_error(error, self._name), taken)
            return
        if answer.stored_limit is not None:
            # Another limit is stored: every waiter of this line is refused.
            assert self._refuse is not None, "a line script answered a limit for a lock"
            refusal = self._refuse(answer.stored_limit)
            self._failed(refusal, taken, everyone=True)
            return
        with self._mutex:
            for entry in leaves:
                told = self._told.pop(entry, None)
                if told is not None:
                    told.set()
        for waiter in giving_up:
            kept = answer.holds.get(waiter.token)
            if kept is not None and answer.grants(waiter.token, waiter.attempt):
                waiter.deliver(kept)  # handed to it meanwhile: it keeps it
            waiter.dismiss()
        with self._mutex:
            first = self._clock is None  # the channel had no lease yet: nothing was lost
            self._in_flight = 0.0
            # Waiters that took the lock while their join was on its way: a
            # join that did not find them holding may have queued them after
            # they released (or found them in line, granted since): out of
            # the queue with the next round, a lock they hold kept.
            self._unqueue.extend(t for t in self._took_meanwhile if t not in answer.holds)
            self._took_meanwhile = []
            self._joins_out = set()
            self._heard = time.monotonic()
            self._clock = (sent, answer.server_ms)
            due = sent + self._waiter_lease_ms / 1000 * WAITER_REFRESH
            holders = [
                (member, granted)
                for token, granted in answer.holds.items()
                if (member := self._members.get(token)) is not None
                and answer.grants(token, member.attempt)
            ]
            if answer.ttl_ms >= 0 and not holders:
                due = min(due, sent + answer.ttl_ms / 1000 + OWNER_EXPIRY_SLACK)
            for token, ms in answer.others.items():
                member = self._members.get(token)
                if member is not None:  # asked again when that permit should have ended
                    self._parked[token] = member.owner_name
                    due = min(due, sent + ms / 1000 + OWNER_EXPIRY_SLACK)
            if answer.outsider:  # redis-py's key is held outside tenure: nobody announces
                due = min(due, sent + self._outsider_poll)
            self._next_round = due
            # The waiter checked is neither in line nor holding: unless it is
            # done meanwhile (it took the lock, and may have released it
            # before the round arrived, which says nothing of the others).
            missing = answer.missing and canary is not None and canary.token in self._members
            if (not answer.alive and not first) or missing:
                # This process's waiter lease had run out (it was stopped or cut
                # off): the server dropped its waiters. Or the waiter checked is
                # not in line (that too, with the lease renewed meanwhile by
                # another line of the process; or its grant lapsed unseen). Join
                # them again (those not on their way already): one still in
                # line keeps its place.
                joined = {token for token, _ in joins}
                joined.update(self._joining)
                joined.update(self._parked)
                again = [
                    (token, member.owner_name)
                    for token, member in self._members.items()
                    if token not in joined and token not in answer.holds
                ]
                self._joining = {**dict(again), **self._joining}
                if again:
                    self._next_round = sent
        for holder, granted in holders:
            holder.deliver(granted)

    def _failed(self, error: TenureError, taken: _Round, *, everyone: bool = False) -> None:
        """A round failed: tell its joiners and those giving up (every waiter, if due).

        Its leaves (and the tokens of those giving up) go again with the next round.
        """
        with self._mutex:
            self._in_flight = 0.0
            self._leaving.extend(taken.leaves)  # tried again with the next round
            # Those giving up raise the error: what may have been handed to
            # them is passed on, as for any waiter that fails.
            self._leaving.extend(waiter.entry for waiter in taken.giving_up)
            # The joins may have arrived: settled as if they had.
            self._unqueue.extend(taken.unqueue)
            self._unqueue.extend(self._took_meanwhile)
            self._took_meanwhile = []
            self._joins_out = set()
            refresh = everyone or time.monotonic() >= self._next_round
            joined = {token for token, _ in taken.joins}
            told = [w for t, w in self._members.items() if refresh or t in joined]
            told.extend(taken.giving_up)
            self._next_round = self._pause_until = time.monotonic() + RETRY_AFTER
        for waiter in told:
            waiter.fail(error)


def _canary(
    members: dict[str, AsyncWaiter], besides: tuple[dict[str, str], ...]
) -> AsyncWaiter | None:
    """A waiter that joined in an earlier round (in none of ``besides``): the round checks it.

    None: none such (the mutex held).
    """
    for token, member in itertools.islice(members.items(), 8):
        if all(token not in other for other in besides):
            return member
    return None


def _tell_all(told: dict[str, Event]) -> dict[str, Event]:
    """Nobody waits any longer for a leave to be heard; an empty dict (the mutex held)."""
    for event in told.values():
        event.set()
    return {}


async def _joins_hear(members: dict[str, AsyncWaiter], joins: list[tuple[str, str]]) -> None:
    """Wait (up to :data:`CONFIRM_TIMEOUT`) for the wake-up subscription of a round's joiners."""
    for token, _ in joins:
        member = members.get(token)
        if member is not None:
            if not member.up:
                await member.subscribed(CONFIRM_TIMEOUT)
            return


_lines: dict[tuple[object, ...], AsyncLine] = {}
_by_scope: dict[tuple[object, ...], list[AsyncLine]] = {}  # each line under its scope too
_waiting: dict[tuple[object, ...], int] = {}  # (scope, registry, owner key) -> waiters now
_waiting_keys: dict[tuple[object, ...], tuple[object, ...]] = {}  # each key of _waiting, shared
_trying: dict[tuple[object, ...], float] = {}  # (scope, registry, owner key) -> when its try began
_lines_mutex = Mutex()


def _forget(line: AsyncLine) -> None:
    with _lines_mutex:
        for key in [k for k, v in _lines.items() if v is line]:
            del _lines[key]
        _unscope(line)


def _unscope(line: AsyncLine) -> None:
    """Drop ``line`` from :data:`_by_scope` (the mutex held)."""
    scoped = _by_scope.get(line.scope)
    if scoped is not None and line in scoped:
        scoped.remove(line)
        if not scoped:
            del _by_scope[line.scope]


def start_waiting(registry: AsyncScriptRegistry, owner_key: str) -> tuple[object, ...]:
    """Count a waiter of this process (or event loop) for a lock (see :func:`stop_waiting`).

    While one waits, the process's acquirers of the lock skip their try
    (:func:`begin_try`). Returns the key to pass to :func:`stop_waiting`.
    """
    key: tuple[object, ...] = (scope_key(), id(registry), owner_key)
    with _lines_mutex:
        _waiting[key] = _waiting.get(key, 0) + 1
        # The key each waiter keeps until it stops: one shared tuple, not one
        # each (10,000 waiting tasks are that many fewer objects to collect).
        return _waiting_keys.setdefault(key, key)


def stop_waiting(key: tuple[object, ...]) -> None:
    """A waiter counted by :func:`start_waiting` waits no more."""
    with _lines_mutex:
        _stop_waiting(key)


def _stop_waiting(key: tuple[object, ...]) -> None:
    left = _waiting.get(key, 1) - 1
    if left > 0:
        _waiting[key] = left
    else:
        _waiting.pop(key, None)
        _waiting_keys.pop(key, None)


def begin_try(registry: AsyncScriptRegistry, owner_key: str) -> tuple[object, ...] | None:
    """Whether a waiting acquirer of this process should try the lock before queueing.

    Not while waiters of this process (or event loop) wait in line for it,
    nor while another of its acquirers' tries is on its way: the try would
    cost a round trip that cannot succeed (the lock is taken, or about to
    be). Returns the key to pass to :func:`end_try`, or None: queue at once.

    The acquirer allowed to try is counted as waiting (see
    :func:`start_waiting`), and the line holds back the joins of those who
    came after it until it joined ahead of them (:meth:`AsyncLine.join` with
    ``first``, then :func:`end_try`), so the first to call ``acquire()``
    stays first.
    """
    key = (scope_key(), id(registry), owner_key)
    with _lines_mutex:
        if key in _waiting or key in _trying:
            return None
        _trying[key] = time.monotonic()
        _waiting[key] = 1
    return key


def end_try(key: tuple[object, ...], stop: bool = False) -> None:
    """The acquirer that :func:`begin_try` allowed holds, or is in line, or gave up.

    Idempotent. The lines holding back joins behind it send them. ``stop``:
    it also waits no more (:func:`stop_waiting`, under the same mutex).
    """
    with _lines_mutex:
        if stop:
            _stop_waiting(key)
        if _trying.pop(key, None) is None:
            return
        lines = list(_by_scope.get(key, ()))  # not a scan of every line of the process
    for line in lines:
        line.wake()


def _held_back(scope: tuple[object, ...], now: float) -> float:
    """Seconds a line of ``scope`` still holds back its joins (0: none)."""
    began = _trying.get(scope)
    if began is None:
        return 0.0
    return max(0.0, began + HOLD_JOINS - now)


def line_for(
    registry: AsyncScriptRegistry,
    script: str,
    keys: tuple[str, ...],
    own_args: tuple[str | int, ...],
    channel: str,
    waiter_lease_ms: int,
    handoff_ms: int,
    name: str,
    refuse: Callable[[int], TenureError] | None = None,
    outsider_poll: float = 0.1,
) -> AsyncLine:
    """The line of this process (or event loop) for one primitive, its channel and waiter lease.

    ``own_args`` are the primitive's own arguments of the line script (a
    semaphore's limit): waiters that pass others wait in another line.
    """
    key = (
        scope_key(),
        id(registry),
        keys,
        script,
        own_args,
        channel,
        waiter_lease_ms,
        handoff_ms,
        outsider_poll,
    )
    with _lines_mutex:
        found = _lines.get(key)
        if found is None or found.closed:
            if found is not None:
                _unscope(found)
            found = _lines[key] = AsyncLine(
                registry,
                script,
                keys,
                own_args,
                channel,
                waiter_lease_ms,
                handoff_ms,
                name,
                _forget,
                refuse,
                outsider_poll,
            )
            _by_scope.setdefault(found.scope, []).append(found)
        return found
