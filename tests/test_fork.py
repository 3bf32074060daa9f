"""fork(): a child process inherits no hold, and its own locks work.

Pre-fork servers (gunicorn ``--preload``, ``multiprocessing`` with fork,
Celery prefork) fork a process that may hold locks. The child must hold
none of them: not owned, nothing to release, extend or renew (all without a
server call), while the parent keeps its hold, its renewals and its lost
notice. The child's own new holds wait in line, are woken and renewed like
any other. Real ``os.fork()``; each child reports through a pipe and every
wait is bounded, so a bug fails the test rather than hanging it.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tenure import (
    AsyncLock,
    ClusterLock,
    ConnectionLock,
    Lock,
    LockNotOwnedError,
    ReadWriteLock,
    Redlock,
    ReentrantLock,
    Semaphore,
    SemaphoreNotOwnedError,
)
from tenure.server import ServerProcess
from tests._backend_asyncio import until
from tests.conftest import wait_for

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()"),
    # Python 3.12+ warns about fork() in a process with threads (the watchdog's, say).
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
]

CHILD_TIMEOUT = 30.0


# -- a forked child that reports back ----------------------------------------


def _fork(job: Callable[[], Any]) -> tuple[int, int]:
    """Run ``job`` in a forked child; return its pid and the pipe its report comes on.

    The child writes ``{"ok": result}`` (JSON) or ``{"error": traceback}`` and
    leaves with ``os._exit``: no atexit handler, no pytest teardown runs there.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        code = 0
        try:
            report: dict[str, Any] = {"ok": job()}
        except BaseException:
            report = {"error": traceback.format_exc()}
            code = 1
        try:
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


def _collect(pid: int, read: int, timeout: float = CHILD_TIMEOUT) -> Any:
    """The child's result (its error fails the test); the child is killed past ``timeout``."""
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"the child did not finish within {timeout}s")
            ready, _, _ = select.select([read], [], [], left)
            if not ready:
                continue
            chunk = os.read(read, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read)
    _, status = os.waitpid(pid, 0)
    report = json.loads(data.decode()) if data else {"error": f"no report (status {status})"}
    if "error" in report:
        raise AssertionError(f"the child failed:\n{report['error']}")
    assert os.waitstatus_to_exitcode(status) == 0
    return report["ok"]


def _unreachable(client: redis.Redis) -> None:
    """Point ``client`` at a closed port (in the child only): any server call would fail."""
    client.connection_pool.connection_kwargs["port"] = 1
    client.connection_pool.reset()


# -- what the child inherits: nothing ------------------------------------------------


def _primitives(client: redis.Redis) -> Iterator[tuple[str, Any, type[Exception]]]:
    yield "Lock", Lock(client, "fork:lock"), LockNotOwnedError
    yield "short lease", Lock(client, "fork:short", timeout=1, auto_renew=True), LockNotOwnedError
    yield "ReentrantLock", ReentrantLock(client, "fork:reentrant"), LockNotOwnedError
    yield "Semaphore", Semaphore(client, "fork:semaphore", limit=2), SemaphoreNotOwnedError
    rw = ReadWriteLock(client, "fork:rw-read")
    yield "read lock", rw.read, LockNotOwnedError
    yield "write lock", ReadWriteLock(client, "fork:rw-write").write, LockNotOwnedError
    yield "ClusterLock", ClusterLock(client, "fork:cluster"), LockNotOwnedError
    yield "Redlock", Redlock([client], "fork:redlock"), LockNotOwnedError


def _inherits_nothing(primitive: Any, error: type[Exception]) -> list[str]:
    """What the child found wrong with ``primitive`` (an empty list: all is well)."""
    wrong: list[str] = []
    if primitive.owned():
        wrong.append("owned() is True")
    if primitive.fencing_token is not None:
        wrong.append(f"fencing_token is {primitive.fencing_token}")
    if primitive.lost:
        wrong.append("lost is True")
    if primitive.statistics().held:
        wrong.append("statistics().held is True")
    for action, call in (
        ("release", primitive.release),
        ("extend", lambda: primitive.extend(1)),
        ("reacquire", primitive.reacquire),
    ):
        try:
            call()
        except error:
            continue
        except Exception as exc:
            wrong.append(f"{action} raised {exc!r}")
        else:
            wrong.append(f"{action} did not raise")
    return wrong


