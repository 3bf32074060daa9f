"""Memory per lock name: N distinct names, each acquired and released once.

A lock used once and released should leave nothing behind for long. tenure
keeps a released name's marker (its last fencing token and release
receipt) for ``IDLE_TTL`` (so fencing tokens keep growing across quick re-use, and a
resent release is recognised) and then lets them expire; redis-py's Lock
deletes its only key on release. This module drives ``N`` names through
each, from ``NAME_PROCESSES`` spawned processes running
``NAME_CONCURRENCY`` asyncio tasks apiece (``tenure.AsyncLock`` and redis-py's
asyncio Lock, each with a 10 s lease), samples ``DBSIZE`` and
``used_memory`` while they run, reads them right after, and then, for a
contender that left keys, polls ``DBSIZE`` until it reaches 0 or a cap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from typing import Any

import redis
import redis.asyncio

import tenure
from benchmarks import BenchmarkError
from benchmarks.contenders import LEASE_SECONDS
from tenure._tooling import IDLE_TTL
from tenure._tools.children import sigint_blocked, start_helper

__all__ = [
    "DEFAULT_IDLE_CAP",
    "IDLE_MARGIN",
    "NAME_CONCURRENCY",
    "NAME_KINDS",
    "NAME_PROCESSES",
    "NamesResult",
    "drive_names",
    "measure_names",
    "wait_idle",
]

NAME_PROCESSES = 2  # one per CPU of the machine the figures were taken on
NAME_CONCURRENCY = 100  # asyncio tasks per process, each with its own connection
NAME_PREFIX = "bench:name:"
NAME_KINDS = ("tenure", "redis-py")
IDLE_MARGIN = 60.0  # the idle wait's cap beyond IDLE_TTL, by default
DEFAULT_IDLE_CAP = IDLE_TTL + IDLE_MARGIN
SAMPLE_EVERY = 1.0  # seconds between DBSIZE / used_memory samples
MIN_RATE = 500  # names per second below which a run is called off as hung


@dataclass(frozen=True)
class NamesResult:
    """One contender's keys and memory for ``names`` names used once each."""

    key: str
    names: int
    processes: int  # 0: in the calling process
    concurrency: int
    seconds: float  # to acquire + release every name
    errors: int
    first_error: str | None
    used_before: int  # used_memory after FLUSHDB, before the run (bytes)
    keys_peak: int  # largest DBSIZE sampled during the run (and right after)
    used_peak: int
    keys_after: int  # right after the last release
    used_after: int
    idle_waited: float | None  # seconds polled after the run (None: the wait was skipped)
    keys_idle: int | None  # DBSIZE when the wait ended
    used_idle: int | None
    zero_after: float | None  # seconds after the run when DBSIZE reached 0 (None: it did not)

    @property
    def rate(self) -> float:
        """Names acquired and released per second."""
        return self.names / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_key(self) -> float | None:
        """``used_memory`` added per key left right after the run (None: no key left)."""
        if self.keys_after <= 0:
            return None
        return (self.used_after - self.used_before) / self.keys_after


# -- one driver: asyncio tasks over a slice of the names --------------------------


def _maker(key: str) -> Callable[[redis.asyncio.Redis, str], Any]:
    if key == "tenure":
        return lambda client, name: tenure.AsyncLock(client, name, timeout=LEASE_SECONDS)
    if key == "redis-py":
        return lambda client, name: client.lock(name, timeout=LEASE_SECONDS)
    raise KeyError(key)


async def _drive(
    url: str, key: str, start: int, stop: int, concurrency: int
) -> tuple[int, list[str]]:
    """Acquire and release names ``start..stop-1`` with ``concurrency`` tasks."""
    make = _maker(key)
    client = redis.asyncio.Redis.from_url(url, max_connections=concurrency)
    names = iter(range(start, stop))
    errors: list[str] = []
    done = 0

    async def worker() -> None:
        nonlocal done
        for index in names:
            lock = make(client, f"{NAME_PREFIX}{index}")
            try:
                if not await lock.acquire(blocking_timeout=10):
                    errors.append(f"{NAME_PREFIX}{index}: acquire returned False")
                    continue
                await lock.release()
            except Exception as exc:
                errors.append(f"{NAME_PREFIX}{index}: {type(exc).__name__}: {exc}"[:160])
                continue
            done += 1

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.aclose()
    return done, errors


def drive_names(
    url: str, key: str, start: int, stop: int, concurrency: int
) -> tuple[int, list[str]]:
    """Acquire and release each of names ``start..stop-1`` once, in this process."""
    return asyncio.run(_drive(url, key, start, stop, concurrency))


def _worker_main(url: str, key: str, start: int, stop: int, concurrency: int, replies: Any) -> None:
    start_helper()
    try:
        done, errors = drive_names(url, key, start, stop, concurrency)
    except Exception as exc:
        replies.put((0, [f"worker failed: {type(exc).__name__}: {exc}"[:160]]))
        return
    replies.put(
        (done, errors[:10] + ([f"... {len(errors) - 10} more"] if len(errors) > 10 else []))
    )


