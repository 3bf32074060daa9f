"""The herd cache's re-entry guard: a loader that asks for its own entry.

A loader runs with the entries it loads marked in a context variable
(this thread or task's); a fetch of a marked
entry would wait for its own load for ever, so it raises
:class:`~tenure.CacheReentryError` instead. ``@cached`` functions that call
each other in a cycle meet it the same way.
"""

from __future__ import annotations

import contextvars
from typing import NoReturn

from tenure._core.exceptions import CacheReentryError

__all__ = ["LOADING", "enter", "leave", "refuse"]

LOADING: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "tenure_cache_loading", default=frozenset()
)
"""The entries whose loads the current thread or task runs (a loader asking for one
of them would wait for itself)."""

Entered = contextvars.Token[frozenset[str]]


def refuse(stored: str, name: str) -> NoReturn:
    """:class:`CacheReentryError`: ``stored`` is loaded here now (by this thread or task).

    Called when ``stored in LOADING.get()`` (asked inline at every fetch).
    """
    raise CacheReentryError(
        f"the loader of {stored!r} asked for that same entry (directly or through "
        "another function): it would wait for its own load for ever; load it "
        "without the cache inside its loader (say the wrapper's .uncached)",
        name=name,
    )


def enter(stored: str) -> Entered:
    """Mark ``stored`` as loaded here, while its loader runs."""
    return LOADING.set(LOADING.get() | {stored})


def leave(entered: Entered) -> None:
    """Undo :func:`enter`."""
    LOADING.reset(entered)
