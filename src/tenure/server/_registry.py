"""The servers and proxies this process started and still runs, stopped at exit.

:func:`register` records a started server or proxy, :func:`unregister`
forgets a stopped one; an :mod:`atexit` hook stops every one still recorded,
the newest first. A forked child starts with an empty registry: it owns none
of its parent's servers, and the proxies' threads did not survive the fork.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

from tenure.server._lifecycle import Lifecycle

__all__ = ["register", "unregister"]

# Servers and proxies started by this process that may still need stopping or cleaning up.
_LIVE: dict[int, Lifecycle] = {}
_LIVE_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False


def register(process: Lifecycle) -> None:
    """Record a started server or proxy, to be stopped at exit unless unregistered."""
    global _ATEXIT_REGISTERED
    with _LIVE_LOCK:
        _LIVE[id(process)] = process
        if not _ATEXIT_REGISTERED:
            atexit.register(_stop_all_at_exit)
            _ATEXIT_REGISTERED = True


def unregister(process: Lifecycle) -> None:
    """Forget a stopped server or proxy."""
    with _LIVE_LOCK:
        _LIVE.pop(id(process), None)


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        processes = list(_LIVE.values())
    for process in reversed(processes):
        with contextlib.suppress(Exception):
            process.stop(timeout=2.0)


def _after_fork_in_child() -> None:
    # A forked child owns none of its parent's servers: never stop them at its exit.
    global _LIVE_LOCK
    _LIVE.clear()
    _LIVE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
