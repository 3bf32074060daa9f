"""Lock under real faults: many processes, SIGSTOP, kill -9, dead waiters.

Each test runs twice: with worker processes using the sync ``Lock`` and with
workers using ``AsyncLock`` (tests/_async/workers.py and its generated twin).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from tenure import ConnectionLock, FencedKey, Lock, Semaphore
from tenure.server import ServerProcess
from tenure.server._procfs import proc_state
from tests.conftest import wait_for, wait_server_past

ROOT = Path(__file__).resolve().parent.parent
LEASE = 1.0
SLACK = 0.1  # the bound: lease + 100 ms

pytestmark = pytest.mark.slow


class Worker:
    """A worker process speaking JSON lines."""

    def __init__(self, api: str, *args: str) -> None:
        module = f"tests._{api}.workers"
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def read(self, timeout: float = 30.0) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"worker {self.pid} said nothing in {timeout}s"
        line = self.process.stdout.readline()
        assert line, f"worker {self.pid} exited (code {self.process.poll()})"
        event: dict[str, Any] = json.loads(line)
        return event

    def send(self, line: str = "go") -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


@pytest.fixture
def client(tenure_server: ServerProcess) -> Iterator[redis.Redis]:
    client = tenure_server.client()
    client.flushall()
    yield client
    client.close()


def test_mutual_exclusion_from_histories(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    processes, count = 32, 100
    for _ in range(processes):
        workers.append(Worker(api, "history", tenure_server.url, "history", str(count)))
    windows: list[tuple[float, float]] = []
    for worker in workers:
        assert worker.read(60)["event"] == "ready"
    for worker in workers:
        report = worker.read(120)
        assert report["event"] == "done"
        windows.extend((start, end) for start, end in report["windows"])
    assert len(windows) == processes * count
    windows.sort()
    overlaps = [(a, b) for a, b in itertools.pairwise(windows) if b[0] < a[1]]
    assert overlaps == []
    # The racy read-modify-write inside the lock lost nothing either.
    assert int(client.get("history:counter") or 0) == processes * count


def test_read_write_exclusion_from_histories(
    api: str, tenure_server: ServerProcess, workers: list[Worker]
) -> None:
    """Eight processes read (3 in 4) or write (1 in 4): no writer overlaps anyone."""
    processes, count = 8, 60
    for _ in range(processes):
        workers.append(Worker(api, "rw", tenure_server.url, "catalog", str(count)))
    for worker in workers:
        assert worker.read(60)["event"] == "ready"
    windows: list[tuple[float, float, str]] = []
    for worker in workers:
        report = worker.read(120)
        assert report["event"] == "done"
        windows.extend((start, end, mode) for start, end, mode in report["windows"])
    assert len(windows) == processes * count
    writes = [w for w in windows if w[2] == "write"]
    reads = [w for w in windows if w[2] == "read"]
    assert writes and reads
    clashes = [
        (w, other)
        for w in writes
        for other in windows
        if other is not w and other[0] < w[1] and w[0] < other[1]
    ]
    assert clashes == []  # a writer is alone: no reader, no other writer
    reads.sort()
    shared = sum(1 for a, b in itertools.pairwise(reads) if b[0] < a[1])
    assert shared > 0  # readers did hold it together


def test_stopped_holder_loses_the_lock_and_its_write(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    holder = Worker(api, "hold", tenure_server.url, "paused", str(LEASE))
    workers.append(holder)
    first = holder.read()
    assert first["event"] == "acquired"
    os.kill(holder.pid, signal.SIGSTOP)
    stopped = time.monotonic()

    lock = Lock(client, "paused", timeout=10)
    assert lock.acquire(blocking_timeout=5)
    taken = time.monotonic()
    # The last renewal happened before the stop: the lease ran out within LEASE of it.
    assert taken - stopped <= LEASE + SLACK
    assert lock.fencing_token is not None
    assert lock.fencing_token > first["fence"]
    data = FencedKey(client, "paused:data")
    # The new owner's value expires before the paused holder resumes: its fence must not.
    assert data.write("new owner", lock.fencing_token, ttl=0.2)
    wait_for(lambda: data.read() == (None, None), 5, "the new owner's value expiring")

    os.kill(holder.pid, signal.SIGCONT)
    time.sleep(LEASE / 3 + 0.3)  # its watchdog renews, and finds the lock gone
    holder.send()
    after = holder.read()
    assert after == {"event": "after", "written": False, "release": "not owned", "lost": True}
    assert data.read() == (None, None)
    assert client.hget(data.fence_key, "fence") == str(lock.fencing_token).encode()
    lock.release()


def test_killed_holder_frees_the_lock_within_its_lease(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    holder = Worker(api, "hold", tenure_server.url, "killed", str(LEASE))
    workers.append(holder)
    assert holder.read()["event"] == "acquired"
    waiter = Worker(api, "wait", tenure_server.url, "killed", "10")
    workers.append(waiter)
    assert waiter.read()["event"] == "waiting"
    time.sleep(1.5 * LEASE)  # renewed a few times while the waiter waits
    assert client.exists("tenure:lock:{killed}")
    os.kill(holder.pid, signal.SIGKILL)
    killed = time.monotonic()
    got = waiter.read()
    assert got["event"] == "acquired"
    assert got["t"] - killed <= LEASE + SLACK


def _queue_length(client: redis.Redis, name: str) -> int:
    return int(client.zcard(f"tenure:lock:{{{name}}}:queue"))


def _queue_up(
    api: str, server: ServerProcess, client: redis.Redis, workers: list[Worker], name: str, n: int
) -> list[Worker]:
    queued = []
    for i in range(n):
        worker = Worker(api, "wait", server.url, name, "30")
        workers.append(worker)
        queued.append(worker)
        assert worker.read()["event"] == "waiting"
        _wait_for_queue(client, name, i + 1)
    return queued


def test_fifo_order_of_eight_processes(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    holder = Lock(client, "fifo8")
    assert holder.acquire()
    queued = _queue_up(api, tenure_server, client, workers, "fifo8", 8)
    holder.release()
    times = [worker.read()["t"] for worker in queued]
    assert times == sorted(times)


@pytest.mark.parametrize("purged", [False, True], ids=["dies-at-the-head", "purged-first"])
def test_dead_waiter_stalls_the_queue_at_most_the_handoff_lease(
    api: str,
    purged: bool,
    tenure_server: ServerProcess,
    client: redis.Redis,
    workers: list[Worker],
) -> None:
    holder = Lock(client, "dead-waiter")
    assert holder.acquire()
    first, second, third = _queue_up(api, tenure_server, client, workers, "dead-waiter", 3)
    (dead,) = cast("list[bytes]", client.zrange(holder.keys.queue, 0, 0))  # first in line
    os.kill(first.pid, signal.SIGKILL)
    first.process.wait(timeout=10)
    if purged:  # its waiter lease (2 s) ran out: the dead waiter is purged by the release
        expiry = _waiter_lease(client, "dead-waiter", token=dead)
        wait_server_past(client, expiry, 10, "the dead waiter's 2 s waiter lease")
    released = time.monotonic()
    holder.release()
    second_at = second.read()["t"]
    third_at = third.read()["t"]
    bound = SLACK if purged else 1.0 + SLACK  # handoff_lease once, or nothing
    assert second_at - released <= bound
    assert third_at - second_at <= SLACK


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until every thread of it is stopped.

    kill() returns before a thread running on another core has stopped: on a
    busy machine the waiter could still read a grant made just after, in
    time, and be stopped only then (the documented "seen in time, then
    stalled" case, not the fault under test).
    """
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:  # every thread: /proc/<tid>/stat reads as a process's does
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return all(proc_state(int(task.name)) in ("t", "T") for task in tasks)

    wait_for(stopped, 5, "the process stopped")


