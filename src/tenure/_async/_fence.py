"""AsyncFencedKey: a value that refuses writes carrying an older fencing token.

A lock's fencing token (:attr:`AsyncLock.fencing_token`) only grows. A holder
that was paused past its lease (GC, SIGSTOP, a slow network) may still try
to write after another holder took over; a store that remembers the highest
token it has seen can refuse that late write. This is Kleppmann's fencing,
for a value kept in Redis: one hash per key holding the value and the token
that wrote it, compared and written by one script.
"""

from __future__ import annotations

import secrets
from typing import Any

from tenure._async._scripting import AsyncClient, registry_for
from tenure._backends.for_asyncio import IS_ASYNC
from tenure._core.clients import map_exceptions, require_client
from tenure._core.exceptions import ArgumentError
from tenure._core.values import check_seconds, to_ms

__all__ = ["AsyncFencedKey"]


MAX_FENCE = 2**53
"""The largest fencing token a write takes: the scripts compare tokens as doubles."""


class AsyncFencedKey:
    """A Redis key whose writes are accepted only with a fencing token >= the last one."""

    def __init__(self, client: AsyncClient, key: str) -> None:
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__)
        if not isinstance(key, str) or not key:
            raise ArgumentError("key", "must be a non-empty str")
        self.client = client
        self.key = key

    async def write(
        self, value: str | bytes | int | float, fencing_token: int, ttl: float | None = None
    ) -> bool:
        """Store ``value`` unless a newer fencing token already wrote; True if stored.

        Resend-safe: each write carries an id of its own, and the key keeps
        the last eight (hash field ``ops``), so a write that redis-py resent
        after a dropped connection is answered True without being written
        again, even if a newer token wrote in between.
        """
        if isinstance(fencing_token, bool) or not isinstance(fencing_token, int):
            raise ArgumentError("fencing_token", "must be an int (a lock's fencing_token)")
        if not 0 <= fencing_token <= MAX_FENCE:
            # Lua compares numbers as doubles: above 2**53 two tokens can compare equal.
            raise ArgumentError(
                "fencing_token",
                f"must be from 0 to 2**53 (a lock's fencing_token), got {fencing_token}",
            )
        if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
            raise ArgumentError(
                "value", f"must be str, bytes, int or float, got {type(value).__name__}"
            )
        check_seconds("ttl", ttl, allow_none=True, name=None)
        ttl_ms = 0 if ttl is None else to_ms(ttl)
        reply = await registry_for(self.client).run(
            "fenced_set", (self.key,), (fencing_token, value, ttl_ms, secrets.token_hex(8))
        )
        return int(reply[0]) == 1

    async def read(self) -> tuple[Any, int | None]:
        """The stored value and the fencing token that wrote it (``(None, None)`` if unset)."""
        with map_exceptions(doing=f"reading fenced key {self.key!r}"):
            value, fence = await self.client.hmget(self.key, ["value", "fence"])
        return value, None if fence is None else int(fence)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.key!r}>"
