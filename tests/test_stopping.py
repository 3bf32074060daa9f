"""Stopping a long command, however it is stopped, leaves nothing behind.

Each of ``tenure demo``, ``tenure demo ingest``, ``tenure bench locks``,
``tenure ingest run`` and ``tenure server`` is started with a temporary
directory of its own, caught at work (its server, workers or helpers
running), then stopped by Ctrl-C (SIGINT to its process group, as a terminal
sends it), by SIGTERM, or killed with ``kill -9``. Afterwards every process
it had started is gone and its temporary directory is empty: no server, no
worker, no folder, no file (the port reservations included).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest
import redis

from tests.conftest import wait_for
from tests.test_ingest import make_table

pytestmark = [pytest.mark.engine_blind, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TENURE = [sys.executable, "-m", "tenure"]

# How each stop ends the command: its exit status (None: killed, not asked).
EXPECTED = {
    signal.SIGINT: 130,
    signal.SIGTERM: 143,
    signal.SIGKILL: -signal.SIGKILL,
}


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return []


def _named(processes: list[psutil.Process], part: str) -> int:
    found = 0
    for process in processes:
        try:
            found += part in " ".join(process.cmdline())
        except psutil.Error:
            pass
    return found


def _server_url(processes: list[psutil.Process]) -> str | None:
    for process in processes:
        try:  # a server's process title: "valkey-server 127.0.0.1:PORT"
            title = " ".join(process.cmdline()).split()
        except psutil.Error:
            continue
        if len(title) > 1 and title[0].endswith("-server") and ":" in title[1]:
            return f"redis://{title[1]}"
    return None


def _clients(processes: list[psutil.Process]) -> int:
    url = _server_url(processes)
    if url is None:
        return 0
    with redis.Redis.from_url(url, socket_timeout=2) as server:
        return len(server.client_list()) - 1


# command -> (arguments, "at work" check on its descendants)
Ready = Callable[[list[psutil.Process]], bool]
COMMANDS: dict[str, tuple[tuple[str, ...], Ready]] = {
    "demo": (
        ("demo", "--seconds", "30", "--rows", "1/1", "--modes", "lock"),
        lambda found: _clients(found) >= 2,  # the market's two traders at work
    ),
    "demo ingest": (
        ("demo", "ingest", "--table-rows", "3000000", "--no-kills"),
        lambda found: _named(found, "multiprocessing") >= 4 and _clients(found) >= 4,
    ),
    "bench locks": (
        (
            "bench",
            "locks",
            "--parts",
            "contended",
            "--only",
            "tenure,redis-py",
            "--seconds",
            "30",
            "--rounds",
            "1",
        ),
        lambda found: _named(found, "multiprocessing.spawn") >= 4 and _clients(found) >= 4,
    ),
    "server": (("server",), lambda found: _server_url(found) is not None and _clients(found) >= 0),
}


@pytest.mark.parametrize("how", list(EXPECTED), ids=lambda how: how.name)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_stopped_command_leaves_nothing_behind(
    command: str, how: signal.Signals, tmp_path: Path
) -> None:
    arguments, ready = COMMANDS[command]
    expected = EXPECTED[how]
    if command == "server" and how != signal.SIGKILL:
        expected = 0  # the server's normal end: Ctrl-C or SIGTERM
    _stop_at_work([*TENURE, *arguments], ready, how, expected, tmp_path)


@pytest.mark.parametrize("command", ["demo ingest", "bench locks"])
def test_a_second_signal_does_not_cut_the_clean_up_short(command: str, tmp_path: Path) -> None:
    # Ctrl-C, then SIGTERM while it cleans up (an impatient user, a supervisor's stop)
    arguments, ready = COMMANDS[command]
    _stop_at_work([*TENURE, *arguments], ready, signal.SIGINT, 130, tmp_path, then=signal.SIGTERM)


@pytest.mark.parametrize("how", list(EXPECTED), ids=lambda how: how.name)
def test_a_stopped_ingestion_run_leaves_nothing_behind(
    how: signal.Signals, tmp_path: Path, tenure_server_url: str
) -> None:
    database = tmp_path / "table" / "events.sqlite"
    database.parent.mkdir()
    make_table(database, 400_000)
    arguments = [
        *TENURE, "ingest", "run", f"sqlite:///{database}", "--table", "events", "--key", "id",
        "--chunk-size", "20000", "--workers", "2", "--url", tenure_server_url,
        "--name", f"stopped-{how.name}",
    ]  # fmt: skip
    ready: Ready = lambda found: _named(found, "multiprocessing.spawn") >= 2  # noqa: E731
    _stop_at_work(arguments, ready, how, EXPECTED[how], tmp_path / "run")


@pytest.fixture
def tenure_server_url(tenure_client: redis.Redis) -> str:
    kwargs = tenure_client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}"


def _stop_at_work(
    arguments: list[str],
    ready: Ready,
    how: signal.Signals,
    expected: int,
    folder: Path,
    then: signal.Signals | None = None,
) -> None:
    folder.mkdir(exist_ok=True)
    process = subprocess.Popen(
        arguments,
        cwd=ROOT,  # (where tenure bench finds the benchmarks)
        env={**os.environ, "TMPDIR": str(folder)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal makes one
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for(lambda: ready(_descendants(process.pid)), 90, f"{arguments[3:5]} at work")
        started = _descendants(process.pid)
        if how == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
        else:
            process.send_signal(how)
        if then is not None:
            time.sleep(0.3)  # the clean-up under way
            process.send_signal(then)
        _, errors = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == expected, errors
    if how != signal.SIGKILL:  # (killed, it says nothing; its helpers may)
        assert "Traceback" not in errors, errors
        assert "leaked" not in errors, errors  # multiprocessing's resource tracker
    wait_for(lambda: all(_gone(child) for child in started), 30, "every process it started gone")
    wait_for(lambda: not any(folder.iterdir()), 20, "the temporary directory emptied")


def _gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_sigterm_at_any_moment_of_an_ingestion_run_ends_it_cleanly(
    tmp_path: Path, tenure_server_url: str
) -> None:
    # Once it runs (its first output; before, Python itself is still starting, and a
    # signal's default action ends it having made nothing): mid-run and as it
    # finishes, exit 143 with one line saying where the job stands (or 0 if it was
    # done first), never killed by the signal itself, nothing leaked.
    database = tmp_path / "events.sqlite"
    make_table(database, 30_000)
    for number, delay in enumerate((0.0, 0.2, 0.4, 0.7, 1.0, 1.4, 1.8, 2.4)):
        run = subprocess.Popen(
            [*TENURE, "ingest", "run", f"sqlite:///{database}", "--table", "events",
             "--key", "id", "--chunk-size", "3000", "--workers", "2",
             "--url", tenure_server_url, "--name", f"late-{number}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert run.stderr is not None
        first = run.stderr.read(1)  # the progress line starts: the run is under way
        time.sleep(delay)
        run.send_signal(signal.SIGTERM)
        out, errors = run.communicate(timeout=60)
        errors = first + errors
        assert run.returncode in (0, 143), (delay, run.returncode, errors)
        assert "Traceback" not in errors and "leaked" not in errors, errors
        if run.returncode == 0:
            assert "done, 30,000 rows" in out
        elif "stopped" in errors:  # (a signal before the plan: nothing to say yet)
            last = errors.strip().splitlines()[-1]
            assert "stopped as it finished: done, 30,000 rows" in last or (
                "run the same command again to resume" in last
            ), last
