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

import atexit
import collections
import contextlib
import functools
import importlib.metadata
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tenure._core import telemetry as table
from tenure._core.cache import CacheCounters

__all__ = [
    "Recorder",
    "Span",
    "flush",
    "lock_held",
    "lock_lost_found",
    "lock_waited",
    "metrics",
    "paused",
    "refresh",
    "span",
]

LOOK_EVERY = 1.0
"""Seconds between two looks for a meter provider set by the application."""

DRAIN_EVERY = 0.05
"""Seconds between two hand-overs of the noted measurements to the SDK."""

_NOBODY = (
    "_ProxyMeterProvider",
    "ProxyMeterProvider",
    "NoOpMeterProvider",
    "ProxyTracerProvider",
    "NoOpTracerProvider",
)


class _Totals:
    """One counter's totals by attribute set, kept by tenure and observed by the SDK.

    The SDK reads them when it collects (an observable counter), so counting
    costs an addition, not the SDK's few microseconds a point.
    """

    def __init__(self) -> None:
        self._values: dict[int, float] = {}
        self._attributes: dict[int, dict[str, Any] | None] = {}
        self._lock = threading.Lock()

    def add(self, value: float, attributes: dict[str, Any] | None) -> None:
        """Add ``value`` to the total of ``attributes`` (a dict made once and shared)."""
        key = id(attributes)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + value
            self._attributes[key] = attributes

    def observe(self, options: Any) -> list[Any]:
        """The SDK's callback: every total so far, cumulative."""
        observation = sys.modules["opentelemetry.metrics"].Observation
        with self._lock:
            return [
                observation(value, self._attributes[key]) for key, value in self._values.items()
            ]

    def forked(self) -> None:
        """In a forked child: counting starts from nothing."""
        self._values, self._attributes, self._lock = {}, {}, threading.Lock()


