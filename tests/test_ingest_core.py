"""Chunked ingestion's sans-IO half, without a server: plans, chunk ranges, replies."""

from __future__ import annotations

import decimal
import json
import math
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from tenure import ArgumentError, CallableSource, IngestJob, SourceRowError
from tenure._core.ingest import REPLANNED, Claim, IngestKeys, Plan, chunk_range, parse_claim
from tenure._core.rows import RowEncoder, _json_default, encode_row
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
    assert parse_claim([1, 3, 17, None, 1]) == Claim(3, 17, None, taken_over=True)
    assert parse_claim([1, 3, 17, b"41", 0]) == Claim(3, 17, 41, taken_over=False)
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


def _dumps(row: Any) -> str:
    """What rows were encoded with before the one prebuilt encoder: json.dumps per row."""
    return json.dumps(row, separators=(",", ":"), ensure_ascii=False, default=_json_default)


_CELLS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.binary(max_size=16),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.dates(),
    st.datetimes(),
    st.times(),
    st.uuids(),
)
_ROWS = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        _CELLS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner)
    ),
    max_size=6,
)


@given(_ROWS)
def test_the_one_encoder_writes_every_valid_row_byte_for_byte_as_before(row: Any) -> None:
    encoded = RowEncoder().encode(row, key=1)
    assert encoded == encode_row(row) == _dumps(row)
    assert RowEncoder().parts([(7, row), (9, row)]) == ["7", encoded, "9", encoded]


def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON (RFC 8259): {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_float_nan_or_infinity_is_refused_naming_the_key_and_the_column(value: float) -> None:
    assert "NaN" in _dumps({"p": value}) or "Infinity" in _dumps({"p": value})  # what it was
    encoder = RowEncoder()
    with pytest.raises(SourceRowError) as refused:
        encoder.encode({"id": 7, "price": value}, key=7, name="job")
    assert (refused.value.key, refused.value.column, refused.value.name) == (7, "price", "job")
    assert str(refused.value) == (
        f"row 7, column 'price' holds {value!r}: JSON (RFC 8259) has no NaN or infinity; "
        "store NULL or a finite number (refused before it was written) (name 'job')"
    )
    assert isinstance(refused.value, ValueError)
    rows: list[tuple[int, dict[str, Any]]] = [(1, {"price": 1.5}), (2, {"tags": [1.0, value]})]
    with pytest.raises(SourceRowError, match=r"^row 2, column 'tags' holds \[1\.0, .*no form") as e:
        encoder.parts(rows)  # nested: the row's key and the column holding it
    assert (e.value.key, e.value.column) == (2, "tags")


def test_values_with_no_json_form_are_refused_and_decimals_stay_strict_strings() -> None:
    with pytest.raises(SourceRowError, match=r"^a row, column 'when' holds .*: a complex has no"):
        encode_row({"id": 1, "when": complex(1, 2)})
    for decimal_value in ("NaN", "Infinity", "-Infinity", "1.50"):  # strings: lossless, strict
        row = {"amount": decimal.Decimal(decimal_value)}
        assert _strict(encode_row(row)) == {"amount": decimal_value}
    with pytest.raises(SourceRowError, match=r"^row 3, column '\(1, 2\)' holds 'a': keys must be"):
        encode_row({(1, 2): "a"}, key=3)  # type: ignore[dict-item]
    with pytest.raises(SourceRowError, match=r"^row 4 cannot be stored as JSON: Out of range"):
        encode_row([math.inf], key=4)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"low": 10, "high": 9, "name": "n"}, r"^high: the key range is empty \(10..9\)$"),
        ({"low": "0", "high": 9, "name": "n"}, "^low: must be an int key, got '0'$"),
        ({"low": 0, "high": True, "name": "n"}, "^high: must be an int key, got True$"),
        ({"low": 0, "high": 9, "name": ""}, "^name: must be a non-empty str, got ''$"),
    ],
)
def test_a_callable_sources_range_and_name_are_checked_when_it_is_made(
    arguments: dict[str, Any], text: str
) -> None:
    with pytest.raises(ArgumentError, match=text):
        CallableSource(lambda first, last: [], **arguments)


def test_a_job_given_something_that_is_no_row_source_says_what_it_lacks() -> None:
    client = redis.Redis()  # never connected: refused before any call
    with pytest.raises(
        ArgumentError,
        match=r"^source: must be a row source .* got str without "
        r"describe, key_range, rows \(an SqlSource takes the URL",
    ):
        IngestJob(client, "job", "sqlite:///rows.db")  # type: ignore[arg-type]
    client.close()


def test_keys_the_scripts_cannot_count_exactly_are_refused_before_anything_is_claimed() -> None:
    with pytest.raises(ArgumentError, match=r"^low: 9007199254740993 is outside \+-"):
        CallableSource(lambda first, last: [], low=2**53 + 1, high=2**53 + 5, name="n")
    with pytest.raises(
        ArgumentError, match=r"^low: the source's key -9223372036854775808 is outside"
    ):
        Plan(source={"kind": "x"}, low=-(2**63), high=0, chunk_size=10)
