"""Loopback ports for servers and proxies: the one host they bind to, and free ports.

:func:`reserve_port` hands out a free port, never one this process already
handed out and has not released with :func:`release_port`. Ports come from
below the kernel's ephemeral range, so an outgoing connection cannot grab one
while its server restarts.
"""

from __future__ import annotations

import os
import random
import socket
import threading

from tenure._core.exceptions import ServerStartError
from tenure.server._procfs import ephemeral_low

__all__ = ["HOST", "release_port", "reserve_port"]

_RANDOM = random.SystemRandom()  # not the global one: its seed and state are the application's

#: The only address servers bind to.
HOST = "127.0.0.1"

_CLUSTER_BUS_OFFSET = 10000

# Ports handed out by this process and not yet released (avoids handing one out twice).
_RESERVED_PORTS: set[int] = set()
_PORTS_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _PORTS_LOCK
    _PORTS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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


def reserve_port(cluster_bus: bool) -> int:
    """A free loopback port (and free ``port + 10000`` for a cluster node).

    Ports come from below the kernel's ephemeral range so that an outgoing
    connection cannot grab the port while a server restarts; when that range
    is too small, the kernel picks (bind to port 0).
    """
    span = _CLUSTER_BUS_OFFSET if cluster_bus else 0
    low, high = 10000, ephemeral_low() - span
    for _ in range(200):
        port = _RANDOM.randrange(low, high) if high - low >= 1000 else _os_port()
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


def release_port(port: int | None) -> None:
    """Give back a port from :func:`reserve_port` (``None`` or 0: nothing to do)."""
    if port:
        with _PORTS_LOCK:
            _RESERVED_PORTS.discard(port)
