"""The caches' entries read and written through the codec, and the key-level commands.

Both caches name an entry with :class:`~tenure._core.cache.CacheNaming`
and encode its value with :class:`~tenure._core.codec.Codec`. This part
does what needs no script: :class:`~tenure.AsyncCache`'s GET and SET (with
PX), and ``exists``, ``delete``, ``ttl`` and ``clear`` of either cache. A
stored value that fails to decode (another serializer, tampered, corrupt)
is counted and reads as a miss, with one logged warning per cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from redis import exceptions as redis_errors

from tenure._async._cache_near import AsyncNearLayer, written
from tenure._async._scripting import AsyncClient
from tenure._backends.near_tracking import dropped_here
from tenure._core.cache import CacheCounters, CacheKeys, CacheNaming, as_bytes
from tenure._core.clients import is_cluster, map_exceptions, translate_error
from tenure._core.codec import Codec
from tenure._core.exceptions import CacheDecodeError

__all__ = ["AsyncCacheStore", "a_value", "read_values"]

logger = logging.getLogger("tenure.cache")


class AsyncCacheStore:
    """One cache's entries on the server, by ``key`` and ``param`` (see the module docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        naming: CacheNaming,
        codec: Codec,
        counters: CacheCounters,
        *,
        marks: bool = False,
    ) -> None:
        # marks: a missing entry's key may hold a load mark (a herd cache's), which
        # exists and ttl do not count as a value
        self._marks = marks
        self._client = client
        self._name = naming.name
        self._naming = naming
        self._codec = codec
        self._counters = counters
        self._warned_decode = False
        self.near: AsyncNearLayer | None = None
        """The cache's near entries (``near=``), or None."""

    def written(self, *stored: str) -> None:
        """Drop every near entry of ``stored`` in this process: it wrote or deleted them."""
        written(self.near, stored)

    def decode(self, data: bytes, key: str) -> Any:
        """The value stored as ``data`` at ``key``; a failure is counted and warned of once."""
        try:
            return self._codec.decode(data)
        except CacheDecodeError as exc:
            self._counters.add("decode_errors")
            if not self._warned_decode:
                self._warned_decode = True
                logger.warning(
                    "tenure cache %r: cannot decode %s (%s); treated as a miss",
                    self._name,
                    key,
                    exc,
                )
            raise

    # -- key-level commands, both caches ---------------------------------------

    async def exists(self, key: str, param: Any) -> bool:
        stored = self._naming.key_of(key, param)
        with map_exceptions(name=self._name, doing="checking a cache entry"):
            if self._marks:
                return await self._held(stored)
            return bool(await self._client.exists(stored))

    async def _held(self, stored: str) -> bool:
        """Whether ``stored`` holds a value, not nothing or a load mark."""
        return _a_value(await self._client.getrange(stored, 0, 0))

    async def delete_key(self, stored: str) -> bool:
        if self._marks:
            return await self._delete_marked([stored]) == 1
        try:
            with map_exceptions(name=self._name, doing="deleting a cache entry"):
                return bool(await self._client.delete(stored))
        finally:
            self.written(stored)

    async def delete_many(self, keys: Iterable[str], param: Any) -> int:
        stored = self._naming.keys_of(keys, param)
        if not stored:
            return 0
        if self._marks:
            return await self._delete_marked(stored)
        try:
            with map_exceptions(name=self._name, doing="deleting cache entries"):
                async with self._client.pipeline(transaction=False) as pipe:
                    for key in stored:
                        pipe.execute_command("DEL", key)  # a cluster pipeline splits delete()
                    return sum(int(n) for n in await pipe.execute())
        finally:
            self.written(*stored)

    async def _delete_marked(self, stored: list[str]) -> int:
        """Delete herd entries with their refresh leases; how many held a value.

        A load under way when its entry is deleted (a first load's mark, or a
        refresh's lease) then finds its write-back refused: a value read
        before the delete is never stored after it. A mark deleted is not
        counted: there was no value.
        """
        try:
            with map_exceptions(name=self._name, doing="deleting cache entries"):
                async with self._client.pipeline(transaction=False) as pipe:
                    for key in stored:
                        pipe.getrange(key, 0, 0)
                        pipe.execute_command("DEL", key)
                        pipe.execute_command("DEL", CacheKeys.for_entry(key).lease)
                    replies = await pipe.execute(raise_on_error=False)
        finally:
            self.written(*stored)
        for reply in replies[1::3]:  # a DEL refused (the ACL, say): raised as itself
            if isinstance(reply, Exception):
                raise translate_error(reply, name=self._name, doing="deleting cache entries")
        # (a GETRANGE of another type's key fails: not a mark, counted as deleted)
        return sum(
            1
            for first, deleted in zip(replies[::3], replies[1::3], strict=True)
            if int(deleted) == 1 and (isinstance(first, Exception) or as_bytes(first) != b"l")
        )

    async def ttl(self, key: str, param: Any) -> float | None:
        stored = self._naming.key_of(key, param)
        with map_exceptions(name=self._name, doing="reading a cache entry's expiry"):
            if self._marks:  # its expiry, and whether it holds a value: one round trip
                async with self._client.pipeline(transaction=False) as pipe:
                    pipe.pttl(stored)
                    pipe.getrange(stored, 0, 0)
                    expiry, first = await pipe.execute()
                left = int(expiry) if _a_value(first) else -2
            else:
                left = int(await self._client.pttl(stored))
        if left == -2:
            return None
        return float("inf") if left == -1 else left / 1000

    async def clear(self) -> int:
        pattern = self._naming.pattern()
        deleted = 0
        batch: list[Any] = []
        with map_exceptions(name=self._name, doing="clearing the cache"):
            async for key in self._client.scan_iter(match=pattern, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += await self._unlink(batch)
                    batch = []
            if batch:
                deleted += await self._unlink(batch)
        if self.near is not None:
            self.near.flush()
        return deleted

    async def _unlink(self, keys: list[Any]) -> int:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.execute_command("UNLINK", key)
                return sum(int(n) for n in await pipe.execute())
        finally:  # other cache objects' near entries of them too
            dropped_here(
                [k.decode("utf-8", "surrogateescape") if type(k) is bytes else k for k in keys]
            )

    # -- the plain cache's values: GET, and SET with PX -------------------------

    def _decoded_or_miss(
        self, data: bytes | None, key: str, default: Any, hit: str = "hits"
    ) -> Any:
        if data is None:
            self._counters.add("misses")
            return default
        try:
            value = self.decode(data, key)
        except CacheDecodeError:
            self._counters.add("misses")
            return default
        self._counters.add(hit)
        return value

    def _decoded_many(
        self, datas: list[Any], stored: list[str], default: Any, hit: str = "hits"
    ) -> list[Any]:
        """:meth:`_decoded_or_miss` of a batch, counted once."""
        values: list[Any] = []
        hits = 0
        for data, key in zip(datas, stored, strict=True):
            if data is not None:
                try:
                    values.append(
                        self.decode(data if type(data) is bytes else as_bytes(data) or b"", key)
                    )
                except CacheDecodeError:
                    pass
                else:
                    hits += 1
                    continue
            values.append(default)
        if hits:
            self._counters.add(hit, hits)
        if len(values) - hits:
            self._counters.add("misses", len(values) - hits)
        return values

    async def get(self, key: str, param: Any, default: Any) -> Any:
        stored = self._naming.key_of(key, param)
        near = self.near
        if near is not None:
            found, data = near.get(stored)
            if found:
                return self._decoded_or_miss(data, stored, default, "near_hits")
            with map_exceptions(name=self._name, doing="reading a cache entry"):
                data = await near.read(stored)
            return self._decoded_or_miss(data, stored, default)
        with map_exceptions(name=self._name, doing="reading a cache entry"):
            data = await self._client.get(stored)
        return self._decoded_or_miss(as_bytes(data), stored, default)

    async def get_many(self, keys: Iterable[str], param: Any, default: Any) -> list[Any]:
        stored = self._naming.keys_of(keys, param)
        if not stored:
            return []
        near = self.near
        if near is None:
            with map_exceptions(name=self._name, doing="reading cache entries"):
                replies = await read_values(self._client, stored)
            return self._decoded_many(replies, stored, default)
        values: list[Any] = [default] * len(stored)
        kept: list[int] = []  # answered from memory
        datas: list[Any] = []
        ask: list[int] = []  # the others: one round trip for them all
        for index, key in enumerate(stored):
            found, data = near.get(key)
            if found:
                kept.append(index)
                datas.append(data)
            else:
                ask.append(index)
        if kept:
            decoded = self._decoded_many(datas, [stored[i] for i in kept], default, "near_hits")
            for index, value in zip(kept, decoded, strict=True):
                values[index] = value
        if ask:
            asked = [stored[index] for index in ask]
            with map_exceptions(name=self._name, doing="reading cache entries"):
                read = [a_value(reply) for reply in await near.read_many(asked)]
            for index, value in zip(ask, self._decoded_many(read, asked, default), strict=True):
                values[index] = value
        return values

    async def set(self, key: str, value: Any, param: Any, ttl: float | None) -> bool:
        stored = self._naming.key_of(key, param)
        data, ttl_ms = self._codec.encode(value), self._naming.ttl_ms(ttl)
        try:
            with map_exceptions(name=self._name, doing="writing a cache entry"):
                return bool(await self._client.set(stored, data, px=ttl_ms or None))
        finally:
            self.written(stored)

    async def set_many(self, values: Mapping[str, Any], param: Any, ttl: float | None) -> bool:
        ttl_ms = self._naming.ttl_ms(ttl)
        entries = [
            (self._naming.key_of(key, param), self._codec.encode(v)) for key, v in values.items()
        ]
        if not entries:
            return True
        try:
            with map_exceptions(name=self._name, doing="writing cache entries"):
                async with self._client.pipeline(transaction=False) as pipe:
                    for stored, data in entries:
                        pipe.set(stored, data, px=ttl_ms or None)
                    return all(await pipe.execute())
        finally:
            self.written(*(stored for stored, _ in entries))


def _a_value(first: Any) -> bool:
    """Whether an entry's first byte (GETRANGE 0 0) is a value's: not nothing, not a mark."""
    head = as_bytes(first)
    return bool(head) and head != b"l"


async def read_values(client: AsyncClient, stored: list[str]) -> list[Any]:
    """The values at ``stored`` in one round trip: None for a key missing or of another type.

    MGET (whose rule that is); on a cluster, a pipeline of GETs (one per
    node, the keys spread over slots), each reply read by :func:`a_value`.
    """
    if not is_cluster(client):
        return list(await client.mget(stored))
    async with client.pipeline(transaction=False) as pipe:
        for key in stored:
            pipe.get(key)
        return [a_value(reply) for reply in await pipe.execute(raise_on_error=False)]


def a_value(reply: Any) -> Any:
    """A GET's ``reply`` in a batch: None for a key of another type (as MGET has it).

    Any other error is raised.
    """
    if isinstance(reply, Exception):
        if isinstance(reply, redis_errors.ResponseError) and str(reply).startswith("WRONGTYPE"):
            return None
        raise reply
    return reply
