"""``tenure ingest run``, ``status`` and ``reset``: the ingestion job from the command line.

``run`` freezes the plan, starts ``--workers`` worker processes and draws a
progress line (rows, rows/s, chunks, ETA) until the job is done. Ctrl-C (or
SIGTERM) stops the workers, which give their claims back as they stop, so
the same command resumes at once where the job stood (a finished job is a
no-op). A worker stopped by its source (the database lost mid-read, a row
with no strict JSON form) gives its claim back and tells the command, which
stops the others and says why in one line. ``status`` reads a job's counters
without its source; ``reset`` removes a job (and its sink with ``--sink``) so
it can start over.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.process import BaseProcess
from multiprocessing.queues import SimpleQueue
from types import FrameType
from typing import Any, TextIO

import redis

from tenure import (
    ArgumentError,
    BackendError,
    IngestJob,
    IngestStatus,
    JobBusyError,
    PlanMismatchError,
    SqlSource,
    TenureError,
)
from tenure._tooling import IngestKeys, Plan, check_name, check_seconds, parse_sink, read_status
from tenure._tools.children import (
    Terminated,
    die_with_parent,
    ignore_sigint,
    sigint_blocked,
    spent,
)

__all__ = [
    "ProgressWriter",
    "job_from_settings",
    "progress_line",
    "run_ingest",
    "start_worker",
]

PREFIX = "tenure:ingest:"


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


# The job's arguments, as the command's options name them.
_OPTIONS = {"url": "SOURCE_URL", "lease": "--lease", "chunk_size": "--chunk-size", "sink": "--sink",
            "name": "--name"}  # fmt: skip


def _as_option(exc: ArgumentError) -> ArgumentError:
    """``exc`` naming the command's option for the argument it names (the same if none)."""
    option = _OPTIONS.get(exc.argument)
    if option is None:
        return exc
    return ArgumentError(option, str(exc.message).removeprefix(f"{exc.argument}: "))


def job_from_settings(client: redis.Redis, settings: dict[str, Any]) -> IngestJob:
    """The job ``settings`` describe (``run``'s options; see :func:`start_worker`).

    The lease is checked before the source is reached, as every duration is.
    """
    check_seconds("--lease", settings["lease"], allow_none=False, name=None, positive=True)
    name = settings["table"] if settings.get("name") is None else settings["name"]
    try:
        check_name(name)  # before the source is reached, as the lease is
        source = SqlSource(settings["source_url"], settings["table"], settings["key"])
        return IngestJob(
            client,
            name,
            source,
            chunk_size=settings["chunk_size"],
            sink=settings.get("sink"),
            lease=settings["lease"],
            prefix=settings.get("prefix", PREFIX),
        )
    except ArgumentError as exc:
        named = _as_option(exc)
        if named is exc:
            raise
        raise named from None


def _work(
    url: str, options: dict[str, Any], parent: int, failures: SimpleQueue[Any] | None = None
) -> None:
    """One worker process: work the job to its end (Ctrl-C is the parent's to handle).

    It dies with its parent: a killed ``tenure ingest run`` leaves no worker.
    SIGTERM (the parent's ``terminate()``) interrupts it, and it gives its
    claim back before it exits. A tenure error other than the server's (the
    source lost, a row refused) is put on ``failures`` as ``(exit status,
    line, traceback)`` for the parent to say once, and the worker exits with
    :data:`FAILED_EXIT`; without ``failures`` it is raised.
    """
    die_with_parent(parent)
    ignore_sigint()

    interrupted: list[bool] = []

    def interrupt(_signal: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, spent)  # once: the give-back must not be cut
        interrupted.append(True)
        # The interrupt can land inside SQLAlchemy's pool clean-up (a connection's
        # reset as it is collected), which logs it with a traceback: after the
        # stop was asked for that is no news, and the command prints one line.
        logging.getLogger("sqlalchemy").addHandler(logging.NullHandler())
        logging.getLogger("sqlalchemy").propagate = False
        if _giving_back(frame):
            # Already stopping (a row or the source failed, and its claim is on its way
            # back): cut now, the give-back would leave the chunk claimed for its lease.
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    reset = failed = False
    try:
        try:
            with redis.Redis.from_url(url) as client:
                job_from_settings(client, options).work()
        except PlanMismatchError:  # the job was reset under it: the parent says so, in one line
            reset = True
        except TenureError as exc:
            # The source lost or a row refused (its claim given back): the parent stops
            # the run and says so in one line. The server's own errors (BackendError)
            # end the worker as before, and the parent starts it again.
            if isinstance(exc, BackendError) or failures is None or interrupted:
                raise
            from tenure._tools.cli import _failure

            signal.signal(signal.SIGTERM, spent)  # the message is not cut
            code, why = _failure(exc)
            failures.put((code, why, traceback.format_exc()))
            failed = True
    except KeyboardInterrupt:
        pass
    except Exception:
        # Interrupted inside a library's own clean-up (a SQL driver closing its
        # connection), which turned the interrupt into an error of its own: the
        # stop the parent asked for, not a failure to print.
        if not interrupted:
            raise
    finally:
        # Done: a terminate() that comes now (the parent stopping every worker) has
        # nothing to cut, and must not interrupt this process's exit with a traceback.
        signal.signal(signal.SIGTERM, spent)
    if reset:
        sys.exit(RESET_EXIT)
    if failed:
        sys.exit(FAILED_EXIT)


