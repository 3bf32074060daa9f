"""``tenure bench caches --near``: near caching's hits, how soon a write is seen, its memory.

    tenure bench caches --near [--rounds 3] [--url URL] [--output FILE.md]

In one process, against one server: a warm ``Cache.get`` and
``HerdCache.fetch`` with ``near=True``, beside a bare redis-py ``GET`` +
``json.loads`` of the same value, and redis-py's own client-side caching
(``cache_config``, RESP3) + ``json.loads`` where this redis-py has it: calls
per second, medians of the rounds, each ratio to the bare GET in the same
round (target: a near hit >= 20x). Then how soon a write by another process
is seen by a reader that reads every 100 µs (p50 / p99 / max over 200
writes; target p99 <= 1 ms on loopback), and the memory an entry takes
(tracemalloc, 10,000 entries of a small dict).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import platform
import shlex
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

import tenure
from benchmarks import BenchmarkError, progress, run_timed, several
from benchmarks.sections import write_section
from tenure.server._process import given_or_private

__all__ = ["run_near"]

TARGET_HIT = 20.0
TARGET_SEEN_MS = 1.0
VALUE = {"price": 990, "currency": "EUR", "stock": 12}
WRITES = 200
ENTRIES = 10_000
SECONDS = 0.5  # per loop and round


def run_near(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with the caches benchmark's ``args`` (its --rounds, --url, --output)."""
    if not 1 <= args.rounds <= 20:
        raise BenchmarkError("--rounds must be in 1..20")
    estimate = 3.0 + args.rounds * 4 * SECONDS + WRITES * 0.01 + 2.0

    def run() -> None:
        with given_or_private(args.url, name="bench-near") as (url, server):
            where = (
                url
                if server is None
                else f"{server.engine.name} {server.engine.version} (private, loopback)"
            )
            rates = _hits(url, args.rounds)
            seen = _seen(url)
            per_entry = _memory(url)
        text = _render(rates, seen, per_entry, args, command, where)
        print(text.split("\n\n", 2)[-1], flush=True)
        if args.output:
            write_section(Path(args.output), "near", text)
            progress(f"wrote {args.output}")

    what = f"4 loops, {several(args.rounds, 'round')}, {WRITES} writes seen"
    return run_timed("caches --near", estimate, what, run)


def _rate(call: Callable[[], object]) -> float:
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
        loops["redis-py cache_config GET + json.loads"] = lambda: json.loads(
            cached.get("bench-near-cached") or b""
        )
    _warm(near, herd)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    try:
        for number in range(1, rounds + 1):
            for name, call in loops.items():
                rates[name].append(_rate(call))
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


def _redis_py_cached(url: str) -> redis.Redis | None:
    """redis-py's client-side caching (RESP3), where this redis-py and server have it."""
    try:
        from redis.cache import CacheConfig
    except ImportError:
        NOT_COMPARED.append("redis-py's `cache_config`: this redis-py has none")
        return None
    client = redis.Redis.from_url(url, protocol=3, cache_config=CacheConfig())
    try:
        client.ping()
    except redis.ConnectionError as exc:  # it refuses servers before Redis 7.4 (Valkey 8 too)
        NOT_COMPARED.append(f"redis-py's `cache_config`: {exc}")
        client.close()
        return None
    return client


def _ratio(rates: dict[str, list[float]], name: str) -> float:
    bare = rates["bare GET + json.loads"]
    return float(statistics.median(a / b for a, b in zip(rates[name], bare, strict=False)))


def _writer(url: str, count: int, ready: Any) -> None:
    client = redis.Redis.from_url(url)
    cache = tenure.Cache(client, "bench-near-seen")
    ready.wait(30)
    for _ in range(count):
        cache.set("k", time.monotonic())
        time.sleep(0.01)
    cache.set("k", -1.0)
    client.close()


def _seen(url: str) -> list[float]:
    """Milliseconds from each write (in another process) to its being read here."""
    client = redis.Redis.from_url(url)
    cache = tenure.Cache(client, "bench-near-seen", near=True)
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


def _render(
    rates: dict[str, list[float]],
    seen: list[float],
    per_entry: float,
    args: argparse.Namespace,
    command: Sequence[str],
    where: str,
) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Near caching",
        "",
        f"Generated by `{shlex.join(command)}` on {now}; do not edit: re-run it. {where}, "
        f"Python {platform.python_version()}, {args.rounds} rounds of {SECONDS:g} s per loop, "
        "one process.",
        "",
        f"| loop | calls/s | vs bare GET + json.loads (target near >= {TARGET_HIT:g}x) |",
        "|---|---:|---:|",
    ]
    for name, values in rates.items():
        ratio = _ratio(rates, name)
        mark = " (NOT MET)" if "near" in name and ratio < TARGET_HIT else ""
        lines.append(f"| {name} | {statistics.median(values):,.0f} | {ratio:.1f}x{mark} |")
    ordered = sorted(seen)
    if ordered:
        p50 = ordered[len(ordered) // 2]
        p99 = ordered[min(len(ordered) - 1, round(len(ordered) * 0.99))]
        mark = "" if p99 <= TARGET_SEEN_MS else " (NOT MET)"
        lines += [
            "",
            f"A write by another process, seen by a reader that reads every 100 µs: "
            f"{len(ordered)} writes, p50 {p50:.3f} ms, p99 {p99:.3f} ms{mark}, max "
            f"{ordered[-1]:.3f} ms (target p99 <= {TARGET_SEEN_MS:g} ms).",
        ]
    lines += ["", f"Memory per near entry (a small dict): {per_entry:,.0f} bytes."]
    for why in NOT_COMPARED:
        lines += ["", f"Not compared: {why}."]
    return "\n".join(lines) + "\n"
