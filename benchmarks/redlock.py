"""``tenure bench redlock``: tenure's Redlock beside pottery's and aioredlock over three masters.

    tenure bench redlock [--seconds 4] [--solo-seconds 3] [--solo-runs 3]
        [--rounds 3] [--processes 4] [--critical-ms 1] [--slow-ms 50]
        [--only KEYS] [--url URL --url URL --url URL [--allow-flush]]
        [--output FILE.md] [--json FILE]

Three private servers on loopback are the masters, unless ``--url`` names
the masters (once per master; their databases must be empty, or
``--allow-flush``: the benchmark empties them between measurements). Each contender is
measured in one run, twice: with every master well, and with one
master slowed by ``--slow-ms`` (every reply that late, through a fault
proxy in a process of its own). Measured: solo acquire + release cycles per
second and the median time of one acquire (one process, no contention);
then ``--processes`` processes contending, each holding the lock for
``--critical-ms`` around a racy increment (a lost update means two holders
at once): acquisitions per second, the wait of each acquire (p50, p99,
max) and fairness (the least served process over the most served). Rounds
interleave the contenders; medians are reported. A table is printed;
``--output`` writes the ``redlock`` section of a Markdown file.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks import (
    BenchmarkError,
    check_empty,
    package_versions,
    progress,
    ratio,
    require_peer,
    round_trip_us,
    run_timed,
    server_version,
    several,
)
from benchmarks.contenders import BenchLock
from benchmarks.measure import (
    COUNTER_KEY,
    LOCK_NAME,
    ContendedResult,
    Plan,
    WorkerPool,
    combine_rounds,
    summarize,
)
from benchmarks.redlock_contenders import (
    REDLOCK_CONTENDERS,
    REDLOCK_REFERENCE,
    RedlockContender,
    estimated_seconds,
    redlock_by_key,
)
from benchmarks.sections import write_section
from tenure._tools.children import start_helper
from tenure.server import FaultProxy, ServerProcess

__all__ = ["add_arguments", "estimated_seconds", "run_command"]

_PACKAGES = ("tenure", "redis", "pottery", "aioredlock", "aioredis")
SOLO_WARMUP = 20
MAX_SOLO_CYCLES = 1_000_000
PEERS = ("pottery", "aioredlock")
SCENARIOS = ("well", "slow")


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--seconds", type=float, default=4.0, help="per contended run (4)")
    parser.add_argument(
        "--solo-seconds", type=float, default=3.0, help="per solo contender, all runs (3)"
    )
    parser.add_argument("--solo-runs", type=int, default=3, help="solo runs, median taken (3)")
    parser.add_argument("--rounds", type=int, default=3, help="contended rounds, median (3)")
    parser.add_argument("--processes", type=int, default=4, help="contending processes (4)")
    parser.add_argument("--critical-ms", type=float, default=1.0, help="time held (1 ms)")
    parser.add_argument(
        "--slow-ms", type=float, default=50.0, help="the slow master's added reply time (50 ms)"
    )
    parser.add_argument("--only", default=None, help="comma-separated contender keys (all)")
    parser.add_argument(
        "--url",
        action="append",
        default=[],
        help="a master to use instead of starting three (once per master; TCP only)",
    )
    parser.add_argument(
        "--allow-flush",
        action="store_true",
        help="let the benchmark empty (FLUSHDB) --url databases that hold keys",
    )
    parser.add_argument(
        "--output", default=output, help=f"write the Markdown report section here ({output})"
    )
    parser.add_argument("--json", help="also write the raw results here")


def _check(args: argparse.Namespace) -> list[RedlockContender]:
    if not 0 < args.seconds <= 600 or not 0 < args.solo_seconds <= 600:
        raise BenchmarkError("--seconds and --solo-seconds must be in (0, 600]")
    if not 1 <= args.solo_runs <= 99 or not 1 <= args.rounds <= 99:
        raise BenchmarkError("--solo-runs and --rounds must be in 1..99")
    if not 1 <= args.processes <= 64:
        raise BenchmarkError("--processes must be in 1..64")
    if not 0 <= args.critical_ms <= 1000 or not 0 < args.slow_ms <= 5000:
        raise BenchmarkError("--critical-ms must be in [0, 1000] and --slow-ms in (0, 5000]")
    for url in args.url:
        _address(url)
    if len(set(map(_address, args.url))) < len(args.url):
        raise BenchmarkError("--url names one master twice: give each master once")
    chosen = list(REDLOCK_CONTENDERS)
    if args.only:
        keys = {k.strip() for k in args.only.split(",") if k.strip()}
        unknown = keys - {c.key for c in chosen}
        if unknown:
            known = ", ".join(c.key for c in chosen)
            raise BenchmarkError(
                f"unknown contender(s) {', '.join(sorted(unknown))}; known: {known}"
            )
        chosen = [c for c in chosen if c.key in keys]
    for contender in chosen:
        if contender.peer is not None:
            require_peer(*contender.peer)  # fail now, not in a worker process
    return chosen


# -- the slow master: a fault proxy in a process of its own ---------------------------


def _proxy_main(target: tuple[str, int], latency: float, ports: Any, stop: Any) -> None:
    start_helper()
    with FaultProxy(*target, name="slow-master") as proxy:
        proxy.set_latency(latency, "downstream")
        ports.put(proxy.port)
        stop.wait()


@contextlib.contextmanager
def slow_proxy(target: tuple[str, int], latency: float) -> Iterator[str]:
    """A URL whose replies come ``latency`` seconds late (a proxy in another process).

    In another process so that its relaying never competes with the
    measuring process for the interpreter.
    """
    context = multiprocessing.get_context("spawn")
    ports: Any = context.Queue()
    stop = context.Event()
    process = context.Process(target=_proxy_main, args=(target, latency, ports, stop), daemon=True)
    process.start()
    try:
        yield f"redis://127.0.0.1:{ports.get(timeout=60)}"
    finally:
        stop.set()
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()


# -- measurements ----------------------------------------------------------------------


@dataclass(frozen=True)
class Solo:
    """One contender uncontended: cycles per second and one acquire's median time."""

    key: str
    cycles_per_second: float
    acquire_p50_ms: float
    runs: tuple[float, ...] = ()


