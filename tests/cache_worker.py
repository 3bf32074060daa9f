"""A process of callers of one HerdCache entry, for tests/test_cache_processes.py.

    python -m tests.cache_worker URL MODE CALLERS START_AT TTL

MODE is ``threads`` or ``asyncio``; the callers all fetch the entry
``stampede`` at the wall-clock time START_AT, with a loader that counts its
calls on the server (INCR ``loads``) and takes 1 s. Prints one JSON line:
the values the callers got and how long each waited.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

import redis
import redis.asyncio

from tenure import AsyncHerdCache, HerdCache

LOAD_SECONDS = 1.0


def main(url: str, mode: str, callers: int, start_at: float, ttl: float) -> None:
    """Run the callers and print what they got."""
    if mode == "threads":
        results = _threads(url, callers, start_at, ttl)
    else:
        results = asyncio.run(_tasks(url, callers, start_at, ttl))
    # A refresh elected in this process runs in the background after its callers
    # were served: live on, as a server process would, until it is stored.
    print(json.dumps({"values": [v for v, _ in results], "waits": [w for _, w in results]}))


def _threads(url: str, callers: int, start_at: float, ttl: float) -> list[tuple[Any, float]]:
    client = redis.Redis.from_url(url, max_connections=callers + 4)
    cache = HerdCache(client, "stampede", ttl=ttl)

    def load() -> str:
        version = int(client.incr("loads"))
        time.sleep(LOAD_SECONDS)
        return f"v{version}"

    results: list[tuple[Any, float]] = []
    lock = threading.Lock()

    def caller() -> None:
        time.sleep(max(0.0, start_at - time.time()))
        started = time.monotonic()
        value = cache.fetch("key", load)
        with lock:
            results.append((value, time.monotonic() - started))

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(LOAD_SECONDS + 0.5)  # see main()
    client.close()
    return results


async def _tasks(url: str, callers: int, start_at: float, ttl: float) -> list[tuple[Any, float]]:
    client = redis.asyncio.Redis.from_url(url)
    cache = AsyncHerdCache(client, "stampede", ttl=ttl)

    async def load() -> str:
        version = int(await client.incr("loads"))
        await asyncio.sleep(LOAD_SECONDS)
        return f"v{version}"

    async def caller() -> tuple[Any, float]:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        started = time.monotonic()
        value = await cache.fetch("key", load)
        return value, time.monotonic() - started

    results = await asyncio.gather(*(caller() for _ in range(callers)))
    await asyncio.sleep(LOAD_SECONDS + 0.5)  # see main()
    await client.aclose()
    return list(results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
