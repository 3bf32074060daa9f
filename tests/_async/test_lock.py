"""Lock contract tests, written once for asyncio and generated for threads."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster
from redis.crc import key_slot

from tenure import (
    AcquireTimeoutError,
    AlreadyHeldError,
    ArgumentError,
    AsyncFencedKey,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncReentrantLock,
    AsyncSemaphore,
    ClientTypeError,
    LockLostError,
    LockNotOwnedError,
    NotOwnedError,
)
from tenure._async._watchdog import watchdog
from tenure._backends.for_asyncio import IS_ASYNC, Event
from tenure.server import ServerProcess
from tests._backend_asyncio import gather, in_line, join, nonempty, spawn, unlocked, until
from tests.conftest import ServerFactory

pytestmark = pytest.mark.topologies("standalone", "cluster")


async def test_acquire_release_and_fencing(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "basic")
    assert not await lock.locked()
    assert await lock.acquire()
    first = lock.fencing_token
    assert first is not None
    assert await lock.locked()
    assert await lock.owned()
    await lock.release()
    assert lock.statistics().fencing_token is None
    assert not await lock.locked()
    assert not await lock.owned()
    assert await lock.acquire()
    second = lock.fencing_token
    assert second is not None
    assert second > first
    await lock.release()
    stats = lock.statistics()
    assert stats.acquisitions == 2
    assert stats.releases == 2
    assert not stats.held


async def test_context_manager_and_repr(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "ctx")
    assert "not held" in repr(lock)
    async with lock:
        assert "held fence=" in repr(lock)
        assert await lock.owned()
    assert not await lock.locked()


async def test_second_owner_cannot_acquire_or_release(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    holder = AsyncLock(tenure_async_client, "busy")
    other = AsyncLock(other_client, "busy")
    assert await holder.acquire()
    assert not await other.acquire(blocking=False)
    with pytest.raises(LockNotOwnedError):
        await other.release()
    with pytest.raises(LockNotOwnedError):
        await other.extend(1)
    await holder.release()
    assert await other.acquire(blocking=False)
    await other.release()


async def test_blocking_timeout_is_precise(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    holder = AsyncLock(tenure_async_client, "slow")
    assert await holder.acquire()
    waiter = AsyncLock(other_client, "slow")
    for wanted in (0.05, 0.2, 0.35):
        began = time.monotonic()
        assert not await waiter.acquire(blocking_timeout=wanted)
        took = time.monotonic() - began
        # Never early; late only by what leaving the line takes (a round trip:
        # ~50 ms on a quiet machine, past 300 ms on a CI machine running two
        # suites at once), never by a refresh period or a lease.
        assert wanted <= took <= wanted + 1.0, (wanted, took)
    assert waiter.statistics().timeouts == 3
    await holder.release()
    # The waiter left the queue: the lock is free for anyone at once.
    assert await waiter.acquire(blocking=False)
    await waiter.release()


async def test_with_raises_when_it_cannot_acquire(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    holder = AsyncLock(tenure_async_client, "held")
    await holder.acquire()
    with pytest.raises(AcquireTimeoutError):
        async with AsyncLock(other_client, "held", blocking_timeout=0.05):
            pass
    await holder.release()


async def test_release_wakes_the_waiter_without_polling(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    holder = AsyncLock(tenure_async_client, "wake")
    waiter = AsyncLock(other_client, "wake")
    assert await holder.acquire()

    async def wait_for_it() -> float:
        assert await waiter.acquire(blocking_timeout=5)
        got = time.monotonic()
        await waiter.release()
        return got

    handle = spawn(wait_for_it)
    await until(lambda: in_line(tenure_async_client, holder, 1), 5, "the waiter in line")
    released = time.monotonic()
    await holder.release()
    got = await join(handle)
    # A handoff, not a poll: the waiter has it within a few milliseconds here (a
    # bound a busy 2-core machine meets; a refresh, which would find it, is 0.8 s away).
    assert got - released < 0.4
    assert waiter.statistics().contended == 1


async def test_fifo_order_of_queued_waiters(
    tenure_async_client: redis.asyncio.Redis, clients: list[redis.asyncio.Redis]
) -> None:
    holder = AsyncLock(tenure_async_client, "fifo", thread_local=False)
    assert await holder.acquire()
    order: list[int] = []

    def waiter(index: int) -> object:
        async def job() -> None:
            # arrive in index order: each once those before it are in line
            await until(lambda: in_line(clients[index], holder, index), 10, f"{index} in line")
            lock = AsyncLock(clients[index], "fifo")
            assert await lock.acquire(blocking_timeout=10)
            order.append(index)
            await lock.release()

        return job

    async def release_later() -> None:
        await until(lambda: in_line(tenure_async_client, holder, 8), 10, "8 waiters in line")
        await holder.release()

    await gather(release_later, *(waiter(i) for i in range(8)))  # type: ignore[arg-type]
    assert order == list(range(8))


async def test_lease_expires_without_renewal(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "lease", timeout=0.2)
    assert await lock.acquire()
    ttl = await tenure_async_client.pttl(lock.keys.owner)
    assert 0 < ttl <= 200
    taken = time.monotonic()

    await until(lambda: unlocked(lock), 5, "the 0.2 s lease running out")
    assert time.monotonic() - taken > 0.1  # its lease, not a release
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_a_client_clock_jump_changes_nothing(
    tenure_async_client: redis.asyncio.Redis,
    other_client: redis.asyncio.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Leases run on the server's clock and waits on the monotonic clock: the
    # client's wall clock jumping an hour either way moves nothing.
    real = time.time
    # A 1.5 s lease renewed every 0.5 s: a starved CI worker once ran a renewal of a
    # 0.6 s lease over 0.4 s late, and the hold was lost.
    holder = AsyncLock(tenure_async_client, "jump", timeout=1.5, auto_renew=True)
    other = AsyncLock(other_client, "jump", timeout=1.5)
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert await holder.acquire()
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    assert not await other.acquire(blocking_timeout=2.0)  # renewed past its lease meanwhile
    assert await holder.owned()
    await holder.release()
    assert await other.acquire(blocking=False)
    await other.release()


async def test_auto_renew_keeps_it_past_the_lease(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "renewed", timeout=0.3, auto_renew=True)
    async with lock:
        taken = time.monotonic()

        async def renewed_past_the_lease() -> bool:  # renewed every 0.1 s
            return lock.statistics().renewals >= 4

        await until(renewed_past_the_lease, 5, "four renewals")
        assert time.monotonic() - taken > 0.3  # held past its lease
        assert await lock.owned()
    assert not await lock.locked()


async def test_extend_and_reacquire(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "extend", timeout=1)
    with pytest.raises(LockNotOwnedError):
        await lock.extend(1)
    await lock.acquire()
    assert await lock.extend(2)
    assert 2000 < await tenure_async_client.pttl(lock.keys.owner) <= 3000
    assert await lock.extend(0.5, replace_ttl=True)
    assert await tenure_async_client.pttl(lock.keys.owner) <= 500
    assert await lock.reacquire()
    assert 500 < await tenure_async_client.pttl(lock.keys.owner) <= 1000
    await lock.release()
    with pytest.raises(LockNotOwnedError):
        await lock.reacquire()


async def test_lost_lock_is_reported(tenure_async_client: redis.asyncio.Redis) -> None:
    lost: list[str] = []
    lock = AsyncLock(
        tenure_async_client,
        "stolen",
        timeout=0.3,
        auto_renew=True,
        on_lost=lambda lk: lost.append(lk.name),
    )
    with pytest.raises(LockLostError):
        async with lock:
            await tenure_async_client.delete(lock.keys.owner)  # someone breaks it

            async def found_out() -> bool:  # by the next renewal (every 0.1 s), then told
                return lock.lost and bool(lost)

            await until(found_out, 5, "the renewal finding the hold gone")
            assert lost == ["stolen"]
    assert lock.statistics().lost == 1
    assert not lock.lost  # forgotten after the block


async def test_max_hold_stops_renewing(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "bounded", timeout=0.2, auto_renew=True, max_hold=0.5)
    await lock.acquire()
    taken = time.monotonic()

    async def renewed_past_the_lease() -> bool:  # renewed every 0.067 s
        return lock.statistics().renewals >= 4

    await until(renewed_past_the_lease, 5, "four renewals")
    assert time.monotonic() - taken > 0.2  # held past its first lease
    assert await lock.owned()  # renewed past its first lease

    # but not past max_hold: the hold ends within a lease of it
    await until(lambda: unlocked(lock), 5, "the hold's end after max_hold")
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_the_end_of_max_hold_is_told_as_a_lost_hold(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """docs/locks.md: the lease runs out and the holder is told (on_lost, lost, the error)."""
    told: list[object] = []
    lock = AsyncLock(
        tenure_async_client, "bounded-told", timeout=0.3, max_hold=0.6, on_lost=told.append
    )
    taken = time.monotonic()
    with pytest.raises(LockLostError):
        async with lock:
            await until(lambda: nonempty(told), 10, "on_lost at the end of max_hold")
            assert time.monotonic() - taken >= 0.5  # not before max_hold (renewed till then)
            assert told == [lock] and lock.lost

            # within the few ms the server's lease is longer
            await until(lambda: unlocked(lock), 5, "the server's hold ended")
    assert lock.statistics().lost == 1 and lock.statistics().renewals >= 2


async def test_max_hold_ends_a_hold_before_its_first_renewal(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    told: list[float] = []
    lock = AsyncLock(
        tenure_async_client,
        "bounded-long",
        timeout=10,  # first renewal at 3.3 s: max_hold ends the hold before it
        max_hold=0.5,
        on_lost=lambda _lock: told.append(time.monotonic()),
    )
    taken = time.monotonic()
    assert await lock.acquire()

    await until(lambda: nonempty(told), 10, "on_lost at the end of max_hold")
    assert 0.45 <= told[0] - taken < 3.0  # at max_hold, not at the lease's renewal

    await until(lambda: unlocked(lock), 5, "the server's hold ended")


async def test_an_extend_past_max_hold_moves_its_end(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    told: list[float] = []
    lock = AsyncLock(
        tenure_async_client,
        "bounded-extended",
        timeout=2,
        max_hold=0.1,  # the first renewal (0.67 s) sets a lease ending at max_hold
        on_lost=lambda _lock: told.append(time.monotonic()),
    )
    assert await lock.acquire()
    hold = lock._holds.peek()
    assert hold is not None

    async def ending() -> bool:  # no renewal left: only the end is planned
        return hold.ending

    await until(ending, 10, "the end of max_hold planned")
    assert await lock.extend(2)  # the holder's own choice: 2 s more
    extended = time.monotonic()
    assert not told and await lock.owned()

    await until(lambda: nonempty(told), 15, "on_lost at the end of the extended lease")
    assert told[0] - extended >= 1.5  # at the extended lease's end, not max_hold's

    await until(lambda: unlocked(lock), 5, "the server's hold ended")
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_reentrant(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncReentrantLock(tenure_async_client, "again")
    async with lock:
        fence = lock.fencing_token
        async with lock:
            assert lock.fencing_token == fence
            assert "count=2" in repr(lock)
        assert await lock.owned()
    assert not await lock.locked()


async def test_non_reentrant_reacquire_is_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    lock = AsyncLock(tenure_async_client, "once")
    async with lock:
        with pytest.raises(AlreadyHeldError):
            await lock.acquire()


async def test_fencing_survives_key_expiry(tenure_async_client: redis.asyncio.Redis) -> None:
    lock = AsyncLock(tenure_async_client, "fenced", timeout=0.05)
    seen: list[int] = []
    for _ in range(3):
        await lock.acquire()
        token = lock.fencing_token
        assert token is not None
        seen.append(token)

        # the lease runs out instead of a release
        await until(lambda: unlocked(lock), 5, "the 50 ms lease running out")
        with pytest.raises(LockNotOwnedError):
            await lock.release()
    assert seen == sorted(seen) and len(set(seen)) == 3


async def test_fencing_survives_restart_with_aof(tenure_server_factory: ServerFactory) -> None:
    server = tenure_server_factory(appendonly=True)
    client = server.async_client()
    try:
        lock = AsyncLock(client, "durable")
        await lock.acquire()
        before = lock.fencing_token
        await lock.release()
        await client.aclose()
        server.restart()
        client = server.async_client()
        lock = AsyncLock(client, "durable")
        await lock.acquire()
        assert lock.fencing_token is not None and before is not None
        assert lock.fencing_token > before
        await lock.release()
    finally:
        await client.aclose()


async def test_fenced_key_rejects_older_token(tenure_async_client: redis.asyncio.Redis) -> None:
    store = AsyncFencedKey(tenure_async_client, "account:7")
    assert await store.read() == (None, None)
    assert await store.write("v5", 5)
    assert await store.write("v5-again", 5)
    assert not await store.write("late", 4)
    assert await store.write("v9", 9, ttl=10)
    assert await store.read() == (b"v9", 9)
    with pytest.raises(ArgumentError, match="fencing_token"):
        await store.write("x", "9")  # type: ignore[arg-type]
    # Tokens the scripts cannot compare exactly (doubles), and values they cannot store.
    for token in (-1, 2**53 + 1, 2**70):
        with pytest.raises(ArgumentError, match="fencing_token: must be from 0 to 2\\*\\*53"):
            await store.write("x", token)
    for value in (None, True, ["a"]):
        with pytest.raises(ArgumentError, match="^value: must be str, bytes, int or float"):
            await store.write(value, 10)  # type: ignore[arg-type]
    assert await store.read() == (b"v9", 9)  # nothing refused was written


@pytest.mark.parametrize("reentrant", [False, True])
async def test_a_second_owner_of_a_chosen_token_is_refused_as_redis_py_refuses_it(
    tenure_async_client: redis.asyncio.Redis, reentrant: bool
) -> None:
    """Two objects acquiring with ``token="worker-1"``: one holds, the other waits."""
    kind = AsyncReentrantLock if reentrant else AsyncLock
    first, second = kind(tenure_async_client, "chosen"), kind(tenure_async_client, "chosen")
    assert await first.acquire(token="worker-1")
    fence = first.fencing_token
    assert fence is not None
    assert not await second.acquire(blocking=False, token="worker-1")
    assert not await second.acquire(blocking_timeout=0.1, token="worker-1")
    assert await first.owned() and not await second.owned()
    assert first.fencing_token == fence and second.statistics().fencing_token is None
    waiting = spawn(lambda: second.acquire(blocking_timeout=10, token="worker-1"))
    await until(lambda: in_line(tenure_async_client, second, 1), 10, "the second in line")
    await first.release()
    assert await join(waiting)  # handed over on release, as to any waiter
    assert second.fencing_token is not None and second.fencing_token > fence
    assert not await first.owned()  # the token is the same: owned() asks this object
    await second.release()


@pytest.mark.parametrize("kind", ["lock", "semaphore", "write"])
async def test_an_owner_whose_lease_ran_out_cannot_touch_the_next_hold_of_its_token(
    tenure_async_client: redis.asyncio.Redis, kind: str
) -> None:
    """Two owners chose one token; the first's lease ran out and the second holds it
    now: the first's owned() is False, its extend() and release() refused, and the
    second's hold is untouched (the fence tells the two acquisitions apart)."""

    def made() -> Any:
        if kind == "semaphore":
            return AsyncSemaphore(tenure_async_client, "stale-owner", limit=1, timeout=0.3)
        if kind == "write":
            return AsyncReadWriteLock(tenure_async_client, "stale-owner", timeout=0.3).write
        return AsyncLock(tenure_async_client, "stale-owner", timeout=0.3)

    token = "w-worker-1" if kind == "write" else "worker-1"
    first, second = made(), made()
    assert await first.acquire(token=token)
    assert await second.acquire(token=token, blocking_timeout=5)  # once the lease ran out
    assert second.fencing_token > first.fencing_token
    assert not await first.owned()
    with pytest.raises(NotOwnedError):
        await first.extend(5)
    with pytest.raises(NotOwnedError):
        await first.release()
    assert await second.owned()
    await second.release()


