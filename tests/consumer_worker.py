"""One consumer process, for tests/test_consumer_processes.py.

    python -m tests.consumer_worker REDIS_URL NAME [read|batches|run|arun]

``read`` (default): its own loop over ``read()`` and ``ack()`` on stream
``work`` in group ``g``; each handling adds the message's ``n`` to the set
``handled`` (and the list ``handlings``) and takes 5 ms; it ends when nothing
came for 3 s, or is killed with kill -9 by the test. ``batches``: the same
through ``StreamConsumer.run`` (a batch acknowledged at a time).
``run`` / ``arun``: ``StreamConsumer.run`` / ``AsyncStreamConsumer.run``
with SIGTERM and SIGINT as stop signals; each handling pushes ``n`` to the
list ``started``, takes 0.15 s, then pushes it to ``finished``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import redis
import redis.asyncio

from tenure import AsyncStreamConsumer, StreamConsumer, StreamMessage

STOP = (signal.SIGTERM, signal.SIGINT)


class Work:
    """The kill test's consumer and its work: each message's ``n`` to ``handled``
    (a set) and ``handlings`` (a list), 5 ms each; idle once nothing came for 3 s."""

    def __init__(self, url: str, name: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.consumer = StreamConsumer(
            self.client, "work", "g", name, count=10, block=0.2, claim_idle=0.5
        )
        self.idle_since = time.monotonic()

    def handle(self, message: StreamMessage) -> None:
        self.client.sadd("handled", message.fields[b"n"])
        self.client.rpush("handlings", message.fields[b"n"])
        time.sleep(0.005)  # a message's work: the kill comes in the middle of it
        self.idle_since = time.monotonic()

    def idle(self) -> bool:
        return time.monotonic() - self.idle_since >= 3


def read_loop(url: str, name: str) -> None:
    """Consume with ``read()`` and ``ack()`` until killed (or idle)."""
    work = Work(url, name)
    while not work.idle():
        for message in work.consumer.read():
            work.handle(message)
            work.consumer.ack(message)


def run_batches(url: str, name: str) -> None:
    """The same work through ``StreamConsumer.run`` (a batch acknowledged at a time)."""
    work = Work(url, name)
    read = work.consumer.read

    def read_until_idle() -> list[StreamMessage]:
        if work.idle():
            work.consumer.stop()
        return read()

    work.consumer.read = read_until_idle  # type: ignore[method-assign]
    work.consumer.run(work.handle)


def run_until_signalled(url: str, name: str) -> None:
    """``StreamConsumer.run`` until SIGTERM or SIGINT."""
    client = redis.Redis.from_url(url)
    consumer = StreamConsumer(client, "work", "g", name, count=1, block=0.2)

    def handle(message: StreamMessage) -> None:
        client.rpush("started", message.fields[b"n"])
        time.sleep(0.15)  # a message's work: the stop signal comes in the middle of it
        client.rpush("finished", message.fields[b"n"])

    consumer.run(handle, stop_signals=STOP)


async def arun_until_signalled(url: str, name: str) -> None:
    """``AsyncStreamConsumer.run`` until SIGTERM or SIGINT."""
    client = redis.asyncio.Redis.from_url(url)
    consumer = AsyncStreamConsumer(client, "work", "g", name, count=1, block=0.2)

    async def handle(message: StreamMessage) -> None:
        await client.rpush("started", message.fields[b"n"])
        await asyncio.sleep(0.15)  # a message's work: the stop signal comes in the middle of it
        await client.rpush("finished", message.fields[b"n"])

    await consumer.run(handle, stop_signals=STOP)
    await client.aclose()


if __name__ == "__main__":
    url, name, mode = (*sys.argv[1:3], sys.argv[3] if len(sys.argv) > 3 else "read")
    if mode == "read":
        read_loop(url, name)
    elif mode == "batches":
        run_batches(url, name)
    elif mode == "run":
        run_until_signalled(url, name)
    else:
        asyncio.run(arun_until_signalled(url, name))
