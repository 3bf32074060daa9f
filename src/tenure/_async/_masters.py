"""AsyncMasters: one call to several independent masters at once, with the answers tallied.

Redlock (:mod:`tenure._async._redlock`) sends each step to every master
and acts on the tally (:class:`~tenure._core.redlock.Tally`): a quorum
granted, refused, or could not be reached. A call returns as soon as the
outcome is decided, so a slow or dead master costs nothing while the
others answer; a master that accepts connections but never answers is
skipped after :data:`~tenure._core.redlock.MAX_OVERDUE` calls left hanging,
until one of them ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from tenure._async._scripting import AsyncClient, registry_for
from tenure._backends.for_asyncio import Mutex, race, sleep
from tenure._backends.owners import generation
from tenure._core.exceptions import ConnectionPoolExhaustedError
from tenure._core.redlock import (
    ADAPTIVE_MARGIN,
    MAX_OVERDUE,
    SETTLE_TIMEOUT,
    SLOWEST_DECAY,
    Tally,
    describe_failure,
    drift_ms,
    is_slow,
    quorum,
)

__all__ = ["RELEASE_PATIENCE", "AsyncMasters", "Send", "answered", "positive"]

RETRY_PAUSE = 0.05
"""Seconds between two rounds of a release asking the masters that were slow to answer."""

RELEASE_PATIENCE = 5.0
"""Seconds a release (or give-back) keeps asking masters only slow to answer (at most the lease)."""

Send = Callable[[int], Any]
"""Makes the call to the master of that index."""


def positive(reply: Any) -> bool:
    """Whether a master's reply is a positive count (it did what was asked)."""
    return int(reply) > 0


def _decided(tally: Tally) -> bool:
    # Not merely "out of reach": a renewal must tell lost (refused) from unsure
    # (failed), and a release that failed on a master may still be answered.
    return tally.reached or tally.lost


def answered(tally: Tally) -> bool:
    """Whether a quorum answered, whatever it said."""
    return not tally.unreachable  # a quorum answered, whatever it said


