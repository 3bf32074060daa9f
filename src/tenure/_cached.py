"""``@tenure.cached``: a function's results in a :class:`~tenure.HerdCache`.

One decorator for plain and async functions; the entry of a call is named by
the function and its arguments (bound to the signature, defaults applied,
encoded canonically), or by a ``cache_key`` hook. Every guarantee is
:meth:`HerdCache.fetch`'s: one load across every process on a cold entry,
stale values served at once while one caller refreshes, errors not cached
unless asked (``cache_errors``), and the function still computed when the
server is down.
"""

from __future__ import annotations

import dis
import functools
import inspect
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from tenure._async._cache import AsyncHerdCache
from tenure._core.cache import DEFAULT_HERD_TIMEOUT, DEFAULT_LOAD_LEASE, Loaded
from tenure._core.codec import DEFAULT_COMPRESSOR, DEFAULT_SERIALIZER
from tenure._core.exceptions import ArgumentError, ClientTypeError
from tenure._core.values import check_seconds
from tenure._sync._cache import HerdCache

__all__ = ["cached"]

F = TypeVar("F", bound=Callable[..., Any])

_KEY = "call"  # every entry of one function: "<prefix><name>:{call:<digest of the arguments>}"


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
) -> Callable[[F], F]:
    """Cache a function's results on the server; each result is loaded once.

    ``client`` is a ``redis.Redis`` (or ``RedisCluster``) for a plain
    function, a ``redis.asyncio`` client for an ``async def`` one. ``ttl`` is
    the results' freshness in seconds (``None``: until invalidated);
    ``herd_timeout``, ``load_lease``, ``early``, ``fallback``,
    ``serializer``, ``compressor`` and ``prefix`` are
    :class:`~tenure.HerdCache`'s. ``name`` (default: the function's module
    and qualified name) names the cache: give two deployments of a changed
    function different names.

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
    error_seconds = check_seconds(
        "error_ttl", error_ttl, name="cached", allow_none=False, longest=None, positive=True
    )
    errors = _ErrorCodec(cache_errors, error_seconds)

    def decorate(func: F) -> F:
        if not callable(func):
            raise ArgumentError("func", f"@cached needs a function, got {type(func).__name__}")
        is_async = inspect.iscoroutinefunction(func)
        cache_prefix = prefix if prefix is not None else "tenure:cached:"
        cache_name = name or _name_of(func, cache_prefix)
        kind: type[Any] = AsyncHerdCache if is_async else HerdCache
        try:
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
            )
        except ClientTypeError as exc:
            wanted = "a redis.asyncio client" if is_async else "a redis.Redis or RedisCluster"
            what = "async function" if is_async else "function"
            raise ClientTypeError(
                "client",
                f"@cached {what} {cache_name} needs {wanted}: {exc}",
                name=cache_name,
            ) from None
        signature = inspect.signature(func)
        captured = _captured_values(func)

        def param_of(args: tuple[Any, ...], kwargs: dict[str, Any], closure: dict[str, Any]) -> Any:
            if cache_key is not None:
                param = cache_key(*args, **kwargs)
                return {"key": param, "closure": closure} if closure else param
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{func.__qualname__}(): {exc}") from None
            bound.apply_defaults()
            if closure:
                return {"args": dict(bound.arguments), "closure": closure}
            return {"args": dict(bound.arguments)}

        names: dict[tuple[Any, ...], str] = {}  # simple arguments -> entry key, bounded

        def key_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            closure = captured() if captured is not None else {}  # read once per call
            memo = _memo_key(args, kwargs) if cache_key is None else None
            if memo is not None and closure:
                memo = (memo, tuple((k, type(v), v) for k, v in closure.items()))
            if memo is not None:
                found = names.get(memo)
                if found is not None:
                    return found
            try:
                stored = cast(str, cache.key_of(_KEY, param_of(args, kwargs, closure)))
            except ArgumentError as exc:
                raise ArgumentError(
                    "cache_key",
                    f"cannot name a call of {func.__qualname__} by its arguments ({exc}); "
                    "pass cache_key=",
                    name=cache_name,
                ) from None
            if memo is not None:
                if len(names) >= _MEMO_SIZE:
                    names.clear()
                names[memo] = stored
            return stored

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


_ERROR_TAG = "$tenure_error"
UNKNOWN_ERROR = object()  # a cached error this wrapper does not know: call the function


class _ErrorCodec:
    """How ``@cached`` stores an error of ``cache_errors`` and raises it again."""

    def __init__(self, kinds: tuple[type[BaseException], ...], ttl: float) -> None:
        self.kinds = kinds
        self.ttl = ttl
        self._by_path = {_path_of(kind): kind for kind in kinds}

    def stored(self, error: BaseException) -> Loaded:
        """The entry that stands for ``error``, fresh for the error TTL."""
        try:
            args = json.loads(json.dumps(list(error.args)))
        except (TypeError, ValueError):
            args = [str(error)]
        return Loaded({_ERROR_TAG: {"type": _path_of(type(error)), "args": args}}, self.ttl)

    def result(self, value: Any) -> Any:
        """``value``, or, for a stored error of a known class, raise that error."""
        if isinstance(value, Loaded):
            value = value.value
        if not (isinstance(value, dict) and len(value) == 1 and _ERROR_TAG in value):
            return value
        error = value[_ERROR_TAG]
        kind = self._by_path.get(str(error.get("type")))
        if kind is None:  # stored by a deployment that cached other errors: a miss
            return UNKNOWN_ERROR
        raise kind(*error.get("args", []))


def _path_of(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


_MEMO_SIZE = 4096
_SIMPLE = frozenset({str, int, float, bool, bytes, type(None)})


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


def _captured_values(func: Callable[..., Any]) -> Callable[[], dict[str, Any]] | None:
    """What names a closure's entries besides its arguments: its captured plain values.

    ``make_scaler(3)`` and ``make_scaler(5)`` return two functions of one
    qualified name (one cache); the numbers they captured tell their calls
    apart. Read at each call, as the function reads them. Only plain values
    count (numbers, strings, bytes, None, tuples and frozensets of them):
    captured objects (a client, a session, a list) are context, and a name
    the function itself assigns (``nonlocal calls; calls += 1``) is state,
    not what the result depends on. None: nothing captured that counts.
    """
    code = getattr(func, "__code__", None)
    cells = getattr(func, "__closure__", None)
    if code is None or not cells:
        return None
    assigned = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "STORE_DEREF"}
    pairs = [
        (var, cell)
        for var, cell in zip(code.co_freevars, cells, strict=False)
        if var != "__class__" and var not in assigned
    ]
    if not pairs:
        return None

    def values() -> dict[str, Any]:
        found: dict[str, Any] = {}
        for var, cell in pairs:
            try:
                value = cell.cell_contents
            except ValueError:  # not bound yet
                continue
            if _plain(value):
                found[var] = value
        return found

    return values


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind in _PLAIN:
        return True
    return kind in (tuple, frozenset) and all(_plain(item) for item in value)


_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


def _memo_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """A hashable stand-in for a call whose arguments are all simple values, else None.

    Types are part of it, so ``f(1)``, ``f(1.0)`` and ``f(True)`` (equal in
    Python, named differently on the server) never share an entry by way of it.
    """
    if not kwargs:  # the common case, in one pass
        kinds = tuple(map(type, args))
        return (kinds, args) if _SIMPLE.issuperset(kinds) else None
    memo: list[Any] = []
    for value in args:
        if type(value) not in _SIMPLE:
            return None
        memo += (type(value), value)
    for name, value in kwargs.items():
        if type(value) not in _SIMPLE:
            return None
        memo += (name, type(value), value)
    return tuple(memo)