def test_a_child_holds_none_of_its_parents_holds(tenure_client: redis.Redis) -> None:
    held = list(_primitives(tenure_client))
    for _, primitive, _ in held:
        assert primitive.acquire(blocking=False)
    connlock = ConnectionLock(tenure_client, "fork:connlock", lease=30)
    assert connlock.acquire(blocking=False)
    parent_id = connlock.owner_id

    def child() -> dict[str, list[str]]:
        _unreachable(tenure_client)  # a server call would raise ServerUnavailableError
        found = {kind: _inherits_nothing(p, error) for kind, p, error in held}
        wrong: list[str] = []
        if connlock.owner_id is not None:
            wrong.append("owner_id is set")
        for action, call in (("release", connlock.release), ("refresh", connlock.refresh)):
            try:
                call()
            except LockNotOwnedError:
                continue
            wrong.append(f"{action} did not raise LockNotOwnedError")
        found["ConnectionLock"] = wrong
        return found

    found = _collect(*_fork(child))
    assert found == {kind: [] for kind in found}
    assert len(found) == len(held) + 1
    for kind, primitive, _ in held:  # the parent's holds are still the parent's
        assert primitive.owned(), kind
        assert not primitive.lost, kind
        primitive.release()
    assert connlock.owner_id == parent_id and connlock.locked()
    connlock.release()


def test_a_child_leaving_its_parents_with_block_is_told_why(tenure_client: redis.Redis) -> None:
    lock = Lock(tenure_client, "fork:with")

    def child() -> str:
        _unreachable(tenure_client)
        try:
            lock.__exit__(None, None, None)  # leaving the parent's `with lock:` block
        except LockNotOwnedError as error:
            return str(error)
        return "no error"

    with lock:
        told = _collect(*_fork(child))
        assert lock.owned()
    assert "held by the parent of this forked process" in told
    assert "os._exit()" in told


def test_the_parent_keeps_its_hold_renewals_and_exclusion(
    tenure_client: redis.Redis, tenure_server: ServerProcess
) -> None:
    told: list[object] = []
    lock = Lock(tenure_client, "fork:kept", timeout=1, auto_renew=True, on_lost=told.append)
    assert lock.acquire(blocking=False)
    fence = lock.fencing_token
    renewals = lock.statistics().renewals

    def child() -> list[str]:
        wrong = _inherits_nothing(lock, LockNotOwnedError)  # on the parent's live client
        if lock.acquire(blocking=False):  # the parent holds it: the child cannot
            wrong.append("the child acquired the parent's lock")
        return wrong

    pid, read = _fork(child)
    try:
        wait_for(  # renewed every third of its lease: past the 1 s lease, twice over
            lambda: lock.statistics().renewals >= renewals + 6, 15, "six renewals in the parent"
        )
    finally:
        wrong = _collect(pid, read)
    assert wrong == []
    assert lock.owned() and not lock.lost and not told
    assert lock.fencing_token == fence
    other = Lock(tenure_server.client(), "fork:kept")
    assert not other.acquire(blocking=False)
    lock.release()
    assert other.acquire(blocking=False)
    other.release()
    assert not told


