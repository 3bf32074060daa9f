"""The caches' sans-IO half, without a server: codec, identities, replies, durations."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure import (
    ArgumentError,
    CacheDecodeError,
    IdentityGenerator,
    JsonSerializer,
    MsgpackSerializer,
    PickleSerializer,
    ZlibCompressor,
    ZstdCompressor,
)
from tenure._core.cache import (
    CacheKeys,
    Entry,
    ServerClock,
    Status,
    early_factor,
    entry_key,
    parse_fetch,
    split_entry,
)
from tenure._core.codec import Codec, canonical
from tenure._core.values import MAX_SECONDS, check_seconds, to_ms

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


@given(json_values, st.sampled_from([None, ZlibCompressor(threshold=0), ZstdCompressor()]))
def test_json_entries_round_trip(value: Any, compressor: Any) -> None:
    codec = Codec(JsonSerializer(), compressor)
    assert codec.decode(codec.encode(value)) == value


@given(json_values | st.binary())
def test_msgpack_entries_round_trip(value: Any) -> None:
    codec = Codec(MsgpackSerializer(), ZlibCompressor(threshold=0))
    assert codec.decode(codec.encode(value)) == value


def test_the_header_names_the_format_so_decoding_never_guesses() -> None:
    json_codec = Codec()
    msgpack_codec = Codec(MsgpackSerializer())
    stored = msgpack_codec.encode([1, 2])
    assert stored.startswith(b"tn1msgpack::")
    with pytest.raises(CacheDecodeError, match="msgpack"):
        json_codec.decode(stored)
    big = json_codec.encode("x" * 4096)
    assert big.startswith(b"tn1json:zlib:") and len(big) < 200
    with pytest.raises(CacheDecodeError, match="zlib"):
        Codec(compressor=None).decode(big)
    for junk in (b"", b"hello", b"tn1json", b"tn1json:zlib:not zlib", b"tn1json::{bad json"):
        with pytest.raises(CacheDecodeError):
            json_codec.decode(junk)


def test_signed_pickle_refuses_what_it_did_not_sign() -> None:
    codec = Codec(PickleSerializer("a" * 16), None)
    stored = codec.encode({"k": (1, 2)})
    assert codec.decode(stored) == {"k": (1, 2)}
    tampered = stored[:-1] + bytes([stored[-1] ^ 1])
    with pytest.raises(CacheDecodeError, match="signature"):
        codec.decode(tampered)
    with pytest.raises(CacheDecodeError, match="signature"):
        Codec(PickleSerializer("b" * 16), None).decode(stored)


def test_values_a_serializer_cannot_hold_are_refused_by_name() -> None:
    with pytest.raises(ArgumentError, match="json cannot store it"):
        Codec().encode(object())


equal_params = st.dictionaries(
    st.text(max_size=6),
    st.integers() | st.text(max_size=6) | st.frozensets(st.integers(), max_size=4),
    max_size=6,
)


@given(equal_params)
def test_identity_ignores_dict_and_set_order(param: dict[str, Any]) -> None:
    generator = IdentityGenerator()
    reordered = dict(reversed(list(param.items())))
    assert generator.generate("k", param) == generator.generate("k", reordered)


def test_identity_is_the_same_across_versions() -> None:
    """An entry's name must not change between releases (a deploy would miss every entry):
    sha256 of the param's canonical JSON, sorted keys, compact, UTF-8, 32 hex digits."""
    generate = IdentityGenerator().generate
    param = {"args": {"user": 42, "tags": ["é", 1.5, None, True]}}
    text = '{"args":{"tags":["é",1.5,null,true],"user":42}}'
    assert generate("k", param) == "k:" + hashlib.sha256(text.encode()).hexdigest()[:32]
    assert generate("k", param) == "k:dce1caab969687e35597539a728f6ce5"


def test_identity_tells_apart_what_str_would_confuse() -> None:
    generate = IdentityGenerator().generate
    assert generate("k", None) == "k"
    distinct = [1, 1.5, "1", True, [1], (2,), {"1": 1}, {1: 1}, b"1", {"$bytes": "MQ=="}, {1}]
    identities = {generate("k", param) for param in distinct}
    assert len(identities) == len(distinct)
    assert generate("k", (1, 2)) == generate("k", [1, 2])  # JSON has one kind of sequence
    assert canonical(float("nan")) == {"$float": "nan"}


