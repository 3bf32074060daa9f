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
:class:`ServerProcess` (here: the port, the start's retries, restart and
stop) composes a server's settings and command line (``_process_config``),
its folder (``_process_folder``) and its child process, launched, awaited
until ready and signalled (``_process_child``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio

from tenure._core.exceptions import EmbeddedServerError, ServerStartError
from tenure.server._binaries import Engine
from tenure.server._commands import execute, no_retry, parse_info, raw_reply
from tenure.server._lifecycle import Lifecycle
from tenure.server._logs import TAIL_LINES, notable
from tenure.server._ports import HOST, release_port, reserve_port
from tenure.server._process_child import AddressInUseError, ServerChild
from tenure.server._process_config import ServerSettings
from tenure.server._process_folder import ServerFolder
from tenure.server._registry import register, unregister

__all__ = ["ServerProcess", "given_or_private"]

_PORT_ATTEMPTS = 8


class _Port:
    """A server's port: 0 on a unix socket, the one asked for, or one reserved (and freed) here.

    Chosen at a start and kept across restarts until the stop releases it.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self.number: int | None = None
        self.auto = False  # reserved here: freed by release(), and another tried on a lost race

    def attempts(self) -> int:
        """How many ports a start may try: several when it picks them itself."""
        auto = self.number is None and self._settings.requested_port is None
        return _PORT_ATTEMPTS if auto else 1

    def choose(self) -> None:
        """Choose the port, unless it is chosen already."""
        if self.number is not None:
            return
        if self._settings.unix:
            self.number = 0
        elif self._settings.requested_port is not None:
            self.number = self._settings.requested_port
        else:
            self.number = reserve_port(self._settings.cluster_bus)
            self.auto = True

    def release(self) -> None:
        """Forget the port, freeing it if it was reserved here."""
        if self.auto:
            release_port(self.number)
            self.auto = False
        self.number = None


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
    thread-safe. Servers are stopped at interpreter exit and die with their
    parent process even on ``kill -9`` (Linux: ``PR_SET_PDEATHSIG``); each runs
    in a session of its own, so a Ctrl-C reaches Python, which stops them.
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
        self._settings = ServerSettings.checked(
            engine,
            port=port,
            unix_socket=unix_socket,
            directory=directory,
            appendonly=appendonly,
            extra_args=extra_args,
            name=name,
            startup_timeout=startup_timeout,
            replicaof=replicaof,
            config=config,
            env=env,
        )
        self.startup_timeout = startup_timeout
        self._folder = ServerFolder(name, self._settings.requested_dir, unix_socket)
        self._child = ServerChild(self)
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
        self._ports = _Port(self._settings)
        self._stopped = False

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """The label given at construction (``"server"``, ``"primary"``, ...)."""
        return self._settings.name

    @property
    def engine(self) -> Engine:
        """The server binary this process runs."""
        return self._settings.engine

    @property
    def pid(self) -> int | None:
        """PID of the server while it runs (also while paused), else ``None``."""
        return self._child.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive (a paused process is alive)."""
        return self.pid is not None

    @property
    def paused(self) -> bool:
        """Whether the process is stopped by :meth:`pause` (SIGSTOP)."""
        return self._child.paused and self.running

    @property
    def host(self) -> str:
        """The loopback address servers bind to: ``"127.0.0.1"``."""
        return HOST

    @property
    def port(self) -> int:
        """The TCP port; 0 for a unix-socket-only server.

        Raises :class:`~tenure.EmbeddedServerError` before the first start.
        """
        port = self._ports.number
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
        return self._folder.socket_path()

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
        return self._folder.path

    @property
    def log_path(self) -> str | None:
        """The server's log file, once started."""
        return self._folder.log_path()

    @property
    def replicaof(self) -> tuple[str, int] | None:
        """``(host, port)`` of the primary this server replicates at start, if any."""
        return self._settings.replicaof

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
            if self._child.popen is not None:
                self._child.popen.wait()
            fresh = self._folder.path is None
            self._stopped = False
            self._folder.prepare(self._settings.config)
            deadline = time.monotonic() + self.startup_timeout
            attempts = self._ports.attempts()
            try:
                for attempt in range(attempts):
                    self._ports.choose()
                    try:
                        self._launch()
                        self._wait_ready(deadline)
                        break
                    except AddressInUseError as exc:
                        self._halt(1.0)
                        if attempt + 1 < attempts and self._ports.auto:
                            self._ports.release()  # lost a race for it: another port
                            continue
                        raise self._port_in_use(exc) from None
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
        if self._child.popen is None:
            raise EmbeddedServerError(f"{self!r} has not been started")
        limit = self.startup_timeout if timeout is None else timeout
        try:
            self._wait_ready(time.monotonic() + limit)
        except AddressInUseError as exc:
            raise self._port_in_use(exc) from None

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
            self._child.kill()

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: it keeps its connections but answers nothing."""
        with self._lock:
            self._child.pause(self._require_pid())

    def resume(self) -> None:
        """Thaw a server frozen by :meth:`pause` (SIGCONT)."""
        with self._lock:
            self._child.resume(self._require_pid())

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines the server wrote (console output, then log) this run."""
        directory = self._folder.path
        if directory is None:
            return ""
        return self._child.log_tail(directory, lines)

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

    def _port_in_use(self, exc: AddressInUseError) -> ServerStartError:
        return ServerStartError(
            f"port {self._ports.number} on {self.host} is in use by another process: give "
            f"another port, or none to take a free one (server {self.name!r})\n"
            f"what the server said: {notable(str(exc))}\nlast lines of its log:\n{exc}"
        )

    def _launch(self) -> None:
        directory, port = self._folder.path, self._ports.number
        assert directory is not None and port is not None
        args = self._settings.command(port, self._folder)
        self._child.launch(args, directory, self._settings.env, mark=self._folder.owned)
        self._owner_pid = os.getpid()

    def _wait_ready(self, deadline: float) -> None:
        probe = self._admin_client(timeout=0.5)
        self._child.wait_ready(probe, deadline, self.log_tail, self.startup_timeout)

    def _halt(self, timeout: float) -> None:
        """Stop the process (graceful, then SIGKILL after ``timeout``) and reap it."""
        self._child.halt(timeout, None if self._ports.number is None else self._admin_client)

    def _cleanup(self) -> None:
        self._ports.release()
        self._folder.remove()

    def _set_replicaof(self, primary: tuple[str, int] | None) -> None:
        self._settings.replicaof = primary

    def _set_config(self, config: str | None) -> None:
        self._settings.config = config

    def __repr__(self) -> str:
        popen, port = self._child.popen, self._ports.number
        if port is None:
            where = "no address"
        elif self._settings.unix:
            where = self.unix_socket_path or "unix socket"
        else:
            where = f"{HOST}:{port}"
        state = self._child.state(self._stopped)
        pid = f" pid={popen.pid}" if popen is not None and state in ("running", "paused") else ""
        return f"<ServerProcess {self.name!r} {self.engine} {where}{pid} {state}>"


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
