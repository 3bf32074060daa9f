"""Test helpers where threads and asyncio differ (paired with _backend_asyncio.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def gather(*jobs: Callable[[], T]) -> list[T]:
    """Run each job concurrently (in threads) and return their results in order."""
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [future.result() for future in futures]


def sleep(seconds: float) -> None:
    """Sleep the calling thread."""
    time.sleep(seconds)


def spawn(job: Callable[[], T]) -> Future[T]:
    """Start ``job`` in a background thread; ``join(handle)`` for its result."""
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(job)
    pool.shutdown(wait=False)
    return future


def join(handle: Future[T]) -> T:
    """Wait for a job started by :func:`spawn`."""
    return handle.result(timeout=60)


def read_line() -> str:
    """Read a line from stdin."""
    return sys.stdin.readline()


def run(result: T) -> T:
    """The sync twin of ``asyncio.run``: the work already ran; pass its result on."""
    return result


def off_loop(call: Callable[[], T]) -> T:
    """Run ``call`` (the asyncio twin runs it in a thread, to keep its loop free)."""
    return call()


def until(condition: Callable[[], object], seconds: float, what: str) -> None:
    """Wait until ``condition()`` is true (polled every 10 ms), else fail naming ``what``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not happen within {seconds}s")
        time.sleep(0.01)


def in_line(client: Any, primitive: Any, count: int) -> bool:
    """Whether at least ``count`` waiters are in ``primitive``'s line on the server."""
    return int(client.zcard(primitive.keys.queue)) >= count


def subscribed(client: Any) -> bool:
    """Whether the server has a client subscribed to channels (a waiter listening)."""
    return bool(client.client_list(_type="pubsub"))


def unlocked(primitive: Any) -> bool:
    """Whether nobody holds ``primitive`` on the server (its hold ended or ran out)."""
    return not primitive.locked()


def nonempty(items: list[Any]) -> bool:
    """Whether ``items`` (what a callback recorded) has anything yet."""
    return bool(items)


def calls_settled(seconds: float) -> None:
    """Nothing to wait for: calls that outlived an acquire's deadline run in daemon
    threads, which end on their own (an event loop would close under its tasks)."""
