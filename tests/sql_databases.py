"""Private PostgreSQL and MariaDB servers for the SQL source tests, from Debian's packages.

Each server runs in a fresh temporary folder, listens on 127.0.0.1 only, on
a free port, and is stopped by its PID (the folder removed) when the test
session ends, and killed by the kernel if the test run dies first
(``PR_SET_PDEATHSIG``). PostgreSQL refuses to run as root: as root it runs
as ``nobody``. Missing binaries skip the tests that need them, naming the
package to install, unless ``TENURE_REQUIRE_SQL=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from tenure.server._spawner import PR_SET_PDEATHSIG, PRCTL
from tests.conftest import wait_for

__all__ = ["SqlServer", "mariadb", "postgresql", "require"]

DATABASE = "tenure_test"
START_TIMEOUT = 60.0


def require(binary: str | None, package: str) -> str:
    """``binary``, or skip (fail with ``TENURE_REQUIRE_SQL=1``) naming the Debian package."""
    if binary:
        return binary
    message = f"needs {package} (apt-get install -y {package})"
    if os.environ.get("TENURE_REQUIRE_SQL") == "1":
        pytest.fail(f"TENURE_REQUIRE_SQL=1 and this test {message}")
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_us() -> None:  # runs in the child between fork and exec
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class SqlServer:
    """One running database server: its SQLAlchemy URL, its PID, its folder."""

    def __init__(
        self,
        name: str,
        folder: Path,
        command: Sequence[str],
        url: str,
        connect: Callable[[], Any],
        stop_signal: int,
        user: str | None = None,
    ) -> None:
        self.name, self.folder, self.url = name, folder, url
        self._stop_signal = stop_signal
        self._log = folder / "server.log"
        self._command, self._connect, self._user = list(command), connect, user
        self._start()

    def _start(self) -> None:
        with self._log.open("ab") as log:
            self.process = subprocess.Popen(
                self._command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_us,
                user=self._user,
                group=None if self._user is None else pwd.getpwnam(self._user).pw_gid,
                extra_groups=None if self._user is None else [],
                start_new_session=True,  # out of reach of the terminal's Ctrl-C
            )
        self._wait_ready(self._connect)

    def kill(self) -> None:
        """Kill the server with SIGKILL, by its PID, and its children (a crash: its folder stays).

        PostgreSQL's backends are children of its postmaster: left alive, they would
        serve the connections they have a moment longer.
        """
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            children = []
        self.process.send_signal(signal.SIGKILL)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        self.process.wait()

    def restart(self) -> None:
        """Start the server again on its folder and port (after :meth:`kill`: it recovers).

        PostgreSQL refuses to start while a killed server's backends still hold
        its shared memory; they exit on their own within moments, so a start
        that exits at once is tried again.
        """
        assert self.process.poll() is not None, "restart() after kill() or a crash"

        def started() -> bool:
            try:
                self._start()
            except RuntimeError as exc:
                if "exited at start" not in str(exc):
                    raise
                return False
            return True

        wait_for(started, START_TIMEOUT, f"{self.name} restarted")

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def _wait_ready(self, connect: Callable[[], Any]) -> None:
        errors: list[Exception] = []

        def ready() -> bool:  # it answers, or it exited
            if self.process.poll() is not None:
                return True
            try:
                connect()
            except Exception as exc:
                errors[:] = [exc]
                raise
            return True

        try:
            wait_for(ready, START_TIMEOUT, f"{self.name} ready")
        except AssertionError as exc:
            self.stop()
            last = errors[0] if errors else exc
            raise RuntimeError(
                f"{self.name} not ready in {START_TIMEOUT:.0f} s ({last}):\n{self.log_tail()}"
            ) from last
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        try:
            text = self._log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server by its PID (killed if it lingers) and remove its folder."""
        if self.process.poll() is None:
            self.process.send_signal(self._stop_signal)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _run(command: Sequence[str], *, user: str | None = None, cwd: Path | None = None) -> None:
    done = subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        user=user,
        group=None if user is None else pwd.getpwnam(user).pw_gid,
        extra_groups=None if user is None else [],
        cwd=cwd,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def _postgres_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=_version_key)
    if found:
        return str(Path(found[-1]).parent)
    postgres = shutil.which("postgres")
    return str(Path(postgres).resolve().parent) if postgres else None


