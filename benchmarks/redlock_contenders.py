"""The multi-master locks under test, each behind the same two calls.

Every contender gets the masters' URLs and a lock name, and uses a 10 s
lease (``LEASE_SECONDS``); a blocking acquire is bounded by
``ACQUIRE_TIMEOUT``. The asyncio contenders (tenure's AsyncRedlock and
aioredlock) run on an event loop of their own, driven one call at a time,
so every contender is timed through the same synchronous calls.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import redis
import redis.asyncio

import tenure
from benchmarks import require_peer
from benchmarks.contenders import ACQUIRE_TIMEOUT, LEASE_SECONDS, BenchLock

__all__ = ["REDLOCK_CONTENDERS", "RedlockContender", "estimated_seconds", "redlock_by_key"]

Maker = Callable[[Sequence[str], str], BenchLock]


@dataclass(frozen=True)
class RedlockContender:
    """A multi-master lock with its settings, as one row of the report."""

    key: str
    label: str
    make: Maker
    peer: tuple[str, str] | None = None  # (module, package) it needs, for a clear error


def _on_loop(
    start: Callable[[], Coroutine[Any, Any, Any]],
) -> tuple[Callable[[Coroutine[Any, Any, Any]], Any], Callable[[], None]]:
    """Run coroutines on one private event loop, one call at a time; and close it."""
    loop = asyncio.new_event_loop()
    loop.run_until_complete(start())

    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        return loop.run_until_complete(coroutine)

    def close() -> None:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()

        async def drain() -> None:
            await asyncio.gather(*tasks, return_exceptions=True)

        loop.run_until_complete(drain())
        loop.close()

    return run, close


def _tenure(urls: Sequence[str], name: str) -> BenchLock:
    lock = tenure.Redlock([redis.Redis.from_url(url) for url in urls], name, timeout=LEASE_SECONDS)
    return BenchLock(lambda: lock.acquire(blocking_timeout=ACQUIRE_TIMEOUT), lock.release)


def _tenure_async(urls: Sequence[str], name: str) -> BenchLock:
    made: list[tenure.AsyncRedlock] = []

    async def start() -> None:
        clients = [redis.asyncio.Redis.from_url(url) for url in urls]
        made.append(tenure.AsyncRedlock(clients, name, timeout=LEASE_SECONDS))

    run, close = _on_loop(start)
    lock = made[0]
    return BenchLock(
        lambda: bool(run(lock.acquire(blocking_timeout=ACQUIRE_TIMEOUT))),
        lambda: run(lock.release()),
        close,
    )


def _pottery(urls: Sequence[str], name: str) -> BenchLock:
    pottery = require_peer("pottery", "pottery")
    masters = {redis.Redis.from_url(url) for url in urls}
    lock = pottery.Redlock(key=name, masters=masters, auto_release_time=LEASE_SECONDS)
    return BenchLock(lambda: bool(lock.acquire(timeout=ACQUIRE_TIMEOUT)), lock.release)


def _aioredlock(urls: Sequence[str], name: str) -> BenchLock:
    aioredlock = require_peer("aioredlock", "aioredlock")
    places = [urlparse(url) for url in urls]
    manager = aioredlock.Aioredlock([{"host": p.hostname, "port": p.port} for p in places])
    held: list[Any] = []

    async def start() -> None:
        return None

    async def acquire() -> bool:
        # aioredlock's lock() tries retry_count (3) times, 0.1-0.3 s apart, then
        # raises: keep calling it until the same deadline as every contender.
        deadline = time.monotonic() + ACQUIRE_TIMEOUT
        while True:
            try:
                held.append(await manager.lock(name, lock_timeout=LEASE_SECONDS))
                return True
            except aioredlock.LockError:
                if time.monotonic() >= deadline:
                    return False

    async def release() -> None:
        await manager.unlock(held.pop())

    run, close = _on_loop(start)

    def destroy() -> None:
        run(manager.destroy())
        close()

    return BenchLock(lambda: bool(run(acquire())), lambda: run(release()), destroy)


REDLOCK_REFERENCE = "tenure"

REDLOCK_CONTENDERS: tuple[RedlockContender, ...] = (
    RedlockContender(REDLOCK_REFERENCE, "tenure `Redlock(timeout=10)`", _tenure),
    RedlockContender("tenure-async", "tenure `AsyncRedlock(timeout=10)`", _tenure_async),
    RedlockContender(
        "pottery",
        "pottery `Redlock(auto_release_time=10)`",
        _pottery,
        peer=("pottery", "pottery"),
    ),
    RedlockContender(
        "aioredlock",
        "aioredlock `Aioredlock().lock(lock_timeout=10)` (asyncio)",
        _aioredlock,
        peer=("aioredlock", "aioredlock"),
    ),
)


def redlock_by_key(key: str) -> RedlockContender:
    """The contender called ``key`` (worker processes receive keys, not functions)."""
    for contender in REDLOCK_CONTENDERS:
        if contender.key == key:
            return contender
    raise KeyError(key)


# How long a run takes (:func:`estimated_seconds`), measured on the 2-core machine
# of docs/benchmarks.md, in seconds.
START = 1.0  # the interpreter, the report
MASTERS_START = 1.0  # three private servers
PROXY_START = 1.0  # the slow scenario's fault proxy, in a process of its own
SOLO_RUN = 0.2  # a solo run's lock object (an event loop for the asyncio ones), FLUSHDBs
WARMUP_CYCLES = 20  # before each solo run (redlock.SOLO_WARMUP)
SPAWN = 0.6  # per process of a scenario's pool: spawn, imports, connect
CONTENDED_RUN = 0.5  # per contended run: the common start's margin, collecting the records
SLOW_TRIPS = {"aioredlock": 2.0}
"""The slow master's delays in a cycle (acquire, release) of a lock that waits for every
master; the others go on with a majority."""


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long ``tenure bench redlock`` with ``args`` (checked) takes, in seconds.

    Two scenarios, each: every contender solo for ``--solo-seconds`` (after
    warm-up cycles, slow ones with a slow master), and ``--rounds`` contended
    runs of ``--seconds`` each from a pool of ``--processes`` processes.
    """
    keys = {k.strip() for k in (args.only or "").split(",") if k.strip()}
    contenders = [c for c in REDLOCK_CONTENDERS if not keys or c.key in keys]
    total = START + (0.0 if args.url else MASTERS_START) + PROXY_START
    for slow in (0.0, float(args.slow_ms) / 1000):
        total += args.processes * SPAWN
        for contender in contenders:
            late = slow * SLOW_TRIPS.get(contender.key, 0.0)
            total += args.solo_seconds + args.solo_runs * (SOLO_RUN + WARMUP_CYCLES * late)
            total += args.rounds * (args.seconds + CONTENDED_RUN + 10 * late)
    return float(total)
