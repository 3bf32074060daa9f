"""``tenure bench caches --near``: near caching's hits, how soon a write is seen, its memory.

    tenure bench caches --near [--rounds 3] [--url URL] [--output FILE.md]

In one process, against one server: a warm ``Cache.get`` and
``HerdCache.fetch`` with ``near=True``, beside a bare redis-py ``GET`` +
``json.loads`` of the same value, and redis-py's own client-side caching
(``cache_config``, RESP3) + ``json.loads`` where this redis-py has it: calls
per second, medians of the rounds, each ratio to the bare GET in the same
round (target: a near hit >= 20x). Then how soon a write by another process
is seen by a reader that reads every 100 µs (p50 and p99 of each round's
500 writes, medians of the rounds, and the worst; target p99 <= 1 ms on
loopback), and the memory an entry takes
(tracemalloc, 10,000 entries of a small dict). Last, the bound under the
fault proxy's faults: a writer process replaces a key every 3 ms while a
reader process reads it through a proxy that adds latency, goes silent,
resets connections and delays replies one way; each read is checked against
the writes (:mod:`benchmarks.near_worker`), and the worst staleness seen in
each phase is reported beside ``max_staleness``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

import tenure
from benchmarks import ROOT, BenchmarkError, progress, run_timed, several
from benchmarks.near_worker import judge
from benchmarks.sections import write_section
from tenure.server import FaultProxy
from tenure.server._process import given_or_private

__all__ = ["calls_per_second", "generated", "run_near"]

TARGET_HIT = 20.0
TARGET_SEEN_MS = 1.0
VALUE = {"price": 990, "currency": "EUR", "stock": 12}
WRITES = 500
WRITE_EVERY = 0.005  # seconds between two writes seen
ENTRIES = 10_000
SECONDS = 0.5  # per loop and round


def run_near(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with the caches benchmark's ``args`` (its --rounds, --url, --output)."""
    if not 1 <= args.rounds <= 20:
        raise BenchmarkError("--rounds must be in 1..20")
    estimate = (
        3.0 + args.rounds * (4 * SECONDS + 2 * (WRITES * WRITE_EVERY + 1.0)) + FAULTS_SECONDS + 6.0
    )

    def run() -> None:
        with given_or_private(args.url, name="bench-near") as (url, server):
            where = (
                url
                if server is None
                else f"{server.engine.name} {server.engine.version} (private, loopback)"
            )
            rates = _hits(url, args.rounds)
            seen: dict[str, list[list[float]]] = {"near": [], "server": []}
            for number in range(1, args.rounds + 1):
                seen["near"].append(_seen(url))
                seen["server"].append(_seen(url, near=False))
                progress(f"round {number}/{args.rounds}: writes seen")
            per_entry = _memory(url)
            bound = _bound_under_faults(url)
        text = _render(rates, seen, per_entry, args, command, where) + _render_bound(bound)
        print(text.split("\n\n", 2)[-1], flush=True)
        if args.output:
            write_section(Path(args.output), "near", text)
            progress(f"wrote {args.output}")

    what = f"4 loops, {several(args.rounds, 'round')}, {WRITES} writes seen a round"
    return run_timed("caches --near", estimate, what, run)


def calls_per_second(call: Callable[[], object]) -> float:
    """How many times a second ``call`` runs, over :data:`SECONDS`."""
    calls = 0
    began = time.perf_counter()
    end = began + SECONDS
    while time.perf_counter() < end:
        call()
        calls += 1
    return calls / (time.perf_counter() - began)


def _hits(url: str, rounds: int) -> dict[str, list[float]]:
    """Calls per second of each loop, each round."""
    client = redis.Redis.from_url(url)
    near = tenure.Cache(client, "bench-near", near=True)
    herd = tenure.HerdCache(client, "bench-near-herd", ttl=3600, near=True)
    near.set("k", VALUE)
    client.set("bench-near-bare", json.dumps(VALUE))
    herd.fetch("k", lambda: VALUE)
    loops: dict[str, Callable[[], object]] = {
        "bare GET + json.loads": lambda: json.loads(client.get("bench-near-bare") or b""),
        "Cache.get, near": lambda: near.get("k"),
        "HerdCache.fetch, near": lambda: herd.fetch("k", dict),
    }
    cached = _redis_py_cached(url)
    if cached is not None:
        cached.set("bench-near-cached", json.dumps(VALUE))
        loops[CACHE_CONFIG] = lambda: json.loads(cached.get("bench-near-cached") or b"")
    _warm(near, herd)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    try:
        for number in range(1, rounds + 1):
            for name, call in loops.items():
                rates[name].append(calls_per_second(call))
            for name, rate in _async_hits(url).items():
                rates.setdefault(name, []).append(rate)
            progress(f"round {number}/{rounds}: near hit {_ratio(rates, 'Cache.get, near'):.1f}x")
    finally:
        client.close()
        if cached is not None:
            cached.close()
    return rates


