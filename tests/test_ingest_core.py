"""Chunked ingestion's sans-IO half, without a server: plans, chunk ranges, replies."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure import ArgumentError
from tenure._core.ingest import REPLANNED, Claim, IngestKeys, Plan, chunk_range, parse_claim
from tenure._core.stream import StreamMessage, parse_claimed, read_messages


@given(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=1, max_value=10**5),
)
def test_chunks_cover_the_range_once(low: int, span: int, size: int) -> None:
    size = max(size, span // 100_000 + 1)  # within the most chunks a plan may have
    plan = Plan({"kind": "test"}, low, low + span, size)
    first, _ = chunk_range(plan, 0)
    _, last = chunk_range(plan, plan.chunks - 1)
    assert (first, last) == (plan.low, plan.high)
    if plan.chunks > 1:
        _, end = chunk_range(plan, 0)
        start, _ = chunk_range(plan, 1)
        assert start == end + 1 and end - first + 1 == size


def test_the_fingerprint_names_the_plan() -> None:
    plan = Plan({"table": "t", "key": "id"}, 1, 100, 10)
    same = Plan({"key": "id", "table": "t"}, 1, 100, 10)
    assert plan.fingerprint == same.fingerprint
    assert Plan.from_json(plan.as_json()) == plan
    assert plan.fingerprint != Plan({"table": "t", "key": "id"}, 1, 100, 20).fingerprint
    with pytest.raises(ArgumentError, match="empty"):
        Plan({}, 5, 4, 1)
    with pytest.raises(ArgumentError, match="chunk_size"):
        Plan({}, 1, 4, 0)
    with pytest.raises(ArgumentError, match="no chunk 10"):
        chunk_range(plan, 10)


def test_keys_share_the_job_hash_tag() -> None:
    keys = IngestKeys.for_job("tenure:ingest:", "orders")
    assert keys.plan == "tenure:ingest:{orders}:plan"
    assert keys.default_sink() == "tenure:ingest:{orders}:rows"
    assert all("{orders}" in key for key in vars(keys).values())


def test_claim_replies() -> None:
    assert parse_claim([1, 3, 17, None]) == Claim(chunk=3, fence=17, cursor=None)
    assert parse_claim([1, 3, 17, b"41"]) == Claim(chunk=3, fence=17, cursor=41)
    assert parse_claim([0]) is None
    assert parse_claim([-1, 1500]) == 1.5
    assert parse_claim([-2]) == REPLANNED  # the job was reset meanwhile
    for bad in ([], [7], "x", [1, 2]):
        with pytest.raises(ValueError, match="ingest_claim"):
            parse_claim(bad)


def test_stream_claim_replies_are_parsed_strictly() -> None:
    reply = [b"0-0", [[b"1-1", [b"key", b"7", b"row", b"{}"], 3]], 2]
    cursor, messages, dead = parse_claimed(reply)
    assert cursor == "0-0" and dead == 2
    assert messages == [StreamMessage("1-1", {b"key": b"7", b"row": b"{}"}, 3)]  # as given
    decoded = parse_claimed(["0-0", [["1-1", ["key", "7"], 2]], 0])[1]
    assert decoded == [StreamMessage("1-1", {"key": "7"}, 2)]
    assert parse_claimed([b"5-0", [], 0]) == ("5-0", [], 0)
    with pytest.raises(ValueError, match="unexpected stream_claim reply"):
        parse_claimed([b"0-0", []])
    with pytest.raises(ValueError, match="shorter than"):  # an odd field list
        parse_claimed([b"0-0", [[b"1-1", [b"key"], 1]], 0])


def test_xreadgroup_replies_of_every_shape_are_read_with_their_fields_as_given() -> None:
    entries = [(b"1-0", {b"n": b"1"}), (b"2-0", {b"n": b"2"})]
    expected = [StreamMessage("1-0", {b"n": b"1"}, 1), StreamMessage("2-0", {b"n": b"2"}, 1)]
    assert read_messages([[b"s", entries]]) == expected  # RESP2
    assert read_messages({b"s": [entries]}) == expected  # RESP3
    assert read_messages({b"s": entries}) == expected  # redis-py 8, legacy_responses=False
    assert read_messages({b"s": entries[:1]}) == expected[:1]  # one entry, not wrapped
    assert read_messages({b"s": [entries[:1]]}) == expected[:1]
    assert read_messages([[b"s", []]]) == []
    empties: list[Any] = [None, [], {}, {b"s": [[]]}]
    for empty in empties:
        assert read_messages(empty) == []
    assert read_messages([["s", [("3-0", {"n": "3"}), (None, None)]]]) == [  # deleted: left out
        StreamMessage("3-0", {"n": "3"}, 1)
    ]


def test_a_plan_of_too_many_chunks_is_refused_with_the_size_that_fits() -> None:
    assert Plan({"kind": "t"}, 1, 1_000_000_000, 10_000).chunks == 100_000
    with pytest.raises(ArgumentError, match=r"100,001 chunks.*chunk_size of at least 10,001"):
        Plan({"kind": "t"}, 1, 1_000_010_000, 10_000)
    sparse = Plan({"kind": "t"}, 1, 2**40, 10_995_117)  # the size the message asks for fits
    assert sparse.chunks <= 100_000
