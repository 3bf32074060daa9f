"""The two measurements: solo acquire/release cycles and a contended run.

Solo runs in the calling process. The contended run uses a pool of worker
processes (multiprocessing ``spawn``), reused for every contender: each
worker makes its own client and lock, reports ready, and all of them start
at one wall-clock instant chosen by the parent and stop at a deadline.
Inside the lock a worker does a racy ``GET`` / sleep / ``SET`` increment of
a counter: any overlap of two holders shows up as a lost update.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from types import TracebackType
from typing import Any

import redis
import redis.cluster

from benchmarks import BenchmarkError
from benchmarks.contenders import ACQUIRE_TIMEOUT, BenchLock, Client, by_key
from tenure._tools.children import sigint_blocked, start_helper

__all__ = [
    "ContendedResult",
    "Plan",
    "SoloResult",
    "WorkerPool",
    "combine_rounds",
    "connect",
    "summarize",
    "time_solo",
]

LOCK_NAME = "bench:lock"
COUNTER_KEY = "bench:counter"
STARTUP_TIMEOUT = 60.0  # spawn, import, connect
START_MARGIN = 0.3  # seconds between "all ready" and the common start instant
SOLO_WARMUP_CYCLES = 20  # loads the scripts before timing
MAX_SOLO_CYCLES = 2_000_000
MAX_ACQUISITIONS_PER_WORKER = 500_000


def connect(url: str, *, cluster: bool = False) -> Client:
    """A client of ``url``: a ``RedisCluster`` when it names a cluster node."""
    if cluster:
        return redis.cluster.RedisCluster.from_url(url)
    return redis.Redis.from_url(url)


# -- solo ------------------------------------------------------------------------


@dataclass(frozen=True)
class SoloResult:
    """Acquire+release cycles per second of one contender, uncontended."""

    key: str
    runs: tuple[float, ...]
    median: float


def time_solo(lock: BenchLock, seconds: float) -> float:
    """Cycles per second of acquire+release for ``seconds`` (or MAX_SOLO_CYCLES)."""
    acquire, release = lock.acquire, lock.release
    for _ in range(SOLO_WARMUP_CYCLES):
        _cycle(acquire, release)
    cycles = 0
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline and cycles < MAX_SOLO_CYCLES:
        _cycle(acquire, release)
        cycles += 1
        now = time.perf_counter()
    return cycles / (now - start)


def _cycle(acquire: Callable[[], bool], release: Callable[[], None]) -> None:
    if not acquire():
        raise BenchmarkError("an uncontended acquire failed")
    release()


# -- contended: one worker -------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What every worker runs in one contended measurement."""

    url: str
    contender: str
    seconds: float
    critical_ms: float
    cluster: bool = False  # the URL names a cluster node: connect with RedisCluster
    masters: tuple[str, ...] = ()  # a multi-master lock's masters (benchmarks.redlock)


@dataclass(frozen=True)
class WorkerResult:
    """One worker's record of a contended run."""

    index: int
    # One (acquire called, acquire returned, release called) per acquisition, in
    # time.perf_counter() seconds: CLOCK_MONOTONIC, comparable across processes.
    holds: tuple[tuple[float, float, float], ...]
    in_window: int  # acquisitions that returned before the deadline
    increments: int  # critical sections run (the counter should grow by the sum)
    failures: int  # acquires that timed out
    error: str | None = None


@dataclass(frozen=True)
class _Ready:
    index: int
    error: str | None


def _worker_main(index: int, commands: Any, replies: Any) -> None:
    """Entry point of a worker process: run plans until told to stop (None).

    For each plan: connect and build the lock, reply ``_Ready``, receive the
    common start instant (wall clock), run, reply the ``WorkerResult``.
    """
    start_helper()  # Ctrl-C is the parent's to handle; and it dies with the parent
    while True:
        plan = commands.get()
        if plan is None or not _serve(index, plan, commands, replies):
            return


def _serve(index: int, plan: Plan, commands: Any, replies: Any) -> bool:
    """Run one plan; return False when the parent called the run off (stop)."""
    try:
        client = connect(plan.url, cluster=plan.cluster)
        if plan.masters:
            from benchmarks.redlock_contenders import redlock_by_key

            lock = redlock_by_key(plan.contender).make(plan.masters, LOCK_NAME)
        else:
            lock = by_key(plan.contender).make(client, LOCK_NAME)
        client.ping()
    except Exception as exc:
        replies.put(_Ready(index, repr(exc)))
        return False
    try:
        replies.put(_Ready(index, None))
        start_at = commands.get()
        if start_at is None:
            return False
        replies.put(_run_worker(index, plan, client, lock, start_at))
    except Exception as exc:
        replies.put(WorkerResult(index, (), 0, 0, 0, error=repr(exc)))
        return False
    finally:
        lock.close()
        client.close()
    return True


