"""Scale: what a lock costs, whatever one process holds and however many wait.

* holds: one thread (sync) or one task (asyncio) takes and keeps N locks of
  distinct names (default arguments, the lock objects kept alive), then
  times ``extra`` further acquire + release pairs on new names, acquire and
  release apart (µs per call: the mean of the pairs). The N grow within
  one round (the locks taken for the smaller N stay held), and rounds are
  repeated with the contenders interleaved; medians of the rounds are
  reported. redis-py's ``client.lock(name)`` is measured the same way, as
  the reference: it keeps nothing per held lock.
* waiters: N asyncio tasks of this process, sharing one
  ``redis.asyncio.Redis`` over a ``BlockingConnectionPool``, each with its
  own ``AsyncLock`` (default arguments) on one name held by another client.
  Queue time = from creating the tasks until the server's queue (``ZCARD``
  of ``lock.keys.queue``) holds N. Refresh traffic = commands per second
  the server processed (``total_commands_processed``) over ``window``
  seconds while all N wait, minus the same over ``window`` seconds with the
  holder alone (script calls, ``EVALSHA``/``EVAL``, shown apart). Then the
  holder releases and every task in turn takes the lock and releases it at
  once: handoffs per second = N / (last release - first release). Each N
  runs ``rounds`` times (interleaved with the other N); the median of each
  figure is reported (queueing time: a noisy machine varies it by +-30%).

Every N is bounded by ``cap`` seconds in all: a run that does not finish
is reported as not finished (its tasks cancelled), never left to hang.
Queueing may use half of it; when not every task has joined the queue by
then, the traffic and the handoffs are measured with those that have.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

import tenure
from benchmarks import BenchmarkError

__all__ = [
    "HANDOFF_RATIO",
    "HOLD_CONTENDERS",
    "HOLD_RATIO",
    "QUEUE_SECONDS",
    "REFRESH_RATIO",
    "REFRESH_SLACK",
    "SCALE_CAP",
    "HoldResult",
    "WaitersResult",
    "measure_holds",
    "measure_scale_waiters",
    "median_crowd",
]

HOLD_RATIO = 1.2  # the target: cost at the most held <= this times at the fewest
HANDOFF_RATIO = 0.8  # handoffs/s at the most waiters >= this times at the fewest
QUEUE_SECONDS = 0.4  # 10,000 waiters queued within this (the lock issue's target)
REFRESH_RATIO = 1.2  # refresh traffic at the most waiters <= this times at the fewest
REFRESH_SLACK = 5.0  # ... plus this many commands/s (the noise of a quiet server)
SCALE_CAP = 120.0  # seconds per N, all included
QUEUE_SHARE = 0.5  # of the cap, for every waiter to join the queue
POLL_SECONDS = 0.01  # between two ZCARD readings
PREFIX = "bench:scale:"
CROWD_NAME = f"{PREFIX}crowd"
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")

HOLD_CONTENDERS: dict[str, tuple[str, str]] = {
    # key -> (mode, label)
    "tenure": ("sync", "tenure `Lock(client, name)`"),
    "redis-py": ("sync", "redis-py `client.lock(name)`"),
    "tenure-async": ("asyncio", "tenure `AsyncLock(client, name)`"),
    "redis-py-async": ("asyncio", "redis-py asyncio `client.lock(name)`"),
}


@dataclass(frozen=True)
class HoldResult:
    """Acquire and release of further locks while one owner holds ``held`` of them."""

    key: str
    mode: str  # "sync" or "asyncio"
    held: int
    extra: int  # acquire + release pairs timed per round
    acquire_us: float  # median of the rounds' means
    release_us: float
    acquire_runs: tuple[float, ...]
    release_runs: tuple[float, ...]
    finished: bool  # every round took its N locks and timed its pairs within the cap
    error: str | None = None


@dataclass(frozen=True)
class WaitersResult:
    """N asyncio tasks waiting on one lock: queueing, refresh traffic, handoffs."""

    waiters: int
    pool_size: int
    queued: int  # the most ZCARD read while queueing
    queue_seconds: float | None  # None: not all queued within QUEUE_SHARE of the cap
    window_seconds: float
    queued_in_window: int | None  # ZCARD at the end of the traffic reading
    baseline_per_s: float  # commands/s with the holder alone
    waiting_per_s: float | None  # commands/s while all waited (None: not reached)
    refresh_per_s: float | None  # waiting - baseline
    scripts_per_s: float | None  # script calls/s while all waited, minus the baseline's
    handoffs: int
    drain_seconds: float | None  # the holder's release to the last waiter's (None: none served)
    handoff_rate: float | None  # handoffs per second over the drain
    unserved: int  # waiters that did not hold the lock within the cap
    finished: bool  # all queued, traffic read, all served, within the cap
    errors: int
    first_error: str | None


# -- holds ----------------------------------------------------------------------------


def _hold_label(key: str) -> str:
    return HOLD_CONTENDERS[key][1]


@dataclass
class _HoldRound:
    acquire_us: dict[int, float]
    release_us: dict[int, float]
    error: str | None = None
    setup_seconds: float = 0.0  # taking the held locks
    cleanup_seconds: float = 0.0  # releasing them
    abandoned: int = 0  # held locks left to their leases (the release took over the cap)

    def finish(self, released: int, held: int, started: float) -> None:
        """Note how the release of the held locks went."""
        self.cleanup_seconds = time.monotonic() - started
        self.abandoned = held - released
        if self.abandoned:
            _quiet_abandoned()
            self.error = self.error or (
                f"releasing the held locks took over the cap: {self.abandoned:,} left to "
                "their leases"
            )


class _AbandonedFilter(logging.Filter):
    """Drops tenure's notice of held lock objects collected: the bench dropped them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "garbage-collected while held" not in record.getMessage()


