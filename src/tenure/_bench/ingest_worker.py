"""One worker process of ``tenure bench ingest``.

    python -m tenure._bench.ingest_worker DESIGN URL DATABASE JOB CHUNK_SIZE PARENT_PID [go|now]

``DESIGN`` is ``tenure`` or ``post`` (:mod:`tenure._bench.ingest_contenders`).
With ``go`` the worker says it is ready (INCR ``bench:ingest:{JOB}:ready``)
and waits for the go signal (BLPOP ``bench:ingest:{JOB}:go``), so process
start-up is not timed; with ``now`` it starts at once. At the end it prints
one JSON line: rows done and its peak resident memory (KiB). It ignores
Ctrl-C and dies with the benchmark.
"""

from __future__ import annotations

import json
import resource
import sys

import redis

from tenure._bench.ingest_contenders import run_post, run_tenure
from tenure._children import die_with_parent, ignore_sigint
from tenure._ingest_sources import SqlSource

__all__ = ["go_keys", "main"]


def go_keys(job: str) -> tuple[str, str]:
    """The ready counter and the go list of ``job``."""
    return f"bench:ingest:{{{job}}}:ready", f"bench:ingest:{{{job}}}:go"


def main(argv: list[str]) -> None:
    """Run one worker as ``argv`` says (see the module docstring)."""
    design, url, database, job, chunk_size, parent, start = argv
    die_with_parent(int(parent))
    ignore_sigint()
    client = redis.Redis.from_url(url)
    source = SqlSource(f"sqlite:///{database}", "events", "id")
    if start == "go":
        ready, go = go_keys(job)
        client.incr(ready)
        client.blpop([go], timeout=120)
    run = run_tenure if design == "tenure" else run_post
    rows = run(client, source, job, int(chunk_size))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": rows, "peak_kib": peak}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
