"""The sans-IO half of id sets: ids checked, the stored form, the log, local copies.

An id set (:class:`~tenure.IdSet`) holds unsigned 32-bit ids in plain Redis
values, every key under the set's ``{name}`` hash tag:

* ``meta``, a hash: ``epoch`` (a random token, new when the set is created
  or cleared), ``version`` (one more with every write), ``log_start`` and
  ``base_pos`` (positions, below), ``pending`` (ids written since the
  compact form), and the compact form's ``bytes``, ``crc`` (CRC-32),
  ``count`` and ``chunks``.
* ``log``, a list: the writes, one or more elements each; each element is
  ``+`` (added) or ``-`` (removed) and the ids as sorted little-endian
  uint32s. Elements have positions counted from the epoch's start; the
  list's first element is at ``log_start``.
* ``base``, a list: the compact form of the writes before ``base_pos``, a
  Roaring bitmap in its portable serialization (the format every Roaring
  library reads), cut into chunks far below the server's value limit.

A write appends to the log (one script, one round trip); it never rewrites
the compact form. A compaction folds the writes into a new compact form,
uploaded beside the old one and swapped in by one script, so a reader sees
the set before or after, never half of it; the log keeps the writes since
the previous compaction, so a reader that was up to date then catches up
from the log alone. Readers keep a decoded copy per set and its position,
and ask one script what they lack: nothing, the log past their position,
or the compact form and the log past it. Everything here is pure; the I/O is in
:mod:`tenure._async._idset`.
"""

from __future__ import annotations

import array
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from tenure._core.bases import Base, BaseMaker, PlainBase, plain_base
from tenure._core.exceptions import ArgumentError, IdSetCorruptError
from tenure._core.leased import check_name
from tenure._core.values import to_text

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_DELTA_LIMIT",
    "MAX_ID",
    "Copy",
    "Encoded",
    "IdSetKeys",
    "IdSetStatistics",
    "ReadReply",
    "SetView",
    "bitmap_of",
    "check_settings",
    "decode_base",
    "encode_base",
    "intersection_count",
    "intersection_of",
    "jaccard_of",
    "one_id",
    "pack",
    "pair_count",
    "to_ids",
]

MAX_ID = 2**32 - 1
"""The largest id: ids are unsigned 32-bit integers."""

DEFAULT_CHUNK_BYTES = 4 << 20
"""The compact form is stored in chunks of at most this many bytes (4 MiB)."""

DEFAULT_DELTA_LIMIT = 100_000
"""Ids written to the log before the write that passes this many compacts the set."""

ELEMENT_IDS = 1 << 20
"""Ids per log element at most (4 MiB): a large write is several elements of one write."""

COMPACTION_LEASE_MS = 60_000
"""How long one compactor holds the set's compaction lease (a crashed one frees it then)."""

STAGE_TTL_MS = 600_000
"""A compactor's upload expires after this long if its swap never comes."""

DEFAULT_LOCAL_BYTES = 1 << 30
"""The local copies of one process take about this much memory at most (1 GiB)."""

_EMPTY = np.zeros(0, dtype=np.uint32)


@dataclass(frozen=True)
class IdSetKeys:
    """The keys of one id set, all under the ``{name}`` hash tag."""

    meta: str  # hash: epoch, version, log_start, base_pos, pending, bytes, crc, count, chunks
    log: str  # list: the writes by position, the first at log_start
    base: str  # list: the compact form's chunks
    lease: str  # string: the compaction lease's token

    @classmethod
    def for_name(cls, prefix: str, name: str) -> IdSetKeys:
        """The keys of set ``name`` under ``prefix``."""
        base = f"{prefix}{{{name}}}"
        return cls(**{field: f"{base}:{field}" for field in cls.__dataclass_fields__})

    def stage(self, token: str) -> str:
        """Where the compactor ``token`` uploads a new compact form."""
        return self.meta.removesuffix(":meta") + f":stage:{token}"

    @property
    def read(self) -> tuple[str, str, str]:
        """The keys the read, write and clear scripts take."""
        return (self.meta, self.log, self.base)


