"""IngestJob: chunks claimed by workers, every row in the sink exactly once (real servers)."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from tenure import (
    ArgumentError,
    AsyncCallableSource,
    AsyncIngestJob,
    CallableSource,
    IngestJob,
    MissingDependencyError,
    SourceUnavailableError,
    SqlSource,
)
from tenure.server import ServerProcess
from tests.conftest import wait_for


def make_table(path: Path, rows: int, *, gaps: bool = True) -> list[int]:
    """An SQLite table ``events`` with integer ids (some missing) and a few columns."""
    ids = [i * 3 + (i % 2) if gaps else i for i in range(1, rows + 1)]
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT, amount REAL)")
        db.executemany(
            "INSERT INTO events VALUES (?, ?, ?)", ((i, f"event {i}", i / 4) for i in ids)
        )
    return ids


def stream_keys(client: redis.Redis, key: str) -> list[int]:
    entries: Any = client.xrange(key)
    return [int(fields[b"key"]) for _, fields in entries]


def test_bad_sources_are_refused_by_name(tenure_client: redis.Redis, tmp_path: Path) -> None:
    path = tmp_path / "bad.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE words (id INTEGER, word TEXT)")
        db.executemany("INSERT INTO words VALUES (?, ?)", [(1, "a"), (1, "b"), (2, "c")])
        db.execute("CREATE TABLE named (code TEXT PRIMARY KEY)")
        db.execute("INSERT INTO named VALUES ('x')")
        db.execute("CREATE TABLE vacant (id INTEGER PRIMARY KEY)")
    url = f"sqlite:///{path}"
    with pytest.raises(ArgumentError, match="no table 'missing'"):
        SqlSource(url, "missing", "id")
    with pytest.raises(ArgumentError, match="has no column 'nope'"):
        SqlSource(url, "words", "nope")
    cases = [
        (SqlSource(url, "words", "id"), "not unique"),
        (SqlSource(url, "named", "code"), "must be an integer column"),
        (SqlSource(url, "vacant", "id"), "is empty"),
    ]
    for source, message in cases:
        with pytest.raises(ArgumentError, match=message):
            IngestJob(tenure_client, f"bad-{message}", source).work()
    with pytest.raises(ArgumentError, match="sink"):
        IngestJob(tenure_client, "x", cases[0][0], sink="queue:x")
    assert tenure_client.dbsize() == 0  # nothing half-written


def test_source_urls_are_checked_before_any_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ArgumentError, match=r"^url: not a database URL: did you mean sqlite:///shop.db\?$"
    ):
        SqlSource("shop.db", "t", "id")
    with pytest.raises(ArgumentError, match="unknown database kind 'nosuch'"):
        SqlSource("nosuch://host/db", "t", "id")
    with pytest.raises(
        SourceUnavailableError, match="no SQLite database at nosuch.db: the file does not exist"
    ):
        SqlSource("sqlite:///nosuch.db", "t", "id")
    assert not (tmp_path / "nosuch.db").exists()  # never created
    with socket.socket() as closed:  # a loopback port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(SourceUnavailableError) as caught:
        SqlSource(f"postgresql+psycopg://user@127.0.0.1:{port}/db", "t", "id")
    assert (
        str(caught.value) == f"cannot connect to PostgreSQL at 127.0.0.1:{port}: connection refused"
    )


def test_sql_source_without_sqlalchemy_names_the_pip_command() -> None:
    code = (
        "import sys; sys.modules['sqlalchemy'] = None\n"
        "from tenure import MissingDependencyError, SqlSource\n"
        "try:\n    SqlSource('sqlite:///x.db', 't', 'id')\n"
        "except MissingDependencyError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == 'SqlSource needs SQLAlchemy: pip install "tenure[sql]"\n'
    assert issubclass(MissingDependencyError, ImportError)


def numbers(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
    for key in range(first, last + 1):
        if key == 35 and numbers.interrupt:  # type: ignore[attr-defined]
            raise KeyboardInterrupt
        yield key, {"n": key}


def test_ctrl_c_in_a_worker_gives_its_claim_back(tenure_client: redis.Redis) -> None:
    source = CallableSource(numbers, low=1, high=100, name="numbers")
    job = IngestJob(tenure_client, "ctrl-c", source, chunk_size=100, batch=10)
    numbers.interrupt = True  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        job.work()
    numbers.interrupt = False  # type: ignore[attr-defined]
    status = job.status()
    assert status.claimed == 0 and status.free == 1 and status.rows == 30
    assert job.work(wait=False).rows == 70  # at once, after the cursor
    assert stream_keys(tenure_client, job.keys.default_sink()) == list(range(1, 101))


def test_a_cancelled_async_worker_gives_its_claim_back(tenure_server: ServerProcess) -> None:
    reached = asyncio.Event()

    async def fetch(first: int, last: int) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            if key == 25:
                reached.set()
                await asyncio.sleep(60)  # a fetch's work, cancelled here
            yield key, {"n": key}

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(tenure_server.url)
        source = AsyncCallableSource(fetch, low=1, high=100, name="numbers")
        job = AsyncIngestJob(client, "cancelled", source, chunk_size=100, batch=10)
        task = asyncio.create_task(job.work())
        await asyncio.wait_for(reached.wait(), 10)
        assert (await job.status()).claimed == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        status = await job.status()
        assert status.claimed == 0 and status.free == 1 and status.rows == 20
        await client.aclose()

    asyncio.run(main())


def test_a_claim_says_whether_it_took_over_a_lease_that_ran_out(tenure_client: redis.Redis) -> None:
    source = CallableSource(numbers, low=1, high=100, name="numbers")
    job = IngestJob(tenure_client, "taken", source, chunk_size=100)
    keys = job.keys
    claim_keys = (keys.free, keys.leases, keys.cursors, keys.stats, keys.fence, keys.plan)
    fingerprint = job.plan().fingerprint

    def claim(token: str, lease_ms: int) -> Any:
        return job._registry.run("ingest_claim", claim_keys, (token, lease_ms, fingerprint))

    assert claim("t1@a", 30_000)[4] == 0  # never claimed
    assert job._registry.run("ingest_release", (keys.free, keys.leases), ("t1@a", 0)) == 1
    assert claim("t2@b", 50)[4] == 0  # given back: not taken over
    time.sleep(0.1)  # its worker "died": the lease runs out unreleased
    assert claim("t3@c", 30_000)[4] == 1


def test_a_resent_release_or_reset_changes_nothing(tenure_client: redis.Redis) -> None:
    """The scripts run twice with the same arguments, as a client library's resend would."""
    source = CallableSource(numbers, low=1, high=100, name="numbers")
    job = IngestJob(tenure_client, "resend", source, chunk_size=50, batch=10)
    job.plan()
    keys = job.keys
    run = job._registry.run
    claim_keys = (keys.free, keys.leases, keys.cursors, keys.stats, keys.fence, keys.plan)
    fingerprint = job.plan().fingerprint
    assert run("ingest_claim", claim_keys, ("t1@a", 30_000, fingerprint))[1] == 0
    for _ in range(2):  # released, then the resend: answered 1, nothing changes
        assert run("ingest_release", (keys.free, keys.leases), ("t1@a", 0)) == 1
    assert run("ingest_claim", claim_keys, ("t2@b", 30_000, fingerprint))[1] == 0  # taken again
    assert run("ingest_release", (keys.free, keys.leases), ("t1@a", 0)) == 0  # not t1's
    assert job.status().claimed == 1  # t2 still holds it
    # a claim whose reply was lost: found by its token
    assert run("ingest_claim", claim_keys, ("t3@c", 30_000, fingerprint))[1] == 1
    assert run("ingest_release", (keys.free, keys.leases), ("t3@c", "")) == 1
    assert job.status().claimed == 1
    reset_keys = (keys.plan, keys.free, keys.leases, keys.cursors, keys.stats, keys.fence,
                  keys.default_sink(), keys.reset)  # fmt: skip
    assert run("ingest_reset", reset_keys, ("op1", 1, 0, 60_000)) == [1, 5, 0, 1]
    job._plan = None  # (the script was run by hand, not by reset())
    job.plan()  # planned anew before the resend arrives
    assert run("ingest_reset", reset_keys, ("op1", 1, 0, 60_000)) == [1, 5, 0, 1]
    assert job.status().chunks == 2  # the new plan stays
    assert run("ingest_reset", reset_keys, ("op2", 0, 0, 60_000)) == [1, 2, 0, 0]


