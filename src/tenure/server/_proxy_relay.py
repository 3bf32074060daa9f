"""A fault proxy's connections: each relayed both ways with the faults of the moment.

:class:`Relay` keeps the live connections (:class:`Connection`, snapshots
as the public :class:`ProxyConnection`) and serves each one on the proxy's
loop: it connects to the target, then four tasks read and write each
direction, delaying, dropping or resetting as the proxy's
:class:`~tenure.server._proxy_faults.FaultRules` say at the moment a chunk
is read and at the moment it is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import socket
import struct
import threading
from typing import Any

from tenure._core.exceptions import ServerStartError
from tenure.server._proxy_faults import FaultRules

__all__ = [
    "Connection",
    "ProxyConnection",
    "Relay",
    "address_of",
    "close_socket",
    "nodelay",
    "resolve",
]

_CHUNK = 65536
_QUEUE_CHUNKS = 64  # at most 4 MiB waiting per direction and connection
_LINGER_RST = struct.pack("ii", 1, 0)
_EOF = b""


class _ReplyLost(ConnectionResetError):
    """Raised in a connection's downstream reader to drop a reply and reset the pair."""


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


class Connection:
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


def address_of(raw: Any) -> tuple[str, int]:
    """``(host, port)`` of a socket address."""
    return (str(raw[0]), int(raw[1]))


def close_socket(sock: socket.socket, rst: bool) -> None:
    """Close a socket; with ``rst`` the peer gets RST instead of FIN."""
    if rst:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    with contextlib.suppress(OSError):
        sock.close()


def nodelay(sock: socket.socket) -> None:
    """Send small writes at once (TCP_NODELAY), where the socket allows it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def resolve(host: str, port: int, owner: object) -> tuple[int, Any]:
    """``(family, sockaddr)`` of the target ``host:port``; errors name ``owner``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ServerStartError(
            f"{owner!r}: cannot resolve the target {host}:{port}: {exc}"
        ) from None
    family, _, _, _, sockaddr = infos[0]
    return (int(family), sockaddr)


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


class Relay:
    """The live connections of one proxy, each served on its loop with the faults of ``rules``.

    ``target`` (``(family, sockaddr)``, set by the proxy before it starts and
    when it is retargeted) is where new connections go; ``connect_timeout``
    bounds that connect. The table of connections is read from any thread.
    """

    def __init__(self, rules: FaultRules, connect_timeout: float) -> None:
        self.rules = rules
        self.connect_timeout = connect_timeout
        self.target: tuple[int, Any] | None = None
        self._conns: dict[int, Connection] = {}
        self._conns_lock = threading.Lock()
        self._ids = itertools.count(1)

    def snapshots(self) -> list[ProxyConnection]:
        """The live connections, oldest first (from any thread)."""
        with self._conns_lock:
            return [conn.snapshot() for conn in self._conns.values()]

    def _live(self) -> list[Connection]:
        with self._conns_lock:
            return list(self._conns.values())

    def _forget(self, conn: Connection) -> None:
        with self._conns_lock:
            self._conns.pop(conn.id, None)

    def accept(self, sock: socket.socket, peer: Any) -> None:
        """On the loop: serve the accepted ``sock`` (non-blocking) of client ``peer``."""
        conn = Connection(next(self._ids), sock, address_of(peer))
        with self._conns_lock:
            self._conns[conn.id] = conn
        conn.task = asyncio.get_running_loop().create_task(self._serve(conn))

    def restart_matches(self) -> None:
        """On the loop, once the lost-reply rule changed: match only bytes from now on."""
        for conn in self._live():
            conn.tail = b""

    async def abort_all(self) -> int:
        """On the loop: reset every live connection (RST to both peers); return how many."""
        conns = self._live()
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
            close_socket(conn.client, rst=True)
            if conn.server is not None:
                close_socket(conn.server, rst=True)
            self._forget(conn)
        return len(conns)

    async def _serve(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        try:
            server = await self._connect()
            if server is None:
                conn.rst = True
                return
            conn.server = server
            conn.outbound_address = address_of(server.getsockname())
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
            await _finish(tasks)
            close_socket(conn.client, conn.rst)
            if conn.server is not None:
                close_socket(conn.server, conn.rst)
            self._forget(conn)

    async def _connect(self) -> socket.socket | None:
        assert self.target is not None
        family, sockaddr = self.target
        loop = asyncio.get_running_loop()
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        # Not asyncio.wait_for: before Python 3.12 it can swallow a cancellation
        # that comes as the connect completes, and abort_all would wait forever.
        connect = loop.create_task(loop.sock_connect(sock, sockaddr))
        try:
            done, _ = await asyncio.wait({connect}, timeout=self.connect_timeout)
        except BaseException:
            await _finish([connect])
            close_socket(sock, rst=True)
            raise
        if not done or connect.cancelled() or connect.exception() is not None:
            await _finish([connect])
            close_socket(sock, rst=True)
            return None
        nodelay(sock)
        return sock

    async def _read(
        self,
        conn: Connection,
        source: socket.socket,
        queue: asyncio.Queue[tuple[float, bytes]],
        *,
        upstream: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        rules = self.rules
        while True:
            data = await loop.sock_recv(source, _CHUNK)
            faults = rules.now
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
                matched, conn.tail = rules.lost_replies.scan(conn.tail, data)
                if matched:
                    conn.lose_reply = True
            elif conn.lose_reply:
                conn.lose_reply = False
                conn.rst = True
                rules.lost_replies.lost += 1
                raise _ReplyLost("reply discarded by lose_reply()")
            await queue.put((loop.time() + faults._latency(upstream), data))

    async def _write(
        self, target: socket.socket, queue: asyncio.Queue[tuple[float, bytes]], *, upstream: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            while (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if data:
                if not self.rules.now._blackholed(upstream):
                    await loop.sock_sendall(target, data)
                continue
            # EOF: a FIN is not lost in a partition, it waits for the partition to heal.
            await self.rules.healed(upstream)
            with contextlib.suppress(OSError):
                target.shutdown(socket.SHUT_WR)
            return
