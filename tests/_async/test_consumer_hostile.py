"""Stream consumers under hostile use: the right answer or one clear error, at once.

What each case gets is documented in docs/ingest.md (consumers). New findings land here.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio

from tenure import AsyncStreamConsumer, StreamMessage


async def test_stop_mid_batch_hands_the_rest_to_another_consumer_at_once(
    tenure_async_client: redis.asyncio.Redis, other_client: redis.asyncio.Redis
) -> None:
    for n in range(10):
        await tenure_async_client.xadd("{hand}", {"n": str(n)})
    first = AsyncStreamConsumer(tenure_async_client, "{hand}", "g", "first", count=10, block=0.1)
    handled: list[bytes] = []

    def handle(message: StreamMessage) -> None:
        handled.append(message.fields[b"n"])
        if len(handled) == 3:
            first.stop()

    assert await first.run(handle) == 3
    # The default claim_idle is 30 s: the other 7 come to the next consumer now.
    other = AsyncStreamConsumer(other_client, "{hand}", "g", "other", count=10, block=0.1)
    started = time.monotonic()
    rest = await other.read()
    assert time.monotonic() - started < 1.0
    assert [m.fields[b"n"] for m in rest] == [str(n).encode() for n in range(3, 10)]
    assert [m.deliveries for m in rest] == [1] * 7  # a hand-back is not a delivery
    assert first.statistics().handed_back == 7
    assert first.statistics().processed == 3
    assert await other.ack(*rest) == 7
    pending: Any = await tenure_async_client.xpending("{hand}", "g")
    assert pending["pending"] == 0


async def test_consumers_stopping_in_turn_send_no_message_to_the_dead_letters(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    """A rolling restart: consumers each stop after one message. The messages
    they handed back were never handled nor failed: none is dead-lettered."""
    for n in range(5):
        await tenure_async_client.xadd("{rolling}", {"n": str(n)})
    handled: list[tuple[bytes, int]] = []
    for generation in range(4):
        consumer = AsyncStreamConsumer(
            tenure_async_client, "{rolling}", "g", f"c{generation}", count=10, block=0.1,
            max_deliveries=2,
        )  # fmt: skip

        def handle(message: StreamMessage, consumer: AsyncStreamConsumer = consumer) -> None:
            handled.append((message.fields[b"n"], message.deliveries))
            consumer.stop()

        assert await consumer.run(handle) == 1
    assert handled == [(str(n).encode(), 1) for n in range(4)]
    assert await tenure_async_client.xlen("{rolling}:dead") == 0
