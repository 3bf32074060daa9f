"""A Redis Cluster assembled with plain commands: :class:`Cluster`.

Besides the topology itself, this module reads ``CLUSTER NODES`` text into one
node's view of the cluster (masters with their slots and replicas, and any
node in a bad state), which is how the nodes are checked to agree on the slot
map and how the owner of a slot is found after a failover.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from tenure._core.exceptions import ArgumentError, EmbeddedServerError
from tenure.server._binaries import Engine
from tenure.server._commands import execute, parse_info
from tenure.server._ports import HOST
from tenure.server._process import ServerProcess
from tenure.server._replication import REPLICATION_ARGS
from tenure.server._topology import Topology, check_count, parallel, resolve, start_one, wait_until

__all__ = ["Cluster"]

_SLOTS = 16384


def _parse_slots(items: Iterable[str]) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    for item in items:
        if item.startswith("["):  # a slot being imported or migrated
            continue
        start, _, end = item.partition("-")
        ranges.append((int(start), int(end or start)))
    return tuple(sorted(ranges))


def _cluster_view(nodes_text: str) -> frozenset[tuple[Any, ...]]:
    """One node's view of the cluster: masters with slots and replicas, plus bad flags."""
    slots: dict[str, tuple[tuple[int, int], ...]] = {}
    replicas: dict[str, set[str]] = {}
    view: set[tuple[Any, ...]] = set()
    for line in nodes_text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        node_id, flags, master = parts[0], set(parts[2].split(",")), parts[3]
        bad = flags & {"handshake", "noaddr", "fail", "fail?"}
        if bad:
            view.add(("bad", node_id, tuple(sorted(bad))))
        if "master" in flags:
            slots[node_id] = _parse_slots(parts[8:])
        elif "slave" in flags and master != "-":
            replicas.setdefault(master, set()).add(node_id)
    for node_id, ranges in slots.items():
        view.add(("master", node_id, ranges, frozenset(replicas.get(node_id, ()))))
    return frozenset(view)


