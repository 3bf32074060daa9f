"""A single server as a topology: :class:`Standalone` wraps one :class:`ServerProcess`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from tenure.server._binaries import Engine
from tenure.server._process import ServerProcess
from tenure.server._topology import Topology

__all__ = ["Standalone"]


class Standalone(Topology):
    """A single server: a thin wrapper of one :class:`ServerProcess`.

    The arguments are those of :class:`ServerProcess`; the process is
    :attr:`server`.
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
        startup_timeout: float = 10.0,
    ) -> None:
        super().__init__(startup_timeout)
        self._server = ServerProcess(
            engine,
            port=port,
            unix_socket=unix_socket,
            directory=directory,
            appendonly=appendonly,
            extra_args=extra_args,
            name="standalone",
            startup_timeout=startup_timeout,
        )

    @property
    def server(self) -> ServerProcess:
        """The one server process."""
        return self._server

    @property
    def processes(self) -> tuple[ServerProcess, ...]:
        """``(server,)``."""
        return (self._server,)

    @property
    def engine(self) -> Engine:
        """The server binary."""
        return self._server.engine

    @property
    def url(self) -> str:
        """The server's URL (``redis://...`` or ``unix://...``)."""
        return self._server.url

    @property
    def host(self) -> str:
        """``"127.0.0.1"``."""
        return self._server.host

    @property
    def port(self) -> int:
        """The TCP port (0 for a unix-socket-only server)."""
        return self._server.port

    @property
    def unix_socket_path(self) -> str | None:
        """The unix socket's path (``unix_socket=True``), else ``None``."""
        return self._server.unix_socket_path

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` connected to the server."""
        return self._server.client(**kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A new ``redis.asyncio.Redis`` connected to the server."""
        return self._server.async_client(**kwargs)

    def _build(self) -> None:
        self._server.start()

    def __repr__(self) -> str:
        return f"<Standalone {self._server!r}>"
