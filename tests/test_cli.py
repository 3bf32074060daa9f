"""The ``tenure`` command and the pytest plugin, run as real processes."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

import tenure
from tests.conftest import wait_for
from tests.test_server import wait_dead

pytestmark = pytest.mark.engine_blind

TENURE = [sys.executable, "-m", "tenure"]


INGEST = ("ingest", "run", "--table", "t", "--key", "id", "--url", "redis://127.0.0.1:1")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TENURE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_version_and_help() -> None:
    version = run("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"tenure {tenure.__version__}"
    helped = run("--help")
    assert helped.returncode == 0
    for command in ("demo", "bench", "inspect", "server"):
        assert command in helped.stdout
    assert run().returncode == 0  # no command: help, not a traceback


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (
            ("inspect", "--url", "redis://127.0.0.1:1"),
            1,
            "tenure: inspect: cannot reach the server",
        ),
        (("inspect", "--url", "notaurl"), 2, "tenure: inspect: --url: Redis URL must specify"),
        (
            ("inspect", "--cluster", "--near", "--url", "redis://127.0.0.1:1"),
            1,
            "tenure: inspect: cannot reach the server",
        ),
        (
            ("inspect", "--url", "redis://user:secret@127.0.0.1:notaport"),
            2,
            "tenure: inspect: --url: Port could not be cast to integer value as 'notaport' "
            "(got 'redis://user:***@127.0.0.1:notaport')",
        ),
        (
            ("demo", "market", "--url", "redis://127.0.0.1:1", "--seconds", "0.2"),
            1,
            "tenure: demo: ",
        ),
        (("demo", "--table-rows", "10"), 2, "tenure: demo: --table-rows: must be 1,000.."),
        (("demo", "sideshow"), 2, "tenure: demo DEMO: invalid choice: 'sideshow'"),
        (("demo", "--seconds", "abc"), 2, "tenure: demo --seconds: must be a number of seconds"),
        (("inspect", "--count", "x"), 2, "tenure: inspect --count: must be a whole number"),
        (("nonesuch",), 2, "tenure: COMMAND: invalid choice: 'nonesuch'"),
        (
            ("demo", "market", "--table-rows", "10000"),
            2,
            "tenure: demo: --table-rows: is an option of `tenure demo ingest`, not of demo market",
        ),
        (("demo", "ingest", "--modes", "lock"), 2, "tenure: demo: --modes: is an option of"),
        (("demo", "--modes", ","), 2, "tenure: demo --modes: give one or more of"),
        (
            ("demo", "ingest", "--url", "redis://127.0.0.1:1"),  # before building any table
            1,
            "tenure: demo: cannot reach the server",
        ),
        (("demo", "--url", "garbage"), 2, "tenure: demo: --url: Redis URL must specify"),
        (
            ("ingest", "run"),
            2,
            "tenure: ingest run: the following arguments are required: SOURCE_URL",
        ),
        (("-x",), 2, "tenure: usage: unrecognized arguments: -x"),
        (
            (*INGEST, "shop.db"),
            2,
            "tenure: ingest: SOURCE_URL: not a database URL: did you mean sqlite:///shop.db?",
        ),
        (
            (*INGEST, "sqlite:////nonexistent/nosuch.db"),
            1,
            "tenure: ingest: no SQLite database at /nonexistent/nosuch.db: the file does not exist",
        ),
        (
            (*INGEST, "postgresql+psycopg://user@127.0.0.1:1/db"),
            1,
            "tenure: ingest: cannot connect to PostgreSQL at 127.0.0.1:1: connection refused",
        ),
        ((*INGEST, "nosuch://host/db"), 2, "tenure: ingest: SOURCE_URL: unknown database kind"),
    ],
)
def test_every_error_is_one_line(args: tuple[str, ...], code: int, says: str) -> None:
    done = run(*args)
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # never a traceback
    assert lines[0].startswith(says), lines[0]
    assert "unexpected" not in lines[0]


def test_an_exhausted_pool_is_not_told_as_an_unreachable_server() -> None:
    from tenure._tools.cli import _failure

    exhausted = tenure.ConnectionPoolExhaustedError("the client's connection pool is exhausted")
    assert _failure(exhausted) == (
        1,
        "ConnectionPoolExhaustedError: the client's connection pool is exhausted",
    )
    raw = redis.exceptions.MaxConnectionsError("Too many connections")
    assert _failure(raw) == (1, "MaxConnectionsError: Too many connections")
    refused = redis.exceptions.ConnectionError("Error 111 connecting")
    assert _failure(refused) == (1, "cannot reach the server: Error 111 connecting")


def test_debug_shows_the_traceback() -> None:
    done = run("--debug", "inspect", "--url", "redis://127.0.0.1:1")
    assert done.returncode == 1
    assert "Traceback" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "--url", "redis://127.0.0.1:1", "--debug"),
        ("inspect", "--debug", "--url", "redis://127.0.0.1:1"),
        ("--debug", "inspect", "--url", "redis://127.0.0.1:1", "--debug"),
    ],
)
def test_debug_is_taken_anywhere(args: tuple[str, ...]) -> None:
    # every error says "--debug shows the traceback": it must work wherever it is put
    done = run(*args)
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr
    assert "unrecognized arguments" not in done.stderr


def test_server_on_a_busy_port_says_why_in_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run("server", "--port", str(port), timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is in use by another process: give another" in lines[0]
    assert "<ServerProcess" not in lines[0] and "Warning" not in lines[0]  # no repr, no raw log


def test_demo_wait_counts_only_completed_purchases() -> None:
    from tenure._tools.demo.run import DemoResult, _table

    none_bought = DemoResult(
        listers=5,
        buyers=1,
        seconds=2.0,
        listed=10,
        missed=3,
        retries=4,
        mode="watch",
        bought=0,
        purchase_attempts=3,
        avg_wait_ms=None,
        consistent=True,
        book_listed=None,
        book_bought=None,
        book_retries=None,
        book_wait_ms=None,
        book_upper_bounds=[],
    )
    table = _table([none_bought], 2.0)
    row = next(line for line in table.splitlines() if line.startswith("5/1"))
    assert " ms" not in row.split("|")[0], row  # no wait figure for a row with no purchase


def test_bad_arguments_exit_with_usage() -> None:
    bad = run("demo", "--seconds", "-1")
    assert bad.returncode == 2
    assert "must be > 0" in bad.stderr
    rows = run("demo", "--rows", "five/one")
    assert rows.returncode == 2
    assert "listers/buyers" in rows.stderr
    empty = run("demo", "--rows", "0/1")
    assert empty.returncode == 2
    assert "tenure: demo: rows: 0/1" in empty.stderr
    modes = run("demo", "--modes", "watch,optimism")
    assert modes.returncode == 2
    assert "tenure: demo: modes" in modes.stderr


@pytest.mark.slow
def test_demo_json_on_its_own_server() -> None:
    done = run("demo", "market", "--seconds", "0.5", "--rows", "1/1,2/2", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["listers"], r["buyers"], r["mode"]) for r in rows] == [
        (listers, buyers, mode)
        for listers, buyers in ((1, 1), (2, 2))
        for mode in ("watch", "lock", "script")
    ]
    for row in rows:
        assert row["consistent"], row  # no money, no item created or lost
        assert 0 <= row["bought"] <= row["listed"], row
        assert row["bought"] + row["missed"] <= row["purchase_attempts"], row
        if row["mode"] != "watch":
            assert row["retries"] == 0, row
    # each row's traders may start late on a busy machine, but the market trades
    assert sum(row["bought"] for row in rows) > 0, rows
    book = {(r["listers"], r["mode"]): r for r in rows}
    assert book[(1, "lock")]["book_bought"] == 417  # 50,000 in 60 s, scaled to 0.5 s
    assert book[(1, "watch")]["book_upper_bounds"] == []
    assert book[(2, "lock")]["book_bought"] is None  # not a row of the book
    assert book[(1, "script")]["book_listed"] is None
    started = re.search(r"started \S+ \S+ \(pid (\d+)\)", done.stderr)
    assert started, done.stderr
    assert wait_dead(int(started.group(1)), 2.0), "the demo left its server running"
    assert f"stopped the server (pid {started.group(1)})" in done.stderr


@pytest.mark.slow
def test_demo_on_a_given_url(tenure_server_url: str, tenure_client: redis.Redis) -> None:
    done = run(
        "demo", "market", "--seconds", "0.3", "--rows", "2/1", "--modes", "lock,script",
        "--url", tenure_server_url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tenure.Lock" in done.stdout and "Lua script" in done.stdout
    assert "WATCH" not in done.stdout
    assert "WRONG" not in done.stdout
    assert "started" not in done.stdout
    assert list(tenure_client.scan_iter(match="tenure:demo:*")) == []  # it cleaned up


@pytest.mark.slow
@pytest.mark.timeout(240)  # about 8 s alone; four busy workers on 2 cores may take far longer
def test_demo_ingest_on_a_given_url(tenure_server_url: str, tenure_client: redis.Redis) -> None:
    # 60,000 rows: about 8 s and 7 kills alone here, more kills on a busier machine
    done = run("demo", "ingest", "--table-rows", "60000", "--seed", "3", "--json",
               "--url", tenure_server_url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] and result["rows"] == result["entries"] == 60_000, result
    assert result["lost"] == result["duplicated"] == result["mismatched"] == 0
    assert result["kills"] >= 1, result
    assert "every row exactly once" in done.stderr
    assert list(tenure_client.scan_iter(match="tenure:demo:*")) == []  # it cleaned up


@pytest.mark.slow
def test_plain_demo_runs_every_demo_on_one_server() -> None:
    done = run("demo", "--seconds", "0.3", "--rows", "1/1", "--modes", "lock",
               "--table-rows", "20000", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"market", "ingest"}
    assert report["market"][0]["consistent"] and report["ingest"]["ok"]
    assert done.stderr.count("started ") == 1  # one server for both


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _server_clients(pids: list[int]) -> int:
    """How many clients the server among ``pids`` has (0 while it does not answer)."""
    for pid in pids:
        # A server shows its address in its process title: "valkey-server 127.0.0.1:PORT".
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
        if title and title[0].endswith(b"-server"):
            host, _, port = title[1].decode().rpartition(":")
            with redis.Redis(host, int(port), socket_timeout=2) as server:
                return len(server.client_list()) - 1  # not this one
    return 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "children"),
    [
        (("market", "--seconds", "30", "--rows", "1/1", "--modes", "lock"), 3),  # server, 2 traders
        (("ingest", "--table-rows", "2000000", "--no-kills"), 5),  # the server and 4 workers
    ],
)
def test_killing_the_demo_leaves_no_process(args: tuple[str, ...], children: int) -> None:
    demo = subprocess.Popen(
        [*TENURE, "demo", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: len(_children(demo.pid)) >= children, 60, "the demo's processes")
        wait_for(  # they work: the helpers connected to the demo's server
            lambda: _server_clients(_children(demo.pid)) >= children - 1,
            60,
            "the demo's helpers connected",
        )
        processes = _children(demo.pid)
        demo.send_signal(signal.SIGKILL)
        demo.wait(timeout=10)
        # A helper still importing when the demo dies (seconds on a busy machine)
        # sees its parent gone as soon as it starts (die_with_parent), then exits.
        for pid in processes:
            assert wait_dead(pid, 30.0), f"process {pid} outlived the killed demo"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


@pytest.mark.slow
@pytest.mark.parametrize("when", ["starting", "trading"])
def test_ctrl_c_stops_the_demo_and_everything_it_started(when: str) -> None:
    demo = subprocess.Popen(
        [*TENURE, "demo", "market", "--seconds", "20", "--rows", "2/2", "--modes", "lock"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal would make it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert _read_line(demo, 30).startswith("tenure demo: about ")  # said up front
        assert "started" in _read_line(demo, 30)
        # The server and four traders, just started (importing) or trading.
        wait_for(lambda: len(_children(demo.pid)) >= 5, 30, "the demo's traders")
        if when == "trading":  # they connected to the demo's server
            wait_for(lambda: _server_clients(_children(demo.pid)) >= 4, 30, "the traders at work")
        processes = _children(demo.pid)
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C does
        _, errors = demo.communicate(timeout=15)
        assert demo.returncode == 130
        assert "Traceback" not in errors  # the traders leave Ctrl-C to the demo
        for pid in processes:
            assert wait_dead(pid, 5.0), f"process {pid} outlived Ctrl-C"
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()


@pytest.fixture
def tenure_server_url(tenure_client: redis.Redis) -> str:
    kwargs = tenure_client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}"


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, "no output in time"
    return process.stdout.readline()


def test_server_command_runs_until_interrupted() -> None:
    process = subprocess.Popen([*TENURE, "server"], stdout=subprocess.PIPE, text=True)
    try:
        first = _read_line(process, 20)
        match = re.search(r"\(pid (\d+)\) at (redis://\S+)", first)
        assert match, first
        pid, url = int(match.group(1)), match.group(2)
        with redis.Redis.from_url(url) as client:
            assert client.ping()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        assert wait_dead(pid, 2.0)
    finally:
        if process.poll() is None:
            process.kill()
        if process.stdout is not None:
            process.stdout.close()


PLUGIN_TEST = """
    import os, signal

    def test_hold_a_server(tenure_server, tenure_client):
        tenure_client.set("k", "v")
        with open(os.environ["PID_FILE"], "w") as out:
            out.write(str(tenure_server.pid))
        signal.pause()  # until the run is killed