@dataclass
class Scenario:
    """Every contender's figures with the masters in one state."""

    name: str
    solo: list[Solo] = field(default_factory=list)
    contended: list[ContendedResult] = field(default_factory=list)

    def solo_of(self, key: str) -> Solo | None:
        """The solo figures of ``key`` (None if it was not measured)."""
        return next((s for s in self.solo if s.key == key), None)

    def contended_of(self, key: str) -> ContendedResult | None:
        """The contended figures of ``key`` (None if it was not measured)."""
        return next((c for c in self.contended if c.key == key), None)


def _address(url: str) -> tuple[str, int]:
    """The host and port of a ``--url`` (the slow scenario puts a proxy before one)."""
    try:
        kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
    except ValueError as exc:
        raise BenchmarkError(f"--url {url}: {exc}") from exc
    if "path" in kwargs or "host" not in kwargs:
        raise BenchmarkError(f"--url {url}: the masters must be TCP servers (host:port)")
    return str(kwargs["host"]), int(kwargs.get("port", 6379))


def _flush(urls: Sequence[str]) -> None:
    for url in urls:
        with redis.Redis.from_url(url) as client:
            client.flushdb()


def time_solo(
    contender: RedlockContender, urls: Sequence[str], seconds: float
) -> tuple[float, float]:
    """Cycles per second and the median acquire time (s) for ``seconds``."""
    lock = contender.make(urls, LOCK_NAME)
    try:
        return _time_solo(contender, lock, seconds)
    finally:
        lock.close()


def _time_solo(contender: RedlockContender, lock: BenchLock, seconds: float) -> tuple[float, float]:
    for _ in range(SOLO_WARMUP):
        _acquire_alone(contender, lock)
        lock.release()
    acquires: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline and len(acquires) < MAX_SOLO_CYCLES:
        _acquire_alone(contender, lock)
        took = time.perf_counter() - now  # a retried acquire counts whole
        lock.release()
        acquires.append(took)
        now = time.perf_counter()
    return len(acquires) / (now - start), statistics.median(acquires)