def _slot_ranges(masters: int) -> list[tuple[int, int]]:
    return [(i * _SLOTS // masters, (i + 1) * _SLOTS // masters - 1) for i in range(masters)]


class Cluster(Topology):
    """A Redis Cluster of ``masters`` masters with ``replicas_per_master`` replicas each.

    Every node runs with ``--cluster-enabled yes``, ``nodes.conf`` in its own
    folder and ``--cluster-node-timeout`` ``node_timeout`` ms (2000: failover
    tests stay fast). The cluster is assembled with plain commands (no
    ``*-cli``): ``CLUSTER ADDSLOTSRANGE`` splits the 16384 slots evenly,
    ``CLUSTER MEET`` joins every node to the first (and to every other, so no
    node waits for gossip to learn of a peer), ``CLUSTER REPLICATE``
    attaches the replicas. :meth:`start` returns when every node reports
    ``cluster_state:ok``, knows every node, and all nodes agree on the slot
    map and on who replicates whom.

    :attr:`masters` and :attr:`replicas` are the roles given at start; after a
    failover, :meth:`node_for_key` asks the cluster who owns a slot now.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas_per_master: int = 0,
        engine: Engine | str | None = None,
        *,
        node_timeout: int = 2000,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
    ) -> None:
        super().__init__(startup_timeout)
        check_count("masters", masters, 1)
        check_count("replicas_per_master", replicas_per_master, 0)
        check_count("node_timeout", node_timeout, 1)
        if masters > _SLOTS:
            raise ArgumentError("masters", f"at most {_SLOTS}, got {masters}")
        resolved = resolve(engine)
        args = (
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout),
            *REPLICATION_ARGS,
            *extra_args,
        )

        def node(name: str) -> ServerProcess:
            return ServerProcess(
                resolved,
                appendonly=appendonly,
                extra_args=args,
                name=name,
                startup_timeout=startup_timeout,
            )

        self._masters = [node(f"master-{m}") for m in range(masters)]
        self._replicas: list[ServerProcess] = []
        self._master_of: dict[int, ServerProcess] = {}
        for m, master in enumerate(self._masters):
            for r in range(replicas_per_master):
                replica = node(f"replica-{m}-{r}")
                self._replicas.append(replica)
                self._master_of[id(replica)] = master
        self._replicas_per_master = replicas_per_master
        self._node_ids: dict[int, str] = {}

    @property
    def masters(self) -> tuple[ServerProcess, ...]:
        """The nodes started as masters, in slot order."""
        return tuple(self._masters)

    @property
    def replicas(self) -> tuple[ServerProcess, ...]:
        """The nodes started as replicas (those of master 0 first)."""
        return tuple(self._replicas)

    @property
    def nodes(self) -> tuple[ServerProcess, ...]:
        """Every node: the masters, then the replicas."""
        return (*self._masters, *self._replicas)

    @property
    def processes(self) -> tuple[ServerProcess, ...]:
        """Same as :attr:`nodes`."""
        return self.nodes

    @property
    def engine(self) -> Engine:
        """The server binary."""
        return self._masters[0].engine

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node, for any cluster client."""
        return [node.address for node in self.nodes]

    def replicas_of(self, master: ServerProcess) -> tuple[ServerProcess, ...]:
        """The nodes started as replicas of ``master``."""
        return tuple(
            replica for replica in self._replicas if self._master_of[id(replica)] is master
        )

    def node_id(self, node: ServerProcess) -> str:
        """The cluster node ID of ``node`` (40 hex digits; kept across restarts)."""
        try:
            return self._node_ids[id(node)]
        except KeyError:
            raise EmbeddedServerError(f"{node!r} is not a started node of {self!r}") from None

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """A new ``redis.cluster.RedisCluster`` seeded with every node."""
        node_class = cast(
            "Callable[[str, int], redis.cluster.ClusterNode]", redis.cluster.ClusterNode
        )
        nodes = [node_class(host, port) for host, port in self.startup_nodes]
        return redis.cluster.RedisCluster(startup_nodes=nodes, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.cluster.RedisCluster:
        """A new ``redis.asyncio.cluster.RedisCluster`` seeded with every node."""
        nodes = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in self.startup_nodes]
        return redis.asyncio.cluster.RedisCluster(startup_nodes=nodes, **kwargs)

    def node_client(self, index: int, **kwargs: Any) -> redis.Redis:
        """A plain ``redis.Redis`` connected to node ``index`` of :attr:`nodes`."""
        return self.nodes[index].client(**kwargs)

    def node_for_slot(self, slot: int) -> ServerProcess:
        """The master that owns ``slot`` now, as the first reachable node sees it."""
        if not 0 <= slot < _SLOTS:
            raise ArgumentError("slot", f"expected 0..{_SLOTS - 1}, got {slot!r}")
        by_id = {node_id: node for node in self.nodes if (node_id := self._node_ids.get(id(node)))}
        last_error: Exception | None = None
        for node in self.nodes:
            if not node.running or node.paused:
                continue
            client = node._admin_client()
            try:
                text = str(execute(client, "CLUSTER", "NODES"))
            except redis.RedisError as exc:
                last_error = exc
                continue
            finally:
                client.close()
            for entry in _cluster_view(text):
                if entry[0] == "master" and any(lo <= slot <= hi for lo, hi in entry[2]):
                    owner = by_id.get(entry[1])
                    if owner is not None:
                        return owner
            break
        raise EmbeddedServerError(
            f"no node of {self!r} owns slot {slot}" + (f" ({last_error})" if last_error else "")
        )

    def node_for_key(self, key: str | bytes) -> ServerProcess:
        """The master that owns ``key``'s hash slot now (hash tags honoured)."""
        encoded = key.encode("utf-8") if isinstance(key, str) else key
        return self.node_for_slot(key_slot(encoded))

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Block until every running node reports ``cluster_state:ok`` and agrees on the map.

        Unlike :meth:`start`, the expected map is not checked: after a
        failover the roles have legitimately changed.
        """
        limit = self.startup_timeout if timeout is None else timeout
        wait_until(
            lambda: self._problems(expected=None),
            time.monotonic() + limit,
            "cluster",
            limit,
        )

    def _problems(self, expected: frozenset[tuple[Any, ...]] | None) -> list[str]:
        problems: list[str] = []
        views: list[frozenset[tuple[Any, ...]]] = []
        live = [node for node in self.nodes if node.running]
        for node in live:
            client = node._admin_client()
            try:
                info = parse_info(str(execute(client, "CLUSTER", "INFO")))
                views.append(_cluster_view(str(execute(client, "CLUSTER", "NODES"))))
                replication = parse_info(str(execute(client, "INFO", "replication")))
            finally:
                client.close()
            if info.get("cluster_state") != "ok":
                problems.append(f"{node.name}: cluster_state {info.get('cluster_state')}")
            if info.get("cluster_known_nodes") != str(len(self.nodes)):
                problems.append(
                    f"{node.name}: knows {info.get('cluster_known_nodes')} of {len(self.nodes)}"
                )
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                problems.append(
                    f"{node.name}: master_link_status {replication.get('master_link_status')}"
                )
        if len(set(views)) > 1:
            problems.append("the nodes do not agree on the slot map yet")
        if expected is not None and views and views[0] != expected:
            problems.append("the slot map is not the one requested yet")
        return problems

    def _expected_view(self) -> frozenset[tuple[Any, ...]]:
        view: set[tuple[Any, ...]] = set()
        for master, (start, end) in zip(
            self._masters, _slot_ranges(len(self._masters)), strict=True
        ):
            replica_ids = frozenset(
                self._node_ids[id(replica)] for replica in self.replicas_of(master)
            )
            view.add(("master", self._node_ids[id(master)], ((start, end),), replica_ids))
        return frozenset(view)

    def _build(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        nodes = self.nodes
        parallel(start_one, nodes)
        clients = [node._admin_client() for node in nodes]
        try:
            for index, (node, client) in enumerate(zip(nodes, clients, strict=True)):
                self._node_ids[id(node)] = str(execute(client, "CLUSTER", "MYID"))
                # Distinct epochs up front, as redis-cli does: no collisions to resolve.
                execute(client, "CLUSTER", "SET-CONFIG-EPOCH", index + 1)
            for client, (start, end) in zip(
                clients, _slot_ranges(len(self._masters)), strict=False
            ):
                execute(client, "CLUSTER", "ADDSLOTSRANGE", start, end)
            # Every node meets every earlier node (the first one included): with the
            # whole mesh introduced up front, nobody waits for gossip to learn of a peer.
            for index, client in enumerate(clients):
                for earlier in nodes[:index]:
                    execute(client, "CLUSTER", "MEET", HOST, earlier.port)
            self._attach_replicas(clients[len(self._masters) :], deadline)
        finally:
            for client in clients:
                client.close()
        expected = self._expected_view()
        wait_until(
            lambda: self._problems(expected), deadline, f"cluster {self!r}", self.startup_timeout
        )

    def _attach_replicas(self, clients: Sequence[redis.Redis], deadline: float) -> None:
        pending = dict(zip([id(replica) for replica in self._replicas], clients, strict=True))

        def problems() -> list[str]:
            waiting: list[str] = []
            for replica in self._replicas:
                client = pending.get(id(replica))
                if client is None:
                    continue
                master_id = self._node_ids[id(self._master_of[id(replica)])]
                known = {
                    line.split()[0]: line.split()[2]
                    for line in str(execute(client, "CLUSTER", "NODES")).splitlines()
                    if line.strip()
                }
                if master_id in known and "handshake" not in known[master_id]:
                    execute(client, "CLUSTER", "REPLICATE", master_id)
                    del pending[id(replica)]
                else:
                    waiting.append(f"{replica.name} does not know its master yet")
            return waiting

        wait_until(problems, deadline, "cluster replicas", self.startup_timeout)

    def __repr__(self) -> str:
        ports = [node._ports.number for node in self.nodes]
        return (
            f"<Cluster {self.engine} masters={len(self._masters)} "
            f"replicas_per_master={self._replicas_per_master} ports={ports} {self._state()}>"
        )
