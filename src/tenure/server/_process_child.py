"""A private server's child process: launched, awaited until ready, signalled, reaped.

:class:`ServerChild` runs one server binary at a time for a
:class:`~tenure.server.ServerProcess`: forked on the spawner thread (so it
dies with this process, see ``_spawner``), its console output appended to
``server.out``; ready once it answers PING *with its own PID*; stopped by
``SHUTDOWN NOSAVE NOW``, else SIGTERM, else SIGKILL, and always reaped;
frozen and thawed with SIGSTOP / SIGCONT. Only its own PID is signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

import redis

from tenure._core.exceptions import ServerStartError
from tenure.server._commands import answers_as, shutdown_now
from tenure.server._folders import note_server
from tenure.server._logs import OUT_NAME, log_offsets, notable, tail_since
from tenure.server._procfs import wait_state
from tenure.server._spawner import spawn

__all__ = ["AddressInUseError", "ServerChild"]


class AddressInUseError(Exception):
    """The server exited early because its port was taken (the message: its log's tail)."""


def _shutdown(admin: Callable[[float], redis.Redis] | None, timeout: float) -> bool:
    """Send SHUTDOWN NOSAVE NOW; ``True`` if the server took it."""
    if admin is None:
        return False
    try:
        client = admin(timeout)
    except Exception:
        return False
    try:
        return shutdown_now(client)
    finally:
        client.close()


class ServerChild:
    """The server process of ``owner`` (named in errors), once launched.

    Not thread-safe by itself: the owner calls it under its lock.
    """

    def __init__(self, owner: object) -> None:
        self._owner = owner
        self.popen: subprocess.Popen[bytes] | None = None
        self.paused = False  # stopped by pause() (SIGSTOP), as far as we know
        self._log_offsets = (0, 0)

    @property
    def pid(self) -> int | None:
        """The PID while the process runs (also while paused), else ``None``."""
        popen = self.popen
        if popen is None or popen.poll() is not None:
            return None
        return popen.pid

    def launch(
        self, args: Sequence[str], directory: str, env: Mapping[str, str] | None, *, mark: bool
    ) -> None:
        """Run ``args`` in ``directory`` (``mark``: note its PID in the private folder's marker)."""
        self._log_offsets = log_offsets(directory)
        with open(os.path.join(directory, OUT_NAME), "ab") as out:
            try:
                self.popen = spawn(args, stdout=out, cwd=directory, env=env)
            except OSError as exc:
                raise ServerStartError(f"{self._owner!r}: cannot run {args[0]}: {exc}") from exc
        if mark:
            note_server(directory, self.popen.pid)
        self.paused = False

    def log_tail(self, directory: str, lines: int) -> str:
        """The last ``lines`` lines written in ``directory`` since the last launch."""
        return tail_since(directory, self._log_offsets, lines)

    def wait_ready(
        self, probe: redis.Redis, deadline: float, tail: Callable[[], str], limit: float
    ) -> None:
        """Poll with ``probe`` (closed after) until the server answers as itself.

        Raises :class:`AddressInUseError` if it exited because its port was
        taken, :class:`~tenure.ServerStartError` if it exited otherwise or
        ``deadline`` passed (``limit`` is the time allowed, for the message);
        ``tail`` gives the tail of its output for those.
        """
        popen = self.popen
        assert popen is not None
        try:
            while True:
                code = popen.poll()
                if code is not None:
                    text = tail()
                    if "Address already in use" in text:
                        raise AddressInUseError(text)
                    raise ServerStartError(
                        f"{self._owner!r} exited with code {code} while starting: "
                        f"{notable(text)}\nlast lines of its output:\n{text}"
                    )
                # Another server may hold the port while ours fails to bind.
                if answers_as(probe, popen.pid):
                    return
                if time.monotonic() >= deadline:
                    text = tail()
                    raise ServerStartError(
                        f"{self._owner!r} did not answer PING within {limit:g} s: "
                        f"{notable(text)}\nlast lines of its output:\n{text}"
                    )
                time.sleep(0.01)
        finally:
            probe.close()

    def halt(self, timeout: float, admin: Callable[[float], redis.Redis] | None) -> None:
        """Stop the process (graceful, then SIGKILL after ``timeout``) and reap it.

        The server is sent ``SHUTDOWN NOSAVE NOW`` on a client of
        ``admin(seconds)`` (a server with no address yet: ``None``), and
        SIGTERM if it did not take it. A paused server is thawed first.
        """
        popen = self.popen
        if popen is None:
            return
        if popen.poll() is None:
            if self.paused:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGCONT)
                self.paused = False
            if not _shutdown(admin, min(1.0, max(timeout, 0.1))):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGKILL)
                popen.wait()
        else:
            popen.wait()
        self.paused = False

    def kill(self) -> None:
        """SIGKILL (a crash) and reap, if it runs."""
        popen = self.popen
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(popen.pid, signal.SIGKILL)
            popen.wait()
        self.paused = False

    def pause(self, pid: int) -> None:
        """Freeze the running process ``pid`` (SIGSTOP) and wait until it is stopped."""
        os.kill(pid, signal.SIGSTOP)
        self.paused = True
        wait_state(pid, lambda state: state in ("T", "t"))

    def resume(self, pid: int) -> None:
        """Thaw the process ``pid`` (SIGCONT) and wait until it runs."""
        os.kill(pid, signal.SIGCONT)
        self.paused = False
        wait_state(pid, lambda state: state not in ("T", "t"))

    def state(self, stopped: bool) -> str:
        """For a repr: not started, stopped (``stopped``), paused, running or exited."""
        popen = self.popen
        if popen is None:
            return "not started"
        if stopped:
            return "stopped"
        if popen.poll() is None:
            return "paused" if self.paused else "running"
        return f"exited ({popen.returncode})"