def check_settings(name: object, prefix: object, delta_limit: object, chunk_bytes: object) -> None:
    """Refuse settings an id set cannot work with, naming the argument."""
    name = check_name(name)  # the keys' hash tag: a brace would split them across slots
    if not isinstance(prefix, str):
        raise ArgumentError("prefix", "must be a str", name=name)
    if isinstance(delta_limit, bool) or not isinstance(delta_limit, int) or delta_limit < 1:
        raise ArgumentError("delta_limit", f"must be an int >= 1, got {delta_limit!r}", name=name)
    if (
        isinstance(chunk_bytes, bool)
        or not isinstance(chunk_bytes, int)
        or not 1024 <= chunk_bytes <= 256 << 20
    ):
        raise ArgumentError(
            "chunk_bytes", f"must be an int in 1024..268435456, got {chunk_bytes!r}", name=name
        )


# -- ids ------------------------------------------------------------------------------


def one_id(value: object, *, argument: str = "id", name: str | None = None) -> int:
    """``value`` as an id, or :class:`~tenure.ArgumentError` saying why it is not one."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(
            argument, f"must be an int in 0..{MAX_ID}, got {type(value).__name__}", name=name
        )
    if not 0 <= int(value) <= MAX_ID:
        raise ArgumentError(argument, f"{int(value)} is outside 0..{MAX_ID}", name=name)
    return int(value)


def to_ids(
    values: object, *, argument: str = "ids", name: str | None = None
) -> npt.NDArray[np.uint32]:
    """Ids from a numpy array of integers or an iterable of ints, as uint32.

    Raises :class:`~tenure.ArgumentError` naming the first value that is not
    an int in ``0..2**32-1`` (and where it was), or a wrong kind of array.
    """
    if isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(
        values, (np.ndarray, Iterable)
    ):
        raise ArgumentError(
            argument,
            f"must be a numpy array or an iterable of ints, got {type(values).__name__}",
            name=name,
        )
    if isinstance(values, np.ndarray):
        array_ = values
        if array_.ndim != 1:
            raise ArgumentError(argument, f"must be one-dimensional, got {array_.ndim}", name=name)
        if array_.dtype.kind not in "iu":
            raise ArgumentError(
                argument, f"must hold integers, got an array of {array_.dtype}", name=name
            )
    else:
        items = list(values)
        if not items:
            return _EMPTY
        for position, item in enumerate(items):
            if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
                raise ArgumentError(
                    argument,
                    f"{item!r} (at position {position}) is not an int",
                    name=name,
                )
        try:
            array_ = np.asarray(items, dtype=np.int64)
        except OverflowError:
            array_ = np.asarray(items, dtype=object)
            bad = next(i for i, item in enumerate(items) if not 0 <= item <= MAX_ID)
            raise ArgumentError(
                argument, f"{items[bad]} (at position {bad}) is outside 0..{MAX_ID}", name=name
            ) from None
    if array_.size == 0:
        return _EMPTY
    if array_.dtype == np.uint32:
        return array_
    outside = (array_ < 0) | (array_ > MAX_ID) if array_.dtype.kind == "i" else array_ > MAX_ID
    if outside.any():
        bad = int(np.argmax(outside))
        raise ArgumentError(
            argument, f"{array_[bad]} (at position {bad}) is outside 0..{MAX_ID}", name=name
        )
    return array_.astype(np.uint32)


def pack(sign: bytes, ids: npt.NDArray[np.uint32]) -> list[bytes]:
    """A write's log elements: ``sign`` (``b"+"`` or ``b"-"``) and the ids sorted, little-endian.

    Sorted because a Roaring bitmap takes sorted ids many times faster.
    """
    ordered = np.sort(ids).astype("<u4", copy=False)
    return [
        sign + ordered[start : start + ELEMENT_IDS].tobytes()
        for start in range(0, len(ordered), ELEMENT_IDS)
    ]


def _element_ids(element: object, position: int, where: str) -> npt.NDArray[np.uint32]:
    """A log element's ids, or :class:`~tenure.IdSetCorruptError` if it is not a write."""
    if not isinstance(element, bytes) or len(element) % 4 != 1 or element[:1] not in (b"+", b"-"):
        shape = f"{len(element)} bytes" if isinstance(element, bytes) else type(element).__name__
        raise IdSetCorruptError(
            f"log element {position} of {where} is not a write (a sign and 4-byte ids): {shape}"
        )
    return np.frombuffer(element, dtype="<u4", offset=1)


