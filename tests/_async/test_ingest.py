"""IngestJob contract tests, written once for asyncio and generated for threads (real servers).

Workers here are tasks (threads in the sync twin) of one process; the tests
with worker processes, kill -9, SIGSTOP and a server restart are in
tests/test_ingest.py.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff

from tenure import (
    ArgumentError,
    AsyncCallableSource,
    AsyncIngestJob,
    AsyncLock,
    CallableSource,
    JobBusyError,
    PlanMismatchError,
    SourceRowError,
    SqlSource,
)
from tenure.server import FaultProxy, ServerProcess
from tests._backend_asyncio import gather, join, spawn, until
from tests._backend_threads import until as until_in_a_thread
from tests.test_ingest import make_table

pytestmark = pytest.mark.topologies("standalone", "cluster")


async def stream_keys(client: redis.asyncio.Redis, key: str) -> list[int]:
    entries: Any = await client.xrange(key)
    return [int(fields[b"key"]) for _, fields in entries]


async def test_every_row_lands_once_with_concurrent_workers(
    tenure_async_client: redis.asyncio.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    ids = make_table(tmp_path / "db.sqlite", 5_000)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    clients = [redis.asyncio.Redis.from_url(tenure_server.url) for _ in range(3)]
    jobs = [
        AsyncIngestJob(c, "events", SqlSource(url, "events", "id"), chunk_size=700, batch=100)
        for c in clients
    ]
    reports = await gather(*(job.work for job in jobs))
    sink = jobs[0].keys.default_sink()
    assert sorted(await stream_keys(tenure_async_client, sink)) == ids
    assert sum(r.rows for r in reports) == len(ids)
    assert all(r.chunks > 0 for r in reports)  # they worked side by side
    status = await jobs[0].status()
    assert status.finished and status.rows == len(ids) and status.free == 0
    assert status.chunks == (await jobs[0].plan()).chunks
    assert status.holders == () and status.claims == status.chunks
    assert 0 < status.elapsed < 60 and status.rate == status.rows / status.elapsed
    entries: Any = await tenure_async_client.xrange(sink, count=1)
    first = json.loads(entries[0][1][b"row"])
    assert set(first) == {"id", "name", "amount"}
    # a finished job run again is a no-op
    assert (await jobs[1].work()).rows == 0
    assert await tenure_async_client.xlen(sink) == len(ids)
    for client in clients:
        await client.aclose()


async def test_a_hung_worker_loses_its_chunk_and_its_late_commit_is_refused(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    stalled: list[int] = []

    def slow(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            if key == 50 and not stalled:
                stalled.append(key)
                time.sleep(1.0)  # hung past its 0.3 s lease (a blocking source)
            yield key, {"n": key}

    def fast(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            yield key, {"n": key}

    def numbers(fetch: Any) -> AsyncIngestJob:  # one chunk of 100 keys, 0.3 s leases
        source = CallableSource(fetch, low=1, high=100, name="numbers")
        return AsyncIngestJob(
            tenure_async_client, "hang", source, chunk_size=100, batch=10, lease=0.3
        )

    hung = numbers(slow)
    running = spawn(hung.work)

    async def stalling() -> bool:
        return bool(stalled)

    async def committed_to_40() -> bool:  # the stall began after 31..40 was committed
        holders = (await hung.status()).holders
        return bool(holders) and (holders[0].cursor or 0) >= 40

    async def lease_ran_out() -> bool:
        return (await hung.status()).holders == ()

    await until(stalling, 5, "the source stalling")
    await until(committed_to_40, 5, "the batch of 31..40 being committed")
    holding = await hung.status()
    assert holding.claimed == 1 and len(holding.holders) == 1
    holder = holding.holders[0]
    assert (holder.chunk, holder.worker, holder.cursor) == (0, hung.worker, 40)
    assert 0 < holder.lease_left <= 0.3
    assert hung.worker == f"{socket.gethostname()}:{os.getpid()}"
    await until(lease_ran_out, 5, "the hung worker's 0.3 s lease running out")
    successor = numbers(fast)
    taken = await successor.work()
    late = await join(running)
    assert taken.chunks == 1 and late.refused == 1 and late.chunks == 0
    keys = await stream_keys(tenure_async_client, hung.keys.default_sink())
    assert sorted(keys) == list(range(1, 101))


async def test_a_plan_under_the_same_name_must_match(
    tenure_async_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    make_table(tmp_path / "db.sqlite", 100)
    source = SqlSource(f"sqlite:///{tmp_path / 'db.sqlite'}", "events", "id")
    first = AsyncIngestJob(tenure_async_client, "job", source, chunk_size=10)
    plan = await first.plan()
    assert plan.chunks == (plan.high - plan.low) // 10 + 1
    before = await tenure_async_client.dbsize()
    with pytest.raises(PlanMismatchError, match="planned with chunks of 10, not 20: use another"):
        await AsyncIngestJob(tenure_async_client, "job", source, chunk_size=20).work()
    other = CallableSource(lambda a, b: iter(()), low=1, high=5, name="else")
    with pytest.raises(PlanMismatchError, match=r"planned with source \{.*\}, not \{.*\}[:;] "):
        await AsyncIngestJob(tenure_async_client, "job", other, chunk_size=10).plan()
    # another sink would split the job's rows over two places
    with pytest.raises(
        PlanMismatchError, match=r"sink stream:tenure:ingest:\{job\}:rows, not list:elsewhere"
    ):
        await AsyncIngestJob(
            tenure_async_client, "job", source, chunk_size=10, sink="list:elsewhere"
        ).work()
    assert await tenure_async_client.dbsize() == before  # nothing half-written
    assert await AsyncIngestJob(tenure_async_client, "job", source, chunk_size=10).plan() == plan


async def test_a_list_sink_and_a_source_that_breaks_its_contract(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    rows = CallableSource(
        lambda a, b: ((k, {"k": k}) for k in range(a, b + 1)), low=0, high=49, name="n"
    )
    job = AsyncIngestJob(
        tenure_async_client, "to-list", rows, chunk_size=7, sink="list:{to-list}:out"
    )
    assert (await job.work()).rows == 50
    stored = [json.loads(v)["k"] for v in await tenure_async_client.lrange("{to-list}:out", 0, -1)]
    assert sorted(stored) == list(range(50))
    backwards = CallableSource(lambda a, b: iter([(b, {}), (a, {})]), low=0, high=9, name="b")
    with pytest.raises(ArgumentError, match="out of order"):
        await AsyncIngestJob(tenure_async_client, "backwards", backwards).work()
    with pytest.raises(ArgumentError, match="sink"):
        AsyncIngestJob(tenure_async_client, "x", rows, sink="queue:x")
    bad: list[dict[str, Any]] = [{"chunk_size": 0}, {"batch": True}, {"lease": 0.01}]
    for options in bad:
        with pytest.raises(ArgumentError, match=next(iter(options))):
            AsyncIngestJob(tenure_async_client, "x", rows, **options)


async def test_an_async_source_is_awaited(tenure_async_client: redis.asyncio.Redis) -> None:
    async def fetch(first: int, last: int) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1, 2):  # odd keys only: gaps in every chunk
            await tenure_async_client.ping()  # a source that awaits I/O between its rows
            yield key, {"odd": key}

    source = AsyncCallableSource(fetch, low=1, high=999, name="odd")
    jobs = [AsyncIngestJob(tenure_async_client, "odd", source, chunk_size=100, batch=7)
            for _ in range(2)]  # fmt: skip
    reports = await gather(*(job.work for job in jobs))
    assert sum(r.rows for r in reports) == 500
    keys = await stream_keys(tenure_async_client, jobs[0].keys.default_sink())
    assert sorted(keys) == list(range(1, 1000, 2))

    async def unordered(first: int, last: int) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        yield last, {}
        yield first, {}

    with pytest.raises(ArgumentError, match="out of order"):
        await AsyncIngestJob(
            tenure_async_client,
            "unordered",
            AsyncCallableSource(unordered, low=0, high=9, name="u"),
        ).work()


async def test_a_commit_resent_after_a_dropped_connection_is_not_applied_twice(
    tenure_async_client: redis.asyncio.Redis, tenure_proxy: FaultProxy, tenure_server: ServerProcess
) -> None:
    # redis-py resends a command when the connection drops before its reply
    # (Retry on ConnectionError); a commit that had run must not run again.
    client = tenure_proxy.async_client(retry=Retry(ConstantBackoff(0.05), 5))
    direct = tenure_server.client()  # the server itself, past the proxy (read from a thread)
    drops: list[str] = []

    def drop_the_next_reply(commit: str, chunk: int, cursor: int | None) -> None:
        tenure_proxy.set_latency(0.5, "downstream")  # the commit's reply will be late...

        def ran() -> bool:  # the server has run the commit: the chunk's cursor, or done
            if cursor is not None:
                last: Any = direct.hget(job.keys.cursors, str(chunk))
                return int(last or 0) >= cursor
            lease: Any = direct.hget(job.keys.leases, str(chunk))
            return lease is not None and lease.startswith(b"done:")

        def drop() -> None:
            until_in_a_thread(ran, 5, f"the commit of {commit} running on the server")
            tenure_proxy.reset_connections()  # ...and its connection drops before it comes
            tenure_proxy.clear()
            drops.append(commit)

        threading.Thread(target=drop).start()

    def rows(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            if key == 10:
                drop_the_next_reply("a full batch, 1..10", chunk=0, cursor=10)
            if key == 15:
                drop_the_next_reply("a chunk's short last batch, 11..15", chunk=0, cursor=15)
            yield key, {"n": key}
        if last == 40:  # read after the full batch 31..40: the chunk's empty final commit
            drop_the_next_reply("a chunk's end with no rows", chunk=2, cursor=None)

    source = CallableSource(rows, low=1, high=40, name="resent")
    job = AsyncIngestJob(client, "resent", source, chunk_size=15, batch=10)
    report = await job.work()
    assert len(drops) == 3, drops
    assert report.rows == 40 and report.chunks == 3 and report.refused == 0
    keys = await stream_keys(tenure_async_client, job.keys.default_sink())
    assert keys == list(range(1, 41))  # once each
    await client.aclose()
    direct.close()


def counting(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
    for key in range(first, last + 1):
        yield key, {"n": key}


async def test_an_interrupted_worker_gives_its_claim_back(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    def breaking(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            if key == 35:
                raise RuntimeError("the source broke")
            yield key, {"n": key}

    def numbers(fetch: Any) -> AsyncIngestJob:  # one chunk of 100 keys, a 30 s lease
        source = CallableSource(fetch, low=1, high=100, name="numbers")
        return AsyncIngestJob(tenure_async_client, "given-back", source, chunk_size=100, batch=10)

    broken = numbers(breaking)
    with pytest.raises(RuntimeError, match="the source broke"):
        await broken.work()
    status = await broken.status()
    assert status.claimed == 0 and status.free == 1 and status.holders == ()
    assert status.rows == 30  # 1..30 committed; 31..34 never made a batch
    started = time.monotonic()
    successor = await numbers(counting).work(wait=False)  # no lease to wait for
    assert time.monotonic() - started < 5
    assert successor.chunks == 1 and successor.rows == 70
    keys = await stream_keys(tenure_async_client, broken.keys.default_sink())
    assert keys == list(range(1, 101))


async def test_reset_removes_the_job_and_keeps_the_sink_unless_asked(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    source = CallableSource(counting, low=1, high=50, name="numbers")
    job = AsyncIngestJob(tenure_async_client, "again", source, chunk_size=20)
    sink = job.keys.default_sink()
    assert (await job.work()).rows == 50
    report = await job.reset()
    assert (
        report.keys == 5 and report.sink is None
    )  # plan, leases, cursors, stats, fence and report.sink_entries == 0
    assert report.released == 0
    assert await tenure_async_client.xlen(sink) == 50  # the rows stay
    assert (await job.status()).chunks == 0
    # planned anew, with another chunk size: no PlanMismatchError
    smaller = AsyncIngestJob(tenure_async_client, "again", source, chunk_size=5)
    assert (await smaller.work()).chunks == 10
    assert await tenure_async_client.xlen(sink) == 100
    report = await smaller.reset(sink=True)
    assert report.sink == sink and report.sink_entries == 100
    fields = [field for field in job.keys.__dataclass_fields__ if field != "reset"]
    assert await tenure_async_client.exists(sink, *(getattr(job.keys, f) for f in fields)) == 0
    assert await tenure_async_client.pttl(job.keys.reset) > 0  # recognises a resent reset
    assert (await job.reset()).keys == 0  # nothing left: a no-op
    await tenure_async_client.set("{again}:string", "x")
    odd = AsyncIngestJob(tenure_async_client, "again", source, sink="stream:{again}:string")
    with pytest.raises(ArgumentError, match="holds a string, not a stream or list"):
        await odd.reset(sink=True)


async def test_reset_is_refused_while_a_claim_runs_unless_forced(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    release = threading.Event()
    reading: list[int] = []

    def blocking(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            if key == 5:
                reading.append(key)
                release.wait(10)  # a worker at work (a blocking source)
            yield key, {"n": key}

    source = CallableSource(blocking, low=1, high=20, name="numbers")
    job = AsyncIngestJob(tenure_async_client, "busy", source, chunk_size=10, batch=2)
    running = spawn(job.work)

    async def blocked() -> bool:
        return bool(reading)

    await until(blocked, 5, "the source blocking")
    other = AsyncIngestJob(tenure_async_client, "busy", source, chunk_size=10)
    with pytest.raises(JobBusyError, match="1 running claim") as refused:
        await other.reset()
    assert refused.value.claimed == 1
    assert (await other.status()).chunks == 2  # nothing deleted
    report = await other.reset(force=True)
    assert report.released == 1 and (await other.status()).chunks == 0
    release.set()
    with pytest.raises(PlanMismatchError, match="was reset"):
        await join(running)  # its commit refused, its next claim told
    assert await tenure_async_client.xlen(job.keys.default_sink()) == 4  # 1..4 only


def strict_json(text: str | bytes) -> Any:
    """``text`` read as strict JSON (RFC 8259): NaN, Infinity and -Infinity refused."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON (RFC 8259): {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
