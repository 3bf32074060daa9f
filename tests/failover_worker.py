"""One process of tests/test_failover.py's run of lock cycles through a failover.

    python -m tests.failover_worker SENTINEL_PORT SERVICE SECONDS OUT_FILE

Takes and releases a ClusterLock through ``Sentinel.master_for`` for
SECONDS, recording every hold the lock reported (start and end on the
machine's monotonic clock, shared by every process, and the fencing token)
and every error, as JSON lines in OUT_FILE.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import redis.sentinel

from tenure import ClusterLock, TenureError
from tests.conftest import wait_for


def main(sentinel_port: str, service: str, seconds: str, out: str) -> None:
    """Cycle until the time is up, then write what happened."""
    sentinel: Any = redis.sentinel.Sentinel  # redis-py leaves Sentinel untyped
    client = sentinel([("127.0.0.1", int(sentinel_port))], socket_timeout=1.0).master_for(
        service, socket_timeout=1.0
    )
    lock = ClusterLock(client, "cycles", timeout=4, blocking_timeout=3, replica_timeout=0.3)
    records: list[dict[str, object]] = []
    stop_at = time.monotonic() + float(seconds)
    while time.monotonic() < stop_at:
        try:
            if not lock.acquire():
                records.append({"timeout": True})
                continue
        except TenureError as exc:
            records.append({"error": type(exc).__name__})
            wait_for(lambda: bool(client.ping()), 60, "the service's master answering")
            continue
        start = time.monotonic()
        fence = lock.fencing_token
        time.sleep(0.01)  # work under the lock: a window an overlap would show in
        end = time.monotonic()  # the hold ends here: nothing is done under it after
        try:
            lock.release()
        except TenureError as exc:
            records.append({"release_error": type(exc).__name__})
        records.append({"start": start, "end": end, "fence": fence})
    with open(out, "w") as file:
        for record in records:
            file.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
