"""Sync primitives on a thread whose asyncio event loop is running: told at once, by name.

A sync call blocks its thread and every task of the loop that thread runs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import redis

import tenure._backends.event_loops as event_loops
import tenure._backends.for_asyncio as for_asyncio
from tenure import (
    AlreadyHeldError,
    AsyncLock,
    Cache,
    ConnectionLock,
    FencedKey,
    HerdCache,
    Lock,
    ReadWriteLock,
    Redlock,
    ReentrantLock,
    Semaphore,
)
from tests.conftest import ServerFactory

KINDS: dict[str, Callable[[redis.Redis, str], Any]] = {
    "Lock": lambda client, name: Lock(client, name),
    "ReentrantLock": lambda client, name: ReentrantLock(client, name),
    "Semaphore": lambda client, name: Semaphore(client, name, limit=1),
    "WriteLock": lambda client, name: ReadWriteLock(client, name).write,
    "Redlock": lambda client, name: Redlock([client], name),
    "ConnectionLock": lambda client, name: ConnectionLock(client, name),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_wait_for_a_hold_taken_on_the_same_loop_raises_at_once(
    tenure_client: redis.Redis, kind: str
) -> None:
    """Two tasks, one sync lock around an await: the second would block the first for ever."""
    make = KINDS[kind]
    name = f"loop-{kind}"

    async def first(taken: asyncio.Event, done: asyncio.Event) -> None:
        with make(tenure_client, name):
            taken.set()
            await done.wait()

    async def second(taken: asyncio.Event, done: asyncio.Event) -> float:
        await taken.wait()
        started = time.monotonic()
        try:
            with make(tenure_client, name):
                pass
        finally:
            done.set()
        return started

    async def main() -> BaseException | None:
        taken, done = asyncio.Event(), asyncio.Event()
        results = await asyncio.gather(
            first(taken, done), second(taken, done), return_exceptions=True
        )
        return results[1] if isinstance(results[1], BaseException) else None

    error = asyncio.run(main())
    assert isinstance(error, AlreadyHeldError), repr(error)
    text = str(error)
    assert f"tenure.Async{kind}" in text and "event loop is running" in text
    assert not tenure_client.hexists(f"tenure:lock:{{{name}}}", "token")  # the first released it
    assert make(tenure_client, name).acquire(blocking=False)  # nothing left behind


def test_another_wait_on_a_loop_thread_works_and_warns_once(tenure_client: redis.Redis) -> None:
    """A notebook's sync wait for a hold of another thread: deliberate, so it goes on."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with Lock(tenure_client, "loop-other"):
            taken.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(10)
    event_loops._warned = False  # once per process: start this test from none

    async def main() -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not Lock(tenure_client, "loop-other").acquire(blocking_timeout=0.05)
            threading.Timer(0.1, done.set).start()
            lock = Lock(tenure_client, "loop-other")
            assert lock.acquire(blocking_timeout=10)  # granted when the other thread releases
            lock.release()
        return [f"{w.category.__name__}: {w.message} @ {w.filename}" for w in caught]

    try:
        said = asyncio.run(main())
    finally:
        done.set()
        holder.join()
    assert len(said) == 1, said
    assert said[0].startswith("RuntimeWarning: tenure: a sync Lock ('loop-other') waits")
    assert "tenure.AsyncLock" in said[0]
    assert said[0].endswith(__file__)  # points at the caller's line


def test_a_lock_taken_without_waiting_on_a_loop_thread_says_nothing(
    tenure_client: redis.Redis,
) -> None:
    async def main() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with Lock(tenure_client, "loop-free"):
                pass

    asyncio.run(main())


@pytest.mark.parametrize(
    "make",
    [
        lambda client: Lock(client, "loop-aw"),
        lambda client: Semaphore(client, "loop-aw", limit=2),
        lambda client: ReadWriteLock(client, "loop-aw").read,
        lambda client: ConnectionLock(client, "loop-aw"),
    ],
)
def test_async_with_on_a_sync_object_names_its_twin(
    tenure_client: redis.Redis, make: Callable[[redis.Redis], Any]
) -> None:
    primitive = make(tenure_client)
    kind = type(primitive).__name__

    async def main() -> None:
        async with primitive:
            pass

    with pytest.raises(TypeError, match=f"^{kind} is tenure's sync .* use tenure.Async{kind} "):
        asyncio.run(main())
    assert tenure_client.dbsize() == 0


def test_await_on_a_sync_acquire_is_refused_before_anything_is_taken(
    tenure_client: redis.Redis,
) -> None:
    lock = Lock(tenure_client, "loop-await")

    async def main() -> None:
        await lock.acquire()  # type: ignore[misc]

    with pytest.raises(TypeError, match=r"^Lock.acquire\(\) is tenure's sync .*AsyncLock"):
        asyncio.run(main())
    assert not lock.owned() and tenure_client.dbsize() == 0

    async def plain() -> bool:
        return lock.acquire()  # not awaited: a deliberate sync call, allowed

    assert asyncio.run(plain())
    lock.release()


def test_every_awaited_sync_call_that_changes_state_is_refused_before_it_acts(
    tenure_client: redis.Redis,
) -> None:
    # Each of these would act (take the lock, write the value, run the loader)
    # and only then fail to be awaited, leaving a change the caller believes failed.
    connlock = ConnectionLock(tenure_client, "loop-await-conn")
    fenced = FencedKey(tenure_client, "loop-await-fenced")
    cache = Cache(tenure_client, "loop-await-cache", ttl=5)
    herd = HerdCache(tenure_client, "loop-await-herd", ttl=5)
    loaded: list[int] = []

    def loader() -> int:
        loaded.append(1)
        return 1

    async def connlock_acquire() -> None:
        await connlock.acquire()  # type: ignore[misc]

    async def fenced_write() -> None:
        await fenced.write("v", 3)  # type: ignore[misc]

    async def cache_set() -> None:
        await cache.set("k", 1)  # type: ignore[misc]

    async def herd_fetch() -> None:
        await herd.fetch("k", loader)

    for main, called, twin in (
        (connlock_acquire, "ConnectionLock.acquire", "AsyncConnectionLock"),
        (fenced_write, "FencedKey.write", "AsyncFencedKey"),
        (cache_set, "Cache.set", "AsyncCache"),
        (herd_fetch, "HerdCache.fetch", "AsyncHerdCache"),
    ):
        pattern = rf"^{called}\(\) is tenure's sync .*nothing was done.*tenure\.{twin}"
        with pytest.raises(TypeError, match=pattern):
            asyncio.run(main())
    assert not connlock.owned() and not loaded
    assert fenced.read() == (None, None) and cache.get("k") is None


def test_an_event_loop_ending_after_an_unanswered_acquire_leaves_no_task_behind(
    tenure_server_factory: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # The acquire's call to a paused server goes on alone past its deadline; the
    # loop's end cancels it. Nothing may then start on a loop that is closing
    # ("Task was destroyed but it is pending!", a traceback from redis-py).
    server = tenure_server_factory()

    async def main() -> bool:
        client = server.async_client()
        assert await client.ping()
        server.pause()
        return await AsyncLock(client, "loop-end").acquire(blocking_timeout=0.3)

    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            assert asyncio.run(main()) is False
            gc.collect()  # a task left pending is reported when collected
    finally:
        server.resume()
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
    # Nor is a task kept for a loop that has ended (reported at the process's exit).
    left = [t for t in for_asyncio._background if t.get_name() == "tenure-give-back"]
    assert not left, left
