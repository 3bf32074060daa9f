"""Every metric receives what a scenario implies (docs/observability.md), in both twins.

The SDK's in-memory reader reads what tenure recorded (tests/metric_readings.py).
Locks: an acquisition and its hold, an acquire that timed out, renewals, and a
hold lost to a deleted key with the renewal that found it gone. Caches: each
request once, as a hit, a miss, a stale hit, a wait or a fallback, the loads'
durations and a failed load.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from opentelemetry import trace
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenure import (
    ArgumentError,
    AsyncCache,
    AsyncCallableSource,
    AsyncConnectionLock,
    AsyncHerdCache,
    AsyncIdSet,
    AsyncIngestJob,
    AsyncLock,
    AsyncRedlock,
    AsyncReentrantLock,
    AsyncSemaphore,
    AsyncStreamConsumer,
    LockLostError,
    ServerUnavailableError,
    StreamMessage,
    set_metric_names,
)
from tenure._core.telemetry import (
    CACHE_LOAD,
    CACHE_LOAD_ERRORS,
    CACHE_REQUESTS,
    IDSET_COMPACTIONS,
    IDSET_QUERY,
    INGEST_CHUNKS,
    INGEST_ROWS,
    LOCK_HOLD,
    LOCK_LOST,
    LOCK_RENEWALS,
    LOCK_WAIT,
    STREAM_MESSAGES,
)
from tenure.server import ServerProcess
from tests._backend_asyncio import gather, sleep, until
from tests.metric_readings import Readings, reader, span_exporter, tenure_spans

pytestmark = pytest.mark.topologies("standalone")


@pytest.fixture(autouse=True)
def _listening() -> None:
    reader()  # the providers set, and tenure listening
    span_exporter()


async def test_an_acquisition_and_its_hold_are_measured(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    seen = Readings()
    async with AsyncLock(tenure_async_client, "otel-held", timeout=10):
        pass
    async with AsyncSemaphore(tenure_async_client, "otel-permits", 2):
        pass
    lock = AsyncReentrantLock(tenure_async_client, "otel-again")
    async with lock, lock:  # re-entered: one acquisition, one hold
        pass
    assert seen.count(LOCK_WAIT, primitive="lock", outcome="acquired") == 1
    assert seen.count(LOCK_HOLD, primitive="lock") == 1
    assert seen.count(LOCK_WAIT, primitive="semaphore", outcome="acquired") == 1
    assert seen.count(LOCK_HOLD, primitive="semaphore") == 1
    assert seen.count(LOCK_WAIT, primitive="reentrant_lock") == 1
    assert seen.count(LOCK_HOLD, primitive="reentrant_lock") == 1
    assert seen.count(LOCK_WAIT, outcome="timeout") == 0


async def test_an_acquire_that_times_out_is_measured_with_its_wait(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    holder = AsyncLock(tenure_async_client, "otel-busy", timeout=10)
    waiter = AsyncLock(tenure_async_client, "otel-busy", timeout=10)
    async with holder:
        seen = Readings()
        assert not await waiter.acquire(blocking_timeout=0.2)
        assert seen.count(LOCK_WAIT, primitive="lock", outcome="timeout") == 1
        assert 0.15 <= seen.total(LOCK_WAIT, outcome="timeout") < 5
        assert seen.count(LOCK_WAIT, outcome="acquired") == 0


async def test_an_acquire_that_fails_is_measured_with_the_error_s_class() -> None:
    seen = Readings()
    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    client = redis.asyncio.Redis(port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(ServerUnavailableError):
            await AsyncLock(client, "otel-down", timeout=10).acquire()
    finally:
        await client.aclose()
    errors = [dict(key[1]) for key in seen.points() if key[0] == LOCK_WAIT.name]
    assert {"tenure.primitive": "lock", "tenure.outcome": "error",
            "error.type": "tenure.ServerUnavailableError"} in errors  # fmt: skip


async def test_renewals_and_a_lost_hold_are_measured(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    seen = Readings()
    lock = AsyncLock(tenure_async_client, "otel-lost", timeout=0.3, auto_renew=True)

    async def renewed() -> bool:  # every 0.1 s
        return seen.count(LOCK_RENEWALS, primitive="lock", outcome="ok") >= 2

    async def found_gone() -> bool:
        return lock.lost

    with pytest.raises(LockLostError):
        async with lock:
            await until(renewed, 5, "two renewals")
            await tenure_async_client.delete(lock.keys.owner)  # someone breaks it
            await until(found_gone, 5, "the renewal finding the hold gone")
    assert seen.count(LOCK_LOST, primitive="lock") == 1
    assert seen.count(LOCK_RENEWALS, primitive="lock", outcome="failed") == 1
    assert seen.count(LOCK_HOLD, primitive="lock") == 0  # lost, not released


async def test_each_cache_request_is_told_once_with_what_it_found(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    seen = Readings()
    plain = AsyncCache(tenure_async_client, "otel-plain", ttl=30)
    assert await plain.get("k") is None  # miss
    await plain.set("k", 1)
    assert await plain.get("k") == 1  # hit
    herd = AsyncHerdCache(tenure_async_client, "otel-herd", ttl=0.3, herd_timeout=30)

    async def load() -> int:
        await sleep(0.2)
        return 7

    assert await herd.fetch("k", load) == 7  # miss: loaded
    assert await herd.fetch("k", load) == 7  # hit
    await sleep(0.4)
    assert await herd.fetch("k", load) == 7  # stale: served, refreshed in the background
    assert seen.count(CACHE_REQUESTS, result="miss") == 2
    assert seen.count(CACHE_REQUESTS, result="hit") == 2
    assert seen.count(CACHE_REQUESTS, result="stale") == 1
    assert seen.count(CACHE_REQUESTS, result="wait") == 0
    assert seen.count(CACHE_LOAD) >= 1
    assert seen.total(CACHE_LOAD) >= 0.15


async def test_a_waiter_is_told_as_a_wait_and_a_failed_load_as_an_error(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    seen = Readings()
    first = AsyncHerdCache(tenure_async_client, "otel-wait", ttl=30)
    second = AsyncHerdCache(other_client, "otel-wait", ttl=30)  # as another process's

    async def slow() -> int:
        await sleep(0.4)
        return 1

    async def loads() -> int:
        return int(await first.fetch("k", slow))

    async def waits() -> int:
        await sleep(0.1)  # the first caller holds the load lease by then
        return int(await second.fetch("k", slow))

    assert await gather(loads, waits) == [1, 1]
    assert seen.count(CACHE_REQUESTS, result="miss") == 1
    assert seen.count(CACHE_REQUESTS, result="wait") == 1
    assert seen.count(CACHE_REQUESTS, result="hit") == 0  # (the waiter's, told as its wait)

    async def broken() -> int:
        raise RuntimeError("the database is down")

    with pytest.raises(RuntimeError):
        await first.fetch("other", broken)
    assert seen.count(CACHE_LOAD_ERRORS) == 1


async def test_a_fetch_around_an_outage_is_told_as_a_fallback() -> None:
    seen = Readings()
    dead = redis.asyncio.Redis(port=1, socket_connect_timeout=0.2)  # nothing listens there
    cache = AsyncHerdCache(dead, "otel-outage", ttl=30)

    async def load() -> int:
        return 3

    assert await cache.fetch("k", load) == 3
    assert seen.count(CACHE_REQUESTS, result="fallback") == 1
    await dead.aclose()


async def test_an_ingestion_counts_its_rows_chunks_and_a_chunk_taken_over(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    async def numbers(first: int, last: int) -> AsyncIterator[tuple[int, dict[str, int]]]:
        for key in range(first, last + 1):
            yield key, {"n": key}

    source = AsyncCallableSource(numbers, low=1, high=100, name="numbers")
    job = AsyncIngestJob(tenure_async_client, "otel-ingest", source, chunk_size=50, batch=20)
    keys, plan = job.keys, await job.plan()
    claim_keys = (keys.free, keys.leases, keys.cursors, keys.stats, keys.fence, keys.plan)
    # a worker that claims a chunk and dies: its 50 ms lease runs out unreleased
    await job._registry.run("ingest_claim", claim_keys, ("dead@x", 50, plan.fingerprint))
    await sleep(0.1)
    seen = Readings()
    report = await job.work()
    assert report.rows == 100
    assert seen.count(INGEST_ROWS) == 100
    assert seen.count(INGEST_CHUNKS, outcome="done") == 2
    assert seen.count(INGEST_CHUNKS, outcome="taken_over") == 1


async def test_a_consumer_counts_acked_failed_and_dead_lettered_messages(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    for n in range(5):
        await tenure_async_client.xadd("{otel}jobs", {"n": str(n)})
    consumer = AsyncStreamConsumer(tenure_async_client, "{otel}jobs", "g", "c0", block=0.1)
    seen = Readings()

    async def handle(message: StreamMessage) -> None:
        if message.fields[b"n"] == b"4":
            consumer.stop()
        if message.fields[b"n"] == b"2":
            raise ValueError("a poison message")

    assert await consumer.run(handle) == 4
    assert seen.count(STREAM_MESSAGES, outcome="acked") == 4
    assert seen.count(STREAM_MESSAGES, outcome="failed") == 1
    # the failed message, delivered once, is moved to the dead letters when claimed
    claimer = AsyncStreamConsumer(
        tenure_async_client, "{otel}jobs", "g", "c1", block=0.1, claim_idle=0.1,
        max_deliveries=1,
    )  # fmt: skip
    await sleep(0.2)
    assert await claimer.read() == []
    assert seen.count(STREAM_MESSAGES, outcome="dead_lettered") == 1


async def test_id_set_queries_and_compactions_are_measured(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    first = AsyncIdSet(tenure_async_client, "otel-a")
    second = AsyncIdSet(tenure_async_client, "otel-b")
    await first.add_many(range(0, 1000, 2))
    await second.add_many(range(0, 1000, 3))
    seen = Readings()
    assert await first.intersection_count(second) == 167
    assert 0.0 < await first.jaccard(second) < 1.0
    assert seen.count(IDSET_QUERY, operation="intersection_count") == 1
    assert seen.count(IDSET_QUERY, operation="jaccard") == 1
    assert await first.compact()
    assert seen.count(IDSET_COMPACTIONS) == 1


async def test_an_acquire_that_waits_is_traced_and_one_taken_at_once_is_not(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    since = len(span_exporter().get_finished_spans())
    # (thread_local=False: the sync twin releases it from another thread)
    holder = AsyncLock(tenure_async_client, "otel-traced", timeout=10, thread_local=False)
    waiter = AsyncLock(other_client, "otel-traced", timeout=10, thread_local=False)
    fence = await _wait_behind(holder, waiter)
    quick = AsyncLock(other_client, "otel-traced", timeout=10)
    assert await quick.acquire(blocking=False)  # free, taken at once: no span
    await quick.release()
    _one_acquire_span(since, "lock", fence)


async def _wait_behind(holder: Any, waiter: Any) -> int:
    """``waiter`` waits (traced) for ``holder``'s hold, released after 0.3 s; its fence."""
    assert await holder.acquire()  # at once: no span

    async def release_soon() -> None:
        await sleep(0.3)
        await holder.release()

    async def wait_for_it() -> bool:
        return bool(await waiter.acquire(blocking_timeout=10))

    assert (await gather(release_soon, wait_for_it))[1]
    fence = int(waiter.fencing_token)
    await waiter.release()
    return fence


