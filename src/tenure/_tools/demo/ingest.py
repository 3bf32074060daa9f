"""``tenure demo ingest``: a million rows into a stream while workers are killed.

Builds an SQLite table of ``rows`` events in a temporary folder and ingests it
into a Redis stream with ``workers`` worker processes (the ones ``tenure
ingest run`` starts) while, every 0.1 to 0.4 s, one of them that has been
working is killed with kill -9 and a fresh one takes its place. Then it
audits the stream: every row of the table exactly once, with its content.
The job's keys are under ``tenure:demo:ingest:`` and deleted at the end, so
the demo can run on a server of yours.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TextIO

import redis

from tenure import ArgumentError, IngestJob, IngestStatus, TenureError
from tenure._tools.ingest_cli import ProgressWriter, job_from_settings, progress_line, start_worker

__all__ = [
    "IngestDemoResult",
    "as_json",
    "audit_stream",
    "build_table",
    "check_arguments",
    "run_ingest_demo",
    "stream_entries",
]

PREFIX = "tenure:demo:ingest:"
CHUNK_SIZE = 10_000
LEASE = 1.0  # seconds: a killed worker's chunk is taken over this soon
KILL_EVERY = (0.1, 0.4)  # seconds between kills, drawn at random
TIME_LIMIT = 600.0


@dataclass(frozen=True)
class IngestDemoResult:
    """What one ingestion demo did and what the audit of its stream found."""

    rows: int  # rows in the table
    workers: int
    seconds: float  # from the workers' start to the job's end
    kills: int  # workers killed with kill -9
    takeovers: int  # chunks claimed again after their holder's lease ran out
    entries: int  # entries in the stream
    lost: int  # rows of the table missing from the stream
    duplicated: int  # entries beyond one per row
    mismatched: int  # entries whose content is not their row's

    @property
    def ok(self) -> bool:
        """Every row exactly once, each with its own content."""
        return self.entries == self.rows and not (self.lost or self.duplicated or self.mismatched)


def build_table(path: Path, rows: int) -> None:
    """An SQLite table ``events(id, name, amount)`` with ids 1..rows."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT, amount REAL)")
        step = 50_000
        for first in range(1, rows + 1, step):
            db.executemany(
                "INSERT INTO events VALUES (?, ?, ?)",
                ((i, f"event {i}", i / 4) for i in range(first, min(first + step, rows + 1))),
            )


def stream_entries(client: redis.Redis, stream: str, page: int = 10_000) -> Iterator[Any]:
    """Every entry of ``stream`` in order, ``(id, fields)``, read ``page`` at a time."""
    start = "-"
    while True:
        entries: Any = client.xrange(stream, min=start, count=page)
        yield from entries
        if len(entries) < page:
            return
        start = "(" + entries[-1][0].decode()


def audit_stream(client: redis.Redis, stream: str, rows: int) -> tuple[int, int, int, int]:
    """Read the whole stream: (entries, rows lost, entries duplicated, entries mismatched).

    Row ``i`` must appear once, as ``key=i`` with the row ``build_table`` made.
    """
    seen = bytearray(rows + 1)  # times each id was seen, capped at 255
    entries = mismatched = 0
    for _, fields in stream_entries(client, stream):
        entries += 1
        key = int(fields[b"key"])
        row = json.loads(fields[b"row"])
        expected = {"id": key, "name": f"event {key}", "amount": key / 4}
        if row != expected or not 1 <= key <= rows:
            mismatched += 1
        elif seen[key] < 255:
            seen[key] += 1
    lost = seen.count(0) - 1  # index 0 is no row
    duplicated = sum(count - 1 for count in seen if count > 1)
    return entries, lost, duplicated, mismatched


def check_arguments(rows: int, workers: int) -> None:
    """Refuse a table size or a worker count the demo cannot run (:class:`ArgumentError`)."""
    if not 1_000 <= rows <= 10_000_000:
        raise ArgumentError("--table-rows", f"must be 1,000..10,000,000, got {rows:,}")
    if not 1 <= workers <= 32:
        raise ArgumentError("--workers", f"must be 1..32, got {workers}")


