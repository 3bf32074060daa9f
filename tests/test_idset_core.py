"""The sans-IO half of id sets: ids, the log, the compact form and local copies."""

from __future__ import annotations

import gc
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from tenure import ArgumentError, IdSetCorruptError
from tenure._backends.counting import (
    NATIVE,
    PARALLEL_CONTAINERS,
    FrozenBase,
    count_each,
    make_base,
    top_counts,
)
from tenure._backends.local_copies import LocalCopies
from tenure._core.bases import PlainBase
from tenure._core.idset import (
    ELEMENT_IDS,
    ReadReply,
    SetView,
    decode_base,
    encode_base,
    intersection_count,
    jaccard_of,
    pack,
    pair_count,
    to_ids,
)

ids_lists = st.lists(st.integers(0, 2**32 - 1), max_size=60)
ops = st.lists(st.tuples(st.sampled_from([b"+", b"-"]), ids_lists), max_size=25)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_the_log_applied_in_order_is_the_set_a_python_set_would_be(
    writes: list[tuple[bytes, list[int]]],
) -> None:
    model: set[int] = set()
    view = SetView.empty()
    for sign, ids in writes:
        view = view.applied(pack(sign, to_ids(ids)), "test")
        if sign == b"+":
            model.update(ids)
        else:
            model.difference_update(ids)
    assert sorted(view.to_bitmap()) == sorted(model) and len(view) == len(model)


def test_a_large_write_is_cut_into_elements_of_sorted_ids() -> None:
    ids = np.arange(ELEMENT_IDS + 10, dtype=np.uint32)[::-1]
    elements = pack(b"+", ids)
    assert [len(e) for e in elements] == [1 + 4 * ELEMENT_IDS, 1 + 40]
    assert np.frombuffer(elements[0], dtype="<u4", offset=1)[:3].tolist() == [0, 1, 2]


def test_unsorted_elements_written_by_anyone_else_are_applied_too() -> None:
    view = SetView.empty().applied([b"+" + np.array([9, 3, 7, 3], dtype="<u4").tobytes()], "t")
    assert list(view.to_bitmap()) == [3, 7, 9]


@pytest.mark.parametrize(
    "element",
    [b"", b"+abc", b"*" + b"\x00" * 4, b"-\x00\x00"],
)
def test_a_log_element_that_is_not_a_write_is_refused(element: bytes) -> None:
    with pytest.raises(IdSetCorruptError, match="log element 3 of here is not a write"):
        SetView.empty().applied([element], "here", 3)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=3000), st.integers(1024, 4096))
def test_the_compact_form_round_trips_in_chunks(ids: list[int], chunk_bytes: int) -> None:
    view = BitMap(ids)
    encoded = encode_base(view.copy(), chunk_bytes)
    assert all(len(chunk) <= chunk_bytes for chunk in encoded.chunks)
    assert encoded.count == len(view)
    meta = (encoded.size, encoded.crc, encoded.count)
    bitmap, blob = decode_base(meta, encoded.chunks, "here")
    assert bitmap == view and blob == b"".join(encoded.chunks)


def test_a_damaged_compact_form_is_refused_saying_how() -> None:
    view = BitMap(range(0, 100_000, 7))
    encoded = encode_base(view, 1024)
    meta = (encoded.size, encoded.crc, encoded.count)
    with pytest.raises(IdSetCorruptError, match="in 5 chunks, .* expected"):
        decode_base(meta, encoded.chunks[:5], "here")
    flipped = bytearray(encoded.chunks[0])
    flipped[20] ^= 1
    with pytest.raises(IdSetCorruptError, match="CRC-32 does not match"):
        decode_base(meta, [bytes(flipped), *encoded.chunks[1:]], "here")
    junk = b"\xff" * encoded.size
    with pytest.raises(IdSetCorruptError, match="not a Roaring bitmap"):
        decode_base((encoded.size, zlib.crc32(junk), encoded.count), [junk], "here")
    with pytest.raises(IdSetCorruptError, match="holds 14,286 ids, 3 expected"):
        decode_base((encoded.size, encoded.crc, 3), encoded.chunks, "here")
    with pytest.raises(IdSetCorruptError, match="its meta data is not numbers"):
        decode_base((b"x", 1, 2), encoded.chunks, "here")
    with pytest.raises(IdSetCorruptError, match="the compact form is missing"):
        decode_base((0, 0, 12), [], "here")


