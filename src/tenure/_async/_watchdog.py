"""The watchdog: one background renewer per event loop.

Every held primitive that must be renewed (or confirmed after a handoff), and
every waiter that must be woken at its deadline, is a :class:`Job`: a script
call due at a monotonic time. One background task sleeps until the earliest
job is due, then runs every due job, with the jobs of one client batched
into a single pipeline round trip. A job's
``on_result`` callback sees the reply (or the error) and returns when the job
is next due, or ``None`` to drop it. The background task lingers for a
second once no jobs remain (a loop that takes and releases locks does not
start one per lock), then exits; the next :meth:`AsyncWatchdog.schedule`
starts it again. Jobs carry a slack: a job may run up to that much early,
never late (a renewal due at a third of its lease is the promise that a lost
hold is noticed within a third of its lease). The task sleeps until the first
job is due and then runs every job whose window has opened, so renewals of
many holds share wake-ups and round trips. Jobs wait in two heaps (by due
time, by window opening), so scheduling, cancelling and each wake-up cost
O(log n) per job, however many holds the process keeps.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from redis import exceptions as redis_errors

from tenure._async._scripting import AsyncClient, registry_for
from tenure._backends.for_asyncio import Event, Mutex, race, scope_key, start_background
from tenure._core.clients import is_cluster, translate_error
from tenure._core.scripts import load_script, operation

__all__ = ["AsyncWatchdog", "Deferred", "Job", "JobRunner", "watchdog"]

IDLE_LINGER = 1.0
"""Seconds the background task stays alive with nothing to do."""

STALL_WAIT = 0.2
"""Seconds the watchdog waits for a batch of calls before it goes on without it.

