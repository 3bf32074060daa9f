"""Every error tenure raises, under one root.

The tree::

    TenureError
    ├── ArgumentError (ValueError)               bad value for a named argument
    ├── ClientTypeError (TypeError)              not a redis-py client we can use
    ├── MissingDependencyError (ImportError)     an optional package is not installed
    ├── SourceUnavailableError                   an ingestion source's database is out of reach
    ├── SourceRowError (ValueError)              an ingested row is not storable as strict JSON,
    │                                            or a cell its driver cannot convert
    ├── BackendError (RedisError)                a call failed: the server refused or
    │   │                                        failed it, or the client could not send it
    │   ├── ServerUnavailableError (ConnectionError)  refused, reset or timed out
    │   ├── ConnectionPoolExhaustedError (MaxConnectionsError, a ConnectionError)
    │   │                                        the client's own pool had no free
    │   │                                        connection; the server is fine
    │   ├── PermissionDeniedError (NoPermissionError) the server's ACL forbids a command
    │   ├── ScriptError (ResponseError)          a tenure script failed on the server
    │   ├── WrongTypeError (ResponseError)       a key holds another type than expected
    │   ├── ReplicationError                     too few replicas acknowledged a write
    │   └── QuorumError                          too few Redlock masters answered
    ├── EmbeddedServerError                      tenure.server could not run a server
    │   ├── ServerNotFoundError                  no server binary was found
    │   └── ServerStartError                     the server did not start or answer
    └── PrimitiveError                           a primitive's own rules were broken
        ├── NotOwnedError (LockNotOwnedError)    the caller does not hold it (any more)
        │   ├── LockNotOwnedError
        │   ├── SemaphoreNotOwnedError
        │   └── LostError                        a held primitive was lost while held
        │       ├── LockLostError (also LockNotOwnedError)
        │       └── SemaphoreLostError (also SemaphoreNotOwnedError)
        ├── SemaphoreLimitError (LockError)      the name is in use with another limit
        ├── AlreadyHeldError (LockError)         re-acquire of a non-reentrant hold
        ├── AcquireTimeoutError (LockError)      `with` could not acquire in time
        ├── CacheDecodeError                     a stored cache value this cache cannot
        │                                        decode (read as a miss, never raised
        │                                        from get or fetch)
        ├── CacheReentryError (RuntimeError)     a loader asked for the entry it is loading
        ├── PlanMismatchError                    an ingestion job's name holds another plan
        ├── JobBusyError                         an ingestion job reset while workers hold claims
        └── IdSetCorruptError                    an id set's stored form fails validation

The names in parentheses are the other classes an error is an instance of:
Python's (``ValueError``, ``TypeError``, ``ImportError``, ``RuntimeError``)
and redis-py's (``redis.exceptions``). An error that means what a redis-py
exception means is also an instance of it, so code written for redis-py's
``Lock`` that catches ``LockError``, ``LockNotOwnedError`` or
``ConnectionError`` keeps catching tenure's.

Errors that concern one primitive carry its ``name`` (the user's name for it,
not the Redis key) so a log line says which lock misbehaved. Errors from
redis-py are translated at tenure's boundary into :class:`BackendError`
subclasses, with the original kept as ``__cause__``; tenure never leaks a
half-translated error. No class shadows a builtin name.
"""

from __future__ import annotations

from redis import exceptions as _redis

__all__ = [
    "AcquireTimeoutError",
    "AlreadyHeldError",
    "ArgumentError",
    "BackendError",
    "CacheDecodeError",
    "CacheReentryError",
    "ClientTypeError",
    "ConnectionPoolExhaustedError",
    "EmbeddedServerError",
    "IdSetCorruptError",
    "JobBusyError",
    "LockLostError",
    "LockNotOwnedError",
    "LostError",
    "MissingDependencyError",
    "NotOwnedError",
    "PermissionDeniedError",
    "PlanMismatchError",
    "PrimitiveError",
    "QuorumError",
    "ReplicationError",
    "ScriptError",
    "SemaphoreLimitError",
    "SemaphoreLostError",
    "SemaphoreNotOwnedError",
    "ServerNotFoundError",
    "ServerStartError",
    "ServerUnavailableError",
    "SourceRowError",
    "SourceUnavailableError",
    "TenureError",
    "WrongTypeError",
]


