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

Only the PIDs started here are ever signalled.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any, TypeVar, cast

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure._exceptions import ArgumentError, EmbeddedServerError, ServerStartError
from tenure.server._binaries import Engine, find_engine
from tenure.server._folders import make_folder, note_server

__all__ = ["HOST", "ServerProcess", "given_or_private"]

#: The only address servers bind to.
HOST = "127.0.0.1"

_PR_SET_PDEATHSIG = 1
_LOG_NAME = "server.log"
_OUT_NAME = "server.out"
_SOCKET_NAME = "server.sock"
_CONFIG_NAME = "server.conf"
_TAIL_LINES = 25
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux
_CLUSTER_BUS_OFFSET = 10000
_PORT_ATTEMPTS = 8

_L = TypeVar("_L", bound="_Lifecycle")


class _Lifecycle:
    """Start/stop plus the sync and async context-manager protocol."""

    def start(self: _L) -> _L:
        """Start, wait until ready, and return ``self``; a no-op when already running."""
        self._start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and clean up; idempotent.

        Each process gets ``timeout`` seconds to exit after a graceful request
        before it is killed.
        """
        self._stop(timeout)

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self, timeout: float) -> None:
        raise NotImplementedError

    def __enter__(self: _L) -> _L:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self: _L) -> _L:
        try:
            await asyncio.to_thread(self._start)
        except asyncio.CancelledError:
            # The worker thread still runs start(); stop once it is done.
            threading.Thread(target=self.stop, name="tenure-server-stop", daemon=True).start()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self._stop, 5.0)


# --------------------------------------------------------------------------- helpers


def execute(client: redis.Redis, *args: Any) -> Any:
    """Run a raw command on a sync client (redis-py's ``execute_command`` is untyped)."""
    run: Callable[..., Any] = client.execute_command
    return run(*args)


def parse_info(text: str) -> dict[str, str]:
    """Parse ``INFO`` / ``CLUSTER INFO`` text into a flat ``{field: value}`` dict."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _raw_reply(response: Any, **options: Any) -> Any:
    return response


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return cast("Callable[..., int]", prctl)


_PRCTL = _load_prctl()
_SIGKILL = int(signal.SIGKILL)


def _make_preexec(parent_pid: int) -> Callable[[], None] | None:
    prctl = _PRCTL
    if prctl is None:
        return None

    def preexec() -> None:  # runs in the child between fork and exec: keep it tiny
        prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """One long-lived daemon thread that forks every server.

    ``PR_SET_PDEATHSIG`` fires when the forking *thread* exits, so forking from
    a thread that lives as long as the process makes it fire only when the
    process dies.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, job: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="tenure-server-spawner", daemon=True
                )
                self._thread.start()
            thread = self._thread
        if threading.current_thread() is thread:
            return job()
        future: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((job, future))
        return future.result()

    def _loop(self) -> None:
        while True:
            job, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:
                future.set_exception(exc)


_SPAWNER = _Spawner()

# Servers started by this process that may still need stopping or cleaning up.
_LIVE: dict[int, ServerProcess] = {}
_LIVE_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False

# Ports handed out by this process and not yet released (avoids handing one out twice).
_RESERVED_PORTS: set[int] = set()
_PORTS_LOCK = threading.Lock()


def _register(process: ServerProcess) -> None:
    global _ATEXIT_REGISTERED
    with _LIVE_LOCK:
        _LIVE[id(process)] = process
        if not _ATEXIT_REGISTERED:
            atexit.register(_stop_all_at_exit)
            _ATEXIT_REGISTERED = True


def _unregister(process: ServerProcess) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(id(process), None)


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        processes = list(_LIVE.values())
    for process in reversed(processes):
        with contextlib.suppress(Exception):
            process.stop(timeout=2.0)


def _after_fork_in_child() -> None:
    # A forked child owns none of its parent's servers: never stop them at its exit.
    global _SPAWNER, _LIVE_LOCK, _PORTS_LOCK
    _LIVE.clear()
    _LIVE_LOCK = threading.Lock()
    _PORTS_LOCK = threading.Lock()
    _SPAWNER = _Spawner()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _os_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _reserve_port(cluster_bus: bool) -> int:
    """A free loopback port (and free ``port + 10000`` for a cluster node).

    Ports come from below the kernel's ephemeral range so that an outgoing
    connection cannot grab the port while a server restarts; when that range
    is too small, the kernel picks (bind to port 0).
    """
    span = _CLUSTER_BUS_OFFSET if cluster_bus else 0
    low, high = 10000, _ephemeral_low() - span
    for _ in range(200):
        port = random.randrange(low, high) if high - low >= 1000 else _os_port()
        if cluster_bus and port + _CLUSTER_BUS_OFFSET > 65535:
            continue
        with _PORTS_LOCK:
            if port in _RESERVED_PORTS:
                continue
            if not _port_free(port):
                continue
            if cluster_bus and not _port_free(port + _CLUSTER_BUS_OFFSET):
                continue
            _RESERVED_PORTS.add(port)
            return port
    raise ServerStartError("found no free loopback port for a server")


def _release_port(port: int | None) -> None:
    if port:
        with _PORTS_LOCK:
            _RESERVED_PORTS.discard(port)


