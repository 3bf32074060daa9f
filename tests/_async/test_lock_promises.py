"""What a lock object promises about its settings, durations, sides and lifetime.

Issue 24's smaller items: a settable ``timeout`` that is honoured, durations
refused or accepted for what they mean, a collected lock no longer renewed,
and a read-write lock that refuses to wait on its own other side.
"""

from __future__ import annotations

import gc
import math
import time
from typing import Any

import pytest
import redis.asyncio

from tenure import (
    AlreadyHeldError,
    ArgumentError,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncReentrantLock,
    AsyncSemaphore,
    LockNotOwnedError,
)
from tenure._async._watchdog import watchdog
from tenure._core.leased import IDLE_TTL_MS
from tests._backend_asyncio import until


async def test_timeout_set_on_the_object_is_the_next_lease(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "settable", timeout=20)
    lock.timeout = 0.5
    assert lock.timeout == 0.5
    assert "lease=0.5s fixed lease" in repr(lock)
    assert await lock.acquire()
    assert 0 < await tenure_async_client.pttl(lock.keys.owner) <= 500
    await lock.release()
    with pytest.raises(ArgumentError, match="^timeout"):
        lock.timeout = -1
    assert lock.timeout == 0.5  # a refused value changes nothing
    lock.timeout = None  # held until released: renewed again
    assert "auto-renew" in repr(lock)
    permits = AsyncSemaphore(tenure_async_client, "settable-permits", limit=2, timeout=20)
    permits.timeout = 0.5
    assert await permits.acquire()
    await permits.release()


