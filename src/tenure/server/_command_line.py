"""The command line a private server runs with.

:func:`server_command` puts tenure's fixed options (loopback only, protected
mode, no daemon, no RDB snapshots, DEBUG from loopback only) before the
server's own (port, folder, log, socket, AOF, primary) and the caller's extra
arguments last, so that those override tenure's defaults.
"""

from __future__ import annotations

from collections.abc import Sequence

from tenure.server._ports import HOST

__all__ = ["server_command"]


def server_command(
    binary: str,
    *,
    port: int,
    directory: str,
    log_path: str,
    config_path: str | None,
    socket_path: str | None,
    appendonly: bool,
    replicaof: tuple[str, int] | None,
    extra_args: Sequence[str],
) -> list[str]:
    """The argument list that runs ``binary`` as one private server."""
    args = [binary]
    if config_path is not None:
        args.append(config_path)
    args += [
        "--port",
        str(port),
        "--bind",
        HOST,
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
        "--dir",
        directory,
        "--logfile",
        log_path,
        "--save",
        "",
        "--enable-debug-command",
        "local",
    ]
    if socket_path is not None:
        args += ["--unixsocket", socket_path, "--unixsocketperm", "700"]
    if appendonly:
        args += ["--appendonly", "yes"]
    if replicaof is not None:
        args += ["--replicaof", replicaof[0], str(replicaof[1])]
    args += extra_args
    return args
