"""``tenure bench locks``: ``tenure.Lock`` beside its peers, one server, one run.

    tenure bench locks [--parts solo,contended,pool,waiters,names,entity,scale|all]
        [--skip PART,...]
        [--seconds S] [--solo-seconds S] [--solo-runs 3] [--rounds 3]
        [--processes 4] [--critical-ms 1] [--single-tries 5]
        [--tasks 1000] [--threads 100] [--waiter-pool 8]
        [--names 1000000] [--name-processes 2] [--idle-cap S] [--skip-idle-wait]
        [--scale-holds 1000,10000,20000] [--scale-extra 500]
        [--scale-waiters 1000,10000] [--scale-window 3]
        [--url URL] [--output FILE.md] [--json FILE] [--plot FILE.png] [--only KEY,KEY]
        [--topology standalone|replicated|cluster]

``--only`` chooses among the contenders of the solo, contended, pool and
names parts; the entity and scale parts have their own.
The peers come with ``pip install -e ".[bench]"`` (in the clone). Without ``--url`` a
private valkey-server is started on loopback (``tenure.server.ServerProcess``)
and stopped at the end. Every measurement starts with ``FLUSHDB``, so a
server given by ``--url`` must have an empty database (or ``--allow-flush``).
The parts, each selectable with ``--parts`` / ``--skip`` (without ``--parts``,
all but scale run; ``--parts all`` runs every one):

* solo: acquire+release cycles per second in this process (median of
  ``--solo-runs`` runs, interleaved across contenders);
* contended: ``--processes`` spawned processes loop over a critical section
  of ``--critical-ms`` from a common start instant until a deadline;
  ``--rounds`` rounds interleaved across contenders, medians reported;
* pool: 6 threads through a ``BlockingConnectionPool(max_connections=3)``
  (:mod:`benchmarks.pool`, ``--rounds`` rounds), and release → waiter
  latency on one ``single_connection_client=True`` client;
* waiters: ``--tasks`` asyncio tasks and ``--threads`` threads of one process
  queued on one tenure lock: connections used by waiting, handoff latency
  (:mod:`benchmarks.waiters`);
* names: ``--names`` distinct names used once each, keys and memory right
  after and after ``IDLE_TTL`` (:mod:`benchmarks.names`); the idle wait
  (up to ``--idle-cap`` seconds) is skipped with ``--skip-idle-wait``;
* entity: per-entity locks, a new lock object per cycle with each library's
  default arguments (tenure ``Lock``/``AsyncLock`` vs redis-py's
  ``client.lock(name)``, sync and asyncio), on fresh names and on names
  reused within a minute, each run ``--solo-seconds``, medians of
  ``--rounds``; and the constructor alone (:mod:`benchmarks.entity`);
* scale (not in the default parts: several minutes): acquire and release
  while one thread or task holds each of ``--scale-holds`` locks
  (``--scale-extra`` pairs timed, medians of ``--rounds``), and each of
  ``--scale-waiters`` asyncio tasks (one client over ``--waiter-pool``
  connections) queued on one lock: time to queue,
  refresh traffic over ``--scale-window`` seconds, handoffs per second,
  medians of ``--rounds`` (:mod:`benchmarks.scale`); every size bounded
  by 120 s.

``--topology replicated`` (a primary with two replicas) or ``cluster`` (three
masters with two replicas each) starts that topology privately and runs the
solo and contended parts of tenure's Lock, its ClusterLock with one and two
replicas acknowledging, and redis-py's Lock on it; the report adds what an
acknowledgement costs per acquisition, in round trips.

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
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import redis

from benchmarks import (
    BenchmarkError,
    check_empty,
    package_versions,
    progress,
    require_peer,
    round_trip_us,
    run_timed,
    server_version,
)
from benchmarks.contenders import Client, Contender, by_key
from benchmarks.entity import EntityResult, measure_entity
from benchmarks.locks_arguments import (
    DEFAULT_PARTS,
    MAX_SCALE,
    PARTS,
    add_arguments,
    counts,
    parts,
    select,
)
from benchmarks.locks_estimate import describe, estimated_seconds
from benchmarks.measure import (
    COUNTER_KEY,
    LOCK_NAME,
    ContendedResult,
    Plan,
    SoloResult,
    WorkerPool,
    combine_rounds,
    connect,
    summarize,
    time_solo,
)
from benchmarks.names import (
    NAME_KINDS,
    NamesResult,
    measure_names,
    wait_idle,
)
from benchmarks.otel import run_for
from benchmarks.plot import plot_waits
from benchmarks.pool import (
    PoolResult,
    PoolRun,
    SingleResult,
    combine_pool_runs,
    run_pool,
    single_connection_latency,
)
from benchmarks.report import Results, RunInfo, as_data, render, summary_table
from benchmarks.scale import (
    HoldResult,
    WaitersResult,
    measure_holds,
    measure_scale_waiters,
)
from benchmarks.sections import write_section
from benchmarks.waiters import CrowdResult, crowd_of_tasks, crowd_of_threads
from tenure.server import Cluster, Replicated
from tenure.server._process import given_or_private

__all__ = [
    "DEFAULT_PARTS",
    "PARTS",
    "add_arguments",
    "check_arguments",
    "counts",
    "estimated_seconds",
    "parts",
    "run_command",
]

_PACKAGES = ("tenure", "redis", "hiredis", "python-redis-lock", "pottery")


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
    if not 1 <= args.rounds <= 99 or not 1 <= args.single_tries <= 99:
        raise BenchmarkError("--rounds and --single-tries must be in 1..99")
    if not 0 <= args.tasks <= 100_000 or not 0 <= args.threads <= 1000:
        raise BenchmarkError("--tasks must be in 0..100000 and --threads in 0..1000")
    if not 1 <= args.waiter_pool <= 1000:
        raise BenchmarkError("--waiter-pool must be in 1..1000")
    if not 1 <= args.names <= 10_000_000 or not 0 <= args.name_processes <= 64:
        raise BenchmarkError("--names must be in 1..10000000 and --name-processes in 0..64")
    if not 0 <= args.idle_cap <= 3600:
        raise BenchmarkError("--idle-cap must be in [0, 3600] seconds")
    if args.topology != "standalone" and args.url:
        raise BenchmarkError("--topology starts its own servers: leave out --url")
    counts(args.scale_holds, "--scale-holds")
    counts(args.scale_waiters, "--scale-waiters")
    if not 1 <= args.scale_extra <= MAX_SCALE:
        raise BenchmarkError(f"--scale-extra must be in 1..{MAX_SCALE}")
    if not 0 < args.scale_window <= 60:
        raise BenchmarkError("--scale-window must be in (0, 60] seconds")
    parts(args)
    select(args.only, args.topology)


def measure_solo(
    client: Client, contenders: Sequence[Contender], seconds: float, rounds: int
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
    client: Client, url: str, contenders: Sequence[Contender], args: argparse.Namespace
) -> list[ContendedResult]:
    """``args.rounds`` contended runs per contender, in one pool of worker processes.

    Rounds interleave the contenders (every other round in reverse order);
    each contender's rounds are combined into medians (``combine_rounds``).
    """
    contenders = [c for c in contenders if c.contended]
    if not contenders:
        return []
    runs: dict[str, list[ContendedResult]] = {c.key: [] for c in contenders}
    with WorkerPool(args.processes) as pool:
        for round_ in range(args.rounds):
            for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
                client.flushdb()
                plan = Plan(
                    url, contender.key, args.seconds, args.critical_ms, args.topology == "cluster"
                )
                records = pool.run(plan)
                counter = int(client.get(COUNTER_KEY) or 0)
                result = summarize(plan, args.processes, records, counter)
                runs[contender.key].append(result)
                progress(
                    f"contended {round_ + 1}/{args.rounds} {contender.key}: "
                    f"{result.throughput:,.0f} acq/s, p50 {result.wait_p50_ms:.2f} ms, "
                    f"p99 {result.wait_p99_ms:.1f} ms, max {result.wait_max_ms:.1f} ms, "
                    f"fairness {result.fairness:.2f}, lost {result.lost_updates}"
                )
    return [combine_rounds(runs[c.key]) for c in contenders]


def measure_pool(
    client: redis.Redis, url: str, contenders: Sequence[Contender], args: argparse.Namespace
) -> tuple[list[PoolResult], list[SingleResult]]:
    """Bounded-pool rounds (interleaved) and single-connection handoffs per contender.

    A contender whose run had errors is not run again: its failure is the
    finding, and each failing run costs its timeouts.
    """
    contenders = [c for c in contenders if c.contended and c.pooled]
    runs: dict[str, list[PoolRun]] = {c.key: [] for c in contenders}
    for round_ in range(args.rounds):
        for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
            if any(run.errors for run in runs[contender.key]):
                continue
            client.flushdb()
            run = run_pool(url, contender.key)
            runs[contender.key].append(run)
            progress(
                f"bounded pool {round_ + 1}/{args.rounds} {contender.key}: {run.seconds:.3f} s, "
                f"{run.cycles} cycles, {run.errors} errors"
                + (f" ({run.first_error})" if run.first_error else "")
            )
    pooled = [combine_pool_runs(c.key, runs[c.key]) for c in contenders]
    single: list[SingleResult] = []
    for contender in contenders:
        client.flushdb()
        result = single_connection_latency(url, contender.key, args.single_tries)
        single.append(result)
        median = "-" if result.median_ms is None else f"{result.median_ms:.2f} ms"
        progress(
            f"single connection {contender.key}: median {median}, {result.errors} errors"
            + (f" ({result.first_error})" if result.first_error else "")
        )
    return pooled, single


def measure_waiters(client: redis.Redis, url: str, args: argparse.Namespace) -> list[CrowdResult]:
    """``args.tasks`` asyncio tasks, then ``args.threads`` threads, queued on one lock."""
    crowds: list[CrowdResult] = []
    for count, crowd in ((args.tasks, crowd_of_tasks), (args.threads, crowd_of_threads)):
        if count <= 0:
            continue
        client.flushdb()
        result = crowd(url, count, args.waiter_pool)
        crowds.append(result)
        progress(
            f"{count} waiting {result.kind}: {result.extra} extra connection(s) "
            f"({result.while_waiting} while waiting, {result.before} before, "
            f"{result.pool_connections} pooled), handoff p50 {result.handoff_p50_ms:.2f} ms, "
            f"p99 {result.handoff_p99_ms:.2f} ms, {result.errors} errors"
        )
    return crowds


def measure_names_part(
    url: str, contenders: Sequence[Contender], args: argparse.Namespace
) -> list[NamesResult]:
    """Each name kind in turn, each followed by its idle wait (unless skipped).

    redis-py's goes first: it leaves no key, so its wait returns at once and
    tenure's keys are not flushed before their wait.
    """
    keys = {c.key for c in contenders}
    results: list[NamesResult] = []
    for kind in sorted((k for k in NAME_KINDS if k in keys), key=lambda k: k == "tenure"):
        progress(f"names {kind}: {args.names:,} names ...")
        result = measure_names(
            url, kind, args.names, processes=args.name_processes, progress=progress
        )
        progress(
            f"names {kind}: {result.seconds:.0f} s ({result.rate:,.0f}/s), "
            f"{result.keys_after:,} keys and {result.used_after / 1e6:.1f} MB right after, "
            f"{result.errors} errors"
        )
        if not args.skip_idle_wait:  # returns at once when no key is left
            if result.keys_after:
                progress(f"names {kind}: waiting up to {args.idle_cap:g} s for the keys to go")
            result = wait_idle(url, result, args.idle_cap, progress=progress)
            progress(
                f"names {kind}: {result.keys_idle:,} keys after {result.idle_waited:.0f} s, "
                f"{(result.used_idle or 0) / 1e6:.1f} MB"
            )
        results.append(result)
    return results


def measure_entity_part(url: str, args: argparse.Namespace) -> list[EntityResult]:
    """Per-entity locks: ``--solo-seconds`` per run, medians of ``--rounds``."""
    return measure_entity(url, args.solo_seconds, args.rounds, progress=progress)


def measure_scale_part(
    url: str, args: argparse.Namespace
) -> tuple[list[HoldResult], list[WaitersResult]]:
    """Many locks held by one owner, then many asyncio waiters on one lock."""
    holds = measure_holds(
        url, counts(args.scale_holds, "--scale-holds"), args.scale_extra, args.rounds,
        progress=progress,
    )  # fmt: skip
    waiters = measure_scale_waiters(
        url, counts(args.scale_waiters, "--scale-waiters"), args.waiter_pool, args.scale_window,
        rounds=args.rounds, progress=progress,
    )  # fmt: skip
    return holds, waiters


def load_average() -> str:
    """The 1/5/15-minute load averages: other work on the machine skews the numbers."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


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
        packages=package_versions(_PACKAGES),
        seconds=args.seconds,
        solo_seconds=args.solo_seconds,
        solo_runs=args.solo_runs,
        processes=args.processes,
        critical_ms=args.critical_ms,
        elapsed=elapsed,
        parts=parts(args),
        rounds=args.rounds,
        single_tries=args.single_tries,
        waiter_pool=args.waiter_pool,
        idle_cap=None if args.skip_idle_wait else args.idle_cap,
        topology=args.topology,
        scale_window=args.scale_window,
    )


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The URL to measure on and a description of where it points."""
    if args.topology == "replicated":
        with Replicated(replicas=2) as replicated:
            yield (
                replicated.primary.url,
                "private `tenure.server.Replicated`: a primary, 2 replicas",
            )
        return
    if args.topology == "cluster":
        with Cluster(masters=3, replicas_per_master=2) as cluster:
            yield (
                cluster.masters[0].url,
                "private `tenure.server.Cluster`: 3 masters, 2 replicas each",
            )
        return
    with given_or_private(args.url, name="bench-locks") as (url, private):
        source = "given by --url"
        if private is not None:
            source = "private `tenure.server.ServerProcess`, loopback TCP"
        yield url, source


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report).

    Raises :class:`BenchmarkError` for arguments it cannot run with (a peer
    not installed among them); then says how long it will take, and a run
    that fails midway is reported on stderr and returns 1.
    """
    check_arguments(args)
    if args.otel:
        if parts(args) != ("solo",) or args.topology != "standalone":
            raise BenchmarkError("--otel measures the solo lock loop: give --parts solo")
        return run_for("locks", args, command, ("lock", "async lock"))
    contenders = select(args.only, args.topology)
    for contender in contenders:
        if contender.peer is not None:
            require_peer(*contender.peer)  # fail now, not in a worker process
    if args.url:
        check_empty(args.url, args.allow_flush)
    return run_timed("locks", estimated_seconds(args), describe(args), lambda: run(args, command))


