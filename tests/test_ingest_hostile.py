"""Ingestion under hostile input: the right answer or one clear typed error, at once.

Each case is a table or a source a careless or unlucky user feeds a job; what
it gets is documented in docs/ingest.md. New findings land here.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tenure import (
    ArgumentError,
    BackendError,
    CallableSource,
    IngestJob,
    SourceRowError,
    SqlSource,
)
from tenure._sync._scripting import registry_for


def table(path: Path, rows: list[tuple[Any, str]], kind: str = "INTEGER") -> str:
    """An SQLite table ``t`` (key column ``id`` of type ``kind``, no constraint)."""
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE t (id {kind}, v TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?)", rows)
    return f"sqlite:///{path}"


@pytest.mark.parametrize(
    ("rows", "kind", "message"),
    [
        # SQLite keeps 2.5 in an INTEGER column; MIN and MAX are integers.
        ([(1, "a"), (2, "b"), (2.5, "c"), (3, "d")], "INTEGER", r"it holds 2\.5"),
        ([(1, "a"), ("x", "b")], "INTEGER", r"it holds 'x'"),
        ([(5, "a"), (7, "b")], "TEXT", r"it holds '5'"),  # the offending value, not MIN
        ([(-(2**63), "a"), (1, "b")], "INTEGER", r"holds -9223372036854775808, outside"),
        ([(1, "a"), (2**53, "b")], "INTEGER", r"holds 9007199254740992, outside"),
    ],
    ids=["real-in-integer", "text-in-integer", "text-column", "int64-min", "past-2**53"],
)
@pytest.mark.parametrize("page", [1, 3])
def test_a_key_that_is_not_a_plain_integer_is_refused_before_anything_is_written(
    tenure_client: redis.Redis,
    tmp_path: Path,
    rows: list[tuple[Any, str]],
    kind: str,
    message: str,
    page: int,
) -> None:
    url = table(tmp_path / "t.sqlite", rows, kind)
    job = IngestJob(tenure_client, "hostile", SqlSource(url, "t", "id", page=page))
    started = time.monotonic()
    with pytest.raises(ArgumentError, match=message):
        job.work()
    assert time.monotonic() - started < 5  # at once: no loop
    assert tenure_client.dbsize() == 0  # nothing half-written


def test_a_source_that_repeats_a_key_is_refused_before_its_batch_is_written(
    tenure_client: redis.Redis,
) -> None:
    def fetch(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            yield key, {"n": key}
            if key == 5:
                yield key, {"n": "again"}  # a truncated 5.5, say

    source = CallableSource(fetch, low=1, high=10, name="repeats")
    job = IngestJob(tenure_client, "repeats", source, batch=100)
    with pytest.raises(ArgumentError, match=r"yielded key 5 outside 6\.\.10 or out of order"):
        job.work()
    assert tenure_client.xlen(job.sink_key) == 0


def test_the_commit_script_refuses_a_batch_that_does_not_move_the_cursor(
    tenure_client: redis.Redis,
) -> None:
    """The server's backstop, whatever the client sends."""
    keys = ("{j}:free", "{j}:leases", "{j}:cursors", "{j}:stats", "{j}:sink")
    tenure_client.zadd("{j}:free", {"0": 1})
    tenure_client.hset("{j}:leases", "0", "tok")
    tenure_client.hset("{j}:cursors", "0", "5")
    run = registry_for(tenure_client).run

    def commit(*batch: str) -> Any:
        return run("ingest_commit", keys, ("tok", 0, 10_000, 0, "stream", "5", *batch))

    for batch in (("5", "{}"), ("4", "{}"), ("7", "{}", "6", "{}"), ("x", "{}")):
        with pytest.raises(BackendError, match="keys must be unique and ascending"):
            commit(*batch)
        assert tenure_client.xlen("{j}:sink") == 0  # nothing appended
    assert commit("6", "{}", "7", "{}") == 1
    assert tenure_client.xlen("{j}:sink") == 2


