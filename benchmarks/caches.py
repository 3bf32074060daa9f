"""``tenure bench caches``: tenure's HerdCache beside dogpile.cache, cashews and aiocache.

    tenure bench caches [--rounds 3] [--processes 4] [--callers 25] [--load 0.3]
        [--fresh 1.0] [--seconds 2] [--only KEY,...] [--url URL]
        [--output FILE.md] [--plot FILE.png]

Two parts, every contender in the same run on the same server:

* **Stampede.** ``--processes`` processes of ``--callers`` callers each
  (threads for a sync library, asyncio tasks for an async one) call one
  cached function of one key at the same instant, twice: on a cold key, and
  again just after the value's freshness (``--fresh``) ran out. The loader
  sleeps ``--load`` seconds and counts its calls on the server. Reported:
  loader calls, and the median and worst caller wait, each the median of
  ``--rounds`` rounds.
* **Hits.** One process calls the cached function of a warm key for
  ``--seconds``, one call after another: calls per second (median of
  the rounds), beside a bare ``GET`` + ``json.loads`` loop (sync and asyncio).

``--plot`` draws every caller's wait of the last round, per contender and
key state. The contenders are listed in :mod:`benchmarks.cache_contenders`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks import (
    ROOT,
    BenchmarkError,
    add_output_arguments,
    check_empty,
    progress,
    run_timed,
    several,
)
from benchmarks.cache_contenders import CACHES, CacheContender, by_key
from benchmarks.otel import OTEL_HELP, run_for
from benchmarks.plot import plot_waits
from benchmarks.sections import write_section
from tenure.server._process import given_or_private

__all__ = ["add_arguments", "estimated_seconds", "run_command"]

PHASES = ("cold", "expired")
START_DELAY = 3.0  # seconds for every worker process to start and connect
WORKER_TIMEOUT = 120.0
EXPIRED_AFTER = 0.25  # the expired phase: this long after the value's freshness ran out
START_SECONDS = 1.0  # the interpreter, the private server, the report
WORKER_SECONDS = 0.8  # a worker process's start (its library's imports) and exit
STAMPEDE_EXIT = 0.2  # the stampede's workers exiting, the counts read


@dataclass
class Stampede:
    """One contender's stampede figures over the rounds."""

    loads: dict[str, list[int]] = field(default_factory=lambda: {p: [] for p in PHASES})
    p50_ms: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    max_ms: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    last_waits_ms: dict[str, list[float]] = field(default_factory=dict)

    def median(self, what: str, phase: str) -> float:
        """The median over the rounds of ``loads``, ``p50_ms`` or ``max_ms``."""
        values: list[Any] = getattr(self, what)[phase]
        return float(statistics.median(values))


def _worker(config: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.cache_worker", json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,  # where python -m finds the benchmarks package
    )


def _collect(workers: list[subprocess.Popen[str]], label: str) -> list[dict[str, Any]]:
    reports = []
    for worker in workers:
        try:
            out, err = worker.communicate(timeout=WORKER_TIMEOUT)
        except subprocess.TimeoutExpired:
            for other in workers:
                other.kill()
            raise BenchmarkError(f"{label}: a worker hung for {WORKER_TIMEOUT:g} s") from None
        if worker.returncode != 0 or not out.strip():
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise BenchmarkError(f"{label}: a worker failed: {last}")
        reports.append(json.loads(out))
    return reports


def stampede_round(
    contender: CacheContender, url: str, args: argparse.Namespace, result: Stampede
) -> None:
    """One round: every worker calls on a cold key, then on a just-expired one."""
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    start = time.time() + START_DELAY
    # cold at start; just expired: the load ended at start + load, fresh for --fresh more
    phases = [start, start + args.load + args.fresh + EXPIRED_AFTER]
    config = {
        "mode": "stampede",
        "contender": contender.key,
        "url": url,
        "callers": args.callers,
        "load": args.load,
        "fresh": args.fresh,
        "phases": phases,
        "counter": "bench:loads",
    }
    reports = _collect([_worker(config) for _ in range(args.processes)], contender.label)
    with redis.Redis.from_url(url) as client:
        for index, phase in enumerate(PHASES):
            waits = sorted(1000 * w for report in reports for w in report["waits"][index])
            result.loads[phase].append(int(client.get(f"bench:loads:{index}") or 0))
            result.p50_ms[phase].append(statistics.median(waits))
            result.max_ms[phase].append(waits[-1])
            result.last_waits_ms[phase] = waits


