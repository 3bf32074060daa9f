"""``tenure bench semaphores``: tenure's Semaphore beside Redis in Action's fair semaphore.

    tenure bench semaphores [--seconds 3] [--limit 5] [--url URL]
        [--output FILE.md] [--plot FILE.png]

Redis in Action 6.3 builds a fair semaphore from two sorted sets and a
counter, and (6.3.5) wraps its acquire in a lock to stop a race between
clients with skewed clocks. It is written out below as the book gives it, on
redis-py, so both run against the same server in the same run. Measured, one
process, no work in between: acquire + release cycles per second, and round
trips to the server per acquire + release (counted on the connection), and
the time each acquire took (``--plot`` draws their distributions). A table
is printed; ``--output`` writes the ``semaphores`` section of a Markdown file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.connection import Connection

import tenure
from benchmarks import (
    BenchmarkError,
    add_output_arguments,
    check_empty,
    progress,
    run_timed,
)
from benchmarks.plot import plot_waits
from benchmarks.sections import write_section
from tenure.server._process import given_or_private

__all__ = ["add_arguments", "estimated_seconds", "run_command"]

MAX_CYCLES = 1_000_000  # per run, so that a very fast machine cannot fill memory
WARMUP_CYCLES = 100  # before each semaphore's timed runs
START_SECONDS = 0.6  # the interpreter, the private server, the report
WARMUP_SECONDS = 0.1  # a semaphore's client and warm-up cycles


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


Cycle = Callable[[], float]  # one acquire + release; returns the acquire's seconds


def tenure_cycle(client: redis.Redis, limit: int) -> Cycle:
    """One acquire + release of a tenure Semaphore (10 s lease, like the book's)."""
    semaphore = tenure.Semaphore(client, "bench-sem", limit=limit, timeout=10)

    def cycle() -> float:
        began = time.perf_counter()
        if not semaphore.acquire():
            raise BenchmarkError("an uncontended tenure acquire failed")
        took = time.perf_counter() - began
        semaphore.release()
        return took

    return cycle


def book_cycle(client: redis.Redis, limit: int) -> Cycle:
    """One acquire + release of Redis in Action's fair semaphore with its lock."""

    def cycle() -> float:
        began = time.perf_counter()
        identifier = acquire_semaphore_with_lock(client, "bench-ria", limit)
        if identifier is None:
            raise BenchmarkError("an uncontended book acquire failed")
        took = time.perf_counter() - began
        release_fair_semaphore(client, "bench-ria", identifier)
        return took

    return cycle


@dataclass(frozen=True)
class Measured:
    """One semaphore's solo figures and every acquire's duration."""

    per_second: float  # median of 3 runs
    round_trips: float  # per acquire + release, median of 3 runs
    acquire_ms: tuple[float, ...]


def measure(
    make: Callable[[redis.Redis, int], Cycle], url: str, limit: int, seconds: float
) -> Measured:
    """Cycles per second (median of 3 runs), round trips per cycle, acquire durations."""
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    client.flushdb()
    cycle = make(client, limit)
    for _ in range(WARMUP_CYCLES):
        cycle()
    rates = []
    trips = []
    acquires: list[float] = []
    for _ in range(3):
        CountingConnection.sent = 0
        count = 0
        began = time.perf_counter()
        deadline = began + seconds / 3
        while time.perf_counter() < deadline and count < MAX_CYCLES:
            acquires.append(cycle() * 1000)
            count += 1
        rates.append(count / (time.perf_counter() - began))
        trips.append(CountingConnection.sent / count)
    client.close()
    return Measured(statistics.median(rates), statistics.median(trips), tuple(acquires))


def render(
    results: dict[str, Measured],
    server: str,
    seconds: float,
    limit: int,
    command: str,
    plot: str | None = None,
) -> str:
    """The Markdown section."""
    mine = results["tenure"]
    book = results["book"]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "# Semaphore benchmark: tenure vs Redis in Action 6.3",
            "",
            f"Generated by `{command}` on {stamp}; do not edit: re-run it.",
            f"Server: {server}; Python {platform.python_version()}; limit {limit}; "
            f"{seconds:g} s per contender, one process, acquire + release with no work between.",
            "",
            "| Semaphore | cycles/s | round trips per acquire + release | tenure / row |",
            "|---|---:|---:|---:|",
            f"| tenure `Semaphore(limit={limit}, timeout=10)` | {mine.per_second:,.0f} | "
            f"{mine.round_trips:.1f} | 1.00 |",
            f"| Redis in Action 6.3.5: fair semaphore + lock | {book.per_second:,.0f} | "
            f"{book.round_trips:.1f} | {mine.per_second / book.per_second:.2f} |",
            "",
            "The book's acquire is a SETNX lock, two MULTI/EXEC pipelines and a",
            "WATCH-based lock release; tenure's is one script call when a permit is",
            "free, and its permits are leases on the server's clock, so client clock",
            "skew cannot reorder or expire them.",
        ]
        + (
            [
                "",
                f"![Acquire times of both semaphores, same run]({plot})",
                "",
                "The time each acquire took, every cycle of the run: cumulative share "
                "(left) and the tail on log-log axes (right). Drawn by `--plot`.",
            ]
            if plot
            else []
        )
    )


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--seconds", type=float, default=3.0, help="per semaphore (3)")
    parser.add_argument("--limit", type=int, default=5, help="permits (5)")
    add_output_arguments(parser, output, "acquire-time")


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long a run with ``args`` takes: ``--seconds`` per semaphore, and start-up."""
    return START_SECONDS + 2 * (float(args.seconds) + WARMUP_SECONDS)


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    if not 0 < args.seconds <= 600 or not 1 <= args.limit <= 10_000:
        raise BenchmarkError("--seconds must be in (0, 600] and --limit in 1..10000")

    def run(url: str, server: str) -> None:
        results = {}
        for name, make in (("tenure", tenure_cycle), ("book", book_cycle)):
            results[name] = found = measure(make, url, args.limit, args.seconds)
            progress(
                f"semaphore {name}: {found.per_second:,.0f} cycles/s, "
                f"{found.round_trips:.1f} round trips a cycle"
            )
        mine = results["tenure"]
        print(f"{'semaphore':<34}{'cycles/s':>10}{'round trips':>13}{'tenure/row':>12}")
        for name, label in (("tenure", "tenure Semaphore"), ("book", "Redis in Action 6.3.5")):
            result = results[name]
            print(
                f"{label:<34}{result.per_second:>10,.0f}{result.round_trips:>13.1f}"
                f"{mine.per_second / result.per_second:>12.2f}"
            )
        if args.plot:
            plot_waits(
                Path(args.plot),
                title=f"Semaphore acquire times: one process, limit {args.limit}, "
                f"{args.seconds:g} s each",
                subtitle=server,
                series={
                    f"tenure Semaphore(limit={args.limit})": results["tenure"].acquire_ms,
                    "Redis in Action 6.3.5 fair semaphore + lock": results["book"].acquire_ms,
                },
            )
            print(f"wrote {args.plot}", file=sys.stderr)
        if args.output:
            output = Path(args.output)
            figure = os.path.relpath(args.plot, output.parent) if args.plot else None
            command_line = shlex.join(command)
            report = render(results, server, args.seconds, args.limit, command_line, figure)
            write_section(output, "semaphores", report)
            print(f"wrote {args.output}", file=sys.stderr)

    def run_private() -> None:
        with given_or_private(args.url, name="bench-semaphores") as (url, server):
            where = (
                url
                if server is None
                else (f"{server.engine.name} {server.engine.version} (private, loopback)")
            )
            run(url, where)

    if args.url:
        check_empty(args.url, args.allow_flush)
    what = f"tenure's Semaphore and the book's, {args.seconds:g} s each"
    return run_timed("semaphores", estimated_seconds(args), what, run_private)
