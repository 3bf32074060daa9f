"""What tenure accepts as a client, and how redis-py's errors are translated.

Pure functions, no I/O: the async source and its generated sync twin both
call them, so the rules live in one place.
"""

from __future__ import annotations

from collections.abc import Callable

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis import exceptions as redis_errors

from tenure._exceptions import (
    BackendError,
    ClientTypeError,
    PermissionDeniedError,
    ScriptError,
    ServerUnavailableError,
    TenureError,
    WrongTypeError,
)

__all__ = [
    "ASYNC_CLIENT_TYPES",
    "SYNC_CLIENT_TYPES",
    "is_cluster",
    "map_exceptions",
    "require_client",
    "translate_error",
]

SYNC_CLIENT_TYPES: tuple[type, ...] = (redis.Redis, redis.cluster.RedisCluster)
ASYNC_CLIENT_TYPES: tuple[type, ...] = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)


def _describe_type(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def require_client(client: object, *, is_async: bool, owner: str, name: str | None = None) -> None:
    """Raise :class:`ClientTypeError` unless ``client`` suits a sync/async ``owner``."""
    wanted = ASYNC_CLIENT_TYPES if is_async else SYNC_CLIENT_TYPES
    if isinstance(client, wanted):
        return
    other = SYNC_CLIENT_TYPES if is_async else ASYNC_CLIENT_TYPES
    if isinstance(client, other):
        hint = (
            "it is a synchronous client; pass a redis.asyncio client, or use the sync twin"
            if is_async
            else "it is an asyncio client; pass a redis.Redis, or use the Async twin"
        )
    else:
        hint = "expected " + " or ".join(_describe_type(t) for t in wanted)
    raise ClientTypeError(
        "client", f"{owner} cannot use a {_describe_type(type(client))}: {hint}", name=name
    )


def is_cluster(client: object) -> bool:
    """True for redis-py's sync or asyncio ``RedisCluster``."""
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def translate_error(
    exc: BaseException, *, name: str | None = None, doing: str = ""
) -> BaseException:
    """Map a redis-py exception to tenure's tree; anything else passes through.

    The caller raises the result ``from exc`` so the original stays attached.
    """
    if isinstance(exc, TenureError):
        return exc  # translated already (tenure's errors are redis-py's too)
    where = f" while {doing}" if doing else ""
    if isinstance(exc, redis_errors.NoPermissionError) or (
        isinstance(exc, redis_errors.ResponseError) and str(exc).startswith("NOPERM")
    ):
        return PermissionDeniedError(f"the server's ACL refused a command{where}: {exc}", name=name)
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError)):
        return ServerUnavailableError(f"server unavailable{where}: {exc}", name=name)
    if isinstance(exc, redis_errors.ResponseError) and str(exc).startswith("WRONGTYPE"):
        return WrongTypeError(f"a key holds another type{where}: {exc}", name=name)
    if isinstance(exc, redis_errors.ResponseError) and _is_script_failure(str(exc)):
        return ScriptError(f"script failed{where}: {exc}", name=name)
    if isinstance(exc, (redis_errors.RedisError, redis_errors.RedisClusterException)):
        return BackendError(f"server error{where}: {exc}", name=name)
    return exc


class map_exceptions:  # lower case: used as a function, ``with map_exceptions(...)``
    """Translate redis-py's errors raised in the block into tenure's (httpcore's way).

    The one place where a redis-py error becomes a :class:`BackendError`
    subclass, with the original as ``__cause__``; tenure's own errors and
    anything else pass through untouched. ``refine(translated, original)``
    may replace the translated error (say which commands an ACL refused).
    A plain class rather than a generator: it wraps every call, hits included.
    """

    __slots__ = ("doing", "name", "refine")

    def __init__(
        self,
        *,
        name: str | None = None,
        doing: str = "",
        refine: Callable[[BaseException, BaseException], BaseException] | None = None,
    ) -> None:
        self.name = name
        self.doing = doing
        self.refine = refine

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if exc is None or isinstance(exc, TenureError):
            return
        if isinstance(exc, (redis_errors.RedisError, redis_errors.RedisClusterException)):
            error = translate_error(exc, name=self.name, doing=self.doing)
            if self.refine is not None:
                error = self.refine(error, exc)
            raise error from exc


def _is_script_failure(message: str) -> bool:
    lowered = message.lower()
    return "script" in lowered or "user_script" in lowered or lowered.startswith("err error")
