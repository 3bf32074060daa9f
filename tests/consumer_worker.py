"""One consumer process, for tests/test_consumer_processes.py (killed with kill -9 there).

    python -m tests.consumer_worker REDIS_URL NAME

Handles messages of stream ``work`` in group ``g``: each handling adds the
message's ``n`` to the set ``handled`` and takes 5 ms.
"""

from __future__ import annotations

import sys
import time

import redis

from tenure import StreamConsumer, StreamMessage


def main(url: str, name: str) -> None:
    """Consume until killed (or until nothing came for 3 s)."""
    client = redis.Redis.from_url(url)
    consumer = StreamConsumer(client, "work", "g", name, count=10, block=0.2, claim_idle=0.5)
    idle_since = time.monotonic()

    def handle(message: StreamMessage) -> None:
        nonlocal idle_since
        client.sadd("handled", message.fields["n"])
        time.sleep(0.005)
        idle_since = time.monotonic()

    while time.monotonic() - idle_since < 3:
        for message in consumer.read():
            handle(message)
            consumer.ack(message)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
