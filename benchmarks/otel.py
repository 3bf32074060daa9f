"""``tenure bench otel``: what reporting through OpenTelemetry costs the fast paths.

    tenure bench otel [--rounds 7] [--seconds 1] [--url URL] [--output FILE.md]

With the OpenTelemetry SDK installed, a meter provider with a reader
attached and a tracer provider set (as a service that exports both would
have), four loops run in this one process: a lock's acquire and release
(``Lock``, uncontended), a warm cache hit (``HerdCache.fetch``), and the
same two on asyncio. Each alternates blocks of ``--seconds`` with recording
on, recording paused (tenure then records nothing, as with no provider
set), and recording "noted" (tenure notes every measurement as usual, but
its thread drops the durations instead of handing them to the SDK: what
tenure's own side costs, the SDK's taken away), a loop's three blocks back
to back in a new order every round;
each ratio is the median over the rounds of calls per second in that mode
over paused. Target: on >= 0.97.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import platform
import random
import shlex
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import redis
import redis.asyncio

import tenure
from benchmarks import (
    BenchmarkError,
    add_output_arguments,
    check_empty,
    progress,
    require_peer,
    run_timed,
    several,
)
from benchmarks.sections import write_section
from tenure._tooling import metrics_paused, metrics_unhanded, telemetry_seam, telemetry_table
from tenure.server._process import given_or_private

__all__ = ["LOOPS", "OTEL_HELP", "add_arguments", "estimated_seconds", "run_command", "run_for"]

TARGET = 0.97
LOOPS = ("lock", "cache hit", "async lock", "async cache hit")
MODES = ("on", "off", "noted")
START_SECONDS = 1.5  # the interpreter, the SDK, the private server, the report


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--rounds", type=int, default=7, help="rounds, median taken (7)")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="seconds per block, on or off (1)"
    )
    add_output_arguments(parser, output, None)


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long a run takes: a block per loop, mode and round."""
    return START_SECONDS + len(LOOPS) * len(MODES) * float(args.rounds) * float(args.seconds)


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    return run_loops(args, command, LOOPS, "otel")


OTEL_HELP = (
    "measure instead what reporting through OpenTelemetry costs {what} (sync and asyncio): "
    "recording on, paused and noted in --rounds rounds of 1 s blocks, as `tenure bench otel` "
    "does for every fast path"
)


def lock_cycle_costs(cycles: int = 20_000) -> tuple[float, float, float]:
    """Microseconds a lock cycle's recording takes: (paused, noted, handed to the SDK).

    What the lock's acquire and release record (a wait and a hold), timed
    ``cycles`` times without a server: with recording paused (the check
    alone), noted (tenure's side: the notes, dropped by the drainer), and
    noted then handed to the SDK at once (tenure's side and the SDK's). For
    the cost breakdown; needs a meter provider set.
    """
    seam = telemetry_seam
    who = seam.subject("Lock", "bench-breakdown")

    def cycle() -> None:
        if (recorder := seam.metrics()) is not None:
            recorder.lock_wait(who, 0.001, telemetry_table.ACQUIRED)
        seam.lock_held(who, time.monotonic())

    def timed(each: Callable[[], None]) -> float:
        began = time.perf_counter()
        for _ in range(cycles):
            each()
        return (time.perf_counter() - began) / cycles * 1e6

    recorder = seam.refresh()
    if recorder is None:
        raise BenchmarkError("no meter provider is set")

    def handed() -> None:
        cycle()
        recorder.flush()

    with metrics_paused():
        off = timed(cycle)
    with metrics_unhanded():
        noted = timed(cycle)
    return off, noted, timed(handed)


def run_for(
    name: str, args: argparse.Namespace, command: Sequence[str], loops: Sequence[str]
) -> int:
    """``--otel`` of benchmark ``name``: these ``loops``, its ``--rounds``, 1 s blocks."""
    given = argparse.Namespace(
        rounds=args.rounds,
        seconds=1.0,
        url=args.url,
        allow_flush=args.allow_flush,
        output=args.output,
    )
    return run_loops(given, command, loops, name)


def run_loops(
    args: argparse.Namespace, command: Sequence[str], loops: Sequence[str], name: str
) -> int:
    """Measure ``loops`` (of :data:`LOOPS`) with ``args`` for benchmark ``name``."""
    if not 1 <= args.rounds <= 50 or not 0.1 <= args.seconds <= 60:
        raise BenchmarkError("--rounds must be in 1..50 and --seconds in [0.1, 60]")
    require_peer("opentelemetry.sdk.metrics", "opentelemetry-sdk")
    if args.url:
        check_empty(args.url, args.allow_flush)

    def run() -> None:
        _set_providers()
        with given_or_private(args.url, name="bench-otel") as (url, server):
            where = (
                url
                if server is None
                else f"{server.engine.name} {server.engine.version} (private, loopback)"
            )
            rates = measure(url, args.rounds, args.seconds, loops)
        costs = lock_cycle_costs() if any("lock" in loop for loop in loops) else None
        text = render(rates, args, command, where, costs)
        print(text.split("\n\n", 2)[-1], flush=True)
        if args.output:
            write_section(Path(args.output), "otel" if name == "otel" else f"otel-{name}", text)
            progress(f"wrote {args.output}")

    what = f"{len(loops)} loops x {len(MODES)} blocks, {several(args.rounds, 'round')}"
    seconds = START_SECONDS + len(loops) * len(MODES) * args.rounds * args.seconds
    return run_timed(name, seconds, what, run)


