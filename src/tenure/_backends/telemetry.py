"""The one seam between tenure's I/O layer and OpenTelemetry's metrics API.

The primitives call :func:`metrics` where something worth counting happens
and record through the :class:`Recorder` it returns, or skip when it
returns None: when nothing listens, that one call is all a lock pays. It
never imports OpenTelemetry itself: it looks for ``opentelemetry.metrics``
among the modules the application already imported, and listens only once
a real meter provider is set there (the API's default, a proxy that
records nothing, counts as nobody listening). It looks again at most once
a second, so a provider set after tenure's first use is found within a
second. The instruments are those of :mod:`tenure._core.telemetry`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tenure._core import telemetry as table
from tenure._core.cache import CacheCounters

__all__ = ["Recorder", "Span", "metrics", "refresh", "span"]

LOOK_EVERY = 1.0
"""Seconds between two looks for a meter provider set by the application."""

_NOBODY = (
    "_ProxyMeterProvider",
    "ProxyMeterProvider",
    "NoOpMeterProvider",
    "ProxyTracerProvider",
    "NoOpTracerProvider",
)


class Recorder:
    """The instruments on one meter provider, recorded with tenure's attributes."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        meter = provider.get_meter(table.METER, _version())
        made: dict[str, Any] = {}
        for each in table.INSTRUMENTS:
            create = meter.create_histogram if each.kind == "histogram" else meter.create_counter
            made[each.name] = create(each.name, unit=each.unit, description=each.description)
        self._wait = made[table.LOCK_WAIT.name]
        self._hold = made[table.LOCK_HOLD.name]
        self._lost = made[table.LOCK_LOST.name]
        self._renewals = made[table.LOCK_RENEWALS.name]
        self._requests = made[table.CACHE_REQUESTS.name]
        self._loads = made[table.CACHE_LOAD.name]
        self._load_errors = made[table.CACHE_LOAD_ERRORS.name]
        self._results = {result: {table.RESULT: result} for result in table.CACHE_REQUESTS.outcomes}
        self._rows = made[table.INGEST_ROWS.name]
        self._chunks = made[table.INGEST_CHUNKS.name]
        self._messages = made[table.STREAM_MESSAGES.name]
        self._queries = made[table.IDSET_QUERY.name]
        self._compactions = made[table.IDSET_COMPACTIONS.name]

    def lock_wait(self, kind: str, seconds: float, outcome: str) -> None:
        """An acquire of a ``kind`` primitive ended after ``seconds``, with ``outcome``."""
        label = table.primitive_label(kind)
        self._wait.record(seconds, {table.PRIMITIVE: label, table.OUTCOME: outcome})

    def lock_hold(self, kind: str, seconds: float) -> None:
        """A hold of a ``kind`` primitive was released after ``seconds``."""
        self._hold.record(seconds, {table.PRIMITIVE: table.primitive_label(kind)})

    def lock_lost(self, kind: str) -> None:
        """A hold of a ``kind`` primitive was lost while held."""
        self._lost.add(1, {table.PRIMITIVE: table.primitive_label(kind)})

    def lock_renewal(self, kind: str, ok: bool) -> None:
        """The watchdog renewed a ``kind`` primitive's hold (``ok``), or failed to."""
        outcome = table.OK if ok else table.FAILED
        self._renewals.add(
            1, {table.PRIMITIVE: table.primitive_label(kind), table.OUTCOME: outcome}
        )

    def cache_request(self, result: str) -> None:
        """A cache request ended with ``result`` (``hit``, ``miss``, ...)."""
        self._requests.add(1, self._results[result])

    def cache_load(self, seconds: float) -> None:
        """A loader took ``seconds``, and its value was stored."""
        self._loads.record(seconds)

    def cache_load_error(self) -> None:
        """A load failed."""
        self._load_errors.add(1)

    def ingest_rows(self, rows: int) -> None:
        """An ingestion worker appended ``rows`` rows."""
        self._rows.add(rows)

    def ingest_chunk(self, outcome: str) -> None:
        """A chunk was finished (``done``) or claimed after its lease ran out (``taken_over``)."""
        self._chunks.add(1, {table.OUTCOME: outcome})

    def stream_messages(self, count: int, outcome: str) -> None:
        """``count`` messages of a consumer were ``acked``, ``failed`` or ``dead_lettered``."""
        self._messages.add(count, {table.OUTCOME: outcome})

    def idset_query(self, operation: str, seconds: float) -> None:
        """An id set query ``operation`` took ``seconds``."""
        self._queries.record(seconds, {table.OPERATION: operation})

    def idset_compaction(self) -> None:
        """An id set's rebuilt compact form was swapped in by this process."""
        self._compactions.add(1)


def _version() -> str | None:
    """The installed version of tenure, for the meter's scope (None if not installed)."""
    try:
        return importlib.metadata.version("tenure")
    except importlib.metadata.PackageNotFoundError:
        return None


def _cache_told(result: str) -> None:
    if (recorder := metrics()) is not None:
        recorder.cache_request(result)


CacheCounters.told = _cache_told

_recorder: Recorder | None = None
_looked = float("-inf")
_looking = threading.Lock()


def metrics() -> Recorder | None:
    """The recorder, or None when nobody listens (the lean path's one check)."""
    if time.monotonic() - _looked < LOOK_EVERY:
        return _recorder
    return refresh()


def refresh() -> Recorder | None:
    """Look for the application's meter provider now (and at most a second later again)."""
    global _recorder, _looked
    with _looking:
        _looked = time.monotonic()
        api = sys.modules.get("opentelemetry.metrics")
        provider = None if api is None else api.get_meter_provider()
        if provider is None or type(provider).__name__ in _NOBODY:
            _recorder = None
        elif _recorder is None or _recorder.provider is not provider:
            _recorder = Recorder(provider)
        return _recorder


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
    with _looking:
        _traced = time.monotonic()
        api = sys.modules.get("opentelemetry.trace")
        provider = None if api is None else api.get_tracer_provider()
        if provider is None or type(provider).__name__ in _NOBODY:
            _tracer = _tracer_provider = None
        elif provider is not _tracer_provider:
            _tracer, _tracer_provider = provider.get_tracer(table.TRACER, _version()), provider
        return _tracer


@contextlib.contextmanager
def span(
    name: str, kind: str | None, started: float | None = None, *, current: bool = False
) -> Iterator[Span | None]:
    """A span ``name`` around the block when a tracer provider is set (else None, for free).

    ``kind``: the primitive's class name, as ``tenure.primitive``; ``started``:
    when the operation began (monotonic), if before the block; ``current``:
    the block's own spans (a loader's queries) are its children. An exception
    ends it as ``cancelled`` or ``error`` (with the exception recorded).
    """
    tracer = _tracing()
    if tracer is None:
        yield None
        return
    attributes = {} if kind is None else {table.PRIMITIVE: table.primitive_label(kind)}
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
            current_span.record_exception(exc)
            error = api.Status(api.StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
            current_span.set_status(error)
        raise
    finally:
        current_span.end()
