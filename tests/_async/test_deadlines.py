"""``blocking_timeout`` kept whatever the server does: paused, dead behind redis-py's
default retry. What a call the caller stopped waiting for took is given back.

Written once for asyncio (tasks) and generated for threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio

from tenure import AsyncConnectionLock, AsyncLock, AsyncReadWriteLock, AsyncSemaphore
from tests._backend_asyncio import calls_settled, join, spawn, until
from tests.conftest import ServerFactory
from tests.starvation import starvation

BOUND = 0.25 + 0.35
"""How far past ``blocking_timeout`` an acquire may return: 0.25 s (issue 39; 0.2 s of
GRACE in the library), and what a CI worker adds to its scheduling; plus, where measured,
the time its threads waited for a CPU (:func:`tests.starvation.starvation`)."""

KINDS: dict[str, Callable[..., Any]] = {
    "lock": lambda client, name: AsyncLock(client, name, timeout=30),
    "semaphore": lambda client, name: AsyncSemaphore(client, name, limit=1, timeout=30),
    "write": lambda client, name: AsyncReadWriteLock(client, name, timeout=30).write,
    "connlock": lambda client, name: AsyncConnectionLock(client, name),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_paused_server_costs_blocking_timeout_and_nothing_stays_held(
    tenure_server_factory: ServerFactory, kind: str
) -> None:
    server = tenure_server_factory()
    client = server.async_client()  # redis-py's defaults: its retry, no socket timeout
    admin = server.async_client()
    primitive = KINDS[kind](client, f"paused-{kind}")
    try:
        assert await client.ping() and await admin.ping()  # connected before the fault
        server.pause()
        try:
            with starvation() as starved:
                started = time.monotonic()
                assert not await primitive.acquire(blocking_timeout=0.3)
                took = time.monotonic() - started
        finally:
            server.resume()
        assert took <= 0.3 + BOUND + starved.seconds, (took, starved)
        if kind != "connlock":  # it keeps no statistics
            assert primitive.statistics().timeouts == 1

        # The try ran when the server resumed, and was given back.
        async def free() -> bool:
            other = KINDS[kind](admin, f"paused-{kind}")
            got = bool(await other.acquire(blocking=False))
            if got:
                await other.release()
            return got

        await until(free, 10, "the late call's hold given back")
        await calls_settled(30)
    finally:
        await client.aclose()
        await admin.aclose()


async def test_a_waiter_whose_server_pauses_leaves_by_its_deadline(
    tenure_server_factory: ServerFactory,
) -> None:
    server = tenure_server_factory()
    client, admin = server.async_client(), server.async_client()
    holder = AsyncLock(admin, "paused-wait", timeout=30, thread_local=False)
    try:
        assert await holder.acquire()
        waiter = AsyncLock(client, "paused-wait", timeout=30)
        waiting = spawn(lambda: waiter.acquire(blocking_timeout=1.0))

        async def queued() -> bool:
            return bool(await admin.zcard(holder.keys.queue))

        await until(queued, 10, "the waiter in line")
        started = time.monotonic()
        server.pause()
        try:
            with starvation() as starved:
                assert not await join(waiting)
            took = time.monotonic() - started
        finally:
            server.resume()
        assert took <= 1.0 + BOUND + starved.seconds, (took, starved)

        async def left() -> bool:
            return not await admin.zcard(holder.keys.queue)

        await until(left, 10, "the waiter out of line")
        await calls_settled(30)
        assert await holder.owned()
        await holder.release()
    finally:
        await client.aclose()
        await admin.aclose()


async def test_a_dead_server_behind_the_default_retry_costs_blocking_timeout(
    tenure_server_factory: ServerFactory,
) -> None:
    """redis-py's default retry spends seconds of backoff on a refused connection: the
    acquire returns by its deadline anyway (False, or the error if it came first)."""
    server = tenure_server_factory()
    client = server.async_client()  # redis-py's default retry
    lock = AsyncLock(client, "dead-retry", timeout=30)
    try:
        assert not await lock.locked()
        server.kill()
        for timeout in (0.3, 1.0):
            with starvation() as starved:
                started = time.monotonic()
                try:
                    got = await lock.acquire(blocking_timeout=timeout)
                except redis.ConnectionError:
                    got = False
                took = time.monotonic() - started
            assert not got
            assert took <= timeout + BOUND + starved.seconds, (took, starved)
        server.restart()  # the calls still retrying (and their give-backs) end sooner
        await calls_settled(30)
    finally:
        await client.aclose()
