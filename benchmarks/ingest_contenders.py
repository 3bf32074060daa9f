"""What ``tenure bench ingest`` runs: tenure's IngestJob, the post's design, and the ceilings.

The ceilings (:func:`ceiling`, :func:`pg_ceiling`) are one process reading
the table with a bare cursor (``sqlite3``, psycopg) and XADDing its rows in
pipelines of :data:`BATCH`: no coordination at all.

The post ("Locking Redis clients for distributed calculations") books a
chunk of a SQL table by naming its connection after the chunk (CLIENT
SETNAME), after checking with CLIENT LIST that no other connection has that
name; a bitmap marks the chunks done; a chunk's rows go out in one pipeline
of LPUSH, with the chunk's bit. It is written here as described, holes
included (they are what the benchmark measures):

* the done bit is read before the booking, outside it: a worker can read
  "not done", another can finish the chunk and move on, and the first then
  books and does it again;
* the bitmap is deleted when every bit is set, so a worker that comes late
  (a replacement started just then) sees nothing done and redoes it all;
* a worker that hangs but stays connected keeps its chunk's name forever;
* CLIENT LIST is an admin command, O(clients), and sees one node only.

Both read the table with the same :class:`~tenure.SqlSource` and encode rows
the same way, so what differs is the coordination.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from benchmarks import BenchmarkError, require_peer
from tenure import IngestJob, SqlSource
from tenure._tooling import encode_row

__all__ = [
    "BATCH",
    "LEASE",
    "POST_PREFIX",
    "ceiling",
    "copy_to_postgresql",
    "estimated_seconds",
    "pg_ceiling",
    "post_keys",
    "run_post",
    "run_tenure",
]

BATCH = 500  # the job's default batch; the ceilings' pipeline length
LEASE = 1.0  # seconds: tenure's claim lease in the benchmark (a killed worker's chunk waits this)
POST_PREFIX = "bench:post:"

# How long a run takes (:func:`estimated_seconds`), measured on the 2-core machine
# of docs/benchmarks.md: rates in rows/s, times in seconds.
START = 1.0  # the interpreter, the private server, the report
TABLE_RATE = 800_000.0  # rows written into the SQLite tables
CEILING_RATE = 90_000.0  # the ceiling (the PostgreSQL one too)
SPEED_RATE = {"tenure": 112_000.0, "post": 88_000.0}  # one worker; more share 2 cores
RUN_START = 0.2  # a speed or memory run: the job, the go signal, the workers' exit
WORKER_START = 0.6  # per worker process: spawn, imports (SQLAlchemy), connect
AUDIT_RATE = 400_000.0  # sink entries read back and checked
FAULT_RUN = {"tenure": (7.5, 34_000.0), "post": (1.5, 14_000.0)}
"""The fault runs (4 workers, one killed now and then): seconds more, and rows/s. tenure's
first seconds go to killed workers' chunks waiting out their leases, replacements starting."""
COPY_RATE = 50_000.0  # rows copied into PostgreSQL


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long ``tenure bench ingest`` with ``args`` takes: rows over rates, start-ups."""
    speed, faults = int(args.rows), int(args.fault_rows)
    memory = [int(rows) for rows in args.memory_rows]
    total = START + sum({speed, faults, *memory}) / TABLE_RATE
    per_round = speed / CEILING_RATE
    for design, rate in SPEED_RATE.items():
        for count in args.workers:
            share = min(count, 2) ** (0.6 if design == "tenure" else 0.75)
            per_round += RUN_START + WORKER_START * count + speed / (rate * share)
            per_round += speed / AUDIT_RATE * (2 if design == "post" else 1)
    total += int(args.rounds) * per_round
    if args.postgresql:
        total += speed / COPY_RATE + int(args.rounds) * (
            speed / CEILING_RATE
            + RUN_START
            + WORKER_START
            + speed / SPEED_RATE["tenure"]
            + speed / AUDIT_RATE
        )
    for design, (more, rate) in FAULT_RUN.items():
        total += more + faults / rate + faults / AUDIT_RATE * (2 if design == "post" else 1)
    one = RUN_START + WORKER_START
    return total + sum(one + rows / SPEED_RATE["tenure"] for rows in memory)


def post_keys(job: str) -> dict[str, str]:
    """The post's keys for ``job``: the done bitmap, the list of rows, the completion flag."""
    return {
        "done": f"{POST_PREFIX}{job}:done",
        "rows": f"{POST_PREFIX}{job}:rows",
        "complete": f"{POST_PREFIX}{job}:complete",
    }


def run_tenure(client: redis.Redis, source: SqlSource, job: str, chunk_size: int) -> int:
    """One tenure worker to the job's end; the rows it committed."""
    return IngestJob(client, job, source, chunk_size=chunk_size, lease=LEASE).work().rows


