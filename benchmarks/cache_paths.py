"""``tenure bench cache-paths``: every cache read path beside the bare commands it replaces.

    tenure bench cache-paths [--rounds 5] [--seconds 1] [--only PATH,...]
        [--url URL] [--output FILE.md]

A cache's hit can cost no less than the one ``GET`` and ``json.loads`` a
hand-written cache makes, and its miss no less than that ``GET`` (nil),
the load and one ``SET``. Each path below runs alone in a process of its own
for ``--seconds``, one call after another, on redis-py and on redis.asyncio,
each beside its bare loop (the two alternating in the one process, so both
run on the same cores), the paths taking turns (a new order every round);
medians of the rounds:

* hits of a warm entry: the bare ``GET`` + ``json.loads``, ``Cache.get``,
  ``HerdCache.get``, ``HerdCache.fetch`` and a ``@cached`` function;
* misses, a new entry each call, the loader returning at once: the bare
  ``GET`` (nil) + ``SET ... PX``, ``HerdCache.fetch`` and ``@cached``.

Reported per call: µs on the client (the loop's wall time) and its CPU µs,
the server's CPU µs (``INFO cpu``), round trips (counted on the client) and
the commands run (``INFO commandstats``, a script's own counted too); each
path against the bare loop of its own API measured in the same process
(targets: hits <= 1.1x, misses <= 1.5x).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import platform
import random
import shlex
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

import tenure
from benchmarks import (
    BenchmarkError,
    add_output_arguments,
    check_empty,
    progress,
    run_timed,
    server_cpu_us,
    several,
)
from benchmarks.cache_contenders import VALUE
from benchmarks.sections import write_section
from tenure._tools.children import sigint_blocked, start_helper
from tenure.server._process import given_or_private

__all__ = ["PATHS", "add_arguments", "estimated_seconds", "run_command"]

HIT_TARGET = 1.1
MISS_TARGET = 1.5
TTL = 3600.0
WORKER_PATIENCE = 120.0
MAX_CALLS = 2_000_000
START_SECONDS = 0.6  # the interpreter, the private server, the report
WORKER_SECONDS = 0.6  # a path's process: spawn, imports, warm-up, the counted calls


@dataclass(frozen=True)
class CachePath:
    """One way of reading a cache, as one row of the report."""

    key: str
    label: str
    miss: bool  # a new entry each call (else one warm entry)


PATHS: tuple[CachePath, ...] = (
    CachePath("bare", "bare `GET` + `json.loads`", False),
    CachePath("cache-get", "`Cache.get`", False),
    CachePath("herd-get", "`HerdCache.get`", False),
    CachePath("herd-fetch", "`HerdCache.fetch`", False),
    CachePath("cached", "`@cached` function", False),
    CachePath("bare-miss", "bare `GET` (nil) + `SET ... PX`", True),
    CachePath("herd-fetch-miss", "`HerdCache.fetch`, a miss", True),
    CachePath("cached-miss", "`@cached` function, a miss", True),
)
BASELINE = {False: "bare", True: "bare-miss"}


def _by_key(key: str) -> CachePath:
    for path in PATHS:
        if path.key == key:
            return path
    raise KeyError(key)


def _sync_call(key: str, client: redis.Redis) -> Callable[[str], Any]:
    """``call(entry)`` of path ``key`` on a redis-py client."""
    if key in ("bare", "bare-miss"):

        def bare(entry: str) -> Any:
            data = client.get(f"bench:bare:{entry}")
            if data is not None:
                return json.loads(data)
            client.set(f"bench:bare:{entry}", json.dumps(VALUE), px=int(TTL * 1000))
            return dict(VALUE)

        return bare
    if key == "cache-get":
        plain = tenure.Cache(client, "paths", ttl=TTL)
        plain.set("warm", VALUE)
        return plain.get
    if key in ("cached", "cached-miss"):

        @tenure.cached(client, ttl=TTL, name="paths")
        def function(entry: str) -> Any:
            return dict(VALUE)

        return function
    herd = tenure.HerdCache(client, "paths", ttl=TTL)
    if key == "herd-get":
        herd.set("warm", VALUE)
        return herd.get
    return lambda entry: herd.fetch(entry, lambda: dict(VALUE))


def _async_call(key: str, client: redis.asyncio.Redis) -> Callable[[str], Awaitable[Any]]:
    """``call(entry)`` of path ``key`` on a redis.asyncio client (the entry warmed first)."""
    if key in ("bare", "bare-miss"):

        async def bare(entry: str) -> Any:
            data = await client.get(f"bench:bare:{entry}")
            if data is not None:
                return json.loads(data)
            await client.set(f"bench:bare:{entry}", json.dumps(VALUE), px=int(TTL * 1000))
            return dict(VALUE)

        return bare
    if key == "cache-get":
        return tenure.AsyncCache(client, "paths", ttl=TTL).get
    if key in ("cached", "cached-miss"):

        @tenure.cached(client, ttl=TTL, name="paths")
        async def function(entry: str) -> Any:
            return dict(VALUE)

        return function
    herd = tenure.AsyncHerdCache(client, "paths", ttl=TTL)
    if key == "herd-get":
        return herd.get

    async def load() -> Any:
        return dict(VALUE)

    return lambda entry: herd.fetch(entry, load)


def _server(client: redis.Redis) -> tuple[float, int]:
    """The server's CPU µs and the commands it ran (scripts' own included), so far."""
    stats: Any = client.info("commandstats")
    return server_cpu_us(client), sum(int(entry.get("calls", 0)) for entry in stats.values())


def _entries(miss: bool) -> Callable[[int], str]:
    if miss:
        return lambda n: f"m{n}"
    return lambda n: "warm"


COUNTED = 200
"""Calls made after the timed loop with every command sent counted (round trips)."""


class _Sends:
    """Counts the commands (or pipelines) a connection class sends, while on."""

    def __init__(self, connection_class: Any) -> None:
        self.count = 0
        self._class = connection_class
        self._original = connection_class.send_packed_command

    def __enter__(self) -> _Sends:
        original = self._original

        def counted(connection: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(connection, *args, **kwargs)

        self._class.send_packed_command = counted
        return self

    def __exit__(self, *exc: object) -> None:
        self._class.send_packed_command = self._original


BLOCKS = 8
"""Each run alternates the path and its bare loop this many times, half a second's
share each: both are measured in one process, on the same cores."""


class _Tally:
    """One loop's totals over its blocks: calls, wall and CPU seconds, server figures."""

    def __init__(self) -> None:
        self.calls = 0
        self.wall = self.cpu = self.server_us = 0.0
        self.commands = 0

    def add(
        self, calls: int, wall: float, cpu: float, before: tuple[float, int],
        after: tuple[float, int],
    ) -> None:  # fmt: skip
        self.calls += calls
        self.wall += wall
        self.cpu += cpu
        self.server_us += after[0] - before[0]
        self.commands += after[1] - before[1] - 2  # the two INFOs of `after` are counted in it

    def figures(self, round_trips: float) -> dict[str, float]:
        return {
            "us": 1e6 * self.wall / self.calls,
            "cpu_us": 1e6 * self.cpu / self.calls,
            "server_us": self.server_us / self.calls,
            "commands": self.commands / self.calls,
            "round_trips": round_trips,
        }


