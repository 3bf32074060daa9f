"""The locks under test, each behind the same two calls: acquire and release.

The peers are imported only when a contender is made, so ``tenure bench``
without the ``bench`` extra fails with a message that says what to install.

Every contender uses a 10 s lease (``LEASE_SECONDS``) except tenure's
default, which holds "until released" on a renewed 30 s lease. A blocking
acquire is bounded by ``ACQUIRE_TIMEOUT`` so that no run can hang.

``--topology replicated|cluster`` runs the contenders whose ``topologies``
name it: tenure's Lock and ClusterLock (1 and 2 replicas) and redis-py's
Lock, on a primary with two replicas or a 3-master cluster with two
replicas per master.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.cluster

import tenure
from benchmarks import require_peer

__all__ = [
    "ACQUIRE_TIMEOUT",
    "CONTENDERS",
    "FLOOR",
    "LEASE_SECONDS",
    "REFERENCE",
    "TOPOLOGIES",
    "BenchLock",
    "Client",
    "Contender",
    "by_key",
]

LEASE_SECONDS = 10
ACQUIRE_TIMEOUT = 10.0  # python-redis-lock refuses a timeout longer than its expire

_COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True)
class BenchLock:
    """One lock object, reduced to a bounded blocking acquire and a release."""

    acquire: Callable[[], bool]
    release: Callable[[], None]
    close: Callable[[], None] = lambda: None  # let go of what it holds (its event loop)


Client = redis.Redis | redis.cluster.RedisCluster
"""A client of the topology under test."""

Maker = Callable[[Client, str], BenchLock]

TOPOLOGIES = ("standalone", "replicated", "cluster")
"""Where the lock benchmark can run."""

_EVERYWHERE = TOPOLOGIES
_REPLICATED = ("replicated", "cluster")


@dataclass(frozen=True)
class Contender:
    """A lock implementation with its settings, as one row of the report."""

    key: str
    label: str
    make: Maker
    contended: bool = True  # False: measured solo only (the bare baseline)
    pooled: bool = True  # False: left out of the pool part (the floor blocks a connection)
    peer: tuple[str, str] | None = None  # (module, package) it needs, for a clear error
    topologies: tuple[str, ...] = ("standalone",)


def _tenure(timeout: float | None) -> Maker:
    def make(client: Client, name: str) -> BenchLock:
        lock = tenure.Lock(client, name, timeout=timeout)
        return BenchLock(lambda: lock.acquire(blocking_timeout=ACQUIRE_TIMEOUT), lock.release)

    return make


def _tenure_plus_round_trip(client: Client, name: str) -> BenchLock:
    """A yardstick: tenure's Lock with one more round trip (a PING) per acquisition."""
    lock = tenure.Lock(client, name, timeout=LEASE_SECONDS)

    def acquire() -> bool:
        taken = lock.acquire(blocking_timeout=ACQUIRE_TIMEOUT)
        if isinstance(client, redis.cluster.RedisCluster):  # to the lock's node, like a WAIT
            cluster: Any = client  # redis-py leaves get_node_from_key untyped
            client.ping(target_nodes=cluster.get_node_from_key(lock.keys.owner))
        else:
            client.ping()
        return taken

    return BenchLock(acquire, lock.release)


def _cluster_lock(replicas: int) -> Maker:
    def make(client: Client, name: str) -> BenchLock:
        lock = tenure.ClusterLock(client, name, timeout=LEASE_SECONDS, min_replicas=replicas)
        return BenchLock(lambda: lock.acquire(blocking_timeout=ACQUIRE_TIMEOUT), lock.release)

    return make


def _redis_py(sleep: float) -> Maker:
    def make(client: Client, name: str) -> BenchLock:
        lock = client.lock(name, timeout=LEASE_SECONDS, sleep=sleep)
        return BenchLock(lambda: lock.acquire(blocking_timeout=ACQUIRE_TIMEOUT), lock.release)

    return make


def _python_redis_lock(client: Client, name: str) -> BenchLock:
    redis_lock = require_peer("redis_lock", "python-redis-lock")
    lock = redis_lock.Lock(client, name, expire=LEASE_SECONDS)

    def acquire() -> bool:
        return bool(lock.acquire(timeout=ACQUIRE_TIMEOUT))

    return BenchLock(acquire, lock.release)


