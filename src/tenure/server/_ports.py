"""Loopback ports for servers and proxies: the one host they bind to, and free ports.

:func:`reserve_port` hands out a free port, never one this process already
handed out and has not released with :func:`release_port`, nor one another
process holds the same way: each reserved port holds an exclusive ``flock`` on
a file of its own in a shared folder (``$TMPDIR/tenure-ports-<uid>``) until
it is released or its process ends. (A server killed to test a crash keeps
its port reserved: a server or proxy of another test run, started meanwhile,
must not take it and answer for it.)

Nothing stays in that folder longer than it must: a release removes the
port's file (while still holding its lock; a claimer that locked a file
already removed sees it is no longer the one at that path and claims afresh),
and the folder itself goes with its last file. A process killed outright
leaves its files unlocked; the next process that reserves a port removes
them (:func:`_sweep`).
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

__all__ = [
    "HOST",
    "PORTS_FOLDER_VARIABLE",
    "ports_folder",
    "release_port",
    "reserve_port",
    "sweep_ports",
]

_RANDOM = random.SystemRandom()  # not the global one: its seed and state are the application's

#: The only address servers bind to.
HOST = "127.0.0.1"

_CLUSTER_BUS_OFFSET = 10000

# Ports handed out by this process and not yet released, with the (port, file
# descriptor) of each of their lock files (a cluster node's bus port too; -1: none
# could be made), so no process hands one out twice.
_RESERVED_PORTS: dict[int, tuple[tuple[int, int], ...]] = {}
_PORTS_LOCK = threading.Lock()
#: The environment variable that names the folder of port files, where set: a command
#: that gives itself (and its helpers) a temporary directory of its own still shares
#: the port reservations of every other tenure process.
PORTS_FOLDER_VARIABLE = "TENURE_PORTS_FOLDER"
_LOCK_FOLDER = os.environ.get(PORTS_FOLDER_VARIABLE) or os.path.join(
    tempfile.gettempdir(), f"tenure-ports-{os.getuid()}"
)
_SWEPT = False  # whether this process removed the files that killed processes left


def _after_fork_in_child() -> None:
    global _PORTS_LOCK
    _PORTS_LOCK = threading.Lock()
    # The parent's reservations stay the parent's: its locks are not released by
    # the child closing its copies of their files, and are no longer held by the
    # child once the parent releases them.
    for claimed in _RESERVED_PORTS.values():
        for _, fd in claimed:
            _close(fd)  # (never removed here: the parent still holds them)
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
    path = os.path.join(_LOCK_FOLDER, str(port))
    for _ in range(10):
        try:
            os.makedirs(_LOCK_FOLDER, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # the folder went with its last file meanwhile
            continue
        except OSError:
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if _still_at(fd, path):
            os.set_inheritable(fd, False)
            return fd
        os.close(fd)  # its holder removed it on release: claim the file now at the path
    return -1


def _still_at(fd: int, path: str) -> bool:
    """Whether the file open as ``fd`` is the one at ``path`` (not removed since)."""
    try:
        opened, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def _unclaim(port: int, fd: int) -> None:
    """Release a claim: its file removed while still locked, then the folder if empty."""
    if fd < 0:
        return
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(_LOCK_FOLDER, str(port)))
    _close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(_LOCK_FOLDER)  # only when empty: another process's files keep it


def _close(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def ports_folder() -> str:
    """The folder of the port files this process uses (shared by every tenure process)."""
    return _LOCK_FOLDER


def _sweep() -> None:
    """:func:`sweep_ports`, once per process (before its first reservation)."""
    global _SWEPT
    if not _SWEPT:
        _SWEPT = True
        sweep_ports()


def sweep_ports() -> None:
    """Remove the files of processes killed outright (unlocked files), and the folder if empty."""
    try:
        names = os.listdir(_LOCK_FOLDER)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            fd = _claim(int(name))
            if fd is not None:
                _unclaim(int(name), fd)


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
    with _PORTS_LOCK:
        _sweep()
    for _ in range(200):
        port = _RANDOM.randrange(low, high) if high - low >= 1000 else _os_port()
        if cluster_bus and port + _CLUSTER_BUS_OFFSET > 65535:
            continue
        with _PORTS_LOCK:
            if port in _RESERVED_PORTS:
                continue
            wanted = (port, port + _CLUSTER_BUS_OFFSET) if cluster_bus else (port,)
            claimed: list[tuple[int, int]] = []
            for each in wanted:
                fd = _claim(each)
                if fd is None:
                    break
                claimed.append((each, fd))
                if not _port_free(each):
                    break
            else:
                _RESERVED_PORTS[port] = tuple(claimed)
                return port
            for each, fd in claimed:
                _unclaim(each, fd)
    raise ServerStartError("found no free loopback port for a server")


def release_port(port: int | None) -> None:
    """Give back a port from :func:`reserve_port` (``None`` or 0: nothing to do)."""
    if port:
        with _PORTS_LOCK:
            claimed = _RESERVED_PORTS.pop(port, ())
        for each, fd in claimed:
            _unclaim(each, fd)
