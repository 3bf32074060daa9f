"""Id sets counted in C with the GIL released, on this process's counting threads.

A :class:`FrozenBase` is the compact form exactly as fetched: CRoaring (the
library inside pyroaring, reached through pyroaring's own shared object
and the ``raw_pointer`` it documents for this use) reads the portable
serialization in place (``roaring_bitmap_portable_deserialize_frozen``), so
decoding copies nothing and every container sits in one contiguous buffer,
which counts about twice as fast as containers scattered over the heap.
Counts run in C with the GIL released and, for large sets, in parallel
over disjoint ranges of containers, one per core; :func:`count_each` shares
many sets out the same way. A base never changes once made; a newer one
replaces it.

If the library cannot be reached this way (another pyroaring build), or
its layout is not the one checked at import, :func:`make_base` makes the
sans-IO :class:`~tenure._core.bases.PlainBase` instead, which does the same
through pyroaring's Python API.

This is process state, so it lives here and not in the sans-IO core: the
library loaded and checked once, and :data:`THREADS`, the worker threads
(made on first use, with a lock, and forgotten in a fork's child). The
core's views get :func:`make_base` from the caller
(:mod:`tenure._backends.local_copies` makes every view of the process).
"""

from __future__ import annotations

import ctypes
import heapq
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pyroaring
from pyroaring import BitMap

from tenure._core.bases import Base, PlainBase
from tenure._core.idset import SetView, pair_count

__all__ = [
    "NATIVE",
    "PARALLEL_CONTAINERS",
    "THREADS",
    "CountingThreads",
    "FrozenBase",
    "count_each",
    "make_base",
    "top_counts",
]

PARALLEL_CONTAINERS = 4096
"""Bases of at least this many containers each are counted in parallel."""

_T = TypeVar("_T")


class CountingThreads:
    """The worker threads of parallel counts: one fewer than the cores used (at most 4)."""

    def __init__(self) -> None:
        self.workers = max(1, min(4, os.cpu_count() or 1))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def submit(self, function: Callable[..., _T], *args: Any) -> Future[_T]:
        """Run ``function(*args)`` on a worker thread (the threads made on first use)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers - 1, "tenure-idset-count")
            pool = self._pool
        return pool.submit(function, *args)

    def after_fork(self) -> None:
        """In a fork's child: the parent's threads are not there, nor its lock's holder."""
        self._pool = None
        self._pool_lock = threading.Lock()


THREADS = CountingThreads()
"""The counting threads of this process."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=THREADS.after_fork)


class _RoaringArray(ctypes.Structure):
    """CRoaring's public ``roaring_array_t`` (``roaring_bitmap_t`` holds just this)."""

    _fields_ = (
        ("size", ctypes.c_int32),
        ("allocation_size", ctypes.c_int32),
        ("containers", ctypes.c_void_p),
        ("keys", ctypes.c_void_p),
        ("typecodes", ctypes.c_void_p),
        ("flags", ctypes.c_uint8),
    )


