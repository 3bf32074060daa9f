"""How cache entries become bytes and back, and how keys get their names (sans-IO).

A :class:`Codec` turns a value into the bytes stored on the server:

    b"tn1" <serializer tag> b":" <compressor tag> b":" <payload>

The header names the serializer and the compressor that made the payload, so
decoding never guesses: bytes written by another serializer, by a newer
format, or by something that is not tenure at all are reported as
:class:`CacheDecodeError` (which the caches turn into a miss and one logged
warning), never decoded into wrong data.

* :class:`JsonSerializer` (the default) and :class:`MsgpackSerializer`
  (``pip install msgpack``) store data, never code.
* :class:`PickleSerializer` stores any picklable object, and only with a
  signing key: every payload carries an HMAC-SHA256 of itself, checked before
  a byte is unpickled, so a payload planted by someone without the key is
  refused, never executed.
* :class:`ZlibCompressor` (the default, above 1 KiB) and
  :class:`ZstdCompressor` (``pip install zstandard``).

:class:`IdentityGenerator` names an entry by its ``key`` and optional
``param``: the param is encoded canonically (dict keys sorted, floats by
their shortest repr, sets sorted), so equal params give the same identity in
every process, host and Python version — unlike hashing ``str(param)``.

Each of the three may be replaced by any object with the same methods, or
``None`` to skip the step, as in aredis.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import hmac
import json
import pickle
import uuid
import zlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from tenure._core.exceptions import ArgumentError, CacheDecodeError, MissingDependencyError
from tenure._core.leased import lone_surrogate

__all__ = [
    "DEFAULT_COMPRESSOR",
    "DEFAULT_SERIALIZER",
    "Codec",
    "Compressor",
    "IdentityGenerator",
    "JsonSerializer",
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
    "ZlibCompressor",
    "ZstdCompressor",
    "canonical",
]

MAGIC = b"tn1"
"""The first bytes of every stored entry (format version 1)."""


@runtime_checkable
class Serializer(Protocol):
    """Turns values into bytes and back; ``tag`` names the format in each entry."""

    tag: str

    def serialize(self, value: Any) -> bytes:
        """The bytes of ``value``."""
        ...

    def deserialize(self, data: bytes) -> Any:
        """The value of ``data`` (raise any exception on bytes it did not make)."""
        ...


@runtime_checkable
class Compressor(Protocol):
    """Shrinks payloads; ``tag`` names the method in each entry."""

    tag: str

    def compress(self, data: bytes) -> bytes | None:
        """The compressed bytes, or ``None`` to store ``data`` as it is (too small)."""
        ...

    def decompress(self, data: bytes) -> bytes:
        """The original bytes of ``data``."""
        ...


# -- serializers -----------------------------------------------------------------


class JsonSerializer:
    """JSON (UTF-8, compact): dicts with string keys, lists, strings, numbers, booleans, None.

    A value is stored only if it comes back exactly as it went in: a tuple
    (JSON brings it back as a list), a dict key that is not a string (it
    would come back as one, and ``{1: 'a', '1': 'b'}`` would lose an entry),
    a set or any other type is refused with ``TypeError`` naming where in
    the value it is (the cache raises it as :class:`~tenure.ArgumentError`).
    Use :class:`MsgpackSerializer` or :class:`PickleSerializer` for more types.
    """

    tag = "json"

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def serialize(self, value: Any) -> bytes:
        """Compact JSON; raises ``TypeError`` for a value that would not come back exactly."""
        _check_json(value)  # exact types only, so what is written is what comes back
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8")

    def deserialize(self, data: bytes) -> Any:
        """The value of JSON ``data``."""
        return json.loads(data)


MAX_JSON_DEPTH = 500
"""Lists and dicts nested deeper than this are refused (a reader's own call
stack would not be deep enough to read them back)."""

_Entry = tuple[Any, int, Any, Any]  # (item, depth, parent entry, key or index in the parent)


_JSON_HINT = "use MsgpackSerializer or PickleSerializer for other types"


def _check_json(value: Any) -> None:
    """Raise ``TypeError`` naming the first part of ``value`` JSON would not bring back as it is.

    Only the exact types come back: a subclass (an enum, an ``OrderedDict``,
    a ``str`` subclass) would come back as its base type.
    """
    root: _Entry = (None, -1, None, None)
    stack: list[_Entry] = []
    _check_item(value, root, None, stack)  # the whole value, as if in a one-item list
    while stack:
        entry = stack.pop()
        item, depth = entry[0], entry[1]
        if depth >= MAX_JSON_DEPTH:
            raise TypeError(_too_deep(entry))
        inner: list[_Entry] = []
        if type(item) is list:
            for index, child in enumerate(item):
                _check_item(child, entry, index, inner)
        else:
            for key, child in item.items():
                if type(key) is not str:
                    raise TypeError(
                        f"{_path(entry)} has the key {key!r} ({type(key).__name__}): JSON keys "
                        f"are strings, it would come back as {_json_key(key)}; use string "
                        f"keys, or {_JSON_HINT}"
                    )
                _check_text(key, entry, key=True)
                _check_item(child, entry, key, inner)
        inner.reverse()
        stack.extend(inner)  # depth first, in the value's order


def _check_item(item: Any, parent: _Entry, step: Any, containers: list[_Entry]) -> None:
    """Check a scalar of ``parent`` at ``step``; a list or dict is added to ``containers``."""
    kind = type(item)
    if kind is str:
        if not item.isascii():  # the common case costs no entry
            _check_text(item, (item, 0, parent, step))
    elif kind is int:
        if item.bit_length() > 10_000:
            _check_digits(item, (item, 0, parent, step))
    elif kind is list or kind is dict:
        containers.append((item, parent[1] + 1, parent, step))
    elif kind is float or kind is bool or item is None:
        return
    elif kind is tuple:
        raise TypeError(
            f"{_path((item, 0, parent, step))} is a tuple: JSON would bring it back as a "
            f"list; store a list, or {_JSON_HINT}"
        )
    else:
        raise TypeError(
            f"{_path((item, 0, parent, step))} is of type {kind.__name__}: {_changed(item)}; "
            f"{_JSON_HINT}"
        )


def _path(entry: _Entry) -> str:
    """Where ``entry`` is in the value: ``value['a'][1]`` (the middle of a long one elided)."""
    steps: list[str] = []
    while entry[2] is not None and entry[2][1] >= 0:  # up to the whole value
        steps.append(f"[{entry[3]!r}]")
        entry = entry[2]
    steps.reverse()
    if len(steps) > 12:
        steps[6:-4] = [f"...({len(steps) - 10} more)..."]
    return "value" + "".join(steps)


def _check_text(text: str, entry: _Entry, *, key: bool = False) -> None:
    at = lone_surrogate(text)
    if at is not None:
        what = f"{_path(entry)} has a key" if key else f"{_path(entry)} is a string"
        raise TypeError(
            f"{what} with a lone surrogate {text[at]!r} at {at}: not UTF-8, so not storable as JSON"
        )


def _check_digits(number: int, entry: _Entry) -> None:
    try:
        str(number)
    except ValueError:
        raise TypeError(
            f"{_path(entry)} is an int of {number.bit_length()} bits, more digits than "
            f"Python converts to text (sys.get_int_max_str_digits()); {_JSON_HINT}"
        ) from None


def _too_deep(entry: _Entry) -> str:
    """The refusal of a list or dict nested :data:`MAX_JSON_DEPTH` deep: circular, or deep."""
    chain: list[_Entry] = []
    while entry is not None and entry[1] >= 0:  # up to the whole value
        chain.append(entry)
        entry = entry[2]
    chain.reverse()  # from the whole value down
    seen: set[int] = set()
    for link in chain:
        if id(link[0]) in seen:
            outer = next(e for e in chain if e[0] is link[0])
            return f"{_path(outer)} contains itself (a circular value): not storable as JSON"
        seen.add(id(link[0]))
    return (
        f"{_path(chain[-1])} is nested {MAX_JSON_DEPTH} lists or dicts deep, more than a "
        f"reader can read back; flatten the value, or {_JSON_HINT}"
    )


def _json_key(key: Any) -> str:
    try:
        return json.dumps(next(iter(json.loads(json.dumps({key: 0})))))
    except (TypeError, ValueError):
        return "nothing (JSON cannot hold it)"


def _changed(item: Any) -> str:
    try:
        back = json.loads(json.dumps(item))
    except (TypeError, ValueError):
        return "not JSON"
    return f"JSON would bring it back as {type(back).__name__}"


class MsgpackSerializer:
    """MessagePack (``pip install msgpack``): JSON's types plus bytes, more compact."""

    tag = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack  # optional dependency
        except ImportError:
            raise MissingDependencyError(
                'MsgpackSerializer needs msgpack: pip install msgpack (or "tenure[msgpack]")'
            ) from None
        self._msgpack = msgpack

    def serialize(self, value: Any) -> bytes:
        """The MessagePack bytes of ``value``."""
        return bytes(self._msgpack.packb(value, use_bin_type=True))

    def deserialize(self, data: bytes) -> Any:
        """The value of MessagePack ``data``."""
        return self._msgpack.unpackb(data, raw=False, strict_map_key=False)


