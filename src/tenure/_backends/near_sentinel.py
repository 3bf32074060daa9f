"""The servers of a Sentinel service, for near caching: every one that may take a write.

A near cache on a client of ``Sentinel.master_for`` reads from the master,
but a failover moves the master, and for a while two servers may take
writes: the promoted replica, and the old master while it still believes it
is one (Sentinel reconfigures it seconds later, or when it comes back).
Tracking the master alone would miss the writes to the other. So tenure
tracks every server of the service (:mod:`tenure._backends.near_tracking`,
one tracker each), as it tracks every primary of a cluster: a near read is
served only while every one of them confirms it, and a write to any of them
is announced (a replica announces the writes it replicates too).

A :class:`SentinelWatch` per service and set of sentinels asks them, once a
second in a thread of its own, for the master and the replicas: the union
of what the sentinels that answer know, leaving out the replicas they find
down (``s_down``, ``o_down``); the master is kept whatever its state. A
near layer looks at the watch's list (in memory, no round trip) and tracks
each server on it. When no near layer has asked for a while the watch
stops asking the sentinels, and starts again when one does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure._core.exceptions import ArgumentError

__all__ = ["MasterCheck", "SentinelWatch", "is_sentinel_pool", "watch_for"]

logger = logging.getLogger("tenure.cache")

LOOK_EVERY = 1.0
"""Seconds between two looks at the sentinels."""
IDLE_AFTER = 30.0
"""Seconds without a near layer asking after which the watch stops looking."""
DOWN_FLAGS = frozenset({"s_down", "o_down"})
"""A replica with one of these flags is left out (it answers no one)."""

Address = tuple[str, int]


def is_sentinel_pool(pool: Any) -> bool:
    """Whether ``pool`` is a Sentinel client's (``master_for``/``slave_for``), sync or asyncio."""
    return hasattr(pool, "sentinel_manager") and hasattr(pool, "service_name")


