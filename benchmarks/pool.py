"""Locks on few connections: a bounded pool, and a client with a single connection.

* **Bounded pool**: ``POOL_THREADS`` threads share one ``redis.Redis`` over a
  ``redis.BlockingConnectionPool(max_connections=POOL_SIZE)``; each runs
  ``POOL_CYCLES`` acquire → hold ``POOL_HOLD_MS`` → release cycles on one
  lock name. A lock whose waiters block on pooled connections (``BLPOP``)
  can leave the holder no connection to release with: that shows up as
  errors (an exception, or an acquire that gave up) and as time.
* **Single connection**: a holder and a waiter, two threads, share one
  client made with ``single_connection_client=True``; the holder releases
  while the waiter waits, and the time from calling release to the waiter's
  acquire returning is measured (median of a few tries).

Every wait is bounded (the contenders' acquire timeout, the pool's
``POOL_TIMEOUT``, a join deadline), so no lock can hang the run.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import redis

from benchmarks.contenders import ACQUIRE_TIMEOUT, BenchLock, Contender, by_key

__all__ = [
    "POOL_CYCLES",
    "POOL_HOLD_MS",
    "POOL_SIZE",
    "POOL_THREADS",
    "POOL_TIMEOUT",
    "PoolResult",
    "PoolRun",
    "SingleResult",
    "combine_pool_runs",
    "run_pool",
    "single_connection_latency",
]

POOL_THREADS = 6
POOL_SIZE = 3
POOL_CYCLES = 3
POOL_HOLD_MS = 5.0
POOL_TIMEOUT = 5.0  # seconds a thread waits for a free connection of the pool
SINGLE_SETTLE = 0.1  # seconds at least between the waiter starting and the holder releasing
SINGLE_SPREAD = 0.1  # ... plus a share of this, spread over the tries (redis-py polls every 0.1 s)
POOL_LOCK = "bench:pool"
SINGLE_LOCK = "bench:single"


@dataclass(frozen=True)
class PoolRun:
    """One bounded-pool run of one contender."""

    seconds: float  # from the common start to the last thread done
    cycles: int  # acquire + release cycles completed
    errors: int  # exceptions, acquires that returned False, threads that hung
    first_error: str | None


@dataclass(frozen=True)
class PoolResult:
    """A contender's bounded-pool runs, with the median time."""

    key: str
    runs: tuple[float, ...]
    median: float
    cycles: int  # all runs
    errors: int  # all runs
    first_error: str | None


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 160 else text[:157] + "..."


def run_pool(
    url: str,
    key: str,
    *,
    threads: int = POOL_THREADS,
    size: int = POOL_SIZE,
    cycles: int = POOL_CYCLES,
    hold_ms: float = POOL_HOLD_MS,
) -> PoolRun:
    """``threads`` threads, ``cycles`` holds of ``hold_ms`` each, through ``size`` connections."""
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=size, timeout=POOL_TIMEOUT)
    client = redis.Redis(connection_pool=pool)
    contender = by_key(key)
    locks = [contender.make(client, f"{POOL_LOCK}:{key}") for _ in range(threads)]
    errors: list[str] = []
    completed = [0] * threads
    start = threading.Barrier(threads + 1)

    def work(index: int, lock: BenchLock) -> None:
        start.wait()
        for _ in range(cycles):
            try:
                if not lock.acquire():
                    errors.append("acquire returned False (gave up)")
                    continue
            except Exception as exc:
                errors.append(_short(exc))
                continue
            time.sleep(hold_ms / 1000)
            try:
                lock.release()
            except Exception as exc:
                errors.append(_short(exc))
                continue
            completed[index] += 1

    workers = [
        threading.Thread(target=work, args=(i, lock), name=f"bench-pool-{i}", daemon=True)
        for i, lock in enumerate(locks)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    # Each cycle waits at most: a bounded acquire, a pool wait to release, the hold.
    deadline = began + cycles * (ACQUIRE_TIMEOUT + 2 * POOL_TIMEOUT + 1) + 5
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.perf_counter()))
    seconds = time.perf_counter() - began
    hung = sum(worker.is_alive() for worker in workers)
    if hung:
        errors.append(f"{hung} thread(s) still running after {seconds:.0f} s")
    else:
        pool.disconnect()
    return PoolRun(seconds, sum(completed), len(errors), errors[0] if errors else None)