def test_a_child_waits_behind_its_parent_and_is_woken_by_its_release(
    tenure_client: redis.Redis,
) -> None:
    # waiter_lease=10: a waiter re-checks every 4 s, so a handoff within a
    # second is the wake-up's doing.
    lock = Lock(tenure_client, "fork:line", timeout=1, auto_renew=True, waiter_lease=10)
    assert lock.acquire(blocking=False)
    parent_fence = lock.fencing_token

    def child() -> dict[str, Any]:
        took = lock.acquire(blocking_timeout=15)  # the same object, in line behind the parent
        at = time.monotonic()
        fence = lock.fencing_token
        renewals = lock.statistics().renewals
        wait_for(  # past its 1 s lease: the child's own watchdog renews it
            lambda: lock.statistics().renewals >= renewals + 4, 15, "four renewals in the child"
        )
        owned = lock.owned() and not lock.lost
        lock.release()
        return {"took": took, "at": at, "fence": fence, "owned": owned}

    pid, read = _fork(child)
    wait_for(lambda: tenure_client.zcard(lock.keys.queue) > 0, 10, "the child in line")

    def listening() -> bool:  # the child's wake-up channel has its subscriber
        (channel,) = tenure_client.hvals(lock.keys.wakes)
        return bool(tenure_client.pubsub_numsub(channel)[0][1])

    wait_for(listening, 10, "the child listening on its wake-up channel")
    assert lock.owned()
    released = time.monotonic()
    lock.release()
    report = _collect(pid, read)
    assert report["took"] is True
    assert report["at"] - released < 2.0  # woken, not found on a re-check (4 s)
    assert report["fence"] > parent_fence
    assert report["owned"] is True


def test_a_lock_taken_in_another_thread_at_the_fork_does_not_block_the_child(
    tenure_client: redis.Redis,
) -> None:
    lock = Lock(tenure_client, "fork:mutex", timeout=1, auto_renew=True)
    assert lock.acquire(blocking=False)
    inside, leave = threading.Event(), threading.Event()

    def hold_the_mutex() -> None:  # as the watchdog does for a moment at each renewal
        with lock._holds.mutex:
            inside.set()
            leave.wait(CHILD_TIMEOUT)

    holder = threading.Thread(target=hold_the_mutex, daemon=True)
    holder.start()
    assert inside.wait(5)
    try:
        pid, read = _fork(lambda: (lock.statistics().held, _own_lock_renewed(tenure_client)))
    finally:
        leave.set()
        holder.join(5)
    assert _collect(pid, read) == [False, True]
    assert lock.owned()
    lock.release()


def _own_lock_renewed(client: redis.Redis) -> bool:
    """Take a new lock with a 1 s lease, hold it past that; True if it was renewed all along."""
    own = Lock(client, f"fork:own:{os.getpid()}", timeout=1, auto_renew=True)
    if not own.acquire(blocking_timeout=5):
        return False
    # Renewed every third of its lease: four renewals take it past its 1 s lease.
    wait_for(lambda: own.statistics().renewals >= 4 or own.lost, 15, "four renewals")
    renewed = own.owned() and not own.lost and own.statistics().renewals >= 4
    own.release()
    return renewed


def test_a_childs_own_new_lock_is_renewed(tenure_client: redis.Redis) -> None:
    lock = Lock(tenure_client, "fork:parent-held", timeout=1, auto_renew=True)
    assert lock.acquire(blocking=False)  # the parent's watchdog runs at the fork
    assert _collect(*_fork(lambda: _own_lock_renewed(tenure_client))) is True
    assert lock.owned() and not lock.lost
    lock.release()


# -- a multiprocessing pool forked from a process that holds a lock ------------------

_POOL: dict[str, Any] = {}  # set by the parent before the fork; the workers find it there
ROUNDS = 25


def _pool_work(worker: int) -> int:
    """Increment the counter ROUNDS times under the pool's lock (read, then write)."""
    lock: Lock = _POOL["lock"]
    client: redis.Redis = _POOL["client"]
    parent_lock: Lock = _POOL["parent"]
    assert not parent_lock.owned() and parent_lock.fencing_token is None
    for _ in range(ROUNDS):
        assert lock.acquire(blocking_timeout=20)
        value = int(client.get("fork:counter") or 0)
        client.set("fork:counter", value + 1)
        lock.release()
    return worker


