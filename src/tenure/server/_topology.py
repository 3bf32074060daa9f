"""The shared base of every topology, and the helpers that assemble them.

Topologies are built from :class:`ServerProcess`: standalone, replicated,
cluster, Sentinel. Each topology is a sync and async context manager with
``start()`` / ``stop()``. ``start()`` returns once the whole topology is usable
(replication links up, cluster slots agreed on every node, sentinels
monitoring the primary and its replicas); a start that fails half-way stops
every process it started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import redis

from tenure._core.exceptions import ArgumentError, ServerStartError
from tenure.server._binaries import Engine, find_engine
from tenure.server._lifecycle import Lifecycle
from tenure.server._process import ServerProcess

__all__ = [
    "Topology",
    "check_count",
    "parallel",
    "resolve",
    "start_one",
    "wait_until",
]

_T = TypeVar("_T")

_POLL = 0.02


def resolve(engine: Engine | str | None) -> Engine:
    """``engine`` itself, or :func:`find_engine`'s answer for a name or ``None``."""
    return engine if isinstance(engine, Engine) else find_engine(engine)


def parallel(function: Callable[[_T], object], items: Sequence[_T]) -> None:
    """Run ``function`` on every item in threads; wait for all, then raise the first error."""
    if len(items) <= 1:
        for item in items:
            function(item)
        return
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="tenure-server") as pool:
        futures = [pool.submit(function, item) for item in items]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error


def start_one(process: ServerProcess) -> None:
    """Start ``process`` (a function for :func:`parallel`)."""
    process.start()


def check_count(argument: str, value: int, minimum: int) -> None:
    """Raise :class:`~tenure.ArgumentError` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentError(argument, f"expected an integer >= {minimum}, got {value!r}")


def wait_until(
    problems: Callable[[], list[str]], deadline: float, what: str, timeout: float
) -> None:
    """Poll ``problems()`` until it returns nothing; ServerStartError with the last ones."""
    while True:
        try:
            found = problems()
        except redis.RedisError as exc:
            found = [f"{type(exc).__name__}: {exc}"]
        if not found:
            return
        if time.monotonic() >= deadline:
            listing = "\n  ".join(found[:20])
            raise ServerStartError(f"{what} not ready within {timeout:g} s:\n  {listing}")
        time.sleep(_POLL)


class Topology(Lifecycle):
    """Shared lifecycle: start all, roll back on failure, stop all in parallel."""

    def __init__(self, startup_timeout: float) -> None:
        if not startup_timeout > 0:
            raise ArgumentError("startup_timeout", f"expected > 0, got {startup_timeout!r}")
        self.startup_timeout = startup_timeout
        self._lock = threading.RLock()
        self._started = False

    @property
    def processes(self) -> tuple[ServerProcess, ...]:
        """Every process of the topology."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        """Whether the topology was started and every one of its processes is alive."""
        return self._started and all(process.running for process in self.processes)

    def _build(self) -> None:
        raise NotImplementedError

    def _stop_groups(self) -> list[tuple[ServerProcess, ...]]:
        return [self.processes]

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            try:
                self._build()
            except BaseException:
                self._stop(1.0)
                raise
            self._started = True

    def _stop(self, timeout: float) -> None:
        with self._lock:
            errors: list[BaseException] = []
            for group in self._stop_groups():
                try:
                    parallel(lambda process: process.stop(timeout), group)
                except Exception as exc:
                    errors.append(exc)
            self._started = False
            if errors:
                raise errors[0]

    def _state(self) -> str:
        if self._started:
            return "running" if self.running else "degraded"
        return "stopped"
