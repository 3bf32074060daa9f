"""AsyncReadWriteLock: shared readers, one exclusive writer, writers never starve.

Policy: FIFO with a writer barrier. Readers share the lock while no writer
holds it; a writer waits for the current readers to finish, and every
reader that arrives after a waiting writer queues behind it. So a steady
stream of readers cannot starve a writer (Redisson's read-write lock
prefers readers and does), and readers arriving after the writer share the
lock together once it is done. :meth:`AsyncWriteLock.downgrade` turns a
write hold into a read hold without letting go, and lets in the readers at
the head of the queue.

Both sides are semaphores with no limit whose tokens carry their mode in
their first letter; the semaphore's scripts admit a writer only alone and a
reader only beside readers. So the same one-round-trip fast path, handoff,
wake-ups, watchdog and lost-hold notice as the lock apply, from one source.
"""

from __future__ import annotations

import weakref
from typing import Any, ClassVar, cast

from tenure._async._primitive import run_to_the_end
from tenure._async._scripting import AsyncClient
from tenure._async._semaphore import RW_LIMIT, AsyncPermitRules, AsyncPermits
from tenure._backends.for_asyncio import IS_ASYNC
from tenure._backends.owners import new_token
from tenure._core.clients import require_client
from tenure._core.exceptions import (
    AlreadyHeldError,
    ArgumentError,
    LockLostError,
    LockNotOwnedError,
    LostError,
    NotOwnedError,
)
from tenure._core.leased import (
    IDLE_TTL_MS,
    check_lock_name,
)
from tenure._core.statistics import (
    LeasedStatistics,
    ReadWriteStatistics,
)
from tenure._core.values import check_seconds, to_text

__all__ = ["AsyncReadLock", "AsyncReadWriteLock", "AsyncWriteLock"]


class _AsyncSideRules(AsyncPermitRules):
    """One side's rules: the semaphore's scripts, the lock's errors, tokens carrying the mode."""

    not_owned: ClassVar[type[NotOwnedError]] = LockNotOwnedError
    lost_error: ClassVar[type[LostError]] = LockLostError
    statistics_type: ClassVar[type[LeasedStatistics]] = ReadWriteStatistics
    reentry_hint = "a read-write lock is not re-entrant: release it before acquiring again"

    def __init__(self, client: AsyncClient, name: str, mode: str, **options: Any) -> None:
        super().__init__(client, name, RW_LIMIT, **options)
        self.mode = mode
        self.noun = "write lock" if mode == "w" else "read lock"
        self.other: weakref.ReferenceType[_AsyncSide] | None = None
        """The other side of the same read-write lock (weak: no cycle keeps a side alive)."""

    def statistics_extra(self) -> dict[str, Any]:
        return {"mode": "write" if self.mode == "w" else "read"}

    def new_token(self) -> str:
        return self.mode + new_token()

    def checked_token(self, token: object) -> str:
        """A token of this side: its first letter is the side ("w" write, "r" read).

        The scripts tell the sides apart by it, so a token of the other side
        (a chosen ``"report-1"`` given to the write side) would take a read
        hold: refused instead.
        """
        text = super().checked_token(token)
        if not text.startswith(self.mode):
            raise ArgumentError(
                "token",
                f"a {self.noun}'s token must start with {self.mode!r} (the scripts tell "
                f"the sides apart by it), got {text[:40]!r}",
                name=self.name,
            )
        return text

    def downgraded_token(self, token: str) -> str:
        """A write token's read token (the hold it becomes on downgrade).

        A renewal that reaches the server after :meth:`AsyncWriteLock.downgrade`
        renews that read hold.
        """
        return "r" + token[1:] if token.startswith("w") else ""

    def check_owner_free(self) -> None:
        other = None if self.other is None else self.other()
        if other is None or not other._holding():
            return
        if self.mode == "w":
            hint = (
                "a read hold is not upgraded (two upgrading readers would wait on each "
                "other): release it first, or take the write lock and downgrade()"
            )
        else:
            hint = "it would wait on its own write hold: use write.downgrade()"
        raise AlreadyHeldError(
            f"this owner holds the {other._rules.noun} of this read-write lock; {hint}",
            name=self.name,
        )


_FRONT_OPTIONS = ("thread_local", "raise_on_release_error", "on_lost", "cancel_on_lost")
"""The options a side's front takes; its rules take the rest."""


