"""What tenure accepts as a client, and how redis-py's errors are translated.

Pure functions, no I/O: the async source and its generated sync twin both
call them, so the rules live in one place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.client
import redis.cluster
from redis import exceptions as redis_errors

from tenure._core.exceptions import (
    BackendError,
    ClientTypeError,
    ConnectionPoolExhaustedError,
    PermissionDeniedError,
    ScriptError,
    ServerUnavailableError,
    TenureError,
    WrongTypeError,
)

__all__ = [
    "ASYNC_CLIENT_TYPES",
    "SLOT_MOVE_PATIENCE",
    "SLOT_MOVE_PAUSE",
    "STALE_CONNECTION_RETRIES",
    "SYNC_CLIENT_TYPES",
    "is_cluster",
    "map_exceptions",
    "require_client",
    "slot_moving",
    "slot_moving_error",
    "stale_connection",
    "translate_error",
]

SYNC_CLIENT_TYPES: tuple[type, ...] = (redis.Redis, redis.cluster.RedisCluster)
ASYNC_CLIENT_TYPES: tuple[type, ...] = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)

_PIPELINE_TYPES: tuple[type, ...] = (
    redis.client.Pipeline,
    redis.asyncio.client.Pipeline,
    redis.cluster.ClusterPipeline,
    redis.asyncio.cluster.ClusterPipeline,
)

_accepted: set[tuple[type, bool]] = set()
"""Client classes found fit, with the kind of primitive (asyncio or not) they suit."""


def _describe_type(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def require_client(
    client: object,
    *,
    is_async: bool,
    owner: str,
    name: str | None = None,
    twin: str | None = None,
) -> None:
    """Raise :class:`ClientTypeError` unless ``client`` suits a sync/async ``owner``.

    ``twin`` is what to use instead with a client of the other kind (default:
    the primitive's sync or Async twin).
    """
    kind = type(client)
    if (kind, is_async) in _accepted:
        return
    wanted = ASYNC_CLIENT_TYPES if is_async else SYNC_CLIENT_TYPES
    if issubclass(kind, wanted) and not issubclass(kind, _PIPELINE_TYPES):
        # Cached per class: the checks go through typing's protocol machinery
        # (redis-py's clients are Protocols), microseconds on every constructor.
        _accepted.add((kind, is_async))
        return
    other = SYNC_CLIENT_TYPES if is_async else ASYNC_CLIENT_TYPES
    if isinstance(client, _PIPELINE_TYPES):  # a Redis subclass, whose calls only queue
        hint = "a pipeline sends its commands only at execute(); pass the client it came from"
    elif isinstance(client, other):
        if is_async:
            hint = "it is a synchronous client; pass a redis.asyncio client, or " + (
                twin or f"use tenure.{owner.removeprefix('Async')}"
            )
        else:
            hint = "it is an asyncio client; pass a redis.Redis, or " + (
                twin or f"use tenure.Async{owner}"
            )
    else:
        hint = "expected " + " or ".join(_describe_type(t) for t in wanted)
    raise ClientTypeError(
        "client", f"{owner} cannot use a {_describe_type(type(client))}: {hint}", name=name
    )


def require_bytes_replies(client: object, *, owner: str, stores: str, name: str) -> None:
    """Raise :class:`ClientTypeError` for a client made with ``decode_responses=True``.

    For primitives that store binary values (``stores`` says which): such a
    client decodes every reply as text, which would fail, or alter the
    values, on every read.
    """
    settings: dict[str, Any] = getattr(client, "get_connection_kwargs", dict)()
    if settings.get("decode_responses"):
        raise ClientTypeError(
            "client",
            f"{owner} stores {stores}, which a client that decodes replies as text "
            "(decode_responses=True) cannot read back: pass one with decode_responses=False, "
            "redis-py's default",
            name=name,
        )


STALE_CONNECTION_RETRIES = 32
"""How many connections of an event loop that ended one call may find and drop."""


def stale_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is a pooled asyncio connection made on an event loop that ended.

    A client used under one ``asyncio.run()`` and then another keeps the first
    loop's connections; redis-py fails a call on each once (and drops it), so
    the call is worth sending again.
    """
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "Event loop is closed" in text or "attached to a different loop" in text
    )


def is_cluster(client: object) -> bool:
    """True for redis-py's sync or asyncio ``RedisCluster``."""
    kind = type(client)
    known = _cluster_kinds.get(kind)
    if known is None:
        # Cached per class: the isinstance check goes through typing's
        # protocol machinery (3 us), on every waiter of a busy process.
        known = _cluster_kinds[kind] = issubclass(
            kind, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)
        )
    return known


_cluster_kinds: dict[type, bool] = {}


