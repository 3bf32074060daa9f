"""``tenure ingest run`` / ``status``: real processes, a real server, a real Ctrl-C."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
import redis
import sqlalchemy as sa

from tenure._tooling import Plan
from tenure._tools.cli import build_parser
from tenure._tools.ingest_cli import ProgressWriter, _few_chunks, job_from_settings
from tenure.server import ServerProcess
from tests.conftest import wait_for
from tests.sql_databases import postgresql
from tests.test_ingest import make_table, stream_keys

pytestmark = pytest.mark.engine_blind

SINK = "tenure:ingest:{events}:rows"


def tenure(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "REDIS_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "tenure", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal delivers it, even when these tests run as a
        # background job (a shell without job control starts those with
        # SIGINT ignored, and the child would inherit that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _rows(client: redis.Redis) -> int:
    """The rows the job ``events`` has committed so far."""
    return int(client.hget("tenure:ingest:{events}:stats", "rows") or 0)


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=180)
    return process.returncode, out, err


def test_run_status_and_a_rerun(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    ids = make_table(tmp_path / "db.sqlite", 20_000)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ("ingest", "run", source, "--table", "events", "--key", "id", "--chunk-size", "2000")
    code, out, err = finish(tenure(tenure_server.url, *args, "--workers", "2"))
    assert code == 0, err
    assert "events: done, 20,000 rows in" in out
    assert sorted(stream_keys(tenure_client, SINK)) == ids
    code, out, _ = finish(tenure(tenure_server.url, *args))
    assert code == 0 and "already done (20,000 rows" in out
    code, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "events", "--json"))
    status: Any = json.loads(out)
    assert code == 0 and status["finished"] and status["rows"] == 20_000
    assert status["rate"] > 0 and status["holders"] == []
    code, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "events"))
    assert code == 0 and "20,000 rows  chunks" in out and "rows/s over" in out
    code, _, err = finish(tenure(tenure_server.url, "ingest", "status", "nonesuch"))
    assert code == 2 and "no ingestion job named 'nonesuch'" in err and err.count("\n") == 1
    code, _, err = finish(tenure(tenure_server.url, "ingest", "run", source, "--table", "nope",
                                 "--key", "id"))  # fmt: skip
    assert code == 2 and "no table 'nope'" in err and err.count("\n") == 1


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_gives_the_claims_back_and_the_same_command_resumes_at_once(
    tenure_client: redis.Redis,
    tenure_server: ServerProcess,
    tmp_path: Path,
    signum: signal.Signals,
    code: int,
) -> None:
    ids = make_table(tmp_path / "db.sqlite", 150_000, gaps=False)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = (
        "ingest",
        "run",
        source,
        "--table",
        "events",
        "--key",
        "id",
        "--chunk-size",
        "5000",
        "--workers",
        "2",
    )  # fmt: skip  (the default 30 s lease: a rerun must not wait it out)
    first = tenure(tenure_server.url, *args)
    wait_for(lambda: _rows(tenure_client) >= 20_000, 120, "20,000 rows ingested")
    first.send_signal(signum)
    returned, _, err = finish(first)
    assert returned == code and "run the same command again to resume" in err
    assert "Traceback" not in err  # the workers leave Ctrl-C to the command
    assert "still claimed" not in err
    _, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "events", "--json"))
    status: Any = json.loads(out)
    assert status["claimed"] == 0 and status["holders"] == []  # given back: none in work
    assert 20_000 <= status["rows"] < len(ids)
    started = time.monotonic()
    returned, _, err = finish(tenure(tenure_server.url, *args))
    assert returned == 0, err
    assert "claimed by other workers" not in err
    assert time.monotonic() - started < 120
    keys = stream_keys(tenure_client, SINK)
    assert len(keys) == len(ids) and sorted(keys) == ids  # every row exactly once


def test_reset_asks_for_yes_refuses_a_busy_job_and_starts_it_over(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    ids = make_table(tmp_path / "db.sqlite", 3_000)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ("ingest", "run", source, "--table", "events", "--key", "id", "--chunk-size", "2000",
            "--workers", "1")  # fmt: skip
    assert finish(tenure(tenure_server.url, *args))[0] == 0
    code, _, err = finish(tenure(tenure_server.url, "ingest", "reset", "events", "--sink"))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("tenure: ingest: --yes: this would delete job 'events' (")
    assert f"and its sink stream:{SINK} (3,000 entries); add --yes to do it" in err
    assert tenure_client.exists("tenure:ingest:{events}:plan") == 1  # nothing deleted
    # another chunk size is refused until the job is reset
    code, _, err = finish(tenure(tenure_server.url, *args[:-3], "1000"))
    assert code == 1 and "PlanMismatchError" in err and "tenure ingest reset" in err
    # a claim held (a worker at work, or killed less than a lease ago) refuses a reset
    settings = {"source_url": source, "table": "events", "key": "id", "chunk_size": 2000,
                "lease": 30.0}  # fmt: skip
    job = job_from_settings(tenure_client, settings)
    job.reset()
    job.plan()
    keys = job.keys
    job._registry.run(
        "ingest_claim",
        (keys.free, keys.leases, keys.cursors, keys.stats, keys.fence, keys.plan),
        ("token@elsewhere", 30_000, job.plan().fingerprint),
    )
    code, _, err = finish(tenure(tenure_server.url, "ingest", "reset", "events", "--yes"))
    assert code == 1 and err.count("\n") == 1, err
    assert "job 'events' has 1 chunk(s) in work: stop its `tenure ingest run`" in err
    code, out, err = finish(
        tenure(tenure_server.url, "ingest", "reset", "events", "--yes", "--force", "--sink")
    )
    assert code == 0, err
    assert out.startswith("deleted job 'events' (5 chunks, 0 done, 0 rows)")
    assert "1 running claim(s) dropped" in out
    assert tenure_client.exists(SINK, keys.plan, keys.free, keys.leases, keys.stats) == 0
    code, _, err = finish(tenure(tenure_server.url, *args[:-3], "1000", "--workers", "2"))
    assert code == 0, err  # started over, with another chunk size
    assert sorted(stream_keys(tenure_client, SINK)) == ids


def test_a_forced_reset_stops_a_running_job_without_planning_it_again(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    # 600,000 rows: on a busy CI machine the run once finished 150,000 before the
    # reset's own process had started (the run then ends on the reset, not the table).
    make_table(tmp_path / "db.sqlite", 600_000, gaps=False)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    run = tenure(tenure_server.url, "ingest", "run", source, "--table", "events", "--key", "id",
                 "--chunk-size", "2000", "--workers", "2")  # fmt: skip
    wait_for(lambda: _rows(tenure_client) >= 10_000, 120, "10,000 rows ingested")
    code, out, err = finish(tenure(tenure_server.url, "ingest", "reset", "events", "--yes",
                                   "--force"))  # fmt: skip
    assert code == 0, err
    assert f"its sink stream:{SINK} (" in out and "a rerun writes every row to it again" in out
    returned, _, err = finish(run)
    assert returned == 1, err
    assert "Traceback" not in err and "PlanMismatchError" in err
    assert "the job was reset while this run worked" in err
    assert "done," not in err
    # the run ended on the reset (above), not at the table's end; on a busy machine
    # its workers may have committed the last rows before the reset reached them
    written = tenure_client.xlen(SINK)
    time.sleep(0.5)  # a pause under test: nothing is written during it
    assert tenure_client.xlen(SINK) == written < 600_000  # nothing ingested anew
    assert tenure_client.exists("tenure:ingest:{events}:plan") == 0  # and not planned again


def test_few_chunks_for_the_workers_are_told(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    make_table(tmp_path / "db.sqlite", 5_000, gaps=False)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    code, out, err = finish(tenure(tenure_server.url, "ingest", "run", source, "--table",
                                   "events", "--key", "id", "--workers", "2"))  # fmt: skip
    assert code == 0 and "done, 5,000 rows in 1 chunk," in out, err
    assert (
        "events: keys 1..5,000 make 1 chunk of 10,000: only 1 of 2 workers will have work; "
        "use --chunk-size 2500" in err
    )


def test_more_workers_than_useful_chunks_are_told_to_use_fewer_workers() -> None:
    plan = Plan(source={}, low=1, high=100_000, chunk_size=10_000)
    said = _few_chunks(plan, plan.chunks, 100_000)
    assert said is not None and "fewer workers would do (--workers 100" in said
    assert "--chunk-size" not in said  # (a chunk of 1 key: slower, not faster)


def test_every_ingest_option_shows_its_default() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    ingest = commands.choices["ingest"]
    actions = next(a for a in ingest._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in actions.choices.items():
        for action in sub._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            helped = action.help or ""
            assert "(default: " in helped or "(required)" in helped, (name, action.dest)
    run = subprocess.run([sys.executable, "-m", "tenure", "ingest", "run", "--help"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "keys per chunk (default: 10,000)" in " ".join(run.split())


def test_a_database_killed_mid_run_is_said_in_one_line_and_no_row_is_lost(
    tenure_client: redis.Redis, tenure_server: ServerProcess
) -> None:
    server = postgresql()
    try:
        engine = sa.create_engine(server.url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE events (id bigint PRIMARY KEY, name text)")
            conn.exec_driver_sql(
                "INSERT INTO events SELECT g, 'event ' || g FROM generate_series(1, 150000) g"
            )
        with engine.connect() as conn:  # on disk: the server runs with synchronous_commit=off
            conn.exec_driver_sql("CHECKPOINT")
        engine.dispose()
        port = sa.make_url(server.url).port
        args = ("ingest", "run", server.url, "--table", "events", "--key", "id",
                "--chunk-size", "5000", "--workers", "2")  # fmt: skip
        run = tenure(tenure_server.url, *args)
        wait_for(lambda: _rows(tenure_client) >= 20_000, 120, "20,000 rows ingested")
        server.kill()  # kill -9 by its PID, mid-read
        code, _, err = finish(run)
        said = [line for line in err.splitlines() if line.startswith("tenure:")]
        assert code == 1 and len(said) == 1, err
        # Killed while a worker read a page (keys a..b) or the table's columns.
        assert said[0].startswith(
            f"tenure: ingest: PostgreSQL at 127.0.0.1:{port} failed while reading "
        ), err
        assert "'events' keys " in said[0] or "the columns of 'events'" in said[0], err
        assert "; run the same command again to resume)" in said[0]
        assert "Traceback" not in err and "OperationalError" not in err
        _, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "events", "--json"))
        status: Any = json.loads(out)
        assert status["claimed"] == 0 and 20_000 <= status["rows"] < 150_000  # given back
        server.restart()  # recovered from the crash: the same command finishes the job
        code, _, err = finish(tenure(tenure_server.url, *args))
        assert code == 0, err
        keys = stream_keys(tenure_client, SINK)
        assert len(keys) == 150_000 and sorted(keys) == list(range(1, 150_001))  # once each
    finally:
        server.stop()


def test_a_row_with_no_json_form_stops_the_run_in_one_line(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    make_table(tmp_path / "db.sqlite", 20_000, gaps=False)
    with sqlite3.connect(tmp_path / "db.sqlite") as db:
        db.execute("UPDATE events SET amount = 9e999 WHERE id = 14321")  # SQLite keeps inf
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    code, _, err = finish(tenure(tenure_server.url, "ingest", "run", source, "--table", "events",
                                 "--key", "id", "--chunk-size", "2000"))  # fmt: skip
    said = [line for line in err.splitlines() if line.startswith("tenure:")]
    assert code == 1 and len(said) == 1 and "Traceback" not in err, err
    assert said[0].startswith(
        "tenure: ingest: SourceRowError: row 14321, column 'amount' holds inf: JSON (RFC 8259) "
        "has no NaN or infinity"
    ), err
    _, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "events", "--json"))
    assert json.loads(out)["claimed"] == 0


STOPPED_WHILE_GIVING_BACK = """
import os, signal, sys
from multiprocessing import SimpleQueue
from tenure._sync._scripting import ScriptRegistry
from tenure._tools.ingest_cli import _work

