"""``@cached``'s sans-IO half: a call's entry named by its arguments; errors stored.

* :class:`CallNaming` — the server key of one call of a function: its
  arguments bound to the signature with defaults applied (or what a
  ``cache_key`` hook returns), and the plain values a closure captured,
  encoded by the cache's identity generator; calls of simple arguments
  remember their key (a bounded memo), so a hit costs no encoding;
* :class:`ErrorCodec` — an error of ``cache_errors`` stored as a value and
  raised again to its readers.

The decorator, and the names it gives functions in this process, live in
:mod:`tenure._cached`.
"""

from __future__ import annotations

import dis
import inspect
import json
from collections.abc import Callable
from typing import Any

from tenure._core.cache import Loaded
from tenure._core.exceptions import ArgumentError

__all__ = ["UNKNOWN_ERROR", "CallNaming", "ErrorCodec"]

ENTRY_KEY = "call"  # every entry of one function: "<prefix><name>:{call:<digest of the arguments>}"

_MEMO_SIZE = 4096
_SIMPLE = frozenset({str, int, float, bool, bytes, type(None)})


class CallNaming:
    """The entry of each call of ``func``, named through ``key_of`` (a cache's).

    ``cache_key(*args, **kwargs)``, if given, names a call instead of its
    arguments. ``cache_name`` is for the error raised when a call cannot be
    named.
    """

    __slots__ = (
        "_cache_key",
        "_captured",
        "_func",
        "_key_of",
        "_name",
        "_names",
        "_positional",
        "_signature",
    )

    def __init__(
        self,
        func: Callable[..., Any],
        key_of: Callable[[str, Any], str],
        cache_key: Callable[..., Any] | None,
        cache_name: str,
    ) -> None:
        self._func = func
        self._key_of = key_of
        self._cache_key = cache_key
        self._name = cache_name
        self._signature = inspect.signature(func)
        # The parameters' names when each is positional (no *args, **kwargs or
        # keyword-only): a call passing them all by position is bound by zip.
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        parameters = self._signature.parameters.values()
        self._positional: tuple[str, ...] | None = (
            tuple(p.name for p in parameters) if all(p.kind in kinds for p in parameters) else None
        )
        self._captured = _captured_values(func)
        self._names: dict[tuple[Any, ...], str] = {}  # simple arguments -> entry key, bounded

    def _param_of(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], closure: dict[str, Any]
    ) -> Any:
        if self._cache_key is not None:
            param = self._cache_key(*args, **kwargs)
            return {"key": param, "closure": closure} if closure else param
        positional = self._positional
        if positional is not None and not kwargs and len(args) == len(positional):
            arguments = dict(zip(positional, args, strict=True))  # what bind() would give
        else:
            try:
                bound = self._signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{self._func.__qualname__}(): {exc}") from None
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        if closure:
            return {"args": arguments, "closure": closure}
        return {"args": arguments}

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The server key of the call ``func(*args, **kwargs)``."""
        closure = self._captured() if self._captured is not None else {}  # read once per call
        memo = _memo_key(args, kwargs) if self._cache_key is None else None
        if memo is not None and closure:
            memo = (memo, tuple((k, type(v), v) for k, v in closure.items()))
        if memo is not None:
            found = self._names.get(memo)
            if found is not None:
                return found
        try:
            stored = self._key_of(ENTRY_KEY, self._param_of(args, kwargs, closure))
        except ArgumentError as exc:
            # Said in the words of this call: the cache's own argument names are not the user's.
            why = str(exc.message).removeprefix(f"{exc.argument}: ")
            # The function is the cache's name= (its qualified name unless given one).
            if self._cache_key is not None:
                raise ArgumentError(
                    "cache_key",
                    f"cannot name this call by what cache_key returned: {why}",
                    name=self._name,
                ) from None
            raise ArgumentError(
                "cache_key",
                f"cannot name this call by its arguments: {why}; pass cache_key= to name "
                "calls another way",
                name=self._name,
            ) from None
        if memo is not None:
            if len(self._names) >= _MEMO_SIZE:
                self._names.clear()
            self._names[memo] = stored
        return stored


_ERROR_TAG = "$tenure_error"
UNKNOWN_ERROR = object()  # a cached error this wrapper does not know: call the function


class ErrorCodec:
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