def run(args: argparse.Namespace, command: Sequence[str]) -> None:
    """Measure every selected part and contender, print the table and write what was asked."""
    contenders = select(args.only, args.topology)
    chosen = parts(args)
    started = time.monotonic()
    load = load_average()
    results = Results()
    with servers(args) as (url, source):
        client = connect(url, cluster=args.topology == "cluster")
        try:
            with redis.Redis.from_url(url) as node:  # one node: version and round trip
                server = server_version(node)
                rtt_us = round_trip_us(node)
            progress(f"server: {server} at {url}, PING round trip {rtt_us:.0f} us")
            if "solo" in chosen:
                results.solo = measure_solo(client, contenders, args.solo_seconds, args.solo_runs)
            if "contended" in chosen:
                results.contended = measure_contended(client, url, contenders, args)
            if isinstance(client, redis.Redis):  # the parts about one server
                if "pool" in chosen:
                    results.pool, results.single = measure_pool(client, url, contenders, args)
                if "waiters" in chosen:
                    results.crowds = measure_waiters(client, url, args)
            if "names" in chosen:
                results.names = measure_names_part(url, contenders, args)
            if isinstance(client, redis.Redis):
                if "entity" in chosen:
                    results.entity = measure_entity_part(url, args)
                if "scale" in chosen:
                    results.holds, results.scale_waiters = measure_scale_part(url, args)
            client.flushdb()
        finally:
            client.close()
    info = run_info(args, command, server, source, rtt_us, load, time.monotonic() - started)
    print(summary_table(results, info), flush=True)
    if args.plot and results.contended:
        rounds = f", {args.rounds} rounds" if args.rounds > 1 else ""
        plot_waits(
            Path(args.plot),
            title=f"Lock wait times: {args.processes} processes, "
            f"{args.critical_ms:g} ms critical section, {args.seconds:g} s each{rounds}",
            subtitle=f"{server}, {info.nproc} CPUs, {info.date}",
            series={by_key(r.key).label.replace("`", ""): r.waits_ms for r in results.contended},
        )
        progress(f"wrote {args.plot}")
    if args.output:
        output = Path(args.output)
        figure = os.path.relpath(args.plot, output.parent) if args.plot else None
        output.parent.mkdir(parents=True, exist_ok=True)
        section = "locks" if args.topology == "standalone" else f"locks-{args.topology}"
        write_section(output, section, render(info, results, figure))
        progress(f"wrote {args.output}")
    if args.json:
        data = as_data(info, results)
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        progress(f"wrote {args.json}")
