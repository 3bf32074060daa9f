"""The two ingestion designs ``tenure bench ingest`` runs: tenure's IngestJob and the post's.

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

import random
import time
from typing import Any

import redis

from tenure import IngestJob, SqlSource
from tenure._tooling import encode_row

__all__ = ["LEASE", "POST_PREFIX", "post_keys", "run_post", "run_tenure"]

LEASE = 1.0  # seconds: tenure's claim lease in the benchmark (a killed worker's chunk waits this)
POST_PREFIX = "bench:post:"


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
