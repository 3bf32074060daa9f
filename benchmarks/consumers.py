"""``tenure bench consumers``: StreamConsumer.run beside a bare consumer-group loop.

    tenure bench consumers [--messages 50000] [--rounds 3] [--processes 1,4]
        [--count 100] [--url URL] [--output FILE.md]

The ceiling of a stream consumer is the bare loop every Redis guide shows:
``XREADGROUP COUNT n`` and one ``XACK`` of the batch, nothing else. Each
round fills a fresh stream with ``--messages`` entries, then N processes
(each ``--processes`` count) drain it through one group, with a no-op
handler: the bare loop on redis-py, ``StreamConsumer.run``, the bare loop on
``redis.asyncio`` and ``AsyncStreamConsumer.run``, in turn, the order of the
contenders changing every round. Messages per second from the moment every
process is connected and ready until the stream is drained and nothing is
pending; medians of the rounds. Each twin is judged against the bare loop of
its own API (target 0.8x). Also reported: tenure's server time per message
(``INFO commandstats``) beside the bare loop's. A table is printed;
``--output`` writes the ``consumers`` section of a Markdown file.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import multiprocessing
import platform
import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from benchmarks import (
    BenchmarkError,
    add_output_arguments,
    check_empty,
    progress,
    run_timed,
    several,
)
from benchmarks.sections import write_section
from tenure import AsyncStreamConsumer, StreamConsumer, StreamMessage
from tenure._tools.children import sigint_blocked, start_helper
from tenure.server._process import given_or_private

__all__ = ["add_arguments", "estimated_seconds", "run_command"]

TARGET = 0.8
"""Each consumer's messages/s against the bare loop of its own API."""

CONTENDERS = ("bare", "run", "abare", "arun")
LABELS = {
    "bare": "bare loop, redis-py (XREADGROUP + one XACK a batch)",
    "run": "tenure `StreamConsumer.run`",
    "abare": "bare loop, redis.asyncio",
    "arun": "tenure `AsyncStreamConsumer.run`",
}
BASELINE = {"run": "bare", "arun": "abare"}

IDLE_READS = 2
"""Empty reads after which a consumer takes the stream as drained (it reads with no wait)."""

WORKER_PATIENCE = 120.0
START_SECONDS = 0.6  # the interpreter, the private server, the report
ROUND_SECONDS = 0.05  # a contender's run: the processes' pool, the group, the checks
SPAWN_SECONDS = 0.45  # per consuming process: spawn, imports, connect
FILL_RATE = 100_000.0  # messages/s into a fresh stream (pipelines of 1,000 XADDs)
DRAIN_RATE = 200_000.0  # messages/s consumed, one process or several (the server's share)
"""Seconds a round waits for its processes before it is called hung."""


def _drain_bare(url: str, stream: str, name: str, count: int) -> int:
    client = redis.Redis.from_url(url)
    got = idle = 0
    while idle < IDLE_READS:
        reply: Any = client.xreadgroup("g", name, {stream: ">"}, count=count)
        if not reply:
            idle += 1
            continue
        ids = [entry_id for entry_id, _ in reply[0][1]]
        client.xack(stream, "g", *ids)
        got += len(ids)
    client.close()
    return got


def _drain_run(url: str, stream: str, name: str, count: int) -> int:
    client = redis.Redis.from_url(url)
    consumer = StreamConsumer(client, stream, "g", name, count=count, block=0)
    drained = _Drained(consumer)
    read = consumer._acked_then_read  # what run reads with
    consumer._acked_then_read = lambda done: drained.seen(read(done))  # type: ignore[method-assign]
    got = consumer.run(_no_op)
    client.close()
    return got


class _Drained:
    """Stops a consumer once its reads came back empty :data:`IDLE_READS` times."""

    def __init__(self, consumer: StreamConsumer | AsyncStreamConsumer) -> None:
        self.consumer = consumer
        self.idle = 0

    def seen(self, batch: list[StreamMessage]) -> list[StreamMessage]:
        if not batch:
            self.idle += 1
            if self.idle >= IDLE_READS:
                self.consumer.stop()
        return batch


async def _adrain_bare(url: str, stream: str, name: str, count: int) -> int:
    client = redis.asyncio.Redis.from_url(url)
    got = idle = 0
    while idle < IDLE_READS:
        reply: Any = await client.xreadgroup("g", name, {stream: ">"}, count=count)
        if not reply:
            idle += 1
            continue
        ids = [entry_id for entry_id, _ in reply[0][1]]
        await client.xack(stream, "g", *ids)
        got += len(ids)
    await client.aclose()
    return got