def _giving_back(frame: FrameType | None) -> bool:
    """Whether ``frame`` (where a signal landed) is inside :meth:`IngestJob._give_back`.

    A worker gives its claim back as an error ends its work; the error goes
    on once the claim is back, so the worker is already stopping.
    """
    code = IngestJob._give_back.__code__
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def start_worker(
    url: str, settings: dict[str, Any], failures: SimpleQueue[Any] | None = None
) -> BaseProcess:
    """Start one worker process of the job ``settings`` describe (``run``'s options).

    ``settings``: ``source_url``, ``table``, ``key``, ``chunk_size``, ``sink``,
    ``name``, ``lease`` and optionally ``prefix``. The worker ignores Ctrl-C; stop it with
    ``terminate()`` (it gives its claim back first), or kill it: the job loses nothing, but
    the worker's chunk waits for its lease to run out. ``failures`` (a spawn context's
    ``SimpleQueue``) receives what stopped it, if its source or a row did (see :func:`_work`).
    """
    worker = multiprocessing.get_context("spawn").Process(
        target=_work, args=(url, settings, os.getpid(), failures), daemon=True
    )
    with sigint_blocked():
        worker.start()
    return worker


def _start(workers: list[BaseProcess], count: int, start: Any) -> None:
    """Start ``count`` workers into ``workers``; a stop meanwhile waits until each is listed."""
    for _ in range(count):
        with sigint_blocked():
            workers.append(start())


def _figures(status: IngestStatus) -> str:
    return f"{status.rows:,} rows  chunks {status.done}/{status.chunks} ({status.claimed} in work)"


