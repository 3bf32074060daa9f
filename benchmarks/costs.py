"""What one per-entity lock cycle costs: server time, round trips, client CPU, idle keys.

A breakdown beside the per-entity cycles/s (:mod:`benchmarks.entity`),
so a gap can be placed: ``COST_CYCLES`` cycles on fresh names after
``FLUSHDB`` and ``CONFIG RESETSTAT``, each contender alone, then

* server µs per cycle: the ``usec`` of the commands a client sent (``EVALSHA``,
  ``EVAL``, ``SET``; what a script runs inside counts in its ``EVALSHA``), from
  ``INFO commandstats``;
* round trips per cycle: the calls of those commands;
* client CPU µs per acquire and per release (the thread's CPU time, so
  waiting for the server is not counted; the lock object is made inside the
  acquire's time);
* keys and bytes per idle name: ``DBSIZE`` right after the last release, per
  name, and the ``MEMORY USAGE`` of the keys left (up to ``MEMORY_SAMPLE`` of
  them, their mean) times the keys per name. (``used_memory`` differences are
  lost in the allocator's noise at a few thousand names; the names part of
  the lock benchmark measures a million.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

import tenure

__all__ = [
    "COST_CYCLES",
    "COST_VARIANTS",
    "SEMAPHORE_LIMIT",
    "SENT_COMMANDS",
    "async_maker",
    "measure_costs",
    "sent_commands",
    "sync_maker",
]

COST_CYCLES = 2000
SENT_COMMANDS = ("evalsha", "eval", "set")
"""The commands a contender's client sends in a cycle (default arguments): tenure's
scripts, redis-py's ``SET NX PX`` and its release script. (``INFO commandstats``
counts a script's own commands too: tenure's scripts may call ``SET``, so for
tenure's contenders only the first two are counted, see :func:`sent_commands`.)"""


def sent_commands(key: str) -> tuple[str, ...]:
    """The commands contender ``key``'s client sends (the others run inside its scripts)."""
    return SENT_COMMANDS[:2] if key.startswith("tenure") else SENT_COMMANDS


COST_VARIANTS = (
    "server_us",
    "round_trips",
    "acquire_cpu_us",
    "release_cpu_us",
    "keys_idle",
    "bytes_idle",
)
"""The per-cycle figures :func:`measure_costs` returns, in this order."""

PREFIX = "bench:cost:"
MEMORY_SAMPLE = 200


def _bytes_per_key(admin: redis.Redis) -> float:
    """The mean ``MEMORY USAGE`` of up to ``MEMORY_SAMPLE`` keys (0: none)."""
    sizes = []
    for key in admin.scan_iter(match=f"*{PREFIX}*", count=1000):
        sizes.append(int(admin.memory_usage(key, samples=0) or 0))
        if len(sizes) >= MEMORY_SAMPLE:
            break
    return sum(sizes) / len(sizes) if sizes else 0.0


def _sent(admin: redis.Redis, key: str) -> tuple[int, int]:
    """(calls, usec) of the commands contender ``key``'s client sent, from INFO commandstats."""
    stats: dict[str, Any] = admin.info("commandstats")
    calls = usec = 0
    for command in sent_commands(key):
        found = stats.get(f"cmdstat_{command}")
        if found:
            calls += int(found["calls"])
            usec += int(found["usec"])
    return calls, usec


SEMAPHORE_LIMIT = 5
"""The per-entity semaphores' limit (no cycle waits: each name has one holder at a time)."""


_TENURE_KINDS: dict[str, tuple[str, dict[str, Any], str | None]] = {
    # contender key (without "-async") -> (class name, its arguments, the side taken)
    "tenure": ("Lock", {}, None),
    "tenure-semaphore": ("Semaphore", {"limit": SEMAPHORE_LIMIT}, None),
    "tenure-read": ("ReadWriteLock", {}, "read"),
    "tenure-write": ("ReadWriteLock", {}, "write"),
}


def _maker(key: str, client: Any, prefix: str) -> Callable[[str], Any]:
    """Contender ``key``'s maker: tenure's class (``prefix`` "Async": its twin), or redis-py's."""
    kind = _TENURE_KINDS.get(key.removesuffix("-async"))
    if kind is None:
        return lambda name: client.lock(name)
    cls, arguments, side = getattr(tenure, prefix + kind[0]), kind[1], kind[2]
    if side is None:
        return lambda name: cls(client, name, **arguments)
    return lambda name: getattr(cls(client, name, **arguments), side)


def sync_maker(key: str, client: redis.Redis) -> Callable[[str], Any]:
    """How contender ``key`` (sync) makes a lock object for a name, with its defaults."""
    return _maker(key, client, "")


def async_maker(key: str, client: redis.asyncio.Redis) -> Callable[[str], Any]:
    """How contender ``key`` (asyncio) makes a lock object for a name, with its defaults."""
    return _maker(key, client, "Async")


def _sync_cycles(url: str, key: str, cycles: int) -> tuple[float, float]:
    """CPU seconds spent in acquires and in releases over ``cycles`` sync cycles."""
    acquiring = releasing = 0.0
    with redis.Redis.from_url(url) as client:
        make = sync_maker(key, client)
        for i in range(cycles):
            start = time.thread_time()
            lock = make(f"{PREFIX}{i}")
            lock.acquire()
            taken = time.thread_time()
            lock.release()
            acquiring += taken - start
            releasing += time.thread_time() - taken
    return acquiring, releasing


async def _async_cycles(url: str, key: str, cycles: int) -> tuple[float, float]:
    acquiring = releasing = 0.0
    client = redis.asyncio.Redis.from_url(url)
    try:
        make = async_maker(key, client)
        for i in range(cycles):
            start = time.thread_time()
            lock = make(f"{PREFIX}{i}")
            await lock.acquire()
            taken = time.thread_time()
            await lock.release()
            acquiring += taken - start
            releasing += time.thread_time() - taken
    finally:
        await client.aclose()
    return acquiring, releasing


def _warm(url: str, key: str, mode: str) -> None:
    """Load the scripts and open the connections, so the timed cycles pay neither."""
    if mode == "sync":
        _sync_cycles(url, key, 20)
    else:
        asyncio.run(_async_cycles(url, key, 20))


def measure_costs(url: str, key: str, mode: str, cycles: int = COST_CYCLES) -> dict[str, float]:
    """One contender's figures per cycle (see the module docstring), keyed as ``COST_VARIANTS``."""
    with redis.Redis.from_url(url) as admin:
        _warm(url, key, mode)
        admin.flushdb()
        admin.config_resetstat()
        calls_before, usec_before = _sent(admin, key)
        if mode == "sync":
            acquiring, releasing = _sync_cycles(url, key, cycles)
        else:
            acquiring, releasing = asyncio.run(_async_cycles(url, key, cycles))
        calls, usec = _sent(admin, key)
        keys = int(admin.dbsize())
        per_key = _bytes_per_key(admin)
        admin.flushdb()
    return {
        "server_us": (usec - usec_before) / cycles,
        "round_trips": (calls - calls_before) / cycles,
        "acquire_cpu_us": acquiring / cycles * 1e6,
        "release_cpu_us": releasing / cycles * 1e6,
        "keys_idle": keys / cycles,
        "bytes_idle": per_key * keys / cycles,
    }
