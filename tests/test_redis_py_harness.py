"""scripts/redis_py_lock_tests.py's own rules: the list's format, and what counts as a
listed test failing where the list says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import redis_py_lock_tests as harness


def test_a_listed_failure_must_be_the_one_listed() -> None:
    entry = harness.Entry(
        "TestLock::test_x", "*", 'r.pttl("foo")...-> AssertionError: assert 8000', ""
    )
    assert entry.failed_as_listed(
        'assert 8000 < r.pttl("foo") <= 10000 -> AssertionError: assert 8000 < -2'
    )
    assert entry.failed_as_listed(
        'assert 8000 < (await r.pttl("foo")) <= 10000 -> AssertionError: assert 8000 < -2'
    )
    assert not entry.failed_as_listed(
        'assert r.ttl("foo") == -1 -> AssertionError: assert 30 == -1'
    )
    assert not entry.failed_as_listed("")


def test_each_list_parses_and_names_where_its_tests_fail() -> None:
    for path in harness.MODES.values():
        entries = harness.read_expected(path)
        assert entries
        assert all(entry.fails_at and entry.reason for entry in entries)


def test_a_line_without_its_failure_is_refused(tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text("TestLock::test_x | * | key layout: r.get\n")
    with pytest.raises(harness.HarnessError, match="<fails at>"):
        harness.read_expected(listing)


def test_only_a_timed_failure_that_passes_alone_counts_as_passed() -> None:
    timed = "tests/test_lock.py::TestLock::test_blocking_timeout"
    still = "tests/test_lock.py::TestLock::test_context_manager_blocking_timeout"
    other = "tests/test_lock.py::TestLock::test_release"
    verdict = harness.Verdict(
        unexpected_failures=[(timed, "late"), (still, "late"), (other, "wrong")]
    )
    assert harness.timed_failures(verdict) == [timed, still]
    second = {"outcomes": {timed: {"outcome": "passed"}, still: {"outcome": "failed"}}}
    harness.take_second_runs(verdict, second)
    assert verdict.passed == [timed]
    assert verdict.second_runs == [(timed, "late")]
    assert verdict.unexpected_failures == [(still, "late"), (other, "wrong")]
    assert not verdict.ok