def _roaring_input(ids: npt.NDArray[np.uint32]) -> array.array[int]:
    """``ids`` in the form a Roaring bitmap takes fastest: a sorted array of C unsigned ints."""
    if len(ids) > 1 and not bool((ids[1:] >= ids[:-1]).all()):
        ids = np.sort(ids)
    native = array.array("I")
    native.frombytes(ids.astype(np.uint32, copy=False).tobytes())
    return native


def bitmap_of(ids: npt.NDArray[np.uint32]) -> BitMap:
    """A bitmap of ``ids`` (any order, repeats allowed)."""
    return BitMap(_roaring_input(ids))


# -- the compact form -----------------------------------------------------------------


@dataclass(frozen=True)
class Encoded:
    """A set's compact form cut into chunks, with what a reader validates it by."""

    chunks: list[bytes]
    size: int
    crc: int
    count: int


def encode_base(form: BitMap, chunk_bytes: int) -> Encoded:
    """The portable Roaring serialization of ``form`` (run containers where they pay).

    ``form`` is optimized in place: pass a bitmap of the caller's own.
    """
    form.run_optimize()
    blob = form.serialize()
    chunks = [blob[start : start + chunk_bytes] for start in range(0, len(blob), chunk_bytes)]
    return Encoded(chunks, len(blob), zlib.crc32(blob), len(form))


def decode_base(meta: Sequence[Any], chunks: Sequence[bytes], where: str) -> tuple[BitMap, bytes]:
    """The compact form from its chunks, validated against ``meta`` (bytes, crc, count).

    Returns the bitmap and the serialized form it was read from.
    """
    try:
        size, crc, count = (int(value) for value in meta)
    except (TypeError, ValueError):
        raise IdSetCorruptError(f"{where}: its meta data is not numbers: {list(meta)!r}") from None
    if size == 0 and not chunks:
        if count:
            raise IdSetCorruptError(f"{where}: the compact form is missing ({count:,} ids)")
        return BitMap(), b""
    blob = b"".join(chunks)
    if len(blob) != size:
        raise IdSetCorruptError(
            f"{where}: the compact form has {len(blob):,} bytes in {len(chunks)} chunks, "
            f"{size:,} expected (truncated or altered)"
        )
    if zlib.crc32(blob) != crc:
        raise IdSetCorruptError(f"{where}: the compact form's CRC-32 does not match (altered)")
    try:
        bitmap = BitMap.deserialize(blob)
    except ValueError as exc:
        message = f"{where}: the compact form is not a Roaring bitmap: {exc}"
        raise IdSetCorruptError(message) from None
    if len(bitmap) != count:
        raise IdSetCorruptError(
            f"{where}: the compact form holds {len(bitmap):,} ids, {count:,} expected"
        )
    return bitmap, blob


# -- a set in memory ----------------------------------------------------------------------


