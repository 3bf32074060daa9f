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