def combine_pool_runs(key: str, runs: list[PoolRun]) -> PoolResult:
    """The median time of ``runs``; errors and cycles of all of them."""
    first = next((run.first_error for run in runs if run.first_error), None)
    times = tuple(run.seconds for run in runs)
    return PoolResult(
        key=key,
        runs=times,
        median=statistics.median(times),
        cycles=sum(run.cycles for run in runs),
        errors=sum(run.errors for run in runs),
        first_error=first,
    )


@dataclass(frozen=True)
class SingleResult:
    """Release → the waiter holding it, holder and waiter on one single-connection client."""

    key: str
    latencies_ms: tuple[float, ...]  # one per try that succeeded
    median_ms: float | None
    tries: int
    errors: int
    first_error: str | None


def single_connection_latency(url: str, key: str, tries: int) -> SingleResult:
    """Median time from release to the waiter holding, over ``tries`` tries.

    Stops at the first try that fails (a lock that cannot do it usually
    fails by timing out, and more tries would only cost more time).
    """
    client = redis.Redis.from_url(url, single_connection_client=True)
    contender = by_key(key)
    latencies: list[float] = []
    errors: list[str] = []
    try:
        for index in range(tries):
            # The release comes at phases spread over SINGLE_SPREAD, so that a
            # lock that polls is not caught at one lucky (or unlucky) phase.
            settle = SINGLE_SETTLE + SINGLE_SPREAD * (index + 0.5) / tries
            try:
                latencies.append(_one_handoff(contender, client, f"{SINGLE_LOCK}:{key}", settle))
            except _TryFailed as exc:
                errors.append(str(exc))
                break
    finally:
        client.close()
    return SingleResult(
        key=key,
        latencies_ms=tuple(latencies),
        median_ms=statistics.median(latencies) if latencies else None,
        tries=tries,
        errors=len(errors),
        first_error=errors[0] if errors else None,
    )


class _TryFailed(Exception):
    """One single-connection try failed; the message says where."""


def _one_handoff(contender: Contender, client: redis.Redis, name: str, settle: float) -> float:
    """One try: hold, start a waiter thread, release; milliseconds until the waiter holds."""
    holder = contender.make(client, name)
    waiter = contender.make(client, name)
    try:
        if not holder.acquire():
            raise _TryFailed("holder: acquire of a free lock returned False")
    except Exception as exc:
        raise _TryFailed(f"holder acquire: {_short(exc)}") from exc
    outcome: list[tuple[bool, float] | BaseException] = []
    started = threading.Event()

    def wait() -> None:
        started.set()
        try:
            got = waiter.acquire()
            outcome.append((got, time.perf_counter()))
            if got:
                waiter.release()
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait, name="bench-single-waiter", daemon=True)
    thread.start()
    started.wait()
    time.sleep(settle)  # the waiter is queued (or polling) by now
    released = time.perf_counter()
    try:
        holder.release()
    except Exception as exc:
        raise _TryFailed(
            f"holder release (after {time.perf_counter() - released:.1f} s): {_short(exc)}"
        ) from exc
    finally:
        thread.join(timeout=ACQUIRE_TIMEOUT + POOL_TIMEOUT + 5)
    if thread.is_alive() or not outcome:
        raise _TryFailed("waiter: did not return")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise _TryFailed(f"waiter acquire: {_short(result)}") from result
    got, at = result
    if not got:
        raise _TryFailed(f"waiter acquire: returned False after {at - released:.1f} s")
    return (at - released) * 1000
