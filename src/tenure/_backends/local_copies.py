"""The id sets' decoded copies held in this process.

Every :class:`~tenure.IdSet` and :class:`~tenure.AsyncIdSet` of the process
shares :data:`LOCAL_COPIES`: a copy read once is brought up to date with
only what was written after it (:mod:`tenure._core.idset` decodes; this
module keeps, every view's base made by
:func:`~tenure._backends.counting.make_base`). It lives here, beside the
backends, and not in the sans-IO core: it holds a lock and survives a fork
by forgetting what it held.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from tenure._backends.counting import make_base
from tenure._core.idset import DEFAULT_LOCAL_BYTES, Copy, ReadReply, SetView, decode_base
from tenure._core.values import to_text

__all__ = ["LOCAL_COPIES", "LocalCopies"]


class LocalCopies:
    """The decoded copies of one process, per client and key, least recently used out first.

    Bounded by ``max_bytes`` (the bytes each copy was built from, about its
    size in memory). Thread-safe; copies of a client that is gone are
    dropped with it.
    """

    def __init__(self, max_bytes: int = DEFAULT_LOCAL_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._copies: OrderedDict[tuple[int, str], Copy] = OrderedDict()
        self._bytes = 0
        self._clients: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def position(self, client: Any, key: str) -> tuple[str, int]:
        """Where the copy of ``key`` stands: (epoch, position); ('', 0) for none."""
        with self._lock:
            copy = self._copies.get((id(client), key))
            if copy is None:
                return "", 0
            self._copies.move_to_end((id(client), key))
            return copy.epoch, copy.position

    def snapshot(self, client: Any, key: str) -> Copy | None:
        """A consistent copy of the record of ``key`` (the view itself is shared)."""
        with self._lock:
            copy = self._copies.get((id(client), key))
            return None if copy is None else Copy(**vars(copy))

    def view_at(self, client: Any, key: str, at: tuple[str, int]) -> SetView | None:
        """The view of the copy of ``key`` if it stands at ``at`` (epoch, position), else None."""
        with self._lock:
            copy = self._copies.get((id(client), key))
            if copy is None or copy.position != at[1] or copy.epoch != at[0]:
                return None
            self._copies.move_to_end((id(client), key))
            return copy.view

    def absorb(
        self, client: Any, key: str, sent: tuple[str, int], reply: ReadReply, where: str
    ) -> SetView | None:
        """The set's view after ``reply`` to a read sent from position ``sent``.

        Returns None when the copy moved meanwhile so that the reply does
        not fit it (the caller reads again). Raises
        :class:`~tenure.IdSetCorruptError` before changing anything if the
        reply does not validate.
        """
        slot = (id(client), key)
        if reply.kind == 2:
            bitmap, blob = decode_base(reply.base[:3], reply.base[3], where)
            view = SetView.of(bitmap, blob, make_base).applied(reply.elements, where, reply.start)
            end = reply.start + len(reply.elements)
            whole = Copy(reply.epoch, reply.version, end, view, reply.base_pos)
            with self._lock:
                self._store(client, slot, whole)
            return view
        with self._lock:
            copy = self._copies.get(slot)
            if copy is None:
                if reply.kind == 0 and sent == ("", 0):  # a set never written
                    copy = Copy(
                        reply.epoch, reply.version, 0, SetView.empty(make_base), reply.base_pos
                    )
                    self._store(client, slot, copy)
                    return copy.view
                return None
            end = reply.start + len(reply.elements)
            if copy.epoch != reply.epoch or not reply.start <= copy.position:
                return None
            if copy.position < end:
                fresh = reply.elements[copy.position - reply.start :]
                view = copy.view.applied(fresh, where, copy.position)
                newer = Copy(copy.epoch, reply.version, end, view, reply.base_pos)
                self._store(client, slot, newer)
                return view
            copy.version = max(copy.version, reply.version)
            copy.base_pos = max(copy.base_pos, reply.base_pos)
            return copy.view

    def absorb_write(
        self, client: Any, key: str, reply: Sequence[Any], elements: Sequence[bytes]
    ) -> None:
        """Apply one's own write to the copy if it was current just before it.

        Saves reading one's own write back; otherwise the next read fetches
        what is missing.
        """
        version, end, epoch = int(reply[0]), int(reply[2]), to_text(reply[3])
        slot = (id(client), key)
        with self._lock:
            copy = self._copies.get(slot)
            if copy is None or copy.epoch != epoch or copy.position != end - len(elements):
                return
            view = copy.view.applied(elements, "a write", copy.position)
            self._store(client, slot, Copy(epoch, version, end, view, copy.base_pos))

    def compacted(self, client: Any, key: str, epoch: str, position: int) -> None:
        """Note that the compact form of ``key`` now covers the writes before ``position``."""
        with self._lock:
            copy = self._copies.get((id(client), key))
            if copy is not None and copy.epoch == epoch:
                copy.base_pos = max(copy.base_pos, position)

    def after_fork(self) -> None:
        """In a child process: a lock of its own (the parent's may have been held)."""
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every copy (the next read of each set reads it whole)."""
        with self._lock:
            self._copies.clear()
            self._bytes = 0

    def _store(self, client: Any, slot: tuple[int, str], copy: Copy) -> None:
        if client not in self._clients:
            self._clients[client] = id(client)
            weakref.finalize(client, self._forget_client, id(client))
        old = self._copies.pop(slot, None)
        if old is not None:
            self._bytes -= old.view.nbytes
        self._copies[slot] = copy
        self._bytes += copy.view.nbytes
        while self._bytes > self.max_bytes and len(self._copies) > 1:
            _, evicted = self._copies.popitem(last=False)
            self._bytes -= evicted.view.nbytes

    def _forget_client(self, client_id: int) -> None:
        with self._lock:
            for slot in [slot for slot in self._copies if slot[0] == client_id]:
                self._bytes -= self._copies.pop(slot).view.nbytes

    @property
    def nbytes(self) -> int:
        """The bytes the copies were built from, in all."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._copies)


LOCAL_COPIES = LocalCopies()
"""The copies of this process (sync and asyncio sets alike, told apart by client)."""

if hasattr(os, "register_at_fork"):  # a fork while another thread held the lock
    os.register_at_fork(after_in_child=LOCAL_COPIES.after_fork)
