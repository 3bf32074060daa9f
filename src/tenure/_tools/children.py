"""Helper processes that leave Ctrl-C to the process that started them.

A terminal's Ctrl-C reaches every process of the foreground group: without
care, each spawned helper of ``tenure demo`` or ``tenure bench`` prints its
own KeyboardInterrupt traceback, and one that is still importing can die
half-way. Start helpers inside :func:`sigint_blocked` and call
:func:`ignore_sigint` first thing in each: the helper inherits SIGINT
blocked, ignores it before unblocking, and the parent receives its Ctrl-C
as soon as it has started them.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tenure.server._spawner import PR_SET_PDEATHSIG, PRCTL

__all__ = [
    "Terminated",
    "die_with_parent",
    "ignore_sigint",
    "sigint_blocked",
    "spent",
    "start_helper",
    "stop_on_signals",
]


class Terminated(KeyboardInterrupt):
    """SIGTERM: a command ends as on Ctrl-C, its servers, workers and files cleaned up."""


def stop_on_signals() -> None:
    """In a command: the first Ctrl-C or SIGTERM ends it, and no later one cuts its clean-up.

    SIGTERM raises :class:`Terminated` (exit 143), Ctrl-C KeyboardInterrupt
    (130), each once: both are ignored from then on (``kill -9`` still ends
    it; the command's janitor then removes its files). A Ctrl-C that was
    ignored when the command started (a shell's background job) stays ignored.
    """
    signal.signal(signal.SIGTERM, _stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop)


def _stop(signum: int, frame: object) -> None:
    signal.signal(signal.SIGINT, spent)
    signal.signal(signal.SIGTERM, spent)
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def spent(signum: int, frame: object) -> None:
    """The handler of a signal already acted on: later ones change nothing.

    Not ``SIG_IGN``: a second signal that arrived while the first one's
    handler ran is then still handled by Python, which otherwise raises
    ``OSError: Signal 15 ignored due to race condition`` wherever it is.
    """


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """Hold SIGINT back for the block; processes started in it inherit it blocked.

    The mask is per thread: a Ctrl-C can still be delivered through another
    thread of this process (a server's output reader, a queue's feeder), and
    Python would raise KeyboardInterrupt here mid-way through starting a
    helper, leaving it half-fed. So, in the main thread, a Ctrl-C that comes
    during the block is also only noted, and raised once the block ends; a
    SIGTERM too (not masked: a helper must still be able to receive one).
    """
    deferred: list[int] = []
    previous: dict[int, Any] = {}
    main = threading.current_thread() is threading.main_thread()
    if main:
        for signum in (signal.SIGINT, signal.SIGTERM):
            # (Nothing to defer where a signal is ignored, as SIGINT in a background job.)
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, lambda number, _: deferred.append(number))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        for held, handler in previous.items():
            signal.signal(held, signal.SIG_DFL if handler is None else handler)
        for number in dict.fromkeys(deferred):
            signal.raise_signal(number)  # as if it came now


def ignore_sigint() -> None:
    """In a helper process: ignore SIGINT, then unblock it (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def die_with_parent(parent: int) -> None:
    """In a helper process: be killed with the process ``parent`` (even by kill -9), on Linux.

    Call it first thing, with the parent's pid passed in; exits at once if the
    parent is already gone. Elsewhere only that check is made.
    """
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def start_helper() -> None:
    """First thing in a helper started by :mod:`multiprocessing`: the parent's helper.

    It leaves Ctrl-C to the parent (:func:`ignore_sigint`) and dies with it,
    even when the parent is killed with kill -9 (:func:`die_with_parent`; a
    helper waiting on a queue would otherwise wait forever).
    """
    import multiprocessing

    ignore_sigint()
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:
        die_with_parent(parent.pid)