def _version_key(path: str) -> tuple[int, ...]:
    parts = Path(path).parts
    version = parts[parts.index("postgresql") + 1] if "postgresql" in parts else "0"
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def postgresql() -> SqlServer:
    """A private PostgreSQL server with database ``tenure_test`` (user ``tenure``, trust)."""
    import psycopg

    bin_dir = require(_postgres_bin(), "postgresql")
    user = "nobody" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="tenure-postgresql-"))
    folder.chmod(0o755)  # the unprivileged server must reach its data and socket
    data, sockets = folder / "data", folder / "sockets"
    for path in (data, sockets):
        path.mkdir()
        if user is not None:
            os.chown(path, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    try:
        _run(
            [f"{bin_dir}/initdb", "-D", str(data), "-U", "tenure", "--auth=trust", "-E", "UTF8",
             "--no-sync", "--locale=C"],
            user=user,
            cwd=folder,
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    port = _free_port()

    def connect() -> None:
        with psycopg.connect(
            host="127.0.0.1", port=port, user="tenure", dbname="postgres", autocommit=True
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if exists.fetchone() is None:
                conn.execute(f"CREATE DATABASE {DATABASE}")

    try:
        return SqlServer(
            "postgresql",
            folder,
            [f"{bin_dir}/postgres", "-D", str(data), "-p", str(port), "-k", str(sockets),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            f"postgresql+psycopg://tenure@127.0.0.1:{port}/{DATABASE}",
            connect,
            signal.SIGINT,  # PostgreSQL's fast shutdown
            user=user,
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _mariadb_binaries() -> tuple[str, str] | None:
    server = shutil.which("mariadbd", path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", ""))
    server = server or shutil.which("mysqld", path="/usr/sbin:/usr/bin")
    install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    return (server, install) if server and install else None


def mariadb() -> SqlServer:
    """A private MariaDB server with database ``tenure_test`` (grant tables skipped)."""
    import pymysql  # type: ignore[import-untyped]

    found = _mariadb_binaries()
    server, install = require(found and found[0], "mariadb-server"), found and found[1]
    assert install is not None
    folder = Path(tempfile.mkdtemp(prefix="tenure-mariadb-"))
    data = folder / "data"
    # Its own temporary folder: two servers made at once (CI's two passes) must not
    # share /tmp's temporary tables (an install once failed on a vanished one).
    scratch = folder / "tmp"
    scratch.mkdir()
    root = ["--user=root"] if os.geteuid() == 0 else []
    try:
        _run([install, "--no-defaults", f"--datadir={data}", "--skip-test-db",
              "--auth-root-authentication-method=normal", f"--tmpdir={scratch}", *root],
             cwd=folder)  # fmt: skip
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    port = _free_port()

    def connect() -> None:
        conn = pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2)
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE} CHARACTER SET utf8mb4")
        finally:
            conn.close()

    try:
        return SqlServer(
            "mariadb",
            folder,
            [server, "--no-defaults", f"--datadir={data}", f"--socket={folder / 'server.sock'}",
             f"--port={port}", "--bind-address=127.0.0.1", f"--pid-file={folder / 'server.pid'}",
             f"--tmpdir={scratch}",
             "--skip-grant-tables", "--skip-name-resolve", "--skip-log-bin",
             "--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=0", *root],
            f"mysql+pymysql://root@127.0.0.1:{port}/{DATABASE}?charset=utf8mb4",
            connect,
            signal.SIGTERM,
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