class _AsyncSide(AsyncPermits):
    """One side of a read-write lock: the semaphore's scripts, the lock's API and errors."""

    _mode: ClassVar[str] = "r"
    _rules: _AsyncSideRules

    def __init__(self, client: AsyncClient, name: str | bytes, **options: Any) -> None:
        name = check_lock_name(name)
        if options.get("reentrant"):  # the semaphore's scripts count no re-entries
            raise ArgumentError(
                "reentrant", "a read-write lock is not re-entrant; leave it out", name=name
            )
        options.pop("reentrant", None)
        options.setdefault("prefix", "tenure:rwlock:")
        front = {key: options.pop(key) for key in _FRONT_OPTIONS if key in options}
        rules = _AsyncSideRules(client, name, self._mode, kind=type(self).__name__, **options)
        super().__init__(rules, **front)

    def statistics(self) -> ReadWriteStatistics:
        """An immutable snapshot of this side's counters; ``mode`` says which side."""
        return cast(ReadWriteStatistics, super().statistics())


class AsyncReadLock(_AsyncSide):
    """The shared side of an :class:`AsyncReadWriteLock`: many readers at once."""

    _mode = "r"


class AsyncWriteLock(_AsyncSide):
    """The exclusive side of an :class:`AsyncReadWriteLock`: one writer, no readers."""

    _mode = "w"

    async def downgrade(self) -> None:
        """Keep holding, as a reader: other readers may now join; writers still wait.

        The hold stays with this object: :meth:`release` ends it. Raises
        :class:`~tenure.LockNotOwnedError` if this owner holds no write lock.
        """
        hold = self._require_hold("downgrade")
        rules = self._rules
        if not hold.token.startswith("w"):
            raise rules.refused("already downgraded to a read lock")
        read_token = rules.downgraded_token(hold.token)
        args = (hold.token, read_token, rules.settings.handoff_ms, RW_LIMIT, IDLE_TTL_MS)
        keys = (*rules.keys.all, *rules.keys.receipts)

        def downgraded(reply: Any) -> None:
            if int(reply) != 0:
                with self._holds.mutex:
                    # The next renewal (or one in flight) still carries the write
                    # token: its reply sees the change and it renews again under the
                    # read token (see AsyncLease), so it never marks the hold lost.
                    hold.token = read_token

        # Once sent, the change is made and the hold follows it (a resent
        # downgrade changes nothing more: safe to finish in the background).
        reply = await run_to_the_end(rules, "rw_downgrade", keys, args, "downgrading", downgraded)
        if int(reply) == 0:
            self._holds.mark_lost(hold)
            raise rules.refused("the write lock is no longer held")
        downgraded(reply)


class AsyncReadWriteLock:
    """A distributed read-write lock: ``.read`` and ``.write`` share one name.

    ``async with rw.read:`` for shared access, ``async with rw.write:`` for
    exclusive access. The arguments are those of :class:`~tenure.AsyncLock`
    (redis-py's eight first, in order; ``timeout=None``: held until
    released, renewed by the watchdog), but for ``reentrant`` (refused with an
    :class:`~tenure.ArgumentError`), and apply to both sides; the rest
    (``auto_renew``, ``on_lost``, ``max_hold``, ``prefix``, ``waiter_lease``,
    ``handoff_lease``, ``owner_name``, ``metric_name``, and ``cancel_on_lost``
    where the lock has it) are keyword-only.

    The policy is FIFO with a writer barrier: readers share the lock while no
    writer holds it; a writer waits for the holders in front of it, and every
    reader that arrives after a waiting writer queues behind it, so a steady
    stream of readers cannot starve a writer. The readers that queued behind
    a writer come in together once it is done. :meth:`AsyncWriteLock.downgrade`
    turns a write hold into a read hold without letting go; there is no
    upgrade (release, then acquire the write side).
    """

    def __init__(
        self,
        client: AsyncClient,
        name: str | bytes,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        **options: Any,
    ) -> None:
        name = check_lock_name(name)
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        check_seconds("sleep", sleep, allow_none=False, name=name)
        if "interop" in options:
            raise ArgumentError(
                "interop",
                "redis-py has no read-write lock to interoperate with; "
                "Lock, ReentrantLock and ClusterLock take it",
                name=name,
            )
        options.update(
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
        )
        self.sleep = sleep
        self.read = AsyncReadLock(client, name, **options)
        self.write = AsyncWriteLock(client, name, **options)
        self.name: str = self.read.name
        self.read._rules.other = weakref.ref(self.write)
        self.write._rules.other = weakref.ref(self.read)

    async def readers(self) -> int:
        """How many read holds there are now (0 while a writer holds)."""
        holders = await self.read._rules.registry.command(
            "ZRANGE", self.read.keys.owner, 0, -1, name=self.name, doing="counting readers"
        )
        return sum(1 for token in holders if to_text(token).startswith("r"))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} read={self.read!r} write={self.write!r}>"
