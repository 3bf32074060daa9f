"""SqlSource's contract on SQLite, PostgreSQL and MariaDB: the same tests, real servers.

PostgreSQL and MariaDB are private servers started once per test session
(tests/sql_databases.py, from Debian's packages); each test makes its own
tables and drops them.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import sqlalchemy as sa

from tenure import (
    ArgumentError,
    AsyncIngestJob,
    IngestJob,
    SourceRowError,
    SourceUnavailableError,
    SqlSource,
)
from tenure._core.rows import encode_row
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


def strict_json(text: bytes) -> Any:
    """``text`` read as strict JSON (RFC 8259): NaN, Infinity and -Infinity refused."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON (RFC 8259): {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def pg(_postgresql: SqlServer) -> Iterator[sa.Engine]:
    """An engine on the session's PostgreSQL; the tables and views made are dropped after."""
    made = sa.create_engine(_postgresql.url)
    yield made
    with made.begin() as conn:
        conn.exec_driver_sql("DROP VIEW IF EXISTS typed")
        conn.exec_driver_sql("DROP TABLE IF EXISTS raw, readings")
    made.dispose()


@pytest.mark.parametrize(
    ("column", "cell", "said"),
    [
        ("at", "'infinity'", "timestamp too large"),  # psycopg has no datetime for it
        ("day", "'-infinity'", "date too small"),
    ],
)
def test_a_postgresql_cell_the_driver_cannot_convert_is_named_by_key_and_column(
    pg: sa.Engine, tenure_client: redis.Redis, column: str, cell: str, said: str
) -> None:
    with pg.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE readings (id bigint PRIMARY KEY, at timestamp, day date)"
        )
        conn.exec_driver_sql(
            "INSERT INTO readings SELECT g, '2026-01-01 12:00', '2026-01-01' "
            "FROM generate_series(1, 100) g"
        )
        conn.exec_driver_sql(f"UPDATE readings SET {column} = {cell} WHERE id = 57")
    job = IngestJob(tenure_client, "readings", SqlSource(pg, "readings", "id", page=25),
                    chunk_size=100, batch=25)  # fmt: skip
    with pytest.raises(SourceRowError) as refused:
        job.work()
    assert (refused.value.key, refused.value.column) == (57, column)
    assert str(refused.value).startswith(
        f"'readings' row 57, column '{column}' ({'TIMESTAMP' if column == 'at' else 'DATE'}) "
        f"holds {cell}, which cannot be converted: {said}"
    )
    status = job.status()
    assert status.claimed == 0 and status.rows == 50  # two pages in; the claim given back


def test_a_postgresql_text_cast_that_fails_is_named_by_key_and_column(
    pg: sa.Engine, tenure_client: redis.Redis
) -> None:
    """A view casting text to NUMERIC and TIMESTAMP: the server refuses the whole query."""
    with pg.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE raw (id bigint PRIMARY KEY, amount text, at text)")
        conn.exec_driver_sql(
            "INSERT INTO raw SELECT g, g::text, '2026-01-01' FROM generate_series(1, 100) g"
        )
        conn.exec_driver_sql("UPDATE raw SET amount = 'abc' WHERE id = 63")
        conn.exec_driver_sql("UPDATE raw SET at = 'x' WHERE id = 71")
        conn.exec_driver_sql(
            "CREATE VIEW typed AS SELECT id, amount::numeric AS amount, at::timestamp AS at "
            "FROM raw"
        )
    source = SqlSource(pg, "typed", "id", page=1000)
    with pytest.raises(SourceRowError) as refused:
        list(source.rows(1, 100))
    assert (refused.value.key, refused.value.column) == (63, "amount")
    assert "column 'amount' (NUMERIC), which cannot be converted: invalid input syntax" in str(
        refused.value
    )
    with pg.begin() as conn:
        conn.exec_driver_sql("UPDATE raw SET amount = '1.5' WHERE id = 63")
    job = IngestJob(tenure_client, "typed", source, chunk_size=100)
    with pytest.raises(SourceRowError, match=r"row 71, column 'at' \(TIMESTAMP\), which cannot"):
        job.work()
    assert job.status().claimed == 0 and tenure_client.xlen(job.sink_key) == 0