class TenureError(Exception):
    """Root of every error tenure raises.

    ``name`` is the primitive's name when the error concerns one primitive,
    else ``None``.
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.message: str | None = message  # str; Optional only as in redis-py's LockError
        self.name = name
        self.lock_name = name  # redis-py's LockError attribute

    def __str__(self) -> str:
        message = str(self.message)
        if self.name is None or repr(self.name) in message:
            return message  # a message that names its primitive already says it once
        return f"{message} (name {self.name!r})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


def _prefixed(argument: str, message: str) -> str:
    """``argument: message``, said once (a message passed on from another error has it)."""
    return message if message.startswith(f"{argument}: ") else f"{argument}: {message}"


class ArgumentError(TenureError, ValueError):
    """An argument had a value tenure cannot accept.

    ``argument`` names the offending parameter, e.g. ``"blocking_timeout"``.
    """

    def __init__(self, argument: str, message: str, *, name: str | None = None) -> None:
        super().__init__(_prefixed(argument, message), name=name)
        self.argument = argument


class ClientTypeError(TenureError, TypeError):
    """The object passed as a client is not one tenure can drive.

    Sync primitives take ``redis.Redis`` or ``redis.cluster.RedisCluster``;
    asyncio primitives take ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster``.
    """

    def __init__(self, argument: str, message: str, *, name: str | None = None) -> None:
        super().__init__(_prefixed(argument, message), name=name)
        self.argument = argument


class MissingDependencyError(TenureError, ImportError):
    """An optional package that a feature needs is not installed.

    The message names the package and the pip command that installs it, e.g.
    ``SqlSource needs SQLAlchemy: pip install "tenure[sql]"``.
    """


class SourceUnavailableError(TenureError):
    """An ingestion source's database could not be reached or opened, or failed mid-read.

    The message names the database (kind, host and port) and why, e.g.
    ``cannot connect to PostgreSQL at 127.0.0.1:5999: connection refused``, or
    ``PostgreSQL at 127.0.0.1:5432 failed while reading events keys 1..10000:
    the server closed the connection``; the driver's error is kept as
    ``__cause__``. ``kind`` (``"PostgreSQL"``, ``"SQLite"``...), ``host``,
    ``port`` (None for a SQLite file) and ``why`` say the same as attributes
    (None where unknown). A worker whose source fails so gives its claim back.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        host: str | None = None,
        port: int | None = None,
        why: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.kind = kind
        self.host = host
        self.port = port
        self.why = why