def test_a_claim_given_back_before_it_arrives_is_refused(tenure_client: redis.Redis) -> None:
    """A worker interrupted while its claim is on its way (on a connection the
    interruption closed) gives it back by token; should the claim reach the
    server after that, it claims nothing."""
    source = CallableSource(numbers, low=1, high=100, name="numbers")
    job = IngestJob(tenure_client, "late-claim", source, chunk_size=50, batch=10)
    keys = job.keys
    run = job._registry.run
    claim_keys = (keys.free, keys.leases, keys.cursors, keys.stats, keys.fence, keys.plan)
    fingerprint = job.plan().fingerprint
    for _ in range(2):  # the give-back finds nothing, and so does its resend
        assert run("ingest_release", (keys.free, keys.leases), ("t1@a", "")) == 0
    assert run("ingest_claim", claim_keys, ("t1@a", 30_000, fingerprint)) == [-3]
    assert job.status().claimed == 0
    assert run("ingest_claim", claim_keys, ("t2@b", 30_000, fingerprint))[1] == 0  # others may


def audited_keys(client: redis.Redis, stream: str) -> list[int]:
    """Every entry's key in stream order, read a page at a time."""
    keys: list[int] = []
    start = "-"
    while True:
        page: Any = client.xrange(stream, min=start, count=20_000)
        keys += (int(fields[b"key"]) for _, fields in page)
        if len(page) < 20_000:
            return keys
        start = "(" + page[-1][0].decode()


