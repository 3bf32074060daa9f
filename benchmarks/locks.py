"""Compare ``tenure.Lock`` with its peers on one server in one run.

Run from the repository root::

    python -m benchmarks.locks [--seconds S] [--solo-seconds S] [--solo-runs 3]
        [--processes 4] [--critical-ms 1] [--url URL] [--output docs/benchmarks.md]
        [--json FILE] [--only KEY,KEY]

Without ``--url`` a private valkey-server is started on loopback
(``tenure.server.ServerProcess``) and stopped at the end. A server given by
``--url`` is emptied: every measurement starts with ``FLUSHALL``. Two
measurements, each contender after the other:

* solo: acquire+release cycles per second in this process (median of runs);
* contended: ``--processes`` spawned processes loop over a critical section
  of ``--critical-ms`` from a common start instant until a deadline.

The results, with "tenure / peer" ratios and the issue's targets, are
written to its own section of ``--output`` (other benchmarks' sections are
kept) and optionally to ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

import redis

from benchmarks._contenders import CONTENDERS, Contender
from benchmarks._measure import (
    COUNTER_KEY,
    LOCK_NAME,
    BenchmarkError,
    ContendedResult,
    Plan,
    SoloResult,
    WorkerPool,
    summarize,
    time_solo,
)
from benchmarks._report import RunInfo, as_data, render
from benchmarks._sections import write_section
from tenure.server import ServerProcess

__all__ = ["main"]

_PACKAGES = ("tenure", "redis", "hiredis", "python-redis-lock", "pottery")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.locks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per contended run (5)")
    parser.add_argument(
        "--solo-seconds", type=float, default=3.0, help="per solo contender, all runs (3)"
    )
    parser.add_argument("--solo-runs", type=int, default=3, help="solo runs, median taken (3)")
    parser.add_argument("--processes", type=int, default=4, help="contending processes (4)")
    parser.add_argument("--critical-ms", type=float, default=1.0, help="time held (1 ms)")
    parser.add_argument("--url", help="use this server instead of starting one")
    parser.add_argument("--output", default="docs/benchmarks.md", help="Markdown report")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument(
        "--only", help="comma-separated contender keys (default: all)", default=None
    )
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 600 or not 0 < args.solo_seconds <= 600:
        parser.error("--seconds and --solo-seconds must be in (0, 600]")
    if not 1 <= args.solo_runs <= 99:
        parser.error("--solo-runs must be in 1..99")
    if not 1 <= args.processes <= 64:
        parser.error("--processes must be in 1..64")
    if not 0 <= args.critical_ms <= 1000:
        parser.error("--critical-ms must be in [0, 1000]")
    return args


def select(only: str | None) -> list[Contender]:
    """The contenders to run, in report order."""
    if only is None:
        return list(CONTENDERS)
    keys = {k.strip() for k in only.split(",") if k.strip()}
    unknown = keys - {c.key for c in CONTENDERS}
    if unknown:
        raise SystemExit(f"unknown contender(s): {', '.join(sorted(unknown))}")
    return [c for c in CONTENDERS if c.key in keys]


@contextlib.contextmanager
def server_url(url: str | None) -> Iterator[tuple[str, str]]:
    """Yield ``(url, where it came from)``: the given server or a private one."""
    if url is not None:
        yield url, "given by --url"
        return
    with ServerProcess() as server:
        yield server.url, "private `tenure.server.ServerProcess`, loopback TCP"


def progress(message: str) -> None:
    """One line of progress on stderr."""
    print(message, file=sys.stderr, flush=True)


def measure_solo(
    client: redis.Redis, contenders: Sequence[Contender], seconds: float, rounds: int
) -> list[SoloResult]:
    """Median of ``rounds`` runs per contender, ``seconds`` in all.

    Rounds interleave the contenders, every other round in reverse order, so
    that a drift in the machine's speed does not favour whoever runs first.
    """
    runs: dict[str, list[float]] = {c.key: [] for c in contenders}
    for round_ in range(rounds):
        for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
            client.flushall()
            rate = time_solo(contender.make(client, LOCK_NAME), seconds / rounds)
            runs[contender.key].append(rate)
            progress(f"solo {round_ + 1}/{rounds} {contender.key}: {rate:,.0f} cycles/s")
    return [SoloResult(key, tuple(rates), statistics.median(rates)) for key, rates in runs.items()]


def measure_contended(
    client: redis.Redis, url: str, contenders: Sequence[Contender], args: argparse.Namespace
) -> list[ContendedResult]:
    """One contended run per contender, all in one pool of worker processes."""
    results: list[ContendedResult] = []
    contenders = [c for c in contenders if c.contended]
    if not contenders:
        return results
    with WorkerPool(args.processes) as pool:
        for contender in contenders:
            client.flushall()
            plan = Plan(url, contender.key, args.seconds, args.critical_ms)
            records = pool.run(plan)
            counter = int(client.get(COUNTER_KEY) or 0)
            result = summarize(plan, args.processes, records, counter)
            results.append(result)
            progress(
                f"contended {contender.key}: {result.throughput:,.0f} acq/s, "
                f"p50 {result.wait_p50_ms:.2f} ms, max {result.wait_max_ms:.1f} ms, "
                f"fairness {result.fairness:.2f}, lost {result.lost_updates}"
            )
    return results


def server_version(client: redis.Redis) -> str:
    """``valkey 8.1.x`` or ``redis 7.x`` from ``INFO server``."""
    info = client.info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info.get('redis_version', '?')}"


def load_average() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews the numbers."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def round_trip_us(client: redis.Redis, count: int = 500) -> float:
    """Median ``PING`` round trip in microseconds: the floor of every lock operation."""
    samples = []
    for _ in range(count):
        sent = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - sent)
    return statistics.median(samples) * 1e6


def package_versions() -> dict[str, str]:
    """Installed versions of tenure, the client and the peers."""
    versions: dict[str, str] = {}
    for name in _PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def run_info(
    args: argparse.Namespace,
    argv: Sequence[str],
    server: str,
    source: str,
    rtt_us: float,
    load: str,
    elapsed: float,
) -> RunInfo:
    """Describe this run for the report."""
    return RunInfo(
        command=shlex.join(["python", "-m", "benchmarks.locks", *argv]),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        nproc=os.cpu_count() or 0,
        load=load,
        python=f"{platform.python_implementation()} {platform.python_version()}",
        platform=platform.platform(terse=True),
        server=server,
        server_source=source,
        round_trip_us=rtt_us,
        packages=package_versions(),
        seconds=args.seconds,
        solo_seconds=args.solo_seconds,
        solo_runs=args.solo_runs,
        processes=args.processes,
        critical_ms=args.critical_ms,
        elapsed=elapsed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write the report; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        run(args, argv)
    except (BenchmarkError, redis.RedisError) as exc:
        progress(f"benchmark failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


def run(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Measure every selected contender and write the report(s)."""
    contenders = select(args.only)
    started = time.monotonic()
    load = load_average()
    with server_url(args.url) as (url, source):
        client = redis.Redis.from_url(url)
        try:
            server = server_version(client)
            rtt_us = round_trip_us(client)
            progress(f"server: {server} at {url}, PING round trip {rtt_us:.0f} us")
            solo = measure_solo(client, contenders, args.solo_seconds, args.solo_runs)
            contended = measure_contended(client, url, contenders, args)
            client.flushall()
        finally:
            client.close()
    info = run_info(args, argv, server, source, rtt_us, load, time.monotonic() - started)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_section(Path(args.output), "locks", render(info, solo, contended))
    progress(f"wrote {args.output} in {info.elapsed:.0f} s")
    if args.json:
        data = as_data(info, solo, contended)
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
