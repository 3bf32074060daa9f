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
import fnmatch
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
from tenure._core.exceptions import ArgumentError

__all__ = [
    "LOOK_EVERY",
    "NOBODY",
    "Recorder",
    "Subject",
    "flush",
    "lock_gave_up",
    "lock_held",
    "lock_lost_found",
    "lock_waited",
    "looking",
    "metrics",
    "paused",
    "refresh",
    "set_metric_names",
    "shown_name",
    "subject",
    "unhanded",
    "version",
]

LOOK_EVERY = 1.0
"""Seconds between two looks for a meter provider set by the application."""

DRAIN_EVERY = 0.05
"""Seconds between two hand-overs of the noted measurements to the SDK."""

NOBODY = (
    "_ProxyMeterProvider",
    "ProxyMeterProvider",
    "NoOpMeterProvider",
    "ProxyTracerProvider",
    "NoOpTracerProvider",
)

_interned: dict[tuple[str, ...], dict[str, Any]] = {}


def _attributes(pairs: tuple[str, ...]) -> dict[str, Any] | None:
    """The attributes of ``pairs`` (key, value, ...): one shared dict per set (None: empty).

    The totals are kept by dict, so equal attribute sets must be the same dict.
    """
    if not pairs:
        return None
    found = _interned.get(pairs)
    if found is None:
        found = _interned.setdefault(pairs, dict(zip(pairs[::2], pairs[1::2], strict=True)))
    return found


class Subject:
    """Who measurements are about: a primitive's kind and, when asked for, its name.

    Made once per primitive object (:func:`subject`); it keeps the attribute
    sets its measurements carry, so a measurement costs one dict look-up.
    """

    __slots__ = ("_base", "_made", "name", "primitive")

    def __init__(self, primitive: str | None, name: str | None) -> None:
        self.primitive = primitive
        """``tenure.primitive`` (``lock``, ``semaphore``...), or None (a cache, a job...)."""
        self.name = name
        """``tenure.name``, or None: the primitive's name is not reported."""
        base: tuple[str, ...] = ()
        if primitive is not None:
            base += (table.PRIMITIVE, primitive)
        if name is not None:
            base += (table.NAME, name)
        self._base = base
        self._made: dict[tuple[str, ...], dict[str, Any] | None] = {}

    def attributes(self, *pairs: str) -> dict[str, Any] | None:
        """The subject's attributes, and ``pairs`` (key, value, ...) if given."""
        try:
            return self._made[pairs]
        except KeyError:
            made = self._made[pairs] = _attributes(self._base + pairs)
            return made

    def __repr__(self) -> str:
        return f"<Subject {self.primitive} {self.name!r}>"


_subjects: dict[tuple[str | None, str | None], Subject] = {}
_named: tuple[str, ...] = ()
METRIC_NAMES_VARIABLE = "TENURE_METRIC_NAMES"
"""Read at import: patterns separated by commas, as :func:`set_metric_names` takes."""
LONGEST_METRIC_NAME = 200
"""The longest ``metric_name=`` taken (an attribute value every series carries)."""


def shown_name(name: str) -> str:
    r"""``name`` as ``tenure.name`` carries it when a pattern matched it.

    What ``metric_name=`` refuses is made to fit instead: characters that are
    not printable escaped (``\n``, ``\x00``), and a name longer than
    :data:`LONGEST_METRIC_NAME` cut, ending in ``...``.
    """
    if not name.isprintable():
        name = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in name)
    if len(name) > LONGEST_METRIC_NAME:
        name = name[: LONGEST_METRIC_NAME - 3] + "..."
    return name


def set_metric_names(*patterns: str) -> None:
    """Report ``tenure.name`` for the primitives whose name matches one of ``patterns``.

    Shell-style patterns (``"orders:*"``, ``"nightly-report"``; ``"*"``: every
    primitive), matched against the name a primitive is made with. They
    apply to primitives made after the call: call it at start-up. No
    patterns (the default): only primitives given ``metric_name=`` report a
    name, since every distinct name is a series of its own in the metrics
    backend. A matched name that ``metric_name=`` would refuse (not
    printable, or longer than 200 characters) is reported escaped (a line
    break as backslash n) and cut to 200 characters, ending in ``...``. The
    environment variable ``TENURE_METRIC_NAMES`` (patterns separated by
    commas; spaces around each are ignored, and so are empty items) sets
    them at import.
    """
    global _named
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern or not pattern.isprintable():
            raise ArgumentError(
                "set_metric_names", f"patterns are printable, non-empty strs, got {pattern!r}"
            )
    _named = tuple(patterns)


