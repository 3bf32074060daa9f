"""tenure: distributed coordination on Redis and Valkey.

Locks that are fair, fenced and told when lost (a drop-in for redis-py's
``Lock``), re-entrant locks, counting semaphores, read-write locks,
connection-bound locks and fenced keys. Every primitive has a sync and an
asyncio API and takes the redis-py client you already have.

Errors all derive from :class:`TenureError`; the tree is drawn in
``tenure._exceptions``.
"""

from tenure._async._connlock import AsyncConnectionLock
from tenure._async._fence import AsyncFencedKey
from tenure._async._lock import AsyncLock, AsyncReentrantLock
from tenure._async._rwlock import AsyncReadLock, AsyncReadWriteLock, AsyncWriteLock
from tenure._async._semaphore import AsyncSemaphore
from tenure._exceptions import (
    AcquireTimeoutError,
    AlreadyHeldError,
    ArgumentError,
    BackendError,
    ClientTypeError,
    EmbeddedServerError,
    LockLostError,
    LockNotOwnedError,
    LostError,
    NotOwnedError,
    PermissionDeniedError,
    PrimitiveError,
    ScriptError,
    SemaphoreLimitError,
    SemaphoreLostError,
    SemaphoreNotOwnedError,
    ServerNotFoundError,
    ServerStartError,
    ServerUnavailableError,
    TenureError,
)
from tenure._leased_core import (
    LeasedStatistics,
    LockStatistics,
    ReadWriteStatistics,
    SemaphoreStatistics,
)
from tenure._sync._connlock import ConnectionLock
from tenure._sync._fence import FencedKey
from tenure._sync._lock import Lock, ReentrantLock
from tenure._sync._rwlock import ReadLock, ReadWriteLock, WriteLock
from tenure._sync._semaphore import Semaphore
from tenure._version import __version__

__all__ = [
    "AcquireTimeoutError",
    "AlreadyHeldError",
    "ArgumentError",
    "AsyncConnectionLock",
    "AsyncFencedKey",
    "AsyncLock",
    "AsyncReadLock",
    "AsyncReadWriteLock",
    "AsyncReentrantLock",
    "AsyncSemaphore",
    "AsyncWriteLock",
    "BackendError",
    "ClientTypeError",
    "ConnectionLock",
    "EmbeddedServerError",
    "FencedKey",
    "LeasedStatistics",
    "Lock",
    "LockLostError",
    "LockNotOwnedError",
    "LockStatistics",
    "LostError",
    "NotOwnedError",
    "PermissionDeniedError",
    "PrimitiveError",
    "ReadLock",
    "ReadWriteLock",
    "ReadWriteStatistics",
    "ReentrantLock",
    "ScriptError",
    "Semaphore",
    "SemaphoreLimitError",
    "SemaphoreLostError",
    "SemaphoreNotOwnedError",
    "SemaphoreStatistics",
    "ServerNotFoundError",
    "ServerStartError",
    "ServerUnavailableError",
    "TenureError",
    "WriteLock",
    "__version__",
]