async def _adrain_run(url: str, stream: str, name: str, count: int) -> int:
    client = redis.asyncio.Redis.from_url(url)
    consumer = AsyncStreamConsumer(client, stream, "g", name, count=count, block=0)
    drained = _Drained(consumer)
    read = consumer._acked_then_read  # what run reads with

    async def read_until_drained(done: list[StreamMessage]) -> list[StreamMessage]:
        return drained.seen(await read(done))

    consumer._acked_then_read = read_until_drained  # type: ignore[method-assign]
    got = await consumer.run(_no_op)
    await client.aclose()
    return got


def _no_op(message: StreamMessage) -> None:
    """The handler: nothing, so the figures are the consumers' own."""


def _worker(
    kind: str, url: str, stream: str, name: str, count: int, ready: Any, go: Any, results: Any
) -> None:
    """One consuming process: connect, say ready, wait for the start, drain; put its count."""
    start_helper()
    ping = redis.Redis.from_url(url)
    ping.ping()
    ping.close()
    ready.release()
    go.wait()
    if kind == "bare":
        got = _drain_bare(url, stream, name, count)
    elif kind == "run":
        got = _drain_run(url, stream, name, count)
    else:
        drain = _adrain_bare if kind == "abare" else _adrain_run
        got = asyncio.run(drain(url, stream, name, count))
    results.put(got)


def _fill(client: redis.Redis, stream: str, messages: int) -> None:
    client.delete(stream)
    pipe = client.pipeline(transaction=False)
    for n in range(messages):
        pipe.xadd(stream, {"n": n})
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()
    client.xgroup_create(stream, "g", "0")


def _server_us(client: redis.Redis) -> float:
    """The server's total µs in commands so far (``INFO commandstats``)."""
    stats: Any = client.info("commandstats")
    return sum(float(entry.get("usec", 0)) for entry in stats.values())


def _round(
    url: str, kind: str, processes: int, messages: int, count: int, tag: str
) -> tuple[float, float]:
    """One contender drains a fresh stream: (messages/s, server µs per message)."""
    client = redis.Redis.from_url(url)
    stream = f"bench:consumers:{tag}"
    _fill(client, stream, messages)
    context = multiprocessing.get_context("spawn")
    ready, go, results = context.Semaphore(0), context.Event(), context.Queue()
    workers = [
        context.Process(
            target=_worker,
            args=(kind, url, stream, f"c{index}", count, ready, go, results),
            daemon=True,
        )
        for index in range(processes)
    ]
    try:
        with sigint_blocked():
            for worker in workers:
                worker.start()
        for _ in workers:
            if not ready.acquire(timeout=WORKER_PATIENCE):
                raise BenchmarkError(f"a {kind} consumer process did not start")
        before = _server_us(client)
        began = time.perf_counter()
        go.set()
        total = sum(results.get(timeout=WORKER_PATIENCE) for _ in workers)
        elapsed = time.perf_counter() - began
        spent = _server_us(client) - before
    except Exception as exc:
        if isinstance(exc, BenchmarkError):
            raise
        raise BenchmarkError(f"the {kind} consumers failed or hung: {exc!r}") from exc
    finally:
        for worker in workers:
            worker.join(5)
            if worker.is_alive():
                worker.kill()
    pending: Any = client.xpending(stream, "g")
    client.delete(stream)
    client.close()
    if total != messages or int(pending["pending"]):
        raise BenchmarkError(
            f"{kind}: {total:,} of {messages:,} messages consumed, {pending['pending']} pending"
        )
    return messages / elapsed, spent / messages


def measure(
    url: str, messages: int, rounds: int, processes: Sequence[int], count: int,
    progress: Callable[[str], None],
) -> dict[tuple[str, int], tuple[float, float]]:  # fmt: skip
    """Medians of ``rounds`` interleaved rounds: (processes, contender) -> (msg/s, server µs)."""
    samples: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for round_ in range(rounds):
        for procs in processes:
            order = CONTENDERS if round_ % 2 == 0 else tuple(reversed(CONTENDERS))
            for kind in order:
                rate, server = _round(url, kind, procs, messages, count, f"{round_}:{kind}")
                samples.setdefault((kind, procs), []).append((rate, server))
                progress(f"round {round_ + 1}/{rounds}, {procs} process(es), {kind}: {rate:,.0f}/s")
    return {
        key: (statistics.median(r for r, _ in got), statistics.median(s for _, s in got))
        for key, got in samples.items()
    }