def _warm(near: tenure.Cache, herd: tenure.HerdCache) -> None:
    """Until both answer from memory (their tracking connection up, the first reads kept)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        before = near.statistics().near_hits + herd.statistics().near_hits
        near.get("k")
        herd.fetch("k", dict)
        if near.statistics().near_hits + herd.statistics().near_hits == before + 2:
            return
        time.sleep(0.01)
    raise BenchmarkError("the near caches never answered from memory")


NOT_COMPARED: list[str] = []
"""Why a peer was left out of this run (shown under the table)."""


CACHE_CONFIG = "redis-py cache_config GET + json.loads"
"""The loop of redis-py's client-side caching (its label names a check set aside)."""


def _redis_py_cached(url: str) -> redis.Redis | None:
    """redis-py's client-side caching (RESP3), where this redis-py has it.

    redis-py refuses servers other than Redis 7.4 or later by their name and
    version (Valkey 8.1 and Debian's Redis 7.0 here). Valkey 8.1 has the same
    client-side caching (``CLIENT TRACKING``) as Redis 7.2-7.4, so on a refusal
    the check is set aside in this benchmark's process only, and the row says so.
    """
    global CACHE_CONFIG
    try:
        from redis.cache import CacheConfig
        from redis.connection import CacheProxyConnection
    except ImportError:
        NOT_COMPARED.append("redis-py's `cache_config`: this redis-py has none")
        return None
    client = redis.Redis.from_url(url, protocol=3, cache_config=CacheConfig())
    try:
        client.ping()
        return client
    except redis.ConnectionError as exc:  # it refuses servers before Redis 7.4, and Valkey
        refusal = str(exc)
        client.close()
    checked = (CacheProxyConnection.DEFAULT_SERVER_NAME, CacheProxyConnection.MIN_ALLOWED_VERSION)
    setting: Any = CacheProxyConnection  # (class attributes of redis-py's, in this process)
    with redis.Redis.from_url(url) as plain:
        setting.DEFAULT_SERVER_NAME = plain.info("server").get("server_name", "redis")
    setting.MIN_ALLOWED_VERSION = "7.0.0"
    client = redis.Redis.from_url(url, protocol=3, cache_config=CacheConfig())
    try:
        client.ping()
    except redis.ConnectionError as exc:
        NOT_COMPARED.append(f"redis-py's `cache_config`: {refusal}; with it set aside: {exc}")
        client.close()
        setting.DEFAULT_SERVER_NAME, setting.MIN_ALLOWED_VERSION = checked
        return None
    CACHE_CONFIG += " (its Redis 7.4 check set aside)"
    NOT_COMPARED.append(
        f"redis-py's `cache_config` as it ships: it refuses this server ({refusal}); "
        "the row above sets that check aside in this process"
    )
    return client


ASYNC_BARE = "asyncio bare GET + json.loads"


def _ratio(rates: dict[str, list[float]], name: str) -> float:
    """The median over rounds of ``name``'s rate over its bare loop's (same API) in its round."""
    bare = rates[ASYNC_BARE if name.startswith("asyncio") else "bare GET + json.loads"]
    return float(statistics.median(a / b for a, b in zip(rates[name], bare, strict=False)))


def _async_hits(url: str) -> dict[str, float]:
    """One round of the asyncio loops: tenure's near hit, and cashews' client-side mode."""
    import redis.asyncio

    async def measure() -> dict[str, float]:
        client = redis.asyncio.Redis.from_url(url)
        near = tenure.AsyncCache(client, "bench-near", near=True)
        await client.set("bench-near-bare", json.dumps(VALUE))
        loops: dict[str, Callable[[], Any]] = {
            ASYNC_BARE: lambda: client.get("bench-near-bare"),
            "asyncio AsyncCache.get, near": lambda: near.get("k"),
        }
        peer = await _cashews(url)
        if peer is not None:
            await peer.set("k", VALUE)
            loops["asyncio cashews client_side get"] = lambda: peer.get("k")
        rates = {}
        try:
            for name, call in loops.items():
                for _ in range(50):  # warm: tracked, kept near
                    await call()
                    await asyncio.sleep(0.001)
                calls = 0
                began = time.perf_counter()
                while time.perf_counter() - began < SECONDS:
                    found = await call()
                    if name == ASYNC_BARE:
                        json.loads(found or b"")
                    calls += 1
                rates[name] = calls / (time.perf_counter() - began)
        finally:
            await client.aclose()
            if peer is not None:
                await peer.close()
        return rates

    return asyncio.run(measure())


