"""Read-write lock contract tests, written once for asyncio and generated for threads."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis.asyncio

from tenure import AsyncReadWriteLock, LockNotOwnedError
from tests._backend_asyncio import gather, in_line, join, sleep, spawn, until

pytestmark = pytest.mark.topologies("standalone", "cluster")


async def test_readers_share_and_writers_exclude(clients: list[redis.asyncio.Redis]) -> None:
    first, second, writer = (AsyncReadWriteLock(c, "doc") for c in clients[:3])
    assert await first.read.acquire()
    assert await second.read.acquire()
    assert await first.readers() == 2
    assert not await writer.write.acquire(blocking=False)
    await first.read.release()
    await second.read.release()
    assert await writer.write.acquire(blocking=False)
    assert not await first.read.acquire(blocking=False)
    assert await first.readers() == 0
    await writer.write.release()


async def test_no_writer_overlaps_anyone(clients: list[redis.asyncio.Redis]) -> None:
    readers_in = 0
    writers_in = 0
    violations: list[str] = []
    readers_seen = 0

    def worker(index: int) -> Any:
        async def job() -> None:
            nonlocal readers_in, writers_in, readers_seen
            rw = AsyncReadWriteLock(clients[index], "shared", timeout=10)
            for round_number in range(12):
                if (index + round_number) % 4 == 0:
                    async with rw.write:
                        writers_in += 1
                        if writers_in > 1 or readers_in:
                            violations.append("writer overlapped")
                        await sleep(0.002)
                        writers_in -= 1
                else:
                    async with rw.read:
                        readers_in += 1
                        readers_seen = max(readers_seen, readers_in)
                        if writers_in:
                            violations.append("reader overlapped a writer")
                        await sleep(0.002)
                        readers_in -= 1

        return job

    await gather(*(worker(i) for i in range(6)))
    assert violations == []
    assert readers_seen > 1  # readers did share


async def test_a_waiting_writer_is_not_starved_by_readers(
    clients: list[redis.asyncio.Redis],
) -> None:
    stop_at = time.monotonic() + 3.0  # starved, the writer would wait nearly all of it

    def reader(index: int) -> Any:
        async def job() -> int:
            rw = AsyncReadWriteLock(clients[index], "busy")
            rounds = 0
            while time.monotonic() < stop_at:
                async with rw.read:  # readers overlap: the lock is never free of them
                    await sleep(0.03)  # the read hold
                rounds += 1
            return rounds

        return job

    def writer() -> Any:
        async def job() -> float:
            rw = AsyncReadWriteLock(clients[7], "busy")

            async def readers_in() -> bool:
                return await rw.readers() >= 2

            await until(readers_in, 5, "the readers holding")  # it arrives among them
            began = time.monotonic()
            async with rw.write:
                return time.monotonic() - began

        return job

    results = await gather(writer(), *(reader(i) for i in range(4)))
    waited = results[0]
    # The readers ahead of it finish (30 ms), the rest queue behind: well under 1 s even on
    # a loaded machine (0.75 s was seen in CI), where starving it would take about 3 s.
    assert waited < 1.0


async def test_a_renewal_under_the_write_token_after_downgrade_renews_the_read_hold(
    clients: list[redis.asyncio.Redis],
) -> None:
    """A renewal sent before downgrade() and answered after it is not a lost hold.

    The server runs it after the downgrade (its reply may even be read before
    the downgrade's): it renews the read hold the write hold became.
    """
    owner = AsyncReadWriteLock(clients[0], "renew-down", timeout=5)
    other = AsyncReadWriteLock(clients[1], "renew-down", timeout=5)
    assert await owner.write.acquire()
    rules = owner.write._rules
    write_token = owner.write.local.token.decode()  # type: ignore[union-attr]
    await owner.write.downgrade()
    keys, args = rules.extend_call(write_token, 9000, "set")
    assert await rules.run(rules.scripts.extend, keys, args) > 5000
    assert 5000 < await clients[0].pttl(rules.keys.owner) <= 9000
    # A semaphore-style call without the read token still finds no write hold.
    assert await rules.run(rules.scripts.extend, keys, (*args[:5], "", "")) == 0
    assert not await other.write.acquire(blocking=False)
    assert await other.read.acquire(blocking=False)
    await other.read.release()
    await owner.write.release()


async def test_downgrade_keeps_holding_and_lets_readers_in(
    clients: list[redis.asyncio.Redis],
) -> None:
    owner = AsyncReadWriteLock(clients[0], "down", thread_local=False)
    reader = AsyncReadWriteLock(clients[1], "down")
    other_writer = AsyncReadWriteLock(clients[2], "down")
    await owner.write.acquire()

    async def read_it() -> float:
        assert await reader.read.acquire(blocking_timeout=5)
        got = time.monotonic()
        await reader.read.release()
        return got

    handle = spawn(read_it)
    await until(lambda: in_line(clients[2], reader.read, 1), 5, "the reader in line")
    downgraded = time.monotonic()
    await owner.write.downgrade()
    assert await join(handle) - downgraded < 0.4  # woken by it, not a refresh (0.8 s away)
    assert not await other_writer.write.acquire(blocking=False)  # still held, as a reader
    assert await owner.readers() == 1
    with pytest.raises(LockNotOwnedError):
        await owner.write.downgrade()
    await owner.write.release()
    assert await other_writer.write.acquire(blocking=False)
    await other_writer.write.release()
