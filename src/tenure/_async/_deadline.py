"""Calls made by an acquire's deadline, whatever the server does.

An acquire with ``blocking_timeout`` races each call it makes against that
deadline (and :data:`GRACE`): a server that is paused, dead behind a client's
retries or cut off answers too late, and the call goes on alone; its outcome
goes to a handler that gives back what it took. Shared by the queued
primitives (:mod:`tenure._async._queue`) and :class:`AsyncConnectionLock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tenure._backends.for_asyncio import race, shielded

__all__ = ["GRACE", "Overdue", "answered", "by_deadline", "ignore_late", "room_left"]

GRACE = 0.2
"""Seconds past its deadline an acquire waits for the server's answer to a call.

A call the server has not answered by then (the server paused, dead behind a
client's retries, cut off) goes on alone; whatever it took is given back when
it ends, and ``acquire()`` returns False: ``blocking_timeout`` is kept within
a quarter of a second whatever the server does."""


def answered(outcomes: dict[int, Any]) -> bool:
    """Whether a raced call answered (with a reply or an error)."""
    return bool(outcomes)


class Overdue(Exception):
    """The server did not answer a call by the acquire's deadline (and GRACE)."""


async def by_deadline(
    deadline: float | None,
    call: Callable[[], Any],
    late: Callable[[int, Any], None],
    lane: object = None,
) -> Any:
    """``call()``'s reply, or :class:`Overdue` if the server has not answered by ``deadline``.

    Without a deadline the call runs to its reply (shielded). With one, a call
    the server has not answered :data:`GRACE` seconds past it goes on alone,
    its outcome handed to ``late(0, outcome)`` when it ends. ``lane``: the
    client called (see :func:`~tenure._backends.for_threads.race`).
    """
    if deadline is None:
        return await shielded(call())
    outcomes = await race([call], room_left(deadline), answered, late, [lane])
    if not outcomes:
        raise Overdue
    outcome = outcomes[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def room_left(deadline: float) -> float:
    """Seconds left for a call made now, by ``deadline`` and :data:`GRACE`."""
    return max(0.0, deadline + GRACE - time.monotonic())


def ignore_late(index: int, outcome: object) -> None:
    """A leave the server answers late: it did its work; nothing more to do."""
