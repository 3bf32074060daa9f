"""Sentinel processes watching a primary and its replicas: :class:`Sentinel`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from tenure._core.exceptions import ArgumentError, EmbeddedServerError
from tenure.server._binaries import Engine
from tenure.server._commands import execute
from tenure.server._ports import HOST
from tenure.server._process import ServerProcess
from tenure.server._replication import Replicated
from tenure.server._topology import Topology, check_count, parallel, resolve, start_one, wait_until

__all__ = ["Sentinel"]


def _pairs(reply: Any) -> dict[str, str]:
    """A flat ``[key, value, key, value, ...]`` reply (or a dict) as a dict of strings."""
    if isinstance(reply, dict):
        return {str(key): str(value) for key, value in reply.items()}
    items = [str(item) for item in reply]
    return dict(zip(items[0::2], items[1::2], strict=False))


class Sentinel(Topology):
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
        check_count("sentinels", sentinels, 1)
        check_count("down_after_ms", down_after_ms, 1)
        check_count("failover_timeout_ms", failover_timeout_ms, 1)
        if not service_name or any(char.isspace() for char in service_name):
            raise ArgumentError("service_name", f"expected a word, got {service_name!r}")
        if quorum is None:
            quorum = sentinels // 2 + 1
        check_count("quorum", quorum, 1)
        resolved = resolve(engine)
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
        wait_until(self._sentinel_problems, time.monotonic() + limit, "sentinels", limit)

    def _build(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        self._replication.start()
        config = self._config()
        for process in self._sentinels:
            process._set_config(config)
        parallel(start_one, self._sentinels)
        wait_until(
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
        ports = [process._ports.number for process in self.processes]
        return (
            f"<Sentinel {self.engine} service={self._service_name!r} "
            f"replicas={len(self.replicas)} sentinels={len(self._sentinels)} "
            f"ports={ports} {self._state()}>"
        )