def strict_json(text: bytes) -> Any:
    """``text`` read as strict JSON (RFC 8259): NaN, Infinity and -Infinity refused."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON (RFC 8259): {constant}")

    return json.loads(text, parse_constant=refuse)


def prices(path: Path, kind: str, cell: str, *, at: int = 42) -> str:
    """An SQLite table ``t`` of 100 rows whose ``price`` (of type ``kind``) holds ``cell`` (SQL)
    at key ``at``; every other price is a plain number."""
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE t (id INTEGER PRIMARY KEY, price {kind}, note TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?, 'x')", [(k, k / 2) for k in range(1, 101)])
        db.execute(f"UPDATE t SET price = {cell} WHERE id = ?", (at,))
    return f"sqlite:///{path}"


def given_back_after_40_rows(client: redis.Redis, job: IngestJob) -> None:
    """Batches of 10 rows up to key 40 were written, strict JSON; the claim was given back."""
    status = job.status()
    assert status.claimed == 0 and status.free == 1 and status.rows == 40
    entries: Any = client.xrange(job.sink_key)
    assert [strict_json(fields[b"row"])["id"] for _, fields in entries] == list(range(1, 41))


@pytest.mark.parametrize(("cell", "shown"), [("9e999", "inf"), ("-9e999", "-inf")])
def test_an_sqlite_real_holding_an_infinity_is_refused_naming_its_key_and_column(
    tenure_client: redis.Redis, tmp_path: Path, cell: str, shown: str
) -> None:
    """SQLite keeps an infinity in a REAL column (a NaN it stores as NULL)."""
    url = prices(tmp_path / "t.sqlite", "REAL", cell)
    source = SqlSource(url, "t", "id", page=10)
    job = IngestJob(tenure_client, "infinite", source, chunk_size=100, batch=10)
    with pytest.raises(SourceRowError) as refused:
        job.work()
    assert (refused.value.key, refused.value.column) == (42, "price")
    assert str(refused.value).startswith(
        f"row 42, column 'price' holds {shown}: JSON (RFC 8259) has no NaN or infinity"
    )
    given_back_after_40_rows(tenure_client, job)


@pytest.mark.parametrize(
    ("kind", "cell"),
    [
        ("NUMERIC", "'abc'"),  # SQLAlchemy's decimal conversion: a raw TypeError
        ("TIMESTAMP", "'x'"),  # its datetime parser: a raw ValueError
        ("DATE", "'2026-13-45'"),
        ("JSON", "'{not json'"),  # its JSON column: a raw JSONDecodeError
    ],
)
def test_an_sqlite_cell_that_cannot_be_converted_is_refused_naming_its_key_and_column(
    tenure_client: redis.Redis, tmp_path: Path, kind: str, cell: str
) -> None:
    url = prices(tmp_path / "t.sqlite", kind, cell)
    if kind in ("TIMESTAMP", "DATE", "JSON"):  # the other rows as the column's type holds them
        with sqlite3.connect(tmp_path / "t.sqlite") as db:
            plain = {"TIMESTAMP": "'2026-01-01 12:00:00'", "DATE": "'2026-01-01'", "JSON": "'[1]'"}
            db.execute(f"UPDATE t SET price = {plain[kind]} WHERE id != 42")
    source = SqlSource(url, "t", "id", page=10)
    job = IngestJob(tenure_client, "unconverted", source, chunk_size=100, batch=10)
    with pytest.raises(SourceRowError) as refused:
        job.work()
    assert (refused.value.key, refused.value.column) == (42, "price")
    assert str(refused.value).startswith(
        f"'t' row 42, column 'price' ({kind}) holds {cell}, which cannot be converted: "
    )
    assert str(refused.value).endswith("(refused before it was written)")
    given_back_after_40_rows(tenure_client, job)
    # the whole page refused, as one read: found however large the page
    with pytest.raises(SourceRowError, match=r"^'t' row 42, column 'price'"):
        list(SqlSource(url, "t", "id", page=1000).rows(1, 100))
