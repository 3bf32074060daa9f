"""How long this process's threads waited for a CPU while runnable (Linux schedstat).

A 2-core CI machine running two test workers and their servers can leave a
runnable thread without a CPU for a second or more. A test that bounds how
long a call takes adds that wait to its bound: the library is judged on what
it did with the CPU it had, not on the machine's other load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def _run_delays() -> dict[str, int]:
    """Nanoseconds each live thread of this process has waited on a run queue."""
    delays: dict[str, int] = {}
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return delays
    for tid in threads:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stats:
                delays[tid] = int(stats.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile, or no schedstat on this kernel
    return delays


@dataclass
class Starvation:
    """Seconds of run-queue wait measured by :func:`starvation` (the most of any thread)."""

    seconds: float = 0.0


@contextmanager
def starvation() -> Iterator[Starvation]:
    """Measure the longest run-queue wait any thread of this process had inside the block.

    Threads that started inside the block count from zero; a thread's wait is
    counted while it was runnable only, never while it slept or waited on a
    socket. 0 where the kernel keeps no schedstat.
    """
    measured = Starvation()
    before = _run_delays()
    try:
        yield measured
    finally:
        after = _run_delays()
        waits = [delay - before.get(tid, 0) for tid, delay in after.items()]
        measured.seconds = max(waits, default=0) / 1e9
