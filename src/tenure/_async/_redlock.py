"""AsyncRedlock: one lock over several independent masters, kept while a majority is.

For users who run several Redis/Valkey servers with no replication between
them and want a lock that survives losing a minority of them (the Redlock
algorithm). Each master keeps its own copy of the lock's keys; an
acquisition counts when a quorum (``n // 2 + 1``) granted it in time.

How it works (the rules are in :mod:`tenure._core.redlock`, each master's
part is one Lua script):

* **acquire** — one attempt sends the acquire script to every master at
  once and returns as soon as a quorum granted it (a slow or dead master
  costs nothing while the others answer), or as soon as a quorum can no
  longer be reached, or after ``master_timeout``. It counts if time is
  left: validity = lease - the attempt's time - drift (1% of the lease +
  2 ms). Otherwise whatever it took is given back at once, on every master
  that granted it, and a grant that comes in later is given back when it
  comes.
* **waiting, fairly** — a caller that finds the lock taken waits in a line
  kept on every master, ordered by a *ticket* (its clock when it began), so
  all masters agree on who is first and grant the free lock to the same
  caller: contenders do not split the masters between them and retry
  forever. A release wakes the first in line (on its process's wake-up
  channel, :mod:`tenure._async._wakeups`); nothing polls. Waiters also
  re-check on their own timers (their place in line is a lease, renewed
  every ``waiter_lease * 0.4``), when the owner's lease runs out on a
  quorum, and at their deadline: ``blocking_timeout`` is a deadline, never
  a number of retries.
* **masters down** — when so many masters fail that the rest cannot make a
  quorum, in two attempts in a row (one may be a passing stall), acquire
  raises :class:`~tenure.QuorumError` at once, naming each failed master and
  why. A master that accepts connections but never
  answers is skipped after :data:`~tenure._core.redlock.MAX_OVERDUE` calls
  left hanging, until one of them ends.
* **renewal, extend** — the watchdog renews on every master and needs a
  quorum; a hold whose renewals keep falling short is lost when its
  validity runs out (``lost``, ``on_lost``, :class:`~tenure.LockLostError`
  from ``with``), as for :class:`~tenure.AsyncLock`.
* **fencing** — each master counts its own acquisitions; a holder's token is
  the largest of its quorum's. When they differ (a master missed some
  acquisitions), the holder raises the others' counters to it before the
  acquisition counts, so every later quorum (which shares a master with
  this one) hands out a larger token. What this does and does not promise
  is in docs/guarantees.md.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from tenure._async._leased import AsyncLeased, LeasedScripts
from tenure._async._scripting import AsyncClient, registry_for
from tenure._async._wakeups import AsyncWaiter, listen
from tenure._async._watchdog import Job, JobRunner
from tenure._backends.for_asyncio import (
    IS_ASYNC,
    Event,
    Mutex,
    current_holder,
    race,
    shielded,
    sleep,
    start_background,
)
from tenure._backends.owners import generation
from tenure._core.exceptions import (
    ArgumentError,
    BackendError,
    LockLostError,
    LockNotOwnedError,
    PrimitiveError,
    QuorumError,
)
from tenure._core.leased import (
    DEFAULT_HANDOFF_LEASE,
    DEFAULT_WAITER_LEASE,
    IDLE_TTL_MS,
    OWNER_EXPIRY_SLACK,
    RENEW_AT,
    WAITER_REFRESH,
    Acquired,
    Hold,
    LeasedStatistics,
    LockSettings,
    check_lock_name,
)
from tenure._core.redlock import (
    ADAPTIVE_MARGIN,
    DEFAULT_MASTER_TIMEOUT,
    FENCE_LIFETIME_MS,
    MAX_OVERDUE,
    SETTLE_TIMEOUT,
    SLOWEST_DECAY,
    RedlockStatistics,
    Tally,
    check_masters,
    describe_failure,
    drift_ms,
    is_slow,
    quorum,
)
from tenure._core.values import check_seconds, to_text

__all__ = ["AsyncRedlock"]

_RANDOM = random.SystemRandom()  # not the global one: its seed and state are the application's

Call = tuple[tuple[str, ...], tuple[str | int, ...]]
Send = Callable[[int], Any]
"""Makes the call to the master of that index."""


def _granted(reply: Any) -> bool:
    return isinstance(reply, list) and int(reply[0]) == 1


def _positive(reply: Any) -> bool:
    return int(reply) > 0


def _decided(tally: Tally) -> bool:
    # Not merely "out of reach": a renewal must tell lost (refused) from unsure
    # (failed), and a release that failed on a master may still be answered.
    return tally.reached or tally.lost


def _answered(tally: Tally) -> bool:
    return not tally.unreachable  # a quorum answered, whatever it said


def _everyone(tally: Tally) -> bool:
    return False  # wait for every master's answer (or the timeout)


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
        self._slowest = 0.0  # the slowest recent answer, decaying with every answer
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
        return min(max(self.call_timeout, ADAPTIVE_MARGIN * self._slowest), self.longest)

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
        with self._mutex:
            self._slowest = max(took, self._slowest * SLOWEST_DECAY)
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
    ) -> Tally:
        """Send ``send(index)`` to every master (or those in ``only``); tally the answers.

        Returns once ``until(tally)`` (by default: the quorum is reached or
        out of reach), or every master answered, or after ``timeout`` (by
        default the masters' timeout); a number from ``until`` is how much
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
            else:
                live.append(index)

        def fill(outcomes: dict[int, Any]) -> Tally:
            for slot, outcome in outcomes.items():
                index = live[slot]
                if isinstance(outcome, BaseException):
                    tally.failed[index] = describe_failure(outcome, timeout)
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

        def finished_late(slot: int, outcome: Any) -> None:
            if late is not None and not isinstance(outcome, BaseException) and good(outcome):
                late(live[slot], outcome)

        def starter(index: int) -> Callable[[], Any]:
            return lambda: self._one(index, send)

        outcomes = await race(
            [starter(index) for index in live],
            timeout,
            settled,
            finished_late,
        )
        if settled(outcomes) is False:  # out of time: those still running failed this call
            for slot, index in enumerate(live):
                if slot not in outcomes:
                    tally.failed[index] = f"no answer within {timeout:g}s"
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
        tally = await self.call(send, good, only=only, until=until, timeout=timeout)
        give_up = time.monotonic() + within
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
                send,
                good,
                only=sorted(tally.failed),
                timeout=max(self.call_timeout, min(self.settle_timeout, left)),
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
            self.script(script, keys, args), _positive, _decided, within, only=only
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
            _positive,
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


@dataclass
class _Attempt:
    """One round of an acquisition, as it ended."""

    fence: int | None = None  # the acquisition counted
    free_in: float | None = None  # seconds until a quorum's leases run out
    split: bool = False  # it took some masters, not enough
    done: bool = False  # decided: grants that come later are judged on arrival
    unreachable: QuorumError | None = None  # too many masters failed for a quorum
    slow: bool = False  # ... but a quorum may answer: those it lacks were only slow
    undecided: bool = False  # short of a quorum, refused nowhere: masters slow to answer
    late: list[int] = field(default_factory=list)  # grants that came in while deciding


SLOW_PATIENCE = 4
"""Attempts' timeouts an acquisition keeps trying while the masters failing it were only slow."""

RETRY_PAUSE = 0.05
"""Seconds between two rounds of a release asking the masters that were slow to answer."""

RELEASE_PATIENCE = 5.0
"""Seconds a release (or give-back) keeps asking masters only slow to answer (at most the lease)."""

SPLIT_GRACE = 0.01
"""Seconds an attempt split with another contender waits, at least, for its other masters."""

_late_jobs: set[Any] = set()  # give-backs of late grants, referenced until they end


def _in_background(job: Callable[[], Any]) -> None:
    """Run ``job`` in the background, keeping a reference to it until it ends."""
    started: list[Any] = []

    async def run() -> None:
        try:
            await job()
        finally:
            _late_jobs.difference_update(started)

    started.append(start_background(run, "tenure-redlock-give-back"))
    _late_jobs.update(started)


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


class AsyncRedlock(AsyncLeased):
    """A lock over several independent masters that holds while a majority of them does.

    ``clients`` is a list with one client per master (independent servers,
    no replication between them; 3 or 5 is usual). The other arguments
    follow :class:`AsyncLock` (redis-py's ``Lock`` order after ``name``):

    * ``timeout`` — lease in seconds; ``None``: 30 s renewed by the watchdog.
    * ``sleep`` — accepted for compatibility; nothing polls.
    * ``blocking`` / ``blocking_timeout`` — defaults for :meth:`acquire`;
      ``blocking_timeout`` is a deadline.
    * ``thread_local``, ``raise_on_release_error`` — as for :class:`AsyncLock`.

    Keyword-only: ``auto_renew``, ``on_lost``, ``max_hold``, ``prefix``,
    ``waiter_lease``, ``owner_name`` as for :class:`AsyncLock` (each master
    stores the owner name beside its part of the hold), and

    * ``cancel_on_lost`` — asyncio only: as for :class:`AsyncLock`.
    * ``master_timeout`` — seconds an attempt waits for the masters (default
      0.1, or a tenth of a shorter lease; at most a tenth of the lease). A release
      waits longer for a quorum, up to 1 s: nothing runs out meanwhile. Set the
      clients' own ``socket_timeout`` too, so a call to a master that never answers ends.

    Not re-entrant. Every master gets the same keys
    (``{prefix}{{{name}}}`` and suffixes).
    """

    _scripts = LeasedScripts(
        try_="redlock_acquire",
        acquire="redlock_acquire",
        release="redlock_release",
        leave="redlock_release",
        extend="lock_extend",
    )
    _not_owned = LockNotOwnedError
    _lost_error = LockLostError
    _noun = "lock"
    _reentry_hint = "a Redlock is not re-entrant: release it before acquiring again"
    _statistics_type: ClassVar[type[LeasedStatistics]] = RedlockStatistics

    def __init__(
        self,
        clients: Sequence[AsyncClient],
        name: str | bytes,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        auto_renew: bool | None = None,
        on_lost: Callable[[AsyncRedlock], None] | None = None,
        # unasync: async-only
        cancel_on_lost: bool = False,
        # unasync: sync-only
        # unasync: end
        max_hold: float | None = None,
        prefix: str = "tenure:redlock:",
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        master_timeout: float | None = None,
        owner_name: str | None = None,
    ) -> None:
        name = check_lock_name(name)
        described = check_masters(clients, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        check_seconds("sleep", sleep, allow_none=False, name=name)
        self._setup(
            clients[0],
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            max_hold=max_hold,
            waiter_lease=waiter_lease,
            handoff_lease=DEFAULT_HANDOFF_LEASE,
            thread_local=thread_local,
            on_lost=on_lost,
            # unasync: async-only
            cancel_on_lost=cancel_on_lost,
            # unasync: sync-only
            # unasync: end
            prefix=prefix,
            raise_on_release_error=raise_on_release_error,
            owner_name=owner_name,
        )
        check_seconds("master_timeout", master_timeout, allow_none=True, name=name)
        if master_timeout is None:
            master_timeout = min(DEFAULT_MASTER_TIMEOUT, self._settings.lease / 10)
        elif not master_timeout > 0 or master_timeout > self._settings.lease / 10:
            raise ArgumentError(
                "master_timeout",
                f"{master_timeout:g}s must be above 0 and at most a tenth of the lease "
                f"({self._settings.lease:g}s)",
                name=name,
            )
        self.sleep = sleep
        self.clients = tuple(clients)
        longest = self._settings.lease / 10
        self._masters = AsyncMasters(clients, described, master_timeout, name, longest)
        self._live: set[str] = set()  # tokens held now: a late grant of any other is given back
        self._attempts = 0
        self._short_attempts = 0

    def _check_settings(self, settings: LockSettings) -> None:
        masters = self._masters
        if masters.call_timeout > settings.lease / 10:
            raise ArgumentError(
                "timeout",
                f"{settings.lease:g}s is less than ten times master_timeout "
                f"({masters.call_timeout:g}s)",
                name=self.name,
            )
        masters.longest = settings.lease / 10

    @property
    def masters(self) -> tuple[str, ...]:
        """Each master, as ``host:port`` (or its socket path, or its Sentinel service)."""
        return self._masters.described

    @property
    def quorum(self) -> int:
        """How many masters must agree: ``len(clients) // 2 + 1``."""
        return self._masters.quorum

    @property
    def master_timeout(self) -> float:
        """Seconds an attempt waits for the masters."""
        return self._masters.call_timeout

    def statistics(self) -> RedlockStatistics:
        """An immutable snapshot of the counters, with the masters' figures."""
        return cast(RedlockStatistics, super().statistics())

    def _statistics_extra(self) -> dict[str, Any]:
        return {
            "masters": len(self._masters.described),
            "quorum": self._masters.quorum,
            "attempts": self._attempts,
            "short_attempts": self._short_attempts,
            "master_failures": self._masters.failures,
        }

    # -- the script calls --------------------------------------------------------

    def _release_call(self, token: str) -> Call:
        return self._release_keys(), (token, "leave", "", IDLE_TTL_MS)

    def _leave_call(self, token: str, mode: str) -> Call:
        return self._release_call(token)

    def _release_keys(self) -> tuple[str, ...]:
        """The redlock_release script's keys: the queue's, then the receipts."""
        return (*self._keys.queued[:4], *self._keys.receipts)

    async def _run(self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Any:
        # Release and leave (the only plain script calls left to the base class):
        # 1 if a quorum still held it for the token, else 0 (it ran out meanwhile).
        within = min(self._settings.lease, RELEASE_PATIENCE)
        tally = await self._masters.settle(script, keys, args, within)
        if tally.reached:
            return 1
        if tally.unreachable:
            raise tally.error("releasing", self.name)
        return 0

    async def _run_taking(
        self,
        script: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        took: Callable[[Any], bool],
    ) -> Any:
        # extend() and reacquire(): the lease a quorum holds.
        return await self._masters.extend(keys, args, self._settings.lease / 3)

    def _renewal_runner(self, hold: Hold) -> JobRunner | None:
        masters = self._masters  # not the lock: renewals must not keep it alive
        settings = self._settings

        async def renew(job: Job) -> Any:
            # Slow masters are asked again until the next renewal would be due,
            # but not past the hold's validity: its loss is told when it ends.
            left = hold.expires_at - time.monotonic()
            within = max(0.0, min(settings.lease * RENEW_AT, left))
            return await masters.extend(job.keys, job.args, within)

        return renew

    def _forget(self, hold: Hold) -> None:
        with self._mutex:
            self._live.discard(hold.token)
        super()._forget(hold)

    # -- acquire ---------------------------------------------------------------

    async def _acquire(self, wait: bool, blocking_timeout: float | None, token: str) -> bool:
        started = time.monotonic()
        deadline = None if blocking_timeout is None else started + blocking_timeout
        holder = current_holder()
        ticket = time.time_ns() // 1000  # the same on every master: one order of waiters
        settings = self._settings
        listener: _Listener | None = None
        queued = False
        unreachable = 0
        unreachable_since = 0.0
        slow_since = 0.0

        def patience_for_slow() -> float:
            return SLOW_PATIENCE * self._masters.attempt_timeout

        try:
            while True:
                if listener is None and wait and self._seen_busy:
                    listener = await self._listen(token)
                sent = time.monotonic()
                attempt = await shielded(self._attempt(token, ticket, listener))
                if attempt.unreachable is not None:
                    # Once may be a stall (of this process, or of the network):
                    # twice in a row, the masters are out of reach -- unless
                    # they were only slow to answer (a busy machine): then
                    # after a few attempts' time, while the attempts wait longer.
                    unreachable += 1
                    if unreachable == 1:
                        unreachable_since = time.monotonic()
                    patience = patience_for_slow() if attempt.slow else 0
                    if unreachable > 1 and time.monotonic() - unreachable_since >= patience:
                        await shielded(self._give_back(None, token, "leave", patient=False))
                        raise attempt.unreachable
                    if unreachable > 1:
                        await sleep(RETRY_PAUSE)  # a skipped master fails an attempt at once
                    continue
                unreachable = 0
                if attempt.fence is not None:
                    drift = drift_ms(settings.lease_ms) / 1000
                    taken = Acquired(fence=attempt.fence, lease_ms=settings.lease_ms)
                    self._took(token, taken, sent - drift, started, holder, queued)
                    self._seen_busy = queued
                    return True
                if not wait:
                    # Not waiting means not waiting for the lock, held elsewhere;
                    # masters merely slow to answer (a busy machine) get a few
                    # attempts' time, as an acquisition they fail does.
                    if not attempt.undecided:
                        return False
                    if not slow_since:
                        slow_since = time.monotonic()
                    if time.monotonic() - slow_since >= patience_for_slow():
                        return False
                    continue
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    await shielded(self._leave_quietly(token, quiet=True))
                    return self._timed_out()
                if listener is None:
                    self._seen_busy = True
                    listener = await self._listen(token)
                    continue  # take a place in line at once
                if not queued:
                    queued = True
                    with self._mutex:
                        self._counters.waiters += 1
                wake_at = now + settings.waiter_lease * WAITER_REFRESH
                if attempt.free_in is not None:
                    wake_at = min(wake_at, now + attempt.free_in + OWNER_EXPIRY_SLACK)
                if attempt.split:  # another took the rest: try again soon, not in step
                    jitter = _RANDOM.uniform(0.0, self._masters.call_timeout / 4)
                    wake_at = min(wake_at, now + jitter)
                if deadline is not None:
                    wake_at = min(wake_at, deadline)
                await listener.wait(wake_at - now)
        except BaseException as exc:
            # Failed, cancelled or interrupted: leave every line, give back any grant.
            with self._mutex:
                self._live.discard(token)
            if not isinstance(exc, (PrimitiveError, QuorumError)):
                await shielded(self._leave_quietly(token, quiet=isinstance(exc, BackendError)))
            raise
        finally:
            if listener is not None:
                listener.stop()
            if queued:
                with self._mutex:
                    self._counters.waiters -= 1

    async def _listen(self, token: str) -> _Listener:
        """Listen for wake-ups from every master.

        Waits (a master timeout at most) until a quorum of the subscriptions
        is up: a master that is down must not delay every waiter.
        """
        listener = _Listener()
        for client in self._masters.clients:
            waiter = await listen(client, token, 0.0, None, listener.event)
            listener.waiters.append(waiter)
        deadline = time.monotonic() + self._masters.call_timeout
        up = 0
        for waiter in sorted(listener.waiters, key=lambda w: not w.up):
            if up >= self.quorum:
                break
            up += await waiter.subscribed(deadline - time.monotonic())
        return listener

    async def _attempt(self, token: str, ticket: int, listener: _Listener | None) -> _Attempt:
        """Send one attempt to every master; keep it if a quorum granted it in time."""
        masters, settings = self._masters, self._settings
        sent = time.monotonic()
        self._attempts += 1
        attempt = _Attempt()
        stay = "stay" if listener is not None else "leave"
        waiter_ms = settings.waiter_lease_ms if listener is not None else 0
        waiters = listener.waiters if listener is not None else []

        mark = f"{self._attempts}"
        acquire_keys = (*self._keys.queued, *self._keys.receipts)

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
                self.owner_name,
            )
            return masters.script("redlock_acquire", acquire_keys, args)(index)

        def late(index: int, reply: Any) -> None:
            # A grant after the attempt ended: part of the hold if it is still
            # held, else given back at once (this attempt's grant only: a later
            # attempt of the same token may have taken that master since).
            with self._mutex:
                if not attempt.done:
                    attempt.late.append(index)
                    return
                keep = token in self._live
            if not keep:
                _in_background(lambda: self._give_back([index], token, "leave", mark))

        def until(tally: Tally) -> bool | float:
            if tally.settled:
                return True
            if tally.good and tally.refused:
                # Split with another owner: waiting long on a slow master would
                # keep both stuck. Wait for the rest twice as long as the
                # answers so far took, then give back and let the line decide.
                return max(SPLIT_GRACE, 2 * (time.monotonic() - sent))
            return False

        tally = await masters.call(send, _granted, late=late, until=until)
        fence: int | None = None
        if tally.reached:
            fence = await self._seal(token, tally, sent)
        if fence is not None:
            attempt.fence = fence
            with self._mutex:
                self._live.add(token)
                attempt.done = True
            return attempt
        with self._mutex:
            attempt.done = True
            taken = sorted({*tally.good, *attempt.late})
        self._short_attempts += 1
        if taken:
            # Marked with this attempt: a give-back that is still on its way
            # when a later attempt of the same token takes that master again
            # must not release the later grant.
            await self._give_back(taken, token, stay, mark)
        answered = {*taken, *tally.refused}
        unanswered = [index for index in range(len(self._masters.clients)) if index not in answered]
        if unanswered:
            # Failed, or still on its way when the attempt was decided: the
            # call may yet land (slow, or resent by the client). A
            # give-back that arrives first leaves a receipt that refuses it,
            # one that arrives after releases its grant. In the background: a
            # master that is down must not hold up the next attempt.
            _in_background(lambda: self._give_back(unanswered, token, stay, mark))
        if tally.unreachable:
            attempt.unreachable = tally.error("acquiring", self.name)
            attempt.slow = tally.may_recover
        elif not tally.refused and tally.failed and tally.may_recover:
            attempt.undecided = True  # no master refused: only slow ones kept it short
        attempt.split = bool(tally.good)
        attempt.free_in = self._free_in(tally)
        return attempt

    async def _seal(self, token: str, tally: Tally, sent: float) -> int | None:
        """The fence of a quorum's grant, once a quorum's counters are at least it.

        None if the lease left is used up (or too few masters could be raised).
        """
        settings = self._settings
        fences = {index: int(reply[1]) for index, reply in tally.good.items()}
        fence = max(fences.values())
        behind = [index for index, f in fences.items() if f < fence]
        if len(fences) - len(behind) < self.quorum:
            args = (token, fence, FENCE_LIFETIME_MS)
            keys = (self._keys.owner, self._keys.fence)
            raised = await self._masters.call(
                self._masters.script("redlock_fence", keys, args), _positive, only=behind
            )
            if len(fences) - len(behind) + len(raised.good) < self.quorum:
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
        if len(left) < self.quorum or left[self.quorum - 1] == float("inf"):
            return None
        return left[self.quorum - 1]

    async def _give_back(
        self, only: list[int] | None, token: str, mode: str, mark: str = "", *, patient: bool = True
    ) -> bool:
        """Release ``token``'s grants (attempt ``mark``'s only, if given) without raising.

        Returns whether every master asked answered (one that did not keeps
        a grant until its lease ends). Waits up to the settle timeout, or
        only ``master_timeout`` if not ``patient`` (the masters are known to
        be out of reach).
        """
        keys, args = self._release_keys(), (token, mode, mark, IDLE_TTL_MS)
        masters = self._masters
        if patient:
            within = min(self._settings.lease, RELEASE_PATIENCE)
            tally = await masters.settle("redlock_release", keys, args, within, only=only)
        else:
            tally = await masters.call(
                masters.script("redlock_release", keys, args),
                _positive,
                only=only,
                timeout=masters.call_timeout,
            )
        return not tally.failed

    # -- queries ---------------------------------------------------------------

    async def _owners(self) -> Tally:
        owner = self._keys.owner
        clients = self._masters.clients

        def send(index: int) -> Any:
            return clients[index].hget(owner, "token")

        # A question changes nothing and nothing runs out while it waits: a
        # busy machine's slow answers are waited for (the settle timeout), and
        # masters only slow are asked again, until a quorum answered.
        def held(reply: Any) -> bool:
            return reply is not None

        return await self._masters.persist(send, held, _answered, RELEASE_PATIENCE, until=_everyone)

    async def locked(self) -> bool:
        """True if one owner holds the lock on a quorum of masters.

        Masters only slow to answer are asked again (up to 5 s) before
        :class:`~tenure.QuorumError`.
        """
        tally = await self._owners()
        counts: dict[str, int] = {}
        for reply in tally.good.values():
            counts[to_text(reply)] = counts.get(to_text(reply), 0) + 1
        if counts and max(counts.values()) >= self.quorum:
            return True
        if tally.unreachable:
            raise tally.error("checking the lock", self.name)
        return False

    async def owned(self) -> bool:
        """True if this owner holds the lock on a quorum of masters (asked as :meth:`locked`)."""
        hold = self._slot.get()
        if hold is None:
            return False
        tally = await self._owners()
        mine = sum(1 for reply in tally.good.values() if to_text(reply) == hold.token)
        if mine < self.quorum and tally.unreachable:
            raise tally.error("checking the lock", self.name)
        return mine >= self.quorum
