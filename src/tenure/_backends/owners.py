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
``tenure._async._primitive``).

**fork()**: a child process inherits no hold. Every hold is stamped with the
process *generation* (bumped in a fork's child by ``os.register_at_fork``);
a slot of another generation forgets all it kept at its next use, so in the
child the lock is simply not held: nothing to release, extend or renew,
and the parent's hold stays the parent's. The child acquires its own.

Every operation is O(1) whatever the owner holds: the inherited holds live
in one small mutable :class:`_Frame` per owner's context (the context
variable points at it and at the frame's version then, so a context copied
later sees exactly the holds taken before the copy), never copied whole.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import secrets
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["BaseOwnerSlot", "default_owner_name", "generation", "new_token"]

T = TypeVar("T")

_generation = 0
"""This process's generation: 0, then bumped in the child at each fork()."""

_reset_mutex = threading.Lock()  # a slot of an older generation forgets its holds under it


def generation() -> int:
    """The generation of this process: a fork's child has a new one (no system call)."""
    return _generation


def _after_fork_in_child() -> None:
    global _generation, _reset_mutex, _token_prefix, _owner_name
    _generation += 1
    _reset_mutex = threading.Lock()  # it may have been held by a thread the child has not
    _token_prefix = secrets.token_hex(8)  # the parent's would repeat its next tokens
    _owner_name = None  # the parent's names the parent


_token_prefix = secrets.token_hex(8)
_token_count = itertools.count()
_owner_name: str | None = None


def default_owner_name() -> str:
    """``host:pid`` of this process, the owner name of a hold unless one is given.

    Made once per process (forgotten in a fork's child, which names itself):
    asked at every acquire, where ``os.getpid()`` would be a system call each time.
    """
    global _owner_name
    made = _owner_name
    if made is None:
        made = _owner_name = f"{socket.gethostname()}:{os.getpid()}"
    return made


def new_token() -> str:
    """A fresh token for one acquisition: 32 hex digits no other acquisition has.

    This process's random prefix (64 bits, drawn again in a fork's child) and
    a count (``next()`` of ``itertools.count`` is atomic under the GIL): unique
    without a system call per acquisition (``secrets.token_hex`` reads the
    kernel's random source every time: ~2 % of a lock cycle).
    """
    return f"{_token_prefix}{next(_token_count):016x}"


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Frame:
    """The holds taken in one owner's context, for the tasks and threads it starts.

    ``holds`` maps a slot's id to its hold and the frame's version when it
    was bound there. The context variable holds ``(frame, version)``: a
    context copied from the owner's keeps the version of the moment it was
    copied, so it inherits the holds bound up to then and none bound later.
    A context whose frame belongs to another owner starts a frame of its own
    on its first hold, reading on through ``parent`` (the context it was
    copied from) for what it inherited.
    """

    __slots__ = ("generation", "holds", "owner", "parent", "version")

    def __init__(self, owner: object, parent: tuple[_Frame, int] | None) -> None:
        self.owner = weakref.ref(owner)
        self.parent = parent
        self.holds: dict[int, tuple[Any, int]] = {}
        self.version = 0
        self.generation = _generation


_inherited: contextvars.ContextVar[tuple[_Frame, int] | None] = contextvars.ContextVar(
    "tenure_holds", default=None
)


def _inherited_hold(slot: int) -> Any:
    """The hold of ``slot`` this context inherited (or took), or None."""
    seen = _inherited.get()
    while seen is not None:
        frame, version = seen
        if frame.generation != _generation:
            return None  # bound before a fork: the parent's
        entry = frame.holds.get(slot)
        if entry is not None and entry[1] <= version:
            return entry[0]
        seen = frame.parent
    return None


