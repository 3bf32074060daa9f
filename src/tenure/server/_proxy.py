"""A fault-injecting TCP proxy: latency, partitions, resets and refusals on demand.

:class:`FaultProxy` listens on loopback and forwards every connection to one
target (a server's ``(host, port)``). Faults are set per direction at any time
while it runs, from any thread:

* ``"upstream"`` is client -> server (commands), ``"downstream"`` is
  server -> client (replies), ``"both"`` is both.
* Latency: every chunk read from one side is written to the other ``seconds``
  after it was read; the order of bytes is kept (a chunk never overtakes the
  one before it, even when the latency is lowered meanwhile). The TCP
  handshake itself is not delayed.
* Blackhole (a partition): bytes are read and discarded, connections stay
  open, nobody is told. A chunk is dropped when its direction is blackholed
  at the moment it is read *or* at the moment it is due, so bytes in flight
  when the partition starts are lost too. A close (FIN) is not lost: it waits
  until the partition heals, like a retransmitted FIN would.
* Reset: every current connection is closed at once with RST (``SO_LINGER``
  0) on both sides.
* Refusal of new connections: ``"refuse"`` stops listening (connects fail
  with ECONNREFUSED; the port stays the proxy's), ``"reset"`` accepts and
  resets at once, ``"close"`` accepts and closes at once.
* A lost reply (:meth:`FaultProxy.lose_reply`): a command whose bytes contain
  a pattern reaches the server and runs; its reply is discarded and the
  connection reset, as when a connection drops between a command and its
  answer. A client that resends the command runs it twice.

The proxy is pure Python: one asyncio event loop in a daemon thread, so it
serves sync and asyncio code alike, and its own thread never blocks yours for
more than a control round trip. :meth:`FaultProxy.stop` resets the remaining
connections, closes every socket and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import ipaddress
import itertools
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any, Literal, TypeVar

import redis
import redis.asyncio

from tenure._core.exceptions import ArgumentError, EmbeddedServerError, ServerStartError
from tenure.server._lifecycle import Lifecycle
from tenure.server._ports import release_port, reserve_port
from tenure.server._registry import register, unregister

__all__ = ["Direction", "FaultProxy", "ProxyConnection", "ProxyFaults", "RefuseMode"]

#: Which way a fault applies: client -> server, server -> client, or both.
Direction = Literal["upstream", "downstream", "both"]
#: How new connections are turned away (see :meth:`FaultProxy.refuse_connections`).
RefuseMode = Literal["refuse", "reset", "close"]

_T = TypeVar("_T")

_CHUNK = 65536
_QUEUE_CHUNKS = 64  # at most 4 MiB waiting per direction and connection
_BACKLOG = 128
_BIND_ATTEMPTS = 8
_CONTROL_TIMEOUT = 10.0
_LINGER_RST = struct.pack("ii", 1, 0)
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_AGAIN = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})
_DIRECTIONS: dict[str, tuple[bool, bool]] = {
    "upstream": (True, False),
    "downstream": (False, True),
    "both": (True, True),
}
_REFUSE_MODES = ("refuse", "reset", "close")
_EOF = b""


class _ReplyLost(ConnectionResetError):
    """Raised in a connection's downstream reader to drop a reply and reset the pair."""


@dataclasses.dataclass(frozen=True)
class ProxyFaults:
    """The faults a :class:`FaultProxy` applies now (an immutable snapshot).

    Latencies are in seconds; ``refusing`` is ``None`` when new connections
    are accepted, else the :meth:`FaultProxy.refuse_connections` mode.
    """

    upstream_latency: float = 0.0
    downstream_latency: float = 0.0
    upstream_blackhole: bool = False
    downstream_blackhole: bool = False
    refusing: RefuseMode | None = None

    @property
    def active(self) -> bool:
        """Whether any fault is set."""
        return self != _NO_FAULTS

    def _latency(self, upstream: bool) -> float:
        return self.upstream_latency if upstream else self.downstream_latency

    def _blackholed(self, upstream: bool) -> bool:
        return self.upstream_blackhole if upstream else self.downstream_blackhole

    def __str__(self) -> str:
        parts = []
        for label, upstream in (("up", True), ("down", False)):
            if self._blackholed(upstream):
                parts.append(f"{label}:blackhole")
            if self._latency(upstream):
                parts.append(f"{label}:+{self._latency(upstream):g}s")
        if self.refusing is not None:
            parts.append(f"new:{self.refusing}")
        return " ".join(parts) or "none"


