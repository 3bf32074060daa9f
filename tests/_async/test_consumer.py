"""StreamConsumer contract tests, written once for asyncio and generated for threads."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster

from tenure import ArgumentError, AsyncStreamConsumer, StreamMessage
from tenure._backends.for_asyncio import Event
from tests._backend_asyncio import join, sleep, spawn, until

pytestmark = pytest.mark.topologies("standalone", "cluster")


async def add(client: redis.asyncio.Redis, stream: str, count: int) -> list[str]:
    ids = []
    for n in range(count):
        entry = await client.xadd(stream, {"n": str(n)})
        ids.append(entry.decode() if isinstance(entry, bytes) else str(entry))
    return ids


async def idle_past(client: Any, stream: str, group: str, seconds: float) -> bool:
    """Whether every pending message of ``group`` has been idle longer than ``seconds``."""
    entries: Any = await client.xpending_range(stream, group, min="-", max="+", count=100)
    return bool(entries) and all(e["time_since_delivered"] > seconds * 1000 for e in entries)


async def test_messages_are_read_once_and_acknowledged(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    ids = await add(tenure_async_client, "{jobs}", 10)
    consumer = AsyncStreamConsumer(tenure_async_client, "{jobs}", "workers", "w1", block=0.1)
    got = await consumer.read()
    assert [m.id for m in got] == ids and all(m.deliveries == 1 for m in got)
    assert got[3].fields == {b"n": b"3"}  # as redis-py gives them: bytes on a plain client
    assert await consumer.ack(*got) == 10
    assert await consumer.read() == []
    pending: Any = await tenure_async_client.xpending("{jobs}", "workers")
    assert pending["pending"] == 0


@pytest.mark.standalone_only
async def test_run_acknowledges_a_batch_at_a_time_and_claims_on_a_timer(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """50 messages, 10 a read: one XACK per batch (5), not one per message; one
    look for abandoned messages at the first read, none before the later reads
    (the next is due a quarter of claim_idle later)."""
    client = tenure_async_client
    await add(client, "batched", 50)
    consumer = AsyncStreamConsumer(client, "batched", "g", count=10, block=0, claim_idle=60)
    seen: list[str] = []

    def handle(message: StreamMessage) -> None:
        seen.append(message.id)
        if len(seen) == 50:
            consumer.stop()

    async def calls(command: str) -> int:
        stats: Any = await client.info("commandstats")
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    await consumer.setup()
    acks, claims = await calls("xack"), await calls("evalsha")
    assert await consumer.run(handle) == 50
    assert await calls("xack") - acks == 5
    assert await calls("evalsha") - claims == 1  # stream_claim, at the first read only
    pending: Any = await client.xpending("batched", "g")
    assert pending["pending"] == 0
    assert consumer.statistics().processed == 50


@pytest.mark.parametrize(
    "options",
    [{}, {"decode_responses": True}, {"protocol": 3}, {"protocol": 3, "decode_responses": True}],
    ids=["plain", "decoded", "resp3", "resp3-decoded"],
)
async def test_fields_are_as_redis_py_returns_them_for_the_client(
    tenure_async_client: redis.asyncio.Redis,
    client_with: Callable[..., Any],
    options: dict[str, Any],
) -> None:
    client: Any = await client_with(**options)
    await client.xadd("{jobs}", {"n": "1", "row": '{"a": 1}'})
    await client.xadd("{jobs}", {"n": "2", "row": "{}"})
    expected: Any = await client.xrange("{jobs}")  # redis-py's own reply, for this client
    as_given = [fields for _, fields in expected]
    first = AsyncStreamConsumer(client, "{jobs}", "g", "first", block=0.1)
    read = await first.read()
    assert [m.fields for m in read] == as_given
    text = "decode_responses" in options
    key = "row" if text else b"row"
    assert all(type(k) is type(key) and type(v) is type(key) for k, v in read[0].fields.items())
    assert read[0].fields[key] == ('{"a": 1}' if text else b'{"a": 1}')
    assert all(isinstance(m.id, str) for m in read)
    await until(
        lambda: idle_past(tenure_async_client, "{jobs}", "g", 0.1), 5, "the reads going idle"
    )
    second = AsyncStreamConsumer(client, "{jobs}", "g", "second", block=0.1, claim_idle=0.1)
    claimed = await second.read()  # through tenure's script, not XREADGROUP
    assert [m.fields for m in claimed] == as_given
    assert [m.deliveries for m in claimed] == [2, 2]
    assert await second.ack(*claimed) == 2


async def test_a_dead_consumers_messages_are_claimed_by_another(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    await add(tenure_async_client, "{jobs}", 5)
    dead = AsyncStreamConsumer(tenure_async_client, "{jobs}", "g", "dead", block=0.1)
    assert len(await dead.read()) == 5  # read, never acknowledged: it died
    alive = AsyncStreamConsumer(other_client, "{jobs}", "g", "alive", block=0.1, claim_idle=0.2)
    assert await alive.read() == []  # not idle long enough yet
    await until(
        lambda: idle_past(tenure_async_client, "{jobs}", "g", 0.2), 5, "the reads going idle"
    )
    taken = await alive.read()
    assert len(taken) == 5 and all(m.deliveries == 2 for m in taken)
    await alive.ack(*taken)


async def test_a_poison_message_ends_in_the_dead_letter_stream(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    await add(tenure_async_client, "{q}jobs", 1)
    consumers = [
        AsyncStreamConsumer(
            tenure_async_client, "{q}jobs", "g", f"c{n}", block=0.1, claim_idle=0.1,
            max_deliveries=2,
        )
        for n in range(3)
    ]  # fmt: skip

    async def idle() -> bool:  # past claim_idle: another consumer may claim it
        return await idle_past(tenure_async_client, "{q}jobs", "g", 0.1)

    assert [m.deliveries for m in await consumers[0].read()] == [1]
    await until(idle, 5, "the first delivery going idle")
    assert [m.deliveries for m in await consumers[1].read()] == [2]
    await until(idle, 5, "the second delivery going idle")
    assert await consumers[2].read() == []  # a third delivery: dead-lettered instead
    dead: Any = await tenure_async_client.xrange("{q}jobs:dead")
    assert len(dead) == 1 and dead[0][1][b"tenure-deliveries"] == b"3"
    assert dead[0][1][b"n"] == b"0"
    pending: Any = await tenure_async_client.xpending("{q}jobs", "g")
    assert pending["pending"] == 0
    assert consumers[2].dead_lettered == 1


async def test_run_acknowledges_each_handled_message_and_stops(
    tenure_async_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await add(tenure_async_client, "{jobs}", 20)
    consumer = AsyncStreamConsumer(tenure_async_client, "{jobs}", "g", count=3, block=0.1)
    seen: list[StreamMessage] = []

    def handle(message: StreamMessage) -> None:
        if message.fields[b"n"] == b"4":
            raise ValueError("poison")  # left unacknowledged, retried later
        seen.append(message)
        if len(seen) == 8:
            consumer.stop()

    with caplog.at_level(logging.WARNING, logger="tenure.consumer"):
        assert await consumer.run(handle) == 8
    pending: Any = await tenure_async_client.xpending("{jobs}", "g")
    assert pending["pending"] == 1  # the one that raised
    # never silently: one warning with the message, its delivery and the traceback
    [record] = [r for r in caplog.records if r.name == "tenure.consumer"]
    assert "the handler failed on message" in record.getMessage()
    assert "(delivery 1 of 5): it comes back after claim_idle (30 s)" in record.getMessage()
    assert record.exc_info is not None and "poison" in str(record.exc_info[1])
    assert consumer.failed == 1


async def test_a_long_job_stays_claimed_while_its_consumer_lives(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    await add(tenure_async_client, "{jobs}", 1)
    # claim_idle 2 s: the heartbeat touches every 2/3 s, so a worker starved of CPU for up to
    # ~1.3 s (a busy 2-core CI machine, four test workers) still keeps its message; longer is
    # a dead consumer.
    worker = AsyncStreamConsumer(tenure_async_client, "{jobs}", "g", "slow", claim_idle=2.0)
    thief = AsyncStreamConsumer(other_client, "{jobs}", "g", "thief", block=0.05, claim_idle=2.0)

    working = Event()

    async def slow(message: StreamMessage) -> None:
        working.set()
        await sleep(4.6)  # the long job under test: over two claim_idle periods
        worker.stop()

    running = spawn(lambda: worker.run(slow))
    assert await working.wait(5)  # the worker has it before the thief looks
    stolen = []
    deadline = time.monotonic() + 4.2
    while time.monotonic() < deadline:  # the window in which nothing must be stolen
        stolen += await thief.read()  # each read waits its block (50 ms) for new messages
    assert await join(running) == 1
    assert stolen == []  # the heartbeat kept it claimed


async def test_bad_arguments(tenure_async_client: redis.asyncio.Redis) -> None:
    with pytest.raises(ArgumentError, match="count"):
        AsyncStreamConsumer(tenure_async_client, "s", "g", count=0)
    with pytest.raises(ArgumentError, match="claim_idle"):
        AsyncStreamConsumer(tenure_async_client, "s", "g", claim_idle=0)


async def test_a_cluster_needs_both_streams_in_one_slot(
    tenure_async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    with pytest.raises(ArgumentError, match=r"^stream: .*hash tag"):
        AsyncStreamConsumer(tenure_async_cluster_client, "jobs", "g")
    with pytest.raises(ArgumentError, match=r"^dead_letter: .*share a slot"):
        AsyncStreamConsumer(tenure_async_cluster_client, "{jobs}", "g", dead_letter="dead")
    consumer = AsyncStreamConsumer(tenure_async_cluster_client, "{jobs}", "g", block=0.1)
    assert consumer.dead_letter == "{jobs}:dead"