def run_ingest_demo(
    url: str,
    *,
    rows: int = 1_000_000,
    workers: int = 4,
    kills: bool = True,
    seed: int | None = None,
    out: TextIO | None = None,
) -> IngestDemoResult:
    """Ingest a generated table with ``workers`` processes, killing them at random; audit.

    ``url`` is the Redis server; progress goes to standard error, the summary
    to ``out`` (standard output).
    """
    check_arguments(rows, workers)
    stream = out or sys.stdout
    folder = Path(tempfile.mkdtemp(prefix="tenure-demo-ingest-"))
    client = redis.Redis.from_url(url)
    name = f"events-{uuid.uuid4().hex[:8]}"
    job: IngestJob | None = None
    try:
        took = time.monotonic()
        build_table(folder / "events.sqlite", rows)
        intro = (
            f"built an SQLite table of {rows:,} rows in {time.monotonic() - took:.1f} s; "
            f"ingesting it with {workers} worker processes"
            + (
                ", killing one with kill -9 every 0.1-0.4 s (once a chunk finished since the "
                "last kill)..."
                if kills
                else "..."
            )
        )
        print(_wrap(intro), file=stream, flush=True)
        settings = {
            "source_url": f"sqlite:///{folder / 'events.sqlite'}",
            "table": "events",
            "key": "id",
            "chunk_size": CHUNK_SIZE,
            "sink": None,
            "name": name,
            "lease": LEASE,
            "prefix": PREFIX,
        }
        job = job_from_settings(client, settings)  # the job its workers run
        job.plan()
        started = time.monotonic()
        killed = _ingest_while_killing(job, url, settings, workers, kills, seed)
        seconds = time.monotonic() - started
        status = job.status()
        entries, lost, duplicated, mismatched = audit_stream(client, job.keys.default_sink(), rows)
        result = IngestDemoResult(
            rows=rows,
            workers=workers,
            seconds=round(seconds, 2),
            kills=killed,
            takeovers=status.claims - status.chunks,
            entries=entries,
            lost=lost,
            duplicated=duplicated,
            mismatched=mismatched,
        )
        print(_summary(result), file=stream, flush=True)
        return result
    finally:
        if job is not None:
            job.reset(sink=True, force=True)  # every key of the job, and its stream
            client.delete(job.keys.reset)  # the reset's resend marker: nothing is left
        client.close()
        shutil.rmtree(folder, ignore_errors=True)


def _ingest_while_killing(
    job: IngestJob,
    url: str,
    settings: dict[str, Any],
    count: int,
    kills: bool,
    seed: int | None,
) -> int:
    """Run ``count`` workers to the job's end, killing one now and then; the kills made."""
    rng = random.Random(seed)
    progress = ProgressWriter(sys.stderr, every=2.0)
    started = time.monotonic()
    workers: list[tuple[BaseProcess, float]] = []
    killed = failures = 0
    done_at_kill = 0  # chunks done at the last kill: the next waits for one more
    next_kill = started + rng.uniform(*KILL_EVERY)
    try:
        workers += [(start_worker(url, settings), time.monotonic()) for _ in range(count)]
        while True:
            status = job.status()
            progress.show(f"{progress_line(status, started, 0)}  kills {killed}")
            if status.finished:
                break
            now = time.monotonic()
            if now - started > TIME_LIMIT:
                raise TenureError(f"the ingestion did not finish in {TIME_LIMIT:.0f} s")
            # A kill waits for a chunk to finish after the last one: on a busy machine,
            # where a chunk takes longer than the kill interval, the job still moves.
            if kills and now >= next_kill and status.done > done_at_kill:
                # Only a worker holding a chunk is killed: one still starting (a slow
                # machine can take seconds to start Python) would make no progress.
                holding = _holding(status)
                working = [i for i, (w, _) in enumerate(workers) if w.pid in holding]
                if working:
                    victim = rng.choice(working)
                    process = workers[victim][0]
                    if process.pid is not None and process.is_alive():
                        os.kill(process.pid, signal.SIGKILL)
                        process.join()
                        killed += 1
                        done_at_kill = status.done
                    workers[victim] = (start_worker(url, settings), time.monotonic())
                next_kill = now + rng.uniform(*KILL_EVERY)
            for index, (process, _) in enumerate(workers):
                if process.exitcode not in (None, 0):  # it failed by itself: start another
                    failures += 1
                    if failures > 3 * count:
                        raise TenureError(
                            f"worker processes keep failing (exit {process.exitcode})"
                        )
                    workers[index] = (start_worker(url, settings), time.monotonic())
            time.sleep(0.05)
    finally:
        progress.end()
        for process, _ in workers:
            if process.is_alive():
                process.terminate()
            process.join(timeout=10)
    return killed


def _holding(status: IngestStatus) -> set[int]:
    """The process ids of the workers holding a chunk (their names are host:pid)."""
    pids = (holder.worker.rpartition(":")[2] for holder in status.holders)
    return {int(pid) for pid in pids if pid.isdigit()}


def _summary(result: IngestDemoResult) -> str:
    verdict = (
        "every row exactly once"
        if result.ok
        else f"WRONG: {result.lost:,} lost, {result.duplicated:,} duplicated, "
        f"{result.mismatched:,} mismatched"
    )
    rate = result.rows / result.seconds if result.seconds else 0.0
    lines = [
        f"ingested {result.rows:,} rows in {result.seconds:.1f} s ({rate:,.0f} rows/s) with "
        f"{result.workers} workers; {result.kills} killed with kill -9, {result.takeovers} "
        "chunks taken over after a lease ran out.",
        f"audit: {result.entries:,} entries in the stream, {verdict} "
        f"({result.lost} lost, {result.duplicated} duplicated).",
    ]
    return "\n".join(_wrap(line, indent="  ") for line in lines)


def _wrap(text: str, indent: str = "") -> str:
    """``text`` in lines of 88 columns, never breaking "kill -9"."""
    glued = text.replace("kill -9", "kill\0-9")
    return textwrap.fill(glued, 88, subsequent_indent=indent).replace("\0", " ")


def as_json(result: IngestDemoResult) -> dict[str, Any]:
    """The result as a JSON-ready dict, ``ok`` included."""
    return {**asdict(result), "ok": result.ok}