def _frame_of(owner: object) -> _Frame:
    """The frame ``owner`` binds its holds in (made on its first hold in this context)."""
    seen = _inherited.get()
    if seen is not None:
        frame = seen[0]
        if frame.owner() is owner and frame.generation == _generation:
            return frame
        if frame.generation != _generation:
            seen = None
    return _Frame(owner, seen)


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
        self._generation = _generation
        self.forgot_at_fork = False
        """True in a fork's child once this slot dropped holds it inherited."""
        self._shared: T | None = None
        # id(owner) -> (the owner, its hold): a stale entry (an owner gone, its id
        # reused) is told by the reference, which no longer points to the owner
        self._by_owner: dict[int, tuple[weakref.ReferenceType[Any], T]] = {}
        # id(hold) -> (its owner, the hold, the frame it was bound in, id(owner))
        self._live: dict[int, tuple[weakref.ReferenceType[Any], T, _Frame | None, int]] = {}

    def _forked(self) -> None:
        """Forget every hold: a fork's child holds none of its parent's."""
        with _reset_mutex:
            if self._generation == _generation:
                return  # another thread of the child did it first
            self.forgot_at_fork = self._shared is not None or bool(self._live)
            self._shared = None
            self._by_owner = {}
            self._live = {}
            self._generation = _generation

    def get(self, adopt: bool = True) -> T | None:
        """The current owner's hold (own, inherited, or adopted when ``adopt``), or None."""
        if self._generation != _generation:
            self._forked()
        if not self._per_owner:
            return self._shared
        if not self._live:
            return None  # no hold at all: none to own, inherit or adopt
        owner = self._current()
        if owner is None:
            return None
        mine = self._by_owner.get(id(owner))
        if mine is not None and mine[0]() is owner:
            return mine[1]
        inherited = _inherited_hold(id(self))
        if inherited is not None:
            entry = self._live.get(id(inherited))
            if entry is not None and entry[1] is inherited:
                return inherited
        if not adopt:
            return None
        orphans = [entry for entry in self._live.values() if _gone(entry[0], self._finished)]
        if len(orphans) != 1:
            return None  # none, or several: nobody can tell whose to take over
        _, hold, frame, _ = orphans[0]
        self._bind(owner, hold, frame)
        return hold

    def set(self, value: T) -> None:
        """Make ``value`` the current owner's hold."""
        if self._generation != _generation:
            self._forked()
        if not self._per_owner:
            self._shared = value
            return
        owner = self._current()
        if owner is None:  # pragma: no cover - asyncio code always runs in a task
            raise RuntimeError("tenure's asyncio primitives must be used from a task")
        frame = _frame_of(owner)
        frame.version += 1
        frame.holds[id(self)] = (value, frame.version)
        _inherited.set((frame, frame.version))
        self._bind(owner, value, frame)

    def holds(self, value: T) -> bool:
        """True while ``value`` is a hold of this slot (not yet cleared)."""
        if self._generation != _generation:
            self._forked()
        if not self._per_owner:
            return self._shared is value
        return id(value) in self._live

    def clear(self, value: T) -> None:
        """Forget the hold ``value``, whoever owns it."""
        if self._generation != _generation:
            self._forked()
        if not self._per_owner:
            if self._shared is value:
                self._shared = None
            return
        entry = self._live.pop(id(value), None)
        if entry is None:
            return
        _, _, frame, owner_id = entry
        mine = self._by_owner.get(owner_id)
        if mine is not None and mine[1] is value:
            del self._by_owner[owner_id]
        if frame is not None:
            bound = frame.holds.get(id(self))
            if bound is not None and bound[0] is value:
                frame.holds.pop(id(self), None)

    def owners(self) -> int:
        """How many holds this slot keeps now (all owners)."""
        if self._generation != _generation:
            self._forked()
        if not self._per_owner:
            return int(self._shared is not None)
        return len(self._live)

    def _bind(self, owner: object, value: T, frame: _Frame | None) -> None:
        entry = self._live.get(id(value))
        if entry is not None:
            mine = self._by_owner.get(entry[3])
            if mine is not None and mine[1] is value:
                del self._by_owner[entry[3]]
        ref = weakref.ref(owner)
        self._by_owner[id(owner)] = (ref, value)
        self._live[id(value)] = (ref, value, frame, id(owner))


def _gone(ref: weakref.ReferenceType[Any], finished: Callable[[object], bool]) -> bool:
    owner = ref()
    return owner is None or finished(owner)