def test_ids_are_checked_once_and_converted() -> None:
    assert to_ids(np.array([1, 2], dtype=np.uint32)).dtype == np.uint32
    assert to_ids([np.int8(5), 2**32 - 1]).tolist() == [5, 2**32 - 1]
    assert to_ids(iter([])).size == 0
    with pytest.raises(ArgumentError, match=r"ids: \[1\] \(at position 0\) is not an int"):
        to_ids([[1]])


def _reply(version: int, epoch: str, kind: int, start: int, elements: list[bytes]) -> ReadReply:
    return ReadReply.parse([version, epoch, kind, start, elements, [], 0], "here")


def _adds(*ids: int) -> bytes:
    return pack(b"+", to_ids(list(ids)))[0]


def _full(version: int, epoch: str, start: int, base: BitMap, elements: list[bytes]) -> ReadReply:
    encoded = encode_base(base, 1 << 20)
    meta = [encoded.size, encoded.crc, encoded.count, encoded.chunks]
    return ReadReply.parse([version, epoch, 2, start, elements, meta, start], "here")


class _Client:
    """Something a weak reference can point to, as a redis-py client."""


def test_local_copies_move_only_forward() -> None:
    copies = LocalCopies()
    client, key = _Client(), "k"
    assert copies.position(client, key) == ("", 0)
    view = copies.absorb(client, key, ("", 0), _full(3, "e1", 2, BitMap([1]), [_adds(2)]), "here")
    assert view is not None and list(view.to_bitmap()) == [1, 2]
    assert copies.position(client, key) == ("e1", 3)
    # a reply from an older read (sent at position 3, elements from 3) arrives after a newer one
    newer = copies.absorb(client, key, ("e1", 3), _reply(5, "e1", 1, 3, [_adds(3), _adds(4)]), "x")
    older = copies.absorb(client, key, ("e1", 3), _reply(4, "e1", 1, 3, [_adds(3)]), "x")
    assert newer is older and newer is not None and list(newer.to_bitmap()) == [1, 2, 3, 4]
    assert copies.position(client, key) == ("e1", 5)
    # a reply that overlaps the copy applies only what is new to it
    view = copies.absorb(client, key, ("e1", 4), _reply(6, "e1", 1, 4, [_adds(4), _adds(9)]), "x")
    assert view is not None and list(view.to_bitmap()) == [1, 2, 3, 4, 9]
    # another epoch's increment cannot apply; the caller reads again
    assert copies.absorb(client, key, ("e1", 6), _reply(7, "e2", 1, 0, [_adds(5)]), "x") is None
    # a bad element is refused before anything is applied
    with pytest.raises(IdSetCorruptError):
        copies.absorb(client, key, ("e1", 6), _reply(8, "e1", 1, 6, [_adds(7), b"?"]), "x")
    snapshot = copies.snapshot(client, key)
    assert snapshot is not None and list(snapshot.view.to_bitmap()) == [1, 2, 3, 4, 9]
    assert (snapshot.position, snapshot.version) == (6, 6)


def test_ones_own_write_is_applied_only_to_a_current_copy() -> None:
    copies, client = LocalCopies(), _Client()
    copies.absorb(client, "k", ("", 0), _full(1, "e", 0, BitMap(), [_adds(1)]), "x")
    copies.absorb_write(client, "k", [2, 2, 2, b"e"], [_adds(2)])
    assert copies.position(client, "k") == ("e", 2)
    copies.absorb_write(client, "k", [4, 5, 4, b"e"], [_adds(4)])  # position 3 was missed
    snapshot = copies.snapshot(client, "k")
    assert snapshot is not None and list(snapshot.view.to_bitmap()) == [1, 2]


