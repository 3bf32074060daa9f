"""tenure: distributed coordination on Redis and Valkey.

Locks that are fair, fenced and told when lost (a drop-in for redis-py's
``Lock``), re-entrant locks, locks acknowledged by replicas before they
count (:class:`ClusterLock`), locks over several independent masters
(:class:`Redlock`), counting semaphores, read-write locks,
connection-bound locks, fenced keys, and caches that load each value once
across every process (:class:`HerdCache`), and chunked ingestion of a SQL
table into a stream, every row once whatever dies (:class:`IngestJob`), and
sets of 32-bit ids intersected in memory (:class:`IdSet`, with the
``idsets`` extra). The primitives have a sync and an asyncio API and take the
redis-py client you already have.

Errors all derive from :class:`TenureError`; one that means what a redis-py
exception means is an instance of that too, so ``except
redis.exceptions.LockError`` still catches tenure's. The API reference's
page of errors draws their tree.
"""

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from tenure._async._cache import AsyncCache, AsyncHerdCache
from tenure._async._cluster_lock import AsyncClusterLock
from tenure._async._connlock import AsyncConnectionLock
from tenure._async._consumer import AsyncStreamConsumer
from tenure._async._fence import AsyncFencedKey
from tenure._async._ingest import AsyncIngestJob
from tenure._async._lock import AsyncLock, AsyncReentrantLock
from tenure._async._redlock import AsyncRedlock
from tenure._async._rwlock import AsyncReadLock, AsyncReadWriteLock, AsyncWriteLock
from tenure._async._semaphore import AsyncSemaphore
from tenure._backends.telemetry import set_metric_names
from tenure._cached import cached
from tenure._core.cache import CacheStatistics
from tenure._core.codec import (
    IdentityGenerator,
    JsonSerializer,
    MsgpackSerializer,
    PickleSerializer,
    ZlibCompressor,
    ZstdCompressor,
)
from tenure._core.exceptions import (
    AcquireTimeoutError,
    AlreadyHeldError,
    ArgumentError,
    BackendError,
    CacheDecodeError,
    CacheReentryError,
    ClientTypeError,
    ConnectionPoolExhaustedError,
    EmbeddedServerError,
    IdSetCorruptError,
    JobBusyError,
    LockLostError,
    LockNotOwnedError,
    LostError,
    MissingDependencyError,
    NotOwnedError,
    PermissionDeniedError,
    PlanMismatchError,
    PrimitiveError,
    QuorumError,
    ReplicationError,
    ScriptError,
    SemaphoreLimitError,
    SemaphoreLostError,
    SemaphoreNotOwnedError,
    ServerNotFoundError,
    ServerStartError,
    ServerUnavailableError,
    SourceRowError,
    SourceUnavailableError,
    TenureError,
    WrongTypeError,
)
from tenure._core.ingest import ChunkHolder, IngestStatus, ResetReport, WorkerReport
from tenure._core.near import NearCache
from tenure._core.redlock import RedlockStatistics
from tenure._core.sources import (
    AsyncCallableSource,
    AsyncRowSource,
    CallableSource,
    RowSource,
    SqlSource,
)
from tenure._core.statistics import (
    ClusterLockStatistics,
    LeasedStatistics,
    LockStatistics,
    ReadWriteStatistics,
    SemaphoreStatistics,
)
from tenure._core.stream import ConsumerStatistics, StreamMessage
from tenure._sync._cache import Cache, HerdCache
from tenure._sync._cluster_lock import ClusterLock
from tenure._sync._connlock import ConnectionLock
from tenure._sync._consumer import StreamConsumer
from tenure._sync._fence import FencedKey
from tenure._sync._ingest import IngestJob
from tenure._sync._lock import Lock, ReentrantLock
from tenure._sync._redlock import Redlock
from tenure._sync._rwlock import ReadLock, ReadWriteLock, WriteLock
from tenure._sync._semaphore import Semaphore
from tenure._version import __version__

