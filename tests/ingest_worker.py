"""One ingestion worker process, for tests/test_ingest.py's kill -9 test.

    python -m tests.ingest_worker REDIS_URL SQLITE_PATH JOB

Works until the job is done; killed at any moment by the test.
"""

from __future__ import annotations

import sys

import redis

from tenure import IngestJob, SqlSource


def main(url: str, database: str, job: str) -> None:
    """Run one worker of ``job`` to the end."""
    client = redis.Redis.from_url(url)
    source = SqlSource(f"sqlite:///{database}", "events", "id", page=400)
    IngestJob(client, job, source, chunk_size=5_000, lease=1.0, batch=200).work()


if __name__ == "__main__":
    main(*sys.argv[1:4])