def test_a_postgresql_nan_or_infinity_is_refused_and_decimals_stay_strings(
    pg: sa.Engine, tenure_client: redis.Redis
) -> None:
    with pg.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE readings (id bigint PRIMARY KEY, ratio double precision, amount numeric)"
        )
        conn.exec_driver_sql("INSERT INTO readings VALUES (1, 0.5, 'NaN'), (2, 1.5, 'Infinity')")
        conn.exec_driver_sql("INSERT INTO readings VALUES (3, 'NaN', 1), (4, 'Infinity', 2)")
    job = IngestJob(tenure_client, "readings", SqlSource(pg, "readings", "id"), chunk_size=100,
                    batch=2)  # fmt: skip
    with pytest.raises(SourceRowError) as refused:
        job.work()
    assert (refused.value.key, refused.value.column) == (3, "ratio")
    assert str(refused.value).startswith("row 3, column 'ratio' holds nan: JSON (RFC 8259)")
    entries: Any = tenure_client.xrange(job.sink_key)
    assert [strict_json(fields[b"row"]) for _, fields in entries] == [
        {"id": 1, "ratio": 0.5, "amount": "NaN"},  # a decimal is a string, NaN included
        {"id": 2, "ratio": 1.5, "amount": "Infinity"},
    ]
    assert job.status().claimed == 0


class KilledMidRead:
    """A :class:`SqlSource` whose database is killed (SIGKILL, by PID) as its rows reach ``at``.

    Once: after a restart it reads on.
    """

    def __init__(self, source: SqlSource, server: SqlServer, at: int) -> None:
        self.source, self.server, self.at = source, server, at
        self.killed = False

    def describe(self) -> dict[str, Any]:
        return self.source.describe()

    def key_range(self) -> tuple[int, int]:
        return self.source.key_range()

    def rows(self, first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key, data in self.source.rows(first, last):
            if key >= self.at and not self.killed:
                self.server.kill()  # the rest of this page is read; the next query fails
                self.killed = True
            yield key, data


@pytest.fixture
def doomed_postgresql() -> Iterator[SqlServer]:
    """A PostgreSQL server of the test's own, to be killed."""
    server = postgresql()
    yield server
    server.stop()


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_postgresql_killed_mid_read_raises_source_unavailable_and_loses_no_row(
    doomed_postgresql: SqlServer,
    tenure_client: redis.Redis,
    tenure_server: ServerProcess,
    flavour: str,
    request: pytest.FixtureRequest,
) -> None:
    server = doomed_postgresql
    engine = sa.create_engine(server.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE events (id bigint PRIMARY KEY, v text)")
        conn.exec_driver_sql("INSERT INTO events SELECT g, 'x' FROM generate_series(1, 6000) g")
    with engine.connect() as conn:  # on disk: the server runs with synchronous_commit=off
        conn.exec_driver_sql("CHECKPOINT")
    request.addfinalizer(engine.dispose)  # its connections closed, not left to the collector
    source = SqlSource(engine, "events", "id", page=200)
    killing = KilledMidRead(source, server, at=2_450)
    port = sa.make_url(server.url).port

    if flavour == "sync":
        job = IngestJob(tenure_client, "events", killing, chunk_size=1000, batch=100)
        with pytest.raises(SourceUnavailableError) as lost:
            job.work()
    else:

        async def work() -> None:
            client = redis.asyncio.Redis.from_url(tenure_server.url)
            try:
                await AsyncIngestJob(client, "events", killing, chunk_size=1000, batch=100).work()
            finally:
                await client.aclose()

        with pytest.raises(SourceUnavailableError) as lost:
            asyncio.run(work())
        job = IngestJob(tenure_client, "events", source, chunk_size=1000, batch=100)
    error = lost.value
    assert (error.kind, error.host, error.port) == ("PostgreSQL", "127.0.0.1", port)
    assert error.why and str(error).startswith(
        f"PostgreSQL at 127.0.0.1:{port} failed while reading 'events' keys "
    )
    assert str(error).endswith(f": {error.why}") and "\n" not in str(error)
    assert isinstance(error.__cause__, sa.exc.DBAPIError)  # the driver's error, kept
    status = job.status()
    assert status.claimed == 0 and 0 < status.rows < 6000  # the claim was given back
    entries: Any = tenure_client.xrange(job.sink_key)
    written = [int(fields[b"key"]) for _, fields in entries]
    assert len(written) == len(set(written)) == status.rows
    # a job planned now on the dead database says the same of its key range
    with pytest.raises(SourceUnavailableError, match=r"reading the key range of 'events': conn"):
        IngestJob(tenure_client, "another", source).plan()
    server.restart()  # it recovers from the crash; the same job finishes
    assert job.work().rows == 6000 - status.rows
    entries = tenure_client.xrange(job.sink_key)
    keys = [int(fields[b"key"]) for _, fields in entries]
    assert sorted(keys) == list(range(1, 6001))  # every row exactly once