A batch not answered by then (its server cut off, paused, or dead behind its
client's retries) runs on by itself; its jobs are handled when it ends, and
the other clients' jobs are served meanwhile."""

logger = logging.getLogger("tenure.watchdog")

OnResult = Callable[[Any, BaseException | None], float | None]
JobRunner = Callable[["Job"], Awaitable[Any]]
"""Runs one job and returns its reply (a job with a runner is never batched)."""


@dataclass(eq=False)
class Job:
    """A script call due at ``due`` (monotonic seconds); see the module docstring.

    ``slack`` is how much before ``due`` the job may run (never after): a
    renewal due at a third of its lease is as good a little sooner, and the
    slack lets the watchdog serve many such jobs with one wake-up. A wake-up
    of a waiter has no slack.
    """

    due: float
    client: AsyncClient
    script: str
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    on_result: OnResult
    name: str | None = None
    slack: float = 0.0
    cancelled: bool = False
    runner: JobRunner | None = None
    wanted: Callable[[], bool] | None = None
    """Asked just before the job runs: False drops it unrun (its owner is gone)."""
    queued: int = field(default=-1, repr=False)
    """The number of its entries in the watchdog's heaps while it waits (-1: not waiting)."""

    def drop_payload(self) -> None:
        """Let go of what a cancelled job would have used (its callbacks, its call).

        Its entries stay in the heaps until they are met or compacted away;
        emptied, they keep nothing else alive meanwhile (a released hold, its
        owner, the callbacks' closures), so a process that takes and releases
        many locks leaves the garbage collector no more to do than the shells.
        """
        self.on_result = _dropped
        self.wanted = None
        self.runner = None
        self.keys = self.args = ()


def _dropped(reply: Any, error: BaseException | None) -> None:
    """A cancelled job's callback: nothing to do."""


class Deferred:
    """A renewal not planned yet: most holds end long before their first renewal.

    Keeping one costs an entry in an insertion-ordered dict (one per lease
    length, so each is in the order its renewals fall due) where a
    :class:`Job` costs its callbacks, its call and two heap entries; when its
    window ``opens``, the watchdog calls ``start(deferred)`` (outside its
    mutex), which plans the real job (or nothing, if the hold ended meanwhile).
    """

    __slots__ = ("bucket", "due", "hold", "opens", "start")

    def __init__(
        self,
        bucket: int,
        due: float,
        opens: float,
        start: Callable[[Deferred], None],
        hold: Any = None,
    ) -> None:
        self.bucket = bucket
        """The lease in ms: deferred renewals of one bucket fall due in their order."""
        self.due = due
        self.opens = opens
        self.start = start
        self.hold = hold
        """The hold it renews (for ``start``; a bound method, not a closure, per hold)."""


class AsyncWatchdog:
    """Runs due jobs in the background, batching those of one client."""

    def __init__(self) -> None:
        self._mutex = Mutex()
        # (due, entry, job) and (due - slack, entry, job); an entry whose job
        # has another one now (re-planned, taken, cancelled) is dropped when met.
        self._by_due: list[tuple[float, int, Job]] = []
        self._by_opening: list[tuple[float, int, Job]] = []
        self._entries = itertools.count()
        self._waiting = 0  # jobs waiting (each has one live entry in each heap)
        self._deferred: dict[int, dict[Deferred, None]] = {}  # bucket -> in order of opening
        self._wakeup = Event()
        self._running = False
        self._idle_since: float | None = None
        self._sleep_until = float("-inf")  # when the sleeping task wakes by itself
        self._worker: Any = None  # the background task, strongly referenced
        self.batches = 0
        self.calls = 0

    @property
    def running(self) -> bool:
        """Whether the background task is alive."""
        return self._running

    def schedule(self, job: Job) -> Job:
        """Queue ``job`` to run at ``job.due`` (within its slack); return it.

        A job already waiting is planned again at its ``due`` and ``slack`` now.
        """
        with self._mutex:
            self._plan(job)
        return job

    def replan(self, job: Job, due: float) -> None:
        """Move a waiting ``job`` to ``due``; a job running or done is left as it is."""
        with self._mutex:
            if job.queued >= 0:
                job.due = due
                self._plan(job)

    def _plan(self, job: Job) -> None:
        """Queue ``job`` at its ``due`` and ``slack`` (under the mutex)."""
        if job.queued < 0:
            self._waiting += 1
        entry = job.queued = next(self._entries)
        heapq.heappush(self._by_due, (job.due, entry, job))
        heapq.heappush(self._by_opening, (job.due - job.slack, entry, job))
        self._compact()
        self._rouse(job.due)

    def defer(self, deferred: Deferred) -> Deferred:
        """Keep ``deferred`` until its window opens, then call its ``start``; return it."""
        with self._mutex:
            self._deferred.setdefault(deferred.bucket, {})[deferred] = None
            self._rouse(deferred.opens)
        return deferred

    def _rouse(self, at: float) -> None:
        """Make sure the background task runs by ``at`` (under the mutex)."""
        if not self._running:
            self._running = True
            self._sleep_until = float("-inf")
            # Kept in self._worker: see start_background.
            self._worker = start_background(self._run, "tenure-watchdog")
        elif at < self._sleep_until:
            self._wakeup.set()  # it sleeps past this window: wake it to re-plan

    def cancel(self, job: Job | Deferred | None) -> None:
        """Drop ``job`` if it has not run yet (a running job's result is ignored)."""
        if isinstance(job, Deferred):
            with self._mutex:
                waiting = self._deferred.get(job.bucket)
                if waiting is not None and job in waiting:
                    del waiting[job]
                    if not waiting:
                        del self._deferred[job.bucket]
            return
        if job is None or job.cancelled:
            return
        job.cancelled = True
        with self._mutex:
            if job.queued < 0:
                return  # running now (its result is ignored) or never queued
            job.queued = -1
            self._waiting -= 1
            job.drop_payload()
            self._compact()

    def _compact(self) -> None:
        """Drop the dead entries once they outnumber the live ones (amortised O(1))."""
        if len(self._by_due) + len(self._by_opening) <= 4 * self._waiting + 128:
            return
        self._by_due = [item for item in self._by_due if item[2].queued == item[1]]
        self._by_opening = [item for item in self._by_opening if item[2].queued == item[1]]
        heapq.heapify(self._by_due)
        heapq.heapify(self._by_opening)

    def _take_due(self) -> tuple[list[Job], float | None]:
        """Split off the jobs to run now; return them and how long to sleep after."""
        with self._mutex:
            self._wakeup.clear()
            now = time.monotonic()
            due: list[Job] = []
            opening = self._by_opening
            while opening and opening[0][0] <= now + 0.001:
                _, entry, job = heapq.heappop(opening)
                if job.queued == entry:  # its live entry: take it
                    job.queued = -1
                    self._waiting -= 1
                    if job.wanted is not None and not job.wanted():
                        job.cancelled = True  # its owner is gone: dropped unrun
                        continue
                    due.append(job)
            by_due = self._by_due
            while by_due and by_due[0][2].queued != by_due[0][1]:
                heapq.heappop(by_due)  # taken, planned again or cancelled
            wake = by_due[0][0] if by_due else float("inf")
            for waiting in self._deferred.values():
                wake = min(wake, next(iter(waiting)).opens)
            if due:
                self._idle_since = None
                self._sleep_until = float("-inf")  # busy: it re-plans when done
                return due, 0.0
            if wake == float("inf"):
                if self._idle_since is None:
                    self._idle_since = now
                idle = now - self._idle_since
                if idle >= IDLE_LINGER:
                    self._running = False
                    self._idle_since = None
                    return [], None
                wake = now + IDLE_LINGER - idle
            else:
                self._idle_since = None
            self._sleep_until = wake
            return [], max(0.0, wake - now)

    def _take_opened(self) -> list[Deferred]:
        """Split off the deferred renewals whose window has opened."""
        opened: list[Deferred] = []
        with self._mutex:
            if not self._deferred:
                return opened
            now = time.monotonic() + 0.001
            for bucket, waiting in list(self._deferred.items()):
                ready = []
                for deferred in waiting:
                    if deferred.opens > now:
                        break
                    ready.append(deferred)
                for deferred in ready:
                    del waiting[deferred]
                if not waiting:
                    del self._deferred[bucket]
                opened += ready
        return opened

    async def _run(self) -> None:
        try:
            while True:
                for deferred in self._take_opened():
                    deferred.start(deferred)  # plans its job (it takes the mutex)
                due, wait = self._take_due()
                if wait is None:
                    return
                if due:
                    await self._execute(due)
                else:
                    await self._wakeup.wait(wait)
        except BaseException:
            with self._mutex:
                self._running = False
            raise

    async def _execute(self, due: list[Job]) -> None:
        groups: dict[tuple[int, bool], list[Job]] = {}
        for job in due:  # jobs with a runner of their own never share a pipeline
            groups.setdefault((id(job.client), job.runner is None), []).append(job)
        batches = list(groups.values())
        # Each client's batch runs on its own, and the watchdog waits for them
        # at most STALL_WAIT: a server that does not answer (cut off, paused,
        # dead behind a client's retries) delays only its own jobs, never the
        # renewals due meanwhile on the others. A batch that ends later is
        # handled then (its jobs are rescheduled from its outcome).
        calls = [partial(self._call, jobs) for jobs in batches]

        def late(index: int, outcome: Any) -> None:
            self._finish(batches[index], outcome)

        lanes = [jobs[0].client for jobs in batches]
        outcomes = await race(calls, STALL_WAIT, partial(_all_in, len(calls)), late, lanes)
        for index, outcome in outcomes.items():
            self._finish(batches[index], outcome)

    def _finish(self, jobs: list[Job], outcome: Any) -> None:
        """Hand one batch's replies to its jobs' callbacks; reschedule what they ask."""
        if isinstance(outcome, BaseException):  # (the batch itself failed: every job with it)
            outcome = [(None, outcome)] * len(jobs)
        results: list[tuple[Any, BaseException | None]] = outcome
        with self._mutex:
            self.batches += 1
            self.calls += len(jobs)
        for job, (reply, error) in zip(jobs, results, strict=True):
            if job.cancelled:
                continue
            try:
                next_due = job.on_result(reply, error)
            except Exception:  # a user's on_lost callback must not kill the watchdog
                logger.exception("tenure watchdog: callback of %s failed", job.name)
                next_due = None
            if next_due is not None and not job.cancelled:
                job.slack = min(job.slack, max(0.0, next_due - time.monotonic()) / 2)
                job.due = next_due
                self.schedule(job)

    async def _call(self, jobs: list[Job]) -> list[tuple[Any, BaseException | None]]:
        client = jobs[0].client
        if len(jobs) == 1 or is_cluster(client) or jobs[0].runner is not None:
            return [await self._call_one(job) for job in jobs]
        results: list[tuple[Any, BaseException | None]] = []
        try:
            async with client.pipeline(transaction=False) as pipe:
                for job in jobs:
                    script = load_script(job.script)
                    pipe.execute_command("EVALSHA", script.sha, len(job.keys), *job.keys, *job.args)
                replies = await pipe.execute(raise_on_error=False)
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            error = translate_error(exc, doing="renewing in the background")
            return [(None, error) for _ in jobs]
        for job, reply in zip(jobs, replies, strict=True):
            if isinstance(reply, redis_errors.NoScriptError):
                results.append(await self._call_one(job))
            elif isinstance(reply, BaseException):
                error = translate_error(
                    reply, name=job.name, doing=operation(job.script), script=job.script
                )
                results.append((None, error))
            else:
                results.append((reply, None))
        return results

    async def _call_one(self, job: Job) -> tuple[Any, BaseException | None]:
        try:
            if job.runner is not None:
                reply = await job.runner(job)
            else:
                reply = await registry_for(job.client).run(
                    job.script, job.keys, job.args, name=job.name
                )
        except Exception as exc:
            return None, exc
        return reply, None


def _all_in(count: int, outcomes: dict[int, Any]) -> bool:
    """Whether every one of ``count`` batches has its outcome."""
    return len(outcomes) == count


_watchdogs: dict[object, AsyncWatchdog] = {}
_watchdogs_mutex = Mutex()


def watchdog() -> AsyncWatchdog:
    """The watchdog of the running event loop."""
    key = scope_key()
    found = _watchdogs.get(key)  # the common case needs no lock
    if found is not None:
        return found
    with _watchdogs_mutex:
        found = _watchdogs.get(key)
        if found is None:
            for other in [k for k, w in _watchdogs.items() if not w.running and k != key]:
                del _watchdogs[other]
            found = _watchdogs[key] = AsyncWatchdog()
        return found
