"""Worker processes for the fault tests (asyncio source; the sync twin is generated).

Run as ``python -m tests._async.workers ROLE ...`` (or ``tests._sync.workers``).
Each worker prints one JSON object per line on stdout, with times from
``time.monotonic()`` (one clock for every process on a Linux machine).

Roles:
  history URL NAME COUNT   acquire/release COUNT times; print the hold windows
  hold URL NAME LEASE      acquire (lease LEASE s, auto-renewed), print it, wait
                           for a line on stdin, then try a fenced write and a
                           release and print what happened
  wait URL NAME TIMEOUT    acquire (blocking), print when, hold 10 ms, release
  stall URL NAME TIMEOUT   acquire (blocking) in a task of its own; on a stdin line
                           "block SECONDS" block the event loop that long (a busy
                           process), on "hold SECONDS" hold that long once
                           acquired, on any other line just wait; print when it
                           was acquired, its fence and the server's, then hold
                           (50 ms by default), release and print whether the hold
                           was kept
  permit URL NAME LIMIT    take a permit of an AsyncSemaphore(limit=LIMIT, 1 s
                           lease, renewed), print it, then wait for stdin
  connlock URL NAME -       take an AsyncConnectionLock, print it, wait for stdin
  rw URL NAME COUNT        take an AsyncReadWriteLock COUNT times, as a writer one
                           time in four (at random), holding each 1 ms; print
                           every hold window with its mode
  crowd URL NAME COUNT     queue COUNT waiters (tasks, or threads) of this one
                           process, each its own AsyncLock with a 0.5 s waiter
                           lease; print "waiting" once every one of them is in the
                           server's queue, then for each: when it was acquired
                           (hold 10 ms, release)
  permits URL NAME COUNT LIMIT
                           take a permit of an AsyncSemaphore(limit=LIMIT, 1 s
                           lease, renewed) COUNT times, holding each 1 ms; print
                           every hold window and whether its release succeeded
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio

from tenure import (
    AsyncConnectionLock,
    AsyncFencedKey,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    LockNotOwnedError,
    SemaphoreNotOwnedError,
)
from tests._backend_asyncio import in_line, join, read_line, run, sleep, spawn, until


def emit(**fields: Any) -> None:
    """Print one JSON line and flush it."""
    print(json.dumps(fields), flush=True)


async def history(url: str, name: str, count: int) -> None:
    """Acquire and release ``count`` times; print every hold window."""
    client = redis.asyncio.Redis.from_url(url)
    lock = AsyncLock(client, name, timeout=10)
    windows = []
    emit(event="ready")
    for _ in range(count):
        assert await lock.acquire(blocking_timeout=60)
        began = time.monotonic()
        value = int(await client.get(f"{name}:counter") or 0)  # a racy read-modify-write
        await client.set(f"{name}:counter", value + 1)
        ended = time.monotonic()
        windows.append((began, ended))
        await lock.release()
    emit(event="done", windows=windows)
    await client.aclose()


async def hold(url: str, name: str, lease: float) -> None:
    """Hold the lock until told to go on, then report what a stale holder sees."""
    client = redis.asyncio.Redis.from_url(url)
    lost: list[bool] = []
    lock = AsyncLock(
        client, name, timeout=lease, auto_renew=True, on_lost=lambda _: lost.append(True)
    )
    assert await lock.acquire()
    emit(event="acquired", t=time.monotonic(), fence=lock.fencing_token)
    await read_line()
    fence = lock.fencing_token
    assert fence is not None
    written = await AsyncFencedKey(client, f"{name}:data").write("stale write", fence)
    try:
        await lock.release()
        released = "released"
    except LockNotOwnedError:
        released = "not owned"
    emit(event="after", written=written, release=released, lost=bool(lost))
    await client.aclose()


async def wait(url: str, name: str, timeout: float) -> None:
    """Queue for the lock; print when it was acquired."""
    client = redis.asyncio.Redis.from_url(url)
    lock = AsyncLock(client, name, timeout=10)
    emit(event="waiting", t=time.monotonic())
    got = await lock.acquire(blocking_timeout=timeout)
    emit(event="acquired" if got else "timeout", t=time.monotonic(), fence=lock.fencing_token)
    if got:
        await lock.release()
    await client.aclose()


async def crowd(url: str, name: str, count: int) -> None:
    """Queue ``count`` waiters of this process; print each acquisition."""
    client = redis.asyncio.Redis.from_url(url)
    locks = [AsyncLock(client, name, timeout=10, waiter_lease=0.5) for _ in range(count)]

    async def take(lock: AsyncLock) -> None:
        got = await lock.acquire(blocking_timeout=60)
        emit(event="acquired" if got else "timeout", t=time.monotonic(), fence=lock.fencing_token)
        if got:
            await sleep(0.01)  # the hold: 10 ms
            await lock.release()

    def starter(lock: AsyncLock) -> Callable[[], Any]:
        return lambda: take(lock)

    tasks = [spawn(starter(lock)) for lock in locks]
    await until(lambda: in_line(client, locks[0], count), 10, f"{count} waiters in line")
    emit(event="waiting", t=time.monotonic())
    for task in tasks:
        await join(task)
    await client.aclose()


async def stall(url: str, name: str, timeout: float) -> None:
    """Queue for the lock, maybe blocking this process's event loop meanwhile."""
    client = redis.asyncio.Redis.from_url(url)
    lost: list[bool] = []
    lock = AsyncLock(client, name, timeout=10, on_lost=lambda _: lost.append(True))

    async def take() -> bool:
        return await lock.acquire(blocking_timeout=timeout)

    emit(event="waiting", t=time.monotonic())
    task = spawn(take)
    line = await read_line()
    held = 0.05
    if line.startswith("block "):
        emit(event="blocking", t=time.monotonic())
        time.sleep(float(line.split()[1]))  # noqa: ASYNC251 - the point: a busy loop
    elif line.startswith("hold "):
        held = float(line.split()[1])
    got = await join(task)
    acquired = time.monotonic()
    server_fence = await client.hget(lock.keys.owner, "fence")
    emit(
        event="acquired" if got else "timeout",
        t=acquired,
        fence=lock.fencing_token,
        server_fence=int(server_fence or 0),
    )
    if got:
        await sleep(held)  # the hold
        try:
            await lock.release()
            kept = True
        except LockNotOwnedError:
            kept = False
        emit(event="released", kept=kept, lost=bool(lost))
    await client.aclose()


