"""``@tenure.cached``: a function's results in a :class:`~tenure.HerdCache`.

One decorator for plain and async functions; the entry of a call is named by
the function and its arguments (bound to the signature, defaults applied,
encoded canonically), or by a ``cache_key`` hook. Every guarantee is
:meth:`HerdCache.fetch`'s: one load across every process on a cold entry,
stale values served at once while one caller refreshes, errors not cached
unless asked (``cache_errors``), and the function still computed when the
server is down.

Here: the decorator, the wrappers it makes, and the names it gives functions
(unique in this process). How a call names its entry, and how an error is
stored and raised again, is sans-IO: :mod:`tenure._core.cached`. A wrapper
reaches its entry by server key through the cache's ``_fetch_key``,
``_store_key`` and ``_delete_key``; the cache's re-entry guard refuses a
loader that asks for its own entry.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from tenure._async._cache import AsyncHerdCache
from tenure._core.cache import DEFAULT_HERD_TIMEOUT, DEFAULT_LOAD_LEASE, check_herd_timeout
from tenure._core.cached import UNKNOWN_ERROR, CallNaming, ErrorCodec
from tenure._core.clients import require_bytes_replies, require_client
from tenure._core.codec import DEFAULT_COMPRESSOR, DEFAULT_SERIALIZER
from tenure._core.exceptions import ArgumentError
from tenure._core.near import NearCache
from tenure._core.values import check_seconds
from tenure._sync._cache import HerdCache

__all__ = ["cached"]

F = TypeVar("F", bound=Callable[..., Any])


def cached(
    client: Any,
    *,
    ttl: float | None,
    name: str | None = None,
    herd_timeout: float = DEFAULT_HERD_TIMEOUT,
    load_lease: float = DEFAULT_LOAD_LEASE,
    early: float = 0.0,
    cache_key: Callable[..., Any] | None = None,
    cache_errors: tuple[type[BaseException], ...] = (),
    error_ttl: float = 5.0,
    fallback: bool = True,
    serializer: Any = DEFAULT_SERIALIZER,
    compressor: Any = DEFAULT_COMPRESSOR,
    prefix: str | None = None,
    metric_name: str | None = None,
    near: bool | NearCache | None = None,
) -> Callable[[F], F]:
    """Cache a function's results on the server; each result is loaded once.

    ``client`` is a ``redis.Redis`` (or ``RedisCluster``) for a plain
    function, a ``redis.asyncio`` client for an ``async def`` one. ``ttl`` is
    the results' freshness in seconds (``None``: until invalidated);
    ``herd_timeout``, ``load_lease``, ``early``, ``fallback``,
    ``serializer``, ``compressor``, ``prefix``, ``metric_name`` and ``near``
    are :class:`~tenure.HerdCache`'s. Each duration (``error_ttl`` too) is
    checked here, as every primitive checks its own: a number of seconds,
    at most ten years, else :class:`~tenure.ArgumentError` naming it.
    ``name`` (default: the function's module and qualified name) names the
    cache: give two deployments of a changed function different names.

    A call's entry is named by its arguments, bound to the signature with
    defaults applied, so ``f(1)`` and ``f(x=1)`` share one; they must be
    values with a stable encoding (see :class:`~tenure.IdentityGenerator`).
    ``cache_key(*args, **kwargs)`` may return what names the call instead
    (say, to leave out ``self`` or a database handle).

    Errors are not cached: a call that raises stores nothing. Negative
    caching is opt-in: an error of a class in ``cache_errors`` (say, your
    ``NotFound``) is stored for ``error_ttl`` seconds and raised again, as
    ``cls(*args)``, to every caller meanwhile.

    The wrapper has ``.cache`` (the :class:`~tenure.HerdCache`),
    ``.invalidate(*args, **kwargs)`` (delete that call's entry),
    ``.refresh(*args, **kwargs)`` (call the function now and store its
    result, whatever is cached) and ``.uncached(*args, **kwargs)`` (the
    function itself, bypassing the cache).
    """
    if not isinstance(cache_errors, tuple) or not all(
        isinstance(kind, type) and issubclass(kind, BaseException) for kind in cache_errors
    ):
        raise ArgumentError("cache_errors", "must be a tuple of exception classes")
    # Checked here, as HerdCache checks them, so a bad one fails at the decorator.
    # The function, and so its cache's name, is not known yet: "@cached" stands for it.
    check_seconds("ttl", ttl, name="@cached", allow_none=True, positive=True)
    check_herd_timeout(herd_timeout, "@cached")
    check_seconds("load_lease", load_lease, name="@cached", allow_none=False, positive=True)
    check_seconds("early", early, name="@cached", allow_none=False, longest=None)  # a factor
    error_seconds = check_seconds(
        "error_ttl", error_ttl, name="@cached", allow_none=False, positive=True
    )
    errors = ErrorCodec(cache_errors, error_seconds)

    def decorate(func: F) -> F:
        if not callable(func):
            raise ArgumentError("func", f"@cached needs a function, got {type(func).__name__}")
        is_async = inspect.iscoroutinefunction(func)
        cache_prefix = prefix if prefix is not None else "tenure:cached:"
        cache_name = name or _name_of(func, cache_prefix)
        # Checked here, in @cached's words: the cache beneath is not what the user made.
        require_client(
            client,
            is_async=is_async,
            owner="@cached on an async function" if is_async else "@cached on a function",
            name=cache_name,
            twin="cache a plain function" if is_async else "cache an async function",
        )
        require_bytes_replies(
            client,
            owner="@cached",
            stores="results as binary entries (serialized, compressed when large)",
            name=cache_name,
        )
        kind: type[Any] = AsyncHerdCache if is_async else HerdCache
        cache = kind(
            client,
            cache_name,
            ttl=ttl,
            herd_timeout=herd_timeout,
            load_lease=load_lease,
            early=early,
            fallback=fallback,
            serializer=serializer,
            compressor=compressor,
            prefix=cache_prefix,
            metric_name=metric_name,
            near=near,
        )
        key_of = CallNaming(func, cache.key_of, cache_key, cache_name).key_of

        if is_async:

            async def async_load(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                try:
                    return await func(*args, **kwargs)
                except errors.kinds as exc:
                    return errors.stored(exc)

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                stored = key_of(args, kwargs)
                value = errors.result(
                    await cache._fetch_key(stored, lambda: async_load(args, kwargs))
                )
                return await func(*args, **kwargs) if value is UNKNOWN_ERROR else value

            async def async_invalidate(*args: Any, **kwargs: Any) -> bool:
                return bool(await cache._delete_key(key_of(args, kwargs)))

            async def async_refresh(*args: Any, **kwargs: Any) -> Any:
                stored = key_of(args, kwargs)
                loaded = await async_load(args, kwargs)
                await cache._store_key(stored, loaded, None, None)
                return errors.result(loaded)

            wrapper: Any = async_wrapper
            wrapper.invalidate = async_invalidate
            wrapper.refresh = async_refresh
        else:

            def sync_load(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                try:
                    return func(*args, **kwargs)
                except errors.kinds as exc:
                    return errors.stored(exc)

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                stored = key_of(args, kwargs)
                value = errors.result(cache._fetch_key(stored, lambda: sync_load(args, kwargs)))
                return func(*args, **kwargs) if value is UNKNOWN_ERROR else value

            def sync_invalidate(*args: Any, **kwargs: Any) -> bool:
                return bool(cache._delete_key(key_of(args, kwargs)))

            def sync_refresh(*args: Any, **kwargs: Any) -> Any:
                stored = key_of(args, kwargs)
                loaded = sync_load(args, kwargs)
                cache._store_key(stored, loaded, None, None)
                return errors.result(loaded)

            wrapper = sync_wrapper
            wrapper.invalidate = sync_invalidate
            wrapper.refresh = sync_refresh
        wrapper.cache = cache
        wrapper.uncached = func
        return cast(F, wrapper)

    return decorate


_names: dict[tuple[str, str], Any] = {}  # (prefix, derived cache name) -> the function's code
_names_mutex = threading.Lock()


def _name_of(func: Any, prefix: str) -> str:
    """The cache name of a function decorated without ``name=``: its module and qualified name.

    Two different functions with one qualified name (two lambdas of one
    scope, a function defined again with another body) would share entries
    and return each other's results: the second is refused in this process.
    The same code decorated again (closures of one factory, a module
    reloaded unchanged) is the same function.
    """
    code = getattr(func, "__code__", None)
    qualname = getattr(func, "__qualname__", None)
    if code is None or not isinstance(qualname, str):
        raise ArgumentError(
            "name",
            f"@cached needs name= for a {type(func).__name__} (it has no qualified name "
            "of its own to name its cache by)",
        )
    cache_name = f"{func.__module__}.{qualname}"
    with _names_mutex:
        known = _names.setdefault((prefix, cache_name), code)
    if known != code:
        where = f"{code.co_filename}:{code.co_firstlineno}"
        raise ArgumentError(
            "name",
            f"another function is cached as {cache_name!r} in this process (this one is at "
            f"{where}); they would share entries and return each other's results: give "
            "each its own name=",
        )
    return cache_name