_NO_FAULTS = ProxyFaults()


@dataclasses.dataclass(frozen=True)
class ProxyConnection:
    """One connection through a :class:`FaultProxy` (a snapshot).

    ``client_address`` is the client's end as the proxy sees it;
    ``outbound_address`` is the proxy's end of its connection to the target,
    as the server sees it (``addr=`` in ``CLIENT LIST``), or ``None`` while
    the proxy is still connecting. The byte counts are what the proxy read
    from each side, dropped bytes included.
    """

    id: int
    client_address: tuple[str, int]
    outbound_address: tuple[str, int] | None
    upstream_bytes: int
    downstream_bytes: int


class _Connection:
    """The proxy thread's record of one live connection."""

    __slots__ = (
        "client",
        "client_address",
        "downstream_bytes",
        "id",
        "lose_reply",
        "outbound_address",
        "rst",
        "server",
        "tail",
        "task",
        "upstream_bytes",
    )

    def __init__(self, ident: int, client: socket.socket, address: tuple[str, int]) -> None:
        self.id = ident
        self.client = client
        self.client_address = address
        self.server: socket.socket | None = None
        self.outbound_address: tuple[str, int] | None = None
        self.upstream_bytes = 0
        self.downstream_bytes = 0
        self.rst = False
        self.task: asyncio.Task[None] | None = None
        self.lose_reply = False  # a command matched: its reply is dropped, then RST
        self.tail = b""  # the last bytes sent upstream, so a match may span two chunks

    def snapshot(self) -> ProxyConnection:
        return ProxyConnection(
            id=self.id,
            client_address=self.client_address,
            outbound_address=self.outbound_address,
            upstream_bytes=self.upstream_bytes,
            downstream_bytes=self.downstream_bytes,
        )


def _address(raw: Any) -> tuple[str, int]:
    return (str(raw[0]), int(raw[1]))


