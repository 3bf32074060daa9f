"""One worker process of ``tenure bench ingest``.

    python -m benchmarks.ingest_worker DESIGN URL DATABASE JOB CHUNK_SIZE PARENT_PID
        [go|now]

``DATABASE`` is an SQLite file or a SQLAlchemy URL. ``DESIGN`` is ``tenure`` or
``post`` (:mod:`benchmarks.ingest_contenders`).
With ``go`` the worker says it is ready (INCR ``bench:ingest:{JOB}:ready``)
and waits for the go signal (BLPOP ``bench:ingest:{JOB}:go``), so process
start-up is not timed; with ``now`` it starts at once, its pid added to
``bench:ingest:{JOB}:started`` first (the fault schedule kills only workers
past their start-up). At the end it prints
one JSON line: rows done and its peak resident memory (KiB). It ignores
Ctrl-C and dies with the benchmark.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import redis

from benchmarks.ingest_contenders import run_post, run_tenure
from tenure import SqlSource
from tenure._tools.children import die_with_parent, ignore_sigint

__all__ = ["go_keys", "main", "peak_rss_kib", "started_key"]


def go_keys(job: str) -> tuple[str, str]:
    """The ready counter and the go list of ``job``."""
    return f"bench:ingest:{{{job}}}:ready", f"bench:ingest:{{{job}}}:go"


def started_key(job: str) -> str:
    """The set of the pids of ``job``'s workers that are past their start-up."""
    return f"bench:ingest:{{{job}}}:started"


def main(argv: list[str]) -> None:
    """Run one worker as ``argv`` says (see the module docstring)."""
    design, url, database, job, chunk_size, parent, start = argv
    die_with_parent(int(parent))
    ignore_sigint()
    client = redis.Redis.from_url(url)
    url_or_path = database if "://" in database else f"sqlite:///{database}"
    source = SqlSource(url_or_path, "events", "id")
    if start == "go":
        ready, go = go_keys(job)
        client.incr(ready)
        client.blpop([go], timeout=120)
    else:
        client.sadd(started_key(job), os.getpid())
    run = run_tenure if design == "tenure" else run_post
    rows = run(client, source, job, int(chunk_size))
    print(json.dumps({"rows": rows, "peak_kib": peak_rss_kib()}), flush=True)


def peak_rss_kib() -> int:
    """The peak resident memory of the calling process, in KiB.

    VmHWM, the high-water mark of its own address space: ``ru_maxrss`` would
    carry the forking parent's over ``exec``.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


if __name__ == "__main__":
    main(sys.argv[1:])
