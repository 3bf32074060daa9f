"""``tenure bench caches --batch``: a page of cached entries read at once.

    tenure bench caches --batch [--rounds 3] [--url URL] [--output FILE.md]

In one process, against one server: ``get_many`` of 100 warm entries (a
small dict each) on ``Cache`` and ``HerdCache``, sync and asyncio, with and
without ``near=``, beside one redis-py ``MGET`` + ``json.loads`` of the same
values in the same round: milliseconds per batch, medians of the rounds, and
each one's ratio to MGET in its round (target: ``HerdCache.get_many`` within
1.5x). The server's commands per batch (``INFO commandstats``) are counted
once, outside the timed loops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

import tenure
from benchmarks import BenchmarkError, progress, run_timed, several
from benchmarks.near import SECONDS, calls_per_second, generated
from benchmarks.sections import write_section
from tenure.server._process import given_or_private

__all__ = ["run_batch"]

TARGET = 1.5
SIZE = 100
VALUE = {"price": 990, "currency": "EUR", "stock": 12}
BASE = "MGET + json.loads"
ASYNC_BASE = "asyncio MGET + json.loads"


def run_batch(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with the caches benchmark's ``args`` (its --rounds, --url, --output)."""
    if not 1 <= args.rounds <= 20:
        raise BenchmarkError("--rounds must be in 1..20")
    estimate = 3.0 + args.rounds * 10 * SECONDS

    def run() -> None:
        with given_or_private(args.url, name="bench-batch") as (url, server):
            where = (
                url
                if server is None
                else f"{server.engine.name} {server.engine.version} (private, loopback)"
            )
            commands = _commands_per_batch(url)
            rates = _rates(url, args.rounds)
        text = _render(rates, commands, args, command, where)
        print(text.split("\n\n", 2)[-1], flush=True)
        if args.output:
            write_section(Path(args.output), "batch", text)
            progress(f"wrote {args.output}")

    return run_timed("caches --batch", estimate, f"10 loops, {several(args.rounds, 'round')}", run)


KEYS = [f"k{n}" for n in range(SIZE)]


def _fill(client: redis.Redis) -> dict[str, Any]:
    """The caches (their entries written and warm) and the bare keys, on ``client``."""
    plain = tenure.Cache(client, "bench-batch")
    herd = tenure.HerdCache(client, "bench-batch-herd", ttl=3600)
    near_plain = tenure.Cache(client, "bench-batch", near=True)
    near_herd = tenure.HerdCache(client, "bench-batch-herd", ttl=3600, near=True)
    plain.set_many(dict.fromkeys(KEYS, VALUE))
    herd.set_many(dict.fromkeys(KEYS, VALUE))
    client.mset({f"bench-batch-bare:{key}": json.dumps(VALUE) for key in KEYS})
    herd.get(KEYS[0])  # a script call: the server's clock learnt
    near_herd.get(KEYS[0])
    return {"plain": plain, "herd": herd, "near plain": near_plain, "near herd": near_herd}


BARE = [f"bench-batch-bare:{key}" for key in KEYS]


def _check(values: object) -> None:
    if values != [VALUE] * SIZE:
        raise BenchmarkError("a batch read came back wrong")


async def _async_rate(call: Callable[[], Awaitable[object]]) -> float:
    calls = 0
    began = time.perf_counter()
    end = began + SECONDS
    while time.perf_counter() < end:
        await call()
        calls += 1
    return calls / (time.perf_counter() - began)


def _rates(url: str, rounds: int) -> dict[str, list[float]]:
    """Batches per second of each loop, each round."""
    client = redis.Redis.from_url(url)
    caches = _fill(client)
    loops: dict[str, Callable[[], object]] = {
        BASE: lambda: [json.loads(v or b"") for v in client.mget(BARE)],
        "Cache.get_many": lambda: caches["plain"].get_many(KEYS),
        "HerdCache.get_many": lambda: caches["herd"].get_many(KEYS),
        "Cache.get_many, near": lambda: caches["near plain"].get_many(KEYS),
        "HerdCache.get_many, near": lambda: caches["near herd"].get_many(KEYS),
    }
    for call in loops.values():
        _check(call())
    _warm_near(caches)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    rates.update({ASYNC_BASE: [], "asyncio HerdCache.get_many": [], "asyncio Cache.get_many": []})
    try:
        for number in range(1, rounds + 1):
            for name, call in loops.items():
                rates[name].append(calls_per_second(call))
            for name, rate in asyncio.run(_async_round(url)).items():
                rates[name].append(rate)
            progress(
                f"round {number}/{rounds}: HerdCache.get_many "
                f"{_ratio(rates, 'HerdCache.get_many'):.2f}x MGET's time"
            )
    finally:
        client.close()
    return rates


