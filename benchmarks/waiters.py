"""Many waiters in one process: connections used by waiting, and handoff latency.

One process queues ``count`` waiters on one ``tenure`` lock — asyncio tasks
sharing one ``redis.asyncio.Redis``, or threads sharing one ``redis.Redis``,
each over a ``BlockingConnectionPool`` of ``pool_size`` connections — while a
holder keeps the lock. Once the server's queue holds them all, the server's
``CLIENT LIST`` is read: the connections beyond those open before and those
of the pool (named ``CROWD_CLIENT_NAME``) are what waiting itself costs.
Then the holder releases and every waiter, in its turn, takes the lock and
releases it at once; handoff latency is the time from one release being
called to the next holder's acquire returning.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import redis
import redis.asyncio

import tenure
from benchmarks.contenders import LEASE_SECONDS
from tenure._tooling import LINGER

__all__ = ["CROWD_CLIENT_NAME", "CrowdResult", "crowd_of_tasks", "crowd_of_threads"]

CROWD_CLIENT_NAME = "tenure-bench-crowd"
CROWD_LOCK = "bench:crowd"
QUEUE_TIMEOUT = 60.0  # seconds for every waiter to join the server's queue
CHAIN_TIMEOUT = 120.0  # seconds for every waiter to take and release the lock in turn
POOL_TIMEOUT = 20.0  # redis-py's default wait for a connection of a blocking pool
COUNT_SAMPLES = 3  # CLIENT LIST readings while they wait (the largest is reported)


@dataclass(frozen=True)
class CrowdResult:
    """One crowd of waiters on one lock."""

    kind: str  # "tasks" or "threads"
    waiters: int
    pool_size: int
    queued: int  # waiters in the server's queue when the connections were counted
    before: int  # connections on the server before the crowd's client existed
    while_waiting: int  # connections on the server while the crowd waited
    pool_connections: int  # of those, the crowd's pool's (named CROWD_CLIENT_NAME, not pub/sub)
    subscribers: int  # of those, connections in pub/sub mode
    extra: int  # while_waiting - before - pool_connections
    handoffs: int
    handoff_p50_ms: float
    handoff_p99_ms: float
    handoff_max_ms: float
    chain_seconds: float  # from the holder's release to the last waiter's release
    overlaps: int  # a holder's acquire returned before the previous one released (must be 0)
    errors: int
    first_error: str | None


@dataclass
class _Tally:
    """What the waiters recorded: (acquire returned, release called) per hold, and errors."""

    holds: list[tuple[float, float]]
    errors: list[str]

    def fail(self, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.errors.append(text[:160])


def _count(admin: redis.Redis) -> tuple[int, int, int]:
    """(all connections, the crowd pool's, pub/sub ones) from ``CLIENT LIST``."""
    clients = admin.client_list()
    pubsub = [c for c in clients if "P" in str(c.get("flags", ""))]
    pooled = [
        c
        for c in clients
        if c.get("name") == CROWD_CLIENT_NAME and "P" not in str(c.get("flags", ""))
    ]
    return len(clients), len(pooled), len(pubsub)


def _percentile(ordered: list[float], pct: float) -> float:
    if not ordered:
        return 0.0
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def _summarize(
    kind: str,
    count: int,
    pool_size: int,
    queued: int,
    before: int,
    counted: tuple[int, int, int],
    released: float,
    tally: _Tally,
) -> CrowdResult:
    holds = sorted(tally.holds)
    ends = [released, *(releasing for _, releasing in holds)]
    gaps = sorted(got - end for (got, _), end in zip(holds, ends, strict=False))
    overlaps = sum(got < end for (got, _), end in zip(holds, ends, strict=False))
    total, pooled, pubsub = counted
    last = max((releasing for _, releasing in holds), default=released)
    missing = max(0, count - len(holds) - len(tally.errors))
    errors = list(tally.errors)
    if missing:
        errors.append(f"{missing} waiter(s) did not finish within {CHAIN_TIMEOUT:.0f} s")
    return CrowdResult(
        kind=kind,
        waiters=count,
        pool_size=pool_size,
        queued=queued,
        before=before,
        while_waiting=total,
        pool_connections=pooled,
        subscribers=pubsub,
        extra=total - before - pooled,
        handoffs=len(gaps),
        handoff_p50_ms=_percentile(gaps, 50) * 1000,
        handoff_p99_ms=_percentile(gaps, 99) * 1000,
        handoff_max_ms=(gaps[-1] if gaps else 0.0) * 1000,
        chain_seconds=last - released,
        overlaps=overlaps,
        errors=len(tally.errors) + missing,
        first_error=errors[0] if errors else None,
    )


def _settled(admin: redis.Redis) -> int:
    """Connections on the server once no pub/sub connection is left (or after a bound).

    A wake-up connection of an earlier measurement closes about two
    ``LINGER`` after its last waiter: counted now, its closing would be
    taken for a connection the crowd did not use.
    """
    deadline = time.monotonic() + 2 * LINGER + 2
    total, _, pubsub = _count(admin)
    while pubsub and time.monotonic() < deadline:
        time.sleep(0.1)
        total, _, pubsub = _count(admin)
    return total


def _sample(admin: redis.Redis) -> tuple[int, int, int]:
    """The largest of a few ``CLIENT LIST`` readings, by total connections."""
    return max((_count(admin) for _ in range(COUNT_SAMPLES)), key=lambda c: c[0])


# -- asyncio tasks ------------------------------------------------------------------


def crowd_of_tasks(url: str, count: int, pool_size: int) -> CrowdResult:
    """``count`` asyncio tasks waiting on one lock, one client over ``pool_size`` connections."""
    admin = redis.Redis.from_url(url)
    try:
        return asyncio.run(_tasks(admin, url, count, pool_size))
    finally:
        admin.close()


async def _tasks(admin: redis.Redis, url: str, count: int, pool_size: int) -> CrowdResult:
    name = f"{CROWD_LOCK}:tasks"
    before = _settled(admin)
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=POOL_TIMEOUT, client_name=CROWD_CLIENT_NAME
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    tally = _Tally([], [])
    try:
        holder = tenure.AsyncLock(client, name)  # renewed: holds however long queueing takes
        if not await holder.acquire(blocking=False):
            raise RuntimeError("the holder could not take a free lock")

        async def wait_turn() -> None:
            lock = tenure.AsyncLock(client, name, timeout=LEASE_SECONDS)
            try:
                if not await lock.acquire(blocking_timeout=QUEUE_TIMEOUT + CHAIN_TIMEOUT):
                    tally.fail("acquire returned False (gave up)")
                    return
                got = time.perf_counter()
                releasing = time.perf_counter()
                await lock.release()
            except Exception as exc:
                tally.fail(exc)
                return
            tally.holds.append((got, releasing))

        tasks = [asyncio.create_task(wait_turn()) for _ in range(count)]
        queued = 0
        deadline = time.monotonic() + QUEUE_TIMEOUT
        while time.monotonic() < deadline:
            queued = int(admin.zcard(holder.keys.queue))
            if queued >= count:
                break
            await asyncio.sleep(0.05)
        counted = _sample(admin)
        released = time.perf_counter()
        await holder.release()
        _, pending = await asyncio.wait(tasks, timeout=CHAIN_TIMEOUT)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10)
        return _summarize("tasks", count, pool_size, queued, before, counted, released, tally)
    finally:
        await client.aclose()
        await pool.aclose()


