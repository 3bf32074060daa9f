"""Semaphore benchmark: tenure's Semaphore beside Redis in Action's fair semaphore.

    python -m benchmarks.semaphores [--seconds 3] [--limit 5] [--url URL]
        [--output docs/benchmarks.md]

Redis in Action 6.3 builds a fair semaphore from two sorted sets and a
counter, and (6.3.5) wraps its acquire in a lock to stop a race between
clients with skewed clocks. It is written out below as the book gives it, on
redis-py, so both run against the same server in the same run. Measured, one
process, no work in between: acquire + release cycles per second, and round
trips to the server per acquire + release (counted on the connection).
Results go to the ``semaphores`` section of ``--output``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.connection import Connection

import tenure
from benchmarks._sections import write_section
from tenure.server import ServerProcess


class CountingConnection(Connection):
    """A redis-py connection that counts round trips (one per packed send)."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Count, then send."""
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


# --- Redis in Action, listings 6.8-6.14, ported to redis-py ------------------------


def acquire_lock(conn: redis.Redis, lockname: str, acquire_timeout: float = 10) -> str | None:
    """6.2.3: a lock by SETNX with a retry loop (the book's, with 1 ms sleeps)."""
    identifier = str(uuid.uuid4())
    end = time.time() + acquire_timeout
    while time.time() < end:
        if conn.setnx("lock:" + lockname, identifier):
            return identifier
        time.sleep(0.001)
    return None


def release_lock(conn: redis.Redis, lockname: str, identifier: str) -> bool:
    """6.2.3: WATCH the lock, delete it in MULTI/EXEC if it is still ours."""
    lockname = "lock:" + lockname
    with conn.pipeline(True) as pipe:
        while True:
            try:
                pipe.watch(lockname)  # type: ignore[no-untyped-call]
                if pipe.get(lockname) == identifier.encode():
                    pipe.multi()
                    pipe.delete(lockname)
                    pipe.execute()
                    return True
                pipe.unwatch()
                return False
            except redis.exceptions.WatchError:
                continue


def acquire_fair_semaphore(
    conn: redis.Redis, semname: str, limit: int, timeout: float = 10
) -> str | None:
    """6.3.2: the fair semaphore (owner zset ranked by a shared counter)."""
    identifier = str(uuid.uuid4())
    czset = semname + ":owner"
    ctr = semname + ":counter"
    now = time.time()
    pipeline = conn.pipeline(True)
    pipeline.zremrangebyscore(semname, "-inf", now - timeout)
    pipeline.zinterstore(czset, {czset: 1, semname: 0})
    pipeline.incr(ctr)
    counter = pipeline.execute()[-1]
    pipeline.zadd(semname, {identifier: now})
    pipeline.zadd(czset, {identifier: counter})
    pipeline.zrank(czset, identifier)
    if pipeline.execute()[-1] < limit:
        return identifier
    pipeline.zrem(semname, identifier)
    pipeline.zrem(czset, identifier)
    pipeline.execute()
    return None


def release_fair_semaphore(conn: redis.Redis, semname: str, identifier: str) -> bool:
    """6.3.2: remove the identifier from both sorted sets."""
    pipeline = conn.pipeline(True)
    pipeline.zrem(semname, identifier)
    pipeline.zrem(semname + ":owner", identifier)
    return bool(pipeline.execute()[0])


def acquire_semaphore_with_lock(
    conn: redis.Redis, semname: str, limit: int, timeout: float = 10
) -> str | None:
    """6.3.5: the fair semaphore's acquire, inside a lock."""
    identifier = acquire_lock(conn, semname, acquire_timeout=0.01)
    if identifier:
        try:
            return acquire_fair_semaphore(conn, semname, limit, timeout)
        finally:
            release_lock(conn, semname, identifier)
    return None


# --- measurement -----------------------------------------------------------------


Cycle = Callable[[], None]


def tenure_cycle(client: redis.Redis, limit: int) -> Cycle:
    """One acquire + release of a tenure Semaphore (10 s lease, like the book's)."""
    semaphore = tenure.Semaphore(client, "bench-sem", limit, timeout=10)

    def cycle() -> None:
        assert semaphore.acquire()
        semaphore.release()

    return cycle


def book_cycle(client: redis.Redis, limit: int) -> Cycle:
    """One acquire + release of Redis in Action's fair semaphore with its lock."""

    def cycle() -> None:
        identifier = acquire_semaphore_with_lock(client, "bench-ria", limit)
        assert identifier is not None
        release_fair_semaphore(client, "bench-ria", identifier)

    return cycle


def measure(
    make: Callable[[redis.Redis, int], Cycle], url: str, limit: int, seconds: float
) -> dict[str, float]:
    """Cycles per second (median of 3 runs) and round trips per cycle."""
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    client.flushall()
    cycle = make(client, limit)
    for _ in range(100):
        cycle()
    rates = []
    trips = []
    for _ in range(3):
        CountingConnection.sent = 0
        count = 0
        began = time.perf_counter()
        deadline = began + seconds / 3
        while time.perf_counter() < deadline:
            cycle()
            count += 1
        rates.append(count / (time.perf_counter() - began))
        trips.append(CountingConnection.sent / count)
    client.close()
    return {"per_second": statistics.median(rates), "round_trips": statistics.median(trips)}


def render(results: dict[str, dict[str, float]], server: str, seconds: float, limit: int) -> str:
    """The Markdown section."""
    mine = results["tenure"]
    book = results["book"]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "# Semaphore benchmark: tenure vs Redis in Action 6.3",
            "",
            f"Generated by `python -m benchmarks.semaphores` on {stamp}; do not edit: re-run it.",
            f"Server: {server}; Python {platform.python_version()}; limit {limit}; "
            f"{seconds:g} s per contender, one process, acquire + release with no work between.",
            "",
            "| Semaphore | cycles/s | round trips per acquire + release | tenure / row |",
            "|---|---:|---:|---:|",
            f"| tenure `Semaphore(limit={limit}, timeout=10)` | {mine['per_second']:,.0f} | "
            f"{mine['round_trips']:.1f} | 1.00 |",
            f"| Redis in Action 6.3.5: fair semaphore + lock | {book['per_second']:,.0f} | "
            f"{book['round_trips']:.1f} | {mine['per_second'] / book['per_second']:.2f} |",
            "",
            "The book's acquire is a SETNX lock, two MULTI/EXEC pipelines and a",
            "WATCH-based lock release; tenure's is one script call when a permit is",
            "free, and its permits are leases on the server's clock, so client clock",
            "skew cannot reorder or expire them.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its section of the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--url")
    parser.add_argument("--output", default="docs/benchmarks.md")
    args = parser.parse_args(argv)

    def run(url: str, server: str) -> None:
        results = {
            "tenure": measure(tenure_cycle, url, args.limit, args.seconds),
            "book": measure(book_cycle, url, args.limit, args.seconds),
        }
        for name, result in results.items():
            rate, trips = result["per_second"], result["round_trips"]
            print(f"{name}: {rate:,.0f} cycles/s, {trips:.1f} round trips")
        report = render(results, server, args.seconds, args.limit)
        write_section(Path(args.output), "semaphores", report)
        print(f"wrote {args.output}")

    if args.url:
        run(args.url, args.url)
    else:
        with ServerProcess(name="bench-semaphores") as server:
            run(server.url, f"{server.engine.name} {server.engine.version} (private, loopback)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