def _quiet_abandoned() -> None:
    logger = logging.getLogger("tenure.lock")
    if not any(isinstance(f, _AbandonedFilter) for f in logger.filters):
        logger.addFilter(_AbandonedFilter())


async def _done(result: Any) -> Any:
    """``result``, awaited if a call of an asyncio lock returned an awaitable."""
    return await result if inspect.isawaitable(result) else result


async def _holds(
    url: str, key: str, sizes: Sequence[int], extra: int, tag: str, cap: float
) -> _HoldRound:
    """One round of one contender; sync locks are driven from here too, unawaited."""
    out = _HoldRound({}, {})
    is_async = HOLD_CONTENDERS[key][0] != "sync"
    client: Any = (redis.asyncio.Redis if is_async else redis.Redis).from_url(url)

    def make(name: str) -> Any:
        if key == "tenure":
            return tenure.Lock(client, name)
        if key == "tenure-async":
            return tenure.AsyncLock(client, name)
        return client.lock(name)

    held: list[Any] = []
    try:
        deadline = time.monotonic() + cap * len(sizes)
        for size in sorted(sizes):
            taking = time.monotonic()
            while len(held) < size:
                lock = make(f"{PREFIX}held:{tag}:{len(held)}")
                if not await _done(lock.acquire(blocking=False)):
                    raise BenchmarkError("an uncontended acquire failed")
                held.append(lock)
                if time.monotonic() > deadline:
                    out.error = f"holding {size:,} locks took over the cap"
                    return out
            out.setup_seconds += time.monotonic() - taking
            spent_acquire = spent_release = 0.0
            for i in range(extra):
                lock = make(f"{PREFIX}extra:{tag}:{size}:{i}")
                start = time.perf_counter()
                if not await _done(lock.acquire(blocking=False)):
                    raise BenchmarkError("an uncontended acquire failed")
                middle = time.perf_counter()
                await _done(lock.release())
                spent_release += time.perf_counter() - middle
                spent_acquire += middle - start
            out.acquire_us[size] = spent_acquire / extra * 1e6
            out.release_us[size] = spent_release / extra * 1e6
    except (BenchmarkError, redis.RedisError, tenure.TenureError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:160]
    finally:
        cleanup = time.monotonic()
        released = 0
        for lock in held:
            if time.monotonic() > cleanup + cap:
                break
            with contextlib.suppress(redis.RedisError, tenure.TenureError):
                await _done(lock.release())
            released += 1
        out.finish(released, len(held), cleanup)
        await _done(client.aclose() if is_async else client.close())
    return out


