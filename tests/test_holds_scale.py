"""What one owner holds does not make acquire, release or renewal planning slower.

No server: the costs that grew with the holds were local (the inherited
holds copied on every bind and clear, the watchdog's job list scanned at
every wake-up). Timings compare the same work with few and with many holds,
the best of several runs, with a wide margin.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tenure._backends.for_threads import OwnerSlot
from tenure._sync._watchdog import Job, Watchdog


class _Hold:
    pass


def _best(work: Callable[[], None], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def _bind_and_clear_with(held: int) -> float:
    """Seconds to bind and clear 2,000 holds while this thread keeps ``held`` others."""
    kept = [(OwnerSlot[_Hold](per_owner=True), _Hold()) for _ in range(held)]
    for slot, hold in kept:
        slot.set(hold)
    extra = [(OwnerSlot[_Hold](per_owner=True), _Hold()) for _ in range(2000)]

    def work() -> None:
        for slot, hold in extra:
            slot.set(hold)
            assert slot.get(adopt=False) is hold
            slot.clear(hold)

    try:
        return _best(work)
    finally:
        for slot, hold in kept:
            assert slot.get() is hold
            slot.clear(hold)


def test_binding_a_hold_does_not_grow_with_what_the_owner_holds() -> None:
    few, many = _bind_and_clear_with(1000), _bind_and_clear_with(20000)
    # 20 times the holds: a cost that grew with them would be ~20 times; a busy
    # CI worker (two test passes on two cores) has made the same work 3.5 times.
    assert many < 8 * few, (few, many)


def _job(due: float) -> Job:
    return Job(
        due=due,
        client=None,  # type: ignore[arg-type]  # never run here
        script="lock_extend",
        keys=(),
        args=(),
        on_result=lambda reply, error: None,
    )


def _idle_watchdog(waiting: int) -> tuple[Watchdog, list[Job]]:
    """A watchdog with ``waiting`` jobs due in an hour, its background thread never started."""
    dog = Watchdog()
    dog._running = True  # planned by hand below: no thread
    far = time.monotonic() + 3600
    jobs = [dog.schedule(_job(far + i)) for i in range(waiting)]
    return dog, jobs


def test_the_watchdog_takes_due_jobs_in_order_and_skips_cancelled_ones() -> None:
    dog, jobs = _idle_watchdog(3)
    now = time.monotonic()
    soon, cancelled, moved = _job(now - 1), _job(now - 0.5), jobs[2]
    dog.schedule(soon)
    dog.schedule(cancelled)
    dog.cancel(cancelled)
    moved.due = now - 0.1
    dog.schedule(moved)  # planned again: due now
    due, wait = dog._take_due()
    assert due == [soon, moved] and wait == 0.0
    due, wait = dog._take_due()
    assert due == [] and wait is not None and 3000 < wait < 3601
    for job in jobs[:2]:
        dog.cancel(job)
    assert len(dog._by_due) + len(dog._by_opening) <= 4 * dog._waiting + 128


def _plan_with(waiting: int) -> float:
    """Seconds to schedule, take and cancel 2,000 short jobs beside ``waiting`` long ones."""
    dog, _ = _idle_watchdog(waiting)

    def work() -> None:
        now = time.monotonic()
        for _ in range(1000):
            dog.cancel(dog.schedule(_job(now + 60)))  # a hold released before its renewal
            dog.schedule(_job(now - 1))  # a handoff to confirm now
            due, _ = dog._take_due()
            assert len(due) == 1

    return _best(work)


def test_planning_renewals_does_not_grow_with_the_jobs_waiting() -> None:
    few, many = _plan_with(100), _plan_with(20000)
    # 200 times the jobs waiting: a plan that walked them would take ~200 times
    # as long; a heap's few extra levels stay far below 10 (on a busy machine too).
    assert many < 10 * few, (few, many)