def run_post(client: redis.Redis, source: SqlSource, job: str, chunk_size: int) -> int:
    """One worker of the post's design to the job's end; the rows it pushed."""
    keys = post_keys(job)
    low, high = source.key_range()
    chunks = (high - low) // chunk_size + 1
    order = list(range(chunks))
    random.shuffle(order)
    pushed = 0
    while True:
        for chunk in order:
            if client.getbit(keys["done"], chunk):  # read outside the booking
                continue
            name = f"post-{job}-{chunk}"
            booking = client.pipeline(transaction=False)
            booking.client_list()
            booking.client_setname(name)
            connections, _ = booking.execute()
            if any(c.get("name") == name for c in connections):
                continue  # another connection holds this chunk
            first = low + chunk * chunk_size
            rows: list[Any] = list(source.rows(first, min(high, first + chunk_size - 1)))
            push = client.pipeline()  # the whole chunk in one pipeline, with its bit
            for _, row in rows:
                push.lpush(keys["rows"], encode_row(row))
            push.setbit(keys["done"], chunk, 1)
            push.execute()
            pushed += len(rows)
        if int(client.bitcount(keys["done"])) >= chunks:
            client.delete(keys["done"])  # the end: a late worker finds nothing done
            client.set(keys["complete"], 1)
            return pushed
        if client.exists(keys["complete"]):
            return pushed
        time.sleep(0.05)


# -- the ceilings: one process, no coordination ---------------------------------


def _xadd_batches(client: redis.Redis, rows: Any) -> int:
    """XADD ``(key, JSON)`` rows to the ceiling's stream in pipelines of :data:`BATCH`."""
    pipe = client.pipeline(transaction=False)
    count = 0
    for key, text in rows:
        pipe.xadd("bench:ceiling", {"key": str(key), "row": text})
        count += 1
        if count % BATCH == 0:
            pipe.execute()
    pipe.execute()
    return count


def _as_json(columns: Sequence[str], rows: Any) -> Any:
    """``(key, compact JSON)`` of DB-API rows whose first column is the key."""
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    for row in rows:
        yield row[0], dumps(dict(zip(columns, row, strict=True)))


def ceiling(client: redis.Redis, database: Path) -> float:
    """Rows/s of one process reading the table with ``sqlite3`` and XADDing, pipelined.

    No coordination: one cursor over the table in key order, each row made
    compact JSON (as the job writes it), XADDed in pipelines of :data:`BATCH`.
    """
    client.flushdb()
    started = time.perf_counter()
    with contextlib.closing(sqlite3.connect(database)) as db:
        cursor = db.execute("SELECT id, name, amount FROM events ORDER BY id")
        columns = [column[0] for column in cursor.description]
        count = _xadd_batches(client, _as_json(columns, cursor))
    took = time.perf_counter() - started
    if int(client.xlen("bench:ceiling")) != count:
        raise BenchmarkError("the ceiling run lost rows")
    return count / took


def pg_ceiling(client: redis.Redis, url: str) -> float:
    """:func:`ceiling` on PostgreSQL: one psycopg cursor (fetching 2,000 rows at a time)."""
    psycopg = require_peer("psycopg", "psycopg")
    client.flushdb()
    started = time.perf_counter()
    with psycopg.connect(_libpq(url)) as db, db.cursor(name="ceiling") as cursor:
        cursor.itersize = 2_000
        cursor.execute("SELECT id, name, amount FROM events ORDER BY id")
        count = 0
        columns: list[str] = []
        rows = iter(cursor)
        first = next(rows, None)
        if first is not None:
            columns = [column.name for column in cursor.description or ()]
            count = _xadd_batches(client, _as_json(columns, itertools.chain([first], rows)))
    took = time.perf_counter() - started
    if int(client.xlen("bench:ceiling")) != count:
        raise BenchmarkError("the PostgreSQL ceiling run lost rows")
    return count / took


def _libpq(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as a libpq connection string."""
    import sqlalchemy as sa

    made = sa.engine.make_url(url).set(drivername="postgresql")
    return made.render_as_string(hide_password=False)


def copy_to_postgresql(database: Path, url: str) -> None:
    """The SQLite table ``events`` copied into ``url``'s database (replacing one there)."""
    psycopg = require_peer("psycopg", "psycopg")
    with (
        contextlib.closing(sqlite3.connect(database)) as source,
        psycopg.connect(_libpq(url)) as db,
    ):
        db.execute("DROP TABLE IF EXISTS events")
        db.execute(
            "CREATE TABLE events (id BIGINT PRIMARY KEY, name TEXT, amount DOUBLE PRECISION)"
        )
        with db.cursor().copy("COPY events (id, name, amount) FROM STDIN") as copy:
            for row in source.execute("SELECT id, name, amount FROM events ORDER BY id"):
                copy.write_row(row)
        db.execute("ANALYZE events")
