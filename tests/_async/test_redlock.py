"""Redlock: one lock over three independent masters (asyncio source; sync generated).

Each master is a real server behind a fault proxy of its own, so a test can
slow one down, cut it off or refuse its connections while the others go on.
The multi-process exclusion runs and server restarts are in
tests/test_redlock_faults.py.
"""

from __future__ import annotations

import functools
import importlib
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from tenure import (
    ArgumentError,
    AsyncLock,
    AsyncRedlock,
    ClientTypeError,
    LockLostError,
    LockNotOwnedError,
    QuorumError,
)
from tenure._async._scripting import registry_for
from tenure.server import FaultProxy, ServerProcess
from tenure.testing import ProxyFactory
from tests._backend_asyncio import calls_settled, gather, join, off_loop, sleep, spawn, until
from tests.starvation import starvation


@pytest.fixture
def proxies(
    redlock_servers: tuple[ServerProcess, ...], tenure_proxy_factory: ProxyFactory
) -> list[FaultProxy]:
    """One proxy per master (every server flushed first)."""
    for server in redlock_servers:
        with server.client() as direct:
            direct.flushall()
    return [tenure_proxy_factory(server) for server in redlock_servers]


async def _clients(proxies: list[FaultProxy]) -> list[redis.asyncio.Redis]:
    return [proxy.async_client(socket_timeout=2) for proxy in proxies]


async def _close(proxies: list[FaultProxy], clients: list[redis.asyncio.Redis]) -> None:
    """Heal the faults first: calls left waiting on a cut-off master end before the clients do."""
    for proxy in proxies:
        proxy.clear()
        proxy.reset_connections()
    await sleep(0.1)  # teardown: calls the reset failed end before their clients close
    for client in clients:
        await client.aclose()


