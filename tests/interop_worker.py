"""One process of tests/test_interop_processes.py: a lock cycled by redis-py or tenure.

    python -m tests.interop_worker KIND PORT CLUSTER SECONDS CYCLES OUT_FILE

KIND is ``redis-py`` (redis-py's own ``Lock``) or ``tenure`` (tenure's ``Lock``
with ``interop="redis-py"``); PORT a loopback server, or a cluster node when
CLUSTER is ``1``. Takes and releases lock ``orders`` until it made CYCLES holds
or SECONDS passed, recording every hold (start and end on the machine's
monotonic clock, shared by every process, and tenure's fencing token) and
every error, as JSON lines in OUT_FILE.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import redis
import redis.cluster

from tenure import Lock
from tests.conftest import wait_for


def main(kind: str, port: str, cluster: str, seconds: str, cycles: str, out: str) -> None:
    """Cycle until the time or the count is up, then write what happened."""
    client: Any
    if cluster == "1":
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=int(port))
    else:
        client = redis.Redis(port=int(port))
    # Leases long enough that a busy machine's stalls do not end a hold
    # between its acquire and its release (that is the lease's job, not this test's).
    lock: Any
    if kind == "tenure":
        lock = Lock(client, "orders", timeout=15, sleep=0.01, interop="redis-py")
    else:
        lock = client.lock("orders", timeout=15, sleep=0.01)
    records: list[dict[str, object]] = []
    stop_at = time.monotonic() + float(seconds)
    holds = 0
    while time.monotonic() < stop_at and holds < int(cycles):
        try:
            if not lock.acquire(blocking_timeout=10):
                records.append({"timeout": True})
                continue
        except Exception as exc:
            records.append({"error": f"{type(exc).__name__}: {exc}"})
            wait_for(lambda: bool(client.ping()), 30, "the server answering")
            continue
        start = time.monotonic()
        fence = getattr(lock, "fencing_token", None)
        time.sleep(0.002)  # work under the lock: a window an overlap would show in
        end = time.monotonic()  # the hold ends here: nothing is done under it after
        try:
            lock.release()
        except Exception as exc:
            records.append({"release_error": f"{type(exc).__name__}: {exc}"})
        records.append({"kind": kind, "start": start, "end": end, "fence": fence})
        holds += 1
    with open(out, "w") as file:
        for record in records:
            file.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:7])