def _block_over(count: int, began: float, seconds: float) -> bool:
    return count >= MAX_CALLS or (count % 64 == 0 and time.perf_counter() >= began + seconds)


def _run_sync(key: str, url: str, seconds: float) -> dict[str, dict[str, float]]:
    """Path ``key`` and its bare loop in turns for ``seconds`` in all: each one's figures."""
    client = redis.Redis.from_url(url)
    base = BASELINE[_by_key(key).miss]
    calls = {name: _sync_call(name, client) for name in dict.fromkeys((key, base))}
    entry, admin = _entries(_by_key(key).miss), redis.Redis.from_url(url)
    tallies = {name: _Tally() for name in calls}
    made = 0
    for call in calls.values():
        call("warm")
        call("warm")
    for _ in range(BLOCKS):
        for name, call in calls.items():
            before, count = _server(admin), 0
            began, cpu = time.perf_counter(), time.process_time()
            while not _block_over(count, began, seconds / BLOCKS / len(calls)):
                call(entry(made))
                count, made = count + 1, made + 1
            wall, cpu = time.perf_counter() - began, time.process_time() - cpu
            tallies[name].add(count, wall, cpu, before, _server(admin))
    found = {}
    for name, call in calls.items():
        with _Sends(redis.connection.AbstractConnection) as sends:
            for _ in range(COUNTED):
                call(entry(made))
                made += 1
        found[name] = tallies[name].figures(sends.count / COUNTED)
    return found


