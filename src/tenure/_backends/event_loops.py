"""A sync primitive used on a thread whose asyncio event loop is running.

A sync call blocks its thread, and with it any event loop that thread runs:
every task of that loop stops until the call returns. Three mistakes follow
from it, each told here in words that name the asyncio twin:

* a **wait that can never end**: a task holds a sync lock and awaits
  something; another task of the same loop asks for the same lock and
  blocks the thread, so the first task never runs again to release it.
  :func:`before_waiting` raises :class:`~tenure.AlreadyHeldError` at once;
* any **other wait** on such a thread stops the loop meanwhile: deliberate
  in a notebook (which runs a loop on the main thread), a mistake in a
  service. It goes on, with one ``RuntimeWarning`` per process;
* ``await lock.acquire()`` and ``async with lock:`` on a sync object: the
  first would take the lock and then fail to await a bool, the second is
  refused by Python with no hint. :func:`refuse_awaited_call` and
  :class:`TwinHints` raise a ``TypeError`` naming the twin first.

Threads only (``tenure._backends.for_threads`` re-exports what the
generated code calls); under asyncio the same names do nothing.
"""

from __future__ import annotations

import dis
import inspect
import os
import sys
import threading
import warnings
from typing import Any, NoReturn

from tenure._core.exceptions import AlreadyHeldError

__all__ = [
    "TwinHints",
    "before_waiting",
    "dropped_on_loop",
    "refuse_awaited_call",
    "taken_on_loop",
]

_mutex = threading.Lock()
_held: dict[int, dict[str, int]] = {}
"""Per thread (ident), the primitives' keys held by holds taken while its event loop ran."""
_warned = False


def _loop_running_here() -> bool:
    """Whether this thread is running an asyncio event loop (asyncio is never imported for it)."""
    asyncio: Any = sys.modules.get("asyncio")
    return asyncio is not None and asyncio._get_running_loop() is not None


def _twin(kind: str) -> str:
    return f"tenure.Async{kind} (on a redis.asyncio client)"


def taken_on_loop(key: str) -> int:
    """Note a hold of ``key`` taken now; the thread's ident if its event loop runs, else 0."""
    if not _loop_running_here():
        return 0
    ident = threading.get_ident()
    with _mutex:
        counts = _held.setdefault(ident, {})
        counts[key] = counts.get(key, 0) + 1
    return ident


def dropped_on_loop(ident: int, key: str) -> None:
    """Forget a hold of ``key`` that :func:`taken_on_loop` noted on thread ``ident``."""
    with _mutex:
        counts = _held.get(ident)
        if counts is None or key not in counts:
            return
        counts[key] -= 1
        if not counts[key]:
            del counts[key]
        if not counts:
            del _held[ident]


def before_waiting(kind: str, key: str, name: str) -> None:
    """About to block this thread waiting for ``key``: refuse a wait that cannot end.

    Raises :class:`~tenure.AlreadyHeldError` when this thread runs an event
    loop and a hold of the same primitive was taken on it (by another task of
    that loop, which cannot run to release it while the thread waits). Any
    other wait on a thread whose loop runs warns once per process.
    """
    global _warned
    if not _loop_running_here():
        return
    with _mutex:
        held_here = _held.get(threading.get_ident(), {}).get(key, 0) > 0
    if held_here:
        raise AlreadyHeldError(
            f"a sync {kind} would wait on a thread whose asyncio event loop is running, for "
            "a hold taken on that same thread (by another task of the loop): the wait "
            "blocks the loop, so that task can never release; use "
            f"{_twin(kind)} in asyncio code",
            name=name,
        )
    if not _warned:
        _warned = True
        warnings.warn(
            f"tenure: a sync {kind} ({name!r}) waits on a thread whose asyncio event loop "
            f"is running: every task of that loop stops until it returns; in asyncio code "
            f"use {_twin(kind)}",
            RuntimeWarning,
            stacklevel=_callers_level(),  # the user's line that called acquire()
        )


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside tenure, seen from the warning's caller."""
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def _awaited(frame: Any) -> bool:
    """Whether ``frame`` (a coroutine's) awaits the result of the call it is making."""
    code = frame.f_code
    if not code.co_flags & inspect.CO_COROUTINE:
        return False
    key = (code, frame.f_lasti)
    found = _AWAITED.get(key)
    if found is None:
        found = _AWAITED[key] = _awaits_at(code, frame.f_lasti)
        if len(_AWAITED) > _AWAITED_CAP:  # code made at run time: start again
            _AWAITED.clear()
    return found


def _awaits_at(code: Any, lasti: int) -> bool:
    """Whether the call at ``lasti`` in ``code`` is followed by an await of its result."""
    # The call being made is the last instruction at or before lasti (which may
    # point into the call's inline caches); an await of its result follows it.
    instructions = list(dis.get_instructions(code))
    for following in instructions[1:]:
        if following.offset > lasti:
            return following.opname == "GET_AWAITABLE"
    return False


_AWAITED: dict[tuple[Any, int], bool] = {}
""":func:`_awaits_at` per call site (code object, offset): a sync lock used from a
coroutine asks it at every call, and reading the bytecode took ~1.5 ms a call."""
_AWAITED_CAP = 4096


def refuse_awaited_call(kind: str, method: str, depth: int) -> None:
    """Raise ``TypeError`` if the sync call ``depth`` frames up is being awaited.

    ``await lock.acquire()`` on a sync lock would take the lock and then fail
    to await its answer, leaving a hold nobody knows of: refused before
    anything is sent. Looked for only on a thread whose event loop runs.
    """
    if not _loop_running_here():
        return
    if _awaited(sys._getframe(depth + 1)):
        raise TypeError(
            f"{kind}.{method}() is tenure's sync (threads) API and cannot be awaited "
            f"(nothing was done); in asyncio code use {_twin(kind)} and await its {method}()"
        )


class TwinHints:
    """``async with`` and ``await`` on a sync primitive: a ``TypeError`` naming its twin."""

    __slots__ = ()

    def _refuse(self, what: str) -> NoReturn:
        kind = type(self).__name__
        raise TypeError(
            f"{kind} is tenure's sync (threads) class and does not support {what}; "
            f"use {_twin(kind)}"
        )

    async def __aenter__(self) -> NoReturn:
        self._refuse("'async with'")

    async def __aexit__(self, *exc: object) -> NoReturn:
        self._refuse("'async with'")

    def __await__(self) -> NoReturn:
        self._refuse("'await'")