async def test_a_longer_timeout_set_while_held_reaches_the_hold_before_the_old_lease_ends(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    # Renewed at a third of the 3 s lease; the renewal after the change must
    # come within the 3 s it set, not a third of the new 300 s. A lease over
    # 10 s is the new one, set while the hold lasted (a late renewal finds the
    # hold gone and marks it lost).
    lock = AsyncLock(tenure_async_client, "retimed", timeout=3, auto_renew=True)
    assert await lock.acquire()
    lock.timeout = 300
    other = AsyncLock(tenure_async_client, "retimed")
    await until(
        lambda: ttl_over(tenure_async_client, lock.keys.owner, 10_000), 10, "the 300 s lease set"
    )
    assert not await other.acquire(blocking=False)
    assert await lock.owned() and not lock.lost
    await lock.release()


async def ttl_over(client: redis.asyncio.Redis, key: str, ms: int) -> bool:
    return int(await client.pttl(key)) > ms


async def test_a_read_write_sides_token_must_be_its_own(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    # The scripts tell the sides apart by the token's first letter: a chosen
    # "report-1" would have taken the write side as a read hold.
    first = AsyncReadWriteLock(tenure_async_client, "tokens")
    second = AsyncReadWriteLock(tenure_async_client, "tokens")
    with pytest.raises(ArgumentError, match="write lock's token must start with 'w'"):
        await first.write.acquire(token="report-1")
    with pytest.raises(ArgumentError, match="read lock's token must start with 'r'"):
        await first.read.acquire(token="worker-1")
    assert await first.write.acquire(token="w-report-1")
    assert not await second.write.acquire(token="w-report-2", blocking=False)
    assert not await second.read.acquire(token="r-reader", blocking=False)
    await first.write.release()


@pytest.mark.parametrize(
    ("argument", "value", "said"),
    [
        ("timeout", math.inf, "finite number of seconds \\(None: held until released\\)"),
        ("timeout", math.nan, "a number of seconds >= 0, got NaN "),
        ("timeout", -1, "> 0 seconds, got -1"),
        ("timeout", 1e12, "at most 315360000 seconds"),
        ("max_hold", math.inf, "finite"),
        ("waiter_lease", math.inf, "finite"),
        ("blocking_timeout", 1e12, "at most"),
        ("blocking_timeout", -0.5, ">= 0"),
    ],
)
async def test_durations_are_refused_by_name(
    tenure_async_client: redis.asyncio.Redis, argument: str, value: float, said: str
) -> None:
    options: dict[str, Any] = {argument: value}
    with pytest.raises(ArgumentError, match=f"^{argument}: .*{said}"):
        AsyncLock(tenure_async_client, "durations", **options)


async def test_infinite_waits_mean_forever_and_infinite_leases_are_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "forever", blocking_timeout=math.inf)
    assert lock.blocking_timeout is None  # what None means: no deadline
    assert await lock.acquire(blocking_timeout=math.inf)
    with pytest.raises(ArgumentError, match="^additional_time: .*finite"):
        await lock.extend(math.inf)
    with pytest.raises(ArgumentError, match="^additional_time: .*at most"):
        await lock.extend(1e12)
    assert await lock.extend(1)
    await lock.release()


async def test_a_collected_lock_is_not_renewed_again(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "collected", timeout=1.0, auto_renew=True)
    key = lock.keys.owner
    assert await lock.acquire()
    taken = time.monotonic()
    del lock
    gc.collect()
    while await tenure_async_client.exists(key):
        # The first renewal was due at a third of the lease (0.33 s); run, it
        # would have made the hold last to 1.33 s.
        assert time.monotonic() - taken < 1.25, "the collected lock was renewed"
        await tenure_async_client.ping()


async def test_a_released_lock_leaves_nothing_for_the_garbage_collector(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    # A cancelled renewal waits in the watchdog's heaps until compacted away;
    # it held its hold, its owner and its callbacks (a cycle) alive there, and
    # the collector ran ~30 times per 1,000 lock cycles (10-14 us a cycle).
    def holds() -> set[int]:
        return {id(obj) for obj in gc.get_objects() if type(obj).__name__ == "Hold"}

    def deferred() -> int:
        return sum(len(waiting) for waiting in watchdog()._deferred.values())

    gc.collect()
    planned = deferred()  # another test's holds' renewals, in this process
    gc.disable()
    try:
        before = holds()  # another test's, still referenced
        for i in range(200):
            async with AsyncLock(tenure_async_client, f"garbage:{i}"):
                pass
        left = holds() - before
    finally:
        gc.enable()
    assert not left, f"{len(left)} released holds still alive"
    assert deferred() <= planned  # no renewal of theirs is still planned


async def test_a_read_write_lock_refuses_to_wait_on_its_own_other_side(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    rw = AsyncReadWriteLock(tenure_async_client, "sides", blocking_timeout=5)
    assert await rw.read.acquire()
    with pytest.raises(AlreadyHeldError, match="holds the read lock.*not upgraded"):
        await rw.write.acquire()
    await rw.read.release()
    assert await rw.write.acquire()
    with pytest.raises(AlreadyHeldError, match="holds the write lock.*downgrade"):
        await rw.read.acquire()
    await rw.write.downgrade()  # the way from write to read
    assert await rw.readers() == 1
    await rw.write.release()
    assert await rw.readers() == 0


async def test_re_entries_are_counted_by_the_owner_and_a_lost_hold_is_told(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncReentrantLock(tenure_async_client, "re-entries", timeout=30)
    assert await lock.acquire()
    assert await lock.acquire()
    assert await tenure_async_client.hget(lock.keys.owner, "count") is None  # not on the server
    await lock.release()  # the inner release: nothing sent, still held
    assert await lock.owned()
    assert await lock.acquire()
    await tenure_async_client.delete(lock.keys.owner)  # the hold is lost
    with pytest.raises(LockNotOwnedError):
        await lock.extend(1)
    assert lock.lost
    with pytest.raises(LockNotOwnedError):
        await lock.release()  # an inner release of a lost hold says so
    assert not await lock.locked()


async def test_a_release_receipt_lasts_until_the_next_release(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    first = AsyncLock(tenure_async_client, "receipt", timeout=10)
    assert await first.acquire()
    hold = first._holds.current()
    assert hold is not None
    rules = first._rules
    keys, args = rules.release_call(hold.token, hold.fence)
    await first.release()
    owner = first.keys.owner
    # The marker: no holder, the last fence and the release's receipt, for IDLE_TTL.
    marker = await tenure_async_client.hgetall(owner)
    assert marker == {
        b"fence": str(hold.fence).encode(),
        b"done": f"{hold.token}:{hold.fence}".encode(),
    }
    assert 0 < await tenure_async_client.pttl(owner) <= IDLE_TTL_MS
    assert not await first.locked()
    resend = rules.scripts.release
    assert await rules.run(resend, keys, args) == 1  # a resend: recognised
    second = AsyncLock(tenure_async_client, "receipt", timeout=10)
    assert await second.acquire()
    assert second.fencing_token == hold.fence + 1
    assert await rules.run(resend, keys, args) == 1  # still, while the next one holds
    await second.release()
    assert await rules.run(resend, keys, args) == 0  # gone with the next release