def _one_acquire_span(since: int, primitive: str, fence: int) -> None:
    """Of the spans since ``since``, one waiting acquire's: its events, attributes, length."""
    spans = [s for s in tenure_spans(since) if s.name == "tenure.lock.acquire"]
    assert len(spans) == 1
    traced = spans[0]
    assert [event.name for event in traced.events] == ["queued", "granted"]
    assert dict(traced.attributes or {}) == {
        "tenure.primitive": primitive,
        "tenure.fencing_token": fence,
        "tenure.outcome": "acquired",
    }
    assert traced.end_time is not None and traced.start_time is not None
    assert (traced.end_time - traced.start_time) / 1e9 >= 0.25


async def test_a_cache_load_is_traced_with_the_loaders_spans_inside_and_a_hit_is_not(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    since = len(span_exporter().get_finished_spans())
    cache = AsyncHerdCache(tenure_async_client, "otel-traced-cache", ttl=30)
    tracer = trace.get_tracer("the-application")

    async def load() -> int:
        with tracer.start_as_current_span("SELECT rate"):
            return 5

    assert await cache.fetch("k", load) == 5
    assert await cache.fetch("k", load) == 5  # a hit: no span
    loads = [s for s in tenure_spans(since) if s.name == "tenure.cache.load"]
    assert len(loads) == 1
    queries = [s for s in span_exporter().get_finished_spans()[since:] if s.name == "SELECT rate"]
    assert len(queries) == 1 and queries[0].parent is not None
    assert queries[0].parent.span_id == loads[0].context.span_id


async def test_a_connection_lock_is_measured_as_the_others(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    seen = Readings()
    first = AsyncConnectionLock(tenure_async_client, "otel-booked")
    second = AsyncConnectionLock(tenure_async_client, "otel-booked", poll_interval=0.05)
    async with first:
        assert not await second.acquire(blocking_timeout=0.2)
    assert seen.count(LOCK_WAIT, primitive="connection_lock", outcome="acquired") == 1
    assert seen.count(LOCK_WAIT, primitive="connection_lock", outcome="timeout") == 1
    assert seen.count(LOCK_HOLD, primitive="connection_lock") == 1


async def test_metric_name_adds_the_name_and_only_where_asked(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    seen = Readings()
    async with AsyncLock(tenure_async_client, "otel-named-1", metric_name="checkout"):
        pass
    async with AsyncLock(tenure_async_client, "otel-unnamed"):
        pass
    cache = AsyncHerdCache(tenure_async_client, "otel-named-cache", ttl=30, metric_name="rates")
    assert await cache.fetch("k", lambda: 1) == 1
    assert seen.count(LOCK_WAIT, primitive="lock", name="checkout") == 1
    assert seen.count(LOCK_HOLD, primitive="lock", name="checkout") == 1
    assert seen.count(LOCK_WAIT, primitive="lock") == 2
    assert seen.count(CACHE_REQUESTS, result="miss", name="rates") == 1
    assert seen.count(CACHE_LOAD, name="rates") == 1
    # no name at all where none was asked for (not even the lock's own)
    assert not any("otel-unnamed" in str(point) for point in seen.points())
    for bad in ("", " ", 7, b"name", "x" * 201, "tab\there"):
        with pytest.raises(ArgumentError, match="metric_name"):
            AsyncLock(tenure_async_client, "otel-named-2", metric_name=bad)  # type: ignore[arg-type]


async def test_set_metric_names_names_the_primitives_made_after_it_that_match(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    seen = Readings()
    set_metric_names("orders:*", "nightly")
    try:
        matched = AsyncLock(tenure_async_client, "orders:42")
        exact = AsyncSemaphore(tenure_async_client, "nightly", 2)
        other = AsyncLock(tenure_async_client, "billing:1")
        own = AsyncLock(tenure_async_client, "orders:43", metric_name="the-43")
    finally:
        set_metric_names()
    later = AsyncLock(tenure_async_client, "orders:44")  # made after: not named
    for primitive in (matched, exact, other, own, later):
        async with primitive:
            pass
    assert seen.count(LOCK_WAIT, name="orders:42") == 1
    assert seen.count(LOCK_WAIT, primitive="semaphore", name="nightly") == 1
    assert seen.count(LOCK_WAIT, name="the-43") == 1
    assert seen.count(LOCK_WAIT, name="billing:1") == 0
    assert seen.count(LOCK_WAIT, name="orders:44") == 0
    assert seen.count(LOCK_WAIT, primitive="lock") == 4


async def test_names_matched_by_a_pattern_are_escaped_and_cut_to_fit(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    seen = Readings()
    set_metric_names("*")
    try:
        odd = AsyncLock(tenure_async_client, "line\nbreak")
        long = AsyncLock(tenure_async_client, "x" * 1000)
    finally:
        set_metric_names()
    for primitive in (odd, long):
        async with primitive:
            pass
    assert seen.count(LOCK_WAIT, name="line\\nbreak") == 1
    assert seen.count(LOCK_WAIT, name="x" * 197 + "...") == 1
    for bad in ("", "a\nb", 3):
        with pytest.raises(ArgumentError, match="set_metric_names"):
            set_metric_names(bad)  # type: ignore[arg-type]


async def test_a_redlock_that_waits_is_traced(
    redlock_servers: tuple[ServerProcess, ...],
) -> None:
    since = len(span_exporter().get_finished_spans())
    mine = [server.async_client() for server in redlock_servers]
    theirs = [server.async_client() for server in redlock_servers]
    try:
        holder = AsyncRedlock(mine, "otel-redlock", timeout=10, thread_local=False)
        waiter = AsyncRedlock(theirs, "otel-redlock", timeout=10, thread_local=False)
        fence = await _wait_behind(holder, waiter)
        assert await holder.acquire()  # free: taken at once, no span
        await holder.release()
    finally:
        for client in (*mine, *theirs):
            await client.aclose()
    _one_acquire_span(since, "redlock", fence)
