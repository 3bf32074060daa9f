"""The herd cache's re-entry guard: a loader that asks for its own entry.

A loader runs with the entries it loads marked in a context variable
(this thread or task's); a fetch of a marked
entry would wait for its own load for ever, so it raises
:class:`~tenure.CacheReentryError` instead. ``@cached`` functions that call
each other in a cycle meet it the same way.
"""

from __future__ import annotations

import contextvars

from tenure._core.exceptions import CacheReentryError

__all__ = ["enter", "leave", "not_loading"]

_loading: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "tenure_cache_loading", default=frozenset()
)
"""The entries whose loads the current thread or task runs (a loader asking for one
of them would wait for itself)."""

Entered = contextvars.Token[frozenset[str]]


def not_loading(stored: str, name: str) -> None:
    """:class:`CacheReentryError` if ``stored`` is loaded here now (by this thread or task)."""
    if stored in _loading.get():
        raise CacheReentryError(
            f"the loader of {stored!r} asked for that same entry (directly or through "
            "another function): it would wait for its own load for ever; load it "
            "without the cache inside its loader (say the wrapper's .uncached)",
            name=name,
        )


def enter(stored: str) -> Entered:
    """Mark ``stored`` as loaded here, while its loader runs."""
    return _loading.set(_loading.get() | {stored})


def leave(entered: Entered) -> None:
    """Undo :func:`enter`."""
    _loading.reset(entered)