class ProgressWriter:
    """One progress line: redrawn in place on a terminal, else printed every ``every`` s.

    Off a terminal the first line comes ``every`` s after the start: a run that
    ends (or fails) sooner prints only its outcome, one line.
    """

    def __init__(self, stream: TextIO, *, every: float = 5.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every = every
        self._last = time.monotonic()
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

    def note(self, line: str) -> None:
        """Print ``line`` on its own, under the progress line (drawn again after it)."""
        self.end()
        print(line, file=self.stream, flush=True)


def _replace_dead(
    workers: list[BaseProcess], status: IngestStatus, start: Any, note: Any, name: str
) -> None:
    """Start a worker in the place of each that died, saying so and what its chunk waits.

    A killed worker cannot give its chunk back: the chunk is taken over when
    its lease runs out, and the line says which and how long.
    """
    host = socket.gethostname()
    for index, worker in enumerate(workers):
        code = worker.exitcode
        if code is None or code == 0:
            continue
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        held = [h for h in status.holders if h.worker == f"{host}:{worker.pid}"]
        waits = "; ".join(
            f"its chunk {h.chunk} is taken over when its lease runs out, in {h.lease_left:,.1f} s"
            for h in held
        )
        note(
            f"{name}: worker {worker.pid} died ({how}); {waits or 'it held no chunk'}; "
            "a new worker takes its place"
        )
        with sigint_blocked():  # a stop waits until the new worker is listed, to be stopped
            workers[index] = start()


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
    filled = round(done_share * width)
    bar = "#" * filled + "." * (width - filled)
    if 0 < done_share < 1 and status.rows > rows_before:
        eta = f"{elapsed / done_share - elapsed:,.0f} s"
    else:  # nothing done by this run yet: no basis for a figure
        eta = "0 s" if status.finished else "-"
    return f"[{bar}] {_figures(status)}  {rate:,.0f} rows/s  ETA {eta}"


def _chunks(count: int) -> str:
    """``1 chunk``, ``12,000 chunks``."""
    return "1 chunk" if count == 1 else f"{count:,} chunks"


def run_ingest(options: argparse.Namespace) -> int:
    """Run ``tenure ingest run``, ``status`` or ``reset``."""
    url = _redis_url(options.url)
    client = _redis(url)
    try:
        if options.action == "status":
            status = _existing(client, options.name)
            if options.json:
                print(json.dumps(_as_json(status)))
            else:
                print(_status_text(options.name, status))
            return 0
        if options.action == "reset":
            return _reset(client, options)
        return _run(client, url, options)
    finally:
        client.close()


def _existing(client: redis.Redis, name: str) -> IngestStatus:
    status = read_status(client, IngestKeys.for_job(PREFIX, name), name=name)
    if status.chunks == 0:
        raise ArgumentError("JOB", f"no ingestion job named {name!r} on this server")
    return status


def _reset(client: redis.Redis, options: argparse.Namespace) -> int:
    name = options.name
    status = _existing(client, name)
    keys = IngestKeys.for_job(PREFIX, name)
    stored: Any = client.hget(keys.plan, "sink")
    sink = stored.decode() if stored else None  # older plans kept no sink: the default
    kind, sink_key = parse_sink(sink, keys.default_sink(), name)
    what = f"job {name!r} ({status.chunks:,} chunks, {status.done:,} done, {status.rows:,} rows)"
    size = client.xlen(sink_key) if kind == "stream" else client.llen(sink_key)
    if options.sink:
        what += f" and its sink {kind}:{sink_key} ({size:,} entries)"
    kept = (
        f"; its sink {kind}:{sink_key} ({size:,} entries) is kept, and a rerun writes every "
        "row to it again (add --sink to delete it too)"
        if size and not options.sink
        else ""
    )
    if not options.yes:
        raise ArgumentError("--yes", f"this would delete {what}{kept}; add --yes to do it")
    source: Any = None  # reset needs no source
    job = IngestJob(client, name, source, sink=f"{kind}:{sink_key}", prefix=PREFIX)
    try:
        report = job.reset(sink=options.sink, force=options.force)
    except JobBusyError as exc:
        raise JobBusyError(
            f"job {name!r} has {exc.claimed} chunk(s) in work: stop its `tenure ingest run` "
            "(its workers give their claims back), wait for a killed one's lease to run out, "
            "or add --force",
            claimed=exc.claimed,
        ) from None
    dropped = f"; {report.released} running claim(s) dropped" if report.released else ""
    print(f"deleted {what}{dropped}{kept}")
    return 0


def _few_chunks(plan: Plan, left: int, workers: int) -> str | None:
    """The line saying that some workers will have no work, or None."""
    if left >= workers:
        return None
    if left < plan.chunks:
        return f"only {left} chunk(s) left: only {left} of {workers} workers will have work"
    keys = plan.high - plan.low + 1
    suggested = -(-keys // workers)
    chunks = _chunks(plan.chunks)
    said = f"keys {plan.low:,}..{plan.high:,} make {chunks} of {plan.chunk_size:,}: only "
    said += f"{plan.chunks} of {workers} workers will have work"
    if suggested < MIN_USEFUL_CHUNK:  # chunks that small cost more than the workers win
        useful = max(1, -(-keys // MIN_USEFUL_CHUNK))
        return f"{said}; fewer workers would do (--workers {useful}, or fewer than {workers})"
    return (
        f"{said}; use --chunk-size {suggested} (with another --name, or after tenure ingest reset)"
    )


MIN_USEFUL_CHUNK = 1_000
"""The smallest chunk worth suggesting: below it, a chunk's claim and commit outweigh its rows."""

RESET_EXIT = 3
"""A worker's exit status when the job was reset (or planned anew) while it worked."""

FAILED_EXIT = 4
"""A worker's exit status when its source or a row stopped it (said on its failures queue)."""


def _reset_under_us(status: IngestStatus, workers: list[BaseProcess]) -> bool:
    """Whether the job was reset while this run worked: its plan gone, or a worker told so."""
    return status.chunks == 0 or any(worker.exitcode == RESET_EXIT for worker in workers)


def _run(client: redis.Redis, redis_url: str, options: argparse.Namespace) -> int:
    job = job_from_settings(client, vars(options))
    try:
        plan = job.plan()  # checks the source and freezes (or matches) the plan
    except PlanMismatchError as exc:
        planned = str(exc.message).partition(": use another job name")[0]
        raise PlanMismatchError(
            f"{planned}: use another --name, or start it over with "
            f"tenure ingest reset {job.name} --yes (add --sink to drop the rows it wrote)"
        ) from None
    before = job.status()
    if before.finished:
        print(f"{job.name}: already done ({before.rows:,} rows in {_chunks(plan.chunks)})")
        return 0
    left = before.chunks - before.done
    if few := _few_chunks(plan, left, options.workers):
        print(f"{job.name}: {few}", file=sys.stderr)
    if before.claimed:
        longest = max((holder.lease_left for holder in before.holders), default=0.0)
        print(
            f"{job.name}: {before.claimed} chunk(s) are claimed by other workers (still "
            f"running, or killed): they wait up to {longest:,.1f} s for their lease to run out",
            file=sys.stderr,
        )
    settings = {k: getattr(options, k) for k in
                ("source_url", "table", "key", "chunk_size", "sink", "name", "lease")}  # fmt: skip
    started = time.monotonic()
    progress = ProgressWriter(sys.stderr)
    workers: list[BaseProcess] = []
    count = min(options.workers, left)
    failures: SimpleQueue[Any] = multiprocessing.get_context("spawn").SimpleQueue()

    try:  # (Ctrl-C and SIGTERM: stop_on_signals, set by the command)
        _start(workers, count, lambda: start_worker(redis_url, settings, failures))
        while True:
            status = job.status()
            progress.show(progress_line(status, started, before.rows))
            if status.finished:
                break
            alive = any(worker.is_alive() for worker in workers)  # before the queue is read
            dead = any(worker.exitcode not in (None, 0) for worker in workers)
            if not failures.empty():
                return _failed(
                    job, workers, progress, failures.get(), debug=getattr(options, "debug", False)
                )
            if _reset_under_us(status, workers):
                # never plan it again from here: the rows written so far stay in the sink
                for worker in workers:
                    worker.terminate()
                progress.end()
                raise PlanMismatchError(
                    "the job was reset while this run worked (tenure ingest reset --force): "
                    "stopped, and not planned anew",
                    name=job.name,
                )
            if not alive:
                # they ended (a lost server): start them again
                workers.clear()
                _start(workers, count, lambda: start_worker(redis_url, settings, failures))
            elif dead:  # killed (kill -9, the OOM killer) or crashed: one line, a new one
                _replace_dead(
                    workers, status, lambda: start_worker(redis_url, settings, failures),
                    progress.note, job.name,
                )  # fmt: skip
            time.sleep(0.25)
    except KeyboardInterrupt as exc:
        for worker in workers:
            worker.terminate()  # each gives its claim back, then exits
        for worker in workers:
            worker.join(timeout=10)
        progress.end()
        print(f"{job.name}: {_stopped_at(job.status())}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    finally:
        for worker in workers:
            worker.join(timeout=10)
    progress.end()
    status = job.status()
    took = time.monotonic() - started
    print(f"{job.name}: done, {status.rows:,} rows in {_chunks(plan.chunks)}, {took:,.1f} s")
    return 0


def _stopped_at(status: IngestStatus) -> str:
    """Where a stopped run leaves its job, for its last line."""
    if status.finished:
        return f"stopped as it finished: done, {status.rows:,} rows"
    held = f"; {status.claimed} chunk(s) still claimed" if status.claimed else ""
    return f"stopped at {status.rows:,} rows{held}; run the same command again to resume"


def _failed(
    job: IngestJob,
    workers: list[BaseProcess],
    progress: ProgressWriter,
    failure: tuple[int, str, str],
    *,
    debug: bool,
) -> int:
    """A worker's source or row stopped the run: stop the others, say why in one line.

    The failed worker gave its claim back, and the others give theirs as they
    stop, so the same command resumes where the job stood (once the database
    is back, or the row mended). ``--debug`` prints the worker's traceback first.
    """
    code, why, trace = failure
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join(timeout=10)
    progress.end()
    status = job.status()
    held = f", {status.claimed} chunk(s) still claimed" if status.claimed else ""
    if debug:
        print(trace, end="", file=sys.stderr)
    print(
        f"tenure: ingest: {why} ({status.rows:,} rows ingested{held}; run the same "
        "command again to resume)",
        file=sys.stderr,
    )
    return code
