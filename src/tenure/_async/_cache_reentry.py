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


def not_loading(stored: str, name: str) -> frozenset[str]:
    """The entries loaded here now; :class:`CacheReentryError` if ``stored`` is one."""
    loading = _loading.get()
    if stored in loading:
        raise CacheReentryError(
            f"the loader of {stored!r} asked for that same entry (directly or through "
            "another function): it would wait for its own load for ever; load it "
            "without the cache inside its loader (say the wrapper's .uncached)",
            name=name,
        )
    return loading


def enter(loading: frozenset[str], stored: str) -> Entered:
    """Mark ``stored`` as loaded here (``loading``: what :func:`not_loading` gave)."""
    return _loading.set(loading | {stored})


def leave(entered: Entered) -> None:
    """Undo :func:`enter`."""
    _loading.reset(entered)