run = ScriptRegistry.run

def run_then_stop(self, script, *args, **kwargs):
    if script == "ingest_release":  # the parent's SIGTERM lands as the claim goes back
        os.kill(os.getpid(), signal.SIGTERM)
    return run(self, script, *args, **kwargs)

ScriptRegistry.run = run_then_stop
settings = dict(source_url=sys.argv[2], table="events", key="id", chunk_size=2000,
                sink=None, name="cut-give-back", lease=60.0)
failures = SimpleQueue()
_work(sys.argv[1], settings, os.getppid(), failures)
print("failures:", int(not failures.empty()))
"""


def test_a_worker_stopped_while_giving_a_claim_back_gives_it_back(
    tenure_server: ServerProcess, tmp_path: Path
) -> None:
    # A worker whose row failed gives its claim back; the SIGTERM of the parent
    # stopping every worker can land just then, and must not cut the give-back
    # (the chunk would stay claimed for its whole lease; seen in CI).
    make_table(tmp_path / "db.sqlite", 4_000, gaps=False)
    with sqlite3.connect(tmp_path / "db.sqlite") as db:
        db.execute("UPDATE events SET amount = 9e999 WHERE id = 10")
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_GIVING_BACK, tenure_server.url, source],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    _, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "cut-give-back", "--json"))
    status = json.loads(out)
    assert status["claims"] == 1 and status["claimed"] == 0, status


def test_the_lease_option_is_checked_before_the_source_is_reached(
    tenure_server: ServerProcess, tmp_path: Path
) -> None:
    with socket.socket() as closed:  # a source nobody answers at: never reached
        closed.bind(("127.0.0.1", 0))
        nowhere = f"postgresql+psycopg://u@127.0.0.1:{closed.getsockname()[1]}/db"
    cases = [
        ("inf", "--lease: must be a finite number of seconds"),
        ("1e16", "--lease: must be at most 315360000 seconds (ten years), got 1e+16"),
    ]
    for lease, message in cases:
        code, _, err = finish(tenure(tenure_server.url, "ingest", "run", nowhere, "--table", "t",
                                     "--key", "id", "--lease", lease))  # fmt: skip
        assert (code, err) == (2, f"tenure: ingest: {message}\n")
    make_table(tmp_path / "db.sqlite", 10)
    code, _, err = finish(tenure(tenure_server.url, "ingest", "run",
                                 f"sqlite:///{tmp_path / 'db.sqlite'}", "--table", "events",
                                 "--key", "id", "--lease", "0.05"))  # fmt: skip
    assert (code, err) == (2, "tenure: ingest: --lease: must be at least 0.1 seconds, got 0.05\n")


def test_off_a_terminal_progress_waits_its_interval_before_its_first_line() -> None:
    # A run that fails (or ends) at once prints one line, its outcome, not a
    # progress line before it; a longer run logs a line every interval.
    stream = io.StringIO()
    progress = ProgressWriter(stream, every=60.0)
    progress.show("[....] 0 rows")
    assert stream.getvalue() == ""
    progress = ProgressWriter(stream, every=0.0)
    progress.show("[#...] 10 rows")
    assert stream.getvalue() == "[#...] 10 rows\n"


def test_a_worker_killed_mid_run_is_said_in_one_line_and_replaced(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    """kill -9 of one of ``run``'s workers: a line names it, the chunk it held and when
    that chunk is taken over; a new worker takes its place; every row lands once."""
    ids = make_table(tmp_path / "db.sqlite", 300_000, gaps=False)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    run = tenure(tenure_server.url, "ingest", "run", source, "--table", "events", "--key", "id",
                 "--chunk-size", "5000", "--workers", "2", "--lease", "2")  # fmt: skip
    wait_for(lambda: _rows(tenure_client) >= 10_000, 120, "10,000 rows ingested")
    workers = [
        child for child in psutil.Process(run.pid).children()
        if "resource_tracker" not in " ".join(child.cmdline())
    ]  # fmt: skip
    assert len(workers) == 2
    victim = workers[0].pid
    os.kill(victim, signal.SIGKILL)
    code, out, err = finish(run)
    assert code == 0, err
    said = [line for line in err.splitlines() if f"worker {victim} died" in line]
    assert len(said) == 1, err
    assert said[0].startswith(f"events: worker {victim} died (killed by SIGKILL); ")
    assert said[0].endswith("; a new worker takes its place")
    assert "is taken over when its lease runs out, in " in said[0] or "held no chunk" in said[0]
    assert "events: done, 300,000 rows in" in out
    assert sorted(stream_keys(tenure_client, SINK)) == ids  # every row once
