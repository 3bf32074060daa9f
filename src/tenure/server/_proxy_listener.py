"""A fault proxy's listening socket: bound at start, listening or refusing, accepting.

:class:`Listener` binds the proxy's port on loopback (a free one below the
ephemeral range unless one was asked for) before the proxy's loop starts;
on the loop it listens, or stops listening while new connections are
refused (the port stays bound), accepts, turns connections away in the
``"reset"`` and ``"close"`` modes and hands the others to the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from tenure._core.exceptions import ArgumentError, ServerStartError
from tenure.server._ports import release_port, reserve_port
from tenure.server._proxy_faults import FaultRules
from tenure.server._proxy_relay import address_of, close_socket, nodelay

__all__ = ["Listener", "loopback_host"]

_BACKLOG = 128
_BIND_ATTEMPTS = 8
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_AGAIN = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})


def loopback_host(host: str) -> str:
    """``host`` if it is a loopback address (``localhost``: 127.0.0.1), else ArgumentError."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ArgumentError("host", f"the proxy listens on loopback only, not {host!r}")
    return host


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


class Listener:
    """The listening socket of one proxy on ``host`` (``requested_port`` 0: a free port).

    :meth:`bind` and :meth:`release` run in the controlling thread while the
    proxy's loop does not; :meth:`open`, :meth:`follow` and :meth:`close` on
    the loop. Accepted connections go to ``accepted`` unless ``rules`` refuse
    them.
    """

    def __init__(
        self,
        host: str,
        requested_port: int,
        rules: FaultRules,
        accepted: Callable[[socket.socket, Any], None],
    ) -> None:
        self.host = host
        self.requested_port = requested_port
        self.port: int | None = None
        self._rules = rules
        self._accepted = accepted
        self._reserved_port: int | None = None
        self._socket: socket.socket | None = None
        self._listening = False
        self._accept_task: asyncio.Task[None] | None = None

    def bind(self, owner: object) -> None:
        """Bind the port (not listening yet); errors name ``owner``."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        attempts = 1 if self.requested_port else _BIND_ATTEMPTS
        for attempt in range(attempts):
            # An explicit port (never 0) keeps the port bound while the listener
            # is shut down by refuse_connections("refuse").
            reserved = None if self.requested_port else reserve_port(False)
            port = self.requested_port or reserved
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.host, port))
            except OSError as exc:
                sock.close()
                release_port(reserved)
                if exc.errno == errno.EADDRINUSE and attempt + 1 < attempts:
                    continue
                raise ServerStartError(
                    f"{owner!r}: cannot listen on {self.host}:{port}: {exc}"
                ) from None
            sock.setblocking(False)
            self.port = address_of(sock.getsockname())[1]
            self._reserved_port = reserved
            self._socket = sock
            return
        raise AssertionError("unreachable")  # pragma: no cover

    def release(self) -> None:
        """Once the loop is gone: close the socket if it is left, free the port."""
        sock = self._socket
        if sock is not None:  # normally closed by close()
            close_socket(sock, rst=False)
        self._socket = None
        self._accept_task = None
        self._listening = False
        self.port = None
        release_port(self._reserved_port)
        self._reserved_port = None

    def open(self) -> None:
        """On the loop, as the proxy starts: listen unless new connections are refused."""
        self._set_listening(self._rules.now.refusing != "refuse")

    async def follow(self) -> None:
        """On the loop, after the faults changed: listen, or stop, as they now say."""
        listening = self._rules.now.refusing != "refuse"
        task = self._accept_task
        if not listening and task is not None:
            task.cancel()
            await asyncio.wait([task])
            self._accept_task = None
        self._set_listening(listening)

    async def close(self) -> None:
        """On the loop, as the proxy stops: stop accepting and close the socket."""
        task = self._accept_task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            self._accept_task = None
        sock = self._socket
        if sock is not None:
            close_socket(sock, rst=False)
            self._socket = None
        self._listening = False

    def _set_listening(self, listening: bool) -> None:
        sock = self._socket
        if sock is None or listening == self._listening:
            return
        if listening:
            sock.listen(_BACKLOG)
            self._accept_task = asyncio.get_running_loop().create_task(self._accept(sock))
        else:
            # Linux: a shut-down listener refuses connects but keeps its port.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._listening = listening

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, peer = await _accept_one(loop, sock)
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    await asyncio.sleep(0.05)
                elif exc.errno not in _ACCEPT_AGAIN:
                    return  # the listener itself is broken
                continue
            mode = self._rules.now.refusing
            if mode is not None:
                close_socket(client, rst=mode != "close")
                continue
            client.setblocking(False)
            nodelay(client)
            self._accepted(client, peer)
