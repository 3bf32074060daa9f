"""Per-entity locks: a new lock object on a name from a large space, each time.

What ``with Lock(client, f"order:{id}")`` costs: every cycle makes a new
lock object with the library's default arguments, enters it (acquire),
leaves it (release), with no contention. tenure's ``Lock`` / ``AsyncLock``
beside redis-py's ``client.lock(name)`` (sync and asyncio), in two variants:

* fresh: names never used before (``{prefix}{i}`` with ``i`` growing), so
  tenure starts each one's fencing tokens from the server's clock;
* reused: the names the fresh run of the same round has just used (at most
  ``REUSE_SPACE``), again in order, ``i % n``: each was used less than a
  minute before, so tenure's marker (the last fence) is still there.

tenure's other kinds (``Semaphore``, both sides of a ``ReadWriteLock``, sync
and asyncio) run the same cycles, measured beside tenure's own lock.

asyncio runs one task doing sequential cycles on a ``redis.asyncio.Redis``.
Each timed run lasts ``seconds``; rounds interleave the contenders (every
other round in reverse order) and the median of the rounds is reported.
The constructor alone (``Lock(...)`` vs ``client.lock(...)``, nothing sent)
is timed the same way, in µs per object.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from benchmarks import BenchmarkError
from benchmarks.costs import (
    COST_CYCLES,
    COST_VARIANTS,
    SEMAPHORE_LIMIT,
    async_maker,
    measure_costs,
    sync_maker,
)

__all__ = [
    "ENTITY_CONTENDERS",
    "ENTITY_RATIO",
    "KIN_RATIO",
    "REUSE_SPACE",
    "VARIANTS",
    "EntityResult",
    "entity_kin",
    "entity_label",
    "entity_pairs",
    "measure_entity",
]

ENTITY_RATIO = 1.0  # issue 40: tenure at least as fast as redis-py, every variant
REUSE_SPACE = 100_000  # the reused variant cycles over at most this many names
VARIANTS = ("fresh", "reused")
WARMUP_CYCLES = 20  # loads the scripts and opens the connection before timing
MAX_CYCLES = 2_000_000  # a bound on one timed run, whatever its duration
CONSTRUCT_SECONDS = 0.3  # longest constructor timing per round
CONSTRUCT_BATCH = 200  # constructors between two clock readings
PREFIX = "bench:entity:"

ENTITY_CONTENDERS: dict[str, tuple[str, str]] = {
    # key -> (mode, label)
    "tenure": ("sync", "tenure `Lock(client, name)`"),
    "redis-py": ("sync", "redis-py `client.lock(name)`"),
    "tenure-async": ("asyncio", "tenure `AsyncLock(client, name)`"),
    "redis-py-async": ("asyncio", "redis-py asyncio `client.lock(name)`"),
    "tenure-semaphore": ("sync", f"tenure `Semaphore(client, name, limit={SEMAPHORE_LIMIT})`"),
    "tenure-read": ("sync", "tenure `ReadWriteLock(client, name).read`"),
    "tenure-write": ("sync", "tenure `ReadWriteLock(client, name).write`"),
    "tenure-semaphore-async": (
        "asyncio",
        f"tenure `AsyncSemaphore(client, name, limit={SEMAPHORE_LIMIT})`",
    ),
    "tenure-read-async": ("asyncio", "tenure `AsyncReadWriteLock(client, name).read`"),
    "tenure-write-async": ("asyncio", "tenure `AsyncReadWriteLock(client, name).write`"),
}
"""The contenders, each with its library's defaults; tenure's come first in each mode,
its other kinds (measured beside its own lock, not redis-py's) after redis-py."""

KIN_RATIO = 0.9  # issue 40: tenure's other kinds within 0.9x of its own lock


@dataclass(frozen=True)
class EntityResult:
    """One contender in one variant: cycles per second, median of the rounds."""

    key: str
    mode: str  # "sync" or "asyncio"
    variant: str  # "fresh", "reused", "constructor", or one of COST_VARIANTS
    runs: tuple[float, ...]  # cycles/s per round (constructor: µs per object; costs: per cycle)
    median: float
    names: tuple[int, ...]  # distinct names used per round (0: constructor; costs: cycles)


# -- sync --------------------------------------------------------------------------


def _sync_cycle(key: str, client: redis.Redis) -> Callable[[str], None]:
    make = sync_maker(key, client)

    def cycle(name: str) -> None:
        with make(name):
            pass

    return cycle


def _timed(cycle: Callable[[str], None], names: Callable[[int], str], seconds: float) -> int:
    """Cycles done in ``seconds`` (or MAX_CYCLES); the caller times the call."""
    done = 0
    deadline = time.perf_counter() + seconds
    while done < MAX_CYCLES:
        cycle(names(done))
        done += 1
        if time.perf_counter() >= deadline:
            break
    return done


def _sync_round(url: str, key: str, tag: str, seconds: float) -> tuple[float, float, int]:
    """(fresh cycles/s, reused cycles/s, distinct names) of one sync contender."""
    with redis.Redis.from_url(url) as client:
        cycle = _sync_cycle(key, client)
        for i in range(WARMUP_CYCLES):
            cycle(f"{PREFIX}warm:{tag}:{i}")
        prefix = f"{PREFIX}{tag}:"
        start = time.perf_counter()
        used = _timed(cycle, lambda i: f"{prefix}{i}", seconds)
        fresh = used / (time.perf_counter() - start)
        space = min(used, REUSE_SPACE)
        start = time.perf_counter()
        done = _timed(cycle, lambda i: f"{prefix}{i % space}", seconds)
        reused = done / (time.perf_counter() - start)
    return fresh, reused, used


def _constructor_us(make: Callable[[str], object], tag: str, seconds: float) -> float:
    """µs per lock object made (names made beforehand, nothing sent)."""
    names = [f"{PREFIX}{tag}:{i}" for i in range(CONSTRUCT_BATCH)]
    made = 0
    spent = 0.0
    while spent < seconds and made < MAX_CYCLES:
        start = time.perf_counter()
        for name in names:
            make(name)
        spent += time.perf_counter() - start
        made += len(names)
    return spent / made * 1e6


# -- asyncio -------------------------------------------------------------------------


def _async_cycle(key: str, client: redis.asyncio.Redis) -> Callable[[str], Any]:
    make = async_maker(key, client)

    async def cycle(name: str) -> None:
        async with make(name):
            pass

    return cycle


async def _async_timed(
    cycle: Callable[[str], Any], names: Callable[[int], str], seconds: float
) -> int:
    done = 0
    deadline = time.perf_counter() + seconds
    while done < MAX_CYCLES:
        await cycle(names(done))
        done += 1
        if time.perf_counter() >= deadline:
            break
    return done


async def _async_round_in_loop(
    url: str, key: str, tag: str, seconds: float
) -> tuple[float, float, int]:
    client = redis.asyncio.Redis.from_url(url)
    try:
        cycle = _async_cycle(key, client)
        for i in range(WARMUP_CYCLES):
            await cycle(f"{PREFIX}warm:{tag}:{i}")
        prefix = f"{PREFIX}{tag}:"
        start = time.perf_counter()
        used = await _async_timed(cycle, lambda i: f"{prefix}{i}", seconds)
        fresh = used / (time.perf_counter() - start)
        space = min(used, REUSE_SPACE)
        start = time.perf_counter()
        done = await _async_timed(cycle, lambda i: f"{prefix}{i % space}", seconds)
        reused = done / (time.perf_counter() - start)
    finally:
        await client.aclose()
    return fresh, reused, used


async def _async_constructor_in_loop(url: str, key: str, tag: str, seconds: float) -> float:
    client = redis.asyncio.Redis.from_url(url)
    try:
        return _constructor_us(async_maker(key, client), tag, seconds)
    finally:
        await client.aclose()


# -- the part ---------------------------------------------------------------------------


def _round(url: str, key: str, tag: str, seconds: float) -> tuple[float, float, int]:
    mode = ENTITY_CONTENDERS[key][0]
    if mode == "sync":
        return _sync_round(url, key, tag, seconds)
    return asyncio.run(_async_round_in_loop(url, key, tag, seconds))


def _constructor(url: str, key: str, tag: str, seconds: float) -> float:
    mode = ENTITY_CONTENDERS[key][0]
    if mode == "sync":
        with redis.Redis.from_url(url) as client:
            return _constructor_us(sync_maker(key, client), tag, seconds)
    return asyncio.run(_async_constructor_in_loop(url, key, tag, seconds))


def measure_entity(
    url: str,
    seconds: float,
    rounds: int,
    *,
    keys: Sequence[str] = tuple(ENTITY_CONTENDERS),
    progress: Callable[[str], None] = lambda _: None,
) -> list[EntityResult]:
    """Fresh and reused cycles/s and constructor µs of each contender, medians of ``rounds``.

    Each round empties the database (``FLUSHDB``) before each contender, runs
    its fresh names for ``seconds``, then the same names again for
    ``seconds``; the constructor is timed for up to ``CONSTRUCT_SECONDS``.
    """
    unknown = set(keys) - set(ENTITY_CONTENDERS)
    if unknown:
        raise BenchmarkError(f"unknown per-entity contender(s): {', '.join(sorted(unknown))}")
    order = [k for k in ENTITY_CONTENDERS if k in keys]
    fresh: dict[str, list[float]] = {k: [] for k in order}
    reused: dict[str, list[float]] = {k: [] for k in order}
    names: dict[str, list[int]] = {k: [] for k in order}
    built: dict[str, list[float]] = {k: [] for k in order}
    costs: dict[str, dict[str, list[float]]] = {k: {v: [] for v in COST_VARIANTS} for k in order}
    construct = min(CONSTRUCT_SECONDS, seconds)
    with redis.Redis.from_url(url) as admin:
        for round_ in range(rounds):
            for key in order if round_ % 2 == 0 else order[::-1]:
                admin.flushdb()
                tag = f"{key}:{round_}"
                first, again, used = _round(url, key, tag, seconds)
                fresh[key].append(first)
                reused[key].append(again)
                names[key].append(used)
                built[key].append(_constructor(url, key, f"made:{tag}", construct))
                for variant, value in measure_costs(url, key, ENTITY_CONTENDERS[key][0]).items():
                    costs[key][variant].append(value)
                progress(
                    f"entity {round_ + 1}/{rounds} {key}: fresh {first:,.0f}/s, "
                    f"reused {again:,.0f}/s ({min(used, REUSE_SPACE):,} names), "
                    f"constructor {built[key][-1]:.2f} us"
                )
        admin.flushdb()
    results: list[EntityResult] = []
    for key in order:
        mode = ENTITY_CONTENDERS[key][0]
        used_names = tuple(names[key])
        results += [
            EntityResult(
                key, mode, "fresh", tuple(fresh[key]), statistics.median(fresh[key]), used_names
            ),
            EntityResult(
                key,
                mode,
                "reused",
                tuple(reused[key]),
                statistics.median(reused[key]),
                tuple(min(n, REUSE_SPACE) for n in used_names),
            ),
            EntityResult(
                key,
                mode,
                "constructor",
                tuple(built[key]),
                statistics.median(built[key]),
                tuple(0 for _ in used_names),
            ),
        ]
        results += [
            EntityResult(
                key,
                mode,
                variant,
                tuple(costs[key][variant]),
                statistics.median(costs[key][variant]),
                tuple(COST_CYCLES for _ in used_names),
            )
            for variant in COST_VARIANTS
        ]
    return results


def entity_label(key: str) -> str:
    """The report's label of a per-entity contender."""
    return ENTITY_CONTENDERS[key][1]


def entity_pairs() -> tuple[tuple[str, str, str], ...]:
    """(mode, tenure key, redis-py key) for each mode."""
    return (("sync", "tenure", "redis-py"), ("asyncio", "tenure-async", "redis-py-async"))


def entity_kin() -> tuple[tuple[str, str, str], ...]:
    """(mode, kind's key, tenure lock's key): tenure's other kinds beside its own lock."""
    return tuple(
        (mode, key, "tenure" if mode == "sync" else "tenure-async")
        for key, (mode, _) in ENTITY_CONTENDERS.items()
        if key.startswith("tenure-") and key != "tenure-async"
    )