def _close(sock: socket.socket, rst: bool) -> None:
    """Close a socket; with ``rst`` the peer gets RST instead of FIN."""
    if rst:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    with contextlib.suppress(OSError):
        sock.close()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _accept_one(
    loop: asyncio.AbstractEventLoop, listener: socket.socket
) -> tuple[socket.socket, Any]:
    """Accept one connection; a cancellation never drops an accepted socket.

    Not ``loop.sock_accept``: a cancellation that arrives as it completes
    loses the new socket unclosed. Here the socket exists only once
    ``accept()`` returned, after the last point of cancellation.
    """
    while True:
        try:
            return listener.accept()
        except (BlockingIOError, InterruptedError):
            pass
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(listener.fileno(), _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(listener.fileno())


def _nodelay(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _quiet_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Peers closing or resetting is the proxy's daily bread: never print it."""
    if isinstance(context.get("exception"), (OSError, asyncio.CancelledError)):
        return
    loop.default_exception_handler(context)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _loopback_host(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ArgumentError("host", f"the proxy listens on loopback only, not {host!r}")
    return host


def _check_direction(direction: str) -> tuple[bool, bool]:
    try:
        return _DIRECTIONS[direction]
    except KeyError:
        raise ArgumentError(
            "direction", f"expected 'upstream', 'downstream' or 'both', not {direction!r}"
        ) from None


class FaultProxy(Lifecycle):
    """A TCP proxy on loopback in front of ``(target_host, target_port)``, with faults.

    Nothing runs until :meth:`start` (or ``with`` / ``async with``)::

        with ServerProcess() as server, FaultProxy(*server.address) as proxy:
            client = proxy.client(socket_timeout=0.5)
            proxy.set_latency(0.1, "downstream")  # every reply 100 ms late
            client.ping()
            proxy.blackhole()  # a partition: the next command times out
            proxy.clear()  # healed (a new connection is needed: redis-py makes one)
            client.close()

    ``host`` must be a loopback address; ``port=0`` picks a free port (below
    the kernel's ephemeral range, like the servers'). ``connect_timeout``
    bounds the proxy's connect to the target; when that connect fails, the
    client's connection is reset. ``name`` labels the proxy in ``repr``.

    Faults (:meth:`set_latency`, :meth:`blackhole`, :meth:`refuse_connections`,
    :meth:`reset_connections`, :meth:`clear`) can be set before start and at
    any time while running, from any thread or event loop; see the module
    docstring of ``tenure.server._proxy`` for their exact semantics. They are
    kept across :meth:`stop` and :meth:`start`. :meth:`stop` resets the
    connections left, closes every socket, frees the port and joins the
    proxy's thread; a restart gets a new port unless ``port`` was given.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        connect_timeout: float = 5.0,
        name: str = "proxy",
    ) -> None:
        if not 0 < target_port < 65536:
            raise ArgumentError("target_port", f"not a TCP port: {target_port!r}")
        if not 0 <= port < 65536:
            raise ArgumentError("port", f"not a TCP port: {port!r}")
        if not (connect_timeout > 0 and math.isfinite(connect_timeout)):
            raise ArgumentError("connect_timeout", "must be a positive number of seconds")
        self._target = (target_host, target_port)
        self._host = _loopback_host(host)
        self._requested_port = port
        self._connect_timeout = connect_timeout
        self._name = name
        self._lock = threading.RLock()
        self._faults = _NO_FAULTS
        self._port: int | None = None
        self._reserved_port: int | None = None
        self._owner_pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._target_address: tuple[int, Any] | None = None
        # Touched by the proxy's thread only (the dict also under _conns_lock):
        self._listener: socket.socket | None = None
        self._listening = False
        self._accept_task: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        self._conns: dict[int, _Connection] = {}
        self._conns_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._lose_match = b""
        self._lose_left = 0
        self._lost_replies = 0

    # ------------------------------------------------------------------ addresses

    @property
    def running(self) -> bool:
        """Whether the proxy is started (and not stopped)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def host(self) -> str:
        """The loopback address the proxy listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The port the proxy listens on.

        Raises :class:`~tenure.EmbeddedServerError` while not running.
        """
        port = self._port
        if port is None:
            raise EmbeddedServerError(f"{self!r} is not running: it has no port")
        return port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` to connect to instead of the target."""
        return (self._host, self.port)

    @property
    def url(self) -> str:
        """``redis://host:port`` of the proxy (IPv6 hosts in brackets)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"redis://{host}:{self.port}"

    @property
    def target(self) -> tuple[str, int]:
        """``(host, port)`` the proxy forwards to."""
        return self._target

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` connected through the proxy; ``kwargs`` go to its constructor."""
        return redis.Redis(host=self._host, port=self.port, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A new ``redis.asyncio.Redis`` through the proxy; ``kwargs`` go to its constructor."""
        return redis.asyncio.Redis(host=self._host, port=self.port, **kwargs)

    # ------------------------------------------------------------------ faults

    @property
    def faults(self) -> ProxyFaults:
        """The faults applied now."""
        return self._faults

    def _set_directed(self, direction: Direction, fault: str, value: object) -> None:
        """Set ``<direction>_<fault>`` to ``value`` for the direction(s) asked."""
        upstream, downstream = _check_direction(direction)
        sides = [side for side, on in (("upstream", upstream), ("downstream", downstream)) if on]
        self._update({f"{side}_{fault}": value for side in sides})

    def set_latency(self, seconds: float, direction: Direction = "both") -> None:
        """Delay every chunk read from now on by ``seconds`` (0 removes the delay).

        Each chunk is written ``seconds`` after the proxy read it, in order.
        Chunks already waiting keep the delay they were read with.
        """
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ArgumentError("seconds", f"must be a finite number >= 0, not {seconds!r}")
        self._set_directed(direction, "latency", float(seconds))

    def blackhole(self, direction: Direction = "both", *, enabled: bool = True) -> None:
        """Drop every byte in ``direction`` (a partition); ``enabled=False`` stops dropping.

        Connections stay open and nobody is told: a client waits for its
        reply until its own timeout. New connections are still accepted
        (the handshake is the kernel's), and then hear nothing either.
        """
        self._set_directed(direction, "blackhole", bool(enabled))

    def refuse_connections(self, mode: RefuseMode | None = "refuse") -> None:
        """Turn new connections away; ``None`` accepts them again.

        ``"refuse"``: the proxy stops listening, so connects fail with
        ECONNREFUSED (the port stays bound to the proxy). ``"reset"``: a
        connect succeeds, then the connection is reset at once. ``"close"``:
        it is closed at once (the client reads EOF). Connections already open
        are not touched (see :meth:`reset_connections`). Takes effect before
        this method returns.
        """
        if mode is not None and mode not in _REFUSE_MODES:
            raise ArgumentError("mode", f"expected 'refuse', 'reset', 'close' or None: {mode!r}")
        self._update({"refusing": mode})

    def lose_reply(self, match: bytes, count: int = 1) -> None:
        """Lose the reply of the next ``count`` commands whose bytes contain ``match``.

        When bytes a client sends on a connection contain ``match`` (say the
        SHA1 an ``EVALSHA`` names, or a key), they are forwarded as usual and
        the server runs the command; the next bytes the server sends back on
        that connection (its reply) are discarded, and the connection is reset
        (RST to both peers) — a reply lost to a dropped connection. The
        client's read fails with ``ConnectionError`` only after the server
        executed the command, so a client that resends it (redis-py does, by
        default) runs it a second time. After ``count`` matching commands the
        fault disarms itself; ``count=0`` disarms it at once, and so does
        :meth:`clear`. :attr:`lost_replies` counts the replies lost.

        A match may span two chunks of the stream. Meant for one command at a
        time per connection: with commands pipelined, the bytes discarded may
        begin with the replies of commands sent before the matching one.
        Takes effect before this method returns (only connections' future
        bytes are matched).
        """
        if not isinstance(match, bytes) or not match:
            raise ArgumentError("match", f"must be non-empty bytes, not {match!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ArgumentError("count", f"must be an integer >= 0, not {count!r}")
        with self._lock:
            if self.running:
                self._call(self._arm_lose(match, count))
            else:
                self._lose_match, self._lose_left = match, count

    @property
    def lost_replies(self) -> int:
        """How many replies :meth:`lose_reply` discarded since the proxy was created."""
        return self._lost_replies

    @property
    def replies_to_lose(self) -> int:
        """How many more matching commands :meth:`lose_reply` loses a reply of (0: disarmed)."""
        return self._lose_left

    def clear(self) -> None:
        """Remove every fault: no latency, no blackhole, new connections accepted.

        No reply is lost any more either (see :meth:`lose_reply`). Chunks
        already waiting keep their delay; dropped bytes stay lost, so a
        connection that lost bytes is usually out of step and best replaced.
        """
        with self._lock:
            self._faults = _NO_FAULTS
            if self.running:
                self._call(self._arm_lose(b"", 0))
            else:
                self._lose_match, self._lose_left = b"", 0
            self._apply()

    def retarget(self, host: str, port: int, *, reset: bool = True) -> None:
        """Forward new connections to ``host:port`` from now on (a moved endpoint).

        Models a virtual IP or DNS name that follows the primary through a
        failover: clients keep the proxy's address and reach the new target
        when they reconnect. With ``reset`` (default) the current connections
        are reset, so no client keeps talking to the old target.
        """
        if not 0 < port < 65536:
            raise ArgumentError("port", f"not a TCP port: {port!r}")
        with self._lock:
            self._target = (host, port)
            if self.running:
                self._resolve_target()
                if reset:
                    self._call(self._abort_all())

    def reset_connections(self) -> int:
        """Reset every current connection (RST to both peers); return how many.

        When this returns, the RSTs are sent. A command in flight fails with
        ``ConnectionError``, and so does the next command of a
        ``redis.asyncio`` client. The sync ``redis.Redis`` pool checks an idle
        connection when it hands it out and silently reconnects, so there the
        reset of an idle connection reaches the caller only on a
        ``single_connection_client=True`` client.
        """
        with self._lock:
            if not self.running:
                return 0
            return self._call(self._abort_all())

    def connections(self) -> list[ProxyConnection]:
        """The live connections, oldest first."""
        with self._conns_lock:
            return [conn.snapshot() for conn in self._conns.values()]

    def wait_connections(self, count: int, timeout: float = 5.0) -> None:
        """Wait until exactly ``count`` connections are live.

        A connection closed by its client leaves after the close went through
        the proxy (a few milliseconds; later under latency or a partition).
        Raises :class:`TimeoutError` naming the number seen.
        """
        deadline = time.monotonic() + timeout
        while True:
            live = len(self.connections())
            if live == count:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self!r}: {live} connections live after {timeout:g} s, not {count}"
                )
            time.sleep(0.002)

    def _update(self, changes: dict[str, Any]) -> None:
        with self._lock:
            self._faults = dataclasses.replace(self._faults, **changes)
            self._apply()

    def _apply(self) -> None:
        """Tell the proxy's thread the faults changed (and wait for listening to follow)."""
        if self.running:
            self._call(self._faults_changed())

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        with self._lock:
            if os.getpid() != self._owner_pid:
                raise EmbeddedServerError(f"{self!r} was created by another process (pid changed)")
            if self.running:
                return
            self._resolve_target()
            listener = self._bind()
            loop = asyncio.new_event_loop()
            loop.set_exception_handler(_quiet_exceptions)
            thread = threading.Thread(
                target=_run_loop, args=(loop,), name=f"tenure-proxy-{self._port}", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
            try:
                self._call(self._open(listener))
            except BaseException:
                self._halt(5.0)
                raise
            register(self)

    def _stop(self, timeout: float) -> None:
        with self._lock:
            if os.getpid() != self._owner_pid:
                return  # a forked child: the proxy belongs to the parent
            self._halt(timeout)
            unregister(self)

    def _halt(self, timeout: float) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            if thread.is_alive():
                with contextlib.suppress(RuntimeError, FutureTimeoutError):
                    self._call(self._close_all(), timeout=timeout)
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            if thread.is_alive():
                raise EmbeddedServerError(
                    f"{self!r}: the proxy thread did not stop in {timeout:g} s"
                )
        listener = self._listener
        if listener is not None:  # normally closed by _close_all
            _close(listener, rst=False)
        self._loop = self._thread = None
        self._listener = None
        self._accept_task = None
        self._changed = None
        self._listening = False
        self._port = None
        release_port(self._reserved_port)
        self._reserved_port = None

    def _resolve_target(self) -> None:
        host, port = self._target
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ServerStartError(
                f"{self!r}: cannot resolve the target {host}:{port}: {exc}"
            ) from None
        family, _, _, _, sockaddr = infos[0]
        self._target_address = (int(family), sockaddr)

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        attempts = 1 if self._requested_port else _BIND_ATTEMPTS
        for attempt in range(attempts):
            # An explicit port (never 0) keeps the port bound while the listener
            # is shut down by refuse_connections("refuse").
            reserved = None if self._requested_port else reserve_port(False)
            port = self._requested_port or reserved
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self._host, port))
            except OSError as exc:
                sock.close()
                release_port(reserved)
                if exc.errno == errno.EADDRINUSE and attempt + 1 < attempts:
                    continue
                raise ServerStartError(
                    f"{self!r}: cannot listen on {self._host}:{port}: {exc}"
                ) from None
            sock.setblocking(False)
            self._port = _address(sock.getsockname())[1]
            self._reserved_port = reserved
            return sock
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float = _CONTROL_TIMEOUT) -> _T:
        """Run ``coro`` on the proxy's loop and wait for its result."""
        loop = self._loop
        if loop is None or threading.current_thread() is self._thread:
            coro.close()
            raise EmbeddedServerError(f"{self!r}: cannot control the proxy from here")
        try:
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:
            coro.close()
            raise
        return future.result(timeout)

    # ------------------------------------------------------------------ the proxy's thread

    async def _open(self, listener: socket.socket) -> None:
        self._listener = listener
        self._changed = asyncio.Event()
        self._set_listening(self._faults.refusing != "refuse")

    async def _arm_lose(self, match: bytes, count: int) -> None:
        self._lose_match, self._lose_left = match, count
        with self._conns_lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.tail = b""

    async def _faults_changed(self) -> None:
        changed = self._changed
        if changed is not None:  # wake writers waiting for a partition to heal
            changed.set()
            self._changed = asyncio.Event()
        await self._set_listening_async(self._faults.refusing != "refuse")

    async def _set_listening_async(self, listening: bool) -> None:
        task = self._accept_task
        if not listening and task is not None:
            task.cancel()
            await asyncio.wait([task])
            self._accept_task = None
        self._set_listening(listening)

    def _set_listening(self, listening: bool) -> None:
        listener = self._listener
        if listener is None or listening == self._listening:
            return
        if listening:
            listener.listen(_BACKLOG)
            self._accept_task = asyncio.get_running_loop().create_task(self._accept(listener))
        else:
            # Linux: a shut-down listener refuses connects but keeps its port.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
        self._listening = listening

    async def _close_all(self) -> None:
        task = self._accept_task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            self._accept_task = None
        listener = self._listener
        if listener is not None:
            _close(listener, rst=False)
            self._listener = None
        self._listening = False
        await self._abort_all()

    async def _abort_all(self) -> int:
        with self._conns_lock:
            conns = list(self._conns.values())
        tasks = []
        for conn in conns:
            conn.rst = True
            if conn.task is not None:
                conn.task.cancel()
                tasks.append(conn.task)
        if tasks:
            await asyncio.wait(tasks)
        for conn in conns:
            # A task cancelled before it first ran never reaches _serve's
            # clean-up: its sockets are closed here (closing twice is harmless).
            _close(conn.client, rst=True)
            if conn.server is not None:
                _close(conn.server, rst=True)
            with self._conns_lock:
                self._conns.pop(conn.id, None)
        return len(conns)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await _accept_one(loop, listener)
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    await asyncio.sleep(0.05)
                elif exc.errno not in _ACCEPT_AGAIN:
                    return  # the listener itself is broken
                continue
            mode = self._faults.refusing
            if mode is not None:
                _close(sock, rst=mode != "close")
                continue
            sock.setblocking(False)
            _nodelay(sock)
            conn = _Connection(next(self._ids), sock, _address(peer))
            with self._conns_lock:
                self._conns[conn.id] = conn
            conn.task = loop.create_task(self._serve(conn))

    async def _serve(self, conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        try:
            server = await self._connect()
            if server is None:
                conn.rst = True
                return
            conn.server = server
            conn.outbound_address = _address(server.getsockname())
            up: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
            down: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUE_CHUNKS)
            tasks = [
                loop.create_task(self._read(conn, conn.client, up, upstream=True)),
                loop.create_task(self._write(server, up, upstream=True)),
                loop.create_task(self._read(conn, server, down, upstream=False)),
                loop.create_task(self._write(conn.client, down, upstream=False)),
            ]
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            # All four end cleanly only after both sides closed; anything else breaks the pair.
            if pending or any(task.cancelled() or task.exception() is not None for task in done):
                conn.rst = True
        finally:
            await self._finish(tasks)
            _close(conn.client, conn.rst)
            if conn.server is not None:
                _close(conn.server, conn.rst)
            with self._conns_lock:
                self._conns.pop(conn.id, None)

    @staticmethod
    async def _finish(tasks: list[asyncio.Task[None]]) -> None:
        """Cancel ``tasks`` and wait until they are done, even if cancelled meanwhile.

        Sockets are closed only after this: a task still waiting on a socket
        would otherwise leave its file descriptor registered with the loop.
        """
        for task in tasks:
            task.cancel()
        while tasks:
            try:
                await asyncio.wait(tasks)
                break
            except asyncio.CancelledError:
                continue
        for task in tasks:
            if not task.cancelled():
                task.exception()  # retrieved: never "exception was never retrieved"

    async def _connect(self) -> socket.socket | None:
        assert self._target_address is not None
        family, sockaddr = self._target_address
        loop = asyncio.get_running_loop()
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        # Not asyncio.wait_for: before Python 3.12 it can swallow a cancellation
        # that comes as the connect completes, and abort_all would wait forever.
        connect = loop.create_task(loop.sock_connect(sock, sockaddr))
        try:
            done, _ = await asyncio.wait({connect}, timeout=self._connect_timeout)
        except BaseException:
            await self._finish([connect])
            _close(sock, rst=True)
            raise
        if not done or connect.cancelled() or connect.exception() is not None:
            await self._finish([connect])
            _close(sock, rst=True)
            return None
        _nodelay(sock)
        return sock

    async def _read(
        self,
        conn: _Connection,
        source: socket.socket,
        queue: asyncio.Queue[tuple[float, bytes]],
        *,
        upstream: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(source, _CHUNK)
            faults = self._faults
            if not data:
                await queue.put((loop.time() + faults._latency(upstream), _EOF))
                return
            if upstream:
                conn.upstream_bytes += len(data)
            else:
                conn.downstream_bytes += len(data)
            if faults._blackholed(upstream):
                continue
            if upstream:
                self._match_lost_reply(conn, data)
            elif conn.lose_reply:
                conn.lose_reply = False
                conn.rst = True
                self._lost_replies += 1
                raise _ReplyLost("reply discarded by lose_reply()")
            await queue.put((loop.time() + faults._latency(upstream), data))

    def _match_lost_reply(self, conn: _Connection, data: bytes) -> None:
        """Mark ``conn`` to lose its next reply if ``data`` completes a match."""
        match = self._lose_match
        if self._lose_left <= 0 or not match:
            return
        window = conn.tail + data
        if match in window:
            self._lose_left -= 1
            conn.lose_reply = True
            conn.tail = b""
        else:
            conn.tail = window[max(0, len(window) - len(match) + 1) :]

    async def _write(
        self, target: socket.socket, queue: asyncio.Queue[tuple[float, bytes]], *, upstream: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            while (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if data:
                if not self._faults._blackholed(upstream):
                    await loop.sock_sendall(target, data)
                continue
            # EOF: a FIN is not lost in a partition, it waits for the partition to heal.
            while True:
                changed = self._changed
                if changed is None or not self._faults._blackholed(upstream):
                    break
                await changed.wait()
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)
            return

    def __repr__(self) -> str:
        where = f"{self._host}:{self._port}" if self._port is not None else "no address"
        target = f"{self._target[0]}:{self._target[1]}"
        state = "running" if self.running else "stopped"
        faults = self._faults
        extra = f" faults={faults}" if faults.active else ""
        return f"<FaultProxy {self._name!r} {where} -> {target} {state}{extra}>"