def _run_worker(
    index: int, plan: Plan, client: Client, lock: BenchLock, start_at: float
) -> WorkerResult:
    """Loop acquire → racy increment inside the lock → release until the deadline."""
    time.sleep(max(0.0, start_at - time.time()))
    deadline = time.perf_counter() + (start_at + plan.seconds - time.time())
    critical = plan.critical_ms / 1000
    acquire, release = lock.acquire, lock.release
    holds: list[tuple[float, float, float]] = []
    in_window = failures = 0
    while len(holds) < MAX_ACQUISITIONS_PER_WORKER:
        called = time.perf_counter()
        if called >= deadline:
            break
        if not acquire():
            failures += 1
            break
        returned = time.perf_counter()
        in_window += returned <= deadline
        value = int(client.get(COUNTER_KEY) or 0)
        time.sleep(critical)
        client.set(COUNTER_KEY, value + 1)
        holds.append((called, returned, time.perf_counter()))
        release()
    return WorkerResult(index, tuple(holds), in_window, len(holds), failures)


# -- contended: the pool and the summary -----------------------------------------


class WorkerPool:
    """``processes`` spawned workers, reused for every contended measurement."""

    def __init__(self, processes: int) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._replies: Any = self._context.Queue()
        self._commands: list[Any] = [self._context.Queue() for _ in range(processes)]
        self._workers: list[SpawnProcess] = []

    def __enter__(self) -> WorkerPool:
        with sigint_blocked():
            for index, commands in enumerate(self._commands):
                worker = self._context.Process(
                    target=_worker_main,
                    args=(index, commands, self._replies),
                    name=f"bench-worker-{index}",
                    daemon=True,
                )
                worker.start()
                self._workers.append(worker)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for commands in self._commands:
            commands.put(None)
        for worker in self._workers:
            if exc_type is not None:  # Ctrl-C or a failed run: stop them now
                worker.terminate()
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)

    def run(self, plan: Plan) -> list[WorkerResult]:
        """Run ``plan`` in every worker at once; return their records."""
        for commands in self._commands:
            commands.put(plan)
        for ready in self._collect(_Ready, STARTUP_TIMEOUT):
            if ready.error is not None:
                raise BenchmarkError(f"worker {ready.index} could not start: {ready.error}")
        start_at = time.time() + START_MARGIN
        for commands in self._commands:
            commands.put(start_at)
        budget = START_MARGIN + plan.seconds + ACQUIRE_TIMEOUT + 30
        results = self._collect(WorkerResult, budget)
        for result in results:
            if result.error is not None:
                raise BenchmarkError(f"worker {result.index} failed: {result.error}")
        return sorted(results, key=lambda r: r.index)

    def _collect(self, kind: type[Any], budget: float) -> list[Any]:
        deadline = time.monotonic() + budget
        replies: list[Any] = []
        while len(replies) < len(self._commands):
            left = deadline - time.monotonic()
            try:
                reply = self._replies.get(timeout=max(0.01, left))
            except queue.Empty:
                raise BenchmarkError(f"workers did not answer within {budget:.0f}s") from None
            if not isinstance(reply, kind):
                raise BenchmarkError(f"unexpected reply from a worker: {reply!r}")
            replies.append(reply)
        return replies


@dataclass(frozen=True)
class ContendedResult:
    """One contender under contention, summarized over all workers."""

    key: str
    processes: int
    seconds: float
    critical_ms: float
    acquisitions: int  # returned before the deadline, all workers
    per_process: tuple[int, ...]
    throughput: float  # acquisitions per second
    wait_p50_ms: float
    wait_p99_ms: float
    wait_max_ms: float
    worst_over_median: float  # wait max / wait p50
    fairness: float  # least served process / most served process
    hold_p50_ms: float  # acquire returned -> release called (the critical section)
    gap_p50_ms: float  # one holder's release called -> the next holder's acquire returned
    gap_p99_ms: float
    handed_on: float  # share of consecutive holds taken by another process
    overlaps: int  # hold windows that overlap the previous one (0 unless exclusion broke)
    increments: int  # critical sections run
    counter: int  # the counter's final value
    lost_updates: int  # increments - counter: 0 unless mutual exclusion broke
    timeouts: int  # acquires that gave up after ACQUIRE_TIMEOUT
    waits_ms: tuple[float, ...] = field(default=(), repr=False)  # every wait, for plots
    rounds: tuple[float, ...] = ()  # the throughput of each round (combine_rounds)