def _proc_state(pid: int) -> str | None:
    """The one-letter state in /proc/<pid>/stat (``None`` if unknown or gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            stat = file.read()
    except OSError:
        return None
    _, _, rest = stat.rpartition(")")
    fields = rest.split()
    return fields[0] if fields else None


def _tail(path: str, offset: int, lines: int) -> str:
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip()
    return "\n".join(text.splitlines()[-lines:])


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class _AddressInUseError(Exception):
    """The server exited early because its port was taken."""


# --------------------------------------------------------------------------- ServerProcess


class ServerProcess(_Lifecycle):
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
    override tenure's defaults. ``name`` labels the server in ``repr`` and
    errors.

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
        return None if self._dir is None else os.path.join(self._dir, _LOG_NAME)

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
            retry=_no_retry(),
        )
        client.set_response_callback("INFO", _raw_reply)
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
                            _release_port(self._port)
                            self._port = None
                            continue
                        raise ServerStartError(
                            f"{self!r}: port {self._port} is in use; last lines of its log:\n{exc}"
                        ) from None
            except BaseException:
                self._halt(1.0)
                if fresh:
                    self._cleanup()
                raise
            _register(self)

    def _stop(self, timeout: float) -> None:
        with self._lock:
            if os.getpid() != self._owner_pid:
                return  # a forked child: the server belongs to the parent
            self._halt(timeout)
            self._cleanup()
            self._stopped = True
            _unregister(self)

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
            raise ServerStartError(f"{self!r}: port in use; log:\n{exc}") from None

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
            self._wait_state(pid, lambda state: state in ("T", "t"))

    def resume(self) -> None:
        """Thaw a server frozen by :meth:`pause` (SIGCONT)."""
        with self._lock:
            pid = self._require_pid()
            os.kill(pid, signal.SIGCONT)
            self._paused = False
            self._wait_state(pid, lambda state: state not in ("T", "t"))

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

    @staticmethod
    def _wait_state(pid: int, done: Callable[[str], bool]) -> None:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            state = _proc_state(pid)
            if state is None or done(state):
                return
            time.sleep(0.001)

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
            self._port = _reserve_port(self._cluster_bus)
            self._auto_port = True

    def _command(self) -> list[str]:
        assert self._dir is not None
        assert self._port is not None
        args = [self._engine.server]
        if self._config is not None:
            args.append(os.path.join(self._dir, _CONFIG_NAME))
        args += [
            "--port",
            str(self._port),
            "--bind",
            HOST,
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--dir",
            self._dir,
            "--logfile",
            os.path.join(self._dir, _LOG_NAME),
            "--save",
            "",
            "--enable-debug-command",
            "local",
        ]
        socket_path = self.unix_socket_path
        if socket_path is not None:
            args += ["--unixsocket", socket_path, "--unixsocketperm", "700"]
        if self._appendonly:
            args += ["--appendonly", "yes"]
        if self._replicaof is not None:
            args += ["--replicaof", self._replicaof[0], str(self._replicaof[1])]
        args += self._extra_args
        return args

    def _launch(self) -> None:
        assert self._dir is not None
        args = self._command()
        out_path = os.path.join(self._dir, _OUT_NAME)
        log_path = os.path.join(self._dir, _LOG_NAME)
        self._log_offsets = (_size(out_path), _size(log_path))
        preexec = _make_preexec(os.getpid())
        directory = self._dir
        with open(out_path, "ab") as out:

            def spawn() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=directory,
                    start_new_session=True,
                    preexec_fn=preexec,
                    close_fds=True,
                )

            try:
                self._popen = _SPAWNER.run(spawn)
            except OSError as exc:
                raise ServerStartError(f"{self!r}: cannot run {args[0]}: {exc}") from exc
        if self._owns_dir:
            note_server(directory, self._popen.pid)
        self._owner_pid = os.getpid()
        self._paused = False

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last ``lines`` lines the server wrote (console output, then log) this run."""
        if self._dir is None:
            return ""
        out = _tail(os.path.join(self._dir, _OUT_NAME), self._log_offsets[0], lines)
        log = _tail(os.path.join(self._dir, _LOG_NAME), self._log_offsets[1], lines)
        return "\n".join(part for part in (out, log) if part) or "(empty log)"

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
                        f"{self!r} exited with code {code} while starting; "
                        f"last lines of its output:\n{tail}"
                    )
                try:
                    if execute(probe, "PING") in (True, "PONG"):
                        fields = parse_info(str(execute(probe, "INFO", "server")))
                        # Another server may hold the port while ours fails to bind.
                        if fields.get("process_id") == str(popen.pid):
                            return
                except redis.RedisError:
                    pass
                if time.monotonic() >= deadline:
                    raise ServerStartError(
                        f"{self!r} did not answer PING within {self.startup_timeout:g} s; "
                        f"last lines of its output:\n{self.log_tail()}"
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
            execute(client, "PING")
        except redis.RedisError:
            client.close()
            return False
        try:
            execute(client, "SHUTDOWN", "NOSAVE", "NOW")
        except (redis.ConnectionError, redis.TimeoutError):
            return True  # the server closed the connection: it is going down
        except redis.RedisError:
            return False
        finally:
            client.close()
        return True

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
            _release_port(self._port)
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
