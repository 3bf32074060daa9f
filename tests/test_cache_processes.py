"""HerdCache across real processes: 4 processes x 50 callers, threads in two, tasks in two."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import redis

from tenure.server import ServerProcess
from tests.cache_worker import LOAD_SECONDS
from tests.conftest import fresh_until, wait_server_past


def _stampede(server: ServerProcess, ttl: float) -> list[dict[str, Any]]:
    start_at = time.time() + 3.0  # every process is up and connected by then
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.cache_worker",
                server.url,
                mode,
                "50",
                repr(start_at),
                repr(ttl),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for mode in ("threads", "asyncio", "threads", "asyncio")
    ]
    reports = []
    for worker in workers:
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        reports.append(json.loads(out))
    return reports


def test_cold_and_just_expired_keys_load_once_across_processes(
    tenure_server: ServerProcess, tenure_client: redis.Redis
) -> None:
    cold = _stampede(tenure_server, ttl=1.5)
    assert int(tenure_client.get("loads") or 0) == 1  # one load for 200 callers
    assert {v for report in cold for v in report["values"]} == {"v1"}
    worst = max(w for report in cold for w in report["waits"])
    assert worst < LOAD_SECONDS + 0.5  # generous: a loaded 2-core machine

    # Stale after its 1.5 s ttl, still kept for herd_timeout.
    wait_server_past(tenure_client, fresh_until(tenure_client, "stampede"), 10, "the ttl")
    expired = _stampede(tenure_server, ttl=30)
    assert {v for report in expired for v in report["values"]} == {"v1"}  # served stale at once
    worst = max(w for report in expired for w in report["waits"])
    assert worst < LOAD_SECONDS / 2  # nobody waited for the refresh
    assert int(tenure_client.get("loads") or 0) == 2  # exactly one refresh
