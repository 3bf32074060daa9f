"""The instruments tenure reports through OpenTelemetry: one table, read by dashboards.

Meter ``tenure``; durations in seconds; an outcome is an attribute
(``tenure.outcome``, ``tenure.result``), never an instrument of its own; no
attribute carries a key or a primitive's name unless asked for
(``tenure.name``: cardinality). docs/observability.md shows this table; the
I/O layer records through :mod:`tenure._backends.telemetry`, which imports
OpenTelemetry only when the application did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ACQUIRED",
    "CACHE_LOAD",
    "CACHE_LOAD_ERRORS",
    "CACHE_LOAD_SPAN",
    "CACHE_REQUESTS",
    "CANCELLED",
    "ERROR",
    "ERROR_TYPE",
    "FAILED",
    "FENCING_TOKEN",
    "GRANTED",
    "IDSET_COMPACTIONS",
    "IDSET_QUERY",
    "INGEST_CHUNKS",
    "INGEST_ROWS",
    "INSTRUMENTS",
    "LOCK_ACQUIRE_SPAN",
    "LOCK_HOLD",
    "LOCK_LOST",
    "LOCK_RENEWALS",
    "LOCK_WAIT",
    "METER",
    "NAME",
    "OK",
    "OPERATION",
    "OUTCOME",
    "PRIMITIVE",
    "QUEUED",
    "RESULT",
    "STREAM_MESSAGES",
    "TIMEOUT",
    "TRACER",
    "Instrument",
    "error_type",
    "primitive_label",
]

METER = "tenure"
"""The meter every instrument belongs to."""

PRIMITIVE = "tenure.primitive"
"""Which kind of primitive: ``lock``, ``reentrant_lock``, ``semaphore``, ``read_lock``..."""
OUTCOME = "tenure.outcome"
"""How an operation ended (the values each instrument lists)."""
RESULT = "tenure.result"
"""What a cache request found: ``hit``, ``miss``, ``stale``, ``wait``, ``fallback``."""
NAME = "tenure.name"
"""A primitive's name: only for those given ``metric_name=`` (cardinality)."""
ERROR_TYPE = "error.type"
"""The exception's class of an operation that ended in ``error`` (redis-py's name for it)."""

ACQUIRED, TIMEOUT, CANCELLED, ERROR = "acquired", "timeout", "cancelled", "error"
OK, FAILED = "ok", "failed"


@dataclass(frozen=True)
class Instrument:
    """One instrument: its name, kind, unit, what it measures and its attributes."""

    name: str
    kind: Literal["histogram", "counter"]
    unit: str
    description: str
    attributes: tuple[str, ...]
    outcomes: tuple[str, ...] = ()
    """The values its ``tenure.outcome`` (or ``tenure.result``) takes."""


LOCK_WAIT = Instrument(
    "tenure.lock.wait.duration",
    "histogram",
    "s",
    "Time from calling acquire to its return, by how it ended (an error: with its class).",
    (PRIMITIVE, OUTCOME, ERROR_TYPE),
    (ACQUIRED, TIMEOUT, CANCELLED, ERROR),
)
LOCK_HOLD = Instrument(
    "tenure.lock.hold.duration",
    "histogram",
    "s",
    "Time from an acquisition to its release (holds that were released).",
    (PRIMITIVE,),
)
LOCK_LOST = Instrument(
    "tenure.lock.lost",
    "counter",
    "{hold}",
    "Holds lost while held: a lease that ran out, a key taken or deleted, max_hold reached.",
    (PRIMITIVE,),
)
LOCK_RENEWALS = Instrument(
    "tenure.lock.renewals",
    "counter",
    "{renewal}",
    "The watchdog's lease renewals, by outcome (failed: an error, or the hold found gone).",
    (PRIMITIVE, OUTCOME),
    (OK, FAILED),
)

HIT, NEAR_HIT, MISS, STALE, WAIT, FALLBACK = "hit", "near_hit", "miss", "stale", "wait", "fallback"

CACHE_REQUESTS = Instrument(
    "tenure.cache.requests",
    "counter",
    "{request}",
    "Cache reads (get, fetch, @cached calls), one per request, by what it found.",
    (RESULT,),
    (HIT, NEAR_HIT, MISS, STALE, WAIT, FALLBACK),
)
CACHE_LOAD = Instrument(
    "tenure.cache.load.duration",
    "histogram",
    "s",
    "Time a loader took, for the loads whose value was stored.",
    (),
)
CACHE_LOAD_ERRORS = Instrument(
    "tenure.cache.load.errors",
    "counter",
    "{error}",
    "Loads that failed: the loader raised, or its value could not be encoded.",
    (),
)

DONE, TAKEN_OVER = "done", "taken_over"
ACKED, DEAD_LETTERED = "acked", "dead_lettered"

INGEST_ROWS = Instrument(
    "tenure.ingest.rows",
    "counter",
    "{row}",
    "Rows an ingestion worker appended to its sink (committed batches).",
    (),
)
INGEST_CHUNKS = Instrument(
    "tenure.ingest.chunks",
    "counter",
    "{chunk}",
    "Chunks a worker finished (done), and claims of chunks whose lease ran out (taken_over).",
    (OUTCOME,),
    (DONE, TAKEN_OVER),
)
STREAM_MESSAGES = Instrument(
    "tenure.stream.messages",
    "counter",
    "{message}",
    "A stream consumer's messages: acknowledged once handled, failed (the handler raised), "
    "or moved to the dead letters.",
    (OUTCOME,),
    (ACKED, FAILED, DEAD_LETTERED),
)

OPERATION = "tenure.operation"
"""An id set's query: ``intersection_count``, ``intersection``, ``jaccard``, ``top_overlaps``."""

IDSET_QUERY = Instrument(
    "tenure.idset.query.duration",
    "histogram",
    "s",
    "An id set query, from its call to its answer: revalidating every set, then counting.",
    (OPERATION,),
)
IDSET_COMPACTIONS = Instrument(
    "tenure.idset.compactions",
    "counter",
    "{compaction}",
    "Compact forms rebuilt and swapped in by this process.",
    (),
)

INSTRUMENTS = (
    LOCK_WAIT,
    LOCK_HOLD,
    LOCK_LOST,
    LOCK_RENEWALS,
    CACHE_REQUESTS,
    CACHE_LOAD,
    CACHE_LOAD_ERRORS,
    INGEST_ROWS,
    INGEST_CHUNKS,
    STREAM_MESSAGES,
    IDSET_QUERY,
    IDSET_COMPACTIONS,
)
"""Every instrument, in the order docs/observability.md lists them."""

TRACER = "tenure"
"""The tracer every span belongs to."""
LOCK_ACQUIRE_SPAN = "tenure.lock.acquire"
"""A span around an acquire that waits in line (none for one taken at once)."""
CACHE_LOAD_SPAN = "tenure.cache.load"
"""A span around a cache load (none on a hit)."""
FENCING_TOKEN = "tenure.fencing_token"
"""A granted hold's fencing token, on its acquire's span."""
QUEUED, GRANTED = "queued", "granted"
"""The events of an acquire's span."""

_LABELS: dict[str, str] = {}


def error_type(exc: BaseException) -> str:
    """``error.type``'s value for ``exc``: its class, with its module unless a builtin."""
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def primitive_label(kind: str) -> str:
    """``tenure.primitive``'s value for a class: ``AsyncReentrantLock`` -> ``reentrant_lock``."""
    label = _LABELS.get(kind)
    if label is None:
        label = re.sub(r"(?<!^)(?=[A-Z])", "_", kind.removeprefix("Async")).lower()
        _LABELS[kind] = label
    return label