# -- threads --------------------------------------------------------------------------


def crowd_of_threads(url: str, count: int, pool_size: int) -> CrowdResult:
    """``count`` threads waiting on one lock, one client over ``pool_size`` connections."""
    name = f"{CROWD_LOCK}:threads"
    admin = redis.Redis.from_url(url)
    before = _settled(admin)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=POOL_TIMEOUT, client_name=CROWD_CLIENT_NAME
    )
    client = redis.Redis(connection_pool=pool)
    tally = _Tally([], [])
    mutex = threading.Lock()
    try:
        holder = tenure.Lock(client, name)  # renewed: holds however long queueing takes
        if not holder.acquire(blocking=False):
            raise RuntimeError("the holder could not take a free lock")

        def wait_turn() -> None:
            lock = tenure.Lock(client, name, timeout=LEASE_SECONDS)
            try:
                if not lock.acquire(blocking_timeout=QUEUE_TIMEOUT + CHAIN_TIMEOUT):
                    with mutex:
                        tally.fail("acquire returned False (gave up)")
                    return
                got = time.perf_counter()
                releasing = time.perf_counter()
                lock.release()
            except Exception as exc:
                with mutex:
                    tally.fail(exc)
                return
            with mutex:
                tally.holds.append((got, releasing))

        threads = [
            threading.Thread(target=wait_turn, name=f"bench-crowd-{i}", daemon=True)
            for i in range(count)
        ]
        for thread in threads:
            thread.start()
        queued = 0
        deadline = time.monotonic() + QUEUE_TIMEOUT
        while time.monotonic() < deadline:
            queued = int(admin.zcard(holder.keys.queue))
            if queued >= count:
                break
            time.sleep(0.05)
        counted = _sample(admin)
        released = time.perf_counter()
        holder.release()
        deadline = time.monotonic() + CHAIN_TIMEOUT
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with mutex:
            snapshot = _Tally(list(tally.holds), list(tally.errors))
        return _summarize("threads", count, pool_size, queued, before, counted, released, snapshot)
    finally:
        client.close()
        pool.disconnect()
        admin.close()
