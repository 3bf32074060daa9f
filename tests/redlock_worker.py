"""One process of tests/test_redlock_faults.py's contended run over three masters.

    python -m tests.redlock_worker PORTS SECONDS CYCLES OUT_FILE

Takes and releases a Redlock over the masters on PORTS (comma-separated, on
loopback) until it made CYCLES holds or SECONDS passed, recording every hold
(start and end on the machine's monotonic clock, shared by every process,
and the fencing token) and every error, as JSON lines in OUT_FILE.
"""

from __future__ import annotations

import json
import sys
import time

import redis

from tenure import Redlock, TenureError


def main(ports: str, seconds: str, cycles: str, out: str) -> None:
    """Cycle until the time or the count is up, then write what happened."""
    clients = [
        redis.Redis(port=int(port), socket_timeout=0.5, socket_connect_timeout=0.5)
        for port in ports.split(",")
    ]
    # A lease long enough that a busy machine's stalls do not end a hold
    # between its acquire and its release (that is the lease's job, not this test's).
    # master_timeout 1.5 s (a tenth of the lease): two masters answering decide an
    # attempt at once, and a machine busy with other tests still answers in time.
    lock = Redlock(clients, "cycles", timeout=15, blocking_timeout=5, master_timeout=1.5)
    records: list[dict[str, object]] = []
    stop_at = time.monotonic() + float(seconds)
    holds = 0
    while time.monotonic() < stop_at and holds < int(cycles):
        try:
            if not lock.acquire():
                records.append({"timeout": True})
                continue
        except TenureError as exc:
            records.append({"error": f"{type(exc).__name__}: {exc}"})
            continue  # a QuorumError came after master_timeout: try again at once
        start = time.monotonic()
        fence = lock.fencing_token
        end = time.monotonic()  # the hold ends here: nothing is done under it after
        try:
            lock.release()
        except TenureError as exc:
            records.append({"release_error": f"{type(exc).__name__}: {exc}"})
        records.append({"start": start, "end": end, "fence": fence})
        holds += 1
    with open(out, "w") as file:
        for record in records:
            file.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
