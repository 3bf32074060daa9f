"""One private server process: start, wait until ready, stop, crash, pause, restart.

Every server is a child of this Python process, bound to loopback (or a unix
socket only), with its files in a private temporary folder. Servers cannot
outlive their parent:

* On Linux each child gets ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel
  kills it when the parent dies, even by ``kill -9``. The kernel sends that
  signal when the *thread* that forked the child exits, so every fork happens
  on one long-lived daemon "spawner" thread: starting a server from a
  short-lived thread (a thread pool, ``asyncio.to_thread``) is still safe.
* An :mod:`atexit` hook stops every server this process started and that is
  still running.
* Children run in their own session (``start_new_session=True``): a Ctrl-C in
  the terminal reaches Python, which then stops the servers in order, instead
  of killing them under their clients' feet.

Only the PIDs started here are ever signalled. The forking lives in
``_spawner``, the exit hook in ``_registry``, the ports in ``_ports``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio

from tenure._core.exceptions import ArgumentError, EmbeddedServerError, ServerStartError
from tenure.server._binaries import Engine, find_engine
from tenure.server._command_line import server_command
from tenure.server._commands import (
    answers_as,
    execute,
    no_retry,
    parse_info,
    raw_reply,
    shutdown_now,
)
from tenure.server._folders import make_folder, note_server
from tenure.server._lifecycle import Lifecycle
from tenure.server._logs import LOG_NAME, OUT_NAME, TAIL_LINES, log_offsets, notable, tail_since
from tenure.server._ports import HOST, release_port, reserve_port
from tenure.server._procfs import wait_state
from tenure.server._registry import register, unregister
from tenure.server._spawner import spawn

__all__ = ["ServerProcess", "given_or_private"]

_SOCKET_NAME = "server.sock"
_CONFIG_NAME = "server.conf"
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux
_PORT_ATTEMPTS = 8


class _AddressInUseError(Exception):
    """The server exited early because its port was taken."""


class ServerProcess(Lifecycle):
    """One private Redis or Valkey server process, bound to loopback.

    Nothing runs until :meth:`start` (or ``with`` / ``async with``)::

        with ServerProcess() as server:
            client = server.client(decode_responses=True)
            client.set("k", "v")

    ``engine`` is an :class:`Engine`, an engine name, or ``None`` for
    :func:`find_engine`'s default. ``port=None`` picks a free port (and retries
    with another when the server loses a race for it); ``unix_socket=True``
    listens on ``<directory>/server.sock`` only (mode 700, no TCP; ``port`` is
    then 0). ``directory`` holds the data, the log and the socket; by default
    it is a private temporary folder removed by :meth:`stop` (a directory the
    caller passed is kept). ``appendonly=True`` turns the AOF on so data
    survives :meth:`restart` and :meth:`kill`. ``replicaof`` makes the server a
    replica of ``(host, port)``. ``config`` is the text of a configuration file
    written to ``<directory>/server.conf`` at the first start and passed to the
    server (which may rewrite it, as Sentinel does); command-line options
    override it. ``extra_args`` are appended to the command line last, so they
    override tenure's defaults. ``env`` adds variables to the server's
    environment (``LD_PRELOAD`` of libfaketime, say, to move its clock).
    ``name`` labels the server in ``repr`` and errors.

    The command line always has ``--bind 127.0.0.1 --protected-mode yes
    --daemonize no --save ""`` (no RDB snapshots), ``--enable-debug-command
    local`` (DEBUG from loopback only, for fault injection), and its own
    ``--dir`` and ``--logfile``; the console output goes to ``server.out`` in
    the same folder. :meth:`start` waits until the server answers PING *and*
    reports its own PID (so a stranger holding the port is never mistaken for
    it); an early exit raises :class:`~tenure.ServerStartError` ending with
    the tail of the server's output.

    :meth:`stop` sends ``SHUTDOWN NOSAVE NOW`` (an AOF is still flushed; no
    waiting for lagging replicas), falls back to SIGTERM, kills with SIGKILL
    after ``timeout``, reaps the child and removes the temporary folder.
    :meth:`kill`, :meth:`pause` and :meth:`resume` inject faults. Methods are
    thread-safe; servers are stopped at interpreter exit and die with the
    parent process (see the module docstring of ``tenure.server._process``).
    """

    def __init__(
        self,
        engine: Engine | str | None = None,
        *,
        port: int | None = None,
        unix_socket: bool = False,
        directory: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        name: str = "server",
        startup_timeout: float = 10.0,
        replicaof: tuple[str, int] | None = None,
        config: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ArgumentError("port", f"expected 1..65535 or None, got {port!r}")
        if port is not None and unix_socket:
            raise ArgumentError("port", "a unix_socket server listens on no TCP port")
        if isinstance(extra_args, (str, bytes)):
            raise ArgumentError("extra_args", "expected a sequence of strings, not one string")
        if not startup_timeout > 0:
            raise ArgumentError("startup_timeout", f"expected > 0, got {startup_timeout!r}")
        self._engine = engine if isinstance(engine, Engine) else find_engine(engine)
        self._requested_port = port
        self._unix = unix_socket
        self._requested_dir = os.path.abspath(os.fspath(directory)) if directory else None
        self._appendonly = appendonly
        self._extra_args = tuple(str(arg) for arg in extra_args)
        self._name = name
        self.startup_timeout = startup_timeout
        self._replicaof = replicaof
        self._config = config
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ArgumentError("env", "expected a mapping of str to str")
        self._env = dict(env) if env else None
        self._cluster_bus = any(
            arg == "--cluster-enabled" and value.lower() == "yes"
            for arg, value in zip(self._extra_args, self._extra_args[1:], strict=False)
        )

        self._lock = threading.RLock()
        self._popen: subprocess.Popen[bytes] | None = None
        self._owner_pid = os.getpid()
        self._dir: str | None = None
        self._owns_dir = False
        self._socket_dir: str | None = None
        self._port: int | None = None
        self._auto_port = False
        self._paused = False
        self._stopped = False
        self._log_offsets = (0, 0)

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """The label given at construction (``"server"``, ``"primary"``, ...)."""
        return self._name

    @property
    def engine(self) -> Engine:
        """The server binary this process runs."""
        return self._engine

    @property
    def pid(self) -> int | None:
        """PID of the server while it runs (also while paused), else ``None``."""
        popen = self._popen
        if popen is None or popen.poll() is not None:
            return None
        return popen.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive (a paused process is alive)."""
        return self.pid is not None

    @property
    def paused(self) -> bool:
        """Whether the process is stopped by :meth:`pause` (SIGSTOP)."""
        return self._paused and self.running

    @property
    def host(self) -> str:
        """The loopback address servers bind to: ``"127.0.0.1"``."""
        return HOST

    @property
    def port(self) -> int:
        """The TCP port; 0 for a unix-socket-only server.

        Raises :class:`~tenure.EmbeddedServerError` before the first start.
        """
        port = self._port
        if port is None:
            raise EmbeddedServerError(f"{self!r} has not been started: it has no port yet")
        return port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of a TCP server."""
        return (HOST, self.port)

    @property
    def unix_socket_path(self) -> str | None:
        """Path of the unix socket (``unix_socket=True``), else ``None``."""
        if not self._unix:
            return None
        folder = self._socket_dir or self._dir
        return None if folder is None else os.path.join(folder, _SOCKET_NAME)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` or ``unix:///<path>``."""
        path = self.unix_socket_path
        if path is not None:
            return f"unix://{path}"
        return f"redis://{HOST}:{self.port}"

    @property
    def directory(self) -> str | None:
        """The server's working folder (data, log, socket), once started."""
        return self._dir

    @property
    def log_path(self) -> str | None:
        """The server's log file, once started."""
        return None if self._dir is None else os.path.join(self._dir, LOG_NAME)

    @property
    def replicaof(self) -> tuple[str, int] | None:
        """``(host, port)`` of the primary this server replicates at start, if any."""
        return self._replicaof

    # ------------------------------------------------------------------ clients

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` connected to this server; ``kwargs`` go to its constructor."""
        path = self.unix_socket_path
        if path is not None:
            return redis.Redis(unix_socket_path=path, **kwargs)
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A new ``redis.asyncio.Redis`` for this server; ``kwargs`` go to its constructor."""
        path = self.unix_socket_path
        if path is not None:
            return redis.asyncio.Redis(unix_socket_path=path, **kwargs)
        return redis.asyncio.Redis(host=HOST, port=self.port, **kwargs)

    def info(self, section: str | None = None) -> dict[str, str]:
        """``INFO [section]`` as a flat dict of strings (``{"role": "master", ...}``)."""
        client = self._admin_client()
        try:
            text = execute(client, "INFO") if section is None else execute(client, "INFO", section)
        finally:
            client.close()
        return parse_info(str(text))

    def _admin_client(self, timeout: float = 2.0) -> redis.Redis:
        """A control client: decoded replies, raw INFO text, short timeouts, no retries."""
        client = self.client(
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=no_retry(),
        )
        client.set_response_callback("INFO", raw_reply)
        return client

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        with self._lock:
            self._check_owner()
            if self.running:
                return
            if self._popen is not None:
                self._popen.wait()
            fresh = self._dir is None
            self._stopped = False
            self._prepare_directory()
            deadline = time.monotonic() + self.startup_timeout
            attempts = _PORT_ATTEMPTS if self._port is None and self._requested_port is None else 1
            try:
                for attempt in range(attempts):
                    self._choose_port()
                    try:
                        self._launch()
                        self._wait_ready(deadline)
                        break
                    except _AddressInUseError as exc:
                        self._halt(1.0)
                        if attempt + 1 < attempts and self._auto_port:
                            release_port(self._port)
                            self._port = None
                            continue
                        raise ServerStartError(
                            f"{self!r}: port {self._port} is in use: {notable(str(exc))}\n"
                            f"last lines of its log:\n{exc}"
                        ) from None
            except BaseException:
                self._halt(1.0)
                if fresh:
                    self._cleanup()
                raise
            register(self)

    def _stop(self, timeout: float) -> None:
        with self._lock:
            if os.getpid() != self._owner_pid:
                return  # a forked child: the server belongs to the parent
            self._halt(timeout)
            self._cleanup()
            self._stopped = True
            unregister(self)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the server answers PING (``timeout`` defaults to ``startup_timeout``).

        Raises :class:`~tenure.ServerStartError` if the process exits or the
        time runs out; the message ends with the tail of the server's log.
        """
        if self._popen is None:
            raise EmbeddedServerError(f"{self!r} has not been started")
        limit = self.startup_timeout if timeout is None else timeout
        try:
            self._wait_ready(time.monotonic() + limit)
        except _AddressInUseError as exc:
            raise ServerStartError(
                f"{self!r}: port {self._port} is in use: {notable(str(exc))}\n"
                f"last lines of its log:\n{exc}"
            ) from None

    def restart(self, timeout: float = 5.0) -> ServerProcess:
        """Stop the server and start it again on the same port or socket and folder.

        With ``appendonly=True`` the data survives. Works after :meth:`kill`
        too (crash recovery). Waits until the server answers again.
        """
        with self._lock:
            self._check_owner()
            self._halt(timeout)
            self._start()
        return self

    def kill(self) -> None:
        """Kill the server with SIGKILL (a crash) and reap it; keep its folder and port.

        :meth:`start` or :meth:`restart` brings it back on the same port with
        the same folder; :meth:`stop` cleans up.
        """
        with self._lock:
            self._check_owner()
            popen = self._popen
            if popen is not None and popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGKILL)
                popen.wait()
            self._paused = False

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: it keeps its connections but answers nothing."""
        with self._lock:
            pid = self._require_pid()
            os.kill(pid, signal.SIGSTOP)
            self._paused = True
            wait_state(pid, lambda state: state in ("T", "t"))

    def resume(self) -> None:
        """Thaw a server frozen by :meth:`pause` (SIGCONT)."""
        with self._lock:
            pid = self._require_pid()
            os.kill(pid, signal.SIGCONT)
            self._paused = False
            wait_state(pid, lambda state: state not in ("T", "t"))

    # ------------------------------------------------------------------ internals

    def _check_owner(self) -> None:
        if os.getpid() != self._owner_pid:
            raise EmbeddedServerError(f"{self!r} was started by another process (pid changed)")

    def _require_pid(self) -> int:
        self._check_owner()
        pid = self.pid
        if pid is None:
            raise EmbeddedServerError(f"{self!r} is not running")
        return pid

    def _prepare_directory(self) -> None:
        if self._dir is None:
            if self._requested_dir is not None:
                os.makedirs(self._requested_dir, exist_ok=True)
                self._dir = self._requested_dir
                self._owns_dir = False
            else:
                self._dir = make_folder(self._name)
                self._owns_dir = True
        if self._unix:
            too_long = len(os.path.join(self._dir, _SOCKET_NAME)) > _MAX_SOCKET_PATH
            if too_long and self._socket_dir is None:
                self._socket_dir = make_folder("sock")
            path = self.unix_socket_path
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if self._config is not None:
            config_path = os.path.join(self._dir, _CONFIG_NAME)
            if not os.path.exists(config_path):
                with open(config_path, "w", encoding="utf-8") as file:
                    file.write(self._config)

    def _choose_port(self) -> None:
        if self._port is not None:
            return
        if self._unix:
            self._port = 0
        elif self._requested_port is not None:
            self._port = self._requested_port
        else:
            self._port = reserve_port(self._cluster_bus)
            self._auto_port = True

    def _command(self) -> list[str]:
        assert self._dir is not None
        assert self._port is not None
        config_path = None if self._config is None else os.path.join(self._dir, _CONFIG_NAME)
        return server_command(
            self._engine.server,
            port=self._port,
            directory=self._dir,
            log_path=os.path.join(self._dir, LOG_NAME),
            config_path=config_path,
            socket_path=self.unix_socket_path,
            appendonly=self._appendonly,
            replicaof=self._replicaof,
            extra_args=self._extra_args,
        )

    def _launch(self) -> None:
        assert self._dir is not None
        args = self._command()
        directory = self._dir
        self._log_offsets = log_offsets(directory)
        with open(os.path.join(directory, OUT_NAME), "ab") as out:
            try:
                self._popen = spawn(args, stdout=out, cwd=directory, env=self._env)
            except OSError as exc:
                raise ServerStartError(f"{self!r}: cannot run {args[0]}: {exc}") from exc
        if self._owns_dir:
            note_server(directory, self._popen.pid)
        self._owner_pid = os.getpid()
        self._paused = False

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines the server wrote (console output, then log) this run."""
        if self._dir is None:
            return ""
        return tail_since(self._dir, self._log_offsets, lines)

    def _wait_ready(self, deadline: float) -> None:
        popen = self._popen
        assert popen is not None
        probe = self._admin_client(timeout=0.5)
        try:
            while True:
                code = popen.poll()
                if code is not None:
                    tail = self.log_tail()
                    if "Address already in use" in tail:
                        raise _AddressInUseError(tail)
                    raise ServerStartError(
                        f"{self!r} exited with code {code} while starting: {notable(tail)}\n"
                        f"last lines of its output:\n{tail}"
                    )
                # Another server may hold the port while ours fails to bind.
                if answers_as(probe, popen.pid):
                    return
                if time.monotonic() >= deadline:
                    tail = self.log_tail()
                    raise ServerStartError(
                        f"{self!r} did not answer PING within {self.startup_timeout:g} s: "
                        f"{notable(tail)}\nlast lines of its output:\n{tail}"
                    )
                time.sleep(0.01)
        finally:
            probe.close()

    def _shutdown_command(self, timeout: float) -> bool:
        """Send SHUTDOWN NOSAVE NOW; ``True`` if the server took it."""
        if self._port is None:
            return False
        try:
            client = self._admin_client(timeout=timeout)
        except Exception:
            return False
        try:
            return shutdown_now(client)
        finally:
            client.close()

    def _halt(self, timeout: float) -> None:
        """Stop the process (graceful, then SIGKILL after ``timeout``) and reap it."""
        popen = self._popen
        if popen is None:
            return
        if popen.poll() is None:
            if self._paused:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(popen.pid, signal.SIGCONT)
                self._paused = False
            if not self._shutdown_command(min(1.0, max(timeout, 0.1))):
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
        self._paused = False

    def _cleanup(self) -> None:
        if self._auto_port:
            release_port(self._port)
            self._auto_port = False
        self._port = None
        if self._dir is not None and self._owns_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        elif self._dir is not None and self._unix:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._dir, _SOCKET_NAME))
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        self._dir = None
        self._socket_dir = None
        self._owns_dir = False

    def _set_replicaof(self, primary: tuple[str, int] | None) -> None:
        self._replicaof = primary

    def _set_config(self, config: str | None) -> None:
        self._config = config

    def __repr__(self) -> str:
        popen = self._popen
        if self._port is None:
            where = "no address"
        elif self._unix:
            where = self.unix_socket_path or "unix socket"
        else:
            where = f"{HOST}:{self._port}"
        if popen is None:
            state = "not started"
        elif self._stopped:
            state = "stopped"
        elif popen.poll() is None:
            state = "paused" if self._paused else "running"
        else:
            state = f"exited ({popen.returncode})"
        pid = f" pid={popen.pid}" if popen is not None and state in ("running", "paused") else ""
        return f"<ServerProcess {self._name!r} {self._engine} {where}{pid} {state}>"


@contextlib.contextmanager
def given_or_private(url: str | None, *, name: str) -> Iterator[tuple[str, ServerProcess | None]]:
    """Yield ``(url, None)`` for a given server, else a private one's URL and process.

    The private server (loopback, temporary folder) is stopped when the block ends.
    """
    if url:
        yield url, None
        return
    with ServerProcess(name=name) as server:
        yield server.url, server