def translate_error(
    exc: BaseException, *, name: str | None = None, doing: str = "", script: str | None = None
) -> BaseException:
    """Map a redis-py exception to tenure's tree; anything else passes through.

    ``doing`` names the operation in the caller's words ("acquiring"; a
    script's are :func:`tenure._core.scripts.operation`'s), never a script:
    ``script`` is kept as the error's ``script`` attribute instead. The
    caller raises the result ``from exc`` so the original stays attached.
    """
    if isinstance(exc, TenureError):
        return exc  # translated already (tenure's errors are redis-py's too)
    error = _translated(exc, name=name, doing=doing)
    if isinstance(error, BackendError):
        error.script = script
    return error


def _translated(exc: BaseException, *, name: str | None, doing: str) -> BaseException:
    where = f" while {doing}" if doing else ""
    if isinstance(exc, redis_errors.NoPermissionError) or (
        isinstance(exc, redis_errors.ResponseError) and str(exc).startswith("NOPERM")
    ):
        return PermissionDeniedError(f"the server's ACL refused a command{where}: {exc}", name=name)
    exhausted = _pool_exhausted(exc, name=name, where=where)
    if exhausted is not None:
        return exhausted
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError)):
        unavailable = ServerUnavailableError(
            f"server unavailable{where}: {_connection_failure(exc)}", name=name
        )
        unavailable.never_sent = _while_connecting(exc)
        return unavailable
    # Where in a script the server failed is not the caller's business.
    said = _SCRIPT_PLACE.sub("", str(exc)).rstrip(" .")
    if isinstance(exc, redis_errors.ResponseError) and said.startswith("WRONGTYPE"):
        return WrongTypeError(f"a key holds another type{where}: {said}", name=name)
    if isinstance(exc, redis_errors.OutOfMemoryError):  # redis-py took the "OOM" off
        said = f"the server is out of memory (its maxmemory){where}: {said}"
        return BackendError(said, name=name)
    if isinstance(exc, redis_errors.ReadOnlyError):
        return BackendError(
            f"the server is a read-only replica{where}: give tenure a client of the primary",
            name=name,
        )
    if isinstance(exc, redis_errors.ResponseError) and _is_script_failure(str(exc)):
        return ScriptError(
            f"the server could not finish tenure's script{where} (was one of its keys "
            f"changed outside tenure?): {said}",
            name=name,
        )
    if isinstance(exc, (redis_errors.RedisError, redis_errors.RedisClusterException)):
        return BackendError(f"server error{where}: {said}", name=name)
    return exc


_SCRIPT_PLACE = re.compile(r"\s*script: [0-9a-f]{40}, on @user_script:\d+\.?")
"""Where in a Lua script a server error arose: not the caller's business (it names no key)."""

_CONNECT_CALL_FAILED = re.compile(
    r"^(?P<head>Error (?P<errno>\d+) connecting to \S+?\.) Connect call failed \(.*\)\.?$"
)


def _connection_failure(exc: BaseException) -> str:
    """redis-py's text for a connection that failed, its address said once.

    Its asyncio client adds asyncio's "Connect call failed ('127.0.0.1', 6379)"
    to "Error 111 connecting to 127.0.0.1:6379."; the sync client says
    "Connection refused." instead: so do both.
    """
    text = str(exc)
    found = _CONNECT_CALL_FAILED.match(text)
    if found is None:
        return text
    return f"{found['head']} {os.strerror(int(found['errno']))}."


class map_exceptions:  # lower case: used as a function, ``with map_exceptions(...)``
    """Translate redis-py's errors raised in the block into tenure's (httpcore's way).

    The one place where a redis-py error becomes a :class:`BackendError`
    subclass, with the original as ``__cause__`` (and ``script``, when one
    ran, as its ``script``); tenure's own errors and anything else pass
    through untouched. ``refine(translated, original)``
    may replace the translated error (say which commands an ACL refused).
    A plain class rather than a generator: it wraps every call, hits included.
    """

    __slots__ = ("doing", "name", "refine", "script")

    def __init__(
        self,
        *,
        name: str | None = None,
        doing: str = "",
        refine: Callable[[BaseException, BaseException], BaseException] | None = None,
        script: str | None = None,
    ) -> None:
        self.name = name
        self.doing = doing
        self.refine = refine
        self.script = script

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if exc is None or isinstance(exc, TenureError):
            return
        if isinstance(exc, (redis_errors.RedisError, redis_errors.RedisClusterException)):
            error = translate_error(exc, name=self.name, doing=self.doing, script=self.script)
            if self.refine is not None:
                error = self.refine(error, exc)
            raise error from exc


def _is_script_failure(message: str) -> bool:
    lowered = message.lower()
    return "script" in lowered or "user_script" in lowered or lowered.startswith("err error")


SLOT_MOVE_PATIENCE = 10.0
"""Seconds a script call is asked again while its cluster slot moves between nodes."""

SLOT_MOVE_PAUSE = 0.05
"""Seconds between those calls when the node answered TRYAGAIN itself."""