async def permits(url: str, name: str, count: int, limit: int) -> None:
    """Take and return permits; print each hold window and whether it stayed held."""
    client = redis.asyncio.Redis.from_url(url)
    permit = AsyncSemaphore(client, name, limit=limit, timeout=1, auto_renew=True)
    emit(event="ready")
    for _ in range(count):
        assert await permit.acquire(blocking_timeout=60)
        began = time.monotonic()
        token, fence = permit.local.token, permit.fencing_token
        await sleep(0.001)  # the hold: 1 ms
        ended = time.monotonic()
        try:
            await permit.release()
            kept = True
        except SemaphoreNotOwnedError:
            kept = False  # stopped past its lease: the permit went to someone else
        emit(
            event="window",
            start=began,
            end=ended,
            kept=kept,
            released=time.monotonic(),
            token=token.decode() if isinstance(token, bytes) else token,
            fence=fence,
            pid=os.getpid(),
        )
    emit(event="done")
    await client.aclose()


async def rw(url: str, name: str, count: int) -> None:
    """Read or write under a read-write lock; print every hold window with its mode."""
    client = redis.asyncio.Redis.from_url(url)
    lock = AsyncReadWriteLock(client, name, timeout=10)
    chooser = random.Random()
    windows = []
    emit(event="ready")
    for _ in range(count):
        mode = "write" if chooser.random() < 0.25 else "read"
        side = lock.write if mode == "write" else lock.read
        assert await side.acquire(blocking_timeout=60)
        began = time.monotonic()
        await sleep(0.001)  # the hold: 1 ms
        ended = time.monotonic()
        windows.append((began, ended, mode))
        await side.release()
    emit(event="done", windows=windows)
    await client.aclose()


async def permit(url: str, name: str, limit: int) -> None:
    """Hold one permit until told to go on (or killed)."""
    client = redis.asyncio.Redis.from_url(url)
    held = AsyncSemaphore(client, name, limit=limit, timeout=1, auto_renew=True)
    assert await held.acquire()
    emit(event="acquired", t=time.monotonic(), fence=held.fencing_token)
    await read_line()
    await held.release()
    await client.aclose()


async def connlock(url: str, name: str) -> None:
    """Hold a connection lock until told to go on (or killed)."""
    client = redis.asyncio.Redis.from_url(url)
    lock = AsyncConnectionLock(client, name)
    assert await lock.acquire()
    emit(event="acquired", t=time.monotonic(), owner=lock.owner_id)
    await read_line()
    await lock.release()
    await client.aclose()


async def work(argv: list[str]) -> int:
    """Dispatch on the role named in ``argv[0]``; return the exit status."""
    role, url, name, value = argv[0], argv[1], argv[2], argv[3]
    if role == "history":
        await history(url, name, int(value))
    elif role == "hold":
        await hold(url, name, float(value))
    elif role == "wait":
        await wait(url, name, float(value))
    elif role == "crowd":
        await crowd(url, name, int(value))
    elif role == "stall":
        await stall(url, name, float(value))
    elif role == "connlock":
        await connlock(url, name)
    elif role == "permit":
        await permit(url, name, int(value))
    elif role == "rw":
        await rw(url, name, int(value))
    elif role == "permits":
        await permits(url, name, int(value), int(argv[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")
    return 0


def main() -> None:
    """Entry point."""
    sys.exit(run(work(sys.argv[1:])))


if __name__ == "__main__":
    main()
