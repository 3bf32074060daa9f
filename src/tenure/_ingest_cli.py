"""``tenure ingest run`` and ``tenure ingest status``: the ingestion job from the command line.

``run`` freezes the plan, starts ``--workers`` worker processes and draws a
progress line (rows, rows/s, chunks, ETA) until the job is done. Ctrl-C stops
the workers; their chunks' leases run out and the same command resumes
where the job stood (a finished job is a no-op). ``status`` reads a job's
counters without its source.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from multiprocessing.process import BaseProcess
from typing import Any, TextIO

import redis

from tenure._children import die_with_parent, ignore_sigint, sigint_blocked
from tenure._exceptions import ArgumentError
from tenure._ingest_core import IngestKeys, IngestStatus
from tenure._ingest_sources import SqlSource
from tenure._sync._ingest import IngestJob, read_status

__all__ = [
    "ProgressWriter",
    "add_ingest",
    "job_from_settings",
    "progress_line",
    "run_ingest",
    "start_worker",
]

PREFIX = "tenure:ingest:"


def add_ingest(commands: Any, positive_int: Any, positive_float: Any) -> None:
    """The ``ingest`` command and its ``run`` and ``status`` subcommands."""
    ingest = commands.add_parser(
        "ingest",
        help="feed a SQL table into a Redis stream in chunks, every row once",
        description="Chunked, crash-safe ingestion of a SQL table into a Redis stream.",
    )
    actions = ingest.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser(
        "run",
        help="ingest a table (resumable: run it again after Ctrl-C or a crash)",
        description="Ingest TABLE of SOURCE_URL (a SQLAlchemy URL, e.g. sqlite:///data.db) "
        "into a stream with --workers processes.",
    )
    run.add_argument("source_url", metavar="SOURCE_URL", help="SQLAlchemy URL of the database")
    run.add_argument("--table", required=True, help="the table to read")
    run.add_argument("--key", required=True, help="its integer, unique key column")
    run.add_argument("--chunk-size", type=positive_int, default=10_000, help="keys per chunk")
    run.add_argument("--workers", type=positive_int, default=4, help="worker processes (4)")
    run.add_argument("--sink", help="stream:KEY or list:KEY (default: the job's own stream)")
    run.add_argument("--name", help="the job's name (default: the table's)")
    run.add_argument("--lease", type=positive_float, default=30.0, help="claim lease, s (30)")
    run.add_argument("--url", help="Redis URL (default: $REDIS_URL)")
    status = actions.add_parser("status", help="a job's progress")
    status.add_argument("name", metavar="JOB")
    status.add_argument("--url", help="Redis URL (default: $REDIS_URL)")
    status.add_argument("--json", action="store_true", help="print JSON")


def _redis_url(given: str | None) -> str:
    url = given or os.environ.get("REDIS_URL")
    if not url:
        raise ArgumentError("--url", "give --url or set REDIS_URL (the job lives on that server)")
    return url


def _redis(url: str) -> redis.Redis:
    try:
        return redis.Redis.from_url(url)
    except ValueError as exc:
        raise ArgumentError("--url", f"{exc} (got {url!r})") from exc


def job_from_settings(client: redis.Redis, settings: dict[str, Any]) -> IngestJob:
    """The job ``settings`` describe (``run``'s options; see :func:`start_worker`)."""
    try:
        source = SqlSource(settings["source_url"], settings["table"], settings["key"])
    except ArgumentError as exc:
        if exc.argument != "url":
            raise
        raise ArgumentError("SOURCE_URL", str(exc).removeprefix("url: ")) from None
    return IngestJob(
        client,
        settings.get("name") or settings["table"],
        source,
        chunk_size=settings["chunk_size"],
        sink=settings.get("sink"),
        lease=settings["lease"],
        prefix=settings.get("prefix", PREFIX),
    )


def _work(url: str, options: dict[str, Any], parent: int) -> None:
    """One worker process: work the job to its end (Ctrl-C is the parent's to handle).

    It dies with its parent: a killed ``tenure ingest run`` leaves no worker.
    """
    die_with_parent(parent)
    ignore_sigint()
    with redis.Redis.from_url(url) as client:
        job_from_settings(client, options).work()


def start_worker(url: str, settings: dict[str, Any]) -> BaseProcess:
    """Start one worker process of the job ``settings`` describe (``run``'s options).

    ``settings``: ``source_url``, ``table``, ``key``, ``chunk_size``, ``sink``,
    ``name``, ``lease`` and optionally ``prefix``. The worker ignores Ctrl-C; stop it with
    ``terminate()`` (or kill it: the job loses nothing).
    """
    worker = multiprocessing.get_context("spawn").Process(
        target=_work, args=(url, settings, os.getpid()), daemon=True
    )
    with sigint_blocked():
        worker.start()
    return worker


def _figures(status: IngestStatus) -> str:
    return f"{status.rows:,} rows  chunks {status.done}/{status.chunks} ({status.claimed} in work)"


class ProgressWriter:
    """One progress line: redrawn in place on a terminal, else printed every ``every`` s."""

    def __init__(self, stream: TextIO, *, every: float = 5.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every
        self._last = 0.0
        self._drawn = False

    def show(self, line: str) -> None:
        """Draw ``line`` (on a terminal at once; elsewhere when ``every`` s have passed)."""
        if self.tty:
            print(f"\r{line}\033[K", end="", file=self.stream, flush=True)
            self._drawn = True
        elif time.monotonic() - self._last >= self.every:
            print(line, file=self.stream, flush=True)
            self._last = time.monotonic()

    def end(self) -> None:
        """Leave the line drawn in place, so what follows starts on a new one."""
        if self._drawn:
            print(file=self.stream, flush=True)
            self._drawn = False


def _as_json(status: IngestStatus) -> dict[str, Any]:
    extra = {"finished": status.finished, "rate": round(status.rate, 1), "elapsed": status.elapsed}
    return {**dataclasses.asdict(status), **extra}


def _status_text(name: str, status: IngestStatus) -> str:
    lines = [f"{name}: {_figures(status)}"]
    if status.elapsed:
        lines[0] += f"  {status.rate:,.0f} rows/s over {status.elapsed:,.1f} s"
    if status.finished:
        lines[0] += "  finished"
    for holder in status.holders:
        cursor = "nothing committed" if holder.cursor is None else f"cursor {holder.cursor:,}"
        lease = f"lease {holder.lease_left:.1f} s left"
        lines.append(f"  chunk {holder.chunk}: {holder.worker}, {cursor}, {lease}")
    if status.claimed > len(status.holders):
        lines.append(f"  ... and {status.claimed - len(status.holders)} more claims")
    return "\n".join(lines)


def progress_line(
    status: IngestStatus, started: float, rows_before: int, *, width: int = 20
) -> str:
    """A bar of the chunks done, then rows, rows/s since ``started`` and the ETA."""
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = (status.rows - rows_before) / elapsed
    done_share = status.done / status.chunks if status.chunks else 1.0
    eta = elapsed / done_share - elapsed if 0 < done_share < 1 else 0.0
    filled = round(done_share * width)
    bar = "#" * filled + "." * (width - filled)
    return f"[{bar}] {_figures(status)}  {rate:,.0f} rows/s  ETA {eta:,.0f} s"


def run_ingest(options: argparse.Namespace) -> int:
    """Run ``tenure ingest run`` or ``tenure ingest status``."""
    url = _redis_url(options.url)
    client = _redis(url)
    try:
        if options.action == "status":
            status = read_status(
                client, IngestKeys.for_job(PREFIX, options.name), name=options.name
            )
            if status.chunks == 0:
                raise ArgumentError(
                    "JOB", f"no ingestion job named {options.name!r} on this server"
                )
            if options.json:
                print(json.dumps(_as_json(status)))
            else:
                print(_status_text(options.name, status))
            return 0
        return _run(client, url, options)
    finally:
        client.close()


def _run(client: redis.Redis, redis_url: str, options: argparse.Namespace) -> int:
    job = job_from_settings(client, vars(options))
    plan = job.plan()  # checks the source and freezes (or matches) the plan
    before = job.status()
    if before.finished:
        print(f"{job.name}: already done ({before.rows:,} rows in {plan.chunks} chunks)")
        return 0
    settings = {k: getattr(options, k) for k in
                ("source_url", "table", "key", "chunk_size", "sink", "name", "lease")}  # fmt: skip
    started = time.monotonic()
    progress = ProgressWriter(sys.stderr)
    workers: list[BaseProcess] = []
    try:
        workers += [start_worker(redis_url, settings) for _ in range(options.workers)]
        while True:
            status = job.status()
            progress.show(progress_line(status, started, before.rows))
            if status.finished:
                break
            if not any(worker.is_alive() for worker in workers):
                # they ended (an error, a lost server): start them again
                workers = [start_worker(redis_url, settings) for _ in range(options.workers)]
            time.sleep(0.25)
    except KeyboardInterrupt:
        for worker in workers:
            worker.terminate()
        progress.end()
        print(f"{job.name}: stopped; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        for worker in workers:
            worker.join(timeout=10)
    progress.end()
    status = job.status()
    took = time.monotonic() - started
    print(f"{job.name}: done, {status.rows:,} rows in {plan.chunks} chunks, {took:,.1f} s")
    return 0