def _set_providers() -> None:
    """A meter provider with a reader attached, and a tracer provider with a processor."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(tracing)


Rates = dict[str, dict[str, list[float]]]  # loop -> "on"/"off"/"noted" -> calls per second


def measure(url: str, rounds: int, seconds: float, loops: Sequence[str] = LOOPS) -> Rates:
    """Each of ``loops`` in every mode, ``rounds`` times; calls per second of each block."""
    rates: Rates = {loop: {mode: [] for mode in MODES} for loop in loops}
    client = redis.Redis.from_url(url)
    lock = tenure.Lock(client, "bench-otel-lock", timeout=10)
    cache = tenure.HerdCache(client, "bench-otel-cache", ttl=3600)
    cache.fetch("warm", lambda: {"price": 990})
    shuffle = random.Random(7)

    def cycle() -> None:
        lock.acquire()
        lock.release()

    try:
        for number in range(1, rounds + 1):
            # a loop's modes back to back (in a new order), so a drift of the
            # machine's speed falls on the three alike; the loops in a new order too
            order = []
            for loop in shuffle.sample(list(loops), len(loops)):
                order += [(loop, mode) for mode in shuffle.sample(MODES, len(MODES))]
            for loop, mode in order:
                within = {"off": metrics_paused, "noted": metrics_unhanded}.get(mode, nullcontext)
                with within():
                    if loop == "lock":
                        rate = _sync_rate(cycle, seconds)
                    elif loop == "cache hit":
                        rate = _sync_rate(lambda: cache.fetch("warm", dict), seconds)
                    else:
                        rate = asyncio.run(_async_rate(url, loop, seconds))
                rates[loop][mode].append(rate)
            line = ", ".join(f"{loop} {_ratio(rates[loop], number - 1):.3f}" for loop in loops)
            progress(f"round {number}/{rounds}: on/off {line}")
    finally:
        client.close()
    return rates


def _sync_rate(call: Callable[[], object], seconds: float) -> float:
    calls = 0
    began = time.perf_counter()
    end = began + seconds
    while time.perf_counter() < end:
        call()
        calls += 1
    return calls / (time.perf_counter() - began)


async def _async_rate(url: str, loop: str, seconds: float) -> float:
    client = redis.asyncio.Redis.from_url(url)
    try:
        if loop == "async lock":
            lock = tenure.AsyncLock(client, "bench-otel-alock", timeout=10)

            async def call() -> None:
                await lock.acquire()
                await lock.release()
        else:
            cache = tenure.AsyncHerdCache(client, "bench-otel-acache", ttl=3600)

            async def load() -> dict[str, int]:
                return {"price": 990}

            await cache.fetch("warm", load)

            async def call() -> None:
                await cache.fetch("warm", load)

        return await _timed(call, seconds)
    finally:
        await client.aclose()


async def _timed(call: Callable[[], Awaitable[object]], seconds: float) -> float:
    calls = 0
    began = time.perf_counter()
    end = began + seconds
    while time.perf_counter() < end:
        await call()
        calls += 1
    return calls / (time.perf_counter() - began)


def _ratio(rates: dict[str, list[float]], upto: int | None = None, mode: str = "on") -> float:
    """Median over the rounds (up to round ``upto``) of ``mode`` / off, each round its pair."""
    pairs = list(zip(rates[mode], rates["off"], strict=True))
    if upto is not None:
        pairs = pairs[: upto + 1]
    return float(statistics.median(on / off for on, off in pairs))


def render(
    rates: Rates,
    args: argparse.Namespace,
    command: Sequence[str],
    where: str,
    costs: tuple[float, float, float] | None = None,
) -> str:
    """The report section: each loop's calls per second in each mode, and the ratios.

    ``costs``: a lock cycle's recording in microseconds (paused, noted, handed over).
    """
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# What OpenTelemetry costs the fast paths",
        "",
        f"Generated by `{shlex.join(command)}` on {now}; do not edit: re-run it. "
        f"{where}, Python {platform.python_version()}, {args.rounds} rounds of "
        f"{args.seconds:g} s blocks, recording on, paused and noted back to back in a new "
        "order for each loop and round, in one process (a meter provider with a reader "
        "attached and a tracer provider set). Noted: tenure notes every measurement, but "
        "its thread drops the durations instead of handing them to the SDK: tenure's own "
        "cost, the SDK's taken away.",
        "",
        f"| loop | calls/s, recording | calls/s, paused | on / off (target >= {TARGET}) "
        "| noted / off |",
        "|---|---:|---:|---:|---:|",
    ]
    for loop in rates:
        on, off = statistics.median(rates[loop]["on"]), statistics.median(rates[loop]["off"])
        ratio = _ratio(rates[loop])
        verdict = "" if ratio >= TARGET else " (NOT MET)"
        noted = _ratio(rates[loop], mode="noted")
        lines.append(f"| {loop} | {on:,.0f} | {off:,.0f} | {ratio:.3f}{verdict} | {noted:.3f} |")
    if costs is not None:
        off_us, noted_us, handed_us = costs
        cycle_us = 1e6 / statistics.median(rates[next(k for k in rates if "lock" in k)]["off"])
        lines += [
            "",
            "A lock cycle's recording alone, without a server (20,000 cycles, this process): "
            f"{off_us:.2f} µs paused (the check), {noted_us:.2f} µs noted (tenure's side: "
            f"{noted_us - off_us:.2f} µs), {handed_us:.2f} µs noted and handed to the SDK (the "
            f"SDK's side: {handed_us - noted_us:.2f} µs, in tenure's thread), against a lock "
            f"cycle of {cycle_us:.0f} µs paused here: tenure's side is "
            f"{(noted_us - off_us) / cycle_us:.1%} of it, the SDK's "
            f"{(handed_us - noted_us) / cycle_us:.1%}.",
        ]
    return "\n".join(lines) + "\n"
