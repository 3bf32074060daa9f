"""AsyncIdSet: a set of 32-bit ids kept compactly in Redis and intersected in memory.

Carlson's "Fast set intersection" problem: one user's followers against
thousands of others'. Redis sets cost 60-80 bytes per member and intersect
on the server, one command at a time. An id set keeps about 2 bytes per id
(a Roaring bitmap in its portable form, in plain Redis strings, no module
needed), and answers intersections from a decoded copy in this process,
revalidated against the server in one round trip per query (for any number
of sets), so an answer is never older than the query. With ``near=``, the
server announces writes (:mod:`tenure._async._cache_near`, as near caching
does) and a copy it has not announced a write to is answered with no round
trip at all, never older than ``max_staleness``.

Writes append to a log (:mod:`tenure._core.idset` draws the layout); the
write that takes the log past ``delta_limit`` ids folds it into a new
compact form, swapped in atomically.
"""

from __future__ import annotations

import secrets
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from tenure._async._cache_near import AsyncNearLayer, Reading
from tenure._async._scripting import AsyncClient, registry_for
from tenure._backends.counting import top_counts
from tenure._backends.for_asyncio import IS_ASYNC, refuse_awaited_call
from tenure._backends.local_copies import LOCAL_COPIES
from tenure._backends.near_tracking import dropped_here
from tenure._backends.owners import default_owner_name
from tenure._backends.telemetry import Subject, metrics, subject
from tenure._core.clients import map_exceptions, require_bytes_replies, require_client
from tenure._core.exceptions import ArgumentError, IdSetCorruptError
from tenure._core.idset import (
    COMPACTION_LEASE_MS,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_DELTA_LIMIT,
    STAGE_TTL_MS,
    IdSetKeys,
    IdSetStatistics,
    ReadReply,
    SetView,
    check_settings,
    encode_base,
    intersection_count,
    intersection_of,
    jaccard_of,
    one_id,
    pack,
    to_ids,
)
from tenure._core.near import NearCache, near_settings

__all__ = ["AsyncIdSet"]

_FORCE_FULL = ("!", 0)  # a position no set is at: the server sends everything


def _new_epoch() -> str:
    return secrets.token_hex(8)


