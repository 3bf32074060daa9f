"""SqlSource's contract on SQLite, PostgreSQL and MariaDB: the same tests, real servers.

PostgreSQL and MariaDB are private servers started once per test session
(tests/sql_databases.py, from Debian's packages); each test makes its own
tables and drops them.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from tenure import ArgumentError, IngestJob, SqlSource
from tenure._core.sources import encode_row
from tenure.server import ServerProcess
from tests._backend_threads import gather
from tests.sql_databases import SqlServer, mariadb, postgresql

BIG = 2**40  # keys past 32 bits


@pytest.fixture(scope="session")
def _postgresql() -> Iterator[SqlServer]:
    server = postgresql()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _mariadb() -> Iterator[SqlServer]:
    server = mariadb()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """An engine on one of the three databases; tables made by the test are dropped after."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url = request.getfixturevalue(f"_{request.param}").url
    made = sa.create_engine(url)
    before = set(sa.inspect(made).get_table_names())
    yield made
    metadata = sa.MetaData()
    metadata.reflect(made)
    with made.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            if table.name not in before:
                table.drop(conn)
    made.dispose()


def events_table(engine: sa.Engine, name: str, keys: list[int]) -> sa.Table:
    """A table of every column type a source meets, one row per key."""
    table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(100)),
        sa.Column("amount", sa.Numeric(14, 2)),
        sa.Column("ratio", sa.Double),
        sa.Column("day", sa.Date),
        sa.Column("at", sa.DateTime),
        sa.Column("flag", sa.Boolean),
        sa.Column("blob", sa.LargeBinary(64)),
        sa.Column("note", sa.String(20), nullable=True),
    )
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [row(key) for key in keys])
    return table


def row(key: int) -> dict[str, Any]:
    """The row stored under ``key``."""
    return {
        "id": key,
        "name": f"événement {key} ✓",
        "amount": decimal.Decimal(key % 100_000) / 4,
        "ratio": key / 8,
        "day": datetime.date(2026, 1, 1) + datetime.timedelta(days=key % 365),
        "at": datetime.datetime(2026, 1, 1, 12, 30, 15) + datetime.timedelta(seconds=key % 86_400),
        "flag": key % 2 == 0,
        "blob": key.to_bytes(8, "big"),
        "note": None if key % 3 else "every third",
    }


def expected_json(key: int) -> dict[str, Any]:
    """The row as the sink stores it: JSON with the documented conversions."""
    data = row(key)
    return {
        **data,
        "amount": str(data["amount"].quantize(decimal.Decimal("0.01"))),
        "day": data["day"].isoformat(),
        "at": data["at"].isoformat(),
        "blob": data["blob"].hex(),
    }


KEYS = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, BIG, BIG + 1, BIG + 7]


def test_key_range_and_rows_across_pages(engine: sa.Engine) -> None:
    events_table(engine, "events", KEYS)
    source = SqlSource(engine, "events", "id", page=4)
    assert source.key_range() == (1, BIG + 7)
    got = list(source.rows(1, BIG + 7))  # five pages of four
    assert [key for key, _ in got] == KEYS
    assert [key for key, _ in source.rows(4, 100)] == [5, 8, 13, 21, 34, 55, 89]
    assert list(source.rows(990, BIG - 1)) == []  # a range inside a gap
    assert [key for key, _ in source.rows(BIG, BIG)] == [BIG]
    for key, data in got:
        assert json.loads(encode_row(data)) == expected_json(key), key


def test_describe_names_the_source_without_its_password(engine: sa.Engine) -> None:
    events_table(engine, "events", [1])
    url = engine.url.set(password="s3cret") if engine.url.drivername != "sqlite" else engine.url
    described = SqlSource(engine, "events", "id").describe()
    assert described["table"] == "events" and described["key"] == "id"
    assert described["kind"] == "sql" and "s3cret" not in json.dumps(described)
    assert "s3cret" not in url.render_as_string(hide_password=True)


def test_bad_tables_and_keys_are_refused_by_name(engine: sa.Engine) -> None:
    metadata = sa.MetaData()
    words = sa.Table("words", metadata, sa.Column("id", sa.Integer), sa.Column("word", sa.Text))
    named = sa.Table("named", metadata, sa.Column("code", sa.String(10), primary_key=True))
    sa.Table("vacant", metadata, sa.Column("id", sa.Integer, primary_key=True))
    nulls = sa.Table("nulls", metadata, sa.Column("id", sa.Integer))
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(words.insert(), [{"id": 1, "word": "a"}, {"id": 1, "word": "b"},
                                      {"id": 2, "word": "c"}])  # fmt: skip
        conn.execute(named.insert(), [{"code": "x"}])
        conn.execute(nulls.insert(), [{"id": 1}, {"id": None}])
    with pytest.raises(ArgumentError, match="no table 'missing'"):
        SqlSource(engine, "missing", "id")
    with pytest.raises(ArgumentError, match=r"has no column 'nope' \(id, word\)"):
        SqlSource(engine, "words", "nope")
    cases = [
        ("words", "id", r"words\.id is not unique \(1 duplicate or NULL keys\)"),
        ("nulls", "id", r"nulls\.id is not unique \(1 duplicate or NULL keys\)"),
        ("named", "code", r"named\.code must be an integer column"),
        ("vacant", "id", "'vacant' is empty"),
    ]
    for table, key, message in cases:
        with pytest.raises(ArgumentError, match=message):
            SqlSource(engine, table, key).key_range()


def test_a_job_from_each_database_lands_every_row_once(
    engine: sa.Engine, tenure_client: redis.Redis, tenure_server: ServerProcess
) -> None:
    keys = [k * 7 for k in range(1, 3_001)] + [BIG + k for k in range(200)]
    events_table(engine, "events", keys)
    clients = [tenure_server.client() for _ in range(3)]
    try:
        jobs = [
            IngestJob(client, "sql", SqlSource(engine, "events", "id", page=250),
                      chunk_size=BIG // 40, batch=200)
            for client in clients
        ]  # fmt: skip
        reports = gather(*(job.work for job in jobs))
        assert sum(report.rows for report in reports) == len(keys)
        entries: Any = tenure_client.xrange(jobs[0].keys.default_sink())
        stored = {int(fields[b"key"]): json.loads(fields[b"row"]) for _, fields in entries}
        assert len(entries) == len(keys) and sorted(stored) == keys  # once each
        assert stored[BIG + 3] == expected_json(BIG + 3)
        assert jobs[0].status().finished
    finally:
        for client in clients:
            client.close()