@dataclass(frozen=True)
class _History:
    """The hold windows of all workers in time order, and what lies between them."""

    gaps: list[float]
    handed_on: float
    overlaps: int


def _history(results: list[WorkerResult]) -> _History:
    windows = sorted(
        (returned, releasing, r.index) for r in results for _, returned, releasing in r.holds
    )
    gaps: list[float] = []
    handed = overlaps = 0
    for (_, prev_end, prev_owner), (start, _, owner) in itertools.pairwise(windows):
        gaps.append(start - prev_end)
        overlaps += start < prev_end
        handed += owner != prev_owner
    pairs = max(1, len(windows) - 1)
    return _History(sorted(gaps), handed / pairs, overlaps)


def summarize(
    plan: Plan, processes: int, results: list[WorkerResult], counter: int
) -> ContendedResult:
    """Fold the workers' records and the counter's final value into one result."""
    waits = sorted(returned - called for r in results for called, returned, _ in r.holds)
    held = sorted(releasing - returned for r in results for _, returned, releasing in r.holds)
    history = _history(results)
    per_process = tuple(r.in_window for r in results)
    increments = sum(r.increments for r in results)
    p50 = _percentile(waits, 50)
    worst = waits[-1] if waits else 0.0
    return ContendedResult(
        key=plan.contender,
        processes=processes,
        seconds=plan.seconds,
        critical_ms=plan.critical_ms,
        acquisitions=sum(per_process),
        per_process=per_process,
        throughput=sum(per_process) / plan.seconds,
        wait_p50_ms=p50 * 1000,
        wait_p99_ms=_percentile(waits, 99) * 1000,
        wait_max_ms=worst * 1000,
        worst_over_median=worst / p50 if p50 > 0 else float("inf"),
        fairness=min(per_process) / max(per_process) if max(per_process, default=0) else 0.0,
        hold_p50_ms=_percentile(held, 50) * 1000,
        gap_p50_ms=_percentile(history.gaps, 50) * 1000,
        gap_p99_ms=_percentile(history.gaps, 99) * 1000,
        handed_on=history.handed_on,
        overlaps=history.overlaps,
        increments=increments,
        counter=counter,
        lost_updates=increments - counter,
        timeouts=sum(r.failures for r in results),
        waits_ms=tuple(wait * 1000 for wait in waits),
    )


def combine_rounds(rounds: list[ContendedResult]) -> ContendedResult:
    """One contender's rounds as one result: the median of each figure.

    Rates, waits, fairness and the hold/gap figures are medians over the
    rounds (each taken on its own, so not necessarily from one round);
    ``per_process`` is the round with the median throughput's; the counts
    that must be 0 (lost updates, overlaps, timeouts) and the work done are
    summed; the waits of every round go to the plot.
    """
    if not rounds:
        raise ValueError("no rounds to combine")

    def median(name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in rounds))

    by_rate = sorted(rounds, key=lambda r: r.throughput)
    middle = by_rate[(len(by_rate) - 1) // 2]
    first = rounds[0]
    return ContendedResult(
        key=first.key,
        processes=first.processes,
        seconds=first.seconds,
        critical_ms=first.critical_ms,
        acquisitions=int(median("acquisitions")),
        per_process=middle.per_process,
        throughput=median("throughput"),
        wait_p50_ms=median("wait_p50_ms"),
        wait_p99_ms=median("wait_p99_ms"),
        wait_max_ms=median("wait_max_ms"),
        worst_over_median=median("worst_over_median"),
        fairness=median("fairness"),
        hold_p50_ms=median("hold_p50_ms"),
        gap_p50_ms=median("gap_p50_ms"),
        gap_p99_ms=median("gap_p99_ms"),
        handed_on=median("handed_on"),
        overlaps=sum(r.overlaps for r in rounds),
        increments=sum(r.increments for r in rounds),
        counter=sum(r.counter for r in rounds),
        lost_updates=sum(r.lost_updates for r in rounds),
        timeouts=sum(r.timeouts for r in rounds),
        waits_ms=tuple(w for r in rounds for w in r.waits_ms),
        rounds=tuple(r.throughput for r in rounds),
    )


def _percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]
