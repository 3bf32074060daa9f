"""``tenure bench ingest``: tenure's IngestJob beside the post's CLIENT SETNAME design.

    tenure bench ingest [--rows 200000] [--rounds 3] [--workers 1,2,4]
        [--fault-rows 500000] [--memory-rows 100000,1000000] [--seed 7]
        [--postgresql URL] [--url URL] [--output FILE.md]

One run, one server, SQLite tables of ``events(id, name, amount)`` built in
a temporary folder:

* **Ceiling.** One process reads the table with a ``sqlite3`` cursor, encodes
  each row as compact JSON (as the job does) and XADDs them in pipelines of
  500, no coordination: rows/s, reading included.
* **Speed.** tenure's :class:`~tenure.IngestJob` and the post's design
  (:mod:`benchmarks.ingest_contenders`) with 1, 2 and 4 worker processes
  over ``--rows`` rows, chunks of 10,000: rows/s from the go signal (every
  worker started and connected) to the job's end, SQL reads and claims
  included. Medians of ``--rounds`` rounds.
* **Faults.** Each design over ``--fault-rows`` rows with 4 workers, one
  killed with kill -9 every 0.05-0.3 s (the same seeded schedule; only
  workers past their start-up) and replaced, until the job is done or
  :func:`kill_budget` kills were made (a design that restarts its work
  could otherwise be killed for ever on a busy machine); then the sink is
  audited: rows lost and rows duplicated.
* **PostgreSQL** (``--postgresql URL``): the table copied there, one tenure
  worker beside the same ceiling with a psycopg cursor.
* **Memory.** Peak resident memory of one tenure worker ingesting tables of
  ``--memory-rows`` rows: flat in the table's size, or not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from benchmarks import (
    ROOT,
    BenchmarkError,
    add_output_arguments,
    check_empty,
    progress,
    run_timed,
    server_cpu_us,
    several,
)
from benchmarks.ingest_contenders import (
    BATCH,
    ceiling,
    copy_to_postgresql,
    estimated_seconds,
    pg_ceiling,
    post_keys,
)
from benchmarks.ingest_worker import go_keys, started_key
from benchmarks.sections import write_section
from tenure._tooling import IngestKeys, read_status
from tenure._tools.demo.ingest import build_table, stream_entries
from tenure.server._process import given_or_private

__all__ = ["add_arguments", "estimated_seconds", "run_command"]

CHUNK = 10_000
DESIGNS = {"tenure": "tenure IngestJob", "post": "the post (CLIENT SETNAME)"}
KILL_EVERY = (0.05, 0.3)


def kill_budget(rows: int) -> int:
    """The most kills of one design's fault run: one per 5,000 rows, at least 20."""
    return max(20, rows // 5_000)


TIME_LIMIT = 300.0
NOTE_EVERY = 15.0  # seconds between two lines of progress of a long run


@dataclass
class FaultResult:
    """One design under the kill schedule, audited."""

    kills: int
    seconds: float
    rows: int  # entries in the sink
    lost: int
    duplicated: int
    stragglers: int  # workers still running long after the job's end, killed by the bench


def _worker(
    design: str, url: str, database: Path | str, job: str, start: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.ingest_worker", design, url, str(database), job,
         str(CHUNK), str(os.getpid()), start],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,  # where python -m finds the benchmarks package
    )  # fmt: skip


def _finished(client: redis.Redis, design: str, job: str) -> bool:
    if design == "tenure":
        return read_status(client, IngestKeys.for_job("tenure:ingest:", job), name=job).finished
    return bool(client.exists(post_keys(job)["complete"]))


def _sink(design: str, job: str) -> str:
    if design == "tenure":
        return IngestKeys.for_job("tenure:ingest:", job).default_sink()
    return post_keys(job)["rows"]


def _audit(client: redis.Redis, design: str, job: str, rows: int) -> tuple[int, int, int]:
    """Entries in the sink, rows lost, entries duplicated (ids are 1..rows)."""
    seen: Counter[int] = Counter()
    sink = _sink(design, job)
    if design == "tenure":
        seen.update(int(fields[b"key"]) for _, fields in stream_entries(client, sink, 50_000))
    else:
        for first in range(0, int(client.llen(sink)), 50_000):
            values: Any = client.lrange(sink, first, first + 49_999)
            seen.update(json.loads(value)["id"] for value in values)
    entries = sum(seen.values())
    lost = sum(1 for key in range(1, rows + 1) if key not in seen)
    return entries, lost, entries - len(seen)