# -- the measurement ----------------------------------------------------------------


@dataclass
class _Peak:
    keys: int = 0
    used: int = 0

    def sample(self, client: redis.Redis) -> tuple[int, int]:
        keys, used = int(client.dbsize()), int(client.info("memory")["used_memory"])
        self.keys = max(self.keys, keys)
        self.used = max(self.used, used)
        return keys, used


def measure_names(
    url: str,
    key: str,
    names: int,
    *,
    processes: int = NAME_PROCESSES,
    concurrency: int = NAME_CONCURRENCY,
    progress: Callable[[str], None] = lambda message: None,
) -> NamesResult:
    """Empty the database, use ``names`` names once each, read keys and memory.

    ``processes=0`` drives the names in this process (no spawn: for tests).
    The idle wait is a separate step, :func:`wait_idle`.
    """
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
        used_before = int(client.info("memory")["used_memory"])
        peak = _Peak()
        began = time.perf_counter()
        if processes == 0:
            done, errors = drive_names(url, key, 0, names, concurrency)
        else:
            done, errors = _spawned(url, key, names, processes, concurrency, client, peak, progress)
        seconds = time.perf_counter() - began
        keys_after, used_after = peak.sample(client)
    finally:
        client.close()
    if not errors and done < names:
        errors.append(f"{names - done} name(s) not done")
    return NamesResult(
        key=key,
        names=names,
        processes=processes,
        concurrency=concurrency,
        seconds=seconds,
        errors=names - done,
        first_error=errors[0] if errors else None,
        used_before=used_before,
        keys_peak=peak.keys,
        used_peak=peak.used,
        keys_after=keys_after,
        used_after=used_after,
        idle_waited=None,
        keys_idle=None,
        used_idle=None,
        zero_after=None,
    )


def _spawned(
    url: str,
    key: str,
    names: int,
    processes: int,
    concurrency: int,
    client: redis.Redis,
    peak: _Peak,
    progress: Callable[[str], None],
) -> tuple[int, list[str]]:
    """Drive the names from ``processes`` spawned processes; sample the server meanwhile."""
    context = multiprocessing.get_context("spawn")
    replies: Any = context.Queue()
    bounds = [names * i // processes for i in range(processes + 1)]
    workers: list[SpawnProcess] = []
    with sigint_blocked():
        for lo, hi in itertools.pairwise(bounds):
            worker = context.Process(
                target=_worker_main,
                args=(url, key, lo, hi, concurrency, replies),
                name=f"bench-names-{lo}",
                daemon=True,
            )
            worker.start()
            workers.append(worker)
    done = 0
    errors: list[str] = []
    answered = 0
    began = time.monotonic()
    deadline = began + 60 + names / MIN_RATE
    next_note = began + 15
    try:
        while answered < processes:
            now = time.monotonic()
            if now >= deadline:
                raise BenchmarkError(
                    f"the {key} name workers did not finish in {now - began:.0f} s"
                )
            try:
                got, failed = replies.get(timeout=SAMPLE_EVERY)
            except queue.Empty:
                dead = [w.exitcode for w in workers if w.exitcode is not None]
                if len(dead) > answered:  # gone without a word (an answer would be queued)
                    raise BenchmarkError(
                        f"a {key} name worker exited without answering (exit codes {dead})"
                    ) from None
                keys, used = peak.sample(client)
                if now >= next_note:
                    progress(
                        f"names {key}: {now - began:.0f} s, {keys:,} keys, {used / 1e6:.0f} MB"
                    )
                    next_note = now + 15
                continue
            answered += 1
            done += got
            errors += failed
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
    return done, errors


def wait_idle(
    url: str,
    result: NamesResult,
    cap: float,
    *,
    progress: Callable[[str], None] = lambda message: None,
) -> NamesResult:
    """Poll ``DBSIZE`` until it is 0 or ``cap`` seconds have passed; the result with it."""
    client = redis.Redis.from_url(url)
    try:
        began = time.monotonic()
        next_note = began + 15
        keys = int(client.dbsize())
        zero_after = 0.0 if keys == 0 else None
        while keys and time.monotonic() - began < cap:
            time.sleep(min(SAMPLE_EVERY, max(0.0, cap - (time.monotonic() - began))))
            keys = int(client.dbsize())
            now = time.monotonic()
            if keys == 0:
                zero_after = now - began
            elif now >= next_note:
                progress(f"idle wait: {now - began:.0f} s, {keys:,} keys left")
                next_note = now + 15
        waited = time.monotonic() - began
        used = int(client.info("memory")["used_memory"])
    finally:
        client.close()
    return dataclasses.replace(
        result, idle_waited=waited, keys_idle=keys, used_idle=used, zero_after=zero_after
    )