"""


@pytest.mark.slow
def test_killing_a_test_run_leaves_no_server(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(PLUGIN_TEST))
    pid_file = tmp_path / "pid"
    env = {**os.environ, "PID_FILE": str(pid_file)}
    run_ = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(  # or the run ended early
            lambda: run_.poll() is not None or (pid_file.exists() and bool(pid_file.read_text())),
            30,
            "the plugin starting a server",
        )
        assert run_.poll() is None, "the user's test run ended early"
        server_pid = int(pid_file.read_text())
        run_.send_signal(signal.SIGKILL)
        run_.wait(timeout=10)
        assert wait_dead(server_pid, 2.0), "a killed test run left its server behind"
    finally:
        if run_.poll() is None:
            run_.kill()


def test_inspect_names_what_is_wrong_and_watches_in_json_lines(tenure_server_url: str) -> None:
    cluster = run("inspect", "--cluster", "--url", tenure_server_url)
    assert cluster.returncode == 2 and cluster.stderr.count("\n") == 1, cluster.stderr
    assert cluster.stderr.startswith("tenure: inspect: --cluster: cannot use ")
    from_env = subprocess.run(
        [*TENURE, "inspect"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "REDIS_URL": "garbage"},
    )
    assert from_env.returncode == 2
    assert from_env.stderr.startswith("tenure: inspect: REDIS_URL: Redis URL must specify")
    watched = run("inspect", "--url", tenure_server_url, "--json", "--watch", "0.1", "--count", "2")
    assert watched.returncode == 0, watched.stderr
    rounds = watched.stdout.splitlines()
    assert len(rounds) == 2 and all(isinstance(json.loads(line), list) for line in rounds)


def _working_under(folder: Path) -> list[int]:
    """The processes whose working directory is under ``folder`` (servers started there)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd").startswith(f"{folder}/"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_demo_ingest_stopped_with_sigterm_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGTERM mid-ingestion: exit 143, the server stopped, the workers gone, the table's
    folder and the server's folder removed, its port's lock file too: the demo's
    temporary directory is empty."""
    demo = subprocess.Popen(
        [*TENURE, "demo", "ingest", "--table-rows", "300000"],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: any(tmp_path.glob("*/tenure-demo-ingest-*/events.sqlite")), 60, "the table"
        )
        wait_for(lambda: len(_working_under(tmp_path)) >= 1, 30, "the server running")
        demo.send_signal(signal.SIGTERM)
        _, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 143, err
    assert "Traceback" not in err
    wait_for(lambda: not _working_under(tmp_path), 10, "every process of the demo gone")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
