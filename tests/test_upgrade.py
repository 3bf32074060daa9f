"""A rolling upgrade: processes on the previous release beside processes on this one.

The previous release kept a lock's fencing counter (``…:fence``) and its
release receipts (``…:done``) in keys of their own; this one keeps both in
the owner hash, which a release leaves as a marker without a token. Both
take and hold the lock by the owner hash's ``token`` field, and the waiting
line's keys did not change, so the two never hold one name at once. The
previous release's scripts are kept here as it shipped them
(``tests/previous_release/``, includes expanded) and run beside the new ones.
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import redis

from tenure import Lock
from tenure._core.leased import IDLE_TTL_MS

PREVIOUS = Path(__file__).resolve().parent / "previous_release"


class PreviousLock:
    """The previous release's lock_try and lock_release, as its Lock called them."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.keys = Lock(client, name).keys
        self.try_ = client.register_script((PREVIOUS / "lock_try.lua").read_text())
        self.release_ = client.register_script((PREVIOUS / "lock_release.lua").read_text())
        self.token = ""
        self.fence = 0

    def acquire(self) -> bool:
        """The previous fast path (no waiting): True if taken."""
        k = self.keys
        token = secrets.token_hex(16)
        fence = int(
            self.try_(
                keys=[k.owner, k.queue, k.fence],
                args=[token, 30_000, IDLE_TTL_MS, "previous", ""],
            )
        )
        if fence:
            self.token, self.fence = token, fence
        return fence > 0

    def release(self) -> bool:
        """The previous release: True if it held."""
        k = self.keys
        keys = [k.owner, k.queue, k.waiters, k.wakes, k.fence, k.names, k.done, k.done_old]
        done = int(self.release_(keys=keys, args=[self.token, 1000, IDLE_TTL_MS, self.fence]))
        self.token, self.fence = "", 0
        return done == 1


def test_the_previous_release_and_this_one_exclude_each_other(
    tenure_client: redis.Redis,
) -> None:
    old = PreviousLock(tenure_client, "upgrade")
    new = Lock(tenure_client, "upgrade", thread_local=False)
    assert old.acquire()
    assert not new.acquire(blocking=False)
    assert old.release()
    assert new.acquire(blocking=False)
    assert not old.acquire()  # held by this release
    new.release()  # leaves the marker: no token, the last fence
    assert tenure_client.hget(new.keys.owner, "token") is None
    assert old.acquire()  # the previous release sees the marker as free
    assert not new.acquire(blocking=False)
    assert old.release()
    assert new.acquire(blocking=False)
    new.release()


def test_a_waiter_of_this_release_is_handed_the_lock_by_the_previous_one(
    tenure_client: redis.Redis,
) -> None:
    old = PreviousLock(tenure_client, "upgrade-handoff")
    assert old.acquire()
    waiter = Lock(tenure_client, "upgrade-handoff", blocking_timeout=10)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire()))
    thread.start()
    deadline = time.monotonic() + 5
    while not tenure_client.exists(waiter.keys.queue):  # in line
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.01)
    assert old.release()  # hands it over inside the script, as before
    thread.join(10)
    assert got == [True]
    assert waiter.fencing_token is not None
    waiter.release()


def test_mixed_releases_never_hold_one_name_twice(tenure_client: redis.Redis) -> None:
    inside = [0]
    overlaps: list[str] = []
    guard = threading.Lock()

    def critical(who: str) -> None:
        with guard:
            inside[0] += 1
            if inside[0] > 1:
                overlaps.append(who)
        time.sleep(0.0005)
        with guard:
            inside[0] -= 1

    def previous() -> None:
        lock = PreviousLock(tenure_client, "upgrade-mixed")
        done = 0
        while done < 150:
            if lock.acquire():
                critical("previous")
                assert lock.release()
                done += 1
            else:
                time.sleep(0.0005)

    def this() -> None:
        for _ in range(150):
            with Lock(tenure_client, "upgrade-mixed", blocking_timeout=10):
                critical("this")

    threads = [threading.Thread(target=work) for work in (previous, this, this)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert overlaps == []