async def test_a_reentry_into_a_hold_another_acquisition_of_the_token_took_is_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """The first owner's hold vanished unseen (here: its key deleted, as a lease run
    out while its process was stopped) and a second owner of its chosen token took
    the lock: the first one's re-entry is refused, the second's hold kept."""
    first = AsyncReentrantLock(tenure_async_client, "reenter-stale")
    second = AsyncReentrantLock(tenure_async_client, "reenter-stale")
    assert await first.acquire(token="worker-1")
    await tenure_async_client.delete(first.keys.owner)
    assert await second.acquire(token="worker-1", blocking=False)
    with pytest.raises(LockNotOwnedError, match="re-entry found the lock lost"):
        await first.acquire()
    assert first.lost and await second.owned()
    await second.release()


async def test_a_fenced_key_keeps_its_fence_when_its_value_expires(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    store = AsyncFencedKey(tenure_async_client, "account:8")
    assert await store.write("v1", 5, ttl=1)
    assert await store.write("v2", 6)  # no ttl: kept until the next write, as SET does
    assert await tenure_async_client.pttl(store.key) == -1
    assert await store.write("v3", 7, ttl=0.05)
    await until(lambda: _is_gone(tenure_async_client, store.key), 5, "the value's ttl running out")
    assert await store.read() == (None, None)
    assert not await store.write("stale", 6)  # the value is gone, its fence is not
    assert await tenure_async_client.pttl(store.fence_key) == -1
    assert await store.write("v4", 7)
    assert await store.read() == (b"v4", 7)
    # A ttl under a millisecond is the shortest there is, not none.
    assert await store.write("v5", 8, ttl=1e-9)
    await until(lambda: _is_gone(tenure_async_client, store.key), 5, "a 1 ms ttl running out")
    # A key with its own hash tag keeps it; braces that are no tag cannot share a slot.
    tagged = AsyncFencedKey(tenure_async_client, "account:{9}:balance")
    assert tagged.fence_key == "account:{9}:balance:tenure-fence"
    assert await tagged.write("10", 1, ttl=5)
    assert AsyncFencedKey(tenure_async_client, "plain").fence_key == "{plain}:tenure-fence"
    for key in ("a}b", "{}x"):
        with pytest.raises(ArgumentError, match="^key: has a '}' but no hash tag"):
            AsyncFencedKey(tenure_async_client, key)


async def _is_gone(client: redis.asyncio.Redis, key: str) -> bool:
    return not await client.exists(key)


async def test_tokens_belong_to_their_owner_while_it_runs(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    shared = AsyncLock(tenure_async_client, "mine")
    taken, done = Event(), Event()

    async def take() -> None:
        assert await shared.acquire()
        taken.set()
        await done.wait(5)

    async def steal() -> str:
        try:
            await shared.release()
        except LockNotOwnedError:
            return "refused"
        return "released"

    owner = spawn(take)
    assert await taken.wait(5)
    assert await gather(steal) == ["refused"]  # its owner is alive: not yours
    done.set()
    await join(owner)
    # The owner finished without releasing: the next user of the object may
    # take the hold over (wait_for / gather ran acquire in a task of its own).
    assert await shared.locked()
    assert await gather(steal) == ["released"]
    assert not await shared.locked()


async def test_not_thread_local_lets_another_owner_release(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    shared = AsyncLock(tenure_async_client, "handover", thread_local=False)

    async def take() -> None:
        assert await shared.acquire()

    async def give_back() -> None:
        await shared.release()

    await gather(take)
    await gather(give_back)
    assert not await shared.locked()


async def test_cluster_client(
    tenure_async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    for name in ("alpha", "beta", "gamma", "delta"):
        lock = AsyncLock(tenure_async_cluster_client, name, auto_renew=True)
        async with lock:
            assert await lock.owned()
            slot = key_slot(lock.keys.owner.encode())
            assert key_slot(lock.keys.queue.encode()) == slot
            assert key_slot(lock.keys.names.encode()) == slot
            assert key_slot(lock.keys.wakes.encode()) == slot
        assert not await lock.locked()


async def test_decoded_responses(tenure_server: ServerProcess) -> None:
    client = tenure_server.async_client(decode_responses=True)
    try:
        first = AsyncLock(client, "decoded")
        second = AsyncLock(client, "decoded")
        await first.acquire()
        first_fence = first.fencing_token
        assert first_fence is not None

        async def wait() -> int | None:
            assert await second.acquire(blocking_timeout=5)
            fence = second.fencing_token
            await second.release()
            return fence

        handle = spawn(wait)
        await until(lambda: in_line(client, first, 1), 5, "the waiter in line")
        await first.release()
        assert await join(handle) == first_fence + 1
        assert await first.owned() is False
    finally:
        await client.aclose()


async def test_bad_arguments_are_named(tenure_async_client: redis.asyncio.Redis) -> None:
    with pytest.raises(ArgumentError, match="^name"):
        AsyncLock(tenure_async_client, "")
    with pytest.raises(ArgumentError, match="hash tag"):
        AsyncLock(tenure_async_client, "a}b")
    with pytest.raises(ArgumentError, match="^prefix"):
        AsyncLock(tenure_async_client, "x", prefix="locks:{eu}:")
    with pytest.raises(ArgumentError, match="^timeout"):
        AsyncLock(tenure_async_client, "x", timeout=-1)
    with pytest.raises(ArgumentError, match="^blocking_timeout"):
        AsyncLock(tenure_async_client, "x", blocking_timeout=-0.5)
    with pytest.raises(ArgumentError, match="^sleep"):
        AsyncLock(tenure_async_client, "x", sleep=float("nan"))
    lock = AsyncLock(tenure_async_client, "x")
    with pytest.raises(ArgumentError, match="^blocking_timeout"):
        await lock.acquire(blocking_timeout=-1)
    # The constructor and acquire() say the same of sleep=inf.
    with pytest.raises(ArgumentError, match="^sleep: must be a finite number of seconds"):
        AsyncLock(tenure_async_client, "x", sleep=math.inf)
    with pytest.raises(ArgumentError, match="^sleep: must be a finite number of seconds"):
        await lock.acquire(sleep=math.inf)
    with pytest.raises(ArgumentError, match="^additional_time"):
        await lock.extend(-1)
    with pytest.raises(ClientTypeError, match="^client"):
        AsyncLock(object(), "x")  # type: ignore[arg-type]


async def test_one_watchdog_batches_the_renewals_of_many_locks(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    dog = watchdog()
    batches, calls = dog.batches, dog.calls
    # A 2 s lease, renewed every third of it: a CI worker starved for 0.2 s lost
    # a 0.3 s lease, one starved for 0.7 s (two engines' suites side by side while
    # redis-py's versions install) lost a 1 s lease, whose renewals then stopped.
    locks = [
        AsyncLock(tenure_async_client, f"many-{i}", timeout=2.0, auto_renew=True) for i in range(6)
    ]
    for lock in locks:
        assert await lock.acquire()

    async def renewed_twice() -> bool:
        return all(lock.statistics().renewals >= 2 for lock in locks)

    await until(renewed_twice, 15, "two renewals of every lock")
    for lock in locks:
        assert await lock.owned()
        await lock.release()
    assert watchdog() is dog  # one renewer for every lock of this loop / process
    renewals = dog.calls - calls
    assert renewals >= 6 * 2
    # several renewals per round trip (on a cluster, per primary: two of the six each)
    assert dog.batches - batches <= renewals / 2
    if not IS_ASYNC:
        names = [thread.name for thread in threading.enumerate()]
        assert names.count("tenure-watchdog") <= 1


async def test_a_token_with_a_nul_is_refused(tenure_async_client: redis.asyncio.Redis) -> None:
    """The line scripts name a waiter with a chosen token "token NUL call id"."""
    lock = AsyncLock(tenure_async_client, "nul-token")
    with pytest.raises(ArgumentError, match="^token: must not contain NUL characters"):
        await lock.acquire(token="worker\x001")
    assert not await lock.locked()