async def test_a_row_holding_nan_or_an_infinity_is_refused_naming_its_key_and_column(
    tenure_async_client: redis.asyncio.Redis, value: float
) -> None:
    def prices(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for key in range(first, last + 1):
            yield key, {"id": key, "price": value if key == 37 else key / 4, "note": "é"}

    source = CallableSource(prices, low=1, high=100, name="prices")
    job = AsyncIngestJob(tenure_async_client, "prices", source, chunk_size=100, batch=10)
    with pytest.raises(SourceRowError) as refused:
        await job.work()
    assert (refused.value.key, refused.value.column) == (37, "price")
    assert str(refused.value) == (
        f"row 37, column 'price' holds {value!r}: JSON (RFC 8259) has no NaN or infinity; "
        "store NULL or a finite number (refused before it was written) (name 'prices')"
    )
    status = await job.status()
    assert status.claimed == 0 and status.free == 1 and status.rows == 30  # given back
    entries: Any = await tenure_async_client.xrange(job.keys.default_sink())
    assert [strict_json(fields[b"row"])["id"] for _, fields in entries] == list(range(1, 31))
    assert entries[0][1][b"row"] == '{"id":1,"price":0.25,"note":"é"}'.encode()  # as ever


async def test_the_lease_is_checked_as_a_lock_checks_its_durations(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    source = CallableSource(counting, low=1, high=20, name="numbers")
    refused: list[Any] = [sys.maxsize, 1e16, math.inf, math.nan, "5", True, None]
    for value in refused:
        with pytest.raises(ArgumentError) as lock_said:
            AsyncLock(tenure_async_client, "durations", waiter_lease=value)
        with pytest.raises(ArgumentError) as job_said:
            AsyncIngestJob(tenure_async_client, "durations", source, lease=value)
        assert job_said.value.argument == "lease" and job_said.value.name == "durations"
        assert job_said.value.message == "lease" + str(lock_said.value.message).removeprefix(
            "waiter_lease"
        )
    for value in (-1, 0):  # below its own least, not waiter_lease's: said with the value
        with pytest.raises(
            ArgumentError, match=rf"^lease: must be at least 0\.1 seconds, got {value} "
        ):
            AsyncIngestJob(tenure_async_client, "durations", source, lease=value)
    with pytest.raises(ArgumentError, match=r"^lease: must be at least 0\.1 seconds, got 0\.05"):
        AsyncIngestJob(tenure_async_client, "durations", source, lease=0.05)
    ten_years = 10 * 365 * 86400
    with pytest.raises(ArgumentError, match=r"at most 315360000 seconds \(ten years\)"):
        AsyncIngestJob(tenure_async_client, "durations", source, lease=ten_years + 1)
    assert await tenure_async_client.dbsize() == 0  # refused before anything was written
    longest = AsyncIngestJob(tenure_async_client, "durations", source, lease=ten_years)
    assert (await longest.work()).rows == 20  # the server takes the longest lease


async def test_a_callable_sources_range_is_part_of_its_plan(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """The same job and source name with another declared range is another plan, refused
    (it used to find the first plan done and ingest nothing)."""

    def rows(low: int, high: int) -> Any:
        return CallableSource(
            lambda a, b: ((k, {"k": k}) for k in range(a, b + 1)), low=low, high=high, name="src"
        )

    assert (await AsyncIngestJob(tenure_async_client, "ranged", rows(1, 4)).work()).rows == 4
    with pytest.raises(PlanMismatchError, match=r"keys 1\.\.4, not 100\.\.200"):
        await AsyncIngestJob(tenure_async_client, "ranged", rows(100, 200)).work()