async def _cashews(url: str) -> Any:
    """The peer cashews in its client-side mode (asyncio, BCAST tracking), if installed."""
    try:
        from cashews import Cache
    except ImportError:
        NOT_COMPARED.append("cashews' client-side mode: cashews is not installed")
        return None
    peer = Cache()
    peer.setup(url, client_side=True)
    await peer.init()
    return peer


def _writer(url: str, count: int, ready: Any) -> None:
    client = redis.Redis.from_url(url)
    cache = tenure.Cache(client, "bench-near-seen")
    ready.wait(30)
    for _ in range(count):
        cache.set("k", time.monotonic())
        time.sleep(WRITE_EVERY)
    cache.set("k", -1.0)
    client.close()


def _seen(url: str, near: bool = True) -> list[float]:
    """Milliseconds from each write (in another process) to its being read here.

    ``near`` False: the same reader without a near cache, each read a round
    trip: the floor of this machine for a reader of the server.
    """
    client = redis.Redis.from_url(url)
    cache = tenure.Cache(client, "bench-near-seen", near=near)
    cache.set("k", 0.0)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    writer = context.Process(target=_writer, args=(url, WRITES, ready), daemon=True)
    writer.start()
    delays = []
    last = 0.0
    try:
        time.sleep(0.2)
        ready.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            value = cache.get("k")
            if value == -1.0:
                break
            if isinstance(value, float) and value != last:
                last = value
                delays.append((time.monotonic() - value) * 1000)
            time.sleep(0.0001)  # a service that reads often, not one that spins
    finally:
        writer.join(30)
        client.close()
    return delays


def _memory(url: str) -> float:
    """Bytes of memory per near entry (tracemalloc, :data:`ENTRIES` small entries)."""
    client = redis.Redis.from_url(url)
    cache = tenure.Cache(client, "bench-near-memory", near=tenure.NearCache(max_entries=ENTRIES))
    cache.set_many({f"k{n}": VALUE for n in range(ENTRIES)})
    time.sleep(0.2)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(ENTRIES):
            cache.get(f"k{n}")
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        client.close()
    held = cache._store.near
    kept = len(held.entries) if held is not None else 0
    return (after - before) / max(kept, 1)


STALENESS = 0.1
"""The reader's ``max_staleness`` under the faults (the default)."""
PHASES = (
    ("quiet", 0.6, lambda proxy: proxy.clear()),
    ("latency 30 ms (slower than the pings)", 0.6, lambda proxy: proxy.set_latency(0.03)),
    ("quiet again", 0.4, lambda proxy: proxy.clear()),
    ("blackhole (no announcement, no answer)", 0.6, lambda proxy: proxy.blackhole()),
    ("connections reset", 0.5, lambda proxy: (proxy.clear(), proxy.reset_connections())),
    ("replies 200 ms late, one way", 0.6, lambda proxy: proxy.set_latency(0.2, "downstream")),
    ("quiet at last", 0.5, lambda proxy: proxy.clear()),
)
FAULTS_SECONDS = sum(seconds for _, seconds, _ in PHASES)