def slot_moving(exc: BaseException) -> bool:
    """Whether ``exc`` says the call's cluster slot is moving: the call was refused, not run.

    A node answers TRYAGAIN to a call on several keys of a slot while they
    are split between it and the slot's next node, and ASK to one whose keys
    left; redis-py's cluster client follows those answers up to its request
    TTL, then raises ``ClusterError("TTL exhausted.")``.
    """
    if isinstance(exc, (redis_errors.TryAgainError, redis_errors.AskError)):
        return True
    return isinstance(exc, redis_errors.ClusterError) and "TTL exhausted" in str(exc)


def slot_moving_error(key: str, doing: str, patience: float, *, name: str | None) -> BackendError:
    """The error of a call refused for ``patience`` seconds while its slot moved."""
    error = BackendError(
        f"the cluster is moving the slot of {key!r} to another node (a reshard: "
        f"TRYAGAIN/ASK) and refused the call for {patience:g}s while {doing}; "
        "nothing was done: call again once the slot has moved",
        name=name,
    )
    error.never_sent = True  # refused before it ran: nothing changed
    return error


_TOO_MANY = "Too many connections"
"""What redis-py's ``ConnectionPool`` says when ``max_connections`` are in use (5.x to 8.x)."""

_NONE_CAME_FREE = "No connection available."
"""What redis-py's ``BlockingConnectionPool`` says when none came free within its timeout."""


def _raising_pool(exc: BaseException) -> Any:
    """The pool (or asyncio cluster node) whose own method raised ``exc``, else None.

    The frame that raised is the last of the traceback; its ``self`` is the
    pool when the pool refused the call itself (not a connection beneath it).
    """
    traceback = exc.__traceback__
    if traceback is None:
        return None
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    owner = traceback.tb_frame.f_locals.get("self")
    return owner if isinstance(getattr(owner, "max_connections", None), int) else None


_TAKING_A_CONNECTION = frozenset({"get_connection", "acquire_connection"})
"""The redis-py functions that take a connection (and connect it) before a command is sent."""


def _while_connecting(exc: BaseException) -> bool:
    """Whether ``exc`` came out of redis-py taking a connection: the command never left.

    redis-py's pools connect a connection as they hand it out, outside the
    retries of the command itself; an error raised on the way out of
    ``get_connection`` (a pool's, or the cluster module's) was raised before
    anything was written to a socket.
    """
    traceback = exc.__traceback__
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code.co_name in _TAKING_A_CONNECTION and str(
            frame.f_globals.get("__name__", "")
        ).startswith("redis."):
            return True
        traceback = traceback.tb_next
    return False


def _through_cluster(exc: BaseException) -> bool:
    """Whether a cluster client's method is on ``exc``'s traceback."""
    traceback = exc.__traceback__
    while traceback is not None:
        if is_cluster(traceback.tb_frame.f_locals.get("self")):
            return True
        traceback = traceback.tb_next
    return False


def _pool_exhausted(
    exc: BaseException, *, name: str | None, where: str
) -> ConnectionPoolExhaustedError | None:
    """A :class:`ConnectionPoolExhaustedError` if ``exc`` says the client's pool ran out.

    Recognised by redis-py's own class (``MaxConnectionsError``: raised by
    the sync pool since redis-py 6.4, the asyncio pool since 7.x and the
    asyncio cluster's nodes), or by a plain ``ConnectionError`` that the pool
    raised itself with the words redis-py 5 to 8 use.
    """
    if not isinstance(exc, redis_errors.ConnectionError):
        return None
    pool = _raising_pool(exc)
    text = str(exc)
    blocking = pool is not None and text == _NONE_CAME_FREE
    if not (isinstance(exc, redis_errors.MaxConnectionsError) or text == _TOO_MANY or blocking):
        return None
    limit: int | None = getattr(pool, "max_connections", None)
    setting = "max_connections" if limit is None else f"max_connections={limit}"
    if isinstance(pool, redis.asyncio.ConnectionPool):
        waiting = "redis.asyncio.BlockingConnectionPool"
    elif isinstance(pool, redis.ConnectionPool):
        waiting = "redis.BlockingConnectionPool"
    else:
        waiting = "redis.BlockingConnectionPool (redis.asyncio.BlockingConnectionPool)"
    if blocking:
        timeout = getattr(pool, "timeout", None)
        message = (
            f"the client's connection pool is exhausted{where}: none of its connections "
            f"({setting}) came free within its timeout={timeout!r} (the server is fine): "
            "raise max_connections or the pool's timeout"
        )
    elif isinstance(pool, redis.asyncio.cluster.ClusterNode) or _through_cluster(exc):
        message = (  # a RedisCluster makes its nodes' pools itself: no waiting pool to give it
            f"the cluster client's connections to a node are exhausted{where}: all are in "
            f"use ({setting}, per node; the server is fine): raise the RedisCluster's "
            "max_connections"
        )
    else:
        message = (
            f"the client's connection pool is exhausted{where}: all its connections are in "
            f"use ({setting}; the server is fine): give the client a {waiting}, which "
            "waits for a free connection, or raise max_connections"
        )
    return ConnectionPoolExhaustedError(message, max_connections=limit, name=name)
