"""AsyncFencedKey: a value that refuses writes carrying an older fencing token.

A lock's fencing token (:attr:`AsyncLock.fencing_token`) only grows. A holder
that was paused past its lease (GC, SIGSTOP, a slow network) may still try
to write after another holder took over; a store that remembers the highest
token it has seen can refuse that late write. This is Kleppmann's fencing,
for a value kept in Redis: one hash per key holding the value and the token
that wrote it, and a second key in the same slot, the fence keeper, holding the
highest token ever accepted; it never expires, so a value's time to live cannot
take its fence with it. Both are compared and written by one script.
"""

from __future__ import annotations

import secrets
from typing import Any

from tenure._async._scripting import AsyncClient, registry_for
from tenure._backends.for_asyncio import IS_ASYNC, refuse_awaited_call
from tenure._core.clients import map_exceptions, require_client
from tenure._core.exceptions import ArgumentError
from tenure._core.fence import check_fencing_token, fence_keeper
from tenure._core.values import check_seconds, to_ms

__all__ = ["AsyncFencedKey"]


class AsyncFencedKey:
    """A Redis key whose writes are accepted only with a fencing token >= the highest accepted.

    ``key`` holds the value (a hash: ``value``, ``fence``); :attr:`fence_key`
    (``{key}:tenure-fence``, or ``key:tenure-fence`` for a key with its own
    hash tag) holds the highest token ever accepted and never expires, so the
    refusal outlives any time to live a write gave its value. Deleting both
    keys starts the fence over.
    """

    def __init__(self, client: AsyncClient, key: str) -> None:
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__)
        if not isinstance(key, str) or not key:
            raise ArgumentError("key", "must be a non-empty str")
        self.client = client
        self.key = key
        self.fence_key = fence_keeper(key)
        """The key that keeps the highest fencing token accepted (never expires)."""

    async def write(
        self, value: str | bytes | int | float, fencing_token: int, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless a newer fencing token already wrote; True if stored.

        A token equal to the highest accepted writes too (the same holder
        writing again). ``ttl`` (seconds, > 0) lets the value expire; a write
        without one (None) keeps the value until the next write, as ``SET`` does.
        Either way the fence stays: after the value expired, a write with a
        token below the highest accepted is still refused.

        Resend-safe: each write carries an id of its own, and the fence keeper
        keeps the last eight (hash field ``ops``), so a write that redis-py
        resent after a dropped connection is answered True without being
        written again, even if a newer token wrote in between.
        """
        refuse_awaited_call(type(self).__name__, "write", 1)
        check_fencing_token(fencing_token, self.key)
        if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
            raise ArgumentError(
                "value",
                f"must be str, bytes, int or float, got {type(value).__name__}",
                name=self.key,
            )
        check_seconds("ttl", ttl, allow_none=True, name=self.key, positive=True)
        # A ttl under a millisecond is the shortest the server keeps (1 ms), not none.
        ttl_ms = 0 if ttl is None else max(1, to_ms(ttl))
        reply = await registry_for(self.client).run(
            "fenced_set",
            (self.key, self.fence_key),
            (fencing_token, value, ttl_ms, secrets.token_hex(8)),
            name=self.key,
        )
        return int(reply[0]) == 1

    async def read(self) -> tuple[Any, int | None]:
        """The stored value and the fencing token that wrote it.

        ``(None, None)`` if never written or its time to live ran out (the
        fence is still kept: see :attr:`fence_key`).
        """
        with map_exceptions(name=self.key, doing="reading the fenced key"):
            value, fence = await self.client.hmget(self.key, ["value", "fence"])
        return value, None if fence is None else int(fence)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r}>"