def _warm_near(caches: dict[str, Any]) -> None:
    """Until both near caches answer every key from memory."""
    deadline = time.monotonic() + 10
    for name in ("near plain", "near herd"):
        cache = caches[name]
        while True:
            before = cache.statistics().near_hits
            cache.get_many(KEYS)
            if cache.statistics().near_hits == before + SIZE:
                break
            if time.monotonic() > deadline:
                raise BenchmarkError("the near caches never answered from memory")
            time.sleep(0.01)


async def _async_round(url: str) -> dict[str, float]:
    client = redis.asyncio.Redis.from_url(url)
    try:
        herd = tenure.AsyncHerdCache(client, "bench-batch-herd", ttl=3600)
        plain = tenure.AsyncCache(client, "bench-batch")
        await herd.get(KEYS[0])  # the server's clock learnt

        async def bare() -> list[Any]:
            return [json.loads(v or b"") for v in await client.mget(BARE)]

        loops: dict[str, Callable[[], Awaitable[Any]]] = {
            ASYNC_BASE: bare,
            "asyncio HerdCache.get_many": lambda: herd.get_many(KEYS),
            "asyncio Cache.get_many": lambda: plain.get_many(KEYS),
        }
        rates = {}
        for name, call in loops.items():
            _check(await call())
            rates[name] = await _async_rate(call)
        return rates
    finally:
        await client.aclose()


def _commands_per_batch(url: str) -> dict[str, dict[str, float]]:
    """The server's commands (INFO commandstats) per warm batch of each cache."""
    client = redis.Redis.from_url(url)
    caches = _fill(client)
    _warm_near(caches)
    found: dict[str, dict[str, float]] = {}
    try:
        for name, cache in (
            ("Cache.get_many", caches["plain"]),
            ("HerdCache.get_many", caches["herd"]),
            ("Cache.get_many, near", caches["near plain"]),
            ("HerdCache.get_many, near", caches["near herd"]),
        ):
            client.config_resetstat()
            for _ in range(10):
                cache.get_many(KEYS)
            stats = client.info("commandstats")
            found[name] = {
                command.removeprefix("cmdstat_"): int(each["calls"]) / 10
                for command, each in stats.items()
                if not command.startswith(("cmdstat_config", "cmdstat_info", "cmdstat_ping"))
            }
    finally:
        client.close()
    return found


def _ratio(rates: dict[str, list[float]], name: str) -> float:
    """The median over rounds of (time per batch) / (MGET's in the same round)."""
    base = rates[ASYNC_BASE if name.startswith("asyncio") else BASE]
    return float(statistics.median(b / a for a, b in zip(rates[name], base, strict=False)))


def _render(
    rates: dict[str, list[float]],
    commands: dict[str, dict[str, float]],
    args: argparse.Namespace,
    command: Sequence[str],
    where: str,
) -> str:
    lines = [
        "# Batch reads",
        "",
        generated(command, where, args.rounds, f"one process; {SIZE} warm entries per batch."),
        "",
        f"| batch of {SIZE} | ms per batch | time vs MGET + json.loads "
        f"(target HerdCache <= {TARGET:g}x) | server commands per batch |",
        "|---|---:|---:|---|",
    ]
    for name, values in rates.items():
        ratio = _ratio(rates, name)
        mark = " (NOT MET)" if name.endswith("HerdCache.get_many") and ratio > TARGET else ""
        sent = ", ".join(f"{c} {n:g}" for c, n in sorted(commands.get(name, {}).items()))
        if name in commands and not sent:
            sent = "none"
        lines.append(
            f"| {name} | {1000 / statistics.median(values):.3f} | {ratio:.2f}x{mark} | {sent} |"
        )
    return "\n".join(lines) + "\n"
