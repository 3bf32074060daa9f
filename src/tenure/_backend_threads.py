"""What threads do differently from asyncio: the hand-written half of a pair.

Same names and meanings as ``tenure._backend_asyncio``; the generated sync
code imports this module wherever the async source imports that one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from tenure._owners import BaseOwnerSlot

__all__ = [
    "CAN_CANCEL_HOLDER",
    "IS_ASYNC",
    "Event",
    "Mutex",
    "OwnerSlot",
    "absorb_guard_cancel",
    "cancel_holder",
    "current_holder",
    "guarded",
    "in_batches",
    "node_pipeline",
    "on_signals",
    "scope_key",
    "shielded",
    "sleep",
    "source_call",
    "start_background",
]

IS_ASYNC = False
CAN_CANCEL_HOLDER = False

T = TypeVar("T")


def sleep(seconds: float) -> None:
    """Sleep the calling thread."""
    time.sleep(seconds)


class Event:
    """An event a background thread waits on with a timeout."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        """Wake the waiter."""
        self._event.set()

    def clear(self) -> None:
        """Reset, so the next wait blocks."""
        self._event.clear()

    def wait(self, timeout: float) -> bool:
        """Wait until set or ``timeout`` seconds pass; True if it was set."""
        return self._event.wait(timeout)


class Mutex:
    """A re-entrant lock guarding state shared between user threads and the watchdog."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def start_background(job: Callable[[], None], name: str) -> Any:
    """Run ``job`` in a daemon thread; return the thread."""
    thread = threading.Thread(target=job, name=name, daemon=True)
    thread.start()
    return thread


def scope_key() -> object:
    """What a background service is shared by: this process (a fork gets its own)."""
    return os.getpid()


def shielded(call: T) -> T:
    """Threads cannot be cancelled half-way, so there is nothing to shield."""
    return call


def current_holder() -> object:
    """Who owns a token taken now: the current thread."""
    return threading.current_thread()


def cancel_holder(holder: object) -> None:
    """Threads cannot be cancelled; sync primitives report loss by flag and error."""
    return


def absorb_guard_cancel(holder: object, exc: BaseException | None) -> bool:
    """Threads are never cancelled by the guard: always False."""
    return False


def _thread_finished(thread: object) -> bool:
    return isinstance(thread, threading.Thread) and not thread.is_alive()


class OwnerSlot(BaseOwnerSlot[T]):
    """Per-thread storage of a primitive's holds (see :mod:`tenure._owners`).

    With ``per_owner=False`` every thread shares one slot: acquire in one
    thread, release in another.
    """

    def __init__(self, per_owner: bool) -> None:
        super().__init__(per_owner, threading.current_thread, _thread_finished)


def guarded(call: T, undo: Callable[[T], object]) -> T:
    """Threads are not cancelled between a call and its reply: nothing to undo."""
    return call


@contextlib.contextmanager
def on_signals(signals: tuple[int, ...], callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on each of ``signals`` while the block runs; then the old handlers.

    Python runs signal handlers in the main thread only, so ``signals`` must
    be empty anywhere else (:class:`~tenure.ArgumentError`).
    """
    if signals and threading.current_thread() is not threading.main_thread():
        from tenure._exceptions import ArgumentError

        raise ArgumentError("stop_signals", "signal handlers can only be set in the main thread")
    previous = {number: signal.signal(number, lambda *_: callback()) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def source_call(call: Callable[[], Any]) -> Any:
    """A source's call, made in the calling thread."""
    return call()


def in_batches(rows: Iterable[T], size: int) -> Iterator[list[T]]:
    """``rows`` as lists of up to ``size``."""
    iterator = iter(rows)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def node_pipeline(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` to one cluster node on one connection; replies or errors, in order.

    A sync cluster node carries a ``redis.Redis`` of its own; its pipeline
    takes one connection for the whole batch.
    """
    with node.redis_connection.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))
