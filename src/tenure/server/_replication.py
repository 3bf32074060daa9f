"""A primary and its replicas: :class:`Replicated`, with promotion of a replica.

:meth:`Replicated.start` returns once every replica's link to the primary is
up; :meth:`Replicated.promote` turns a replica into the primary and repoints
the others. :data:`REPLICATION_ARGS` are the replication options every
replicating server (cluster nodes too) runs with.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from tenure.server._binaries import Engine
from tenure.server._commands import execute
from tenure.server._ports import HOST
from tenure.server._process import ServerProcess
from tenure.server._topology import Topology, check_count, parallel, resolve, start_one, wait_until

__all__ = ["REPLICATION_ARGS", "Replicated"]

# Full syncs through a disk RDB: diskless sync waits 5 s for more replicas to join, and
# after it a replica's first acknowledgement can lag ~1 s, so a first WAIT stalls.
REPLICATION_ARGS = ("--repl-diskless-sync", "no")


def _replication_problems(primary: ServerProcess, replicas: Sequence[ServerProcess]) -> list[str]:
    problems: list[str] = []
    live = [replica for replica in replicas if replica.running]
    for replica in live:
        info = replica.info("replication")
        if info.get("role") != "slave" or info.get("master_port") != str(primary.port):
            problems.append(f"{replica.name}: role {info.get('role')} of {info.get('master_port')}")
        elif info.get("master_link_status") != "up":
            problems.append(f"{replica.name}: master_link_status {info.get('master_link_status')}")
    info = primary.info("replication")
    if info.get("role") != "master":
        problems.append(f"{primary.name}: role {info.get('role')}")
    online = sum(
        1 for key, value in info.items() if key.startswith("slave") and "state=online" in value
    )
    if info.get("connected_slaves") != str(len(live)) or online != len(live):
        problems.append(
            f"{primary.name}: connected_slaves={info.get('connected_slaves')} "
            f"online={online}, expected {len(live)}"
        )
    return problems


class Replicated(Topology):
    """A primary and ``replicas`` replicas (``--replicaof 127.0.0.1 <primary port>``).

    :meth:`start` returns when every replica reports ``master_link_status:up``
    and the primary counts them all online. ``appendonly`` applies to every
    process; ``extra_args`` are added to every command line.
    """

    def __init__(
        self,
        replicas: int = 1,
        engine: Engine | str | None = None,
        appendonly: bool = False,
        *,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 20.0,
    ) -> None:
        super().__init__(startup_timeout)
        check_count("replicas", replicas, 0)
        resolved = resolve(engine)
        args = (*REPLICATION_ARGS, *extra_args)
        self._primary = ServerProcess(
            resolved,
            appendonly=appendonly,
            extra_args=args,
            name="primary",
            startup_timeout=startup_timeout,
        )
        self._replicas = [
            ServerProcess(
                resolved,
                appendonly=appendonly,
                extra_args=args,
                name=f"replica-{index}",
                startup_timeout=startup_timeout,
            )
            for index in range(replicas)
        ]

    @property
    def primary(self) -> ServerProcess:
        """The current primary (changes with :meth:`promote`)."""
        return self._primary

    @property
    def replicas(self) -> tuple[ServerProcess, ...]:
        """The current replicas, in order (changes with :meth:`promote`)."""
        return tuple(self._replicas)

    @property
    def processes(self) -> tuple[ServerProcess, ...]:
        """The primary, then the replicas."""
        return (self._primary, *self._replicas)

    @property
    def engine(self) -> Engine:
        """The server binary."""
        return self._primary.engine

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` connected to the primary."""
        return self._primary.client(**kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A new ``redis.asyncio.Redis`` connected to the primary."""
        return self._primary.async_client(**kwargs)

    def replica_client(self, index: int = 0, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` connected to replica ``index``."""
        return self._replicas[index].client(**kwargs)

    def async_replica_client(self, index: int = 0, **kwargs: Any) -> redis.asyncio.Redis:
        """A new ``redis.asyncio.Redis`` connected to replica ``index``."""
        return self._replicas[index].async_client(**kwargs)

    def wait_replication(self, timeout: float | None = None) -> None:
        """Block until every running replica's link to the primary is up."""
        limit = self.startup_timeout if timeout is None else timeout
        wait_until(
            lambda: _replication_problems(self._primary, self._replicas),
            time.monotonic() + limit,
            "replication",
            limit,
        )

    def promote(self, index: int, timeout: float | None = None) -> ServerProcess:
        """Make replica ``index`` the primary (``REPLICAOF NO ONE``) and repoint the rest.

        The other replicas, and the old primary if it still runs, become
        replicas of the new one; a stopped or killed old primary is set to
        come back as a replica when restarted. :attr:`primary` and
        :attr:`replicas` are updated (the old primary goes last). Waits until
        the links are up and returns the new primary.
        """
        with self._lock:
            new = self._replicas[index]
            old = self._primary
            client = new._admin_client()
            try:
                execute(client, "REPLICAOF", "NO", "ONE")
            finally:
                client.close()
            new._set_replicaof(None)
            others = [replica for i, replica in enumerate(self._replicas) if i != index]
            others.append(old)
            for process in others:
                process._set_replicaof((HOST, new.port))
                if process.running:
                    client = process._admin_client()
                    try:
                        execute(client, "REPLICAOF", HOST, new.port)
                    finally:
                        client.close()
            self._primary = new
            self._replicas = others
            self.wait_replication(timeout)
            return new

    def _build(self) -> None:
        self._primary.start()
        for replica in self._replicas:
            replica._set_replicaof((HOST, self._primary.port))
        parallel(start_one, self._replicas)
        self.wait_replication()

    def _stop_groups(self) -> list[tuple[ServerProcess, ...]]:
        # Replicas first, so the primary has no one to wait for.
        return [tuple(self._replicas), (self._primary,)]

    def __repr__(self) -> str:
        ports = [process._ports.number for process in self.processes]
        return (
            f"<Replicated {self.engine} replicas={len(self._replicas)} "
            f"ports={ports} {self._state()}>"
        )
