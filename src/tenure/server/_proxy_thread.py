"""A fault proxy's own thread: one asyncio event loop, controlled from other threads.

:class:`LoopThread` starts the loop in a daemon thread, runs a control
coroutine there and waits for its result (:meth:`LoopThread.call`, from any
thread but its own), and stops it: a last coroutine, then the loop, then
the thread joined. Peers closing or resetting are never printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, TypeVar

from tenure._core.exceptions import EmbeddedServerError

__all__ = ["CONTROL_TIMEOUT", "LoopThread"]

_T = TypeVar("_T")

CONTROL_TIMEOUT = 10.0
"""How long a control call waits for the proxy's loop at most, in seconds."""


def _quiet_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Peers closing or resetting is the proxy's daily bread: never print it."""
    if isinstance(context.get("exception"), (OSError, asyncio.CancelledError)):
        return
    loop.default_exception_handler(context)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


class LoopThread:
    """An event loop in a daemon thread of its own, for ``owner`` (named in errors)."""

    def __init__(self, owner: object) -> None:
        self._owner = owner
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is started and alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self, name: str) -> None:
        """Start the loop in a new daemon thread called ``name``."""
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_quiet_exceptions)
        thread = threading.Thread(target=_run_loop, args=(loop,), name=name, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

    def call(self, coro: Coroutine[Any, Any, _T], timeout: float = CONTROL_TIMEOUT) -> _T:
        """Run ``coro`` on the loop and wait for its result."""
        loop = self._loop
        if loop is None or threading.current_thread() is self._thread:
            coro.close()
            raise EmbeddedServerError(f"{self._owner!r}: cannot control the proxy from here")
        try:
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:
            coro.close()
            raise
        return future.result(timeout)

    def stop(self, timeout: float, last: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Run ``last()`` on the loop (if it still runs), stop the loop and join the thread.

        Raises :class:`~tenure.EmbeddedServerError` if the thread is still
        alive after ``timeout`` (and then keeps it).
        """
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            if thread.is_alive():
                with contextlib.suppress(RuntimeError, FutureTimeoutError):
                    self.call(last(), timeout=timeout)
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            if thread.is_alive():
                raise EmbeddedServerError(
                    f"{self._owner!r}: the proxy thread did not stop in {timeout:g} s"
                )
        self._loop = self._thread = None
