"""A private server's settings, checked once, and the command line they make.

:class:`ServerSettings` holds what a :class:`~tenure.server.ServerProcess`
was asked for (engine, port, socket, folder, AOF, primary, configuration
text, extra arguments, environment), refusing what it cannot run with, and
builds the command line of each start (:func:`~tenure.server._command_line.server_command`
for the paths and port of that start).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Mapping, Sequence

from tenure._core.exceptions import ArgumentError
from tenure.server._binaries import Engine, find_engine
from tenure.server._command_line import server_command
from tenure.server._logs import LOG_NAME
from tenure.server._process_folder import CONFIG_NAME, ServerFolder

__all__ = ["ServerSettings"]


@dataclasses.dataclass
class ServerSettings:
    """What one server process runs with (see :class:`~tenure.server.ServerProcess`).

    ``replicaof`` and ``config`` change when a topology promotes a replica
    or rewrites Sentinel's configuration; the rest never changes.
    """

    engine: Engine
    requested_port: int | None
    unix: bool
    requested_dir: str | None
    appendonly: bool
    extra_args: tuple[str, ...]
    name: str
    replicaof: tuple[str, int] | None
    config: str | None
    env: dict[str, str] | None

    @classmethod
    def checked(
        cls,
        engine: Engine | str | None,
        *,
        port: int | None,
        unix_socket: bool,
        directory: str | os.PathLike[str] | None,
        appendonly: bool,
        extra_args: Sequence[str],
        name: str,
        startup_timeout: float,
        replicaof: tuple[str, int] | None,
        config: str | None,
        env: Mapping[str, str] | None,
    ) -> ServerSettings:
        """The settings asked for, or :class:`~tenure.ArgumentError` naming the first bad one.

        ``startup_timeout`` is only checked (the process keeps it).
        """
        if port is not None and not 0 < port < 65536:
            raise ArgumentError("port", f"expected 1..65535 or None, got {port!r}")
        if port is not None and unix_socket:
            raise ArgumentError("port", "a unix_socket server listens on no TCP port")
        if isinstance(extra_args, (str, bytes)):
            raise ArgumentError("extra_args", "expected a sequence of strings, not one string")
        if not startup_timeout > 0:
            raise ArgumentError("startup_timeout", f"expected > 0, got {startup_timeout!r}")
        found = engine if isinstance(engine, Engine) else find_engine(engine)
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ArgumentError("env", "expected a mapping of str to str")
        return cls(
            engine=found,
            requested_port=port,
            unix=unix_socket,
            requested_dir=os.path.abspath(os.fspath(directory)) if directory else None,
            appendonly=appendonly,
            extra_args=tuple(str(arg) for arg in extra_args),
            name=name,
            replicaof=replicaof,
            config=config,
            env=dict(env) if env else None,
        )

    @property
    def cluster_bus(self) -> bool:
        """Whether the server runs in cluster mode (its port's bus port must be free too)."""
        args = self.extra_args
        return any(
            arg == "--cluster-enabled" and value.lower() == "yes"
            for arg, value in itertools.pairwise(args)
        )

    def command(self, port: int, folder: ServerFolder) -> list[str]:
        """The command line of a start on ``port`` in the prepared ``folder``."""
        directory = folder.path
        assert directory is not None
        return server_command(
            self.engine.server,
            port=port,
            directory=directory,
            log_path=os.path.join(directory, LOG_NAME),
            config_path=None if self.config is None else os.path.join(directory, CONFIG_NAME),
            socket_path=folder.socket_path(),
            appendonly=self.appendonly,
            replicaof=self.replicaof,
            extra_args=self.extra_args,
        )