def measure_holds(
    url: str,
    sizes: Sequence[int],
    extra: int,
    rounds: int,
    *,
    cap: float = SCALE_CAP,
    progress: Callable[[str], None] = lambda _: None,
) -> list[HoldResult]:
    """Each contender's acquire and release µs at each held count, medians of ``rounds``."""
    order = list(HOLD_CONTENDERS)
    runs: dict[str, list[_HoldRound]] = {k: [] for k in order}
    failed: set[str] = set()
    with redis.Redis.from_url(url) as admin:
        for round_ in range(rounds):
            for key in order if round_ % 2 == 0 else order[::-1]:
                if key in failed:
                    continue
                admin.flushdb()
                tag = f"{key}:{round_}"
                out = asyncio.run(_holds(url, key, sizes, extra, tag, cap))
                runs[key].append(out)
                if out.error:
                    failed.add(key)
                timings = ", ".join(
                    f"{n:,} held: acquire {out.acquire_us[n]:.0f} us, "
                    f"release {out.release_us[n]:.0f} us"
                    for n in sorted(out.acquire_us)
                )
                progress(
                    f"scale holds {round_ + 1}/{rounds} {key}: {timings}; taking the "
                    f"held locks took {out.setup_seconds:.1f} s, releasing them "
                    f"{out.cleanup_seconds:.1f} s" + (f" ({out.error})" if out.error else "")
                )
        admin.flushdb()
    results: list[HoldResult] = []
    for key in order:
        error = next((r.error for r in runs[key] if r.error), None)
        for size in sorted(sizes):
            acquires = tuple(r.acquire_us[size] for r in runs[key] if size in r.acquire_us)
            releases = tuple(r.release_us[size] for r in runs[key] if size in r.release_us)
            results.append(
                HoldResult(
                    key=key,
                    mode=HOLD_CONTENDERS[key][0],
                    held=size,
                    extra=extra,
                    acquire_us=statistics.median(acquires) if acquires else 0.0,
                    release_us=statistics.median(releases) if releases else 0.0,
                    acquire_runs=acquires,
                    release_runs=releases,
                    finished=error is None and len(acquires) == rounds,
                    error=error,
                )
            )
    return results


# -- waiters --------------------------------------------------------------------------