@pytest.fixture
async def masters(proxies: list[FaultProxy]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """A client per master, through its proxy."""
    made = await _clients(proxies)
    yield made
    await _close(proxies, made)


@pytest.fixture
async def other_masters(proxies: list[FaultProxy]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """Another client per master, as another process would have."""
    made = await _clients(proxies)
    yield made
    await _close(proxies, made)


def direct(server: ServerProcess) -> redis.Redis:
    """A client of the server itself, bypassing its proxy."""
    return server.client(decode_responses=True)


def owner_of(server: ServerProcess, name: str) -> str | None:
    """The token that holds ``name`` on one master (None: nobody)."""
    with direct(server) as client:
        token = client.hget(f"tenure:redlock:{{{name}}}", "token")
        return None if token is None else str(token)


def held_everywhere(servers: tuple[ServerProcess, ...], name: str) -> bool:
    """Whether every master holds ``name``, for one token.

    ``acquire()`` returns once a quorum granted: the last master's grant may
    land a moment later. A test that then changes one master waits for this.
    """
    tokens = {owner_of(server, name) for server in servers}
    return len(tokens) == 1 and None not in tokens


async def eventually(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll ``condition`` (a blocking call, run off the loop) until it holds, or fail.

    On the loop, a poll every 10 ms through a new sync client would keep it
    blocked most of the time on a busy machine, and the Redlock's own calls in
    the background (a give-back) would time out.
    """

    async def holds() -> bool:
        return bool(await off_loop(condition))

    await until(holds, seconds, what)


async def test_acquire_release_and_exclusion(
    masters: list[Any], other_masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    lock = AsyncRedlock(masters, "job", timeout=5)
    other = AsyncRedlock(other_masters, "job", timeout=5)
    assert lock.quorum == 2
    assert len(lock.masters) == 3
    assert await lock.acquire()
    first = lock.fencing_token
    assert first is not None and first > 0
    assert await lock.locked() and await lock.owned()
    assert not await other.owned()
    assert not await other.acquire(blocking=False)
    await eventually(lambda: held_everywhere(redlock_servers, "job"), 5, "the grant everywhere")
    await lock.release()
    assert not await lock.locked()
    await eventually(
        lambda: all(owner_of(server, "job") is None for server in redlock_servers),
        5,
        "the release on every master",  # it returns at a quorum too
    )
    assert await other.acquire(blocking=False)
    second = other.fencing_token
    assert second is not None and second > first
    await other.release()
    with pytest.raises(LockNotOwnedError):
        await other.release()
    stats = lock.statistics()
    assert (stats.masters, stats.quorum, stats.acquisitions, stats.releases) == (3, 2, 1, 1)


async def test_a_waiter_is_woken_by_the_release(
    masters: list[Any], other_masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    lock = AsyncRedlock(masters, "woken", timeout=10)
    other = AsyncRedlock(other_masters, "woken", timeout=10, blocking_timeout=10)
    assert await lock.acquire()

    async def wait_then_time() -> float:
        assert await other.acquire()
        return time.monotonic()

    waiter = spawn(wait_then_time)

    def queued() -> bool:
        with direct(redlock_servers[0]) as client:
            return bool(client.zcard(lock.keys.queue))

    await eventually(queued, 5, "the waiter in line")
    released = time.monotonic()
    await lock.release()
    woken = await join(waiter)
    # Woken by the release's message, not by a timer (the refresh is 0.8 s away).
    assert woken - released < 0.4
    assert other.statistics().contended == 1
    await other.release()


async def test_blocking_timeout_is_a_deadline(masters: list[Any], other_masters: list[Any]) -> None:
    lock = AsyncRedlock(masters, "deadline", timeout=10)
    assert await lock.acquire()
    other = AsyncRedlock(other_masters, "deadline", timeout=10)
    started = time.monotonic()
    assert not await other.acquire(blocking_timeout=0.5)
    took = time.monotonic() - started
    assert 0.5 <= took < 0.75
    assert other.statistics().timeouts == 1
    with pytest.raises(Exception, match="could not acquire"):
        async with AsyncRedlock(other_masters, "deadline", blocking=False):
            pass
    await lock.release()


async def test_waiters_are_served_in_arrival_order(
    masters: list[Any], proxies: list[FaultProxy], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    holder = AsyncRedlock(masters, "line", timeout=10)
    assert await holder.acquire()
    order: list[int] = []
    extra = [await _clients(proxies) for _ in range(4)]

    def in_line() -> int:
        with direct(redlock_servers[0]) as client:
            return int(client.zcard(holder.keys.queue))

    async def contender(index: int) -> None:
        # Arrive in index order: each once those before it are in line (a
        # fixed pause is no order on a busy machine, where a thread can be
        # held up longer).
        await eventually(lambda: in_line() >= index, 8, f"{index} waiters in line")
        lock = AsyncRedlock(extra[index], "line", timeout=10, blocking_timeout=10)
        assert await lock.acquire()
        order.append(index)
        await lock.release()

    jobs = [spawn(functools.partial(contender, i)) for i in range(4)]
    await eventually(lambda: in_line() >= 4, 8, "every waiter in line")
    await holder.release()
    for job in jobs:
        await join(job)
    assert order == [0, 1, 2, 3]
    for clients in extra:
        for client in clients:
            await client.aclose()


async def test_wrong_input_is_refused_clearly(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    with pytest.raises(ArgumentError, match="at least one client"):
        AsyncRedlock([], "bad")
    with pytest.raises(ClientTypeError, match="list of clients"):
        AsyncRedlock(masters[0], "bad")
    twin = redlock_servers[0].async_client()
    with pytest.raises(ArgumentError, match=r"clients\[1\].*is also clients\[0\]"):
        AsyncRedlock([twin, redlock_servers[0].async_client(db=1)], "bad")
    kinds = [redis.Redis(), importlib.import_module("redis." + "asyncio").Redis()]
    other_kind = next(kind for kind in kinds if type(kind) is not type(masters[0]))
    with pytest.raises(ClientTypeError, match=r"clients\[1\].*one kind"):
        AsyncRedlock([masters[0], other_kind], "bad")
    with pytest.raises(ArgumentError, match="master_timeout"):
        AsyncRedlock(masters, "bad", timeout=1, master_timeout=0.5)
    with pytest.raises(TypeError):
        AsyncRedlock(masters, "bad", reentrant=True)  # type: ignore[call-arg]
    await twin.aclose()


async def test_a_minority_down_changes_nothing(
    masters: list[Any], other_masters: list[Any], proxies: list[FaultProxy]
) -> None:
    proxies[0].refuse_connections()
    proxies[0].reset_connections()
    lock = AsyncRedlock(masters, "minority", timeout=5)
    other = AsyncRedlock(other_masters, "minority", timeout=5)
    for _ in range(20):
        assert await lock.acquire()
        assert not await other.acquire(blocking=False)
        await lock.release()
    await sleep(lock.master_timeout)  # master 0's calls outlived their timeout: it is skipped
    assert await lock.acquire()
    await lock.release()
    assert lock.statistics().master_failures > 0


async def test_a_majority_down_fails_fast_naming_the_masters(
    masters: list[Any], proxies: list[FaultProxy]
) -> None:
    proxies[1].refuse_connections()
    proxies[1].reset_connections()
    proxies[2].blackhole()
    lock = AsyncRedlock(masters, "majority", timeout=5, blocking_timeout=30)
    started = time.monotonic()
    with pytest.raises(QuorumError) as caught:
        await lock.acquire()
    # Not the 30 s blocking timeout: a few attempts (masters only slow to answer
    # get that much patience, for a busy machine), then the error.
    assert time.monotonic() - started < 2.0
    error = caught.value
    assert (error.answered, error.required) == (1, 2)
    assert set(error.failures) == {lock.masters[1], lock.masters[2]}
    assert lock.masters[1] in str(error) and lock.masters[2] in str(error)
    # The blackholed master: timed out, or skipped once its calls piled up.
    assert re.match("no answer within|not answering", error.failures[lock.masters[2]])


async def test_many_waiters_on_masters_slower_than_master_timeout_all_get_it(
    proxies: list[FaultProxy],
) -> None:
    """Every master answers after master_timeout (a busy machine, a burst of new
    connections): the attempts wait for the answers on their way instead of sending
    more calls, which would pile up until the pools ran out (QuorumError)."""
    clients = [proxy.async_client(socket_timeout=5, max_connections=20) for proxy in proxies]
    for proxy in proxies:
        proxy.set_latency(0.07)  # a round trip: 0.14 s, over the 0.1 s master_timeout
    held: list[int] = []

    async def take(index: int) -> None:
        lock = AsyncRedlock(clients, "burst", timeout=10)
        assert await lock.acquire(blocking_timeout=60)
        held.append(index)
        await lock.release()

    try:
        await gather(*(functools.partial(take, index) for index in range(10)))
        assert sorted(held) == list(range(10))
    finally:
        await _close(proxies, clients)


async def test_a_burst_of_acquirers_larger_than_the_pools_all_get_it(
    redlock_servers: tuple[ServerProcess, ...], proxies: list[FaultProxy]
) -> None:
    """120 acquirers of one process at once on pools of 30 connections per master
    (straight to the masters, flushed by ``proxies``: no proxy's CPU on a busy
    machine): they take turns at attempts (a quarter of the pool at a time), so
    none finds the pools exhausted (every one of them used to fail with QuorumError)."""
    clients = [
        redis.asyncio.Redis(port=server.port, socket_timeout=5, max_connections=30)
        for server in redlock_servers
    ]
    held: list[int] = []
    holding = [0]

    async def take(index: int) -> None:
        lock = AsyncRedlock(clients, "burst-pools", timeout=10)
        assert await lock.acquire(blocking_timeout=60)
        holding[0] += 1
        assert holding[0] == 1
        held.append(index)
        holding[0] -= 1
        await lock.release()

    try:
        await gather(*(functools.partial(take, index) for index in range(120)))
        assert sorted(held) == list(range(120))
    finally:
        await _close(proxies, clients)


async def test_every_master_cut_off_fails_in_seconds_not_a_tenth_of_the_lease(
    masters: list[Any], proxies: list[FaultProxy]
) -> None:
    """The first attempt's wait for masters that all stay silent is bounded (1 s):
    a process cut off from every master is told in about 1.5 s (under 3 s on a
    busy machine), not a tenth of the lease (6 s here) per attempt."""
    lock = AsyncRedlock(masters, "cut-off", timeout=60)
    assert await lock.acquire()  # connections made: the silence is not connecting
    await lock.release()
    for proxy in proxies:
        proxy.blackhole()
    started = time.monotonic()
    with pytest.raises(QuorumError) as caught:
        await lock.acquire()
    assert time.monotonic() - started < 3.0
    assert caught.value.answered == 0


async def test_every_master_cut_off_still_ends_a_wait_by_its_blocking_timeout(
    masters: list[Any], proxies: list[FaultProxy]
) -> None:
    """The first attempt's longer wait for silent masters stops at the deadline."""
    lock = AsyncRedlock(masters, "cut-off-deadline", timeout=60)
    assert await lock.acquire()
    await lock.release()
    for proxy in proxies:
        proxy.blackhole()
    started = time.monotonic()
    assert not await lock.acquire(blocking_timeout=0.3)
    assert time.monotonic() - started < 0.8


async def test_a_release_waits_for_masters_slower_than_master_timeout(
    masters: list[Any], proxies: list[FaultProxy], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    lock = AsyncRedlock(masters, "unhurried", timeout=5)
    assert await lock.acquire()  # once before the fault: its scripts are loaded on
    await lock.release()  # every master (a first call is three round trips)
    assert await lock.acquire()
    for proxy in proxies[1:]:  # a quorum answers, but only after master_timeout
        proxy.set_latency(0.25)
    started = time.monotonic()
    await lock.release()  # nothing runs out while a release waits: no QuorumError
    assert 0.25 < time.monotonic() - started < 1.0
    # The third master's release lands once its latency (and a busy machine) allow.
    await eventually(
        lambda: [owner_of(server, "unhurried") for server in redlock_servers] == [None] * 3,
        3,
        "the release on every master",
    )


async def test_a_slow_master_does_not_slow_acquisition(
    masters: list[Any], proxies: list[FaultProxy], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    lock = AsyncRedlock(masters, "slow", timeout=5)
    assert await lock.acquire()  # connections made before the fault
    await lock.release()
    proxies[2].set_latency(0.5)
    took = []
    for _ in range(5):
        started = time.monotonic()
        assert await lock.acquire()
        took.append(time.monotonic() - started)
        await lock.release()
    took.sort()
    assert took[2] < 0.3  # the two fast masters' time, not the slow one's 500 ms
    proxies[2].set_latency(0)
    # The slow master's late grants were given back (or released): nobody holds it there.
    await eventually(lambda: owner_of(redlock_servers[2], "slow") is None, 8, "the give-back")


async def test_extend_needs_a_quorum_and_a_lost_hold_is_reported(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    lock = AsyncRedlock(masters, "extend", timeout=5)
    assert await lock.acquire()
    await eventually(lambda: held_everywhere(redlock_servers, "extend"), 5, "the grant everywhere")
    assert await lock.extend(5)

    def extended_everywhere() -> bool:
        for server in redlock_servers:
            with direct(server) as client:
                if client.pttl("tenure:redlock:{extend}") <= 5_000:
                    return False
        return True

    await eventually(extended_everywhere, 4, "the extension on every master")
    for server in redlock_servers[:2]:  # gone on a majority
        with direct(server) as client:
            client.delete("tenure:redlock:{extend}")
    with pytest.raises(LockNotOwnedError):
        await lock.extend(1)
    assert lock.lost


async def test_extend_asks_a_master_only_slow_to_answer_again(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...], proxies: list[FaultProxy]
) -> None:
    """One master refuses (its key is gone), one answers slower than
    master_timeout: the slow one's answer decides, not a QuorumError."""
    lock = AsyncRedlock(masters, "slow-extend", timeout=10)
    began = time.monotonic()
    assert await lock.acquire()
    await eventually(
        lambda: held_everywhere(redlock_servers, "slow-extend"), 5, "the grant everywhere"
    )
    with direct(redlock_servers[1]) as client:
        client.delete("tenure:redlock:{slow-extend}")
    proxies[0].set_latency(0.3)  # three times master_timeout
    assert await lock.extend(5)
    # Under load a late grant of the acquisition can make the deleted key whole
    # again: the quorum is then the two others, and the slow master's addition
    # lands a moment after extend() returned (see the test below).
    await eventually(
        lambda: _pttl(redlock_servers[0], "slow-extend") > 10_000, 5, "the slow one's addition"
    )
    left = _pttl(redlock_servers[0], "slow-extend")
    # Added once, however long the asking took: the lease ends 15 s after the
    # acquire ran (at or after ``began``), not 10 (never added) or 20 (twice).
    elapsed_ms = (time.monotonic() - began) * 1000
    assert 15_000 - elapsed_ms <= left <= 15_000
    proxies[0].set_latency(0)
    await lock.release()


async def test_renewals_need_a_quorum_and_loss_is_told(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...], proxies: list[FaultProxy]
) -> None:
    told: list[float] = []
    lease = 1.5  # (a busy machine may stall a renewal by a few tenths of a second)
    lock = AsyncRedlock(
        masters,
        "renewed",
        timeout=lease,
        auto_renew=True,
        on_lost=lambda _lock: told.append(time.monotonic()),
    )
    with pytest.raises(LockLostError):
        async with lock:
            proxies[0].blackhole()  # one master gone: renewals go on with the other two
            taken = time.monotonic()
            await eventually(lambda: lock.statistics().renewals >= 4, 5, "four renewals")
            assert time.monotonic() - taken > lease  # past the lease: renewed
            assert await lock.owned()
            proxies[0].clear()
            renewed = lock.statistics().renewals
            await eventually(
                lambda: lock.statistics().renewals > renewed, 5, "a renewal with master 0 back"
            )
            cut = time.monotonic()
            for server in redlock_servers[1:]:  # gone on a majority: the next renewal is refused
                with direct(server) as client:
                    client.delete("tenure:redlock:{renewed}")
            await eventually(lambda: bool(told), 5, "the loss being told")
            # Told at the next renewal (a third of the lease), plus what a busy
            # machine may delay a timer by: well before the lease would end.
            assert told and told[0] - cut < lease * 2 / 3
            assert lock.lost


async def test_a_hold_no_quorum_confirms_is_lost_when_its_validity_ends(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...], proxies: list[FaultProxy]
) -> None:
    told: list[float] = []
    lease = 1.5  # (a busy machine may stall a renewal by a few tenths of a second)
    lock = AsyncRedlock(
        masters,
        "unconfirmed",
        timeout=lease,
        auto_renew=True,
        on_lost=lambda _lock: told.append(time.monotonic()),
    )
    assert await lock.acquire()
    await eventually(lambda: lock.statistics().renewals >= 1, 5, "a first renewal")
    # One master cut off, one that lost the key: renewals reach one master, and
    # nobody can say whether the cut-off one still holds it.
    proxies[0].blackhole()
    with direct(redlock_servers[1]) as client:
        client.delete("tenure:redlock:{unconfirmed}")
    cut = time.monotonic()
    await sleep(0.1)  # the window under test: within the last renewal's validity
    assert not lock.lost
    await eventually(lambda: bool(told), lease + 5, "the loss being told")
    # Told when the last renewal's validity ends, less than a lease after the
    # cut (plus what a busy machine may delay a timer by).
    assert told and told[0] - cut < lease + 0.5
    assert lock.statistics().lost == 1
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_fences_grow_when_the_masters_counters_differ(
    masters: list[Any],
    other_masters: list[Any],
    redlock_servers: tuple[ServerProcess, ...],
    proxies: list[FaultProxy],
) -> None:
    fence_key = "tenure:redlock:{fenced}:fence"
    lock = AsyncRedlock(masters, "fenced", timeout=5)
    for _ in range(3):  # on every master (acquire and release return at a quorum)
        assert await lock.acquire()
        await eventually(lambda: held_everywhere(redlock_servers, "fenced"), 5, "the grant")
        await lock.release()
        await eventually(
            lambda: all(owner_of(server, "fenced") is None for server in redlock_servers),
            5,
            "the release on every master",
        )
    # Master 0 loses its counter (say, a restart without persistence): it starts
    # again from its clock in microseconds, above the other two. Master 2 is
    # slow, so the next quorum is masters 0 and 1.
    with direct(redlock_servers[0]) as client:
        client.delete(fence_key)
    proxies[2].set_latency(0.3)
    with direct(redlock_servers[1]) as client:
        before = int(client.get(fence_key))
    assert await lock.acquire()
    high = lock.fencing_token
    assert high is not None and high > before + 1
    with direct(redlock_servers[0]) as client:
        assert int(client.get(fence_key)) == high
    with direct(redlock_servers[1]) as client:
        assert int(client.get(fence_key)) == high  # raised to it before the grant counted
    await lock.release()
    # Master 0 goes away; the next holder's quorum is masters 1 and 2.
    proxies[0].blackhole()
    proxies[2].set_latency(0)
    # Master 2's late calls are answered: the release lands there too.
    await eventually(lambda: owner_of(redlock_servers[2], "fenced") is None, 5, "master 2 freed")
    other = AsyncRedlock(other_masters, "fenced", timeout=5)
    assert await other.acquire()
    assert other.fencing_token is not None and other.fencing_token > high
    await other.release()


async def test_a_late_grant_of_a_failed_attempt_is_given_back(
    masters: list[Any],
    other_masters: list[Any],
    redlock_servers: tuple[ServerProcess, ...],
    proxies: list[FaultProxy],
) -> None:
    holder = AsyncRedlock(masters, "late", timeout=60)  # outlives even the lease's end below
    assert await holder.acquire()
    await eventually(lambda: held_everywhere(redlock_servers, "late"), 5, "the grant everywhere")
    # Master 2 loses the hold and answers slowly: an attempt is refused by the
    # fast two, and master 2's grant comes after the attempt failed.
    with direct(redlock_servers[2]) as client:
        client.delete("tenure:redlock:{late}")
    other = AsyncRedlock(other_masters, "late", timeout=10)
    assert await other.locked()
    proxies[2].set_latency(0.3)
    assert not await other.acquire(blocking=False)
    # Master 2's grant lands late and is given back, or the give-back lands
    # first and the late call then takes nothing (its receipt refuses it):
    # either way master 2 is free once both calls are in. (A busy machine
    # answers late: the give-back is asked again for up to 5 s; on a machine too
    # busy for that, master 2 is free at the end of the late grant's 10 s lease.)
    await eventually(lambda: owner_of(redlock_servers[2], "late") is None, 15, "the give-back")
    await holder.release()


async def test_an_earlier_attempt_arriving_late_cannot_take_a_later_attempts_grant(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    """Attempt 2 took a master; attempt 1's acquire, delayed on the way, lands
    after it, and then attempt 1's give-back: the grant stays attempt 2's."""
    lock = AsyncRedlock(masters, "late-attempt", timeout=10)
    keys = (*lock.keys.queued, *lock.keys.receipts)
    run = registry_for(masters[0]).run

    def acquire(attempt: str) -> tuple[str | int, ...]:
        return ("tok", 10_000, 0, 1, "", 60_000, attempt, "me", "")

    assert (await run("redlock_acquire", keys, acquire("2")))[0] == 1
    assert (await run("redlock_acquire", keys, acquire("1")))[0] == 1  # late: ours already
    release_keys = (*keys[:4], *lock.keys.receipts)
    given_back = await run("redlock_release", release_keys, ("tok", "leave", "1", 60_000, ""))
    assert given_back == 0  # attempt 1's give-back releases nothing
    assert owner_of(redlock_servers[0], "late-attempt") == "tok"
    released = await run("redlock_release", release_keys, ("tok", "leave", "", 60_000, ""))
    assert released == 1


async def test_an_attempt_given_back_before_its_acquire_arrives_takes_nothing(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    """A failed attempt gives back to masters that did not answer; the give-back
    may land before the acquire (delayed on the way, or resent by the client):
    the acquire then takes nothing, and a later attempt of the token still can."""
    lock = AsyncRedlock(masters, "given-back-first", timeout=10)
    keys = (*lock.keys.queued, *lock.keys.receipts)
    release_keys = (*lock.keys.queued[:4], *lock.keys.receipts)
    run = registry_for(masters[0]).run

    def acquire(attempt: str) -> tuple[str | int, ...]:
        return ("tok", 10_000, 0, 1, "", 60_000, attempt, "me", "")

    assert await run("redlock_release", release_keys, ("tok", "leave", "1", 60_000, "")) == 0
    assert await run("redlock_release", release_keys, ("tok", "leave", "1", 60_000, "")) == 0
    refused = await run("redlock_acquire", keys, acquire("1"))
    assert refused[0] == 0
    assert owner_of(redlock_servers[0], "given-back-first") is None
    assert (await run("redlock_acquire", keys, acquire("2")))[0] == 1
    assert owner_of(redlock_servers[0], "given-back-first") == "tok"
    assert await run("redlock_release", release_keys, ("tok", "leave", "", 60_000, "")) == 1


async def test_a_given_back_attempt_does_not_take_over_an_earlier_attempts_grant(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    """Attempt 1 took a master; attempt 2's give-back lands before attempt 2's
    acquire (both delayed on the way), then attempt 1's give-back: the master
    is free (attempt 2's late acquire did not mark the grant as its own)."""
    lock = AsyncRedlock(masters, "taken-over", timeout=10)
    keys = (*lock.keys.queued, *lock.keys.receipts)
    release_keys = (*lock.keys.queued[:4], *lock.keys.receipts)
    run = registry_for(masters[0]).run

    def acquire(attempt: str) -> tuple[str | int, ...]:
        return ("tok", 10_000, 0, 1, "", 60_000, attempt, "me", "")

    assert (await run("redlock_acquire", keys, acquire("1")))[0] == 1
    assert await run("redlock_release", release_keys, ("tok", "leave", "2", 60_000, "")) == 0
    assert (await run("redlock_acquire", keys, acquire("2")))[0] == 0  # given back already
    assert await run("redlock_release", release_keys, ("tok", "leave", "1", 60_000, "")) == 1
    assert owner_of(redlock_servers[0], "taken-over") is None


async def test_contenders_all_get_their_turn(masters: list[Any], proxies: list[FaultProxy]) -> None:
    extra = [await _clients(proxies) for _ in range(3)]
    inside: list[int] = []
    overlaps = 0
    counts = [0, 0, 0]

    async def worker(index: int) -> None:
        nonlocal overlaps
        lock = AsyncRedlock(extra[index], "turns", timeout=5, blocking_timeout=10)
        for _ in range(15):
            assert await lock.acquire()
            inside.append(index)
            if len(inside) > 1:
                overlaps += 1
            await sleep(0.002)
            inside.remove(index)
            counts[index] += 1
            await lock.release()

    await gather(*(functools.partial(worker, i) for i in range(3)))
    assert overlaps == 0
    assert counts == [15, 15, 15]
    for clients in extra:
        for client in clients:
            await client.aclose()


async def test_a_plain_lock_and_a_redlock_do_not_share_keys(masters: list[Any]) -> None:
    lock = AsyncLock(masters[0], "shared-name")
    redlock = AsyncRedlock(masters, "shared-name")
    assert await lock.acquire()
    assert await redlock.acquire(blocking=False)
    await redlock.release()
    await lock.release()


async def test_a_lease_too_short_for_its_masters_is_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """A lease whose tenth is less than a round trip: refused, not blamed on the masters."""
    for lease in (0.005, 0.049):
        with pytest.raises(ArgumentError, match=r"^timeout: .* too short for a Redlock"):
            AsyncRedlock([tenure_async_client], "short", timeout=lease)
    lock = AsyncRedlock([tenure_async_client], "short", timeout=0.05)
    with pytest.raises(ArgumentError, match=r"^timeout: .* too short for a Redlock"):
        lock.timeout = 0.01
    assert lock.timeout == 0.05


def _pttl(server: ServerProcess, name: str) -> int:
    with direct(server) as client:
        return int(client.pttl(f"tenure:redlock:{{{name}}}"))


async def test_an_extend_a_quorum_decided_leaves_a_slow_master_to_catch_up(
    masters: list[Any], redlock_servers: tuple[ServerProcess, ...], proxies: list[FaultProxy]
) -> None:
    """extend() returns once a quorum extended the lease: a Redlock holds while a quorum
    does. A master slower than that (here 0.3 s behind its proxy; under load, any) may
    not have the addition yet when extend() returns; its call is on its way and adds
    the time once when it lands (a resent addition adds nothing)."""
    lock = AsyncRedlock(masters, "catch-up", timeout=10)
    assert await lock.acquire()
    await eventually(lambda: held_everywhere(redlock_servers, "catch-up"), 5, "the grant")
    proxies[0].set_latency(0.3)
    assert await lock.extend(5)
    for server in redlock_servers[1:]:  # the quorum that decided
        assert _pttl(server, "catch-up") > 10_000
    await eventually(
        lambda: _pttl(redlock_servers[0], "catch-up") > 10_000, 5, "the slow master's addition"
    )
    assert _pttl(redlock_servers[0], "catch-up") <= 15_000  # added once
    proxies[0].set_latency(0)
    await lock.release()


async def test_owned_and_locked_do_not_wait_for_a_dead_master(proxies: list[FaultProxy]) -> None:
    """With redis-py's default retry, a dead master answers only after its backoff (about
    a second): owned() and locked() return once the others decide."""
    clients = [redis.asyncio.Redis(host=p.host, port=p.port) for p in proxies]  # default Retry
    try:
        lock = AsyncRedlock(clients, "dead-master", timeout=10)
        assert await lock.acquire()
        proxies[2].reset_connections()
        proxies[2].refuse_connections()  # dead: its connections refused
        for check in (lock.owned, lock.locked):
            started = time.monotonic()
            assert await check()
            assert time.monotonic() - started < 0.5
        other = AsyncRedlock(clients[1:] + clients[:1], "dead-master", timeout=10)
        started = time.monotonic()
        assert not await other.owned()  # decided without asking anyone: it holds nothing
        assert await other.locked()
        assert time.monotonic() - started < 0.5
        proxies[2].refuse_connections(None)
        await lock.release()
    finally:
        await _close(proxies, clients)


async def test_a_waiter_that_gave_up_on_unreachable_masters_leaves_their_lines(
    masters: list[Any], proxies: list[FaultProxy]
) -> None:
    """Two masters cut off while a waiter waits: it gives up (QuorumError, or False at its
    deadline) and its place in their lines is taken out once they answer again -- not
    left first in line while this process's other waiters keep its waiter lease alive."""
    holder = AsyncRedlock(masters, "gave-up", timeout=10, thread_local=False)
    assert await holder.acquire()
    waiter = AsyncRedlock(masters, "gave-up", timeout=10)
    waiting = spawn(lambda: waiter.acquire(blocking_timeout=0.6))
    await sleep(0.2)  # a fault under test: the masters are cut off while it waits
    proxies[0].blackhole()
    proxies[1].blackhole()
    try:
        await join(waiting)
    except QuorumError:
        pass
    for proxy in proxies[:2]:
        proxy.clear()
    await holder.release()
    fresh = AsyncRedlock(masters, "gave-up", timeout=10)
    assert await fresh.acquire(blocking_timeout=10)  # not behind the waiter that left
    await fresh.release()
    await calls_settled(30)


async def test_a_second_owner_of_a_chosen_token_is_refused_and_takes_nothing_back(
    masters: list[Any], other_masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    """Two Redlocks acquiring with ``token="worker-1"``: one holds; the other's attempts,
    and the give-backs of its attempts when it gives up, leave that hold alone."""
    first = AsyncRedlock(masters, "chosen", timeout=10)
    second = AsyncRedlock(other_masters, "chosen", timeout=10)
    assert await first.acquire(token="worker-1")
    fence = first.fencing_token
    await eventually(lambda: held_everywhere(redlock_servers, "chosen"), 5, "held everywhere")
    assert not await second.acquire(blocking=False, token="worker-1")
    assert not await second.acquire(blocking_timeout=0.3, token="worker-1")
    await calls_settled(30)  # its give-backs, in the background too, have all landed
    assert held_everywhere(redlock_servers, "chosen")
    assert await first.owned() and first.fencing_token == fence
    assert not await second.owned()
    await first.extend(1)  # still this owner's on a quorum
    await first.release()
    assert await second.acquire(blocking=False, token="worker-1")
    assert second.fencing_token is not None and fence is not None
    assert second.fencing_token > fence
    await second.release()


async def test_a_waiter_whose_minority_master_is_paused_leaves_by_its_deadline(
    masters: list[Any], other_masters: list[Any], redlock_servers: tuple[ServerProcess, ...]
) -> None:
    """Refused by the holder's quorum while one master is paused (its earlier calls
    still hanging there): the waiter leaves the lines by its deadline, the paused
    master told in the background (it took 6 s: a patient give-back)."""
    earlier = AsyncRedlock(masters, "paused-minority", timeout=5)
    redlock_servers[0].pause()
    try:
        assert await earlier.acquire(blocking_timeout=1.0)  # a quorum without master 0
    finally:
        redlock_servers[0].resume()
    await earlier.release()
    holder = AsyncRedlock(other_masters, "paused-minority", timeout=5)
    assert await holder.acquire()
    waiter = AsyncRedlock(masters, "paused-minority", timeout=5)
    redlock_servers[0].pause()
    try:
        with starvation() as starved:
            started = time.monotonic()
            assert not await waiter.acquire(blocking_timeout=1.0)
            took = time.monotonic() - started
    finally:
        redlock_servers[0].resume()
    assert took <= 1.0 + 0.6 + starved.seconds, (took, starved)
    await calls_settled(30)
    await holder.release()


async def test_an_owner_whose_lease_ran_out_cannot_touch_the_next_hold_of_its_token(
    masters: list[Any], other_masters: list[Any]
) -> None:
    """Two Redlocks chose one token; the first's lease ran out and the second holds it:
    the first one's owned() is False, its extend() and release() are refused (each
    master keeps the acquire call's id beside a chosen token), the second's hold kept."""
    # A 1.5 s lease: its masters get a tenth of it to answer (a 0.5 s lease's
    # 0.05 s was missed by all three on a starved CI worker).
    first = AsyncRedlock(masters, "stale-owner", timeout=1.5)
    second = AsyncRedlock(other_masters, "stale-owner", timeout=10)
    assert await first.acquire(token="worker-1")
    assert await second.acquire(token="worker-1", blocking_timeout=5)  # once it ran out
    assert not await first.owned()
    with pytest.raises(LockNotOwnedError):
        await first.extend(5)
    with pytest.raises(LockNotOwnedError):
        await first.release()
    assert await second.owned()
    await second.release()