def test_local_copies_stay_within_their_bound_and_leave_with_their_client() -> None:
    copies = LocalCopies(max_bytes=3000)
    client: Any = _Client()
    for name in "abcd":
        base = BitMap(range(0, 4000, 4))  # about 2 KB serialized
        copies.absorb(client, name, ("", 0), _full(1, "e", 1, base, []), "x")
    assert len(copies) == 1 and copies.nbytes <= 3000
    assert copies.position(client, "d") == ("e", 1)
    other: Any = _Client()
    copies.absorb(other, "z", ("", 0), _full(1, "e", 1, BitMap([1]), []), "x")
    assert len(copies) == 2
    del client
    gc.collect()
    assert len(copies) == 1 and copies.position(other, "z") == ("e", 1)


def _views(base: list[int], writes: list[tuple[bytes, list[int]]], native: bool) -> SetView:
    bitmap = BitMap(base)
    view = (
        SetView.of(bitmap, make=make_base)
        if native
        else SetView(PlainBase(bitmap), BitMap(), BitMap())
    )
    for sign, ids in writes:
        view = view.applied(pack(sign, to_ids(ids)), "test")
    return view


small_ids = st.lists(st.integers(0, 300_000), max_size=80)
small_ops = st.lists(st.tuples(st.sampled_from([b"+", b"-"]), small_ids), max_size=8)


@settings(max_examples=150, deadline=None)
@given(small_ids, small_ops, small_ids, small_ops, st.booleans())
def test_counts_on_a_base_and_its_writes_are_the_counts_of_the_sets(
    base_a: list[int],
    writes_a: list[tuple[bytes, list[int]]],
    base_b: list[int],
    writes_b: list[tuple[bytes, list[int]]],
    native: bool,
) -> None:
    a, b = _views(base_a, writes_a, native), _views(base_b, writes_b, native)
    full_a, full_b = a.to_bitmap(), b.to_bitmap()
    assert len(a) == len(full_a) and len(b) == len(full_b)
    assert not a.adds & BitMap(base_a) and a.removes <= BitMap(base_a)  # kept apart, normalized
    assert pair_count(a, b) == len(full_a & full_b) == pair_count(b, a)
    assert intersection_count([a, b, a]) == len(full_a & full_b)
    assert jaccard_of(a, b) == pytest.approx(
        len(full_a & full_b) / len(full_a | full_b) if full_a | full_b else 0.0
    )
    for value in [*base_a[:5], *base_b[:5], 299_999]:
        assert (value in a) == (value in full_a)


def test_large_bases_count_in_parallel_as_they_would_alone() -> None:
    rng = np.random.default_rng(5)
    first = BitMap(to_ids(rng.integers(0, 2**32, 400_000)))
    second = BitMap(to_ids(rng.integers(0, 2**32, 600_000)))
    a, b = SetView.of(first.copy(), make=make_base), SetView.of(second.copy(), make=make_base)
    if NATIVE is not None:
        assert isinstance(a.base, FrozenBase) and a.base.containers >= PARALLEL_CONTAINERS
    expected = len(first & second)
    assert a.base.and_cardinality(b.base) == expected
    assert a.base.and_cardinality(b.base, parallel=False) == expected
    others = [
        SetView.of(BitMap(to_ids(rng.integers(0, 2**32, 5000))), make=make_base) for _ in range(100)
    ]
    assert count_each(a, others) == [len(first & o.to_bitmap()) for o in others]


def test_a_view_whose_writes_grow_large_is_rebuilt() -> None:
    view = SetView.of(BitMap(range(0, 1000, 2)))
    view = view.applied(pack(b"+", to_ids(range(1, 200_000, 2))), "test")
    assert not view.adds and not view.removes  # folded into a new base
    assert len(view) == 500 + 100_000


def test_counts_and_top_overlaps() -> None:
    a, b, c = (SetView.of(BitMap(r)) for r in (range(10), range(5, 20), range(8, 9)))
    assert intersection_count([a, b, c]) == 1
    assert intersection_count([a]) == 10
    assert top_counts(a, [c, b, SetView.of(BitMap(range(5, 10)))], 2) == [(1, 5), (2, 5)]
    assert top_counts(a, [b], 0) == []