class _Native:
    """The few CRoaring functions tenure calls, from pyroaring's shared object."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(pyroaring.__file__)
        pointer, size = ctypes.c_void_p, ctypes.c_size_t
        self.and_cardinality = lib.roaring_bitmap_and_cardinality
        self.and_cardinality.argtypes = [pointer, pointer]
        self.and_cardinality.restype = ctypes.c_uint64
        self.freeze = lib.roaring_bitmap_portable_deserialize_frozen
        self.freeze.argtypes = [pointer]
        self.freeze.restype = pointer
        self.free = lib.roaring_bitmap_free
        self.free.argtypes = [pointer]
        self.free.restype = None
        self.contains = lib.roaring_bitmap_contains
        self.contains.argtypes = [pointer, ctypes.c_uint32]
        self.contains.restype = ctypes.c_bool
        self.intersect = lib.roaring_bitmap_and
        self.intersect.argtypes = [pointer, pointer]
        self.intersect.restype = pointer
        self.size_in_bytes = lib.roaring_bitmap_portable_size_in_bytes
        self.size_in_bytes.argtypes = [pointer]
        self.size_in_bytes.restype = size
        self.serialize = lib.roaring_bitmap_portable_serialize
        self.serialize.argtypes = [pointer, pointer]
        self.serialize.restype = size

    def bitmap_of(self, pointer: int) -> BitMap:
        """A pyroaring bitmap of the C bitmap at ``pointer`` (which is freed)."""
        try:
            blob = ctypes.create_string_buffer(self.size_in_bytes(pointer))
            self.serialize(pointer, ctypes.addressof(blob))
            return BitMap.deserialize(blob.raw)
        finally:
            self.free(pointer)

    def windows(self, first: int, second: int, parts: int) -> list[tuple[Any, Any]]:
        """``parts`` pairs of views of disjoint key ranges of two bitmaps, covering both."""
        a, b = _RoaringArray.from_address(first), _RoaringArray.from_address(second)
        keys_a, keys_b = _keys(a), _keys(b)
        bounds = [int(keys_a[len(keys_a) * i // parts]) for i in range(1, parts)]
        cut_a = [0, *np.searchsorted(keys_a, bounds).tolist(), a.size]
        cut_b = [0, *np.searchsorted(keys_b, bounds).tolist(), b.size]
        return [
            (_window(a, cut_a[i], cut_a[i + 1]), _window(b, cut_b[i], cut_b[i + 1]))
            for i in range(parts)
        ]

    def parallel_and_cardinality(self, first: int, second: int) -> int:
        """|first & second|, the containers split over the cores (:data:`THREADS`)."""
        pairs = self.windows(first, second, THREADS.workers)
        futures: list[Future[int]] = [
            THREADS.submit(self.and_cardinality, ctypes.addressof(x), ctypes.addressof(y))
            for x, y in pairs[1:]
        ]
        here = int(
            self.and_cardinality(ctypes.addressof(pairs[0][0]), ctypes.addressof(pairs[0][1]))
        )
        return here + sum(int(f.result()) for f in futures)


def _keys(array: _RoaringArray) -> np.ndarray[Any, np.dtype[np.uint16]]:
    if array.size == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.frombuffer((ctypes.c_uint16 * array.size).from_address(array.keys), dtype=np.uint16)


def _window(array: _RoaringArray, start: int, end: int) -> _RoaringArray:
    pointer_size = ctypes.sizeof(ctypes.c_void_p)
    return _RoaringArray(
        end - start,
        end - start,
        (array.containers or 0) + pointer_size * start,
        (array.keys or 0) + 2 * start,
        (array.typecodes or 0) + start,
        array.flags,
    )


class FrozenBase(Base):
    """A base read in place from its portable serialization, by CRoaring through ctypes."""

    def __init__(self, native: _Native, blob: bytes, count: int) -> None:
        self._native = native
        self._buffer = ctypes.create_string_buffer(blob, len(blob))
        pointer = native.freeze(ctypes.addressof(self._buffer))
        if not pointer:
            raise ValueError("CRoaring could not read the compact form in place")
        self.pointer = int(pointer)
        self.count = count
        self.nbytes = len(blob)
        self.containers = _RoaringArray.from_address(self.pointer).size
        weakref.finalize(self, native.free, self.pointer)

    def and_cardinality(self, other: Base, *, parallel: bool = True) -> int:
        if not isinstance(other, FrozenBase):
            return other.and_cardinality(self)
        native = self._native
        big = min(self.containers, other.containers) >= PARALLEL_CONTAINERS
        if parallel and big and THREADS.workers > 1:
            return native.parallel_and_cardinality(self.pointer, other.pointer)
        return int(native.and_cardinality(self.pointer, other.pointer))

    def and_small_cardinality(self, small: BitMap) -> int:
        return int(self._native.and_cardinality(small.raw_pointer, self.pointer))

    def and_small(self, small: BitMap) -> BitMap:
        return self._native.bitmap_of(self._native.intersect(small.raw_pointer, self.pointer))

    def contains(self, value: int) -> bool:
        return bool(self._native.contains(self.pointer, value))

    def to_bitmap(self) -> BitMap:
        return BitMap.deserialize(self._buffer.raw)


def _load() -> _Native | None:
    """The native functions if they work as checked here, else None (pyroaring's API then)."""
    try:
        native = _Native()
        left = BitMap([1, 2, 3, 70_000, 70_001, 1 << 20, (1 << 31) + 5, 4_000_000_000])
        right = BitMap([2, 3, 70_001, 1 << 20, 4_000_000_000, 4_000_000_001])
        probe = FrozenBase(native, left.serialize(), len(left))
        layout = _RoaringArray.from_address(probe.pointer)
        if layout.size != left.get_statistics()["n_containers"] or _keys(layout).tolist() != [
            0,
            1,
            16,
            32768,
            61035,
        ]:
            return None
        other = FrozenBase(native, right.serialize(), len(right))
        expected = len(left & right)
        pairs = native.windows(probe.pointer, other.pointer, 3)
        split = sum(
            int(native.and_cardinality(ctypes.addressof(x), ctypes.addressof(y))) for x, y in pairs
        )
        if (
            probe.and_cardinality(other) != expected
            or split != expected
            or probe.and_small(right) != left & right
            or not probe.contains(70_000)
            or probe.contains(4)
        ):
            return None
    except (OSError, AttributeError, ValueError, TypeError):
        return None
    return native


NATIVE = _load()
"""CRoaring through ctypes, or None where it could not be checked (then PlainBase)."""


def make_base(blob: bytes, bitmap: BitMap) -> Base:
    """The local base of a validated compact form: ``blob``, whose bitmap is ``bitmap``."""
    if NATIVE is None or not blob:
        return PlainBase(bitmap, len(blob))
    return FrozenBase(NATIVE, blob, len(bitmap))


def count_each(view: SetView, others: Sequence[SetView]) -> list[int]:
    """|view & other| for each of ``others``, split over the cores when there are many."""
    if NATIVE is None or THREADS.workers == 1 or len(others) < 64:
        return [pair_count(view, other) for other in others]
    parts = THREADS.workers
    step = -(-len(others) // parts)

    def part(start: int) -> list[int]:
        return [pair_count(view, other, parallel=False) for other in others[start : start + step]]

    futures = [THREADS.submit(part, start) for start in range(step, len(others), step)]
    counts = part(0)
    for future in futures:
        counts += future.result()
    return counts


def top_counts(view: SetView, others: Sequence[SetView], k: int) -> list[tuple[int, int]]:
    """The ``k`` largest overlaps of ``view`` with ``others``: (index, count), largest first.

    Ties keep the order of ``others``. Many sets are counted on every core.
    """
    counts = count_each(view, others)
    best = heapq.nsmallest(k, ((-count, index) for index, count in enumerate(counts)))
    return [(index, -negative) for negative, index in best]
