"""Loopback ports for servers and proxies: the one host they bind to, and free ports.

:func:`reserve_port` hands out a free port, never one this process already
handed out and has not released with :func:`release_port`, nor one another
process holds the same way: each reserved port holds an exclusive ``flock`` on
a file of its own in a shared folder until it is released or its process ends.
(A server killed to test a crash keeps its port reserved: a server or proxy
of another test run, started meanwhile, must not take it and answer for it.)
Ports come from below the kernel's ephemeral range, so an outgoing connection
cannot grab one while its server restarts.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import threading

from tenure._core.exceptions import ServerStartError
from tenure.server._procfs import ephemeral_low

__all__ = ["HOST", "release_port", "reserve_port"]

_RANDOM = random.SystemRandom()  # not the global one: its seed and state are the application's

#: The only address servers bind to.
HOST = "127.0.0.1"

_CLUSTER_BUS_OFFSET = 10000

# Ports handed out by this process and not yet released, with the file descriptors of
# their lock files (a cluster node's bus port too; -1: none could be made), so no
# process hands one out twice.
_RESERVED_PORTS: dict[int, tuple[int, ...]] = {}
_PORTS_LOCK = threading.Lock()
_LOCK_FOLDER = os.path.join(tempfile.gettempdir(), f"tenure-ports-{os.getuid()}")


def _after_fork_in_child() -> None:
    global _PORTS_LOCK
    _PORTS_LOCK = threading.Lock()
    # The parent's reservations stay the parent's: its locks are not released by
    # the child closing its copies of their files, and are no longer held by the
    # child once the parent releases them.
    for claimed in _RESERVED_PORTS.values():
        for fd in claimed:
            _unclaim(fd)
    _RESERVED_PORTS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _claim(port: int) -> int | None:
    """Lock ``port``'s file for this process; its descriptor.

    -1 if none could be made (an unwritable folder: this process's own set
    still applies), None if another process holds it.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return -1
    try:
        os.makedirs(_LOCK_FOLDER, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(_LOCK_FOLDER, str(port)), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.set_inheritable(fd, False)
    return fd


def _unclaim(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)  # (the file stays: removing it could race another's claim)


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
            wanted = (port, port + _CLUSTER_BUS_OFFSET) if cluster_bus else (port,)
            claimed: list[int] = []
            for each in wanted:
                fd = _claim(each)
                if fd is None:
                    break
                claimed.append(fd)
                if not _port_free(each):
                    break
            else:
                _RESERVED_PORTS[port] = tuple(claimed)
                return port
            for fd in claimed:
                _unclaim(fd)
    raise ServerStartError("found no free loopback port for a server")


def release_port(port: int | None) -> None:
    """Give back a port from :func:`reserve_port` (``None`` or 0: nothing to do)."""
    if port:
        with _PORTS_LOCK:
            claimed = _RESERVED_PORTS.pop(port, ())
        for fd in claimed:
            _unclaim(fd)
