"""The tracking connection of near caching, driven directly against a real server."""

from __future__ import annotations

import math
import os
import select
import threading
import time
from typing import Any

import pytest
import redis

from tenure import Cache, NearCache
from tenure._backends.near_tracking import Tracker, servers_of, tracker_for
from tenure._core.near import NearEntries
from tenure.server import ServerProcess
from tests.conftest import wait_for


def _entries(tracker: Tracker) -> NearEntries:
    return NearEntries(NearCache(), tracker.confirmation, threading.Lock())


def test_a_cache_registered_while_the_connection_connects_is_tracked(
    tenure_server: ServerProcess, tenure_client: redis.Redis
) -> None:
    kind, settings = servers_of(tenure_client)[0]
    real = tracker_for(kind, settings)._make
    late = _entries(Tracker(real, "unused"))  # (its confirmation is replaced below)
    tracker: Tracker

    def make() -> Any:  # the connection is made after the prefixes were read...
        if not registered.is_set():
            registered.set()
            tracker.register("late:", late)  # ...and a new cache registers meanwhile
        return real()

    registered = threading.Event()
    tracker = Tracker(make, "test")
    late.confirmation = tracker.confirmation
    first = _entries(tracker)
    try:
        tracker.register("first:", first)
        wait_for(lambda: registered.is_set() and late.tracked, 5, "the late cache tracked")
        tenure_client.set("late:k", "v")
        ticket = late.begin("late:k")
        late.finish("late:k", ticket, time.monotonic(), b"v", math.inf)
        wait_for(lambda: late.get("late:k", time.monotonic())[0], 2, "a near read of it")
        tenure_client.set("late:k", "w")  # announced to it: dropped
        wait_for(lambda: not late.get("late:k", time.monotonic())[0], 2, "the write announced")
    finally:
        tracker.stop()


def test_a_new_prefix_is_handed_over_without_losing_an_entry(
    tenure_server: ServerProcess, tenure_client: redis.Redis
) -> None:
    """A cache of a new name takes a new connection; what the old one confirmed stays
    served, writes are announced all along, and the new cache keeps only reads begun
    once the new connection tracked."""
    kind, settings = servers_of(tenure_client)[0]
    tracker = Tracker(tracker_for(kind, settings)._make, "test")
    first = _entries(tracker)
    try:
        tracker.register("first:", first)
        wait_for(lambda: first.tracked, 5, "the first cache tracked")
        epoch = tracker.confirmation.epoch
        ticket = first.begin("first:k")
        first.finish("first:k", ticket, time.monotonic(), b"v", math.inf)
        wait_for(lambda: first.get("first:k", time.monotonic())[0], 2, "a near read")
        second = _entries(tracker)
        before = time.monotonic()
        early = second.begin("second:k")  # begun before the new connection tracked
        tracker.register("second:", second)
        wait_for(lambda: second.tracked, 5, "the second cache tracked")
        assert tracker.confirmation.epoch == epoch  # the same life: nothing dropped
        assert first.get("first:k", time.monotonic()) == (True, b"v")
        second.finish("second:k", early, before, b"old", math.inf)
        assert not second.get("second:k", time.monotonic())[0]  # might have missed a write
        ticket = second.begin("second:k")
        second.finish("second:k", ticket, time.monotonic(), b"new", math.inf)
        wait_for(lambda: second.get("second:k", time.monotonic())[0], 2, "a near read of it")
        tenure_client.set("first:k", "w")  # announced on the new connection: dropped
        wait_for(lambda: not first.get("first:k", time.monotonic())[0], 2, "first's write")
        tenure_client.set("second:k", "w")
        wait_for(lambda: not second.get("second:k", time.monotonic())[0], 2, "second's write")
        clients = [c for c in tenure_client.client_list() if "t" in c["flags"]]
        assert len([c for c in clients if c["name"].startswith("tenure-near:")]) == 1
    finally:
        tracker.stop()


def _near_hit(cache: Cache, key: str) -> bool:
    before = cache.statistics().near_hits
    cache.get(key)
    return cache.statistics().near_hits > before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_tracks_on_its_own(
    tenure_server: ServerProcess, tenure_client: redis.Redis
) -> None:
    """The parent's tracking thread and connection are not in the child: it drops what it
    inherited, tracks on a connection of its own, answers near again, and sees writes."""
    cache = Cache(tenure_client, "near-fork", near=True)
    cache.set("k", 1)
    wait_for(lambda: _near_hit(cache, "k"), 5, "the parent's near hit")
    from_parent, to_child = os.pipe()  # (read end, write end)
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 if all held
        code = 1
        try:
            assert not _near_hit(cache, "k")  # what it inherited is dropped
            wait_for(lambda: _near_hit(cache, "k"), 5, "the child's near hit")
            os.write(to_parent, b"r")
            assert os.read(from_parent, 1) == b"w"  # the parent wrote 2
            wait_for(lambda: cache.get("k") == 2, 2, "the write seen")
            wait_for(lambda: _near_hit(cache, "k"), 5, "near again")
            code = 0
        finally:
            os._exit(code)
    done = (0, 0)
    try:
        ready, _, _ = select.select([from_child], [], [], 30)
        assert ready and os.read(from_child, 1) == b"r", "the child never answered near"
        with tenure_server.client() as other:
            Cache(other, "near-fork").set("k", 2)
        os.write(to_child, b"w")
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
        assert cache.get("k") == 2  # the parent's tracking goes on
    finally:
        if done[0] != pid and os.waitpid(pid, os.WNOHANG)[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        for fd in (from_parent, to_child, from_child, to_parent):
            os.close(fd)