async def _run_async(key: str, url: str, seconds: float) -> dict[str, dict[str, float]]:
    """:func:`_run_sync` on redis.asyncio."""
    client = redis.asyncio.Redis.from_url(url)
    base = BASELINE[_by_key(key).miss]
    calls = {name: _async_call(name, client) for name in dict.fromkeys((key, base))}
    entry, admin = _entries(_by_key(key).miss), redis.Redis.from_url(url)
    if key == "herd-get":
        await tenure.AsyncHerdCache(client, "paths", ttl=TTL).set("warm", VALUE)
    elif key == "cache-get":
        await tenure.AsyncCache(client, "paths", ttl=TTL).set("warm", VALUE)
    tallies = {name: _Tally() for name in calls}
    made = 0
    for call in calls.values():
        await call("warm")
        await call("warm")
    for _ in range(BLOCKS):
        for name, call in calls.items():
            before, count = _server(admin), 0
            began, cpu = time.perf_counter(), time.process_time()
            while not _block_over(count, began, seconds / BLOCKS / len(calls)):
                await call(entry(made))
                count, made = count + 1, made + 1
            wall, cpu = time.perf_counter() - began, time.process_time() - cpu
            tallies[name].add(count, wall, cpu, before, _server(admin))
    found = {}
    for name, call in calls.items():
        with _Sends(redis.asyncio.connection.AbstractConnection) as sends:
            for _ in range(COUNTED):
                await call(entry(made))
                made += 1
        found[name] = tallies[name].figures(sends.count / COUNTED)
    await client.aclose()
    return found


def _worker(key: str, is_async: bool, url: str, seconds: float, results: Any) -> None:
    """One path and its bare loop in a process: their figures, or the error that stopped it."""
    start_helper()
    try:
        if is_async:
            results.put(asyncio.run(_run_async(key, url, seconds)))
        else:
            results.put(_run_sync(key, url, seconds))
    except Exception as exc:
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _measure_once(
    key: str, is_async: bool, url: str, seconds: float
) -> dict[str, dict[str, float]]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    worker = context.Process(target=_worker, args=(key, is_async, url, seconds, results))
    with sigint_blocked():
        worker.start()
    try:
        got = results.get(timeout=WORKER_PATIENCE)
    except Exception as exc:
        raise BenchmarkError(f"{key}: the worker failed or hung: {exc!r}") from exc
    finally:
        worker.join(5)
        if worker.is_alive():
            worker.kill()
    if "error" in got:
        raise BenchmarkError(f"{key}: {got['error']}")
    return dict(got)


Figures = dict[tuple[str, bool], dict[str, float]]


