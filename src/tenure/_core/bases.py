"""A set's compact form held in memory: what a base answers, and the plain one.

A *base* is the compact form of an id set as a reader last fetched it,
immutable once made (a newer one replaces it); a view of the set
(:class:`~tenure._core.idset.SetView`) counts on it. :class:`Base` is what
the queries ask of one; :class:`PlainBase` answers through pyroaring's
Python API and holds nothing but its bitmap.

The faster base, read in place by CRoaring and counted with the GIL
released over the process's counting threads, is process state and lives
a floor up, in :mod:`tenure._backends.counting`; it comes in as a
:data:`BaseMaker`, so this floor never imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from pyroaring import BitMap

__all__ = ["Base", "BaseMaker", "PlainBase", "plain_base"]


class Base:
    """A compact form held locally: immutable, counted against others and small bitmaps."""

    count: int
    containers: int
    nbytes: int

    def and_cardinality(self, other: Base, *, parallel: bool = True) -> int:
        """|self & other| (over every core for large bases, unless ``parallel`` is False)."""
        raise NotImplementedError

    def and_small_cardinality(self, small: BitMap) -> int:
        """|self & small|, ``small`` a pyroaring bitmap."""
        raise NotImplementedError

    def and_small(self, small: BitMap) -> BitMap:
        """The ids of ``small`` in this form, as a pyroaring bitmap."""
        raise NotImplementedError

    def contains(self, value: int) -> bool:
        """True if ``value`` is in the form."""
        raise NotImplementedError

    def to_bitmap(self) -> BitMap:
        """The form as a pyroaring bitmap of its own (a copy)."""
        raise NotImplementedError


class PlainBase(Base):
    """A base kept as a pyroaring bitmap (the fallback, and the empty base)."""

    def __init__(self, bitmap: BitMap, nbytes: int = 0) -> None:
        self.bitmap = bitmap
        self.count = len(bitmap)
        self.containers = 0
        self.nbytes = nbytes

    def and_cardinality(self, other: Base, *, parallel: bool = True) -> int:
        if isinstance(other, PlainBase):
            return int(self.bitmap.intersection_cardinality(other.bitmap))
        return other.and_small_cardinality(self.bitmap)

    def and_small_cardinality(self, small: BitMap) -> int:
        return int(self.bitmap.intersection_cardinality(small))

    def and_small(self, small: BitMap) -> BitMap:
        return self.bitmap & small

    def contains(self, value: int) -> bool:
        return value in self.bitmap

    def to_bitmap(self) -> BitMap:
        return self.bitmap.copy()


BaseMaker = Callable[[bytes, BitMap], Base]
"""Makes the local base of a validated compact form: ``(blob, bitmap)`` -> a base."""


def plain_base(blob: bytes, bitmap: BitMap) -> Base:
    """A :class:`PlainBase` of ``bitmap`` (serialized as ``blob``): the maker of this floor."""
    return PlainBase(bitmap, len(blob))
