"""``tenure demo``: a short, real contention run on a server it starts itself.

Several processes increment one counter with a read-modify-write (GET, then
SET): with no lock, with the classic ``SET NX PX`` lock that retries every
millisecond, and with :class:`tenure.Lock`. Without a lock, updates are lost;
with either lock, none are; the columns show what fairness and waiting cost.
Every number printed is measured in this run.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import redis

from tenure._sync._lock import Lock
from tenure._sync._scripting import registry_for

__all__ = ["DemoResult", "run_demo"]

COUNTER_KEY = "tenure:demo:{counter}"
LOCK_KEY = "tenure:demo:{counter}:lock"
MODES = ("no lock", "SET NX + 1 ms retry", "tenure.Lock")


@dataclass
class DemoResult:
    """One row of the demo table: one mode, all workers together."""

    mode: str
    workers: int
    seconds: float
    increments: int
    counter: int
    lost_updates: int
    per_second: float
    wait_p50_ms: float
    wait_p99_ms: float
    wait_max_ms: float
    fairness: float


def _worker(url: str, mode: str, seconds: float, start_at: float, out: Any) -> None:
    """One process: increment the counter until time runs out; report counts and waits."""
    client = redis.Redis.from_url(url)
    registry = registry_for(client)
    token = uuid.uuid4().hex
    lock = Lock(client, "demo", timeout=10)
    increments = 0
    waits: list[float] = []
    while time.time() < start_at:
        time.sleep(0.001)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if mode == "no lock":
            value = int(client.get(COUNTER_KEY) or 0)
            client.set(COUNTER_KEY, value + 1)
            increments += 1
            continue
        began = time.monotonic()
        if mode == "tenure.Lock":
            lock.acquire()
        else:
            while not client.set(LOCK_KEY, token, nx=True, px=10_000):
                time.sleep(0.001)
        waits.append(time.monotonic() - began)
        try:
            value = int(client.get(COUNTER_KEY) or 0)
            client.set(COUNTER_KEY, value + 1)
            increments += 1
        finally:
            if mode == "tenure.Lock":
                lock.release()
            else:
                registry.run("compare_and_delete", (LOCK_KEY,), (token,))
    client.close()
    out.put((increments, waits))


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


def _run_mode(url: str, mode: str, workers: int, seconds: float) -> DemoResult:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with redis.Redis.from_url(url) as client:
        client.delete(COUNTER_KEY, LOCK_KEY)
        start_at = time.time() + 1.0  # let every process import and connect first
        processes = [
            context.Process(target=_worker, args=(url, mode, seconds, start_at, out), daemon=True)
            for _ in range(workers)
        ]
        for process in processes:
            process.start()
        reports = [out.get(timeout=seconds + 60) for _ in processes]
        for process in processes:
            process.join(timeout=10)
        counter = int(client.get(COUNTER_KEY) or 0)
        client.delete(COUNTER_KEY, LOCK_KEY)
    increments = sum(count for count, _ in reports)
    served = [count for count, _ in reports]
    waits = sorted(wait for _, worker_waits in reports for wait in worker_waits)
    return DemoResult(
        mode=mode,
        workers=workers,
        seconds=seconds,
        increments=increments,
        counter=counter,
        lost_updates=increments - counter,
        per_second=increments / seconds,
        wait_p50_ms=1000 * statistics.median(waits) if waits else 0.0,
        wait_p99_ms=1000 * _percentile(waits, 0.99),
        wait_max_ms=1000 * (waits[-1] if waits else 0.0),
        fairness=min(served) / max(served) if max(served) else 0.0,
    )


@contextmanager
def _server_url(url: str | None, out: TextIO) -> Iterator[str]:
    if url:
        yield url
        return
    from tenure.server import ServerProcess

    with ServerProcess(name="tenure-demo") as server:
        pid = server.pid
        print(
            f"started {server.engine.name} {server.engine.version} (pid {pid}) at {server.url}",
            file=out,
        )
        yield server.url
    print(f"stopped the server (pid {pid})", file=out)


def _table(results: list[DemoResult]) -> str:
    header = (
        f"{'mode':<21}{'increments':>11}{'counter':>10}{'lost':>9}"
        f"{'incr/s':>9}{'wait p50':>10}{'wait p99':>10}{'wait max':>10}{'fairness':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        waits = (
            f"{r.wait_p50_ms:>8.2f}ms{r.wait_p99_ms:>8.2f}ms{r.wait_max_ms:>8.2f}ms"
            if r.mode != "no lock"
            else f"{'-':>10}{'-':>10}{'-':>10}"
        )
        lines.append(
            f"{r.mode:<21}{r.increments:>11,}{r.counter:>10,}{r.lost_updates:>9,}"
            f"{r.per_second:>9,.0f}{waits}{r.fairness:>10.2f}"
        )
    return "\n".join(lines)


def run_demo(
    *,
    url: str | None = None,
    workers: int = 4,
    seconds: float = 3.0,
    as_json: bool = False,
    out: TextIO | None = None,
) -> list[DemoResult]:
    """Run the demo and print its table (or JSON); return the measured rows."""
    stream = out or sys.stdout
    log = sys.stderr if as_json else stream
    results: list[DemoResult] = []
    with _server_url(url or os.environ.get("REDIS_URL"), log) as server_url:
        print(
            f"{workers} processes each increment one counter with GET + SET "
            f"for {seconds:g} s per mode...",
            file=log,
        )
        for mode in MODES:
            results.append(_run_mode(server_url, mode, workers, seconds))
    if as_json:
        json.dump([asdict(r) for r in results], stream, indent=2)
        stream.write("\n")
    else:
        print(file=stream)
        print(_table(results), file=stream)
        print(file=stream)
        unlocked, polled, fair = results
        print(
            f"Without a lock {unlocked.lost_updates:,} of {unlocked.increments:,} increments "
            f"were lost; with a lock, {polled.lost_updates + fair.lost_updates}.\n"
            f"fairness = least served / most served process. tenure.Lock hands the lock\n"
            f"to waiters in arrival order; the polling lock's worst wait was "
            f"{polled.wait_max_ms:.1f} ms, tenure's {fair.wait_max_ms:.1f} ms.",
            file=stream,
        )
    return results
