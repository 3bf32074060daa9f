"""What threads do differently from asyncio: the hand-written half of a pair.

Same names and meanings as ``tenure._backends.for_asyncio``; the generated sync
code imports this module wherever the async source imports that one.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from tenure._backends.event_loops import (
    TwinHints,
    before_waiting,
    dropped_on_loop,
    refuse_awaited_call,
    taken_on_loop,
)
from tenure._backends.owners import BaseOwnerSlot, generation

logger = logging.getLogger("tenure.lock")

__all__ = [
    "CAN_CANCEL_HOLDER",
    "IS_ASYNC",
    "Event",
    "Mutex",
    "OwnerSlot",
    "TwinHints",
    "absorb_guard_cancel",
    "before_waiting",
    "cancel_holder",
    "current_holder",
    "dropped_on_loop",
    "guarded",
    "in_batches",
    "is_cancellation",
    "node_pipeline",
    "on_signals",
    "race",
    "refuse_awaited_call",
    "scope_key",
    "shielded",
    "sleep",
    "source_call",
    "start_background",
    "taken_on_loop",
]

IS_ASYNC = False
CAN_CANCEL_HOLDER = False

T = TypeVar("T")


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` ends a call from outside (Ctrl-C, an exit), not as its failure."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def sleep(seconds: float) -> None:
    """Sleep the calling thread."""
    time.sleep(seconds)


class Event:
    """An event a background thread waits on with a timeout."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        """Wake the waiter."""
        self._event.set()

    def clear(self) -> None:
        """Reset, so the next wait blocks."""
        self._event.clear()

    def is_set(self) -> bool:
        """Whether the event is set."""
        return self._event.is_set()

    def wait(self, timeout: float | None) -> bool:
        """Wait until set or ``timeout`` seconds pass (None: no limit); True if it was set."""
        return self._event.wait(timeout)


class Mutex:
    """A re-entrant lock guarding state shared between user threads and the watchdog.

    Making one returns a plain ``threading.RLock`` (entered and left in C:
    8 of them per lock cycle), kept in a weak set so that a fork's child
    re-initialises every one at once: one held by a thread of the parent at
    the fork would otherwise be held for ever in the child.
    """

    def __new__(cls) -> Any:
        lock = threading.RLock()
        _mutexes.add(lock)
        return lock


_mutexes: weakref.WeakSet[Any] = weakref.WeakSet()
"""Every mutex made (re-initialised in a fork's child)."""


def start_background(job: Callable[[], object], name: str) -> Any:
    """Run ``job`` in a daemon thread; return the thread."""
    thread = threading.Thread(target=job, name=name, daemon=True)
    thread.start()
    return thread


_scope: tuple[str, int] = ("process", generation())


def scope_key() -> object:
    """What a background service is shared by: this process (a fork's child gets its own).

    Asked at every cache fetch: the key is made once per generation, not per call.
    """
    global _scope
    scope = _scope
    if scope[1] != generation():
        scope = _scope = ("process", generation())
    return scope


def shielded(call: T) -> T:
    """Threads cannot be cancelled half-way, so there is nothing to shield."""
    return call


def current_holder() -> object:
    """Who owns a token taken now: the current thread."""
    return threading.current_thread()


def cancel_holder(holder: object) -> None:
    """Threads cannot be cancelled; sync primitives report loss by flag and error."""
    return


def absorb_guard_cancel(holder: object, exc: BaseException | None) -> bool:
    """Threads are never cancelled by the guard: always False."""
    return False


def _thread_finished(thread: object) -> bool:
    return isinstance(thread, threading.Thread) and not thread.is_alive()


class OwnerSlot(BaseOwnerSlot[T]):
    """Per-thread storage of a primitive's holds (see :mod:`tenure._backends.owners`).

    With ``per_owner=False`` every thread shares one slot: acquire in one
    thread, release in another.
    """

    def __init__(self, per_owner: bool) -> None:
        super().__init__(per_owner, threading.current_thread, _thread_finished)


def guarded(call: T, undo: Callable[[T], object]) -> T:
    """Threads are not cancelled between a call and its reply: nothing to undo."""
    return call


@contextlib.contextmanager
def on_signals(signals: tuple[int, ...], callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on each of ``signals`` while the block runs; then the old handlers.

    Python runs signal handlers in the main thread only, so ``signals`` must
    be empty anywhere else (:class:`~tenure.ArgumentError`).
    """
    if signals and threading.current_thread() is not threading.main_thread():
        from tenure._core.exceptions import ArgumentError

        raise ArgumentError("stop_signals", "signal handlers can only be set in the main thread")
    previous = {number: signal.signal(number, lambda *_: callback()) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def source_call(call: Callable[[], Any]) -> Any:
    """A source's call, made in the calling thread."""
    return call()


def in_batches(rows: Iterable[T], size: int) -> Iterator[list[T]]:
    """``rows`` as lists of up to ``size``."""
    iterator = iter(rows)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def node_pipeline(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` to one cluster node on one connection; replies or errors, in order.

    A sync cluster node carries a ``redis.Redis`` of its own; its pipeline
    takes one connection for the whole batch.
    """
    with node.redis_connection.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))


class _Workers:
    """Daemon threads that run the calls of :func:`race`, started on demand within limits.

    Daemon threads, not a ``ThreadPoolExecutor``: a call stuck on a server
    that never answers must not keep the interpreter from exiting. Each job
    is a call, what to do with its outcome (its result, or the exception it
    raised), run in the worker's thread, and its lane: the server it goes to.

    Per lane, ``limit`` threads at most while their calls make progress. A
    lane is compared by identity (``None`` is one lane for every call that
    names none), so calls to a healthy master never queue behind calls to a
    dead one, however many of those a burst started before they could count
    as stuck. A worker whose call has run :data:`STUCK_AFTER` seconds (a
    master that refuses connections behind a client's retry backoff, or
    never answers) does not count against its lane's limit either.
    ``ceiling`` bounds the threads whatever happens; a thread idle for
    :data:`IDLE_FOR` seconds ends.
    """

    def __init__(self, limit: int, ceiling: int) -> None:
        self._limit = limit
        self._ceiling = ceiling
        self._mutex: threading.Lock
        self._reset()

    def _reset(self) -> None:
        self._mutex = threading.Lock()  # in a fork's child: a thread of the parent may hold it
        self._more = threading.Condition(self._mutex)  # a job was queued
        self._jobs: collections.deque[_Job] = collections.deque()
        self._threads = 0
        self._idle = 0  # threads waiting for a job
        self._busy: dict[object, tuple[object, float]] = {}  # a call's mark -> (lane, began)
        self._rechecking = False  # a timer will look at the queued jobs again

    def _room(self, lane: object, now: float) -> bool:
        """Whether a thread may start for a call in ``lane`` (the mutex held)."""
        if self._threads >= self._ceiling:
            return False
        stuck = now - STUCK_AFTER
        busy = sum(1 for on, began in self._busy.values() if on is lane and began > stuck)
        return busy < self._limit

    def _take(self, job: _Job, now: float) -> object:
        """Count ``job`` as running in its lane from ``now`` (the mutex held); its mark."""
        mark = object()
        self._busy[mark] = (job[2], now)
        return mark

    def submit(
        self, call: Callable[[], Any], deliver: Callable[[Any], None], lane: object = None
    ) -> None:
        """Run ``call`` in a worker, then ``deliver(outcome)`` there (``lane``: its server)."""
        job = (call, deliver, lane)
        mark = None
        recheck = False
        with self._mutex:
            now = time.monotonic()
            if self._idle <= len(self._jobs) and self._room(lane, now):
                self._threads += 1
                mark = self._take(job, now)
            else:  # an idle worker takes it, or it waits for room in its lane
                self._jobs.append(job)
                self._more.notify()
                recheck = self._idle < len(self._jobs) and not self._rechecking
                self._rechecking = self._rechecking or recheck
        if mark is not None:
            self._start(job, mark)
        elif recheck:
            self._recheck_later()

    def _start(self, job: _Job, mark: object) -> None:
        thread = threading.Thread(target=self._work, args=(job, mark), name="tenure-race")
        thread.daemon = True
        thread.start()

    def _recheck_later(self) -> None:
        """Jobs wait for room: look again once the busy calls may count as stuck."""
        timer = threading.Timer(STUCK_AFTER, self._recheck)
        timer.daemon = True
        timer.start()

    def _recheck(self) -> None:
        """Start a thread for each queued job whose lane has room now."""
        starts: list[tuple[_Job, object]] = []
        with self._mutex:
            now = time.monotonic()
            for job in list(self._jobs):
                if len(self._jobs) <= self._idle:
                    break  # the idle workers take the rest
                if self._room(job[2], now):
                    self._jobs.remove(job)
                    self._threads += 1
                    starts.append((job, self._take(job, now)))
            self._rechecking = again = len(self._jobs) > self._idle
        for job, mark in starts:
            self._start(job, mark)
        if again:
            self._recheck_later()

    def _work(self, job: _Job | None, mark: object) -> None:
        while True:
            if job is None:
                with self._mutex:
                    self._idle += 1
                    while not self._jobs:
                        if not self._more.wait(IDLE_FOR) and not self._jobs:
                            self._idle -= 1
                            self._threads -= 1
                            return
                    self._idle -= 1
                    job = self._jobs.popleft()
                    mark = self._take(job, time.monotonic())
            try:
                try:
                    outcome = job[0]()
                except BaseException as exc:
                    outcome = exc
                job[1](outcome)
            except Exception:  # a late handler that failed: the worker goes on
                logger.exception("tenure: handling a late call's outcome failed")
            finally:
                outcome = job = None  # (a traceback would hold this frame)
                with self._mutex:
                    self._busy.pop(mark, None)


_Job = tuple[Callable[[], Any], Callable[[Any], None], object]

STUCK_AFTER = 1.0
"""Seconds after which a race worker's call counts as stuck (see :class:`_Workers`)."""
IDLE_FOR = 60.0
"""Seconds after which a race worker with nothing to do ends."""

_workers = _Workers(limit=64, ceiling=1024)


class _Race:
    """The outcomes of one race's calls, as their workers deliver them.

    The racer waits on one plain lock, released when an outcome comes in
    (no Future per call, no waiter object per wait); once it gives up, later
    outcomes go to its ``late`` handler, in the worker's thread.
    """

    __slots__ = ("late", "mutex", "outcomes", "ready", "signal")

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.signal = threading.Lock()
        self.signal.acquire()
        self.ready = False  # ``signal`` released and not yet taken back by the racer
        self.outcomes: dict[int, Any] = {}
        self.late: Callable[[int, Any], None] | None = None

    def deliver(self, index: int, outcome: Any) -> None:
        """Call ``index`` ended with ``outcome``: wake the racer, or hand it to ``late``."""
        with self.mutex:
            late = self.late
            wake = False
            if late is None:
                self.outcomes[index] = outcome
                wake, self.ready = not self.ready, True
        if late is not None:
            late(index, outcome)
        elif wake:
            self.signal.release()

    def wait(self, timeout: float) -> dict[int, Any]:
        """The outcomes in, once a new one came or ``timeout`` seconds passed."""
        taken = self.signal.acquire(timeout=max(0.0, timeout))
        with self.mutex:
            if taken:
                self.ready = False
            return dict(self.outcomes)

    def give_up(self, seen: dict[int, Any], late: Callable[[int, Any], None]) -> None:
        """The racer returns ``seen``: every other outcome, in or to come, goes to ``late``."""
        with self.mutex:
            self.late = late
            unseen = [(i, o) for i, o in self.outcomes.items() if i not in seen]
        for index, outcome in unseen:
            try:
                late(index, outcome)
            except Exception:  # as a worker does: the racer returns all the same
                logger.exception("tenure: handling a late call's outcome failed")


def _after_fork_in_child() -> None:
    """A fork's child has none of the parent's threads: no worker, no lock held."""
    _workers._reset()
    for mutex in list(_mutexes):
        mutex._at_fork_reinit()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def race(
    calls: Sequence[Callable[[], T]],
    timeout: float,
    settled: Callable[[dict[int, T | BaseException]], bool | float],
    late: Callable[[int, T | BaseException], None],
    lanes: Sequence[object] | None = None,
) -> dict[int, T | BaseException]:
    """Start every call at once (worker threads); return the outcomes in by settled/timeout.

    Outcomes (a result or the exception raised) are keyed by the call's
    index. The race ends as soon as ``settled(outcomes)`` is true (a number
    instead: wait at most that many seconds more) or ``timeout`` seconds
    passed; each call still running goes on, and its
    outcome goes to ``late(index, outcome)`` when it comes. ``lanes`` names
    the server each call goes to (compared by identity): calls to one server
    never wait for worker threads held by calls to another.
    """
    deadline = time.monotonic() + timeout
    racing = _Race()
    for index, call in enumerate(calls):
        _workers.submit(call, partial(racing.deliver, index), lanes and lanes[index])
    outcomes: dict[int, T | BaseException] = {}
    try:
        while len(outcomes) < len(calls):
            verdict = settled(outcomes)
            if verdict is True:
                break
            if verdict is not False:  # a number: wait at most that much longer
                deadline = min(deadline, time.monotonic() + verdict)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            outcomes = racing.wait(left)
    finally:
        racing.give_up(outcomes, late)
    return outcomes
