"""Topologies built from :class:`ServerProcess`: standalone, replicated, cluster, Sentinel.

Each topology is a sync and async context manager with ``start()`` / ``stop()``.
``start()`` returns once the whole topology is usable (replication links up,
cluster slots agreed on every node, sentinels monitoring the primary and its
replicas); a start that fails half-way stops every process it started.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.crc import key_slot

from tenure._exceptions import ArgumentError, EmbeddedServerError, ServerStartError
from tenure.server._binaries import Engine, find_engine
from tenure.server._process import HOST, ServerProcess, _Lifecycle, execute, parse_info

__all__ = ["Cluster", "Replicated", "Sentinel", "Standalone"]

_T = TypeVar("_T")

_SLOTS = 16384
_POLL = 0.02
# Full syncs through a disk RDB: diskless sync waits 5 s for more replicas to join, and
# after it a replica's first acknowledgement can lag ~1 s, so a first WAIT stalls.
_REPLICATION_ARGS = ("--repl-diskless-sync", "no")


def _resolve(engine: Engine | str | None) -> Engine:
    return engine if isinstance(engine, Engine) else find_engine(engine)


def _parallel(function: Callable[[_T], object], items: Sequence[_T]) -> None:
    """Run ``function`` on every item in threads; wait for all, then raise the first error."""
    if len(items) <= 1:
        for item in items:
            function(item)
        return
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="tenure-server") as pool:
        futures = [pool.submit(function, item) for item in items]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error


def _start_one(process: ServerProcess) -> None:
    process.start()


def _check_count(argument: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentError(argument, f"expected an integer >= {minimum}, got {value!r}")


def _wait_until(
    problems: Callable[[], list[str]], deadline: float, what: str, timeout: float
) -> None:
    """Poll ``problems()`` until it returns nothing; ServerStartError with the last ones."""
    while True:
        try:
            found = problems()
        except redis.RedisError as exc:
            found = [f"{type(exc).__name__}: {exc}"]
        if not found:
            return
        if time.monotonic() >= deadline:
            listing = "\n  ".join(found[:20])
            raise ServerStartError(f"{what} not ready within {timeout:g} s:\n  {listing}")
        time.sleep(_POLL)


class _Topology(_Lifecycle):
    """Shared lifecycle: start all, roll back on failure, stop all in parallel."""

    def __init__(self, startup_timeout: float) -> None:
        if not startup_timeout > 0:
            raise ArgumentError("startup_timeout", f"expected > 0, got {startup_timeout!r}")
        self.startup_timeout = startup_timeout
        self._lock = threading.RLock()
        self._started = False

    @property
    def processes(self) -> tuple[ServerProcess, ...]:
        """Every process of the topology."""
        raise NotImplementedError

    @property
    def running(self) -> bool:
        """Whether the topology was started and every one of its processes is alive."""
        return self._started and all(process.running for process in self.processes)

    def _build(self) -> None:
        raise NotImplementedError

    def _stop_groups(self) -> list[tuple[ServerProcess, ...]]:
        return [self.processes]

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            try:
                self._build()
            except BaseException:
                self._stop(1.0)
                raise
            self._started = True

    def _stop(self, timeout: float) -> None:
        with self._lock:
            errors: list[BaseException] = []
            for group in self._stop_groups():
                try:
                    _parallel(lambda process: process.stop(timeout), group)
                except Exception as exc:
                    errors.append(exc)
            self._started = False
            if errors:
                raise errors[0]

    def _state(self) -> str:
        if self._started:
            return "running" if self.running else "degraded"
        return "stopped"


# --------------------------------------------------------------------------- Standalone


class Standalone(_Topology):
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


# --------------------------------------------------------------------------- Replicated


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


class Replicated(_Topology):
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
        _check_count("replicas", replicas, 0)
        resolved = _resolve(engine)
        args = (*_REPLICATION_ARGS, *extra_args)
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
        _wait_until(
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
        _parallel(_start_one, self._replicas)
        self.wait_replication()

    def _stop_groups(self) -> list[tuple[ServerProcess, ...]]:
        # Replicas first, so the primary has no one to wait for.
        return [tuple(self._replicas), (self._primary,)]

    def __repr__(self) -> str:
        ports = [process._port for process in self.processes]
        return (
            f"<Replicated {self.engine} replicas={len(self._replicas)} "
            f"ports={ports} {self._state()}>"
        )


# --------------------------------------------------------------------------- Cluster


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


class Cluster(_Topology):
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
        _check_count("masters", masters, 1)
        _check_count("replicas_per_master", replicas_per_master, 0)
        _check_count("node_timeout", node_timeout, 1)
        if masters > _SLOTS:
            raise ArgumentError("masters", f"at most {_SLOTS}, got {masters}")
        resolved = _resolve(engine)
        args = (
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout),
            *_REPLICATION_ARGS,
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
        _wait_until(
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
        _parallel(_start_one, nodes)
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
        _wait_until(
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

        _wait_until(problems, deadline, "cluster replicas", self.startup_timeout)

    def __repr__(self) -> str:
        ports = [node._port for node in self.nodes]
        return (
            f"<Cluster {self.engine} masters={len(self._masters)} "
            f"replicas_per_master={self._replicas_per_master} ports={ports} {self._state()}>"
        )


# --------------------------------------------------------------------------- Sentinel


def _pairs(reply: Any) -> dict[str, str]:
    """A flat ``[key, value, key, value, ...]`` reply (or a dict) as a dict of strings."""
    if isinstance(reply, dict):
        return {str(key): str(value) for key, value in reply.items()}
    items = [str(item) for item in reply]
    return dict(zip(items[0::2], items[1::2], strict=False))


class Sentinel(_Topology):
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinel processes.

    Each sentinel runs the same server binary with ``<folder>/server.conf
    --sentinel``; its configuration monitors ``service_name`` at the primary
    with quorum ``quorum`` (default: a majority of the sentinels),
    ``down-after-milliseconds`` 1000 and ``failover-timeout`` 5000.
    :meth:`start` returns when every sentinel reports the primary as master,
    knows every replica and every other sentinel.
    """

    def __init__(
        self,
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
    ) -> None:
        super().__init__(startup_timeout)
        _check_count("sentinels", sentinels, 1)
        _check_count("down_after_ms", down_after_ms, 1)
        _check_count("failover_timeout_ms", failover_timeout_ms, 1)
        if not service_name or any(char.isspace() for char in service_name):
            raise ArgumentError("service_name", f"expected a word, got {service_name!r}")
        if quorum is None:
            quorum = sentinels // 2 + 1
        _check_count("quorum", quorum, 1)
        resolved = _resolve(engine)
        self._replication = Replicated(
            replicas, resolved, appendonly, startup_timeout=startup_timeout
        )
        self._service_name = service_name
        self._quorum = quorum
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._sentinels = [
            ServerProcess(
                resolved,
                extra_args=("--sentinel",),
                name=f"sentinel-{index}",
                startup_timeout=startup_timeout,
                config="",
            )
            for index in range(sentinels)
        ]

    @property
    def service_name(self) -> str:
        """The name the sentinels monitor the primary under."""
        return self._service_name

    @property
    def replication(self) -> Replicated:
        """The primary and its replicas."""
        return self._replication

    @property
    def primary(self) -> ServerProcess:
        """The primary as started (after a failover, ask :meth:`master_address`)."""
        return self._replication.primary

    @property
    def replicas(self) -> tuple[ServerProcess, ...]:
        """The replicas as started."""
        return self._replication.replicas

    @property
    def sentinels(self) -> tuple[ServerProcess, ...]:
        """The Sentinel processes."""
        return tuple(self._sentinels)

    @property
    def processes(self) -> tuple[ServerProcess, ...]:
        """The primary, the replicas, then the sentinels."""
        return (*self._replication.processes, *self._sentinels)

    @property
    def engine(self) -> Engine:
        """The server binary."""
        return self._replication.engine

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel."""
        return [process.address for process in self._sentinels]

    def sentinel(self, **kwargs: Any) -> redis.sentinel.Sentinel:
        """A new ``redis.sentinel.Sentinel`` for the sentinels (``kwargs`` go to it)."""
        factory = cast("Callable[..., redis.sentinel.Sentinel]", redis.sentinel.Sentinel)
        return factory(self.sentinel_addresses, **kwargs)

    def async_sentinel(self, **kwargs: Any) -> redis.asyncio.sentinel.Sentinel:
        """A new ``redis.asyncio.sentinel.Sentinel`` for the sentinels."""
        factory = cast(
            "Callable[..., redis.asyncio.sentinel.Sentinel]", redis.asyncio.sentinel.Sentinel
        )
        return factory(self.sentinel_addresses, **kwargs)

    def master_client(self, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` that finds the master through the sentinels (``master_for``)."""
        master_for = cast("Callable[..., redis.Redis]", self.sentinel().master_for)
        return master_for(self._service_name, **kwargs)

    def async_master_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A ``redis.asyncio.Redis`` that finds the master through the sentinels."""
        master_for = cast("Callable[..., redis.asyncio.Redis]", self.async_sentinel().master_for)
        return master_for(self._service_name, **kwargs)

    def master_address(self) -> tuple[str, int]:
        """``(host, port)`` of the master according to the first sentinel that answers."""
        last_error: Exception | None = None
        for process in self._sentinels:
            if not process.running or process.paused:
                continue
            client = process._admin_client()
            try:
                reply = execute(client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._service_name)
            except redis.RedisError as exc:
                last_error = exc
                continue
            finally:
                client.close()
            if reply:
                return (str(reply[0]), int(reply[1]))
        raise EmbeddedServerError(f"no sentinel of {self!r} knows the master ({last_error})")

    def _config(self) -> str:
        name = self._service_name
        return (
            f"bind {HOST}\n"
            f"sentinel monitor {name} {HOST} {self.primary.port} {self._quorum}\n"
            f"sentinel down-after-milliseconds {name} {self._down_after_ms}\n"
            f"sentinel failover-timeout {name} {self._failover_timeout_ms}\n"
        )

    def _sentinel_problems(self) -> list[str]:
        problems: list[str] = []
        name = self._service_name
        replica_ports = {str(replica.port) for replica in self.replicas}
        for process in self._sentinels:
            client = process._admin_client()
            try:
                address = execute(client, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
                master = _pairs(execute(client, "SENTINEL", "MASTER", name))
                replicas = [_pairs(item) for item in execute(client, "SENTINEL", "REPLICAS", name)]
            finally:
                client.close()
            if not address or [str(part) for part in address] != [HOST, str(self.primary.port)]:
                problems.append(f"{process.name}: master address {address}")
            if master.get("flags") != "master":
                problems.append(f"{process.name}: master flags {master.get('flags')}")
            if master.get("num-other-sentinels") != str(len(self._sentinels) - 1):
                problems.append(
                    f"{process.name}: knows {master.get('num-other-sentinels')} other sentinels"
                )
            healthy = {
                replica.get("port", "?")
                for replica in replicas
                if replica.get("flags") == "slave" and replica.get("master-link-status") == "ok"
            }
            if healthy != replica_ports:
                problems.append(f"{process.name}: healthy replicas {sorted(healthy)}")
        return problems

    def wait_monitoring(self, timeout: float | None = None) -> None:
        """Block until every sentinel sees the started primary, replicas and sentinels."""
        limit = self.startup_timeout if timeout is None else timeout
        _wait_until(self._sentinel_problems, time.monotonic() + limit, "sentinels", limit)

    def _build(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        self._replication.start()
        config = self._config()
        for process in self._sentinels:
            process._set_config(config)
        _parallel(_start_one, self._sentinels)
        _wait_until(
            self._sentinel_problems,
            deadline,
            f"sentinels of {self._service_name!r}",
            self.startup_timeout,
        )

    def _stop_groups(self) -> list[tuple[ServerProcess, ...]]:
        # Sentinels first, so none starts a failover while the servers go down.
        return [tuple(self._sentinels), *self._replication._stop_groups()]

    def _stop(self, timeout: float) -> None:
        with self._lock:
            try:
                super()._stop(timeout)
            finally:
                self._replication._started = False

    def __repr__(self) -> str:
        ports = [process._port for process in self.processes]
        return (
            f"<Sentinel {self.engine} service={self._service_name!r} "
            f"replicas={len(self.replicas)} sentinels={len(self._sentinels)} "
            f"ports={ports} {self._state()}>"
        )