def subject(kind: str | None, name: str, metric_name: object = None) -> Subject:
    """The :class:`Subject` of a primitive named ``name`` (shared by equal ones).

    ``kind``: its class name, for ``tenure.primitive`` (None: not reported);
    ``metric_name``: the primitive's ``metric_name=`` (None: its name if it
    matches :func:`set_metric_names`' patterns, else no name).
    """
    if metric_name is not None:
        if not isinstance(metric_name, str) or not metric_name:
            raise ArgumentError(
                "metric_name", f"must be a non-empty str, got {metric_name!r}", name=name
            )
        if (
            len(metric_name) > LONGEST_METRIC_NAME
            or not metric_name.isprintable()
            or metric_name.isspace()
        ):
            raise ArgumentError(
                "metric_name",
                f"must be printable, not blank, and at most {LONGEST_METRIC_NAME} characters",
                name=name,
            )
        label: str | None = metric_name
    elif _named and any(fnmatch.fnmatchcase(name, pattern) for pattern in _named):
        label = shown_name(name)
    else:
        label = None
    primitive = None if kind is None else table.primitive_label(kind)
    found = _subjects.get((primitive, label))
    if found is None:
        found = _subjects.setdefault((primitive, label), Subject(primitive, label))
    return found


set_metric_names(
    *(p.strip() for p in os.environ.get(METRIC_NAMES_VARIABLE, "").split(",") if p.strip())
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
        meter = provider.get_meter(table.METER, version())
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
        self._drainer: threading.Thread | None = None
        self._flushing = threading.Lock()
        # At exit, before the SDK shuts down: its provider registered its own
        # shutdown when it was made, before this, and exit handlers run last first.
        atexit.register(self.flush)
        self.unhanded = False
        """Drop the noted durations instead of handing them to the SDK (:func:`unhanded`)."""

    def _later(self, record: Any, value: float, attributes: dict[str, Any] | None) -> None:
        """Note a histogram's point; the drainer records it into the SDK."""
        self._pending.append((record, value, attributes))
        if self._drainer is None:  # not started yet, or forked since
            self._start()

    def _start(self) -> None:
        with looking:
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
            if self.unhanded:
                pending.clear()
            while pending:
                record, value, attributes = pending.popleft()
                record(value, attributes)

    def lock_wait(self, who: Subject, seconds: float, outcome: str, error: str = "") -> None:
        """An acquire of ``who`` took ``seconds``; ``outcome`` (``error``: the class raised)."""
        if error:
            self._wait(seconds, who.attributes(table.OUTCOME, outcome, table.ERROR_TYPE, error))
        else:
            self._wait(seconds, who.attributes(table.OUTCOME, outcome))

    def lock_hold(self, who: Subject, seconds: float) -> None:
        """A hold of ``who`` was released after ``seconds``."""
        self._hold(seconds, who.attributes())

    def lock_lost(self, who: Subject) -> None:
        """A hold of ``who`` was lost while held."""
        self._lost(1, who.attributes())

    def lock_renewal(self, who: Subject, ok: bool) -> None:
        """The watchdog renewed a hold of ``who`` (``ok``), or failed to."""
        self._renewals(1, who.attributes(table.OUTCOME, table.OK if ok else table.FAILED))

    def cache_request(self, who: Subject, result: str, count: int = 1) -> None:
        """``count`` requests to cache ``who`` ended with ``result`` (``hit``, ``miss``...)."""
        self._requests(count, who.attributes(table.RESULT, result))

    def cache_load(self, who: Subject, seconds: float) -> None:
        """A loader of cache ``who`` took ``seconds``, and its value was stored."""
        self._loads(seconds, who.attributes())

    def cache_load_error(self, who: Subject) -> None:
        """A load of cache ``who`` failed."""
        self._load_errors(1, who.attributes())

    def ingest_rows(self, who: Subject, rows: int) -> None:
        """A worker of ingestion job ``who`` appended ``rows`` rows."""
        self._rows(rows, who.attributes())

    def ingest_chunk(self, who: Subject, outcome: str) -> None:
        """A chunk was finished (``done``) or claimed after its lease ran out (``taken_over``)."""
        self._chunks(1, who.attributes(table.OUTCOME, outcome))

    def stream_messages(self, who: Subject, count: int, outcome: str) -> None:
        """``count`` messages of a consumer were ``acked``, ``failed`` or ``dead_lettered``."""
        self._messages(count, who.attributes(table.OUTCOME, outcome))

    def idset_query(self, who: Subject, operation: str, seconds: float) -> None:
        """An id set query ``operation`` on ``who`` took ``seconds``."""
        self._queries(seconds, who.attributes(table.OPERATION, operation))

    def idset_compaction(self, who: Subject) -> None:
        """Id set ``who``'s rebuilt compact form was swapped in by this process."""
        self._compactions(1, who.attributes())


def lock_waited(who: Subject, started: float, outcome: str) -> None:
    """An acquire of ``who``, called at ``started`` (monotonic), ended with ``outcome``."""
    if (recorder := metrics()) is not None:
        recorder.lock_wait(who, time.monotonic() - started, outcome)


def lock_gave_up(who: Subject, started: float, exc: BaseException, cancelled: bool) -> None:
    """An acquire of ``who``, called at ``started``, ended with ``exc`` (``cancelled``, or not)."""
    if (recorder := metrics()) is not None:
        took = time.monotonic() - started
        if cancelled:
            recorder.lock_wait(who, took, table.CANCELLED)
        else:
            recorder.lock_wait(who, took, table.ERROR, table.error_type(exc))


def lock_held(who: Subject, taken: float) -> None:
    """A hold of ``who``, taken at ``taken`` (monotonic), was released."""
    if (recorder := metrics()) is not None:
        recorder.lock_hold(who, time.monotonic() - taken)


def lock_lost_found(who: Subject) -> None:
    """A hold of ``who`` was found lost."""
    if (recorder := metrics()) is not None:
        recorder.lock_lost(who)


def flush() -> None:
    """Hand every measurement noted so far to the SDK (before a read, at exit)."""
    recorder = _recorder
    if recorder is not None:
        recorder.flush()


def _after_fork_in_child() -> None:
    if _recorder is not None:
        _recorder.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def version() -> str | None:
    """The installed version of tenure, for the meter's scope (None if not installed)."""
    try:
        return importlib.metadata.version("tenure")
    except importlib.metadata.PackageNotFoundError:
        return None


def _cache_told(who: Any, result: str, count: int) -> None:
    if (recorder := metrics()) is not None:
        recorder.cache_request(who, result, count)


CacheCounters.told = _cache_told

_recorder: Recorder | None = None
_looked = float("-inf")
looking = threading.Lock()


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
    with looking:
        kept, _recorder, _looked = _recorder, None, float("inf")
    try:
        yield
    finally:
        with looking:
            _recorder, _looked = kept, float("-inf")


@contextlib.contextmanager
def unhanded() -> Iterator[None]:
    """Within the block, note durations as usual but never hand them to the SDK.

    For the cost benchmark: what tenure's own side costs, the SDK's taken away.
    """
    recorder = metrics()
    if recorder is None:
        yield
        return
    recorder.unhanded = True
    try:
        yield
    finally:
        recorder.flush()
        recorder.unhanded = False


def refresh() -> Recorder | None:
    """Look for the application's meter provider now (and at most a second later again)."""
    global _recorder, _looked
    with looking:
        _looked = time.monotonic()
        api = sys.modules.get("opentelemetry.metrics")
        provider = None if api is None else api.get_meter_provider()
        if provider is None or type(provider).__name__ in NOBODY:
            _recorder = None
        elif _recorder is None or _recorder.provider is not provider:
            _recorder = Recorder(provider)
        return _recorder
