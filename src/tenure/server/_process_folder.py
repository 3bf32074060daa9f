"""A private server's folder: its data, log, configuration file and unix socket.

:class:`ServerFolder` makes the folder at a server's first start (a private
temporary one, or the one the caller named, which is kept), a short-named
folder for the socket when the path would not fit a unix socket address,
writes the configuration text once, and removes what it made at the stop.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from tenure.server._folders import make_folder
from tenure.server._logs import LOG_NAME

__all__ = ["CONFIG_NAME", "SOCKET_NAME", "ServerFolder"]

SOCKET_NAME = "server.sock"
CONFIG_NAME = "server.conf"
_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux


class ServerFolder:
    """The working folder of server ``name``: ``requested`` (kept) or a private one.

    ``unix``: the server listens on ``server.sock`` in it (or in a folder of
    its own when that path is too long). :attr:`path` is ``None`` until the
    first :meth:`prepare` and again after :meth:`remove`.
    """

    def __init__(self, name: str, requested: str | None, unix: bool) -> None:
        self._name = name
        self._requested = requested
        self._unix = unix
        self.path: str | None = None
        self.owned = False  # made here, so removed here
        self._socket_dir: str | None = None

    def socket_path(self) -> str | None:
        """Path of the unix socket (a unix-socket server), else ``None``."""
        if not self._unix:
            return None
        folder = self._socket_dir or self.path
        return None if folder is None else os.path.join(folder, SOCKET_NAME)

    def log_path(self) -> str | None:
        """The server's log file, once the folder exists."""
        return None if self.path is None else os.path.join(self.path, LOG_NAME)

    def prepare(self, config: str | None) -> None:
        """Before each start: the folder made if needed, a stale socket gone, the config written.

        The configuration file is written only if it is not there yet (the
        server may rewrite it, as Sentinel does).
        """
        if self.path is None:
            if self._requested is not None:
                os.makedirs(self._requested, exist_ok=True)
                self.path = self._requested
                self.owned = False
            else:
                self.path = make_folder(self._name)
                self.owned = True
        if self._unix:
            too_long = len(os.path.join(self.path, SOCKET_NAME)) > _MAX_SOCKET_PATH
            if too_long and self._socket_dir is None:
                self._socket_dir = make_folder("sock")
            path = self.socket_path()
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        if config is not None:
            config_path = os.path.join(self.path, CONFIG_NAME)
            if not os.path.exists(config_path):
                with open(config_path, "w", encoding="utf-8") as file:
                    file.write(config)

    def remove(self) -> None:
        """At the stop: remove what was made here (a caller's folder loses only the socket)."""
        if self.path is not None and self.owned:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self.path is not None and self._unix:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.path, SOCKET_NAME))
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        self.path = None
        self._socket_dir = None
        self.owned = False