def hit_rate(key: str, url: str, seconds: float) -> float:
    """Cached calls per second of one process on a warm key."""
    config = {"mode": "hits", "contender": key, "url": url, "seconds": seconds}
    return float(_collect([_worker(config)], key)[0]["per_second"])


def _chosen(only: str | None) -> list[CacheContender]:
    if not only:
        return list(CACHES)
    chosen = []
    for key in only.split(","):
        try:
            chosen.append(by_key(key.strip()))
        except KeyError:
            known = ", ".join(c.key for c in CACHES)
            raise BenchmarkError(f"--only: no contender {key.strip()!r} (known: {known})") from None
    return chosen


def _table(
    contenders: list[CacheContender],
    stampedes: dict[str, Stampede],
    hits: dict[str, float],
) -> list[list[str]]:
    rows = []
    for contender in contenders:
        figures = stampedes[contender.key]
        bare = hits["bare-async" if contender.is_async else "bare-sync"]
        rate = hits[contender.key]
        row = [contender.label]
        for phase in PHASES:
            row += [
                f"{figures.median('loads', phase):g}",
                f"{figures.median('p50_ms', phase):,.1f}",
                f"{figures.median('max_ms', phase):,.1f}",
            ]
        row += [f"{rate:,.0f}", f"{rate / bare:.2f}"]
        rows.append(row)
    return rows


HEADER = [
    "contender",
    "cold: loads",
    "p50 ms",
    "max ms",
    "expired: loads",
    "p50 ms",
    "max ms",
    "hits/s",
    "/ bare",
]


def _ratios(contenders: list[CacheContender], hits: dict[str, float]) -> list[str]:
    lines = []
    for mine in ("tenure-threads", "tenure-async"):
        if mine not in hits:
            continue
        kind = by_key(mine).is_async  # compared with peers of its own kind only
        others = [c for c in contenders if not c.key.startswith("tenure") and c.is_async == kind]
        parts = [f"{hits[mine] / hits[c.key]:.2f}x {c.label}" for c in others]
        bare = "bare-async" if mine == "tenure-async" else "bare-sync"
        parts.insert(0, f"{hits[mine] / hits[bare]:.2f}x the bare loop")
        lines.append(f"{by_key(mine).label} hits: " + ", ".join(parts))
    return lines


def targets(
    contenders: list[CacheContender],
    stampedes: dict[str, Stampede],
    hits: dict[str, float],
    load: float,
) -> list[tuple[str, str, str, bool]]:
    """The issue's goals for each tenure contender: (goal, contender, measured, met)."""
    found = []
    for mine in (c for c in contenders if c.key.startswith("tenure")):
        figures = stampedes[mine.key]
        cold_loads, cold_max = figures.median("loads", "cold"), figures.median("max_ms", "cold")
        limit = 1000 * load + 20
        found.append((
            f"cold key: 1 load, worst wait <= load + 20 ms ({limit:g} ms)", mine.label,
            f"{cold_loads:g} load(s), worst {cold_max:,.1f} ms",
            cold_loads == 1 and cold_max <= limit,
        ))  # fmt: skip
        hot_loads, hot_max = figures.median("loads", "expired"), figures.median("max_ms", "expired")
        found.append((
            "just-expired key: 1 load, worst wait <= 10 ms", mine.label,
            f"{hot_loads:g} load(s), worst {hot_max:,.1f} ms", hot_loads == 1 and hot_max <= 10,
        ))  # fmt: skip
        bare = hits["bare-async" if mine.is_async else "bare-sync"]
        found.append((
            "hits >= 0.9x the bare GET + json.loads loop", mine.label,
            f"{hits[mine.key]:,.0f}/s vs {bare:,.0f}/s: {hits[mine.key] / bare:.2f}x",
            hits[mine.key] >= 0.9 * bare,
        ))  # fmt: skip
        peers = [c for c in contenders if not c.key.startswith("tenure")]
        peers = [c for c in peers if c.is_async == mine.is_async]
        if peers:
            best = max(peers, key=lambda c: hits[c.key])
            found.append((
                "hits >= every peer of its kind", mine.label,
                f"{hits[mine.key]:,.0f}/s vs {best.label} {hits[best.key]:,.0f}/s",
                hits[mine.key] >= hits[best.key],
            ))  # fmt: skip
    return found