@pytest.mark.timeout(300)  # about 30 s alone; a busy 2-core machine may triple that
def test_a_million_rows_with_workers_killed_20_times_lose_and_duplicate_nothing(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    database = tmp_path / "big.sqlite"
    rows = 1_000_000
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT, amount REAL)")
        db.executemany("INSERT INTO events VALUES (?, ?, ?)",
                       ((i, f"event {i}", i / 4) for i in range(1, rows + 1)))  # fmt: skip
    command = [sys.executable, "-m", "tests.ingest_worker", tenure_server.url, str(database), "big"]
    job = IngestJob(
        tenure_client,
        "big",
        SqlSource(f"sqlite:///{database}", "events", "id", page=400),
        chunk_size=5_000,
        lease=1.0,
        batch=200,
    )
    started = time.monotonic()
    workers = [(subprocess.Popen(command), started) for _ in range(4)]
    rng = random.Random(7)
    kills = 0
    deadline = started + 240
    try:
        # 30 kills spread over the run, then the survivors finish (killing on
        # to the end only makes the run longer, not the check stronger).
        while kills < 30 and time.monotonic() < deadline and not job.status().finished:
            time.sleep(rng.uniform(0.1, 0.5))
            # a random worker that holds a chunk (host:pid): one still starting holds
            # nothing, and on a busy machine start-up can take longer than the kills
            holding = {h.worker.rpartition(":")[2] for h in job.status().holders}
            working = [i for i, (w, _) in enumerate(workers) if str(w.pid) in holding]
            if not working:
                continue
            victim = rng.choice(working)
            if workers[victim][0].poll() is None:
                workers[victim][0].send_signal(signal.SIGKILL)
                workers[victim][0].wait()
                kills += 1
            workers[victim] = (subprocess.Popen(command), time.monotonic())
        for worker, _ in workers:  # let the last ones finish what the killed ones held
            worker.wait(timeout=60)
    finally:
        for worker, _ in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    status = job.status()
    assert status.finished and status.rows == rows
    assert kills >= 20
    assert status.claims > status.chunks  # chunks of killed workers were taken over
    keys = audited_keys(tenure_client, job.keys.default_sink())
    assert len(keys) == rows  # none duplicated...
    assert set(keys) == set(range(1, rows + 1))  # ...and none lost