def _acquire_alone(contender: RedlockContender, lock: BenchLock, attempts: int = 3) -> None:
    """Acquire with nobody else asking; three refusals in a row fail the bench.

    A refusal is retried: a peer whose validity ran out on a busy machine
    refuses one now and then.
    """
    for _ in range(attempts):
        if lock.acquire():
            return
    raise BenchmarkError(f"{attempts} uncontended acquires of {contender.key} in a row failed")


def measure_solo(
    contenders: Sequence[RedlockContender], urls: Sequence[str], args: argparse.Namespace
) -> list[Solo]:
    """Median of ``--solo-runs`` runs per contender, interleaved."""
    runs: dict[str, list[tuple[float, float]]] = {c.key: [] for c in contenders}
    for round_ in range(args.solo_runs):
        for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
            _flush(urls)
            rate, took = time_solo(contender, urls, args.solo_seconds / args.solo_runs)
            runs[contender.key].append((rate, took))
            progress(
                f"  solo {round_ + 1}/{args.solo_runs} {contender.key}: {rate:,.0f} cycles/s, "
                f"acquire p50 {took * 1000:.2f} ms"
            )
    return [
        Solo(
            key,
            statistics.median(rate for rate, _ in found),
            statistics.median(took for _, took in found) * 1000,
            tuple(rate for rate, _ in found),
        )
        for key, found in runs.items()
    ]


def measure_contended(
    contenders: Sequence[RedlockContender],
    urls: Sequence[str],
    counter_url: str,
    args: argparse.Namespace,
) -> list[ContendedResult]:
    """``--rounds`` contended runs per contender in one pool of processes, medians combined."""
    runs: dict[str, list[ContendedResult]] = {c.key: [] for c in contenders}
    with WorkerPool(args.processes) as pool, redis.Redis.from_url(counter_url) as counter:
        for round_ in range(args.rounds):
            for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
                _flush(urls)
                plan = Plan(
                    counter_url,
                    contender.key,
                    args.seconds,
                    args.critical_ms,
                    masters=tuple(urls),
                )
                records = pool.run(plan)
                result = summarize(
                    plan, args.processes, records, int(counter.get(COUNTER_KEY) or 0)
                )
                runs[contender.key].append(result)
                progress(
                    f"  contended {round_ + 1}/{args.rounds} {contender.key}: "
                    f"{result.throughput:,.0f} acq/s, p50 {result.wait_p50_ms:.2f} ms, "
                    f"p99 {result.wait_p99_ms:.1f} ms, max {result.wait_max_ms:.1f} ms, "
                    f"fairness {result.fairness:.2f}, lost {result.lost_updates}"
                )
    return [combine_rounds(runs[c.key]) for c in contenders]


# -- report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One of the issue's targets and whether this run met it."""

    what: str
    figures: str
    met: bool | None  # None: a figure shown for comparison, not a target


def _ahead(
    mine_solo: Solo, mine: ContendedResult, theirs_solo: Solo, theirs: ContendedResult
) -> list[str]:
    """The figures on which tenure is not ahead of a peer (empty: ahead on all)."""
    behind = []
    if mine_solo.cycles_per_second <= theirs_solo.cycles_per_second:
        behind.append("solo cycles/s")
    if mine_solo.acquire_p50_ms >= theirs_solo.acquire_p50_ms:
        behind.append("solo acquire p50")
    if mine.throughput <= theirs.throughput:
        behind.append("acq/s")
    for label, name in (
        ("wait p50", "wait_p50_ms"),
        ("wait p99", "wait_p99_ms"),
        ("wait max", "wait_max_ms"),
    ):
        if getattr(mine, name) >= getattr(theirs, name):
            behind.append(label)
    if mine.fairness < theirs.fairness:
        behind.append("fairness")
    return behind


