"""``tenure bench locks``: ``tenure.Lock`` beside its peers, one server, one run.

    tenure bench locks [--seconds S] [--solo-seconds S] [--solo-runs 3]
        [--processes 4] [--critical-ms 1] [--url URL] [--output FILE.md]
        [--json FILE] [--plot FILE.png] [--only KEY,KEY]

(``python -m benchmarks.locks`` is the same, writing docs/benchmarks.md.)
The peers come with ``pip install "tenure[bench]"``. Without ``--url`` a
private valkey-server is started on loopback (``tenure.server.ServerProcess``)
and stopped at the end. Every measurement starts with ``FLUSHDB``, so a
server given by ``--url`` must have an empty database (or ``--allow-flush``).
Two measurements, each contender after the other:

* solo: acquire+release cycles per second in this process (median of runs);
* contended: ``--processes`` spawned processes loop over a critical section
  of ``--critical-ms`` from a common start instant until a deadline.

A table with the "tenure / peer" ratios is printed; ``--output`` writes the
full report (with the issue's targets) to its own section of a Markdown file
(other sections are kept), ``--json`` the raw results, and ``--plot`` the
wait-time distribution of every contender.
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
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import redis

from tenure._bench import BenchmarkError, add_output_arguments, check_empty, require_peer
from tenure._bench.contenders import CONTENDERS, Contender, by_key
from tenure._bench.measure import (
    COUNTER_KEY,
    LOCK_NAME,
    ContendedResult,
    Plan,
    SoloResult,
    WorkerPool,
    summarize,
    time_solo,
)
from tenure._bench.plot import plot_waits
from tenure._bench.report import RunInfo, as_data, render, summary_table
from tenure._bench.sections import write_section
from tenure.server._process import given_or_private

__all__ = ["add_arguments", "check_arguments", "main", "run_command"]

_PACKAGES = ("tenure", "redis", "hiredis", "python-redis-lock", "pottery")


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--seconds", type=float, default=5.0, help="per contended run (5)")
    parser.add_argument(
        "--solo-seconds", type=float, default=3.0, help="per solo contender, all runs (3)"
    )
    parser.add_argument("--solo-runs", type=int, default=3, help="solo runs, median taken (3)")
    parser.add_argument("--processes", type=int, default=4, help="contending processes (4)")
    parser.add_argument("--critical-ms", type=float, default=1.0, help="time held (1 ms)")
    add_output_arguments(parser, output, "wait-time")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument(
        "--only", help="comma-separated contender keys (default: all)", default=None
    )


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse values that would make a run meaningless or endless."""
    if not 0 < args.seconds <= 600 or not 0 < args.solo_seconds <= 600:
        raise BenchmarkError("--seconds and --solo-seconds must be in (0, 600]")
    if not 1 <= args.solo_runs <= 99:
        raise BenchmarkError("--solo-runs must be in 1..99")
    if not 1 <= args.processes <= 64:
        raise BenchmarkError("--processes must be in 1..64")
    if not 0 <= args.critical_ms <= 1000:
        raise BenchmarkError("--critical-ms must be in [0, 1000]")
    select(args.only)


def select(only: str | None) -> list[Contender]:
    """The contenders to run, in report order."""
    if only is None:
        return list(CONTENDERS)
    keys = {k.strip() for k in only.split(",") if k.strip()}
    unknown = keys - {c.key for c in CONTENDERS}
    if unknown:
        known = ", ".join(c.key for c in CONTENDERS)
        raise BenchmarkError(f"unknown contender(s) {', '.join(sorted(unknown))}; known: {known}")
    return [c for c in CONTENDERS if c.key in keys]


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
            client.flushdb()
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
            client.flushdb()
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
    command: Sequence[str],
    server: str,
    source: str,
    rtt_us: float,
    load: str,
    elapsed: float,
) -> RunInfo:
    """Describe this run for the report."""
    return RunInfo(
        command=shlex.join(command),
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


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "tenure bench locks",
    output: str | None = None,
) -> int:
    """Parse ``argv``, run the benchmark and report; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(parser, output=output)
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
    except BenchmarkError as exc:
        parser.error(str(exc))
    return run_command(args, [*prog.split(), *argv])


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report).

    Raises :class:`BenchmarkError` for arguments it cannot run with; a run
    that fails midway is reported on stderr and returns 1.
    """
    check_arguments(args)
    if args.url:
        check_empty(args.url, args.allow_flush)
    try:
        run(args, command)
    except (BenchmarkError, redis.RedisError) as exc:
        progress(f"benchmark failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


def run(args: argparse.Namespace, command: Sequence[str]) -> None:
    """Measure every selected contender, print the table and write what was asked."""
    contenders = select(args.only)
    for contender in contenders:
        if contender.peer is not None:
            require_peer(*contender.peer)  # fail now, not in a worker process
    started = time.monotonic()
    load = load_average()
    with given_or_private(args.url, name="bench-locks") as (url, private):
        source = "given by --url"
        if private is not None:
            source = "private `tenure.server.ServerProcess`, loopback TCP"
        client = redis.Redis.from_url(url)
        try:
            server = server_version(client)
            rtt_us = round_trip_us(client)
            progress(f"server: {server} at {url}, PING round trip {rtt_us:.0f} us")
            solo = measure_solo(client, contenders, args.solo_seconds, args.solo_runs)
            contended = measure_contended(client, url, contenders, args)
            client.flushdb()
        finally:
            client.close()
    info = run_info(args, command, server, source, rtt_us, load, time.monotonic() - started)
    print(summary_table(solo, contended), flush=True)
    if args.plot:
        plot_waits(
            Path(args.plot),
            title=f"Lock wait times: {args.processes} processes, "
            f"{args.critical_ms:g} ms critical section, {args.seconds:g} s each",
            subtitle=f"{server}, {info.nproc} CPUs, {info.date}",
            series={by_key(r.key).label.replace("`", ""): r.waits_ms for r in contended},
        )
        progress(f"wrote {args.plot}")
    if args.output:
        output = Path(args.output)
        figure = os.path.relpath(args.plot, output.parent) if args.plot else None
        output.parent.mkdir(parents=True, exist_ok=True)
        write_section(output, "locks", render(info, solo, contended, figure))
        progress(f"wrote {args.output}")
    if args.json:
        data = as_data(info, solo, contended)
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        progress(f"wrote {args.json}")


if __name__ == "__main__":
    raise SystemExit(main())