def _workers_until_done(
    command: list[str], job: IngestJob, count: int, timeout: float = 120
) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` workers; respawn any that exits before the job is done."""
    workers = [subprocess.Popen(command, stderr=subprocess.DEVNULL) for _ in range(count)]

    def finished() -> bool:  # an error: the server is restarting
        for index, worker in enumerate(workers):
            if worker.poll() is not None:
                workers[index] = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        return job.status().finished

    try:
        wait_for(finished, timeout, "the job finished")
    except AssertionError:
        for worker in workers:
            worker.kill()
            worker.wait()
        raise
    return workers


def test_a_stopped_worker_is_taken_over_and_its_commits_refused_when_resumed(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    database = tmp_path / "stop.sqlite"
    ids = make_table(database, 40_000, gaps=False)
    command = [
        sys.executable,
        "-m",
        "tests.ingest_worker",
        tenure_server.url,
        str(database),
        "stop",
    ]
    job = IngestJob(
        tenure_client, "stop", SqlSource(f"sqlite:///{database}", "events", "id"), chunk_size=5_000
    )
    stopped = subprocess.Popen(command)
    try:
        wait_for(lambda: job.status().rows >= 1_000, 60, "the worker inside a chunk")
        stopped.send_signal(signal.SIGSTOP)
        held = job.status().claimed
        assert held == 1
        others = _workers_until_done(command, job, 2)
        for worker in others:
            worker.wait(timeout=60)
        assert job.status().finished  # the stopped worker's chunk was taken over
        stopped.send_signal(signal.SIGCONT)
        assert stopped.wait(timeout=60) == 0  # resumed: refused, it moved on and ended
    finally:
        if stopped.poll() is None:
            stopped.send_signal(signal.SIGCONT)
            stopped.kill()
            stopped.wait()
    keys = stream_keys(tenure_client, job.keys.default_sink())
    assert len(keys) == len(ids) and sorted(keys) == ids


def test_a_server_restarted_with_aof_mid_job_loses_and_duplicates_nothing(
    tenure_engine: Any, tmp_path: Path
) -> None:
    database = tmp_path / "aof.sqlite"
    ids = make_table(database, 60_000, gaps=False)
    with ServerProcess(tenure_engine, appendonly=True, name="tenure-ingest-aof") as server:
        client = server.client()
        command = [sys.executable, "-m", "tests.ingest_worker", server.url, str(database), "aof"]
        job = IngestJob(
            client, "aof", SqlSource(f"sqlite:///{database}", "events", "id"), chunk_size=5_000
        )
        job.plan()
        restarted = threading.Event()

        def restart_when_a_third_is_in() -> None:
            wait_for(lambda: job.status().rows >= len(ids) // 3, 120, "a third ingested")
            server.restart()
            restarted.set()

        restarter = threading.Thread(target=restart_when_a_third_is_in)
        restarter.start()
        workers = _workers_until_done(command, job, 3)
        restarter.join(timeout=60)
        for worker in workers:
            worker.wait(timeout=60)
        assert restarted.is_set() and job.status().finished
        keys = stream_keys(client, job.keys.default_sink())
        assert len(keys) == len(ids) and sorted(keys) == ids
        client.close()