def targets(scenarios: dict[str, Scenario]) -> list[Target]:
    """The issue's targets, judged on this run's figures."""
    found: list[Target] = []
    for scenario in scenarios.values():
        mine_solo, mine = (
            scenario.solo_of(REDLOCK_REFERENCE),
            scenario.contended_of(REDLOCK_REFERENCE),
        )
        for peer in PEERS:
            theirs_solo, theirs = scenario.solo_of(peer), scenario.contended_of(peer)
            if None in (mine_solo, mine, theirs_solo, theirs):
                continue
            assert mine_solo and mine and theirs_solo and theirs
            behind = _ahead(mine_solo, mine, theirs_solo, theirs)
            found.append(
                Target(
                    f"ahead of {peer} on every figure ({_SCENARIO_TITLE[scenario.name]})",
                    "behind on " + ", ".join(behind) if behind else "ahead on all 8",
                    not behind,
                )
            )
    well, slow = scenarios.get("well"), scenarios.get("slow")
    if well and slow:
        for key in (REDLOCK_REFERENCE, *PEERS):
            before, after = well.solo_of(key), slow.solo_of(key)
            if before is None or after is None:
                continue
            change = after.acquire_p50_ms / before.acquire_p50_ms - 1
            moved = f"{before.acquire_p50_ms:.2f} → {after.acquire_p50_ms:.2f} ms ({change:+.0%})"
            if key == REDLOCK_REFERENCE:
                found.append(
                    Target(
                        "slow master: tenure's acquire p50 unchanged within 10%",
                        moved,
                        change <= 0.10,
                    )
                )
            else:
                found.append(
                    Target(
                        f"slow master: {key}'s acquire p50 (for comparison)",
                        moved,
                        None,
                    )
                )
    return found


_SCENARIO_TITLE = {"well": "all masters well", "slow": "one master slow"}


def _met(met: bool | None) -> str:
    return "—" if met is None else "yes" if met else "**no**"


def _label(key: str) -> str:
    return redlock_by_key(key).label