class AsyncMasters:
    """Runs one call on every master at once and tallies the answers."""

    def __init__(
        self,
        clients: Sequence[AsyncClient],
        described: tuple[str, ...],
        call_timeout: float,
        name: str,
        longest: float,
    ) -> None:
        self.clients = tuple(clients)
        self.described = described
        self.quorum = quorum(len(clients))
        self.call_timeout = call_timeout  # master_timeout: one call's limit, not a lease
        self.longest = longest  # the longest an attempt may wait, however slow the answers
        self.name = name
        self.failures = 0
        self._registries = [registry_for(client) for client in clients]
        self._mutex = Mutex()  # late calls end in worker threads (sync) or callbacks
        self._running: list[dict[object, float]] = [{} for _ in clients]
        self._generation = generation()

    @property
    def attempt_timeout(self) -> float:
        """How long an attempt (acquire, renewal) waits for answers.

        ``master_timeout``, unless the masters' recent answers were slower
        (a busy machine: starved threads or event loop, a loaded server):
        then a few times the slowest of them, up to a tenth of the lease. A
        master that is down leaves the others' answers fast, so it still
        fails in ``master_timeout``.
        """
        slowest = max(registry.slowest for registry in self._registries)
        return min(max(self.call_timeout, ADAPTIVE_MARGIN * slowest), self.longest)

    @property
    def settle_timeout(self) -> float:
        """How long a release or give-back waits, at most, for a quorum."""
        return max(self.call_timeout, SETTLE_TIMEOUT)

    def _hanging(self, index: int, now: float) -> int:
        """Calls to a master still running, if one of them outlived its timeout (else 0).

        The attempts' timeout, which grows while the masters answer slowly (a
        busy machine), so a healthy master is not skipped for it; a master
        that does not answer at all is skipped after a few calls, so it
        cannot take every worker thread (sync) or connection.
        """
        with self._mutex:
            if self._generation != generation():
                # A fork's child: the parent's calls in flight never end here.
                self._running = [{} for _ in self.clients]
                self._generation = generation()
            running = self._running[index].values()
            timeout = self.attempt_timeout
            if any(now - sent > timeout for sent in running):
                return len(running)
            return 0

    async def _one(self, index: int, send: Send) -> Any:
        mark = object()
        with self._mutex:
            self._running[index][mark] = time.monotonic()
        sent = time.monotonic()
        try:
            reply = await send(index)
        finally:
            with self._mutex:
                self._running[index].pop(mark, None)
        took = time.monotonic() - sent
        registry = self._registries[index]
        with self._mutex:  # (another object's update may be lost: a heuristic)
            registry.slowest = max(took, registry.slowest * SLOWEST_DECAY)
        return reply

    async def call(
        self,
        send: Send,
        good: Callable[[Any], bool],
        *,
        late: Callable[[int, Any], None] | None = None,
        only: Sequence[int] | None = None,
        until: Callable[[Tally], bool | float] | None = None,
        timeout: float | None = None,
        silent: float = 0.0,
    ) -> Tally:
        """Send ``send(index)`` to every master (or those in ``only``); tally the answers.

        Returns once ``until(tally)`` (by default: the quorum is reached or
        out of reach), or every master answered, or after ``timeout`` (by
        default the masters' timeout; ``silent`` seconds if longer, while no
        master has answered at all); a number from ``until`` is how much
        longer to wait for the rest. ``late(index, reply)`` gets the good
        replies that come afterwards.
        """
        if timeout is None:
            timeout = self.attempt_timeout
        tally = Tally(self.described, self.quorum)
        now = time.monotonic()
        targets = list(range(len(self.clients)) if only is None else only)
        live: list[int] = []
        for index in targets:
            hanging = self._hanging(index, now)
            if hanging >= MAX_OVERDUE:
                tally.failed[index] = f"not answering ({hanging} calls still running)"
                # Overdue calls: slow as a timeout is (a busy machine starves
                # healthy masters' replies too), so it gets the same patience.
                tally.slow.add(index)
            else:
                live.append(index)

        def fill(outcomes: dict[int, Any]) -> Tally:
            for slot, outcome in outcomes.items():
                index = live[slot]
                if isinstance(outcome, BaseException):
                    tally.failed[index] = describe_failure(outcome, timeout)
                    if getattr(outcome, "never_sent", False):
                        tally.unsent.add(index)
                    if isinstance(outcome, ConnectionPoolExhaustedError):
                        tally.exhausted.add(index)
                    if is_slow(outcome):
                        tally.slow.add(index)
                elif good(outcome):
                    tally.good[index] = outcome
                else:
                    tally.refused[index] = outcome
            return tally

        def settled(outcomes: dict[int, Any]) -> bool | float:
            tally = fill(outcomes)
            if only is not None:
                return len(outcomes) == len(live)
            return tally.settled if until is None else until(tally)

        began = time.monotonic()
        first_in: list[float] = []

        def patient(outcomes: dict[int, Any]) -> bool | float:
            # While no master has answered at all, the wait goes on up to
            # ``silent``; once one answers, the rest get ``timeout`` or a few
            # times what that answer took.
            verdict = settled(outcomes)
            if verdict is True or not outcomes:
                return verdict
            now = time.monotonic()
            if not first_in:
                first_in.append(now - began)
            allowed = max(timeout, ADAPTIVE_MARGIN * first_in[0]) - (now - began)
            return max(0.0, allowed if verdict is False else min(verdict, allowed))

        def finished_late(slot: int, outcome: Any) -> None:
            if late is not None and not isinstance(outcome, BaseException) and good(outcome):
                late(live[slot], outcome)

        def starter(index: int) -> Callable[[], Any]:
            return lambda: self._one(index, send)

        outcomes = await race(
            [starter(index) for index in live],
            max(timeout, silent),
            patient,
            finished_late,
            [self.clients[index] for index in live],
        )
        if settled(outcomes) is False:  # out of time: those still running failed this call
            for slot, index in enumerate(live):
                if slot not in outcomes:
                    waited = max(timeout, time.monotonic() - began)
                    tally.failed[index] = f"no answer within {waited:.2g}s"
                    tally.slow.add(index)
        with self._mutex:
            self.failures += len(tally.failed)
        return tally

    async def persist(
        self,
        send: Send,
        good: Callable[[Any], bool],
        done: Callable[[Tally], bool],
        within: float,
        *,
        first: float | None = None,
        only: Sequence[int] | None = None,
        until: Callable[[Tally], bool | float] | None = None,
    ) -> Tally:
        """Call the masters; ask again those only slow to answer until ``done(tally)``.

        For calls that are safe to repeat (a resent release, give-back or
        extension finds its receipt; a question changes nothing): on a busy
        machine a healthy master can miss a timeout, so the masters that did
        not answer in time are asked again, until ``done`` (or every master
        asked answered, with ``only``), or ``within`` seconds passed, or a
        failure was not mere slowness (a refused connection, an error). The
        first call waits ``first`` (by default the settle timeout).
        """
        timeout = self.settle_timeout if first is None else first
        give_up = time.monotonic() + within  # counted from the first call: ``within`` in all
        tally = await self.call(send, good, only=only, until=until, timeout=timeout)
        while tally.failed and not done(tally):
            left = give_up - time.monotonic()
            if left <= 0:
                break
            if only is None:
                if not tally.may_recover:
                    break
            elif not set(tally.failed) & tally.slow:
                break
            await sleep(RETRY_PAUSE)  # a master skipped as hanging fails at once
            again = await self.call(
                send, good, only=sorted(tally.failed), timeout=min(self.settle_timeout, left)
            )
            tally.merge(again)
        return tally

    async def settle(
        self,
        script: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        within: float,
        *,
        only: Sequence[int] | None = None,
    ) -> Tally:
        """Run a release (or give-back) on the masters until a quorum answered.

        Or every master asked did, with ``only``; see :meth:`persist`.
        """
        return await self.persist(
            self.script(script, keys, args), positive, _decided, within, only=only
        )

    def script(self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Send:
        """A ``send`` that runs a tenure script on a master."""
        registries, name = self._registries, self.name

        def send(index: int) -> Any:
            return registries[index].run(script, keys, args, name=name)

        return send

    async def extend(
        self, keys: tuple[str, ...], args: tuple[str | int, ...], within: float
    ) -> int:
        """Set or add to the lease on every master: the lease a quorum holds, less drift.

        Masters only slow to answer are asked again for up to ``within``
        seconds (a resent extension adds nothing); each answer counts from
        when its call was sent, so the time spent asking is not counted as
        lease. Returns 0 when so many masters refused (the lease ran out
        there) that no quorum holds it, or the quorum's lease ran out while
        the slow ones were asked; raises :class:`~tenure.QuorumError` when
        failures leave it undecided (a renewal retries).
        """
        run = self.script("lock_extend", keys, args)

        async def send(index: int) -> Any:
            sent = time.monotonic()
            ms = int(await run(index))
            return sent + ms / 1000 if ms > 0 else 0  # when the lease ends there, at the earliest

        tally = await self.persist(
            send,
            positive,
            _decided,
            within,
            first=self.attempt_timeout,
            until=_decided,
        )
        if tally.reached:
            ends = sorted(tally.good.values(), reverse=True)[self.quorum - 1]
            ms = int((ends - time.monotonic()) * 1000)
            return max(1, ms - drift_ms(ms)) if ms > 0 else 0
        if tally.lost:
            return 0
        raise tally.error("extending", self.name)
