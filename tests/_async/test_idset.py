"""IdSet contract tests, written once for asyncio and generated for threads.

Two clients stand for two processes: each keeps its own local copies, so a
write through one and a query through the other is the cross-process case.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import numpy as np
import pytest
import redis.asyncio

from tenure import ArgumentError, AsyncIdSet, ClientTypeError, IdSetCorruptError, WrongTypeError
from tenure._backends.local_copies import LOCAL_COPIES
from tests._backend_asyncio import gather, until

pytestmark = pytest.mark.topologies("standalone", "cluster")

MAX = 2**32 - 1


async def test_adds_removes_and_answers_membership(tenure_async_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "followers:1")
    assert await ids.version() == 0
    assert await ids.count() == 0
    assert not await ids.contains(5)
    await ids.add(5)
    await ids.add_many([1, 2, 3, MAX, 0])
    await ids.remove(2)
    await ids.remove_many(np.array([3, 77], dtype=np.int64))
    assert await ids.version() == 4
    assert await ids.contains(5) and await ids.contains(MAX) and await ids.contains(0)
    assert not await ids.contains(2) and not await ids.contains(3)
    assert await ids.count() == 4
    found = await ids.to_numpy()
    assert found.dtype == np.uint32
    assert found.tolist() == [0, 1, 5, MAX]


async def test_empty_writes_are_not_writes(tenure_async_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "quiet")
    await ids.add_many([])
    await ids.remove_many(np.zeros(0, dtype=np.uint32))
    assert await ids.version() == 0
    assert await tenure_async_client.exists(ids.keys.meta) == 0


async def test_accepts_every_integer_array_and_iterable(tenure_async_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "kinds")
    for dtype in (np.uint8, np.int16, np.uint32, np.int64, np.uint64):
        await ids.add_many(np.array([1, 2, 3], dtype=dtype))
    await ids.add_many(range(10, 13))
    await ids.add_many(x for x in (20, 20, 21))
    await ids.add_many([np.uint32(30), np.int64(31)])
    assert (await ids.to_numpy()).tolist() == [1, 2, 3, 10, 11, 12, 20, 21, 30, 31]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1, -1], "-1 (at position 1) is outside 0..4294967295"),
        ([2**32], "4294967296 (at position 0) is outside 0..4294967295"),
        ([2**70], "(at position 0) is outside 0..4294967295"),
        ([1, 2.0], "2.0 (at position 1) is not an int"),
        ([True], "True (at position 0) is not an int"),
        (["7"], "'7' (at position 0) is not an int"),
        ("123", "must be a numpy array or an iterable of ints, got str"),
        (7, "must be a numpy array or an iterable of ints, got int"),
        (np.array([1.0]), "must hold integers, got an array of float64"),
        (np.array([True]), "must hold integers, got an array of bool"),
        (np.array([[1, 2]]), "must be one-dimensional, got 2"),
        (np.array([5, -3], dtype=np.int32), "-3 (at position 1) is outside"),
        (np.array([2**40], dtype=np.uint64), "1099511627776 (at position 0) is outside"),
    ],
)
async def test_bad_ids_are_refused_and_nothing_is_written(
    tenure_async_client: Any, values: Any, message: str
) -> None:
    ids = AsyncIdSet(tenure_async_client, "strict")
    await ids.add(1)
    for write in (ids.add_many, ids.remove_many):
        with pytest.raises(ArgumentError, match="^ids: ") as raised:
            await write(values)
        assert message in str(raised.value)
    for bad in (-1, 2**32, 1.0, "1", True, None):
        with pytest.raises(ArgumentError, match="^id: "):
            await ids.add(bad)  # type: ignore[arg-type]
        with pytest.raises(ArgumentError, match="^id: "):
            await ids.contains(bad)  # type: ignore[arg-type]
    assert await ids.version() == 1
    assert (await ids.to_numpy()).tolist() == [1]


def test_bad_settings_are_refused(tenure_async_client: Any) -> None:
    with pytest.raises(ArgumentError, match="name: must not be empty"):
        AsyncIdSet(tenure_async_client, "")
    with pytest.raises(ArgumentError, match="name: must not contain '{' or '}'"):
        AsyncIdSet(tenure_async_client, "a{b")
    with pytest.raises(ArgumentError, match="delta_limit: must be an int >= 1, got 0"):
        AsyncIdSet(tenure_async_client, "s", delta_limit=0)
    with pytest.raises(ArgumentError, match="chunk_bytes: must be an int in 1024..268435456"):
        AsyncIdSet(tenure_async_client, "s", chunk_bytes=10)


async def test_a_decoding_client_is_refused_at_once() -> None:
    # its replies would turn the stored bitmaps into text: every read would fail
    decoding = redis.asyncio.Redis(decode_responses=True)
    with pytest.raises(ClientTypeError, match="decode_responses=False"):
        AsyncIdSet(decoding, "followers")
    await decoding.aclose()


async def test_a_key_of_another_type_is_refused_by_name(tenure_async_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "taken")
    await tenure_async_client.set(ids.keys.meta, "not a hash")
    for call in (lambda: ids.add(1), ids.count, ids.version):
        with pytest.raises(WrongTypeError, match="WRONGTYPE") as raised:
            await call()
        assert isinstance(raised.value, redis.exceptions.ResponseError)
    with pytest.raises(WrongTypeError, match=r"tenure:idset:\{taken\}:meta holds a string"):
        await ids.add(1)
    await tenure_async_client.delete(ids.keys.meta)
    await tenure_async_client.set(ids.keys.log, "not a list")
    with pytest.raises(WrongTypeError, match=r"\{taken\}:log holds a string, not the list"):
        await ids.count()
    assert await tenure_async_client.get(ids.keys.log) == b"not a list"


async def test_another_clients_writes_are_never_answered_stale(
    tenure_async_client: Any, other_client: Any
) -> None:
    writer = AsyncIdSet(tenure_async_client, "shared", delta_limit=50)
    reader = AsyncIdSet(other_client, "shared")
    model: set[int] = set()
    rng = random.Random(7)
    for step in range(120):
        batch = [rng.randrange(0, 400) for _ in range(rng.randrange(1, 6))]
        if rng.random() < 0.3:
            await writer.remove_many(batch)
            model.difference_update(batch)
        else:
            await writer.add_many(batch)
            model.update(batch)
        if step % 40 == 39:
            await writer.compact()
        assert await reader.count() == len(model), step
        assert (await reader.to_numpy()).tolist() == sorted(model), step
    stats = reader.statistics()
    assert stats.reads == 240 and stats.full >= 1
    assert stats.incremental > stats.full  # compactions were crossed without reading it all
    assert writer.statistics().compactions >= 3


async def test_a_write_passing_the_delta_limit_compacts(tenure_async_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "grows", delta_limit=1000)
    await ids.add_many(range(999))
    meta = await tenure_async_client.hgetall(ids.keys.meta)
    assert int(meta[b"pending"]) == 999 and int(meta[b"chunks"]) == 0
    assert await tenure_async_client.llen(ids.keys.log) == 1
    await ids.add(5000)
    meta = await tenure_async_client.hgetall(ids.keys.meta)
    assert int(meta[b"pending"]) == 0 and int(meta[b"count"]) == 1000
    assert int(meta[b"version"]) == 2  # compaction changes no content, so no version
    assert await tenure_async_client.exists(ids.keys.base) == 1
    assert ids.statistics().compactions == 1
    assert await ids.count() == 1000
    assert not await ids.compact()  # nothing left to fold
    # The log keeps the last merged writes, up to a sixteenth of the set (for
    # readers a moment behind), and none from before the previous compaction.
    assert (int(meta[b"log_start"]), int(meta[b"base_pos"])) == (1, 2)
    assert await tenure_async_client.llen(ids.keys.log) == 1
    for i in range(20):
        await ids.add_many(range(10_000 + 50 * i, 10_050 + 50 * i))
    meta = await tenure_async_client.hgetall(ids.keys.meta)
    assert (int(meta[b"log_start"]), int(meta[b"base_pos"])) == (20, 22)
    assert await tenure_async_client.llen(ids.keys.log) == 2
    assert ids.statistics().compactions == 2
    assert await ids.count() == 2000
    # a bulk load, more than the log keeps: only the compact form remains
    await ids.add_many(range(100_000, 150_000))
    meta = await tenure_async_client.hgetall(ids.keys.meta)
    assert (int(meta[b"log_start"]), int(meta[b"base_pos"])) == (23, 23)
    assert await tenure_async_client.llen(ids.keys.log) == 0
    assert await ids.count() == 52_000
    assert not await ids.compact()  # nothing to fold: no round trip wasted on a swap
    assert ids.statistics().compaction_conflicts == 0


async def test_large_writes_and_chunked_forms_round_trip(
    tenure_async_client: Any, other_client: Any
) -> None:
    rng = np.random.default_rng(3)
    spread = rng.integers(0, 2**32, 1_100_000, dtype=np.uint64)  # two log elements
    ids = AsyncIdSet(tenure_async_client, "chunked", chunk_bytes=65536, delta_limit=10**9)
    await ids.add_many(spread)
    assert await tenure_async_client.llen(ids.keys.log) == 2
    expected = np.unique(spread).astype(np.uint32)
    assert np.array_equal(await AsyncIdSet(other_client, "chunked").to_numpy(), expected)
    assert await ids.compact()
    assert await tenure_async_client.llen(ids.keys.base) > 10
    LOCAL_COPIES.clear()  # as in a process just started: the set is read whole
    fresh = AsyncIdSet(other_client, "chunked")
    assert np.array_equal(await fresh.to_numpy(), expected)
    assert fresh.statistics().full == 1


def _same(client: Any) -> dict[str, Any]:
    """Keyword arguments for another client of the same server (standalone only)."""
    kwargs = client.connection_pool.connection_kwargs
    return {"host": kwargs["host"], "port": kwargs["port"]}


async def test_writes_during_a_compaction_are_kept(
    tenure_async_client: Any, other_client: Any
) -> None:
    compactor = AsyncIdSet(tenure_async_client, "busy", delta_limit=10**9)
    writer = AsyncIdSet(other_client, "busy", delta_limit=10**9)
    await compactor.add_many(range(0, 20_000, 2))
    model = set(range(0, 20_000, 2))

    async def compact() -> None:
        for _ in range(5):
            await compactor.compact()

    async def write() -> None:
        for i in range(60):
            if i % 3 == 0:
                await writer.remove_many([i * 2, i * 2 + 2])
                model.difference_update([i * 2, i * 2 + 2])
            else:
                await writer.add_many([100_000 + i])
                model.add(100_000 + i)

    await gather(compact, write)
    await compactor.compact()
    for view in (compactor, writer):
        assert (await view.to_numpy()).tolist() == sorted(model)


async def test_a_crashed_compactor_stops_nothing(tenure_async_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "orphan", delta_limit=10)
    # a compactor that died holding the lease, its upload half done
    await tenure_async_client.set(ids.keys.lease, "dead", px=400)
    await tenure_async_client.rpush(ids.keys.stage("dead"), b"partial")
    await tenure_async_client.pexpire(ids.keys.stage("dead"), 400)
    await ids.add_many(range(50))  # past the limit: the compaction is skipped, not waited for
    assert await ids.count() == 50
    assert ids.statistics().compactions == 0
    await _until_gone(tenure_async_client, ids.keys.lease, ids.keys.stage("dead"))
    await ids.add(99)
    assert ids.statistics().compactions == 1
    assert (await ids.to_numpy()).tolist() == [*range(50), 99]


async def _until_gone(client: Any, *keys: str) -> None:
    async def gone() -> bool:
        return bool(await client.exists(*keys) == 0)

    await until(gone, 5, f"{keys} expiring")


async def test_clear_empties_and_moves_the_version_on(
    tenure_async_client: Any, other_client: Any
) -> None:
    ids = AsyncIdSet(tenure_async_client, "gone", delta_limit=5)
    reader = AsyncIdSet(other_client, "gone")
    await ids.add_many(range(20))
    assert await reader.count() == 20
    await ids.clear()
    assert await ids.version() == 2
    assert await reader.count() == 0
    await ids.add(3)
    assert (await reader.to_numpy()).tolist() == [3]


async def test_a_deleted_and_rebuilt_set_is_read_again(
    tenure_async_client: Any, other_client: Any
) -> None:
    ids = AsyncIdSet(tenure_async_client, "rebuilt")
    reader = AsyncIdSet(other_client, "rebuilt")
    await ids.add_many([1, 2, 3])
    assert await reader.count() == 3
    # Deleted behind tenure's back (or a restart without persistence), then
    # rebuilt with the same number of writes: a new generation, read whole.
    await tenure_async_client.delete(*ids.keys.read)
    await ids.add_many([7])
    assert (await reader.to_numpy()).tolist() == [7]


async def test_intersections_jaccard_and_top_overlaps(tenure_async_client: Any) -> None:
    a = AsyncIdSet(tenure_async_client, "a")
    b = AsyncIdSet(tenure_async_client, "b")
    c = AsyncIdSet(tenure_async_client, "c")
    empty = AsyncIdSet(tenure_async_client, "empty")
    await a.add_many(range(100))
    await b.add_many(range(50, 150))
    await c.add_many(range(90, 95))
    assert await a.intersection_count(b) == 50
    assert await a.intersection_count(b, c) == 5
    assert await a.intersection_count() == 100
    assert (await a.intersection(b, c)).tolist() == [90, 91, 92, 93, 94]
    assert (await a.intersection(empty)).tolist() == []
    assert await a.jaccard(b) == pytest.approx(50 / 150)
    assert await a.jaccard(a) == 1.0
    assert await empty.jaccard(empty) == 0.0
    top = await a.top_overlaps([c, empty, b, a], k=3)
    assert [(s.name, n) for s, n in top] == [("a", 100), ("b", 50), ("c", 5)]
    assert await a.top_overlaps([c, b], k=0) == []
    tie = await c.top_overlaps([b, a], k=2)
    assert [(s.name, n) for s, n in tie] == [("b", 5), ("a", 5)]  # ties keep the order given
    with pytest.raises(ArgumentError, match="others: item 1 is a str, not an AsyncIdSet"):
        await a.intersection_count(b, "c")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="k: must be an int >= 0"):
        await a.top_overlaps([b], k=-1)


async def test_top_overlaps_over_many_sets_revalidates_them_together(
    tenure_async_client: Any, other_client: Any
) -> None:
    rng = np.random.default_rng(11)
    mine = AsyncIdSet(tenure_async_client, "me")
    await mine.add_many(rng.integers(0, 5000, 1000))
    others = [AsyncIdSet(tenure_async_client, f"them:{i}") for i in range(200)]
    for i, other in enumerate(others):
        await other.add_many(rng.integers(0, 5000, 10 + i))
    top = await mine.top_overlaps(others, k=5)
    mine_np = await mine.to_numpy()
    exact = []
    for i, other in enumerate(others):
        exact.append((len(np.intersect1d(mine_np, await other.to_numpy())), -i))
    exact.sort(reverse=True)
    assert [(s.name, n) for s, n in top] == [(f"them:{-i}", n) for n, i in exact[:5]]
    # another process changes one set: the next answer includes it
    leader = AsyncIdSet(other_client, "them:3")
    await leader.add_many(mine_np)
    top = await mine.top_overlaps(others, k=1)
    assert top[0][0].name == "them:3" and top[0][1] == len(mine_np)


@pytest.mark.standalone_only
async def test_a_corrupt_form_is_refused_before_use(tenure_async_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "fragile", delta_limit=10**9)
    await ids.add_many(range(0, 300_000, 3))
    assert await ids.compact()
    client = tenure_async_client
    chunk = await client.lindex(ids.keys.base, 0)

    async def fresh_read() -> Any:
        reader = AsyncIdSet(redis.asyncio.Redis(**_same(client)), "fragile")
        try:
            return await reader.count()
        finally:
            await reader.client.aclose()

    await client.lset(ids.keys.base, 0, chunk[:-10])  # truncated
    with pytest.raises(IdSetCorruptError, match="bytes in 1 chunks, .* expected") as raised:
        await fresh_read()
    assert raised.value.name == "fragile"
    altered = bytearray(chunk)
    altered[len(altered) // 2] ^= 0xFF
    await client.lset(ids.keys.base, 0, bytes(altered))
    with pytest.raises(IdSetCorruptError, match="CRC-32 does not match"):
        await fresh_read()
    garbage = b"\x00" * len(chunk)
    await client.lset(ids.keys.base, 0, garbage)
    await client.hset(ids.keys.meta, "crc", zlib.crc32(garbage))
    with pytest.raises(IdSetCorruptError, match="not a Roaring bitmap"):
        await fresh_read()
    await client.lset(ids.keys.base, 0, chunk)
    await client.hset(ids.keys.meta, mapping={"crc": zlib.crc32(chunk), "count": 5})
    with pytest.raises(IdSetCorruptError, match="holds 100,000 ids, 5 expected"):
        await fresh_read()
    await client.hset(ids.keys.meta, "count", 100_000)
    assert await fresh_read() == 100_000
    await client.rpush(ids.keys.log, b"+abc")
    with pytest.raises(IdSetCorruptError, match="log element 1 .* is not a write"):
        await ids.count()
    with pytest.raises(IdSetCorruptError, match="log element 1 .* is not a write"):
        await ids.count()  # still refused: the bad element was never applied


async def test_statistics_and_repr(tenure_async_client: Any, other_client: Any) -> None:
    ids = AsyncIdSet(tenure_async_client, "seen")
    assert repr(ids) == "<AsyncIdSet 'seen' (no local copy)>"
    await ids.add_many([4, 5])
    await ids.count()
    await ids.count()
    assert repr(ids) == "<AsyncIdSet 'seen' version 1: 2 ids in the local copy>"
    stats = ids.statistics()
    assert (stats.writes, stats.ids_written, stats.reads, stats.unchanged) == (1, 2, 2, 1)
    assert stats.bytes_read == 9  # the log element: a sign and two 4-byte ids