def _table(scenario: Scenario) -> str:
    rows = [
        "| lock | solo cycles/s | solo acquire p50 | acq/s | wait p50 | wait p99 | wait max "
        "| fairness | lost updates |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for solo in scenario.solo:
        c = scenario.contended_of(solo.key)
        contended = (
            f"{c.throughput:,.0f} | {c.wait_p50_ms:.2f} ms | {c.wait_p99_ms:.1f} ms "
            f"| {c.wait_max_ms:,.0f} ms | {c.fairness:.2f} | {c.lost_updates}"
            if c
            else "— | — | — | — | — | —"
        )
        rows.append(
            f"| {_label(solo.key)} | {solo.cycles_per_second:,.0f} "
            f"| {solo.acquire_p50_ms:.2f} ms | {contended} |"
        )
    return "\n".join(rows)


def _ratios(scenario: Scenario) -> str:
    mine_solo = scenario.solo_of(REDLOCK_REFERENCE)
    mine = scenario.contended_of(REDLOCK_REFERENCE)
    if mine_solo is None or mine is None:
        return ""
    rows = [
        "tenure's advantage on each figure (above 1.00: tenure ahead; rates are tenure's over "
        "the peer's, times the peer's over tenure's):",
        "",
        "| tenure vs | solo cycles/s | solo acquire | acq/s | wait p50 | wait p99 | wait max |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for peer in PEERS:
        theirs_solo, theirs = scenario.solo_of(peer), scenario.contended_of(peer)
        if theirs_solo is None or theirs is None:
            continue
        rows.append(
            f"| {peer} | {ratio(mine_solo.cycles_per_second, theirs_solo.cycles_per_second)} "
            f"| {ratio(theirs_solo.acquire_p50_ms, mine_solo.acquire_p50_ms)} "
            f"| {ratio(mine.throughput, theirs.throughput)} "
            f"| {ratio(theirs.wait_p50_ms, mine.wait_p50_ms)} "
            f"| {ratio(theirs.wait_p99_ms, mine.wait_p99_ms)} "
            f"| {ratio(theirs.wait_max_ms, mine.wait_max_ms)} |"
        )
    return "\n".join(rows)


def render(info: dict[str, Any], scenarios: dict[str, Scenario], found: list[Target]) -> str:
    """The ``redlock`` section of docs/benchmarks.md."""
    parts = [
        "## Redlock: one lock over three independent masters",
        "",
        f"`{info['command']}` — {info['date']}, {info['nproc']} CPUs (load {info['load']}), "
        f"{info['python']}, three {info['server']} servers on loopback "
        f"(PING {info['rtt_us']:.0f} µs); "
        + ", ".join(f"{k} {v}" for k, v in info["packages"].items())
        + ".",
        "",
        f"Solo: one process, acquire + release, {info['solo_seconds']:g} s per contender over "
        f"{info['solo_runs']} interleaved runs (medians). Contended: {info['processes']} "
        f"processes, each holding the lock {info['critical_ms']:g} ms around a racy increment, "
        f"{info['seconds']:g} s per run, {info['rounds']} interleaved rounds (medians). "
        f'"One master slow": every reply of one master comes {info["slow_ms"]:g} ms late '
        "(a fault proxy in a process of its own).",
    ]
    for scenario in scenarios.values():
        parts += ["", f"### {_SCENARIO_TITLE[scenario.name].capitalize()}", "", _table(scenario)]
        ratios = _ratios(scenario)
        if ratios:
            parts += ["", ratios]
    parts += ["", "### Targets", "", "| target | this run | met |", "|---|---|---|"]
    parts += [f"| {t.what} | {t.figures} | {_met(t.met)} |" for t in found]
    parts += [
        "",
        "How they wait: tenure waits in a line kept on every master and ordered by a ticket, "
        "woken by the release (no polling); pottery retries after a random sleep of up to "
        "200 ms; aioredlock's `lock()` tries three times, 0.1-0.3 s apart, and is called again "
        "until the deadline. All three take a quorum of 2 and set aside 1% of the lease + 2 ms "
        "for clock drift; tenure and pottery return as soon as a quorum answered, aioredlock "
        "waits for every master.",
    ]
    return "\n".join(parts) + "\n"


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    contenders = _check(args)
    for url in args.url:
        check_empty(url, args.allow_flush)
    what = f"masters well, then one slow; {several(len(contenders), 'contender')}"
    estimate = estimated_seconds(args)
    return run_timed("redlock", estimate, what, lambda: run(args, command, contenders))


def run(
    args: argparse.Namespace, command: Sequence[str], contenders: list[RedlockContender]
) -> None:
    """Measure both scenarios, print the report and write what was asked."""
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    scenarios: dict[str, Scenario] = {}
    with contextlib.ExitStack() as stack:
        if args.url:
            urls = list(args.url)
        else:
            urls = [
                stack.enter_context(ServerProcess(name=f"bench-master{i}")).url for i in range(3)
            ]
        with redis.Redis.from_url(urls[0]) as first:
            server, rtt_us = server_version(first), round_trip_us(first, 300)
        progress(f"masters: {server} at {', '.join(urls)}, PING {rtt_us:.0f} us")
        for name in SCENARIOS:
            masters = list(urls)
            if name == "slow":
                masters[-1] = stack.enter_context(
                    slow_proxy(_address(urls[-1]), args.slow_ms / 1000)
                )
            progress(f"{_SCENARIO_TITLE[name]}:")
            scenario = scenarios[name] = Scenario(name)
            scenario.solo = measure_solo(contenders, masters, args)
            scenario.contended = measure_contended(contenders, masters, urls[0], args)
    found = targets(scenarios)
    info = {
        "command": shlex.join(command),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count() or 0,
        "load": load,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "server": server,
        "rtt_us": rtt_us,
        "packages": package_versions(_PACKAGES),
        "seconds": args.seconds,
        "solo_seconds": args.solo_seconds,
        "solo_runs": args.solo_runs,
        "rounds": args.rounds,
        "processes": args.processes,
        "critical_ms": args.critical_ms,
        "slow_ms": args.slow_ms,
    }
    text = render(info, scenarios, found)
    print(text, flush=True)
    if args.output:
        write_section(Path(args.output), "redlock", text)
        progress(f"wrote {args.output}")
    if args.json:
        data = {
            "info": info,
            "scenarios": {
                name: {
                    "solo": [asdict(s) for s in scenario.solo],
                    "contended": [
                        {k: v for k, v in asdict(c).items() if k != "waits_ms"}
                        for c in scenario.contended
                    ],
                }
                for name, scenario in scenarios.items()
            },
            "targets": [asdict(t) for t in found],
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        progress(f"wrote {args.json}")
