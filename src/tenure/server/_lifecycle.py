"""The lifecycle every server, topology and proxy shares: ``start()`` / ``stop()``.

:class:`Lifecycle` turns a class's ``_start`` and ``_stop`` into the public
``start()`` / ``stop()`` and the ``with`` / ``async with`` protocol (the async
one runs them in a worker thread).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TypeVar

__all__ = ["Lifecycle"]

_L = TypeVar("_L", bound="Lifecycle")


class Lifecycle:
    """Start/stop plus the sync and async context-manager protocol."""

    def start(self: _L) -> _L:
        """Start, wait until ready, and return ``self``; a no-op when already running."""
        self._start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and clean up; idempotent.

        Each process gets ``timeout`` seconds to exit after a graceful request
        before it is killed.
        """
        self._stop(timeout)

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self, timeout: float) -> None:
        raise NotImplementedError

    def __enter__(self: _L) -> _L:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self: _L) -> _L:
        try:
            await asyncio.to_thread(self._start)
        except asyncio.CancelledError:
            # The worker thread still runs start(); stop once it is done.
            threading.Thread(target=self.stop, name="tenure-server-stop", daemon=True).start()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self._stop, 5.0)
