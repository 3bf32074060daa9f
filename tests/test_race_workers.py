"""The sync API's race workers: calls stuck on a dead server never hold up the others."""

from __future__ import annotations

import threading
import time

import pytest

from tenure._backends import for_threads
from tenure._backends.for_threads import STUCK_AFTER, race


def test_calls_stuck_on_a_dead_master_do_not_hold_up_calls_to_the_healthy_ones() -> None:
    """More calls stuck than the workers' limit (a master refusing connections behind
    redis-py's retry backoff, as a burst of Redlock calls met): a call made later to a
    healthy master is answered at once, not queued behind them."""
    gate = threading.Event()
    stuck = for_threads._workers._limit + 6  # the first ones fill the limit, six wait
    try:
        for _ in range(stuck):
            for_threads._workers.submit(lambda: gate.wait(60), lambda outcome: None)
        time.sleep(STUCK_AFTER + 0.3)
        started = time.monotonic()
        outcomes = race([lambda: 42], 5.0, lambda seen: bool(seen), lambda i, o: None)
        took = time.monotonic() - started
    finally:
        gate.set()
    assert outcomes == {0: 42}
    assert took < 2.0, took


def test_busy_workers_that_make_progress_keep_the_limit() -> None:
    """Calls that are only busy (not stuck) never start more threads than the limit."""
    workers = for_threads._Workers(limit=4, ceiling=16)
    gate = threading.Event()
    done = threading.Semaphore(0)
    try:
        for _ in range(10):
            workers.submit(lambda: gate.wait(60), lambda outcome: done.release())
        assert workers._threads == 4
    finally:
        gate.set()
    for _ in range(10):
        assert done.acquire(timeout=10)
    assert workers._threads == 4


def test_the_ceiling_holds_whatever_happens() -> None:
    workers = for_threads._Workers(limit=2, ceiling=5)
    gate = threading.Event()
    try:
        for _ in range(4):
            workers.submit(lambda: gate.wait(60), lambda outcome: None)
        assert workers._threads == 2
        time.sleep(STUCK_AFTER + 0.3)  # both stuck: two more may start, for the two queued
        workers.submit(lambda: gate.wait(60), lambda outcome: None)
        assert workers._threads == 4
        time.sleep(STUCK_AFTER + 0.3)  # all four stuck: up to the ceiling, no further
        for _ in range(10):
            workers.submit(lambda: gate.wait(60), lambda outcome: None)
        assert workers._threads == 5
    finally:
        gate.set()


def test_jobs_queued_behind_busy_workers_start_once_those_are_stuck() -> None:
    """Every worker busy (not stuck yet) when a job came: it waits in the queue, and
    gets a thread of its own once the busy ones count as stuck, with no later call
    needed to notice."""
    workers = for_threads._Workers(limit=2, ceiling=8)
    gate = threading.Event()
    ran = threading.Event()
    try:
        for _ in range(2):
            workers.submit(lambda: gate.wait(60), lambda outcome: None)
        workers.submit(ran.set, lambda outcome: None)
        assert not ran.wait(STUCK_AFTER / 2)  # queued behind the two busy ones
        assert ran.wait(STUCK_AFTER * 3)  # started by the recheck, the gate still shut
    finally:
        gate.set()


def test_a_burst_to_a_dead_server_does_not_hold_up_another_server_before_it_counts_as_stuck() -> (
    None
):
    """The Redlock failure this guards: a master refusing connections behind redis-py's
    retry backoff took every worker with calls younger than STUCK_AFTER, and the two
    healthy masters' calls queued behind them past their 0.1 s timeout. Each server is
    a lane of its own: a call to another one starts at once."""
    workers = for_threads._Workers(limit=4, ceiling=64)
    dead, healthy = object(), object()
    gate = threading.Event()
    ran = threading.Event()
    try:
        for _ in range(10):
            workers.submit(lambda: gate.wait(60), lambda outcome: None, dead)
        assert workers._threads == 4  # the dead lane keeps its limit
        started = time.monotonic()
        workers.submit(ran.set, lambda outcome: None, healthy)
        assert ran.wait(5)
        assert time.monotonic() - started < STUCK_AFTER / 2
    finally:
        gate.set()


def test_race_starts_each_lanes_calls_at_once() -> None:
    dead, healthy = object(), object()
    gate = threading.Event()
    try:
        for _ in range(for_threads._workers._limit + 6):
            for_threads._workers.submit(lambda: gate.wait(60), lambda outcome: None, dead)
        started = time.monotonic()
        outcomes = race(
            [lambda: 42, lambda: 43], 5.0, lambda seen: len(seen) == 2, lambda i, o: None,
            [healthy, healthy],
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        gate.set()
    assert outcomes == {0: 42, 1: 43}
    assert took < STUCK_AFTER / 2, took


def test_idle_workers_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(for_threads, "IDLE_FOR", 0.2)
    workers = for_threads._Workers(limit=4, ceiling=16)
    done = threading.Semaphore(0)
    for _ in range(3):
        workers.submit(lambda: time.sleep(0.05), lambda outcome: done.release())
    for _ in range(3):
        assert done.acquire(timeout=10)
    assert workers._threads == 3
    deadline = time.monotonic() + 5
    while workers._threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers._threads == 0
    workers.submit(lambda: 1, lambda outcome: done.release())  # and a new one starts
    assert done.acquire(timeout=10)