def _held_with_a_stall_waiter(
    api: str, server: ServerProcess, client: redis.Redis, workers: list[Worker], name: str
) -> tuple[Lock, Worker]:
    """A lock held here, and a "stall" worker waiting for it (in line, or about to be)."""
    holder = Lock(client, name)
    assert holder.acquire()
    waiter = Worker(api, "stall", server.url, name, "30")
    workers.append(waiter)
    assert waiter.read()["event"] == "waiting"
    return holder, waiter


def _a_later_grant_than(busy: Worker, got: dict[str, Any], fence: int) -> None:
    """``busy``'s acquire() returned a grant made after ``fence``, never the lapsed one.

    It then held the lock when it looked (every grant is confirmed, on the full
    lease, before acquire() returns).
    """
    assert got["event"] == "acquired"
    assert got["fence"] > fence, "acquire() returned the grant that had lapsed"
    after = busy.read()
    if got["server_fence"] == got["fence"]:
        assert after == {"event": "released", "kept": True, "lost": False}
    else:
        assert after["event"] == "released" and not after["kept"]


def test_a_busy_waiter_is_never_handed_a_lock_that_is_gone(
    api: str,
    tenure_server: ServerProcess,
    client: redis.Redis,
    workers: list[Worker],
) -> None:
    """The waiter handed the lock is busy 1.6 s (its event loop blocked, or its
    process stopped): its 1 s handoff lease runs out, the waiter behind it takes
    the lock; the busy one must not then return from acquire() with a hold that
    is gone. It waits again and gets the lock after the other's release.
    """
    name = "busy-waiter"
    holder, busy = _held_with_a_stall_waiter(api, tenure_server, client, workers, name)
    _wait_for_queue(client, name, 1)
    third = Worker(api, "wait", tenure_server.url, name, "30")
    workers.append(third)
    assert third.read()["event"] == "waiting"
    _wait_for_queue(client, name, 2)
    if api == "async":
        busy.send("block 1.6")
        assert busy.read()["event"] == "blocking"
        released = time.monotonic()
        holder.release()
    else:
        busy.send("go")  # its main thread only joins the thread that waits
        _stop(busy.pid)
        released = time.monotonic()
        holder.release()
        time.sleep(1.6)  # stopped as long as the async worker's blocked loop: the fault
        os.kill(busy.pid, signal.SIGCONT)
    taken = third.read()
    assert taken["event"] == "acquired"
    assert taken["t"] - released <= 1.0 + SLACK  # a busy waiter stalls the line one handoff lease
    got = busy.read()
    assert got["t"] > taken["t"]
    _a_later_grant_than(busy, got, taken["fence"])