class Recorder:
    """The instruments on one meter provider, recorded with tenure's attributes.

    A call only notes its measurement (a few hundred nanoseconds); a thread
    of its own hands the notes to the SDK every :data:`DRAIN_EVERY` seconds
    (and :func:`flush` at once), so the SDK's cost of several microseconds a
    measurement is paid while the primitives wait on the network, never on
    their path. A scrape may miss the last fraction of a second; the next
    one has it.
    """

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self._totals: list[_Totals] = []
        meter = provider.get_meter(table.METER, _version())
        made: dict[str, Any] = {}
        for each in table.INSTRUMENTS:
            if each.kind == "histogram":
                histogram = meter.create_histogram(
                    each.name, unit=each.unit, description=each.description
                )
                made[each.name] = functools.partial(self._later, histogram.record)
            else:  # tenure's own totals, read by the SDK when it collects: free to add to
                totals = _Totals()
                meter.create_observable_counter(
                    each.name, [totals.observe], unit=each.unit, description=each.description
                )
                made[each.name] = totals.add
                self._totals.append(totals)
        self._wait = made[table.LOCK_WAIT.name]
        self._hold = made[table.LOCK_HOLD.name]
        self._lost = made[table.LOCK_LOST.name]
        self._renewals = made[table.LOCK_RENEWALS.name]
        self._requests = made[table.CACHE_REQUESTS.name]
        self._loads = made[table.CACHE_LOAD.name]
        self._load_errors = made[table.CACHE_LOAD_ERRORS.name]
        self._rows = made[table.INGEST_ROWS.name]
        self._chunks = made[table.INGEST_CHUNKS.name]
        self._messages = made[table.STREAM_MESSAGES.name]
        self._queries = made[table.IDSET_QUERY.name]
        self._compactions = made[table.IDSET_COMPACTIONS.name]
        self._pending: collections.deque[tuple[Any, float, dict[str, Any] | None]] = (
            collections.deque()
        )
        self._attributes: dict[tuple[str, ...], dict[str, Any]] = {}
        self._by_kind: dict[tuple[str, str], dict[str, Any]] = {}  # a lock's, by class
        self._drainer: threading.Thread | None = None
        self._flushing = threading.Lock()

    def _later(self, record: Any, value: float, attributes: dict[str, Any] | None) -> None:
        """Note a histogram's point; the drainer records it into the SDK."""
        self._pending.append((record, value, attributes))
        if self._drainer is None:  # not started yet, or forked since
            self._start()

    def _start(self) -> None:
        with _looking:
            if self._drainer is not None:
                return
            self._drainer = threading.Thread(
                target=self._drain_forever, name="tenure-metrics", daemon=True
            )
            self._drainer.start()

    def forked(self) -> None:
        """In a forked child: no drainer runs here yet, and nothing counted is this process's."""
        self._drainer = None
        self._pending.clear()
        self._flushing = threading.Lock()
        for totals in self._totals:
            totals.forked()

    def _drain_forever(self) -> None:
        while True:
            time.sleep(DRAIN_EVERY)
            self.flush()

    def flush(self) -> None:
        """Hand every noted measurement to the SDK now.

        One drain at a time: once it returns, everything noted before the
        call was recorded.
        """
        pending = self._pending
        with self._flushing:
            while pending:
                record, value, attributes = pending.popleft()
                record(value, attributes)

    def _labelled(self, *pairs: str) -> dict[str, Any]:
        """The attributes of ``pairs`` (key, value, ...), made once and shared."""
        found = self._attributes.get(pairs)
        if found is None:
            found = self._attributes[pairs] = dict(zip(pairs[::2], pairs[1::2], strict=True))
        return found

    def _by_primitive(self, record: Any, kind: str, outcome: str, value: float) -> None:
        """Note ``value`` for a ``kind`` primitive, with ``outcome`` ("": none).

        Its attributes are made once per class and outcome.
        """
        attributes = self._by_kind.get((kind, outcome))
        if attributes is None:
            pairs: tuple[str, ...] = (table.PRIMITIVE, table.primitive_label(kind))
            if outcome:
                pairs += (table.OUTCOME, outcome)
            attributes = self._by_kind[(kind, outcome)] = self._labelled(*pairs)
        record(value, attributes)

    def lock_wait(self, kind: str, seconds: float, outcome: str) -> None:
        """An acquire of a ``kind`` primitive ended after ``seconds``, with ``outcome``."""
        self._by_primitive(self._wait, kind, outcome, seconds)

    def lock_hold(self, kind: str, seconds: float) -> None:
        """A hold of a ``kind`` primitive was released after ``seconds``."""
        self._by_primitive(self._hold, kind, "", seconds)

    def lock_lost(self, kind: str) -> None:
        """A hold of a ``kind`` primitive was lost while held."""
        self._by_primitive(self._lost, kind, "", 1)

    def lock_renewal(self, kind: str, ok: bool) -> None:
        """The watchdog renewed a ``kind`` primitive's hold (``ok``), or failed to."""
        self._by_primitive(self._renewals, kind, table.OK if ok else table.FAILED, 1)

    def cache_request(self, result: str) -> None:
        """A cache request ended with ``result`` (``hit``, ``miss``, ...)."""
        self._requests(1, self._labelled(table.RESULT, result))

    def cache_load(self, seconds: float) -> None:
        """A loader took ``seconds``, and its value was stored."""
        self._loads(seconds, None)

    def cache_load_error(self) -> None:
        """A load failed."""
        self._load_errors(1, None)

    def ingest_rows(self, rows: int) -> None:
        """An ingestion worker appended ``rows`` rows."""
        self._rows(rows, None)

    def ingest_chunk(self, outcome: str) -> None:
        """A chunk was finished (``done``) or claimed after its lease ran out (``taken_over``)."""
        self._chunks(1, self._labelled(table.OUTCOME, outcome))

    def stream_messages(self, count: int, outcome: str) -> None:
        """``count`` messages of a consumer were ``acked``, ``failed`` or ``dead_lettered``."""
        self._messages(count, self._labelled(table.OUTCOME, outcome))

    def idset_query(self, operation: str, seconds: float) -> None:
        """An id set query ``operation`` took ``seconds``."""
        self._queries(seconds, self._labelled(table.OPERATION, operation))

    def idset_compaction(self) -> None:
        """An id set's rebuilt compact form was swapped in by this process."""
        self._compactions(1, None)


def lock_waited(kind: str, started: float, outcome: str) -> None:
    """An acquire of a ``kind`` primitive, called at ``started`` (monotonic), ended so."""
    if (recorder := metrics()) is not None:
        recorder.lock_wait(kind, time.monotonic() - started, outcome)


def lock_held(kind: str, taken: float) -> None:
    """A hold of a ``kind`` primitive, taken at ``taken`` (monotonic), was released."""
    if (recorder := metrics()) is not None:
        recorder.lock_hold(kind, time.monotonic() - taken)


def lock_lost_found(kind: str) -> None:
    """A hold of a ``kind`` primitive was found lost."""
    if (recorder := metrics()) is not None:
        recorder.lock_lost(kind)


def flush() -> None:
    """Hand every measurement noted so far to the SDK (before a read, at exit)."""
    recorder = _recorder
    if recorder is not None:
        recorder.flush()


atexit.register(flush)


def _after_fork_in_child() -> None:
    if _recorder is not None:
        _recorder.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Within the block, record nothing, as if no provider were set.

    The benchmarks measure what recording costs so: the same process, the
    same provider, with and without, alternately.
    """
    global _recorder, _looked
    with _looking:
        kept, _recorder, _looked = _recorder, None, float("inf")
    try:
        yield
    finally:
        with _looking:
            _recorder, _looked = kept, float("-inf")


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
