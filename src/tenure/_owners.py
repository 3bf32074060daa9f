"""Who holds a primitive's hold: the rules both backends share.

A hold (one acquisition) belongs to the thread or task that took it, as
redis-py's ``thread_local=True`` promises. Three rules make that survive the
ways asyncio code really runs, and are the same for threads:

1. **Own**: the owner that took the hold finds it.
2. **Inherited**: a task (or thread) started *after* the hold was taken, from
   the owner's context, finds it too: ``asyncio.shield(lock.release())``,
   ``asyncio.create_task(lock.release())``, ``asyncio.to_thread(lock.release)``
   run the release in a task or thread of their own, which copies the
   owner's context.
3. **Orphaned**: a hold whose owner has *finished* may be taken over
   (adopted) by whoever next uses the same lock object to release, extend or
   inspect it: ``asyncio.wait_for(lock.acquire(), 2)`` (before Python 3.12)
   and ``asyncio.gather(lock.acquire())`` run the acquire in a task of their
   own that ends as soon as it returns. ``acquire`` never adopts: a second
   task that acquires waits for the hold to be released, as it should.

With ``per_owner=False`` (redis-py's ``thread_local=False``) every thread and
task shares one hold. A hold nobody can reach any more — its lock object was
garbage-collected — is no longer renewed and ends with its lease (see
``tenure._async._leased``).
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["BaseOwnerSlot"]

T = TypeVar("T")

# slot id -> hold taken in this context; copied into every task and thread started from it
_inherited: contextvars.ContextVar[dict[int, Any] | None] = contextvars.ContextVar(
    "tenure_holds", default=None
)


def _inherited_holds() -> dict[int, Any]:
    return _inherited.get() or {}


class BaseOwnerSlot(Generic[T]):
    """Per-owner storage of a primitive's holds (see the module docstring).

    The backends give it the two things that differ: who the current owner is
    (``None`` when there is none, e.g. outside any task) and whether an owner
    has finished.
    """

    def __init__(
        self,
        per_owner: bool,
        current: Callable[[], object | None],
        finished: Callable[[object], bool],
    ) -> None:
        self._per_owner = per_owner
        self._current = current
        self._finished = finished
        self._shared: T | None = None
        self._by_owner: weakref.WeakKeyDictionary[object, T] = weakref.WeakKeyDictionary()
        self._live: dict[int, tuple[weakref.ReferenceType[Any], T]] = {}

    def get(self, adopt: bool = True) -> T | None:
        """The current owner's hold (own, inherited, or adopted when ``adopt``), or None."""
        if not self._per_owner:
            return self._shared
        owner = self._current()
        if owner is None:
            return None
        value = self._by_owner.get(owner)
        if value is not None:
            return value
        inherited: T | None = _inherited_holds().get(id(self))
        if inherited is not None and id(inherited) in self._live:
            return inherited
        if not adopt:
            return None
        orphans = [hold for ref, hold in self._live.values() if _gone(ref, self._finished)]
        if len(orphans) != 1:
            return None  # none, or several: nobody can tell whose to take over
        self._bind(owner, orphans[0])
        return orphans[0]

    def set(self, value: T) -> None:
        """Make ``value`` the current owner's hold."""
        if not self._per_owner:
            self._shared = value
            return
        owner = self._current()
        if owner is None:  # pragma: no cover - asyncio code always runs in a task
            raise RuntimeError("tenure's asyncio primitives must be used from a task")
        self._bind(owner, value)
        _inherited.set({**_inherited_holds(), id(self): value})

    def holds(self, value: T) -> bool:
        """True while ``value`` is a hold of this slot (not yet cleared)."""
        if not self._per_owner:
            return self._shared is value
        return id(value) in self._live

    def clear(self, value: T) -> None:
        """Forget the hold ``value``, whoever owns it."""
        if not self._per_owner:
            if self._shared is value:
                self._shared = None
            return
        entry = self._live.pop(id(value), None)
        owner = None if entry is None else entry[0]()
        if owner is not None and self._by_owner.get(owner) is value:
            del self._by_owner[owner]
        context = _inherited_holds()
        if context.get(id(self)) is value:
            _inherited.set({k: v for k, v in context.items() if k != id(self)})

    def owners(self) -> int:
        """How many holds this slot keeps now (all owners)."""
        if not self._per_owner:
            return int(self._shared is not None)
        return len(self._live)

    def _bind(self, owner: object, value: T) -> None:
        entry = self._live.get(id(value))
        previous = None if entry is None else entry[0]()
        if previous is not None and self._by_owner.get(previous) is value:
            del self._by_owner[previous]
        self._by_owner[owner] = value
        self._live[id(value)] = (weakref.ref(owner), value)


def _gone(ref: weakref.ReferenceType[Any], finished: Callable[[object], bool]) -> bool:
    owner = ref()
    return owner is None or finished(owner)