def speed(
    client: redis.Redis, url: str, design: str, database: Path | str, rows: int, count: int
) -> float:
    """Rows/s of ``count`` workers of ``design``, from the go signal to the job's end."""
    client.flushdb()
    job = f"speed-{uuid.uuid4().hex[:8]}"
    workers = [_worker(design, url, database, job, "go") for _ in range(count)]
    ready, go = go_keys(job)
    try:
        deadline = time.monotonic() + 60
        while int(client.get(ready) or 0) < count:
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise BenchmarkError(f"{design} workers did not start")
            time.sleep(0.01)
        started = time.perf_counter()
        client.rpush(go, *range(count))
        while not _finished(client, design, job):
            if time.perf_counter() - started > TIME_LIMIT:
                raise BenchmarkError(f"{design} did not finish {rows:,} rows in {TIME_LIMIT:.0f} s")
            time.sleep(0.01)
        took = time.perf_counter() - started
        for worker in workers:
            worker.communicate(timeout=60)
    finally:
        _stop(workers)
    entries, lost, _ = _audit(client, design, job, rows)
    if design == "tenure" and (entries != rows or lost):
        raise BenchmarkError(f"tenure's sink holds {entries:,} entries for {rows:,} rows")
    return rows / took


def faults(
    client: redis.Redis, url: str, design: str, database: Path, rows: int, seed: int
) -> FaultResult:
    """``design`` with 4 workers under the seeded kill schedule, then the sink audited."""
    client.flushdb()
    job = f"faults-{uuid.uuid4().hex[:8]}"
    rng = random.Random(seed)
    started = time.monotonic()
    workers = [(_worker(design, url, database, job, "now"), started) for _ in range(4)]
    kills = stragglers = 0
    budget = kill_budget(rows)
    note = started + NOTE_EVERY
    try:
        while not _finished(client, design, job):
            if time.monotonic() - started > TIME_LIMIT:
                raise BenchmarkError(f"{design} did not finish under faults in {TIME_LIMIT:.0f} s")
            if time.monotonic() >= note:
                progress(f"faults {design}: {note - started:.0f} s, {kills} kills so far")
                note += NOTE_EVERY
            time.sleep(rng.uniform(*KILL_EVERY))
            # only workers past their start-up (importing SQLAlchemy alone takes about a
            # second here, longer than the schedule leaves): else nothing gets done
            members: Any = client.smembers(started_key(job))
            past_start = {int(pid) for pid in members}
            working = [i for i, (w, _) in enumerate(workers) if w.pid in past_start]
            if not working or kills >= budget or _finished(client, design, job):
                continue
            victim = rng.choice(working)
            process = workers[victim][0]
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()
                kills += 1
            workers[victim] = (_worker(design, url, database, job, "now"), time.monotonic())
        took = time.monotonic() - started
        for process, _ in workers:  # what the last workers still do counts too
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                stragglers += 1
    finally:
        _stop([process for process, _ in workers])
    entries, lost, duplicated = _audit(client, design, job, rows)
    return FaultResult(kills, took, entries, lost, duplicated, stragglers)


def peak_memory(url: str, database: Path) -> int:
    """Peak RSS in KiB of one tenure worker ingesting the whole table."""
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    worker = _worker("tenure", url, database, f"memory-{uuid.uuid4().hex[:8]}", "now")
    out, _ = worker.communicate(timeout=TIME_LIMIT)
    if worker.returncode != 0:
        raise BenchmarkError(f"the memory worker failed (exit {worker.returncode})")
    return int(json.loads(out.strip().splitlines()[-1])["peak_kib"])


