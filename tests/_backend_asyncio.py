"""Test helpers where asyncio and threads differ (paired with _backend_threads.py)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def gather(*jobs: Callable[[], Awaitable[T]]) -> list[T]:
    """Run each job concurrently (as tasks) and return their results in order."""
    return list(await asyncio.gather(*(job() for job in jobs)))


async def sleep(seconds: float) -> None:
    """Sleep without blocking the loop."""
    await asyncio.sleep(seconds)


def spawn(job: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
    """Start ``job`` in the background; ``await join(handle)`` for its result."""
    return asyncio.ensure_future(job())


async def join(handle: asyncio.Task[T]) -> T:
    """Wait for a job started by :func:`spawn`."""
    return await handle


async def read_line() -> str:
    """Read a line from stdin without blocking the loop."""
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a worker's main coroutine."""
    return asyncio.run(main)


async def off_loop(call: Callable[[], T]) -> T:
    """Run a blocking ``call`` (a sync client's command) in a thread, the loop free meanwhile."""
    return await asyncio.to_thread(call)


async def until(condition: Callable[[], Awaitable[object]], seconds: float, what: str) -> None:
    """Wait until ``await condition()`` is true (polled every 10 ms), else fail naming ``what``."""
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {seconds}s")
        await asyncio.sleep(0.01)


async def in_line(client: Any, primitive: Any, count: int) -> bool:
    """Whether at least ``count`` waiters are in ``primitive``'s line on the server."""
    return int(await client.zcard(primitive.keys.queue)) >= count


async def subscribed(client: Any) -> bool:
    """Whether the server has a client subscribed to channels (a waiter listening)."""
    return bool(await client.client_list(_type="pubsub"))


async def unlocked(primitive: Any) -> bool:
    """Whether nobody holds ``primitive`` on the server (its hold ended or ran out)."""
    return not await primitive.locked()


async def nonempty(items: list[Any]) -> bool:
    """Whether ``items`` (what a callback recorded) has anything yet."""
    return bool(items)


async def calls_settled(seconds: float) -> None:
    """Wait until tenure's calls that outlived an acquire's deadline, and the give-backs
    that follow them, have ended (before the test's event loop closes under them)."""
    from tenure._backends import for_asyncio

    def busy() -> bool:
        giving_back = any(t.get_name() == "tenure-give-back" for t in for_asyncio._background)
        return bool(for_asyncio._racing) or giving_back

    deadline = time.monotonic() + seconds
    while busy():
        if time.monotonic() >= deadline:
            raise AssertionError(f"tenure's late calls did not end within {seconds}s")
        await asyncio.sleep(0.01)