class PickleSerializer:
    """Pickle, signed: any picklable object, for caches only trusted code writes to.

    ``key`` (bytes or str, at least 16 bytes) signs every payload with
    HMAC-SHA256; :meth:`deserialize` checks the signature before unpickling
    and refuses a payload that is unsigned, signed with another key or
    altered. Give every process of one cache the same key, and keep it secret.
    """

    tag = "pickle"
    _DIGEST = 32

    def __init__(self, key: bytes | str, *, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
        if isinstance(key, str):
            key = key.encode("utf-8")
        if not isinstance(key, bytes) or len(key) < 16:
            raise ArgumentError("key", "the signing key must be at least 16 bytes")
        self._key = key
        self._protocol = protocol

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    def serialize(self, value: Any) -> bytes:
        """The signature followed by the pickle of ``value``."""
        payload = pickle.dumps(value, protocol=self._protocol)
        return self._sign(payload) + payload

    def deserialize(self, data: bytes) -> Any:
        """Unpickle ``data`` only if its signature is this key's."""
        signature, payload = data[: self._DIGEST], data[self._DIGEST :]
        if len(signature) != self._DIGEST or not hmac.compare_digest(
            signature, self._sign(payload)
        ):
            raise CacheDecodeError("pickle payload with a missing or wrong signature: refused")
        return pickle.loads(payload)  # signed by this key: checked above


# -- compressors -----------------------------------------------------------------


class ZlibCompressor:
    """zlib at ``level``, for payloads of at least ``threshold`` bytes."""

    tag = "zlib"

    def __init__(self, *, threshold: int = 1024, level: int = 6) -> None:
        self.threshold = _threshold(threshold)
        self.level = _level(level, -1, 9, "zlib")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(threshold={self.threshold}, level={self.level})"

    def compress(self, data: bytes) -> bytes | None:
        """The zlib bytes, or ``None`` below the threshold or when nothing is saved."""
        if len(data) < self.threshold:
            return None
        packed = zlib.compress(data, self.level)
        return packed if len(packed) < len(data) else None

    def decompress(self, data: bytes) -> bytes:
        """The bytes zlib compressed."""
        return zlib.decompress(data)


class ZstdCompressor:
    """Zstandard (``pip install zstandard``) at ``level``, from ``threshold`` bytes."""

    tag = "zstd"

    def __init__(self, *, threshold: int = 1024, level: int = 3) -> None:
        try:
            import zstandard  # optional dependency
        except ImportError:
            raise MissingDependencyError(
                'ZstdCompressor needs zstandard: pip install zstandard (or "tenure[zstd]")'
            ) from None
        self.threshold = _threshold(threshold)
        self._compressor = zstandard.ZstdCompressor(level=_level(level, -131072, 22, "zstd"))
        self._decompressor = zstandard.ZstdDecompressor()

    def compress(self, data: bytes) -> bytes | None:
        """Zstandard bytes, or ``None`` below the threshold or when nothing is saved."""
        if len(data) < self.threshold:
            return None
        packed = bytes(self._compressor.compress(data))
        return packed if len(packed) < len(data) else None

    def decompress(self, data: bytes) -> bytes:
        """The bytes Zstandard compressed."""
        return bytes(self._decompressor.decompress(data))


def _threshold(threshold: object) -> int:
    """A compressor's ``threshold``: a whole number of bytes, 0 or more."""
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise ArgumentError("threshold", f"must be a whole number of bytes >= 0, got {threshold!r}")
    return threshold


def _level(level: object, lowest: int, highest: int, what: str) -> int:
    """A compressor's ``level``: a whole number its library takes."""
    if isinstance(level, bool) or not isinstance(level, int) or not lowest <= level <= highest:
        raise ArgumentError(
            "level", f"{what} takes a whole number from {lowest} to {highest}, got {level!r}"
        )
    return level


DEFAULT_SERIALIZER = JsonSerializer()
DEFAULT_COMPRESSOR = ZlibCompressor()

_RAW = "raw"  # no serializer: the value must be bytes (or str, stored as UTF-8)


def _tag_of(step: object, what: str) -> str:
    tag = getattr(step, "tag", None)
    if tag is None:
        tag = type(step).__qualname__
    if not isinstance(tag, str) or not tag or ":" in tag or len(tag) > 40:
        raise ArgumentError(what, f"tag must be a short str without ':', got {tag!r}")
    return tag


class Codec:
    """A serializer and a compressor (either may be ``None``), with the entry header."""

    __slots__ = (
        "_compressor_tag",
        "_json",
        "_plain",
        "_serializer_tag",
        "compressor",
        "serializer",
    )

    def __init__(
        self, serializer: Any = DEFAULT_SERIALIZER, compressor: Any = DEFAULT_COMPRESSOR
    ) -> None:
        for what, step, methods in (
            ("serializer", serializer, ("serialize", "deserialize")),
            ("compressor", compressor, ("compress", "decompress")),
        ):
            if step is not None and not all(callable(getattr(step, m, None)) for m in methods):
                raise ArgumentError(what, f"needs methods {' and '.join(methods)}, or None")
        self.serializer = serializer
        self.compressor = compressor
        tag = _RAW if serializer is None else _tag_of(serializer, "serializer")
        self._serializer_tag = tag.encode("ascii")
        self._compressor_tag = (
            b"" if compressor is None else _tag_of(compressor, "compressor").encode("ascii")
        )
        self._plain = MAGIC + self._serializer_tag + b"::"  # header of an uncompressed value
        self._json = type(serializer) is JsonSerializer  # read with json.loads, one call less

    def __repr__(self) -> str:
        return f"Codec({self._serializer_tag.decode()}, {self._compressor_tag.decode() or 'none'})"

    def encode(self, value: Any) -> bytes:
        """The stored bytes of ``value``: header, then the (compressed) payload."""
        if self.serializer is None:
            if isinstance(value, str):
                value = value.encode("utf-8")
            if not isinstance(value, bytes):
                raise ArgumentError(
                    "value",
                    f"without a serializer values must be bytes, got {type(value).__name__}",
                )
            payload = value
        else:
            try:
                payload = self.serializer.serialize(value)
            except Exception as exc:
                raise ArgumentError(
                    "value", f"{_tag_of(self.serializer, 'serializer')} cannot store it: {exc}"
                ) from exc
            if isinstance(payload, str):
                payload = payload.encode("utf-8")
        compressor_tag = b""
        if self.compressor is not None:
            packed = self.compressor.compress(payload)
            if packed is not None:
                payload, compressor_tag = packed, self._compressor_tag
        return b"".join((MAGIC, self._serializer_tag, b":", compressor_tag, b":", payload))

    def decode(self, data: bytes) -> Any:
        """The value of stored ``data``; :class:`CacheDecodeError` if it is not ours."""
        plain = data.startswith(self._plain)  # the common case: this format, uncompressed
        payload = data[len(self._plain) :] if plain else self._payload(data)
        if self.serializer is None:
            return payload
        try:
            if self._json:
                return json.loads(payload)
            return self.serializer.deserialize(payload)
        except CacheDecodeError:
            raise
        except Exception as exc:
            raise CacheDecodeError(f"cannot deserialize the entry: {exc}") from exc

    def _payload(self, data: bytes) -> bytes:
        """The serialized bytes of ``data``, its header checked, decompressed if it was."""
        if not data.startswith(MAGIC):
            raise CacheDecodeError("not a tenure cache entry (no tn1 header)")
        serializer_tag, sep, rest = data[len(MAGIC) :].partition(b":")
        compressor_tag, sep2, payload = rest.partition(b":")
        if not sep or not sep2:
            raise CacheDecodeError("truncated tenure cache entry")
        if serializer_tag != self._serializer_tag:
            raise CacheDecodeError(
                f"entry written with serializer {serializer_tag.decode(errors='replace')!r}, "
                f"this cache reads {self._serializer_tag.decode()!r}"
            )
        if not compressor_tag:
            return payload
        if compressor_tag != self._compressor_tag:
            raise CacheDecodeError(
                f"entry compressed with {compressor_tag.decode(errors='replace')!r}, "
                "which this cache does not use"
            )
        try:
            return bytes(self.compressor.decompress(payload))
        except Exception as exc:
            raise CacheDecodeError(f"cannot decompress the entry: {exc}") from exc


# -- identities ------------------------------------------------------------------


def canonical(value: Any, *, _where: str = "param") -> Any:
    """A JSON-ready form of ``value`` that is the same for equal values everywhere.

    Dicts get their keys sorted (keys may be str, int, float, bool or None);
    sets and frozensets are sorted by their canonical JSON; tuples become
    lists; bytes, datetimes, dates, times, Decimals and UUIDs are tagged so
    they never collide with a plain string. Anything else is refused with
    :class:`ArgumentError`: a key built from ``repr`` would not be stable.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"$float": repr(value)}
        return value
    if isinstance(value, (list, tuple)):
        return [canonical(item, _where=_where) for item in value]
    if isinstance(value, Mapping):
        pairs = []
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, int, float, bool))):
                raise ArgumentError(
                    _where,
                    f"dict keys must be str, int, float, bool or None, got {type(key).__name__}",
                )
            pairs.append((canonical(key, _where=_where), canonical(item, _where=_where)))
        if all(isinstance(key, str) and not key.startswith("$") for key, _ in pairs):
            return dict(pairs)  # dumped with sorted keys
        return {"$dict": sorted(([key, item] for key, item in pairs), key=lambda p: _dump(p[0]))}
    if isinstance(value, (set, frozenset)):
        members = [canonical(item, _where=_where) for item in value]
        return {"$set": sorted(members, key=_dump)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return {f"${type(value).__name__}": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    raise ArgumentError(_where, f"cannot build a stable cache key from a {type(value).__name__}")


_dump = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
"""Canonical JSON text (one encoder, built once: ``json.dumps`` builds one a call)."""


class IdentityGenerator:
    """Names a cache entry by ``key`` and an optional ``param`` (aredis's ``generate``).

    Without a param the identity is the key itself; with one it is
    ``key:<sha256 of the param's canonical JSON, 32 hex digits>``.
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def generate(self, key: str, param: Any) -> str:
        """The identity of ``key`` with ``param`` (``None``: the key alone)."""
        if param is None:
            return key
        digest = hashlib.sha256(_dump(canonical(param)).encode("utf-8")).hexdigest()
        return f"{key}:{digest[:32]}"
