"""One process of the cache benchmark: ``python -m benchmarks.cache_worker CONFIG``.

CONFIG is JSON. With ``"mode": "stampede"``, ``callers`` threads (or asyncio
tasks, for an asyncio contender) each make one cached call at every wall-clock
instant of ``phases``; the loader counts its calls on the server under
``<counter>:<phase>`` (the phase it started in) and sleeps ``load`` seconds.
The process then stays up for a load time more, as a server process would,
so that a background refresh it was elected to run is finished. With
``"mode": "hits"``, one caller repeats a cached call of a warm key for
``seconds`` and counts. One JSON line is printed either way.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from benchmarks.cache_contenders import VALUE, bare_async, bare_sync, by_key

__all__ = ["main"]


def _phase(phases: list[float]) -> int:
    now = time.time()
    return max([i for i, start in enumerate(phases) if start <= now] or [0])


def _sync_loader(config: dict[str, Any]) -> Callable[[], Any]:
    counter = redis.Redis.from_url(config["url"])

    def load() -> Any:
        counter.incr(f"{config['counter']}:{_phase(config['phases'])}")
        time.sleep(config["load"])
        return dict(VALUE)

    return load


def _async_loader(config: dict[str, Any]) -> Callable[[], Any]:
    counter = redis.asyncio.Redis.from_url(config["url"])

    async def load() -> Any:
        await counter.incr(f"{config['counter']}:{_phase(config['phases'])}")
        await asyncio.sleep(config["load"])
        return dict(VALUE)

    return load


def _stampede_threads(config: dict[str, Any]) -> list[list[float]]:
    call = by_key(config["contender"]).make(config["url"], config["fresh"], _sync_loader(config))
    waits: list[list[float]] = [[] for _ in config["phases"]]
    mutex = threading.Lock()

    def caller() -> None:
        for index, start in enumerate(config["phases"]):
            time.sleep(max(0.0, start - time.time()))
            began = time.perf_counter()
            call()
            took = time.perf_counter() - began
            with mutex:
                waits[index].append(took)

    threads = [threading.Thread(target=caller) for _ in range(config["callers"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(config["load"] + 0.5)
    return waits


async def _stampede_tasks(config: dict[str, Any]) -> list[list[float]]:
    call = by_key(config["contender"]).make(config["url"], config["fresh"], _async_loader(config))
    waits: list[list[float]] = [[] for _ in config["phases"]]

    async def caller() -> None:
        for index, start in enumerate(config["phases"]):
            await asyncio.sleep(max(0.0, start - time.time()))
            began = time.perf_counter()
            await call()
            waits[index].append(time.perf_counter() - began)

    await asyncio.gather(*(caller() for _ in range(config["callers"])))
    await asyncio.sleep(config["load"] + 0.5)
    return waits


def _hits_sync(config: dict[str, Any]) -> float:
    if config["contender"] == "bare-sync":
        call = bare_sync(config["url"])
    else:
        call = by_key(config["contender"]).make(config["url"], 3600.0, lambda: dict(VALUE))
    call()
    count, began = 0, time.perf_counter()
    deadline = began + config["seconds"]
    while count < 2_000_000 and (count % 64 or time.perf_counter() < deadline):
        call()
        count += 1
    return count / (time.perf_counter() - began)


async def _hits_async(config: dict[str, Any]) -> float:
    if config["contender"] == "bare-async":
        call = await bare_async(config["url"])
    else:

        async def load() -> Any:
            return dict(VALUE)

        call = by_key(config["contender"]).make(config["url"], 3600.0, load)
    await call()
    count, began = 0, time.perf_counter()
    deadline = began + config["seconds"]
    while count < 2_000_000 and (count % 64 or time.perf_counter() < deadline):
        await call()
        count += 1
    return count / (time.perf_counter() - began)


def main(argv: list[str]) -> int:
    """Run the configured part and print its result as one JSON line."""
    config = json.loads(argv[0])
    name = config["contender"]
    is_async = name == "bare-async" or (name != "bare-sync" and by_key(name).is_async)
    if config["mode"] == "hits":
        rate = asyncio.run(_hits_async(config)) if is_async else _hits_sync(config)
        print(json.dumps({"per_second": rate}))
    else:
        waits = asyncio.run(_stampede_tasks(config)) if is_async else _stampede_threads(config)
        print(json.dumps({"waits": waits}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