def test_a_fork_pool_locks_each_worker_on_its_own(tenure_server: ServerProcess) -> None:
    client = tenure_server.client()
    client.flushall()
    parent = Lock(client, "fork:pool-parent", timeout=1, auto_renew=True)
    assert parent.acquire(blocking=False)  # held by the parent during the fork
    # A long handoff lease: under test is each worker locking on its own after
    # the fork, not a worker starved of CPU past a 1 s handoff (seen on CI).
    pool_lock = Lock(client, "fork:pool", handoff_lease=10)
    _POOL.update(lock=pool_lock, client=client, parent=parent)
    try:
        with multiprocessing.get_context("fork").Pool(4) as pool:
            done = pool.map_async(_pool_work, range(4)).get(timeout=60)
        assert sorted(done) == [0, 1, 2, 3]
        assert int(client.get("fork:counter") or 0) == 4 * ROUNDS  # no lost update
        assert parent.owned() and not parent.lost
        parent.release()
    finally:
        _POOL.clear()
        client.close()


# -- asyncio: a lock object made before the fork, used under a new loop in the child -----


def test_an_asyncio_lock_in_a_childs_new_event_loop(tenure_server: ServerProcess) -> None:
    async def inherits_nothing(lock: AsyncLock) -> list[str]:
        wrong: list[str] = []
        if await lock.owned():
            wrong.append(f"{lock.name}: owned() is True")
        if lock.fencing_token is not None or lock.lost:
            wrong.append(f"{lock.name}: fencing_token or lost set")
        for action, call in (
            ("release", lock.release),
            ("extend", lambda: lock.extend(1)),
            ("reacquire", lock.reacquire),
        ):
            try:
                await call()
            except LockNotOwnedError:
                continue
            wrong.append(f"{lock.name}: {action} did not raise")
        return wrong

    async def child_checks(locks: list[AsyncLock]) -> list[str]:
        wrong: list[str] = []
        for lock in locks:
            wrong += await inherits_nothing(lock)
        client = tenure_server.async_client()  # the child's own, on its own loop
        try:
            own = AsyncLock(client, "fork:async-own", timeout=1, auto_renew=True)
            if not await own.acquire(blocking_timeout=5):
                wrong.append("the child's own lock was not acquired")

            async def renewed() -> bool:  # four, a third of its lease apart: past its lease
                return own.statistics().renewals >= 4 or own.lost

            await until(renewed, 15, "four renewals of the child's own lock")
            if not await own.owned() or own.lost:
                wrong.append("the child's own lock was not renewed")
            await own.release()
        finally:
            await client.aclose()
        return wrong

    def child(locks: list[AsyncLock]) -> list[str]:
        # The parent's loop is still "running" in this thread: a fresh thread, a fresh loop.
        results: list[list[str]] = []

        def run() -> None:
            try:
                results.append(asyncio.run(child_checks(locks)))
            except Exception:
                results.append([traceback.format_exc()])

        runner = threading.Thread(target=run)
        runner.start()
        runner.join(CHILD_TIMEOUT)
        return results[0] if results else ["the child's event loop did not finish"]

    async def parent() -> None:
        client = tenure_server.async_client()
        try:
            lock = AsyncLock(client, "fork:async", timeout=1, auto_renew=True)
            assert await lock.acquire(blocking=False)
            # Taken in a task of its own that has ended: an orphan the parent may adopt.
            orphan = AsyncLock(client, "fork:async-orphan", timeout=1, auto_renew=True)
            assert list(await asyncio.gather(orphan.acquire(blocking=False))) == [True]
            pid, read = _fork(lambda: child([lock, orphan]))
            # Collected in a thread: this loop goes on renewing meanwhile.
            assert await asyncio.to_thread(_collect, pid, read) == []
            for held in (lock, orphan):
                assert await held.owned() and not held.lost
                await held.release()
        finally:
            await client.aclose()

    asyncio.run(parent())