def _stop(workers: Sequence[subprocess.Popen[str]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
        worker.communicate()


def _ints(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the speed runs")
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds; medians (3)")
    parser.add_argument("--workers", type=_ints, default=[1, 2, 4], help="worker counts (1,2,4)")
    parser.add_argument("--fault-rows", type=int, default=500_000, help="rows under kill -9")
    parser.add_argument("--memory-rows", type=_ints, default=[100_000, 1_000_000],
                        help="tables of the memory runs (100000,1000000)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=7, help="seed of the kill schedule (7)")
    parser.add_argument(
        "--postgresql",
        metavar="URL",
        help="also measure one worker on this PostgreSQL database (SQLAlchemy URL, "
        "postgresql+psycopg://...; its table events is replaced) beside a psycopg cursor",
    )
    add_output_arguments(parser, output, "(unused)")


def _check(args: argparse.Namespace) -> None:
    if not (
        1_000 <= args.rows <= 10_000_000
        and 1 <= args.rounds <= 20
        and max(args.workers) <= 16
        and 1_000 <= args.fault_rows <= 10_000_000
        and max(args.memory_rows) <= 10_000_000
    ):
        raise BenchmarkError(
            "--rows and --fault-rows 1,000..10,000,000, --rounds 1..20, --workers up to 16, "
            "--memory-rows up to 10,000,000"
        )


@dataclass
class Report:
    """Every figure of one run."""

    ceiling: float
    speeds: dict[tuple[str, int], float]  # (design, workers) -> median rows/s
    pg: tuple[float, float] | None  # (ceiling, one tenure worker) rows/s on PostgreSQL
    server_us: dict[str, float]  # "ceiling", "tenure-1", "pg-ceiling"... -> server µs per row
    faults: dict[str, FaultResult]
    memory: dict[int, int]  # rows -> peak KiB
    args: argparse.Namespace
    server: str
    command: str


def _targets(report: Report) -> list[tuple[str, str, bool]]:
    one = report.speeds.get(("tenure", 1))
    tenure = report.faults["tenure"]
    sizes = sorted(report.memory)
    found = []
    if one is not None:
        ratio = one / report.ceiling
        found.append(("one worker >= 1.0x the ceiling", f"{ratio:.2f}x", ratio >= 1.0))
    four = report.speeds.get(("tenure", 4))
    if four is not None:
        ratio = four / report.ceiling
        found.append(("4 workers >= 1.5x the ceiling", f"{ratio:.2f}x", ratio >= 1.5))
    if report.pg is not None:
        ratio = report.pg[1] / report.pg[0]
        found.append((
            "PostgreSQL: one worker >= 0.9x its ceiling", f"{ratio:.2f}x", ratio >= 0.9,
        ))  # fmt: skip
    found.append((
        "0 lost and 0 duplicated under kill -9",
        f"{tenure.lost} lost, {tenure.duplicated} duplicated, {tenure.kills} kills",
        tenure.lost == 0 and tenure.duplicated == 0 and tenure.kills >= 1,
    ))  # fmt: skip
    if len(sizes) > 1:
        growth = report.memory[sizes[-1]] / report.memory[sizes[0]]
        found.append((
            f"peak RSS flat from {sizes[0]:,} to {sizes[-1]:,} rows (<= 1.2x)",
            f"{growth:.2f}x", growth <= 1.2,
        ))  # fmt: skip
    return found


def render(report: Report) -> str:
    """The Markdown section of docs/benchmarks.md."""
    args = report.args
    lines = [
        "# Ingestion benchmark: tenure's IngestJob vs the post's CLIENT SETNAME design",
        "",
        f"`{report.command}` on {report.server}; Python {platform.python_version()}, "
        f"{os.cpu_count()} cores, {datetime.date.today().isoformat()}. SQLite tables of "
        f"`events(id, name, amount)`, chunks of {CHUNK:,} keys, worker processes started "
        "before the clock (a go signal); every figure is measured in this run. "
        "The designs are described in `benchmarks/ingest_contenders.py`.",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        *(f"| {goal} | {measured} | {'met' if met else '**not met**'} |"
          for goal, measured, met in _targets(report)),
        "",
        f"## Speed: {args.rows:,} rows, medians of {args.rounds} rounds",
        "",
        "| design | workers | rows/s | / ceiling | client µs per row | server CPU µs per row |",
        "|---|---:|---:|---:|---:|---:|",
        f"| one process: a `sqlite3` cursor, each row `json` encoded, XADD pipelines of "
        f"{BATCH} (the ceiling) | 1 | {report.ceiling:,.0f} | 1.00 | "
        f"{1e6 / report.ceiling:.2f} | {report.server_us['ceiling']:.2f} |",
    ]  # fmt: skip
    for (design, count), rate in report.speeds.items():
        lines.append(
            f"| {DESIGNS[design]} | {count} | {rate:,.0f} | {rate / report.ceiling:.2f} | "
            f"{1e6 * count / rate:.2f} | {report.server_us[f'{design}-{count}']:.2f} |"
        )
    if report.pg is not None:
        pg_ceiling_rate, pg_tenure = report.pg
        lines += [
            "",
            f"On PostgreSQL (`--postgresql`), the same {args.rows:,} rows, medians of "
            f"{args.rounds} rounds:",
            "",
            "| design | workers | rows/s | / ceiling | client µs per row | server CPU µs per row |",
            "|---|---:|---:|---:|---:|---:|",
            f"| one process: a psycopg cursor, each row `json` encoded, XADD pipelines of "
            f"{BATCH} (the ceiling) | 1 | {pg_ceiling_rate:,.0f} | 1.00 | "
            f"{1e6 / pg_ceiling_rate:.2f} | {report.server_us['pg-ceiling']:.2f} |",
            f"| tenure IngestJob | 1 | {pg_tenure:,.0f} | {pg_tenure / pg_ceiling_rate:.2f} | "
            f"{1e6 / pg_tenure:.2f} | {report.server_us['pg-tenure-1']:.2f} |",
        ]
    lines += [
        "",
        f"## Faults: {args.fault_rows:,} rows, 4 workers, one killed with kill -9 every "
        f"{KILL_EVERY[0]:g}-{KILL_EVERY[1]:g} s, at most {kill_budget(args.fault_rows)} "
        f"(seed {args.seed}), and replaced",
        "",
        "| design | kills | seconds | entries | rows lost | rows duplicated |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for design, result in report.faults.items():
        late = f" ({result.stragglers} still working 60 s after)" if result.stragglers else ""
        lines.append(
            f"| {DESIGNS[design]} | {result.kills} | {result.seconds:.1f}{late} | "
            f"{result.rows:,} | {result.lost:,} | {result.duplicated:,} |"
        )
    lines += [
        "",
        "## Memory: one tenure worker, the whole table",
        "",
        "| rows | peak RSS |",
        "|---:|---:|",
        *(f"| {rows:,} | {kib / 1024:,.1f} MiB |" for rows, kib in sorted(report.memory.items())),
        "",
        "tenure reads a page of rows at a time (`WHERE id > last ORDER BY id LIMIT 1000`) "
        "and commits 500 at a time, so its memory does not grow with the table.",
        "",
        "## Notes",
        "",
        "* Client µs per row: each worker's wall time per row it handled (workers x "
        "seconds / rows). Server CPU µs per row: the server's CPU time over the run (`INFO "
        "cpu`, its main thread), divided by the rows; tenure's round trips are one "
        "`ingest_commit` call per 500 rows and one `ingest_claim` per chunk of 10,000, the "
        "ceiling's one pipeline of 500 XADDs per 500 rows.",
        "* The ceiling reads the table as fast as Python can (one `sqlite3` cursor, no "
        "coordination, no checks) and sends one XADD per row, pipelined. A tenure worker "
        "reads through SQLAlchemy a page at a time and sends 500 rows per script call, "
        "which the server appends from inside the script (one call parsed and answered, "
        "not 500). With 2 and 4 workers on 2 cores, the SQL reads of one worker overlap "
        "the server's work for another.",
        "* The post's duplicates: when every bit is set, its bitmap is deleted; a worker that "
        "starts just then (here, the replacement of a killed one) finds no chunk done and "
        "pushes the whole table again. Its done bit is also read outside its booking, so two "
        "workers can do one chunk. Its kills are more because it runs longer.",
        "* tenure's rows/s count from the go signal to the last commit, SQL reads, claims and "
        "lease renewals included; under faults, a killed worker's chunk waits out its 1 s "
        "lease before another worker resumes it from its cursor.",
    ]
    return "\n".join(lines)


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    _check(args)
    if args.url:
        check_empty(args.url, args.allow_flush)
    what = (
        f"{several(len(DESIGNS) * len(args.workers) + 1, 'speed run')} of "
        f"{args.rows:,} rows x {several(args.rounds, 'round')}, faults over "
        f"{args.fault_rows:,} rows, {several(len(args.memory_rows), 'memory run')}"
        + (", PostgreSQL" if args.postgresql else "")
    )
    return run_timed("ingest", estimated_seconds(args), what, lambda: _run(args, command))


def _run(args: argparse.Namespace, command: Sequence[str]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="tenure-bench-ingest-"))
    try:
        tables = {}
        for rows in sorted({args.rows, args.fault_rows, *args.memory_rows}):
            tables[rows] = folder / f"events-{rows}.sqlite"
            began = time.monotonic()
            build_table(tables[rows], rows)
            progress(f"table of {rows:,} rows built in {time.monotonic() - began:.1f} s")
        with given_or_private(args.url, name="bench-ingest") as (url, server):
            where = url if server is None else f"{server.engine.name} {server.engine.version}"
            with redis.Redis.from_url(url) as client:
                report = _measure(client, url, args, tables, where, shlex.join(command))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    text = render(report)
    print(text)
    if args.output:
        write_section(Path(args.output), "ingest", text)
        progress(f"wrote {args.output}")


def _measure(
    client: redis.Redis,
    url: str,
    args: argparse.Namespace,
    tables: dict[int, Path],
    server: str,
    command: str,
) -> Report:
    ceilings: list[float] = []
    speeds: dict[tuple[str, int], list[float]] = {}
    server_times: dict[str, list[float]] = {}

    def timed(label: str, rows: int, run: Any) -> float:
        before = server_cpu_us(client)
        rate = float(run())
        server_times.setdefault(label, []).append((server_cpu_us(client) - before) / rows)
        progress(f"{label}: {rate:,.0f} rows/s")
        return rate

    for round_number in range(1, args.rounds + 1):
        ceilings.append(timed("ceiling", args.rows, lambda: ceiling(client, tables[args.rows])))
        for design in DESIGNS:
            for count in args.workers:
                rate = timed(
                    f"{design}-{count}", args.rows,
                    lambda d=design, n=count: speed(
                        client, url, d, tables[args.rows], args.rows, n
                    ),
                )  # fmt: skip
                speeds.setdefault((design, count), []).append(rate)
        progress(f"speed round {round_number}/{args.rounds} done")
    pg = None
    if args.postgresql:
        copy_to_postgresql(tables[args.rows], args.postgresql)
        pg_ceilings, pg_speeds = [], []
        for _ in range(args.rounds):
            pg_ceilings.append(
                timed("pg-ceiling", args.rows, lambda: pg_ceiling(client, args.postgresql))
            )
            pg_speeds.append(
                timed(
                    "pg-tenure-1", args.rows,
                    lambda: speed(client, url, "tenure", args.postgresql, args.rows, 1),
                )
            )  # fmt: skip
        pg = (statistics.median(pg_ceilings), statistics.median(pg_speeds))
        progress("PostgreSQL done")
    fault_results = {}
    for design in DESIGNS:
        found = faults(client, url, design, tables[args.fault_rows], args.fault_rows, args.seed)
        fault_results[design] = found
        progress(
            f"faults {design}: {found.kills} kills, {found.seconds:.1f} s, "
            f"{found.lost:,} lost, {found.duplicated:,} duplicated"
        )
    memory = {}
    for rows in args.memory_rows:
        memory[rows] = peak_memory(url, tables[rows])
        progress(f"memory of {rows:,} rows: peak RSS {memory[rows] / 1024:.1f} MiB")
    client.flushdb()
    return Report(
        ceiling=statistics.median(ceilings),
        speeds={key: statistics.median(values) for key, values in speeds.items()},
        pg=pg,
        server_us={key: statistics.median(values) for key, values in server_times.items()},
        faults=fault_results,
        memory=memory,
        args=args,
        server=server,
        command=command,
    )