@dataclass(frozen=True)
class SetView:
    """A set in memory: its compact form, plus the writes since, kept apart.

    The set is ``(base - removes) | adds``, with ``adds`` disjoint from the
    base and ``removes`` inside it, so counts combine the base's (in C, in
    parallel, with the bases of :mod:`tenure._backends.counting`) with small
    corrections. A view never changes: writes make a new one, and one whose
    writes grew past ``max(REBUILD_IDS, base/16)`` is rebuilt into a new
    compact form, its base made by ``make`` (the maker the view was made with).
    """

    base: Base
    adds: BitMap
    removes: BitMap
    make: BaseMaker = field(default=plain_base, compare=False, repr=False)

    @classmethod
    def empty(cls, make: BaseMaker = plain_base) -> SetView:
        """The view of a set with no ids (its rebuilds' bases made by ``make``)."""
        return cls(PlainBase(BitMap()), BitMap(), BitMap(), make)

    @classmethod
    def of(cls, bitmap: BitMap, blob: bytes | None = None, make: BaseMaker = plain_base) -> SetView:
        """A view whose base is ``bitmap`` (serialized as ``blob``, made if not given).

        The base is ``make(blob, bitmap)``: a plain one unless the caller
        passes a faster maker (:func:`tenure._backends.counting.make_base`).
        """
        if blob is None:
            bitmap.run_optimize()
            blob = bitmap.serialize()
        return cls(make(blob, bitmap), BitMap(), BitMap(), make)

    def __len__(self) -> int:
        return self.base.count - len(self.removes) + len(self.adds)

    def __contains__(self, value: int) -> bool:
        return value in self.adds or (value not in self.removes and self.base.contains(value))

    def to_bitmap(self) -> BitMap:
        """The set as a pyroaring bitmap of its own."""
        full = self.base.to_bitmap()
        if self.removes:
            full -= self.removes
        if self.adds:
            full |= self.adds
        return full

    def applied(self, elements: Sequence[bytes], where: str, first: int = 0) -> SetView:
        """The view after log elements (validated first, then applied in order)."""
        batches = [_element_ids(e, p, where) for p, e in enumerate(elements, first)]
        if not batches:
            return self
        adds, removes = self.adds.copy(), self.removes.copy()
        for element, ids in zip(elements, batches, strict=True):
            written = BitMap(_roaring_input(ids))
            in_base = self.base.and_small(written)
            if element[:1] == b"+":
                removes -= written
                adds |= written - in_base
            else:
                adds -= written
                removes |= in_base
        view = SetView(self.base, adds, removes, self.make)
        if len(adds) + len(removes) > max(REBUILD_IDS, self.base.count // 16):
            return SetView.of(view.to_bitmap(), make=self.make)
        return view

    @property
    def nbytes(self) -> int:
        """About the memory the view takes."""
        return self.base.nbytes + 4 * (len(self.adds) + len(self.removes))


REBUILD_IDS = 65_536
"""A view is rebuilt once its writes apart from the base pass this many ids (or base/16)."""


# -- local copies -------------------------------------------------------------------------


@dataclass
class Copy:
    """A decoded copy of a set: ``view`` holds the writes before ``position`` of ``epoch``.

    Positions count log elements since the set was created (or cleared,
    which starts a new epoch). A copy only moves forward; its view never
    changes (newer writes make a newer view), so a query counts on the
    view it validated, whatever other threads or tasks read meanwhile.
    """

    epoch: str
    version: int
    position: int
    view: SetView
    base_pos: int = 0  # the writes the server's compact form covered when last read


@dataclass(frozen=True)
class ReadReply:
    """The read script's reply, decoded (see ``lua/idset_read.lua``)."""

    version: int
    epoch: str
    kind: int  # 0 current, 1 log elements from start, 2 the compact form and the log past it
    start: int
    elements: list[bytes]
    base: list[Any]
    base_pos: int

    @classmethod
    def parse(cls, reply: Sequence[Any], where: str) -> ReadReply:
        """Decode ``reply``, or :class:`~tenure.IdSetCorruptError` if it is not one."""
        try:
            version, epoch, kind, start, elements, base, base_pos = reply
            parsed = cls(
                int(version),
                to_text(epoch),
                int(kind),
                int(start),
                list(elements),
                list(base),
                int(base_pos),
            )
        except (TypeError, ValueError):
            message = f"{where}: an unexpected reply to a read: {reply!r:.200}"
            raise IdSetCorruptError(message) from None
        if parsed.kind not in (0, 1, 2) or (parsed.kind == 2 and len(parsed.base) != 4):
            raise IdSetCorruptError(f"{where}: an unexpected reply to a read (kind {parsed.kind})")
        return parsed

    @property
    def received(self) -> int:
        """The bytes of ids and compact form this reply carried."""
        chunks = self.base[3] if self.kind == 2 else ()
        return sum(len(e) for e in self.elements) + sum(len(c) for c in chunks)


# -- queries --------------------------------------------------------------------------


def pair_count(a: SetView, b: SetView, *, parallel: bool = True) -> int:
    """|a & b|: the bases' count (the costly part, in C), corrected by each one's writes.

    With a = (Ab - Ar) | Aa and b likewise (Aa disjoint from Ab, Ar inside
    it), the four parts of a & b are disjoint and each is a base's count
    against small bitmaps, or small bitmaps' counts.
    """
    total = a.base.and_cardinality(b.base, parallel=parallel)
    if a.removes:
        total -= b.base.and_small_cardinality(a.removes)
    if b.removes:
        total -= a.base.and_small_cardinality(b.removes)
        if a.removes:
            total += a.removes.intersection_cardinality(b.removes)
    if b.adds:
        total += a.base.and_small_cardinality(b.adds)
        if a.removes:
            total -= a.removes.intersection_cardinality(b.adds)
    if a.adds:
        total += b.base.and_small_cardinality(a.adds)
        if b.removes:
            total -= a.adds.intersection_cardinality(b.removes)
        if b.adds:
            total += a.adds.intersection_cardinality(b.adds)
    return int(total)


def intersection_of(views: Sequence[SetView]) -> BitMap:
    """The ids in every one of ``views``, as a bitmap of its own (the smallest first)."""
    ordered = sorted(views, key=len)
    result = ordered[0].to_bitmap()
    for view in ordered[1:]:
        if not result:
            break
        result &= view.to_bitmap()
    return result


def intersection_count(views: Sequence[SetView]) -> int:
    """How many ids are in every one of ``views``."""
    if len(views) == 1:
        return len(views[0])
    if len(views) == 2:
        return pair_count(views[0], views[1])
    return len(intersection_of(views))


def jaccard_of(a: SetView, b: SetView) -> float:
    """|a & b| / |a | b| (0.0 for two empty sets)."""
    shared = pair_count(a, b)
    union = len(a) + len(b) - shared
    return shared / union if union else 0.0


@dataclass
class IdSetStatistics:
    """An id set's counters (this object, this process).

    ``reads`` counts revalidations of the local copy: ``unchanged`` found
    it current, ``incremental`` applied the log past it, ``full`` read the
    set whole; ``bytes_read`` is what came from the server for them.
    ``writes`` and ``ids_written`` count writes; ``compactions`` those this
    object made, and ``compaction_conflicts`` those refused because another
    compaction or a clear came first. ``near_reads`` counts the reads of a
    set with ``near=`` answered from this process's copy with no round trip.
    """

    reads: int = 0
    unchanged: int = 0
    incremental: int = 0
    full: int = 0
    bytes_read: int = 0
    writes: int = 0
    ids_written: int = 0
    compactions: int = 0
    compaction_conflicts: int = 0
    near_reads: int = 0

    def count_read(self, kind: int, received: int) -> None:
        """Count one revalidation of ``kind`` (0, 1, 2) that received ``received`` bytes."""
        self.reads += 1
        self.bytes_read += received
        if kind == 0:
            self.unchanged += 1
        elif kind == 1:
            self.incremental += 1
        else:
            self.full += 1
