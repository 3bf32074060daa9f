"""The near layer's bookkeeping, without a server: what may be answered from memory."""

from __future__ import annotations

import math

import pytest

from tenure import ArgumentError, NearCache
from tenure._core.near import Confirmation, NearEntries, near_settings

pytestmark = pytest.mark.engine_blind


def _entries(**settings: float) -> tuple[NearEntries, Confirmation]:
    confirmation = Confirmation()
    confirmation.began(0.0)
    entries = NearEntries(NearCache(**settings), confirmation)  # type: ignore[arg-type]
    entries.mark_tracked(confirmation)  # the connection tracks its prefix
    return entries, confirmation


def _read(entries: NearEntries, key: str, data: bytes, at: float, until: float = math.inf) -> None:
    entries.finish(key, entries.begin(key), at, data, until)


def test_an_entry_is_served_while_confirmed_and_fresh() -> None:
    entries, confirmation = _entries(max_staleness=0.1)
    _read(entries, "k", b"v", 1.0, until=5.0)
    confirmation.answered(1.0)
    assert entries.get("k", 1.05) == (True, b"v")
    assert entries.get("k", 1.2) == (False, None)  # no answer to a ping since 1.0
    confirmation.answered(4.95)
    assert entries.get("k", 5.0) == (False, None)  # past its expiry on the server


def test_an_invalidation_that_overtakes_the_reply_wins() -> None:
    entries, confirmation = _entries()
    ticket = entries.begin("k")
    entries.invalidate("k")  # the write was announced before the (older) reply came
    entries.finish("k", ticket, 0.5, b"old", math.inf)
    confirmation.answered(0.5)
    assert entries.get("k", 0.55) == (False, None)
    # another key's invalidation does not touch it
    ticket = entries.begin("k")
    entries.invalidate("other")
    entries.finish("k", ticket, 0.6, b"new", math.inf)
    confirmation.answered(0.6)
    assert entries.get("k", 0.61) == (True, b"new")


def test_a_flush_drops_everything_and_the_reads_in_flight() -> None:
    entries, confirmation = _entries()
    _read(entries, "a", b"1", 0.1)
    ticket = entries.begin("b")
    entries.flush()
    entries.finish("b", ticket, 0.1, b"2", math.inf)
    confirmation.answered(0.2)
    assert entries.get("a", 0.2) == (False, None)
    assert entries.get("b", 0.2) == (False, None)


def test_nothing_is_kept_from_before_tracking_or_from_another_life() -> None:
    confirmation = Confirmation()
    entries = NearEntries(NearCache(), confirmation)
    ticket = entries.begin("k")  # not tracking yet
    confirmation.began(1.0)
    entries.mark_tracked(confirmation)
    entries.finish("k", ticket, 0.5, b"v", math.inf)  # the read began before tracking did
    assert entries.get("k", 1.01) == (False, None)
    _read(entries, "k", b"v", 1.1)
    confirmation.answered(1.1)
    assert entries.get("k", 1.11) == (True, b"v")
    confirmation.ended()
    confirmation.began(2.0)  # a new connection: what the old one confirmed is not served
    entries.mark_tracked(confirmation)
    assert entries.get("k", 2.01) == (False, None)


def test_nothing_is_kept_while_the_connection_tracks_other_prefixes() -> None:
    confirmation = Confirmation()
    confirmation.began(0.0)
    entries = NearEntries(NearCache(), confirmation)  # registered after the connection began
    _read(entries, "k", b"v", 0.1)
    confirmation.answered(0.1)
    assert not entries.tracked and entries.get("k", 0.11) == (False, None)


def test_the_least_recently_read_goes_first_and_max_age_caps_an_entry() -> None:
    entries, confirmation = _entries(max_entries=2, max_age=10.0)
    _read(entries, "a", b"1", 0.0)
    _read(entries, "b", b"2", 0.0)
    confirmation.answered(0.0)
    assert entries.get("a", 0.01)[0]  # a read last: b goes when c comes
    _read(entries, "c", b"3", 0.0)
    assert [entries.get(k, 0.02)[0] for k in "abc"] == [True, False, True]
    confirmation.answered(10.0)
    assert entries.get("a", 10.01) == (False, None)  # older than max_age


@pytest.mark.parametrize(
    ("settings", "argument"),
    [
        ({"max_entries": 0}, "max_entries"),
        ({"max_entries": True}, "max_entries"),
        ({"max_entries": 2.5}, "max_entries"),
        ({"max_staleness": 0}, "max_staleness"),
        ({"max_staleness": 0.001}, "max_staleness"),
        ({"max_staleness": float("nan")}, "max_staleness"),
        ({"max_staleness": 120}, "max_staleness"),
        ({"max_age": -1}, "max_age"),
        ({"max_age": "1"}, "max_age"),
    ],
)
def test_bad_settings_are_refused_by_name(settings: dict[str, object], argument: str) -> None:
    with pytest.raises(ArgumentError, match=argument):
        NearCache(**settings)  # type: ignore[arg-type]


def test_near_takes_true_false_or_settings() -> None:
    assert near_settings(True, "c") == NearCache()
    assert near_settings(False, "c") is None and near_settings(None, "c") is None
    assert near_settings(NearCache(max_entries=5), "c") == NearCache(max_entries=5)
    for bad in (1, "yes", {"max_entries": 5}):
        with pytest.raises(ArgumentError, match="near"):
            near_settings(bad, "c")