async def _counts(admin: redis.asyncio.Redis) -> tuple[int, int]:
    """(commands processed, script calls) so far, from ``INFO``."""
    stats = await admin.info("stats")
    commands = await admin.info("commandstats")
    scripts = sum(
        int(commands.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPT_COMMANDS
    )
    return int(stats["total_commands_processed"]), scripts


async def _rates(admin: redis.asyncio.Redis, seconds: float) -> tuple[float, float]:
    """(commands/s, script calls/s) over ``seconds``."""
    commands, scripts = await _counts(admin)
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    commands_after, scripts_after = await _counts(admin)
    spent = time.perf_counter() - start
    return (commands_after - commands) / spent, (scripts_after - scripts) / spent


async def _crowd(url: str, count: int, pool_size: int, window: float, cap: float) -> WaitersResult:
    started = time.monotonic()
    deadline = started + cap
    admin = redis.asyncio.Redis.from_url(url)
    holder_client = redis.asyncio.Redis.from_url(url)
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=cap
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    errors: list[str] = []
    served: list[float] = []  # release instants
    tasks: list[asyncio.Task[None]] = []
    try:
        holder = tenure.AsyncLock(holder_client, CROWD_NAME)
        if not await holder.acquire(blocking=False):
            raise BenchmarkError("the holder could not take a free lock")
        baseline, baseline_scripts = await _rates(admin, window)

        async def wait_turn() -> None:
            lock = tenure.AsyncLock(client, CROWD_NAME, blocking_timeout=cap)
            try:
                if not await lock.acquire():
                    errors.append("acquire returned False (gave up)")
                    return
                await lock.release()
            except Exception as exc:  # a finding to report, not a crash of the bench
                errors.append(f"{type(exc).__name__}: {exc}"[:160])
                return
            served.append(time.perf_counter())

        start = time.perf_counter()
        tasks = [asyncio.create_task(wait_turn()) for _ in range(count)]
        queued = 0
        queue_seconds: float | None = None
        while time.monotonic() < started + cap * QUEUE_SHARE:
            queued = max(queued, int(await admin.zcard(holder.keys.queue)))
            if queued >= count:
                queue_seconds = time.perf_counter() - start
                break
            await asyncio.sleep(POLL_SECONDS)
        waiting = scripts = None
        in_window: int | None = None
        if time.monotonic() + window < deadline:  # all queued, or as many as could be
            waiting, scripts = await _rates(admin, window)
            in_window = int(await admin.zcard(holder.keys.queue))
        released = time.perf_counter()
        await holder.release()
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        drain = max(served) - released if served else None
        return WaitersResult(
            waiters=count,
            pool_size=pool_size,
            queued=queued,
            queue_seconds=queue_seconds,
            window_seconds=window,
            queued_in_window=in_window,
            baseline_per_s=baseline,
            waiting_per_s=waiting,
            refresh_per_s=None if waiting is None else waiting - baseline,
            scripts_per_s=None if scripts is None else scripts - baseline_scripts,
            handoffs=len(served),
            drain_seconds=drain,
            handoff_rate=None if drain is None or drain <= 0 else len(served) / drain,
            unserved=count - len(served),
            finished=queue_seconds is not None and waiting is not None and not pending,
            errors=len(errors),
            first_error=errors[0] if errors else None,
        )
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        for closing in (client.aclose(), pool.aclose(), holder_client.aclose(), admin.aclose()):
            await _quietly(closing)


async def _quietly(closing: Awaitable[None]) -> None:
    try:
        await closing
    except (redis.RedisError, OSError):
        pass


def measure_scale_waiters(
    url: str,
    counts: Sequence[int],
    pool_size: int,
    window: float,
    *,
    rounds: int = 1,
    cap: float = SCALE_CAP,
    progress: Callable[[str], None] = lambda _: None,
) -> list[WaitersResult]:
    """Crowds of asyncio waiters, ``rounds`` per count (interleaved), after ``FLUSHDB`` each.

    One result per count: the medians of its rounds (see :func:`median_crowd`).
    """
    runs: dict[int, list[WaitersResult]] = {count: [] for count in counts}
    with redis.Redis.from_url(url) as admin:
        for round_ in range(rounds):
            for count in counts:
                admin.flushdb()
                result = asyncio.run(_crowd(url, count, pool_size, window, cap))
                runs[count].append(result)
                progress(
                    f"scale waiters {count:,} (round {round_ + 1}/{rounds}): "
                    f"{_waiters_text(result)}"
                )
        admin.flushdb()
    return [median_crowd(runs[count]) for count in counts]


def median_crowd(results: Sequence[WaitersResult]) -> WaitersResult:
    """One crowd's figures over its rounds: the median of each measure.

    Queueing that did not finish counts as the slowest; errors and unserved
    waiters are the rounds' worst, and ``finished`` only if every round did.
    """

    def median(values: Sequence[float | None]) -> float | None:
        known = sorted(v for v in values if v is not None)
        if len(known) < len(values) and len(known) <= len(values) // 2:
            return None  # most rounds had none: the median is "not reached"
        return statistics.median(known) if known else None

    def queue_key(r: WaitersResult) -> float:
        return float("inf") if r.queue_seconds is None else r.queue_seconds

    middle = sorted(results, key=queue_key)[(len(results) - 1) // 2]
    worst = max(results, key=lambda r: (r.errors, r.unserved))
    return dataclasses.replace(
        middle,
        baseline_per_s=statistics.median(r.baseline_per_s for r in results),
        waiting_per_s=median([r.waiting_per_s for r in results]),
        refresh_per_s=median([r.refresh_per_s for r in results]),
        scripts_per_s=median([r.scripts_per_s for r in results]),
        handoff_rate=median([r.handoff_rate for r in results]),
        drain_seconds=median([r.drain_seconds for r in results]),
        handoffs=min(r.handoffs for r in results),
        unserved=worst.unserved,
        errors=worst.errors,
        first_error=worst.first_error,
        finished=all(r.finished for r in results),
    )


def _waiters_text(r: WaitersResult) -> str:
    queue = "not all queued" if r.queue_seconds is None else f"queued in {r.queue_seconds:.3f} s"
    refresh = "-" if r.refresh_per_s is None else f"{r.refresh_per_s:,.0f}"
    scripts = "-" if r.scripts_per_s is None else f"{r.scripts_per_s:,.0f}"
    rate = "-" if r.handoff_rate is None else f"{r.handoff_rate:,.0f}"
    return (
        f"{queue} ({r.queued:,} seen), refresh {scripts} script calls/s, {refresh} "
        f"commands/s, {r.handoffs:,} handoffs at {rate}/s, {r.unserved:,} unserved, "
        f"{r.errors} errors" + (f" ({r.first_error})" if r.first_error else "")
    )