def render(
    contenders: list[CacheContender],
    stampedes: dict[str, Stampede],
    hits: dict[str, float],
    args: argparse.Namespace,
    server: str,
    command: str,
    plot: str | None,
) -> str:
    """The Markdown section."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = _table(contenders, stampedes, hits)
    lines = [
        "# Cache benchmark: tenure vs dogpile.cache, cashews and aiocache",
        "",
        f"Generated by `{command}` on {stamp}; do not edit: re-run it.",
        f"Server: {server}; Python {platform.python_version()}; {args.processes} processes x "
        f"{args.callers} callers on one key; loader {1000 * args.load:g} ms; freshness "
        f"{args.fresh:g} s; medians of {args.rounds} rounds. Sync libraries run their callers "
        "on threads, asyncio ones on tasks; each is compared with peers and a bare loop of "
        "its own kind.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|---|" + "---:|" * (len(HEADER) - 1),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "## Targets", "", "| Goal | Contender | Measured | Met |", "|---|---|---|---|"]
    lines += [
        f"| {goal} | {label} | {measured} | {'met' if met else '**not met**'} |"
        for goal, label, measured, met in targets(contenders, stampedes, hits, args.load)
    ]
    bare = (
        f"Bare loop, one process: `GET` + `json.loads` {hits['bare-sync']:,.0f} calls/s, "
        f"on asyncio {hits['bare-async']:,.0f} calls/s; `/ bare` compares each contender "
        "with the loop of its own kind."
    )
    lines += ["", bare, ""]
    lines += [f"* {line}" for line in _ratios(contenders, hits)]
    lines += [
        "",
        "*cold*: nobody has the value; *expired*: the value's freshness ran out "
        f"{EXPIRED_AFTER:g} s before the callers arrive. Loads are loader calls across all "
        "processes (1 is the goal); waits are how long each caller's call took.",
    ]
    if plot:
        lines += [
            "",
            f"![Caller waits of every contender, last round]({plot})",
            "",
            "Every caller's wait in the last round, cold and expired key: cumulative "
            "share (left) and the tail on log-log axes (right). Drawn by `--plot`.",
        ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians reported (3)")
    parser.add_argument("--processes", type=int, default=4, help="stampede processes (4)")
    parser.add_argument("--callers", type=int, default=25, help="callers per process (25)")
    parser.add_argument("--load", type=float, default=0.3, help="loader seconds (0.3)")
    parser.add_argument("--fresh", type=float, default=1.0, help="freshness seconds (1.0)")
    parser.add_argument("--seconds", type=float, default=2.0, help="per hit run (2)")
    parser.add_argument("--only", help="comma-separated contenders (default: all)")
    parser.add_argument(
        "--otel", action="store_true", help=OTEL_HELP.format(what="the warm cache hit")
    )
    parser.add_argument(
        "--near",
        action="store_true",
        help="measure instead near caching: hits from memory beside a bare GET, how soon "
        "another process's write is seen, memory per entry (benchmarks/near.py)",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="measure instead get_many of 100 warm entries beside one MGET + json.loads "
        "(benchmarks/batch.py)",
    )
    add_output_arguments(parser, output, "caller-wait")


def _check(args: argparse.Namespace) -> None:
    if not (
        1 <= args.rounds <= 20
        and 1 <= args.processes <= 16
        and 1 <= args.callers <= 200
        and 0 < args.load <= 10
        and 0.1 <= args.fresh <= 60
        and 0 < args.seconds <= 60
    ):
        raise BenchmarkError(
            "--rounds 1..20, --processes 1..16, --callers 1..200, --load (0, 10], "
            "--fresh [0.1, 60] and --seconds (0, 60]"
        )


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    _check(args)
    if args.otel:
        return run_for("caches", args, command, ("cache hit", "async cache hit"))
    if args.near:
        from benchmarks.near import run_near

        return run_near(args, command)
    if args.batch:
        from benchmarks.batch import run_batch

        return run_batch(args, command)
    contenders = _chosen(args.only)

    def run(url: str, server: str) -> None:
        stampedes = {c.key: Stampede() for c in contenders}
        hits: dict[str, list[float]] = {}
        for round_number in range(1, args.rounds + 1):
            for contender in contenders:
                figures = stampedes[contender.key]
                stampede_round(contender, url, args, figures)
                progress(
                    f"round {round_number}/{args.rounds} stampede {contender.key}: "
                    + ", ".join(
                        f"{phase} {figures.loads[phase][-1]} load(s), "
                        f"worst wait {figures.max_ms[phase][-1]:,.0f} ms"
                        for phase in PHASES
                    )
                )
            for key in ["bare-sync", "bare-async", *(c.key for c in contenders)]:
                hits.setdefault(key, []).append(hit_rate(key, url, args.seconds))
                progress(f"round {round_number}/{args.rounds} hits {key}: {hits[key][-1]:,.0f}/s")
        rates = {key: statistics.median(values) for key, values in hits.items()}
        widths = [
            max(len(r[i]) for r in [HEADER, *_table(contenders, stampedes, rates)])
            for i in range(len(HEADER))
        ]
        for row in [HEADER, *_table(contenders, stampedes, rates)]:
            print(
                "  ".join(
                    cell.rjust(w) if i else cell.ljust(w)
                    for i, (cell, w) in enumerate(zip(row, widths, strict=True))
                )
            )
        print(
            f"bare GET + json.loads: {rates['bare-sync']:,.0f}/s sync, "
            f"{rates['bare-async']:,.0f}/s asyncio"
        )
        for line in _ratios(contenders, rates):
            print(line)
        for goal, label, measured, met in targets(contenders, stampedes, rates, args.load):
            print(f"{'met' if met else 'NOT MET':>8}  {label}: {goal}: {measured}")
        if args.plot:
            plot_waits(
                Path(args.plot),
                title=f"Caller waits: {args.processes} processes x {args.callers} callers, "
                f"{1000 * args.load:g} ms loader",
                subtitle=server,
                series={
                    f"{c.label} ({phase})": stampedes[c.key].last_waits_ms[phase]
                    for c in contenders
                    for phase in PHASES
                },
            )
            print(f"wrote {args.plot}", file=sys.stderr)
        if args.output:
            output = Path(args.output)
            figure = os.path.relpath(args.plot, output.parent) if args.plot else None
            report = render(contenders, stampedes, rates, args, server, shlex.join(command), figure)
            write_section(output, "caches", report)
            print(f"wrote {args.output}", file=sys.stderr)

    def run_private() -> None:
        with given_or_private(args.url, name="bench-caches") as (url, server):
            where = (
                url
                if server is None
                else f"{server.engine.name} {server.engine.version} (private, loopback)"
            )
            run(url, where)

    if args.url:
        check_empty(args.url, args.allow_flush)
    what = f"{several(len(contenders), 'contender')}, {several(args.rounds, 'round')}"
    return run_timed("caches", estimated_seconds(args), what, run_private)


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long a run with ``args`` (checked) takes, in seconds.

    A stampede lasts from its common start (``START_DELAY`` away) to its
    expired phase, that call's load, and the load the workers stay up for;
    each hit run (every contender and the two bare loops) is a worker process
    calling for ``--seconds``.
    """
    contenders = len(_chosen(args.only))
    load, fresh = float(args.load), float(args.fresh)
    stampede = START_DELAY + load + fresh + EXPIRED_AFTER + 2 * load + STAMPEDE_EXIT
    hits = (contenders + 2) * (WORKER_SECONDS + float(args.seconds))
    return START_SECONDS + int(args.rounds) * (contenders * stampede + hits)
