"""A writer or a reader of one near-cached key, for tests/test_near_history.py.

    python -m tests.near_worker writer URL SECONDS EVERY_MS OUT
    python -m tests.near_worker reader URL SECONDS STALENESS OUT [MIN_READS]

The writer replaces the key ``history`` of cache ``near-history`` with
versions 1, 2, 3... every EVERY_MS milliseconds, until the file OUT.stop
appears (or SECONDS pass), and writes ``version start end`` per write to
OUT (monotonic seconds: one clock for every process of the machine). A
reader reads it through a near cache (``max_staleness`` = STALENESS) as fast
as it can, and writes ``start end version near`` per read
that found one (near: 1 if it was answered from memory), for SECONDS and
until it has MIN_READS reads (three times SECONDS at most). Errors (the
server out of reach during a fault) are counted, printed at the end, and
read on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import redis

from tenure import Cache, NearCache, TenureError

KEY = "history"
NAME = "near-history"


def writer(url: str, seconds: float, every_ms: float, out: str) -> None:
    """Write increasing versions, recording when each write began and ended."""
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    cache = Cache(client, NAME)
    lines: list[str] = []
    version = 0
    errors = 0
    end = time.monotonic() + seconds
    stop = Path(out + ".stop")
    while time.monotonic() < end and not stop.exists():
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


def reader(url: str, seconds: float, staleness: float, out: str, least: int = 0) -> None:
    """Read through a near cache, recording when each read began and ended, and what it got."""
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    cache = Cache(client, NAME, near=NearCache(max_staleness=staleness))
    lines: list[str] = []
    errors = near = 0
    started = time.monotonic()
    while True:
        began = time.monotonic()
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


if __name__ == "__main__":
    role, url, seconds, setting, out = sys.argv[1:6]
    if role == "writer":
        writer(url, float(seconds), float(setting), out)
    else:
        reader(url, float(seconds), float(setting), out, int(sys.argv[6]) if sys.argv[6:] else 0)