def test_identity_is_the_same_in_another_interpreter() -> None:
    param = {"z": [1.1, None, {"b": 2, "a": 1}], "a": {3, 1, 2}}
    code = (
        f"from tenure import IdentityGenerator;print(IdentityGenerator().generate('k', {param!r}))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == IdentityGenerator().generate("k", param)


def test_keys_share_the_entry_hash_tag() -> None:
    keys = CacheKeys.for_entry(entry_key("tenure:herd:", "prices", "eur:abc"))
    assert keys.entry == "tenure:herd:prices:{eur:abc}"
    assert keys.as_tuple()[1:] == (
        "tenure:herd:prices:{eur:abc}:lease",
        "tenure:herd:prices:{eur:abc}:waiters",
    )


def test_fetch_replies_are_parsed_strictly() -> None:
    fresh = parse_fetch([1, b"h1700000000000:25:tn1json::1", 10, 1699999999990])
    assert fresh.status is Status.FRESH and fresh.value == b"tn1json::1"
    assert fresh.entry == Entry(fresh_until=1700000000000, took_ms=25, value=b"tn1json::1")
    assert parse_fetch([4, None, 5000, 1]).value is None
    for bad in ([1, None, 0, 0], [4, b"h0:0:v", 0, 0], [9, None, 0, 0], "x", [1, b"h0:0:v", 0]):
        with pytest.raises(ValueError, match="cache_fetch"):
            parse_fetch(bad)
    with pytest.raises(ValueError, match="herd-cache entry"):
        split_entry(b"tn1json::1")
    with pytest.raises(ValueError, match="truncated"):
        split_entry(b"h12")


def test_the_server_clock_trusts_a_hit_only_well_before_its_deadline() -> None:
    clock = ServerClock()

    def fresh(now: float, early: float = 0.0, entry: bytes = b"h100000:50:v") -> bool:
        return clock.fresh_value(entry, now, early) is not None

    assert not fresh(now=10.0)  # nothing learned yet: ask the server
    assert fresh(now=10.0, entry=b"h0:0:v")  # fresh for ever
    clock.observe(server_ms=90_000, sent=10.0, received=10.002)  # offset 79,999 ms, error 1 ms
    assert fresh(now=10.0)  # server ~90,000: 10 s left
    assert clock.fresh_value(b"h100000:50:v", 10.0) == b"v"
    assert not fresh(now=19.999)  # within error + margin of the deadline
    assert fresh(now=19.9, early=1.0)
    assert not fresh(now=19.9, early=3.0)  # XFetch: 150 ms of load time ahead
    clock.observe(server_ms=95_000, sent=12.0, received=12.5)  # a worse estimate is ignored
    assert fresh(now=15.0)
    assert not fresh(now=10.0 + ServerClock.MAX_AGE + 0.1)  # too old: ask
    for other in (b"l0123", b"tn1json:x", b"hx:1:v", b"h1", b""):  # marks, other formats
        assert clock.fresh_value(other, 10.0) is None


@given(st.floats(min_value=0.0, max_value=0.999999))
def test_early_factor_is_non_negative_and_off_at_zero(rand: float) -> None:
    assert early_factor(0.0, rand) == 0.0
    factor = early_factor(1.0, rand)
    assert factor >= 0 and math.isfinite(factor)
    assert early_factor(2.0, rand) == pytest.approx(2 * factor)


def test_durations() -> None:
    assert to_ms(None) == 0 and to_ms(0.0001) == 1 and to_ms(1.5) == 1500
    assert to_ms(1.2341) == 1235  # rounded up: never shorter than asked
    assert (
        check_seconds("ttl", None, name="c", allow_none=True, longest=None, positive=True) is None
    )
    assert check_seconds("ttl", 0, name="c", allow_none=True, longest=None) == 0.0
    for bad in (-1, 0, float("inf"), float("nan"), "5", True):
        with pytest.raises(ArgumentError, match="ttl"):
            check_seconds("ttl", bad, name="c", allow_none=True, longest=None, positive=True)  # type: ignore[arg-type]
    # The bound every primitive uses by default, named; another bound is not "ten years".
    assert check_seconds("ttl", MAX_SECONDS, name=None, allow_none=False) == MAX_SECONDS
    with pytest.raises(ArgumentError, match=r"^ttl: .* 315360000 seconds \(ten years\), got 1e"):
        check_seconds("ttl", 1e16, name=None, allow_none=False)
    with pytest.raises(ArgumentError, match=r"^ttl: must be at most 60 seconds, got 61$"):
        check_seconds("ttl", 61, name=None, allow_none=False, longest=60)


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (
            lambda: ZlibCompressor(level=99),
            "^level: zlib takes a whole number from -1 to 9, got 99$",
        ),
        (lambda: ZlibCompressor(level=True), "^level: zlib takes .* got True$"),
        (lambda: ZstdCompressor(level=23), "^level: zstd takes .* to 22, got 23$"),
        (lambda: ZlibCompressor(threshold=-1), "^threshold: must be a whole number of bytes"),
        (
            lambda: ZstdCompressor(threshold=0.5),  # type: ignore[arg-type]
            "^threshold: must be a whole number of bytes",
        ),
    ],
)
def test_a_compressor_refuses_levels_and_thresholds_its_library_would_not_take(
    make: Any, text: str
) -> None:
    """Refused when made, not at the first large value a cache stores."""
    with pytest.raises(ArgumentError, match=text):
        make()