def measure(
    url: str, paths: Sequence[CachePath], rounds: int, seconds: float,
    progress: Callable[[str], None],
) -> Figures:  # fmt: skip
    """Medians over ``rounds`` of every (path, asyncio?) pair's figures.

    A path's ``x`` is the median of its rounds' ratios to the bare loop run in
    the same process; a bare loop's figures are the medians of all its runs.
    """
    samples: dict[tuple[str, bool], list[dict[str, float]]] = {}
    pairs = _pairs(paths)
    shuffle = random.Random(7)
    for round_ in range(rounds):
        shuffle.shuffle(pairs)
        for key, is_async in pairs:
            with redis.Redis.from_url(url) as client:
                client.flushdb()
            got = _measure_once(key, is_async, url, seconds)
            base = BASELINE[_by_key(key).miss]
            for name, figures in got.items():
                sample = dict(figures)
                if name != base:
                    sample["x"] = figures["us"] / got[base]["us"]
                samples.setdefault((name, is_async), []).append(sample)
            api = "asyncio" if is_async else "sync"
            ratio = f", {got[key]['us'] / got[base]['us']:.2f}x" if key != base else ""
            progress(
                f"round {round_ + 1}/{rounds}, {key} ({api}): {got[key]['us']:.1f} µs a call{ratio}"
            )
    return {
        pair: {what: statistics.median(s[what] for s in got) for what in got[0]}
        for pair, got in samples.items()
    }


