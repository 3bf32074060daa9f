"""The lock benchmark's resource parts as Markdown, terminal lines and targets.

The bounded pool and single connection (:mod:`benchmarks.pool`), the many
waiters of one process (:mod:`benchmarks.waiters`) and the memory per
lock name (:mod:`benchmarks.names`); :mod:`benchmarks.report` puts
them into the ``locks`` section and its targets table.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.contenders import by_key
from benchmarks.names import NamesResult
from benchmarks.pool import (
    POOL_CYCLES,
    POOL_HOLD_MS,
    POOL_SIZE,
    POOL_THREADS,
    POOL_TIMEOUT,
    PoolResult,
    SingleResult,
)
from benchmarks.waiters import CrowdResult
from tenure._tooling import IDLE_TTL

__all__ = [
    "MAX_EXTRA_CONNECTIONS",
    "POOL_RATIO",
    "names_section",
    "pool_section",
    "resource_lines",
    "resource_targets",
    "waiters_section",
]

POOL_RATIO = 2.0  # tenure's bounded-pool time at most this times redis-py's
MAX_EXTRA_CONNECTIONS = 2  # connections waiting may add, however many wait

Goal = tuple[str, str, str, "bool | None"]  # (goal, lock key, measured, met)


def _mb(value: int | None) -> str:
    return "—" if value is None else f"{value / 1e6:.1f}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


# -- targets ----------------------------------------------------------------------


def resource_targets(
    pool: Sequence[PoolResult],
    crowds: Sequence[CrowdResult],
    names: Sequence[NamesResult],
    *,
    peer: str,
    tenure_keys: Sequence[str],
) -> list[Goal]:
    """The goals of the bounded pool, the many waiters and the memory per name."""
    found: list[Goal] = []
    theirs = next((r for r in pool if r.key == peer), None)
    for result in pool:
        if result.key not in tenure_keys:
            continue
        goal = f"bounded pool: time <= {POOL_RATIO:g}x redis-py's, 0 errors"
        if theirs is None:
            found.append((goal, result.key, f"{result.median:.3f} s, redis-py not run", None))
            continue
        ratio = result.median / theirs.median if theirs.median > 0 else float("inf")
        measured = (
            f"{result.median:.3f} s vs {theirs.median:.3f} s: {ratio:.2f}x; {result.errors} errors"
        )
        found.append((goal, result.key, measured, ratio <= POOL_RATIO and result.errors == 0))
    for crowd in crowds:
        goal = (
            f"{crowd.waiters:,} waiting {crowd.kind}: <= {MAX_EXTRA_CONNECTIONS} extra "
            "connections, every waiter served"
        )
        measured = (
            f"{crowd.extra} extra ({crowd.subscribers} pub/sub); {crowd.handoffs:,} handoffs, "
            f"{crowd.errors} errors, {crowd.overlaps} overlaps"
        )
        met = crowd.extra <= MAX_EXTRA_CONNECTIONS and crowd.errors == 0 and crowd.overlaps == 0
        found.append((goal, "tenure", measured, met))
    for used in names:
        if used.key not in tenure_keys:
            continue
        goal = f"{used.names:,} names used once: 0 keys after the idle time"
        if used.keys_idle is None:
            measured = f"{used.keys_after:,} keys right after; the idle wait was skipped"
            found.append((goal, used.key, measured, None))
            continue
        measured = (
            f"{used.keys_after:,} keys right after, {used.keys_idle:,} after "
            f"{used.idle_waited or 0:.0f} s"
        )
        if used.zero_after is not None:
            measured += f" (0 at {used.zero_after:.0f} s)"
        found.append((goal, used.key, measured, used.keys_idle == 0 and used.errors == 0))
    return found


# -- Markdown -----------------------------------------------------------------------


def pool_section(
    pool: Sequence[PoolResult], single: Sequence[SingleResult], tries: int, rounds: int
) -> str:
    """The bounded-pool and single-connection tables."""
    if not pool and not single:
        return ""
    reference = next((r for r in pool if r.key == "tenure"), None)
    lines = [
        "## Few connections: a bounded pool, a single connection",
        "",
        f"{POOL_THREADS} threads share one `redis.Redis` over "
        f"`redis.BlockingConnectionPool(max_connections={POOL_SIZE}, timeout={POOL_TIMEOUT:g})`; "
        f"each runs {POOL_CYCLES} cycles of acquire → hold {POOL_HOLD_MS:g} ms → release on "
        f"one lock name, each thread with its own lock object. Time = from a common start "
        f"to the last thread done, median of up to {rounds} rounds (interleaved; a lock "
        "whose round had errors is not run again). Errors = exceptions plus acquires that "
        "gave up (10 s bound). A lock whose waiters block on pooled connections (`BLPOP`) "
        "can leave its holder none to release with.",
        "",
        "| Lock | seconds (median) | rounds s | cycles done | errors | first error "
        "| row / tenure |",
        "|---|---:|---|---:|---:|---|---:|",
    ]
    for r in pool:
        rounds_text = ", ".join(f"{x:.3f}" for x in r.runs)
        ratio = (
            "—"
            if reference is None or reference.median <= 0
            else f"{r.median / reference.median:.2f}"
        )
        error = "" if r.first_error is None else f"`{r.first_error}`"
        lines.append(
            f"| {by_key(r.key).label} | {r.median:.3f} | {rounds_text} | {r.cycles} "
            f"| {r.errors} | {error} | {ratio} |"
        )
    if single:
        lines += [
            "",
            "### Release → waiter holding it, on one `single_connection_client=True` client",
            "",
            "A holder thread and a waiter thread share one client made with "
            "`single_connection_client=True` (one connection, used by one command at a "
            "time). The holder releases while the waiter waits; latency = from calling "
            f"release to the waiter's acquire returning, median of {tries} tries, the "
            "release coming 0.1 to 0.2 s after the waiter started (spread over the tries, "
            "so a lock that polls every 0.1 s is not caught at one phase). The first "
            "failed try ends a lock's tries.",
            "",
            "| Lock | latency ms (median) | tries ms | errors | first error |",
            "|---|---:|---|---:|---|",
        ]
        for s in single:
            median = "—" if s.median_ms is None else f"{s.median_ms:.2f}"
            tries_text = ", ".join(f"{x:.2f}" for x in s.latencies_ms) or "—"
            error = "" if s.first_error is None else f"`{s.first_error}`"
            lines.append(
                f"| {by_key(s.key).label} | {median} | {tries_text} | {s.errors} | {error} |"
            )
    return "\n".join(lines) + "\n"


def waiters_section(crowds: Sequence[CrowdResult]) -> str:
    """The many-waiters table."""
    if not crowds:
        return ""
    lines = [
        "## Many waiters in one process",
        "",
        "One process queues its waiters on one tenure lock (`Lock(timeout=10)` / "
        "`AsyncLock(timeout=10)`, one object each) while a holder keeps it: asyncio tasks "
        "share one `redis.asyncio.Redis`, threads one `redis.Redis`, each over a "
        "`BlockingConnectionPool` of the size shown. Once the server's queue holds them "
        "all, `CLIENT LIST` is read (largest of 3 readings): extra = connections while "
        "waiting - connections before - the pool's own. Then the holder releases and "
        "each waiter in turn takes the lock and releases it at once; handoff = from a "
        "release being called to the next holder's acquire returning.",
        "",
        "| Waiters | pool | queued | connections before | while waiting | pool's "
        "| pub/sub | extra | handoff p50 ms | p99 ms | max ms | all handed on in s "
        "| errors | overlaps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in crowds:
        lines.append(
            f"| {c.waiters:,} {c.kind} | {c.pool_size} | {c.queued:,} | {c.before} "
            f"| {c.while_waiting} | {c.pool_connections} | {c.subscribers} | {c.extra} "
            f"| {c.handoff_p50_ms:.2f} | {c.handoff_p99_ms:.2f} | {c.handoff_max_ms:.1f} "
            f"| {c.chain_seconds:.2f} | {c.errors} | {c.overlaps} |"
        )
    errors = [c for c in crowds if c.first_error]
    for c in errors:
        lines.append(f"\n{c.kind}: first error `{c.first_error}`.")
    return "\n".join(lines) + "\n"


def names_section(names: Sequence[NamesResult], idle_cap: float | None) -> str:
    """The memory-per-name table."""
    if not names:
        return ""
    first = names[0]
    where = (
        "this process"
        if first.processes == 0
        else f"{first.processes} processes of {first.concurrency} asyncio tasks each"
    )
    wait = (
        "The idle wait was skipped in this run."
        if idle_cap is None
        else f"Then `DBSIZE` is polled every second, up to {idle_cap:g} s, until it is 0."
    )
    lines = [
        "## Memory per lock name",
        "",
        f"{first.names:,} distinct lock names, each acquired and released once (10 s "
        f"lease), driven from {where} (`tenure.AsyncLock`, redis-py's asyncio "
        "`Lock`), after `FLUSHDB`. Keys and `used_memory` are read right after the "
        f"last release. tenure keeps a released name's marker (one hash: its last "
        f"fencing token and release receipt) for `IDLE_TTL` = {IDLE_TTL:g} s of "
        f"idleness (so tokens keep growing when a name is re-used soon, and a resent "
        f"release is recognised); the run itself takes long enough that the first "
        f"names' markers may already be gone when it ends. {wait} "
        "Bytes per key left = (`used_memory` right after - `used_memory` before) / keys "
        "right after.",
        "",
        "| Lock | names/s | keys right after | MB right after | bytes per key left "
        "| waited s | keys after the wait | MB after the wait | keys 0 after s "
        "| peak keys | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in names:
        per_key = "—" if r.bytes_per_key is None else f"{r.bytes_per_key:,.0f}"
        keys_idle = "—" if r.keys_idle is None else f"{r.keys_idle:,}"
        lines.append(
            f"| {by_key(r.key).label} | {r.rate:,.0f} | {r.keys_after:,} | {_mb(r.used_after)} "
            f"| {per_key} | {_seconds(r.idle_waited)} | {keys_idle} | {_mb(r.used_idle)} "
            f"| {_seconds(r.zero_after)} | {r.keys_peak:,} | {r.errors} |"
        )
    lines += [
        "",
        f"`used_memory` before each run: {', '.join(f'{_mb(r.used_before)} MB' for r in names)}. "
        "A lock with no key left after the wait costs nothing for a name not in use; "
        "`waited` and `keys 0 after` count from the end of the run.",
    ]
    return "\n".join(lines) + "\n"


# -- terminal -----------------------------------------------------------------------


def resource_lines(
    pool: Sequence[PoolResult],
    single: Sequence[SingleResult],
    crowds: Sequence[CrowdResult],
    names: Sequence[NamesResult],
) -> list[str]:
    """The resource parts as terminal lines, each part after a blank line."""
    lines: list[str] = []
    if pool or single:
        lines += [
            "",
            f"bounded pool ({POOL_THREADS} threads, {POOL_SIZE} connections, "
            f"{POOL_CYCLES} x {POOL_HOLD_MS:g} ms) and single-connection release -> waiter:",
        ]
        latency = {s.key: s for s in single}
        for r in pool:
            s = latency.get(r.key)
            single_text = ""
            if s is not None:
                median = "-" if s.median_ms is None else f"{s.median_ms:.2f} ms"
                single_text = f"   single conn {median:>9} ({s.errors} errors)"
            lines.append(f"  {r.key:<18}{r.median:>8.3f} s  {r.errors:>3} errors{single_text}")
    if crowds:
        lines += ["", "many waiters in one process:"]
        for c in crowds:
            lines.append(
                f"  {c.waiters:>5} {c.kind:<8} pool {c.pool_size}: {c.extra} extra connection(s) "
                f"({c.subscribers} pub/sub), handoff p50 {c.handoff_p50_ms:.2f} ms "
                f"p99 {c.handoff_p99_ms:.2f} ms, {c.errors} errors"
            )
    if names:
        lines += ["", "memory per name:"]
        for n in names:
            idle = "wait skipped"
            if n.keys_idle is not None:
                idle = (
                    f"{n.keys_idle:,} keys, {_mb(n.used_idle)} MB after {n.idle_waited or 0:.0f} s"
                )
            lines.append(
                f"  {n.key:<10}{n.names:>10,} names: {n.keys_after:,} keys, "
                f"{_mb(n.used_after)} MB right after; {idle}; {n.errors} errors"
            )
    return lines
