"""Traces through OpenTelemetry: spans where time goes, none on the fast paths.

:func:`span` opens a span when the application set a tracer provider (looked
for as :mod:`tenure._backends.telemetry` looks for a meter provider: in
``sys.modules``, at most once a second), and costs one check otherwise;
:class:`AcquireSpan` is an acquire's span, begun only once it waits in line.
The span names and attributes are those of :mod:`tenure._core.telemetry`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from tenure._backends.telemetry import LOOK_EVERY, NOBODY, Subject, looking, version
from tenure._core import telemetry as table
from tenure._core.leased import Hold

__all__ = ["AcquireSpan", "Span", "span"]


class Span:
    """A span in progress (:func:`span`): events, the outcome, the fencing token."""

    __slots__ = ("_span",)

    def __init__(self, started: Any) -> None:
        self._span = started

    def event(self, name: str) -> None:
        """Add event ``name`` (``queued``, ``granted``) now."""
        self._span.add_event(name)

    def outcome(self, outcome: str) -> None:
        """How the operation ended: ``tenure.outcome``."""
        self._span.set_attribute(table.OUTCOME, outcome)

    def granted(self, fence: int) -> None:
        """The acquire was granted with fencing token ``fence``."""
        self._span.add_event(table.GRANTED)
        self._span.set_attribute(table.FENCING_TOKEN, fence)
        self._span.set_attribute(table.OUTCOME, table.ACQUIRED)


_tracer: Any = None
_tracer_provider: Any = None
_traced = float("-inf")


def _tracing() -> Any:
    """The tracer on the application's tracer provider, or None (looked at once a second)."""
    global _tracer, _tracer_provider, _traced
    if time.monotonic() - _traced < LOOK_EVERY:
        return _tracer
    with looking:
        _traced = time.monotonic()
        api = sys.modules.get("opentelemetry.trace")
        provider = None if api is None else api.get_tracer_provider()
        if provider is None or type(provider).__name__ in NOBODY:
            _tracer = _tracer_provider = None
        elif provider is not _tracer_provider:
            _tracer, _tracer_provider = provider.get_tracer(table.TRACER, version()), provider
        return _tracer


@contextlib.contextmanager
def span(
    name: str, who: Subject, started: float | None = None, *, current: bool = False
) -> Iterator[Span | None]:
    """A span ``name`` around the block when a tracer provider is set (else None, for free).

    ``who``: the primitive, its attributes the span's; ``started``:
    when the operation began (monotonic), if before the block; ``current``:
    the block's own spans (a loader's queries) are its children. An exception
    ends it as ``cancelled`` or ``error`` (with the exception recorded).
    """
    tracer = _tracing()
    if tracer is None:
        yield None
        return
    attributes = who.attributes()
    begun = None
    if started is not None:  # on the wall clock, as spans are
        begun = time.time_ns() - int((time.monotonic() - started) * 1e9)
    current_span = tracer.start_span(name, attributes=attributes, start_time=begun)
    api = sys.modules["opentelemetry.trace"]
    try:
        if current:
            with api.use_span(current_span, end_on_exit=False):
                yield Span(current_span)
        else:
            yield Span(current_span)
    except BaseException as exc:
        cancelled = isinstance(exc, (KeyboardInterrupt, SystemExit)) or (
            type(exc).__name__ == "CancelledError"
        )
        current_span.set_attribute(table.OUTCOME, table.CANCELLED if cancelled else table.ERROR)
        if not cancelled:
            current_span.set_attribute(table.ERROR_TYPE, table.error_type(exc))
            current_span.record_exception(exc)
            error = api.Status(api.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
            current_span.set_status(error)
        raise
    finally:
        current_span.end()


class AcquireSpan:
    """An acquire's span (``tenure.lock.acquire``), begun once it waits in line.

    ``with AcquireSpan(who, started) as traced:`` around the acquire;
    :meth:`queued` when it joins the line (the span starts at ``started``,
    the call); :meth:`ended` with what it got. An acquire that never waits
    has no span; one that ends in an exception has its outcome.
    """

    __slots__ = ("_span", "_started", "_who", "_within")

    def __init__(self, who: Subject, started: float) -> None:
        self._who, self._started = who, started
        self._within: contextlib.AbstractContextManager[Span | None] | None = None
        self._span: Span | None = None

    def __enter__(self) -> AcquireSpan:
        return self

    def queued(self) -> None:
        """The acquire joined the line (again: nothing more)."""
        if self._within is None:
            self._within = span(table.LOCK_ACQUIRE_SPAN, self._who, self._started)
            self._span = self._within.__enter__()
            if self._span is not None:
                self._span.event(table.QUEUED)

    def ended(self, got: bool, hold: Hold | None) -> bool:
        """The acquire returns ``got``, holding ``hold`` if it got it; returns ``got``."""
        if self._span is not None:
            if got and hold is not None:
                self._span.granted(hold.fence)
            else:
                self._span.outcome(table.TIMEOUT)
        return got

    def __exit__(self, *exc_info: Any) -> None:
        if self._within is not None:
            self._within.__exit__(*exc_info)
