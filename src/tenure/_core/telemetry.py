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
    "CACHE_REQUESTS",
    "CANCELLED",
    "ERROR",
    "FAILED",
    "INSTRUMENTS",
    "LOCK_HOLD",
    "LOCK_LOST",
    "LOCK_RENEWALS",
    "LOCK_WAIT",
    "METER",
    "NAME",
    "OK",
    "OUTCOME",
    "PRIMITIVE",
    "RESULT",
    "TIMEOUT",
    "Instrument",
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
    "Time from calling acquire to its return, by how it ended.",
    (PRIMITIVE, OUTCOME),
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

HIT, MISS, STALE, WAIT, FALLBACK = "hit", "miss", "stale", "wait", "fallback"

CACHE_REQUESTS = Instrument(
    "tenure.cache.requests",
    "counter",
    "{request}",
    "Cache reads (get, fetch, @cached calls), one per request, by what it found.",
    (RESULT,),
    (HIT, MISS, STALE, WAIT, FALLBACK),
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

INSTRUMENTS = (
    LOCK_WAIT,
    LOCK_HOLD,
    LOCK_LOST,
    LOCK_RENEWALS,
    CACHE_REQUESTS,
    CACHE_LOAD,
    CACHE_LOAD_ERRORS,
)
"""Every instrument, in the order docs/observability.md lists them."""

_LABELS: dict[str, str] = {}


def primitive_label(kind: str) -> str:
    """``tenure.primitive``'s value for a class: ``AsyncReentrantLock`` -> ``reentrant_lock``."""
    label = _LABELS.get(kind)
    if label is None:
        label = re.sub(r"(?<!^)(?=[A-Z])", "_", kind.removeprefix("Async")).lower()
        _LABELS[kind] = label
    return label
