"""The tracking connection of near caching, driven directly against a real server."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import redis

from tenure import NearCache
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