def _pottery(client: Client, name: str) -> BenchLock:
    lock = require_peer("pottery", "pottery").Redlock(
        key=name, masters={client}, auto_release_time=LEASE_SECONDS
    )
    return BenchLock(lambda: lock.acquire(timeout=ACQUIRE_TIMEOUT), lock.release)


class _SetNxLock:
    """The minimal correct lock: ``SET key token NX PX`` and a compare-and-delete script.

    It never waits (a failed SET returns False), so it is only a solo baseline.
    """

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self._key = name
        self._delete = client.register_script(_COMPARE_AND_DELETE)
        self._token = ""

    def acquire(self) -> bool:
        token = secrets.token_hex(16)
        if not self._client.set(self._key, token, nx=True, px=LEASE_SECONDS * 1000):
            return False
        self._token = token
        return True

    def release(self) -> None:
        self._delete(keys=[self._key], args=[self._token])


def _set_nx(client: Client, name: str) -> BenchLock:
    lock = _SetNxLock(client, name)
    return BenchLock(lock.acquire, lock.release)


def _handoff_floor(client: Client, name: str) -> BenchLock:
    """The floor of a FIFO handoff: one token in a list, taken by ``BLPOP``, given by ``RPUSH``.

    Not a lock (no lease: a holder that dies keeps the token for ever); it
    measures what handing on costs when the waiter is woken by the server's
    blocking pop, with nothing else done. The first process to make one puts
    the token in (``SET NX`` decides which).
    """
    queue = f"{name}:floor"
    if client.set(f"{name}:floor-made", 1, nx=True):
        client.rpush(queue, "token")

    def acquire() -> bool:
        return client.blpop([queue], timeout=ACQUIRE_TIMEOUT) is not None

    def release() -> None:
        client.rpush(queue, "token")

    return BenchLock(acquire, release)


REFERENCE = "tenure"
FLOOR = "handoff-floor"

CONTENDERS: tuple[Contender, ...] = (
    Contender(
        REFERENCE, "tenure `Lock(timeout=10)`", _tenure(LEASE_SECONDS), topologies=_EVERYWHERE
    ),
    Contender("tenure-default", "tenure `Lock()` (30 s lease, background renewal)", _tenure(None)),
    Contender(
        "tenure-cluster-1",
        "tenure `ClusterLock(timeout=10, min_replicas=1)`",
        _cluster_lock(1),
        topologies=_REPLICATED,
    ),
    Contender(
        "tenure-cluster-2",
        "tenure `ClusterLock(timeout=10, min_replicas=2)`",
        _cluster_lock(2),
        topologies=_REPLICATED,
    ),
    Contender(
        "tenure-plus-rtt",
        "yardstick: tenure `Lock(timeout=10)` + one `PING` per acquisition",
        _tenure_plus_round_trip,
        contended=False,
        topologies=_REPLICATED,
    ),
    Contender(
        "redis-py",
        "redis-py `client.lock(timeout=10)` (sleep=0.1)",
        _redis_py(0.1),
        topologies=_EVERYWHERE,
    ),
    Contender(
        "redis-py-1ms",
        "redis-py `client.lock(timeout=10, sleep=0.001)` (tuned)",
        _redis_py(0.001),
        topologies=_EVERYWHERE,
    ),
    Contender(
        "python-redis-lock",
        "python-redis-lock `Lock(expire=10)`",
        _python_redis_lock,
        peer=("redis_lock", "python-redis-lock"),
    ),
    Contender(
        "pottery",
        "pottery `Redlock(auto_release_time=10)`, one master",
        _pottery,
        peer=("pottery", "pottery"),
    ),
    Contender(
        FLOOR,
        "floor: one token passed on by `RPUSH`/`BLPOP` (no lease: not a lock)",
        _handoff_floor,
        pooled=False,
    ),
    Contender(
        "set-nx",
        "baseline: `SET NX PX` + compare-and-delete script",
        _set_nx,
        contended=False,
    ),
)


def by_key(key: str) -> Contender:
    """The contender called ``key`` (worker processes receive keys, not functions)."""
    for contender in CONTENDERS:
        if contender.key == key:
            return contender
    raise KeyError(key)