def render(
    results: dict[tuple[str, int], tuple[float, float]],
    processes: Sequence[int],
    server: str,
    messages: int,
    rounds: int,
    count: int,
    command: str,
) -> str:
    """The Markdown section."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Stream consumers: tenure vs a bare consumer-group loop",
        "",
        f"Generated by `{command}` on {stamp}; do not edit: re-run it.",
        f"Server: {server}; Python {platform.python_version()}; {messages:,} messages a "
        f"round, `count={count}`, a no-op handler; medians of {rounds} interleaved rounds.",
        "",
        "| processes | consumer | messages/s | server µs per message | against its bare loop |",
        "|---:|---|---:|---:|---:|",
    ]
    for procs in processes:
        for kind in CONTENDERS:
            rate, server_us = results[(kind, procs)]
            base = BASELINE.get(kind)
            against = f"{rate / results[(base, procs)][0]:.2f}" if base else "1.00"
            lines.append(
                f"| {procs} | {LABELS[kind]} | {rate:,.0f} | {server_us:.2f} | {against} |"
            )
    lines += [
        "",
        "Both tenure consumers make one round trip a batch: the XACK of the batch",
        "handled and the next XREADGROUP in one pipeline (a heartbeat call only for a",
        "batch that takes a third of `claim_idle`, a look for dead consumers' messages",
        "every quarter of it). What",
        "they add is on the client: each entry made a `StreamMessage`, the handler",
        "called. A consumer killed mid-batch leaves at most its batch in hand to be",
        "delivered again ([guarantees](guarantees.md)).",
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--messages", type=int, default=50_000, help="messages a round (50000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, median taken (3)")
    parser.add_argument(
        "--processes", default="1,4", help="comma-separated consumer process counts (1,4)"
    )
    parser.add_argument("--count", type=int, default=100, help="messages a read (100)")
    add_output_arguments(parser, output, None)


def _process_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or not all(1 <= count <= 64 for count in counts):
        raise BenchmarkError(f"--processes takes comma-separated counts in 1..64 (got {text!r})")
    return counts


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    if not 100 <= args.messages <= 10_000_000:
        raise BenchmarkError(f"--messages must be in 100..10000000 (got {args.messages})")
    if not 1 <= args.rounds <= 50 or not 1 <= args.count <= 10_000:
        raise BenchmarkError("--rounds must be in 1..50 and --count in 1..10000")
    processes = _process_counts(args.processes)
    if args.url:
        check_empty(args.url, args.allow_flush)

    def run() -> None:
        with given_or_private(args.url, name="bench-consumers") as (url, server):
            where = (
                url
                if server is None
                else f"{server.engine.name} {server.engine.version} (private, loopback)"
            )
            results = measure(url, args.messages, args.rounds, processes, args.count, progress)
        report(args, command, processes, results, where)

    what = (
        f"{several(len(CONTENDERS), 'consumer')} x {several(len(processes), 'process count')}, "
        f"{several(args.rounds, 'round')} of {several(args.messages, 'message')}"
    )
    return run_timed("consumers", estimated_seconds(args), what, run)


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long a run with ``args`` (checked) takes: a stream filled and drained a run."""
    messages = int(args.messages)
    runs = [
        ROUND_SECONDS + procs * SPAWN_SECONDS + messages / FILL_RATE + messages / DRAIN_RATE
        for procs in _process_counts(args.processes)
    ]
    return START_SECONDS + int(args.rounds) * len(CONTENDERS) * sum(runs)


def report(
    args: argparse.Namespace, command: Sequence[str], processes: Sequence[int],
    results: dict[tuple[str, int], tuple[float, float]], where: str,
) -> None:  # fmt: skip
    """Print the table and the targets; write the report if asked."""
    print(f"{'procs':>5}  {'consumer':<52}{'msg/s':>10}{'server us':>11}{'vs bare':>9}")
    for procs in processes:
        for kind in CONTENDERS:
            rate, server_us = results[(kind, procs)]
            base = BASELINE.get(kind)
            against = rate / results[(base, procs)][0] if base else 1.0
            print(f"{procs:>5}  {LABELS[kind]:<52}{rate:>10,.0f}{server_us:>11.2f}{against:>9.2f}")
    print("\ntargets:")
    for procs in processes:
        for kind, base in BASELINE.items():
            against = results[(kind, procs)][0] / results[(base, procs)][0]
            verdict = "met" if against >= TARGET else "NOT MET"
            print(
                f"  [{verdict}] {LABELS[kind]}, {procs} process(es): >= {TARGET}x "
                f"{LABELS[base]}: {against:.2f}x"
            )
    if args.output:
        text = render(
            results, processes, where, args.messages, args.rounds, args.count,
            shlex.join(command),
        )  # fmt: skip
        write_section(Path(args.output), "consumers", text)
        progress(f"wrote {args.output}")
