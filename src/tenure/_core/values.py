"""Values crossing the wire: a reply's text, durations validated and in milliseconds.

The one home of these conversions: every primitive, core and tool uses them
from here.
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

from tenure._core.exceptions import ArgumentError

__all__ = ["MAX_SECONDS", "check_seconds", "to_ms", "to_text"]

MAX_SECONDS = 10 * 365 * 86400
"""The longest duration tenure sends to a server (about ten years, in whole ms a
server's clock can add to its own without overflowing)."""


def to_text(value: Any) -> str:
    """Decode a reply element that may be bytes (``decode_responses=False``)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def to_ms(seconds: float | None) -> int:
    """Seconds to whole milliseconds, rounded up, at least 1; None or 0 give 0 (no limit).

    Rounded up, so a lease or a time to live is never shorter than asked.
    """
    if not seconds:
        return 0
    return max(1, math.ceil(seconds * 1000))


@overload
def check_seconds(
    argument: str,
    value: float,
    *,
    allow_none: bool,
    name: str | None,
    forever: Literal[False] = False,
    longest: float | None = MAX_SECONDS,
    positive: bool = False,
    least: float | None = None,
) -> float: ...


@overload
def check_seconds(
    argument: str,
    value: float | None,
    *,
    allow_none: bool,
    name: str | None,
    forever: bool = False,
    longest: float | None = MAX_SECONDS,
    positive: bool = False,
    least: float | None = None,
) -> float | None: ...


def check_seconds(
    argument: str,
    value: float | None,
    *,
    allow_none: bool,
    name: str | None,
    forever: bool = False,
    longest: float | None = MAX_SECONDS,
    positive: bool = False,
    least: float | None = None,
) -> float | None:
    """Refuse non-numeric, NaN, negative, infinite or too long durations, naming the argument.

    Returns the value, with infinity as None when ``forever`` (a wait with no
    deadline: ``blocking_timeout=math.inf`` means what None means). ``longest``
    (None: no bound) is the longest the value may be: a lease or wait the
    server counts in milliseconds. ``positive`` refuses 0 too; ``least``
    (None: 0) is the shortest the value may be. A refusal names the bound the
    value missed as the argument has it (a negative ``timeout`` is told it
    must be > 0, not >= 0).
    """
    if (
        (type(value) is float or type(value) is int)
        and 0 < value < math.inf
        and (longest is None or value <= longest)
        and (least is None or value >= least)
    ):
        return value  # the usual case, checked at every lock made: a finite, positive number
    if value is None:
        if allow_none:
            return None
        raise ArgumentError(argument, "must be a number of seconds, not None", name=name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(
            argument, f"must be a number of seconds, got {type(value).__name__}", name=name
        )
    if math.isnan(value):
        raise ArgumentError(argument, "must be a number of seconds >= 0, got NaN", name=name)
    if least is not None and value < least:
        raise ArgumentError(
            argument, f"must be at least {least:g} seconds, got {value!r}", name=name
        )
    if value < 0:
        bound = "> 0" if positive else ">= 0"
        raise ArgumentError(argument, f"must be {bound} seconds, got {value!r}", name=name)
    if math.isinf(value):
        if forever:
            return None
        fix = " (None: held until released)" if allow_none and argument == "timeout" else ""
        raise ArgumentError(argument, f"must be a finite number of seconds{fix}", name=name)
    if positive and value == 0:
        raise ArgumentError(argument, "must be > 0 seconds, got 0", name=name)
    if longest is not None and value > longest:
        said = " (ten years)" if longest == MAX_SECONDS else ""
        raise ArgumentError(
            argument, f"must be at most {longest} seconds{said}, got {value!r}", name=name
        )
    return value