def test_a_new_owner_stopped_right_after_a_handoff_keeps_the_lock(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    """Handed the lock, the new owner is stopped as soon as acquire() returned, for
    longer than the 1 s handoff lease: its hold was confirmed (full lease) before
    acquire() returned, so it is kept; nobody else got the lock meanwhile."""
    name = "stopped-new-owner"
    holder, owner = _held_with_a_stall_waiter(api, tenure_server, client, workers, name)
    owner.send("hold 2.5")
    _wait_for_queue(client, name, 1)
    holder.release()  # handed to the worker
    got = owner.read()
    _stop(owner.pid)  # at once: its watchdog has had no time to run
    assert got["event"] == "acquired"
    stopped = time.monotonic()
    wait_for(lambda: time.monotonic() - stopped >= 1.6, 5, "a stop past the handoff lease")
    assert client.hget(holder.keys.owner, "fence") == str(got["fence"]).encode()
    newcomer = Lock(client, name)
    assert not newcomer.acquire(blocking=False)
    os.kill(owner.pid, signal.SIGCONT)
    after = owner.read()
    assert after == {"event": "released", "kept": True, "lost": False}


def test_a_grant_that_lapsed_while_its_waiter_was_stopped_is_not_taken(
    api: str,
    tenure_server: ServerProcess,
    client: redis.Redis,
    workers: list[Worker],
) -> None:
    """The only waiter is stopped (or its event loop blocked) when the lock is handed
    to it; its 1 s handoff lease runs out and a newcomer takes the lock and keeps it.
    Resumed, the waiter asks the server again (its wait timed out meanwhile) and
    only then reads the old grant: it must not return from acquire() with it, but
    wait for the newcomer's release.
    """
    name = "stopped-waiter"
    holder, busy = _held_with_a_stall_waiter(api, tenure_server, client, workers, name)
    _wait_for_queue(client, name, 1)
    if api == "async":
        busy.send("block 2.2")
        assert busy.read()["event"] == "blocking"
    else:
        busy.send("go")  # its main thread only joins the thread that waits
        _stop(busy.pid)
    holder.release()  # handed to the stopped waiter
    wait_for(lambda: not client.exists(holder.keys.owner), 10, "its handoff lease (1 s) ran out")
    newcomer = Lock(client, name, timeout=30)
    assert newcomer.acquire(blocking=False)
    if api == "sync":
        time.sleep(0.9)  # stopped on, as the async worker's loop stays blocked: the fault
        os.kill(busy.pid, signal.SIGCONT)
    fence = newcomer.fencing_token
    assert fence is not None
    stdout = busy.process.stdout
    assert stdout is not None
    assert not select.select([stdout], [], [], 2.0)[0], busy.read()  # it waits on
    assert newcomer.owned()
    newcomer.release()
    _a_later_grant_than(busy, busy.read(), fence)


@pytest.mark.parametrize("purged", [False, True], ids=["dies-at-the-head", "purged-first"])
def test_a_dead_process_with_many_waiters_stalls_the_queue_at_most_the_handoff_lease(
    api: str,
    purged: bool,
    tenure_server: ServerProcess,
    client: redis.Redis,
    workers: list[Worker],
) -> None:
    """Five waiters of one process (one line, one waiter lease for all of them)
    die together: the waiter behind them is held up one handoff lease at most
    (released at once: the first dead one is handed the lock), or not at all
    (released after their 0.5 s waiter lease ran out: all five are dropped)."""
    name = "dead-crowd"
    holder, crowd, behind = _crowd_then_one(api, tenure_server, client, workers, name, 5)
    os.kill(crowd.pid, signal.SIGKILL)
    crowd.process.wait(timeout=10)
    if purged:
        expiry = _waiter_lease(client, name, waiters=5)
        wait_server_past(client, expiry, 10, "the dead crowd's 0.5 s waiter lease")
    released = time.monotonic()
    holder.release()
    taken = behind.read()
    assert taken["event"] == "acquired"
    bound = SLACK if purged else 1.0 + SLACK
    assert taken["t"] - released <= bound


def test_a_stopped_process_waits_again_behind_those_who_stayed(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    """A process stopped longer than its waiter lease loses its waiters' places
    (they stall nobody); when it resumes, its line joins them again, behind."""
    name = "stopped-crowd"
    holder, crowd, behind = _crowd_then_one(api, tenure_server, client, workers, name, 3)
    os.kill(crowd.pid, signal.SIGSTOP)
    wait_server_past(
        client, _waiter_lease(client, name, waiters=3), 10, "the crowd's 0.5 s waiter lease"
    )
    released = time.monotonic()
    holder.release()
    taken = behind.read()
    assert taken["event"] == "acquired"
    assert taken["t"] - released <= SLACK
    os.kill(crowd.pid, signal.SIGCONT)
    got = [crowd.read(timeout=15) for _ in range(3)]
    assert [event["event"] for event in got] == ["acquired"] * 3
    assert min(event["t"] for event in got) > taken["t"]
    assert len({event["fence"] for event in got}) == 3


def _crowd_then_one(
    api: str,
    server: ServerProcess,
    client: redis.Redis,
    workers: list[Worker],
    name: str,
    count: int,
) -> tuple[Lock, Worker, Worker]:
    """A held lock; ``count`` waiters of one process in line, then one of another behind."""
    holder = Lock(client, name)
    assert holder.acquire()
    crowd = Worker(api, "crowd", server.url, name, str(count))
    workers.append(crowd)
    assert crowd.read()["event"] == "waiting"
    (behind,) = _queue_up(api, server, client, workers, name, 1)
    _wait_for_queue(client, name, count + 1)
    return holder, crowd, behind


def _waiter_lease(
    client: redis.Redis, name: str, waiters: int = 0, token: bytes | None = None
) -> float:
    """The waiter lease's expiry (ms, server clock) of the process of waiter ``token``,
    or of the process with ``waiters`` in line."""
    keys = Lock(client, name).keys
    if token is not None:
        channel = client.hget(keys.wakes, token)
    else:
        channels = list(client.hvals(keys.wakes))
        (channel,) = {channel for channel in channels if channels.count(channel) == waiters}
    assert channel is not None
    expiry = client.zscore(keys.waiters, channel)
    assert expiry is not None
    return expiry


def _wait_for_queue(client: redis.Redis, name: str, length: int) -> None:
    wait_for(lambda: _queue_length(client, name) >= length, 10, f"{length} waiters in line")


def test_semaphore_holds_at_most_limit_under_kills_and_stops(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    limit, processes, count = 2, 8, 40
    for _ in range(processes):
        workers.append(Worker(api, "permits", tenure_server.url, "permits", str(count), str(limit)))
    for worker in workers:
        assert worker.read(60)["event"] == "ready"
    keys = Semaphore(client, "permits", limit=limit).keys
    wait_for(
        lambda: int(client.get(keys.fence) or 0) >= processes, 30, "the workers taking permits"
    )
    killed, stopped = random.sample(workers, 2)
    os.kill(killed.pid, signal.SIGKILL)
    os.kill(stopped.pid, signal.SIGSTOP)
    held = cast(list[tuple[bytes, float]], client.zrange(keys.owner, 0, -1, withscores=True))
    leases = [expiry for _, expiry in held]
    # Past the 1 s lease of every permit held now: the stopped process loses its own.
    wait_server_past(client, max(leases, default=0), 10, "the leases held at the stop")
    os.kill(stopped.pid, signal.SIGCONT)
    windows: list[dict[str, Any]] = []
    for worker in workers:
        if worker is killed:
            continue
        while True:
            event = worker.read(120)
            if event["event"] == "done":
                break
            if event["kept"]:
                windows.append(event)
    # Sweep the kept hold windows: never more than `limit` at once.
    edges = sorted(
        [(w["start"], 1, i) for i, w in enumerate(windows)]
        + [(w["end"], -1, i) for i, w in enumerate(windows)]
    )
    inside: set[int] = set()
    most = 0
    for _, step, index in edges:
        if step > 0:
            inside.add(index)
        else:
            inside.discard(index)
        most = max(most, len(inside))
        assert len(inside) <= limit, (
            f"{len(inside)} permits held at once (stopped: {stopped.pid}, killed: "
            f"{killed.pid}): {[windows[i] for i in sorted(inside)]}"
        )
    assert len(windows) >= (processes - 2) * count
    # The dead process's permit came back: its lease ran out, so both permits are
    # free (an expired entry may stay in the set until the next acquire purges it),
    # or will be within a handoff lease (1 s): the dead waiter, still in line, may
    # have been handed one by the last release.
    takers = [Semaphore(client, "permits", limit=limit, timeout=5) for _ in range(limit)]
    assert all(taker.acquire(blocking_timeout=5) for taker in takers)
    for taker in takers:
        taker.release()
    assert client.zcard("tenure:semaphore:{permits}") == 0


def test_a_grant_read_late_by_a_stopped_waiter_is_confirmed_not_trusted(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    """A permit handed to a waiter stopped past the handoff lease lapses; its
    wake-up message, read after SIGCONT, must not pass for a hold. (With the
    worker's 1 s lease as long as the handoff lease, such a grant was once
    taken at its word: the waiter held beside the permit's next owner.)"""
    name = "stale-grant"
    first = Semaphore(client, name, limit=1, timeout=10)
    keys = first.keys
    assert first.acquire()
    waiter = Worker(api, "permit", tenure_server.url, name, "1")
    workers.append(waiter)
    wait_for(lambda: int(client.zcard(keys.queue)) >= 1, 10, "the worker in line")
    os.kill(waiter.pid, signal.SIGSTOP)
    first.release()  # handed to the stopped waiter, on the 1 s handoff lease
    held = cast(list[tuple[bytes, float]], client.zrange(keys.owner, 0, -1, withscores=True))
    assert len(held) == 1
    wait_server_past(client, held[0][1], 10, "the handoff lease")
    second = Semaphore(client, name, limit=1, timeout=10)
    assert second.acquire(blocking=False)  # the lapsed grant is purged: free again
    os.kill(waiter.pid, signal.SIGCONT)
    time.sleep(1.5)  # the waiter reads its message late, asks the server, waits on
    released, fence = time.monotonic(), second.fencing_token
    second.release()
    event = waiter.read(30)
    assert event["event"] == "acquired"
    assert event["t"] >= released, "the waiter held while the permit was another's"
    assert fence is not None and event["fence"] > fence
    waiter.send()


def test_killed_holder_gives_its_permit_back_within_its_lease(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    holder = Worker(api, "permit", tenure_server.url, "reclaim", "1")
    workers.append(holder)
    assert holder.read()["event"] == "acquired"
    time.sleep(1.5 * LEASE)  # refreshed a few times
    waiter = Semaphore(client, "reclaim", limit=1, timeout=10)
    assert not waiter.acquire(blocking=False)
    os.kill(holder.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert waiter.acquire(blocking_timeout=5)
    assert time.monotonic() - killed <= LEASE + SLACK  # the issue allows lease + 1 s
    waiter.release()


def test_killed_connection_lock_holder_frees_it_within_a_second(
    api: str, tenure_server: ServerProcess, client: redis.Redis, workers: list[Worker]
) -> None:
    holder = Worker(api, "connlock", tenure_server.url, "booked", "-")
    workers.append(holder)
    assert holder.read()["event"] == "acquired"
    waiter = ConnectionLock(client, "booked")
    assert not waiter.acquire(blocking=False)
    os.kill(holder.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert waiter.acquire(blocking_timeout=5)
    assert time.monotonic() - killed < 1.0  # no lease to wait out
    waiter.release()
