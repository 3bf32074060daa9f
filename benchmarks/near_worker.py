"""A writer or a reader of one near-cached key (tests/test_near_history.py, bench caches --near).

    python -m benchmarks.near_worker writer URL SECONDS EVERY_MS OUT
    python -m benchmarks.near_worker reader URL SECONDS STALENESS OUT [MIN_READS [CHURN]]

The writer replaces the key ``history`` of cache ``near-history`` with
versions 1, 2, 3... every EVERY_MS milliseconds, until the file OUT.stop
appears (or SECONDS pass), and writes ``version start end`` per write to
OUT (monotonic seconds: one clock for every process of the machine). A
reader reads it through a near cache (``max_staleness`` = STALENESS) as fast
as it can, and writes ``start end version near`` per read
that found one (near: 1 if it was answered from memory), for SECONDS and
until it has MIN_READS reads (three times SECONDS at most); every CHURN
seconds (0: never) it makes a near cache of a new name, which hands the
tracking over to a new connection. Errors (the server out of reach during a
fault) are counted, printed at the end, and read on.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.sentinel

from tenure import Cache, NearCache, TenureError

KEY = "history"
NAME = "near-history"
RECONNECT_EVERY = 0.02
"""Seconds between two reconnections of a Sentinel client (see the module docstring)."""


class _Client:
    """The worker's client of URL, and its reconnections when it is a Sentinel client's."""

    def __init__(self, url: str, timeout: float) -> None:
        self.sentinel = url.startswith("sentinel://")
        if self.sentinel:
            parts = urlsplit(url)
            sentinel: Any = cast("Callable[..., Any]", redis.sentinel.Sentinel)(
                [(parts.hostname or "127.0.0.1", parts.port or 26379)], socket_timeout=timeout
            )
            self.redis: redis.Redis = sentinel.master_for(
                parts.path.strip("/"), socket_timeout=timeout, socket_connect_timeout=timeout
            )
        else:
            self.redis = redis.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout
            )
        self._reconnected = time.monotonic()

    def tick(self) -> None:
        """A Sentinel client closes its connections every RECONNECT_EVERY seconds."""
        if self.sentinel and time.monotonic() - self._reconnected >= RECONNECT_EVERY:
            self.redis.connection_pool.disconnect()
            self._reconnected = time.monotonic()


def writer(url: str, seconds: float, every_ms: float, out: str) -> None:
    """Write increasing versions, recording when each write began and ended."""
    client = _Client(url, 1.0)
    cache = Cache(client.redis, NAME)
    lines: list[str] = []
    version = 0
    errors = 0
    end = time.monotonic() + seconds
    stop, pause, paused = Path(out + ".stop"), Path(out + ".pause"), Path(out + ".paused")
    while time.monotonic() < end and not stop.exists():
        if pause.exists():
            paused.touch()  # (said after the check: no write of this process follows it)
            time.sleep(0.001)
            continue
        paused.unlink(missing_ok=True)
        client.tick()
        version += 1
        began = time.monotonic()
        try:
            cache.set(KEY, version)
        except TenureError:
            errors += 1  # not known to have landed: recorded as begun, never ended
            lines.append(f"{version} {began} inf")
            time.sleep(every_ms / 1000)
            continue
        lines.append(f"{version} {began} {time.monotonic()}")
        time.sleep(every_ms / 1000)
    with open(out, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
    print(f"writes {version} errors {errors}")


def reader(
    url: str, seconds: float, staleness: float, out: str, least: int = 0, churn: float = 0.0
) -> None:
    """Read through a near cache, recording when each read began and ended, and what it got."""
    client = _Client(url, 0.5)
    cache = Cache(client.redis, NAME, near=NearCache(max_staleness=staleness))
    lines: list[str] = []
    errors = near = 0
    started = time.monotonic()
    made: list[Cache] = []  # the caches of new names (kept: each stays tracked)
    while True:
        client.tick()  # (before the read begins: a reconnection's close is not timed)
        began = time.monotonic()
        if churn and began - started >= churn * (len(made) + 1):
            made.append(Cache(client.redis, f"{NAME}-new{len(made)}", near=True))
        if began - started >= seconds and (len(lines) >= least or began - started >= 3 * seconds):
            break
        before = cache.statistics().near_hits
        try:
            version = cache.get(KEY)
        except TenureError:
            errors += 1
            time.sleep(0.01)
            continue
        if version is not None:
            was_near = cache.statistics().near_hits - before
            lines.append(f"{began} {time.monotonic()} {version} {was_near}")
    near = cache.statistics().near_hits
    with open(out, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
    print(f"reads {len(lines)} near {near} errors {errors}")


@dataclass
class History:
    """A run's reads checked against its writes (:func:`judge`)."""

    reads: int = 0
    near: int = 0
    """Reads answered from memory."""
    violations: list[str] = field(default_factory=list)
    late: list[tuple[float, float]] = field(default_factory=list)
    """(when a read began, how long before its version had been replaced), for every
    read of a replaced version: the staleness the bound limits."""


def judge(writes: Path, reads: Sequence[Path], staleness: float) -> History:
    """Check every read of ``reads`` files against the ``writes`` file.

    A violation: a read that returned a version whose successor had finished
    writing more than ``staleness`` seconds before the read began (the
    bound), or a version not yet begun when the read ended.
    """
    began: dict[int, float] = {}
    ended: dict[int, float] = {}
    for line in writes.read_text().splitlines():
        written, start, end = line.split()
        began[int(written)], ended[int(written)] = float(start), float(end)
    history = History()
    for path in reads:
        for line in path.read_text().splitlines():
            start, end, got, was_near = line.split()
            read_began, read_ended, version = float(start), float(end), int(got)
            history.reads += 1
            history.near += int(was_near) > 0
            if began.get(version, math.inf) > read_ended:
                history.violations.append(
                    f"read at {read_began:.4f} got {version}, not yet written"
                )
            replaced = ended.get(version + 1, math.inf)  # when its successor surely landed
            if replaced < read_began:
                history.late.append((read_began, read_began - replaced))
                if replaced < read_began - staleness:
                    history.violations.append(
                        f"read at {read_began:.4f} got {version}, "
                        f"replaced {read_began - replaced:.4f}s before"
                    )
    return history


if __name__ == "__main__":
    role, url, seconds, setting, out = sys.argv[1:6]
    if role == "writer":
        writer(url, float(seconds), float(setting), out)
    else:
        least, churn = (
            (int(sys.argv[6]) if sys.argv[6:] else 0),
            float(sys.argv[7]) if sys.argv[7:] else 0.0,
        )
        reader(url, float(seconds), float(setting), out, least, churn)