if TYPE_CHECKING:  # imported on first use: they need numpy and pyroaring (tenure[idsets])
    from tenure._async._idset import AsyncIdSet
    from tenure._core.idset import IdSetStatistics
    from tenure._sync._idset import IdSet

_NEEDS_NUMPY = {
    "AsyncIdSet": "tenure._async._idset",
    "IdSet": "tenure._sync._idset",
    "IdSetStatistics": "tenure._core.idset",
}

__all__ = [
    "AcquireTimeoutError",
    "AlreadyHeldError",
    "ArgumentError",
    "AsyncCache",
    "AsyncCallableSource",
    "AsyncClusterLock",
    "AsyncConnectionLock",
    "AsyncFencedKey",
    "AsyncHerdCache",
    "AsyncIdSet",
    "AsyncIngestJob",
    "AsyncLock",
    "AsyncReadLock",
    "AsyncReadWriteLock",
    "AsyncRedlock",
    "AsyncReentrantLock",
    "AsyncRowSource",
    "AsyncSemaphore",
    "AsyncStreamConsumer",
    "AsyncWriteLock",
    "BackendError",
    "Cache",
    "CacheDecodeError",
    "CacheReentryError",
    "CacheStatistics",
    "CallableSource",
    "ChunkHolder",
    "ClientTypeError",
    "ClusterLock",
    "ClusterLockStatistics",
    "ConnectionLock",
    "ConnectionPoolExhaustedError",
    "ConsumerStatistics",
    "EmbeddedServerError",
    "FencedKey",
    "HerdCache",
    "IdSet",
    "IdSetCorruptError",
    "IdSetStatistics",
    "IdentityGenerator",
    "IngestJob",
    "IngestStatus",
    "JobBusyError",
    "JsonSerializer",
    "LeasedStatistics",
    "Lock",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "LostError",
    "MissingDependencyError",
    "MsgpackSerializer",
    "NearCache",
    "NotOwnedError",
    "PermissionDeniedError",
    "PickleSerializer",
    "PlanMismatchError",
    "PrimitiveError",
    "QuorumError",
    "ReadLock",
    "ReadWriteLock",
    "ReadWriteStatistics",
    "Redlock",
    "RedlockStatistics",
    "ReentrantLock",
    "ReplicationError",
    "ResetReport",
    "RowSource",
    "ScriptError",
    "Semaphore",
    "SemaphoreLimitError",
    "SemaphoreLostError",
    "SemaphoreNotOwnedError",
    "SemaphoreStatistics",
    "ServerNotFoundError",
    "ServerStartError",
    "ServerUnavailableError",
    "SourceRowError",
    "SourceUnavailableError",
    "SqlSource",
    "StreamConsumer",
    "StreamMessage",
    "TenureError",
    "WorkerReport",
    "WriteLock",
    "WrongTypeError",
    "ZlibCompressor",
    "ZstdCompressor",
    "__version__",
    "cached",
    "set_metric_names",
]


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported (found without importing it)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


if not (_installed("numpy") and _installed("pyroaring")):
    # ``from tenure import *`` takes every name in __all__: without the idsets
    # extra it leaves the id sets out rather than failing (tenure.IdSet still
    # raises MissingDependencyError naming the pip command).
    for _name in _NEEDS_NUMPY:
        __all__.remove(_name)


def __getattr__(name: str) -> Any:
    """The id sets, imported on first use: they need numpy and pyroaring."""
    module = _NEEDS_NUMPY.get(name)
    if module is None:
        raise AttributeError(f"module 'tenure' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        missing = exc.name or "numpy and pyroaring"
        raise MissingDependencyError(
            f"tenure.{name} needs numpy and pyroaring ({missing} is missing): "
            'pip install "tenure[idsets]"'
        ) from None
    globals()[name] = value
    return value
