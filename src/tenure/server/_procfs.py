"""What tenure reads from Linux's ``/proc``: process states and the ephemeral port range.

Every reader has a fallback for a system without ``/proc`` (or a process that
is gone): ``None`` for a state, the usual Linux default for the port range.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ephemeral_low", "proc_state", "wait_state"]


def ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral (outgoing) range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def proc_state(pid: int) -> str | None:
    """The one-letter state in /proc/<pid>/stat (``None`` if unknown or gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            stat = file.read()
    except OSError:
        return None
    _, _, rest = stat.rpartition(")")
    fields = rest.split()
    return fields[0] if fields else None


def wait_state(pid: int, done: Callable[[str], bool]) -> None:
    """Poll ``pid``'s state until ``done(state)``, it is unknown, or 1 s has passed."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        state = proc_state(pid)
        if state is None or done(state):
            return
        time.sleep(0.001)
