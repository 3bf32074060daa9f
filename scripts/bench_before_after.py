"""The lock family's speed at two commits, measured in one run, rounds interleaved.

A change that only reshapes the code (issue 27: the leased primitives
composed of parts) must not make a lock slower. This script checks out the
library of ``--before`` (a git revision) and of the working tree, starts one
private valkey-server, and measures each in turn, alternating which goes
first, with the same measurement code (only the public API), so both see
the same machine at the same time:

* ``Lock solo``, ``AsyncLock solo``, ``Semaphore solo``: acquire+release
  cycles per second in one thread / task, nobody else on the name;
* ``Lock 4 threads``: four threads of one process taking turns on one lock
  (handoffs per second);
* ``AsyncLock 50 tasks``: fifty tasks of one event loop taking turns;
* ``... entity``: a new object on a new name per cycle, tenure's and
  redis-py's (redis-py's is the same code in both trees: a gauge of the noise).

    python scripts/bench_before_after.py --before 60634b4 --rounds 5 --seconds 2

It prints the median of the rounds for each (with their range) and the ratio\nafter/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tenure.server import ServerProcess

MEASURE = r"""
import asyncio, json, os, sys, threading, time
import redis, redis.asyncio
import tenure

url, seconds = sys.argv[1], float(sys.argv[2])
client = redis.Redis.from_url(url)
out = {"version_file": tenure.__file__}

def solo(make):
    lock = make()
    lock.acquire(); lock.release()  # the scripts are loaded
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        lock.acquire(); lock.release(); n += 1
    return n / seconds

out["Lock solo"] = solo(lambda: tenure.Lock(client, "ba:solo"))

def entity(make):
    warm = make(f"ba:e:warm:{os.getpid()}")
    warm.acquire(); warm.release()
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        lock = make(f"ba:e:{os.getpid()}:{n}")
        lock.acquire(); lock.release(); n += 1
    return n / seconds

out["Lock entity (new object and name)"] = entity(lambda name: tenure.Lock(client, name))
out["redis-py Lock entity (the same in both)"] = entity(lambda name: client.lock(name))
out["Semaphore solo"] = solo(lambda: tenure.Semaphore(client, "ba:sem", limit=3))

def threads(count):
    lock = tenure.Lock(client, "ba:threads")
    lock.acquire(); lock.release()
    done, stop = [0] * count, time.perf_counter() + seconds
    def loop(i):
        while time.perf_counter() < stop:
            with lock:
                done[i] += 1
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(count)]
    for w in workers: w.start()
    for w in workers: w.join()
    return sum(done) / seconds

out["Lock 4 threads"] = threads(4)

async def async_parts():
    aclient = redis.asyncio.Redis.from_url(url)
    lock = tenure.AsyncLock(aclient, "ba:asolo")
    await lock.acquire(); await lock.release()
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        await lock.acquire(); await lock.release(); n += 1
    out["AsyncLock solo"] = n / seconds
    entities = (
        ("AsyncLock entity (new object and name)", lambda name: tenure.AsyncLock(aclient, name)),
        ("redis-py asyncio Lock entity (the same in both)", lambda name: aclient.lock(name)),
    )
    for label, make in entities:
        warm = make(f"ba:ae:warm:{os.getpid()}")
        await warm.acquire(); await warm.release()
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            lock = make(f"ba:ae:{os.getpid()}:{label[0]}{n}")
            await lock.acquire(); await lock.release(); n += 1
        out[label] = n / seconds
    shared = tenure.AsyncLock(aclient, "ba:tasks")
    await shared.acquire(); await shared.release()
    done, stop = [0], time.perf_counter() + seconds
    async def loop():
        while time.perf_counter() < stop:
            async with shared:
                done[0] += 1
    await asyncio.gather(*(loop() for _ in range(50)))
    out["AsyncLock 50 tasks"] = done[0] / seconds
    await aclient.aclose()

asyncio.run(async_parts())
print(json.dumps(out))
"""


def measure(src: Path, url: str, seconds: float) -> dict[str, float]:
    """One round of every figure with the library in ``src`` (a fresh process)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, url, str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60 + 10 * seconds,
        check=True,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(figures.pop("version_file")).startswith(str(src)):
        raise SystemExit(f"the library was not imported from {src}")
    return {key: float(value) for key, value in figures.items()}


def main() -> None:
    """Measure both trees, interleaved, and print the medians and ratios."""
    parser = argparse.ArgumentParser(description="The lock family at two commits, interleaved.")
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if not 1 <= args.rounds <= 50 or not 0 < args.seconds <= 30:
        parser.error("--rounds must be in 1..50 and --seconds in (0, 30]")
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="tenure-before-") as folder:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", args.before, "src"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        trees = {"before": Path(folder) / "src", "after": root / "src"}
        results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        with ServerProcess() as server:
            for index in range(args.rounds):
                order = ["before", "after"] if index % 2 == 0 else ["after", "before"]
                for which in order:
                    results[which].append(measure(trees[which], server.url, args.seconds))
                print(f"round {index + 1}/{args.rounds} done", file=sys.stderr)
    print(f"| figure (per s; median of {args.rounds} rounds, min-max) | before | after | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for key in results["before"][0]:
        cells = []
        for which in ("before", "after"):
            values = [r[key] for r in results[which]]
            cells.append(
                f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"
            )
        ratio = statistics.median(r[key] for r in results["after"]) / statistics.median(
            r[key] for r in results["before"]
        )
        print(f"| {key} | {cells[0]} | {cells[1]} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