def _bound_under_faults(url: str) -> list[tuple[str, int, int, float, int]]:
    """Per phase: (phase, reads, near reads, worst staleness in ms, violations)."""
    parts = urllib.parse.urlsplit(url)
    who = parts.netloc.rpartition("@")[0]
    with tempfile.TemporaryDirectory(prefix="tenure-bench-near-") as folder:
        writes, reads = Path(folder) / "writes", Path(folder) / "reads"
        with FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
            through = parts._replace(netloc=f"{who}{'@' if who else ''}{proxy.host}:{proxy.port}")
            writer = _worker("writer", url, 4 * FAULTS_SECONDS, 3.0, writes)
            reader = _worker("reader", through.geturl(), FAULTS_SECONDS + 1.2, STALENESS, reads)
            starts: list[float] = []

            def faults() -> None:
                time.sleep(1.0)  # the reader started (Python, imports), connected, tracking
                for _, seconds, fault in PHASES:
                    starts.append(time.monotonic())
                    fault(proxy)
                    time.sleep(seconds)
                proxy.clear()

            thread = threading.Thread(target=faults, daemon=True)
            thread.start()
            said = reader.communicate(timeout=FAULTS_SECONDS + 60)[0]
            thread.join(30)
            writes.with_name("writes.stop").touch()
            writer.communicate(timeout=60)
            if reader.returncode or writer.returncode:
                raise BenchmarkError(f"the near history's processes failed: {said.strip()}")
        history = judge(writes, [reads], STALENESS)
        lines = [line.split() for line in reads.read_text().splitlines()]
    progress(f"bound under faults: {history.reads:,} reads, {len(history.violations)} violations")
    ends = [*starts[1:], float("inf")]
    phases = []
    for (name, _, _), start, end in zip(PHASES, starts, ends, strict=True):
        mine = [line for line in lines if start <= float(line[0]) < end]
        late = [ms for began, ms in history.late if start <= began < end]
        worst = 1000 * max(late, default=0.0)
        broken = sum(1 for ms in late if ms > STALENESS)
        phases.append((name, len(mine), sum(int(line[3]) > 0 for line in mine), worst, broken))
    return phases


def _worker(role: str, url: str, seconds: float, setting: float, out: Path) -> Any:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.near_worker",
            role,
            url,
            *map(str, (seconds, setting, out)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,  # where python -m finds the benchmarks package
    )


def _render_bound(phases: list[tuple[str, int, int, float, int]]) -> str:
    lines = [
        "",
        f"The bound under the fault proxy's faults (`max_staleness` {1000 * STALENESS:g} ms): "
        "a writer process replaces a key every 3 ms; a reader process reads it through the "
        "proxy; staleness is how long before a read began its version had been replaced.",
        "",
        "| phase | reads | from memory | worst staleness | reads past the bound |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, reads, near, worst, broken in phases:
        lines.append(f"| {name} | {reads:,} | {near:,} | {worst:.1f} ms | {broken} |")
    return "\n".join(lines) + "\n"


def generated(command: Sequence[str], where: str, rounds: int, more: str) -> str:
    """A report's line saying how, when and where it was measured."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Generated by `{shlex.join(command)}` on {now}; do not edit: re-run it. {where}, "
        f"Python {platform.python_version()}, {rounds} rounds of {SECONDS:g} s per loop, {more}"
    )


def _render(
    rates: dict[str, list[float]],
    seen: dict[str, list[list[float]]],
    per_entry: float,
    args: argparse.Namespace,
    command: Sequence[str],
    where: str,
) -> str:
    lines = [
        "# Near caching",
        "",
        generated(command, where, args.rounds, "one process."),
        "",
        f"| loop | calls/s | vs its API's bare GET + json.loads (target near >= {TARGET_HIT:g}x) |",
        "|---|---:|---:|",
    ]
    for name, values in rates.items():
        ratio = _ratio(rates, name)
        mark = " (NOT MET)" if name.endswith("near") and ratio < TARGET_HIT else ""
        lines.append(f"| {name} | {statistics.median(values):,.0f} | {ratio:.1f}x{mark} |")
    lines += [
        "",
        "A write by another process, seen by a reader that reads every 100 µs; per round "
        f"{WRITES} writes; p50 and p99 of each round, medians of the rounds (and each "
        "round's p99), and the worst. The reader without a near cache reads the server "
        "each time: the floor of this machine for a reader that asks the server.",
        "",
        f"| reader | p50 | p99 (target <= {TARGET_SEEN_MS:g} ms with near) | rounds' p99 | worst |",
        "|---|---:|---:|---|---:|",
    ]
    for name, label in (("near", "near cache"), ("server", "no near cache (a GET each time)")):
        rounds = [sorted(delays) for delays in seen[name] if delays]
        if not rounds:
            continue
        p50 = statistics.median(o[len(o) // 2] for o in rounds)
        p99s = [o[min(len(o) - 1, round(len(o) * 0.99))] for o in rounds]
        p99 = statistics.median(p99s)
        mark = " (NOT MET)" if name == "near" and p99 > TARGET_SEEN_MS else ""
        lines.append(
            f"| {label} | {p50:.3f} ms | {p99:.3f} ms{mark} | "
            f"{', '.join(f'{x:.2f}' for x in p99s)} | {max(o[-1] for o in rounds):.2f} ms |"
        )
    lines += ["", f"Memory per near entry (a small dict): {per_entry:,.0f} bytes."]
    for why in NOT_COMPARED:
        lines += ["", f"Not compared: {why}."]
    return "\n".join(lines) + "\n"