class AsyncIdSet:
    """A set of unsigned 32-bit ids (0..2**32-1) stored compactly in Redis.

    * ``client`` — a redis-py client of this API (plain or cluster); every key of
      the set is under the ``{name}`` hash tag, so a cluster keeps it on one node.
    * ``name`` — the set; its keys are ``{prefix}{{name}}:meta``, ``:base`` and ``:log``.
    * ``delta_limit`` — ids written (added or removed) since the last
      compaction that make the write passing them compact the set.
    * ``chunk_bytes`` — the compact form is stored in chunks of at most this size.
    * ``metric_name`` — report this set's measurements with ``tenure.name``
      set to it (docs/observability.md); by default no name is reported
      unless :func:`~tenure.set_metric_names` matches ``name``.
    * ``near`` — ``True`` or a :class:`~tenure.NearCache`: the server
      announces writes to the sets under ``prefix`` (client-side caching, as
      near caches have it), and a query of sets with no write announced is
      answered from this process's copies with no round trip. Never older
      than ``max_staleness`` (0.1 s by default); this process's own writes
      are seen at once (docs/idsets.md).

    Queries revalidate this process's copy of every set involved in one
    round trip per client and answer from memory; writes are one round trip.
    """

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        prefix: str = "tenure:idset:",
        delta_limit: int = DEFAULT_DELTA_LIMIT,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        metric_name: str | None = None,
        near: bool | NearCache | None = None,
    ) -> None:
        check_settings(name, prefix, delta_limit, chunk_bytes)
        settings = near_settings(near, name)
        self._subject = subject(None, name, metric_name)
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        require_bytes_replies(
            client, owner=type(self).__name__, stores="binary bitmaps and ids", name=name
        )
        self.client = client
        self.name = name
        self.prefix = prefix
        self.delta_limit = delta_limit
        self.chunk_bytes = chunk_bytes
        self.keys = IdSetKeys.for_name(prefix, name)
        self._stats = IdSetStatistics()
        self._near = None if settings is None else _near_layer(client, prefix, settings, name)

    # -- writes ---------------------------------------------------------------

    async def add(self, value: int) -> None:
        """Add one id."""
        refuse_awaited_call(type(self).__name__, "add", 1)
        await self._write(b"+", np.array([one_id(value, name=self.name)], dtype=np.uint32))

    async def add_many(self, values: npt.ArrayLike | Iterable[int]) -> None:
        """Add ids: a numpy array of integers or an iterable of ints (one write)."""
        refuse_awaited_call(type(self).__name__, "add_many", 1)
        await self._write(b"+", to_ids(values, name=self.name))

    async def remove(self, value: int) -> None:
        """Remove one id (nothing happens if it is not in the set)."""
        refuse_awaited_call(type(self).__name__, "remove", 1)
        await self._write(b"-", np.array([one_id(value, name=self.name)], dtype=np.uint32))

    async def remove_many(self, values: npt.ArrayLike | Iterable[int]) -> None:
        """Remove ids: a numpy array of integers or an iterable of ints (one write)."""
        refuse_awaited_call(type(self).__name__, "remove_many", 1)
        await self._write(b"-", to_ids(values, name=self.name))

    async def clear(self) -> None:
        """Remove every id (the version moves on, like any write)."""
        refuse_awaited_call(type(self).__name__, "clear", 1)
        try:
            await registry_for(self.client).run(
                "idset_clear", self.keys.read, (_new_epoch(),), name=self.name
            )
        finally:
            dropped_here(self.keys.read)  # this process reads its own writes at once
        self._stats.writes += 1

    async def _write(self, sign: bytes, ids: npt.NDArray[np.uint32]) -> None:
        if not len(ids):
            return
        elements = pack(sign, ids)
        try:
            reply = await registry_for(self.client).run(
                "idset_write", self.keys.read, (_new_epoch(), len(ids), *elements), name=self.name
            )
        finally:
            dropped_here(self.keys.read)  # this process reads its own writes at once
        self._stats.writes += 1
        self._stats.ids_written += len(ids)
        LOCAL_COPIES.absorb_write(self.client, self.keys.meta, reply, elements)
        if int(reply[1]) >= self.delta_limit:
            await self.compact()

    async def compact(self) -> bool:
        """Fold the log into a new compact form now; True if this call did.

        False if the log was empty or another process is compacting. The
        new form is uploaded beside the old one and swapped in by one script
        with the log elements it merged; a compactor that dies leaves the
        set as it was (its upload expires, its lease too).
        """
        refuse_awaited_call(type(self).__name__, "compact", 1)
        token = secrets.token_hex(8)
        # the lease's value names the compactor too (tenure inspect shows it: host:pid)
        lease = f"{token} {default_owner_name()}"
        with map_exceptions(name=self.name, doing="taking the compaction lease"):
            if not await self.client.set(self.keys.lease, lease, nx=True, px=COMPACTION_LEASE_MS):
                return False
        try:
            await _views([self])
            copy = LOCAL_COPIES.snapshot(self.client, self.keys.meta)
            if copy is None or copy.position <= copy.base_pos:
                return False  # the compact form has every write already
            # The view holds the writes before `position` at least; any applied
            # since stay in the log past the new form, and applying them again
            # changes nothing.
            encoded = encode_base(copy.view.to_bitmap(), self.chunk_bytes)
            stage = self.keys.stage(token)
            with map_exceptions(name=self.name, doing="uploading a compact form"):
                pipe = self.client.pipeline(transaction=False)
                pipe.delete(stage)
                for chunk in encoded.chunks:
                    pipe.rpush(stage, chunk)
                pipe.pexpire(stage, STAGE_TTL_MS)
                await pipe.execute()
            swapped = await registry_for(self.client).run(
                "idset_swap",
                (*self.keys.read, stage),
                (
                    copy.epoch,
                    copy.position,
                    encoded.size,
                    encoded.crc,
                    encoded.count,
                    len(encoded.chunks),
                    # writes kept for readers behind: bounded by the form's size too
                    min(self.delta_limit, encoded.count // 16),
                ),
                name=self.name,
            )
            if int(swapped) != 1:
                self._stats.compaction_conflicts += 1
                return False
            self._stats.compactions += 1
            if (recorder := metrics()) is not None:
                recorder.idset_compaction(self._subject)
            LOCAL_COPIES.compacted(self.client, self.keys.meta, copy.epoch, copy.position)
            return True
        finally:
            await registry_for(self.client).run(
                "compare_and_delete", (self.keys.lease,), (lease,), name=self.name
            )

    # -- reads ----------------------------------------------------------------

    async def version(self) -> int:
        """The set's version: one more with every write (0 for a set never written)."""
        with map_exceptions(name=self.name, doing="reading the version"):
            value = await self.client.hget(self.keys.meta, "version")
        return int(value or 0)

    async def contains(self, value: int) -> bool:
        """True if ``value`` is in the set."""
        checked = one_id(value, name=self.name)
        [view] = await _views([self])
        return checked in view

    async def count(self) -> int:
        """How many ids the set holds."""
        [view] = await _views([self])
        return len(view)

    async def to_numpy(self) -> npt.NDArray[np.uint32]:
        """The ids, sorted, as a numpy array of uint32."""
        [view] = await _views([self])
        return np.frombuffer(view.to_bitmap().to_array(), dtype=np.uint32)

    async def intersection_count(self, *others: AsyncIdSet) -> int:
        """How many ids are in this set and every one of ``others``."""
        started = time.monotonic()
        views = await _views([self, *_check_sets(others, type(self), "others")])
        return _queried(self._subject, "intersection_count", started, intersection_count(views))

    async def intersection(self, *others: AsyncIdSet) -> npt.NDArray[np.uint32]:
        """The ids in this set and every one of ``others``, sorted, as uint32."""
        started = time.monotonic()
        views = await _views([self, *_check_sets(others, type(self), "others")])
        found = np.frombuffer(intersection_of(views).to_array(), dtype=np.uint32)
        return _queried(self._subject, "intersection", started, found)

    async def jaccard(self, other: AsyncIdSet) -> float:
        """The Jaccard index: shared ids over all ids (1.0 equal, 0.0 disjoint or empty)."""
        started = time.monotonic()
        [checked] = _check_sets([other], type(self), "other")
        mine, theirs = await _views([self, checked])
        return _queried(self._subject, "jaccard", started, jaccard_of(mine, theirs))

    async def top_overlaps(
        self, others: Iterable[AsyncIdSet], k: int = 10
    ) -> list[tuple[AsyncIdSet, int]]:
        """The ``k`` sets of ``others`` sharing the most ids with this one, with the count.

        Largest first; ties keep the order of ``others``. Every set is
        revalidated in one round trip per client.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ArgumentError("k", f"must be an int >= 0, got {k!r}", name=self.name)
        started = time.monotonic()
        candidates = _check_sets(list(others), type(self), "others")
        views = await _views([self, *candidates])
        top = [(candidates[i], count) for i, count in top_counts(views[0], views[1:], k)]
        return _queried(self._subject, "top_overlaps", started, top)

    # -- introspection --------------------------------------------------------

    def statistics(self) -> IdSetStatistics:
        """A snapshot of this object's counters."""
        return IdSetStatistics(**vars(self._stats))

    def __repr__(self) -> str:
        copy = LOCAL_COPIES.snapshot(self.client, self.keys.meta)
        if copy is None:
            return f"<{type(self).__name__} {self.name!r} (no local copy)>"
        return (
            f"<{type(self).__name__} {self.name!r} version {copy.version}: "
            f"{len(copy.view):,} ids in the local copy>"
        )

    # unasync: async-only
    # unasync: sync-only
    # def __len__(self) -> int:
    #     """How many ids the set holds (one round trip, like :meth:`count`)."""
    #     return self.count()
    #
    # def __contains__(self, value: object) -> bool:
    #     """``value in ids``: :meth:`contains` (one round trip)."""
    #     return self.contains(value)  # type: ignore[arg-type]
    # unasync: end


Q = TypeVar("Q")


def _queried(who: Subject, operation: str, started: float, answer: Q) -> Q:
    """``answer``, once the metrics were told how long ``who``'s query took."""
    if (recorder := metrics()) is not None:
        recorder.idset_query(who, operation, time.monotonic() - started)
    return answer


def _check_sets(sets: Iterable[Any], kind: type[AsyncIdSet], argument: str) -> list[AsyncIdSet]:
    checked = list(sets)
    for position, item in enumerate(checked):
        if not isinstance(item, kind):
            raise ArgumentError(
                argument,
                f"item {position} is a {type(item).__name__}, not an {kind.__name__}",
            )
    return checked


_near_layers: weakref.WeakValueDictionary[tuple[int, str, NearCache], AsyncNearLayer] = (
    weakref.WeakValueDictionary()
)


def _near_layer(client: AsyncClient, prefix: str, settings: NearCache, name: str) -> AsyncNearLayer:
    """The near layer of the id sets under ``prefix`` on ``client`` (one for them all).

    Shared: one tracked prefix, and one set of entries (a set's is where
    its copy stood when last read), however many set objects there are.
    """
    key = (id(client), prefix, settings)
    layer = _near_layers.get(key)
    if layer is None or layer.client is not client:
        layer = AsyncNearLayer(client, prefix, settings, name)
        _near_layers[key] = layer
    return layer


def _near_at(near: AsyncNearLayer, keys: Sequence[str]) -> tuple[str, int] | None:
    """Where a set's copy stood when read, if no write to any of its ``keys`` was announced.

    Every key of the set is kept near, with the same position: a write to
    any of them (a client not tenure's may touch one alone) drops it.
    """
    at = None
    for key in keys:
        found, data = near.get(key)
        if not found or (at is not None and data != at):
            return None
        at = data
    return at


async def _views(sets: Sequence[AsyncIdSet]) -> list[SetView]:
    """The current view of each set: one round trip per client (more only on a race).

    None for sets with ``near=`` whose copy no write was announced to since
    it was read.
    """
    views: list[SetView | None] = [None] * len(sets)
    by_client: dict[int, list[int]] = {}
    for index, item in enumerate(sets):
        near = item._near
        at = None if near is None else _near_at(near, item.keys.read)
        if at is not None and (view := LOCAL_COPIES.view_at(item.client, item.keys.meta, at)):
            views[index] = view
            item._stats.near_reads += 1
            continue
        by_client.setdefault(id(item.client), []).append(index)
    for indices in by_client.values():
        await _read(sets, indices, views, force=False)
        missed = [i for i in indices if views[i] is None]
        if missed:
            await _read(sets, missed, views, force=True)
    return [view for view in views if view is not None]


async def _read(
    sets: Sequence[AsyncIdSet], indices: list[int], views: list[SetView | None], *, force: bool
) -> None:
    client = sets[indices[0]].client
    sent = {
        i: _FORCE_FULL if force else LOCAL_COPIES.position(client, sets[i].keys.meta)
        for i in indices
    }
    calls = [(sets[i].keys.read, sent[i]) for i in indices]
    readings: dict[int, list[Reading]] = {}
    for i in indices:  # (begun before the read: a write announced meanwhile wins)
        near = sets[i]._near
        if near is not None:
            readings[i] = [near.begin(key) for key in sets[i].keys.read]
    try:
        replies = await registry_for(client).run_many(
            "idset_read", calls, name=sets[indices[0]].name
        )
        for i, raw in zip(indices, replies, strict=True):
            item = sets[i]
            try:
                reply = ReadReply.parse(raw, item.keys.meta)
                views[i] = LOCAL_COPIES.absorb(
                    client, item.keys.meta, sent[i], reply, item.keys.meta
                )
            except IdSetCorruptError as exc:
                exc.name = exc.lock_name = item.name
                raise
            item._stats.count_read(reply.kind, reply.received)
    finally:
        for i, begun in readings.items():
            keys = sets[i].keys
            at = LOCAL_COPIES.position(client, keys.meta) if views[i] is not None else None
            for key, reading in zip(keys.read, begun, strict=True):
                sets[i]._near.finish(key, reading, at)  # type: ignore[union-attr]