def _pairs(reply: Any) -> dict[str, str]:
    """A Sentinel reply of alternating names and values, as text."""
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[::2], reply[1::2], strict=True))
    return {_text(name): _text(value) for name, value in items}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class SentinelWatch:
    """The servers of one Sentinel service, as its sentinels know them (module docstring)."""

    def __init__(self, service: str, sentinels: list[Callable[[], Any]], label: str) -> None:
        self.service = service
        self.label = label
        self._makers = sentinels  # each: () -> a new, unconnected sync redis Connection
        self._connections: list[Any] = [None] * len(sentinels)
        self._servers: tuple[Address, ...] = ()
        self.masters: frozenset[Address] = frozenset()
        """The master each sentinel that answered the last look names (the same object
        while they do not change)."""
        self._looked = 0  # looks that found the service
        self._asked = time.monotonic()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._idle = False  # the thread waits for a near layer to ask
        self._said = ""

    @property
    def looks(self) -> int:
        """How many looks have found the service so far."""
        return self._looked

    def servers(self) -> tuple[Address, ...]:
        """Every server of the service known now (none before the first look answered)."""
        self._asked = time.monotonic()
        if self._thread is None:
            self._start()
        elif self._idle:
            self._wake.set()
        return self._servers

    def _start(self) -> None:
        with self._mutex:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"tenure-near-sentinel {self.label}", daemon=True
                )
                self._thread.start()

    def forked(self) -> None:
        """In a forked child: the parent's thread and connections are not here."""
        self._thread = None
        self._mutex = threading.Lock()
        self._wake = threading.Event()
        self._idle = False
        self._connections = [None] * len(self._makers)

    def _run(self) -> None:
        while True:
            if time.monotonic() - self._asked > IDLE_AFTER:
                self._close()
                self._idle = True
                self._wake.wait()  # until a near layer asks again
                self._idle = False
            self._wake.clear()
            self.look()
            self._wake.wait(LOOK_EVERY)

    def look(self) -> None:
        """Ask every sentinel for the master and the replicas; keep the union of the answers."""
        found: set[Address] = set()
        masters: set[Address] = set()
        answered = 0
        failures: list[str] = []
        for index in range(len(self._makers)):
            try:
                master, servers = self._ask(index)
                masters.add(master)
                found.update(servers)
                answered += 1
            except (redis.RedisError, OSError, ValueError, IndexError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                self._drop(index)
        if answered:
            if masters != self.masters:
                self.masters = frozenset(masters)
            self._servers = tuple(sorted(found))
            self._looked += 1
            self._said = ""
        elif failures and failures[0] != self._said:
            self._said = failures[0]
            logger.warning(
                "tenure near cache: no sentinel of %s answered (%s); the servers "
                "tracked stay those known before",
                self.label,
                failures[0],
            )

    def _ask(self, index: int) -> tuple[Address, set[Address]]:
        """The master sentinel ``index`` names, and every server of the service it knows."""
        connection = self._connections[index]
        if connection is None:
            connection = self._connections[index] = self._makers[index]()
            connection.connect()
        connection.send_command("SENTINEL", "MASTER", self.service)
        master = _pairs(connection.read_response())
        connection.send_command("SENTINEL", "REPLICAS", self.service)
        replicas = [_pairs(each) for each in connection.read_response()]
        named = (master["ip"], int(master["port"]))
        found = {named}
        for replica in replicas:
            if not DOWN_FLAGS & set(replica.get("flags", "").split(",")):
                found.add((replica["ip"], int(replica["port"])))
        return named, found

    def _drop(self, index: int) -> None:
        connection, self._connections[index] = self._connections[index], None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.disconnect()

    def _close(self) -> None:
        for index in range(len(self._makers)):
            self._drop(index)


class MasterCheck:
    """Whether a ``master_for`` client reads from the server its sentinels name master.

    redis-py's Sentinel client keeps its connections to the old master after
    a failover until Sentinel reconfigures that server (seconds after a
    manual failover): its reads are stale meanwhile, near or not. A near
    layer keeps and serves nothing while :meth:`state` is not one that
    :meth:`agreed` (and drops everything when it changes).
    """

    __slots__ = ("_pool", "_watch")

    def __init__(self, pool: Any, watch: SentinelWatch) -> None:
        self._pool = pool
        self._watch = watch

    def state(self) -> tuple[Any, frozenset[Address]]:
        """(the address the client's pool connects to, the masters the sentinels name)."""
        return self._pool.master_address, self._watch.masters

    @staticmethod
    def agreed(state: tuple[Any, frozenset[Address]]) -> bool:
        """Whether the client reads from a server the sentinels name master, in ``state``."""
        address, masters = state
        return address is not None and tuple(address) in masters


_watches: dict[tuple[Any, ...], SentinelWatch] = {}
_making = threading.Lock()


def watch_for(
    pool: Any,
    copied: Callable[[dict[str, Any]], dict[str, Any]],
    sync_class: Callable[[type], type],
) -> SentinelWatch:
    """The watch of the service ``pool`` (a ``master_for`` client's pool) reaches.

    ``copied`` keeps of a client's connection settings what a connection of
    tenure's own takes; ``sync_class`` maps a connection class to its sync kind.
    """
    if not getattr(pool, "is_master", True):
        raise ArgumentError(
            "near",
            "near caching reads from the master: a client of Sentinel.slave_for reads "
            "replicas, whose lag no bound covers (use Sentinel.master_for)",
        )
    makers: list[Callable[[], Any]] = []
    where: list[Any] = [pool.service_name]
    for sentinel in pool.sentinel_manager.sentinels:
        sentinel_pool = sentinel.connection_pool
        settings = copied(sentinel_pool.connection_kwargs)
        kind = sync_class(sentinel_pool.connection_class)
        where.append((kind.__name__, settings.get("host"), settings.get("port")))

        def make(kind: type = kind, settings: dict[str, Any] = settings) -> Any:
            return kind(**settings, protocol=2, socket_timeout=1.0, retry=Retry(NoBackoff(), 0))

        makers.append(make)
    key = tuple(where)
    found = _watches.get(key)
    if found is None:
        with _making:
            found = _watches.get(key)
            if found is None:
                label = f"Sentinel service {pool.service_name!r}"
                found = _watches[key] = SentinelWatch(pool.service_name, makers, label)
    return found


def after_fork_in_child() -> None:
    """Every watch's thread and connections were the parent's."""
    for watch in list(_watches.values()):
        watch.forked()