def _pairs(paths: Sequence[CachePath]) -> list[tuple[str, bool]]:
    """The (path, asyncio?) runs of a round: every path but the bare loops, on both APIs."""
    pairs = [(p.key, a) for p in paths if p.key not in BASELINE.values() for a in (False, True)]
    return pairs or [(p.key, a) for p in paths for a in (False, True)]  # the bare loops alone


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long a run with ``args`` (checked) takes: a process per path run."""
    runs = int(args.rounds) * len(_pairs(_chosen(args.only)))
    return START_SECONDS + runs * (float(args.seconds) + WORKER_SECONDS)


def _ratio(figures: Figures, path: CachePath, is_async: bool) -> float | None:
    return figures[(path.key, is_async)].get("x")


def verdicts(figures: Figures, paths: Sequence[CachePath]) -> list[tuple[str, float, bool]]:
    """(what, ratio, met) for every path measured beside its baseline."""
    found = []
    for path in paths:
        for is_async in (False, True):
            ratio = _ratio(figures, path, is_async)
            if ratio is None:
                continue
            target = MISS_TARGET if path.miss else HIT_TARGET
            api = "asyncio" if is_async else "sync"
            what = f"{path.label} ({api}) <= {target}x {_by_key(BASELINE[path.miss]).label}"
            found.append((what, ratio, ratio <= target))
    return found


def _cells(figures: Figures, path: CachePath, is_async: bool) -> list[str]:
    got = figures[(path.key, is_async)]
    ratio = _ratio(figures, path, is_async)
    return [
        f"{got['us']:.1f}",
        "1.00" if ratio is None else f"{ratio:.2f}",
        f"{got['cpu_us']:.1f}",
        f"{got['server_us']:.2f}",
        f"{got['round_trips']:.2f}",
        f"{got['commands']:.2f}",
    ]


COLUMNS = ("µs", "x", "client CPU µs", "server CPU µs", "round trips", "server commands")


def render(
    figures: Figures, paths: Sequence[CachePath], server: str, rounds: int, seconds: float,
    command: str,
) -> str:  # fmt: skip
    """The Markdown section."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Cache read paths: every hit and miss beside the bare commands",
        "",
        f"Generated by `{command}` on {stamp}; do not edit: re-run it.",
        f"Server: {server}; Python {platform.python_version()}; each path in a process of "
        f"its own for {seconds:g} s, one call after another, alternating with the bare "
        f"loop of its API {BLOCKS} times; medians of {rounds} rounds (a new order each "
        "round); `x` is the median of each round's ratio to that bare loop. µs per call "
        "on the client; server CPU µs from `INFO cpu`, commands "
        "per call from `INFO commandstats` (commands run inside scripts included); "
        "round trips counted on the client over 200 more calls.",
    ]
    for is_async, api in ((False, "redis-py"), (True, "redis.asyncio")):
        lines += [
            "",
            f"**{api}**",
            "",
            "| path | " + " | ".join(COLUMNS) + " |",
            "|---|" + "---:|" * len(COLUMNS),
        ]
        for path in paths:
            lines.append("| " + " | ".join([path.label, *_cells(figures, path, is_async)]) + " |")
    lines += ["", "| Goal | Measured | Met |", "|---|---|---|"]
    lines += [
        f"| {what} | {ratio:.2f}x | {'met' if met else '**not met**'} |"
        for what, ratio, met in verdicts(figures, paths)
    ]
    lines += [
        "",
        "A herd-cache hit is one `GET` (a cache whose recent reads are mostly hits) or one",
        "`SET entry l<token> NX PX lease GET` (otherwise), served when this process's",
        "estimate of the server's clock finds it fresh. A miss is that `SET`, which puts the",
        "caller's load mark in the entry's place and so elects it to load, the loader, and",
        "the `cache_commit` script: the bare loop's two round trips. In a cache whose reads",
        "are mostly hits, a miss costs a third: the `GET`, then `cache_fetch` elects the",
        "loader ([caches](caches.md)).",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--rounds", type=int, default=5, help="rounds, median taken (5)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per path run (2)")
    parser.add_argument("--only", help="comma-separated paths (default: all)")
    add_output_arguments(parser, output, None)


def _chosen(only: str | None) -> list[CachePath]:
    if not only:
        return list(PATHS)
    chosen = []
    for key in only.split(","):
        try:
            chosen.append(_by_key(key.strip()))
        except KeyError:
            known = ", ".join(p.key for p in PATHS)
            raise BenchmarkError(f"--only: no path {key.strip()!r} (known: {known})") from None
    for path in list(chosen):  # each beside its baseline
        base = _by_key(BASELINE[path.miss])
        if base not in chosen:
            chosen.insert(0, base)
    return chosen


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    if not 1 <= args.rounds <= 50 or not 0.1 <= args.seconds <= 60:
        raise BenchmarkError("--rounds must be in 1..50 and --seconds in [0.1, 60]")
    paths = _chosen(args.only)
    if args.url:
        check_empty(args.url, args.allow_flush)

    def run() -> None:
        with given_or_private(args.url, name="bench-cache-paths") as (url, server):
            where = (
                url
                if server is None
                else f"{server.engine.name} {server.engine.version} (private, loopback)"
            )
            figures = measure(url, paths, args.rounds, args.seconds, progress)
        report(args, command, paths, figures, where)

    what = f"{several(len(_pairs(paths)), 'run')} a round, {several(args.rounds, 'round')}"
    return run_timed("cache-paths", estimated_seconds(args), what, run)


def report(
    args: argparse.Namespace, command: Sequence[str], paths: Sequence[CachePath],
    figures: Figures, where: str,
) -> None:  # fmt: skip
    """Print the tables and the targets; write the report if asked."""
    widths = (8, 6, 9, 10, 8, 9)
    for is_async, api in ((False, "redis-py"), (True, "redis.asyncio")):
        print(f"{api:<36}{'us':>8}{'x':>6}{'cpu us':>9}{'srv us':>10}{'trips':>8}{'cmds':>9}")
        for path in paths:
            cells = _cells(figures, path, is_async)
            print(
                f"{path.label:<36}"
                + "".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
            )
    print("\ntargets:")
    for what, ratio, met in verdicts(figures, paths):
        print(f"  [{'met' if met else 'NOT MET'}] {what}: {ratio:.2f}x")
    if args.output:
        text = render(figures, paths, where, args.rounds, args.seconds, shlex.join(command))
        write_section(Path(args.output), "cache-paths", text)
        progress(f"wrote {args.output}")