class SourceRowError(TenureError, ValueError):
    """A row an ingestion job cannot store: not strict JSON, or a cell its driver cannot convert.

    Rows are stored as strict JSON (RFC 8259), which has no NaN or infinity:
    a float NaN or infinity, or a value of a type with no JSON form, is
    refused, and so is a cell the database driver (or SQLAlchemy) cannot
    convert to a Python value (``TIMESTAMP 'infinity'`` on PostgreSQL,
    ``'abc'`` in a SQLite ``NUMERIC`` column). The message and the attributes
    ``key`` and ``column`` name the row's key and the column (either None
    when it could not be found out). Nothing of the row's batch was written,
    and the worker gave its claim back.
    """

    def __init__(
        self, message: str, *, key: int | None, column: str | None, name: str | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.key = key
        self.column = column


class BackendError(TenureError, _redis.RedisError):
    """A call tenure made failed: the server refused or failed it, or the client could not.

    ``never_sent`` is True when the call never ran: it never left the client
    (its pool had no free connection, or no connection to the server could be
    opened), or the cluster kept refusing it while its slot moved to another
    node (a reshard). Nothing changed on the server then, and the same call
    can be retried (a ``release()`` that failed so still holds, and can be
    called again).
    ``script`` is the name of the tenure Lua script that was running, for
    debugging (None for a plain command); the message names the operation
    the caller asked for instead.
    """

    never_sent: bool = False
    script: str | None = None


def as_tenure_error(error: Exception, name: str | None = None) -> TenureError:
    """``error`` as tenure's: itself if it is one, else a :class:`BackendError` naming it.

    For a background task whose call failed in the client library itself (a
    redis-py race on a connection closed meanwhile): the callers waiting on
    it hear one typed error, and the task goes on.
    """
    if isinstance(error, TenureError):
        return error
    said = str(error) or type(error).__name__
    return BackendError(f"the client failed: {type(error).__name__}: {said}", name=name)


class ServerUnavailableError(BackendError, _redis.ConnectionError):
    """The server could not be reached: refused, reset, or timed out."""


class ConnectionPoolExhaustedError(BackendError, _redis.MaxConnectionsError):
    """The client's own connection pool had no free connection; the server is fine.

    redis-py's ``ConnectionPool`` refuses a call ("Too many connections")
    once ``max_connections`` connections are in use, and a
    ``BlockingConnectionPool`` refuses one when none came free within its
    ``timeout``. The message names the pool's ``max_connections`` and the
    fix: a ``redis.BlockingConnectionPool`` (``redis.asyncio.BlockingConnectionPool``),
    which waits for a free connection, or a larger ``max_connections``.
    ``max_connections`` is the pool's limit (``None`` when it could not be
    read). It is a redis-py ``MaxConnectionsError``, itself a
    ``ConnectionError``, so ``except redis.ConnectionError`` still catches it;
    it is not a :class:`ServerUnavailableError`.
    """

    def __init__(
        self, message: str, *, max_connections: int | None = None, name: str | None = None
    ) -> None:
        super().__init__(message, name=name)
        self.max_connections = max_connections

    never_sent = True  # the pool refused the call before it took a connection


class PermissionDeniedError(BackendError, _redis.NoPermissionError):
    """The server's ACL forbids a command or key that tenure needs."""


class ScriptError(BackendError, _redis.ResponseError):
    """A tenure Lua script raised an error on the server."""


class WrongTypeError(BackendError, _redis.ResponseError):
    """A key holds a value of another type than the primitive keeps there (WRONGTYPE).

    The message names the key; nothing was written.
    """


class ReplicationError(BackendError):
    """Too few replicas (or AOF files) acknowledged a write within its timeout.

    Raised by :class:`~tenure.ClusterLock` when an acquisition, handoff or
    extension was not acknowledged as its replication policy asks; what was
    taken has been given back (token checked) before it is raised.
    ``acknowledged`` and ``required`` count replicas; with ``aof=True``,
    ``local_fsynced`` says whether the primary's own AOF had it on disk
    (``None`` without AOF).
    """

    def __init__(
        self,
        message: str,
        *,
        acknowledged: int,
        required: int,
        local_fsynced: bool | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.acknowledged = acknowledged
        self.required = required
        self.local_fsynced = local_fsynced


class QuorumError(BackendError):
    """Too few of a :class:`~tenure.Redlock`'s masters answered for a quorum.

    Raised at once (never after waiting out ``blocking_timeout``) when so many
    masters failed (refused, timed out, errored) that the ones left cannot
    make a quorum, whatever they answer; whatever the attempt took on the
    others has been given back first. ``failures`` maps each failed master
    (``host:port``, or a socket path) to what went wrong; ``answered`` and
    ``required`` count masters.
    """

    def __init__(
        self,
        message: str,
        *,
        failures: dict[str, str],
        answered: int,
        required: int,
        name: str | None = None,
    ) -> None:
        super().__init__(message, name=name)
        self.failures = dict(failures)
        self.answered = answered
        self.required = required


class EmbeddedServerError(TenureError):
    """tenure.server could not run a server process."""


class ServerNotFoundError(EmbeddedServerError):
    """No server binary was found (install ``tenure[embedded]`` or set TENURE_SERVER_BIN)."""


class ServerStartError(EmbeddedServerError):
    """A server process exited early or did not answer in time."""


class PrimitiveError(TenureError):
    """A primitive's own rules were broken (ownership, lease, timeout)."""


class NotOwnedError(PrimitiveError, _redis.LockNotOwnedError):
    """The caller does not hold the primitive, or no longer does."""


class LockNotOwnedError(NotOwnedError):
    """Release, extend or reacquire on a lock the caller does not hold."""


class SemaphoreNotOwnedError(NotOwnedError):
    """Release, refresh or extend of a permit the caller does not hold (any more)."""


class SemaphoreLimitError(PrimitiveError, _redis.LockError):
    """A semaphore name is in use with another limit than the one given.

    The limit is stored with the semaphore on the server; change it with
    ``set_limit()``. ``stored`` and ``given`` are the two limits.
    """

    def __init__(self, message: str, *, name: str | None = None, stored: int, given: int) -> None:
        super().__init__(message, name=name)
        self.stored = stored
        self.given = given


class LostError(NotOwnedError):
    """A primitive was lost while its holder believed it held it."""


class LockLostError(LostError, LockNotOwnedError):
    """The lock's lease ran out or was taken while the holder was in its body."""


class SemaphoreLostError(LostError, SemaphoreNotOwnedError):
    """A permit's lease ran out while its holder was in its body."""


class AlreadyHeldError(PrimitiveError, _redis.LockError):
    """The owner (thread or task) already holds this non-reentrant primitive."""


class AcquireTimeoutError(PrimitiveError, _redis.LockError):
    """Entering ``with`` / ``async with`` could not acquire within its blocking timeout.

    ``acquire()`` itself returns False instead, as redis-py's does.
    """


class CacheDecodeError(PrimitiveError):
    """Stored bytes that a cache cannot decode: another format, tampered, or corrupt."""


class CacheReentryError(PrimitiveError, RuntimeError):
    """A loader asked for the entry it is loading (directly or through another function).

    It would wait for its own load for ever; the load fails instead, and its
    lease is given back at once.
    """


class PlanMismatchError(PrimitiveError):
    """An ingestion job's name is taken by a job with another plan (source or chunk size)."""


class JobBusyError(PrimitiveError):
    """An ingestion job was to be reset while workers hold claims on its chunks.

    ``claimed`` counts the chunks whose lease is running. Stop the workers
    (their claims are given back as they stop) or pass ``force=True``.
    """

    def __init__(self, message: str, *, claimed: int, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.claimed = claimed


class IdSetCorruptError(PrimitiveError):
    """An id set's stored form failed validation: truncated, altered, or not an id set.

    Raised before the data is used, naming what did not match (its length,
    its checksum, its count of ids, a log element's shape); the local copy
    is left as it was.
    """


# Shown as tenure.ArgumentError (the public path), not tenure._core.exceptions.ArgumentError.
for _error in [v for k, v in list(globals().items()) if k in __all__]:
    _error.__module__ = "tenure"
