"""AsyncConnectionLock: a lock owned by a connection, freed the moment it closes.

From "Locking Redis clients for distributed calculations": the owner of a
booking is a connection, and a booking whose connection is gone is free. A
holder killed with ``kill -9`` frees the lock as soon as the server notices
the closed socket: no lease to wait out. The source's holes are closed:

* the holder gets a **dedicated connection** of its own (a one-connection
  pool copied from the client's settings), so no pool can swap it, lend it
  out, or rename it; the lock key names that connection's ``CLIENT ID``;
* the check that the current owner is gone and the booking are **one
  transaction** (WATCH the key, look the owner up with ``CLIENT LIST ID``,
  then MULTI/SET/EXEC), so two clients can never both take a dead owner's
  lock;
* a server whose ACL forbids ``CLIENT ID`` or ``CLIENT LIST`` gives a
  :class:`~tenure.PermissionDeniedError` that names them;
* a holder that is alive but hung keeps its connection open, so it keeps
  the lock: pass ``lease=`` to also expire the booking unless the holder
  calls :meth:`refresh` in time (opt-in: it trades the "never expires while
  connected" guarantee for liveness).

Redis tells nobody when a connection closes, so waiters look again every
``poll_interval`` (default 50 ms), and at once when a holder releases.
Standalone servers only: a cluster client raises ClientTypeError.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import redis.asyncio
from redis import exceptions as redis_errors

from tenure._async._deadline import GRACE, Overdue, by_deadline
from tenure._async._scripting import registry_for
from tenure._backends.for_asyncio import (
    IS_ASYNC,
    TwinHints,
    before_waiting,
    dropped_on_loop,
    is_cancellation,
    refuse_awaited_call,
    shielded,
    sleep,
    start_background,
    taken_on_loop,
)
from tenure._backends.owners import default_owner_name, generation
from tenure._backends.telemetry import (
    lock_gave_up,
    lock_held,
    lock_lost_found,
    lock_waited,
    subject,
)
from tenure._core.clients import is_cluster, map_exceptions, require_client
from tenure._core.exceptions import (
    AcquireTimeoutError,
    AlreadyHeldError,
    ArgumentError,
    ClientTypeError,
    LockNotOwnedError,
    PermissionDeniedError,
)
from tenure._core.leased import (
    base_key,
    check_lock_name,
    check_prefix,
)
from tenure._core.owner_names import check_owner_name
from tenure._core.telemetry import ACQUIRED, TIMEOUT
from tenure._core.values import check_seconds, to_ms, to_text

__all__ = ["AsyncConnectionLock"]

_parents: list[Any] = []
"""Dedicated connections a fork's parent held: kept, never closed, in the child."""


logger = logging.getLogger("tenure.lock")


class AsyncConnectionLock(TwinHints):
    """A lock owned by a connection: free the moment that connection closes.

    :meth:`acquire` opens a dedicated connection (a one-connection pool with
    the client's settings, so no pool can lend it out or swap it) and books
    the lock for that connection's ``CLIENT ID``, checking that the previous
    owner's connection is gone and booking in one transaction (WATCH, then
    ``CLIENT LIST ID``, then MULTI/SET/EXEC): two clients never both take a
    dead owner's lock. A holder killed with ``kill -9`` frees the lock as soon
    as the server notices the closed socket, with no lease to wait out;
    :meth:`release` deletes the booking and closes the connection.

    Redis announces no closed connection, so waiters look again every
    ``poll_interval`` seconds (and at once when a holder releases).
    ``blocking`` / ``blocking_timeout`` are the defaults of :meth:`acquire`;
    ``lease`` also expires the booking unless the holder calls
    :meth:`refresh` in time (a holder alive but hung keeps its connection,
    and so the lock, without one); ``prefix``, ``owner_name`` and ``metric_name`` are as for
    :class:`~tenure.AsyncLock`. Not re-entrant. Standalone servers only (a
    cluster client raises :class:`~tenure.ClientTypeError`); the ACL must
    allow ``CLIENT ID``, ``CLIENT LIST``, ``WATCH``, ``MULTI``, ``GET``,
    ``SET`` and ``EVALSHA``. See "Connection-bound locks" in docs/locks.md.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        name: str | bytes,
        *,
        lease: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        poll_interval: float = 0.05,
        prefix: str = "tenure:connlock:",
        owner_name: str | None = None,
        metric_name: str | None = None,
    ) -> None:
        name = check_lock_name(name)
        self._owner_name = check_owner_name(owner_name, name)
        self._subject = subject(type(self).__name__, name, metric_name)
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        if is_cluster(client):
            raise ClientTypeError(
                "client",
                "a ConnectionLock needs a standalone server client: its owner is one "
                "connection's CLIENT ID, looked up with CLIENT LIST on the server that holds "
                "the key, and a cluster client cannot send CLIENT commands to the key's node "
                "in one transaction; on a cluster use Lock or ClusterLock",
                name=name,
            )
        check_seconds("lease", lease, allow_none=True, name=name)
        check_seconds("blocking_timeout", blocking_timeout, allow_none=True, name=name)
        check_seconds("poll_interval", poll_interval, allow_none=False, name=name)
        if lease is not None and lease <= 0:
            raise ArgumentError("lease", f"must be > 0 seconds, got {lease!r}", name=name)
        if not 0.001 <= poll_interval <= 5:
            raise ArgumentError("poll_interval", "must be between 1 ms and 5 s", name=name)
        self.client = client
        self.name = name
        self.key = base_key(check_prefix(prefix, name), name)
        self.owner_key = f"{self.key}:owner"
        self.lease = lease
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.poll_interval = poll_interval
        self._connection: redis.asyncio.Redis | None = None
        self._owner_id: str | None = None
        self._generation = generation()  # of the process that holds (see _held)
        self._taken_at = 0.0  # when the current hold was taken (monotonic), for the metrics
        self._loop_thread = 0  # the thread it was taken on while its event loop ran (sync)

    @property
    def owner_name(self) -> str:
        """Who holds, as ``tenure inspect`` shows it: ``owner_name=``, or ``host:pid``.

        Booked beside the connection's ``CLIENT ID`` (key ``{key}:owner``),
        with the same expiry.
        """
        return self._owner_name or default_owner_name()

    @property
    def owner_id(self) -> str | None:
        """The ``CLIENT ID`` of this object's dedicated connection while it holds."""
        return self._held()[1]

    def _held(self) -> tuple[redis.asyncio.Redis | None, str | None]:
        """The dedicated connection and its ID while this process holds.

        A fork's child holds nothing: the parent's booking stays the parent's.
        """
        if self._owner_id is not None and self._generation != generation():
            _parents.append(self._connection)  # closing it here could disturb the parent's
            self._connection = self._owner_id = None
        return self._connection, self._owner_id

    def __repr__(self) -> str:
        owner_id = self._held()[1]
        state = f"held by connection {owner_id}" if owner_id else "not held"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    async def acquire(
        self, blocking: bool | None = None, blocking_timeout: float | None = None
    ) -> bool:
        """Take the lock on a new dedicated connection; False if busy (or timed out)."""
        refuse_awaited_call(type(self).__name__, "acquire", 1)
        if self._held()[1] is not None:
            raise AlreadyHeldError(
                "this ConnectionLock already holds: release it first (it is not re-entrant)",
                name=self.name,
            )
        wait = self.blocking if blocking is None else blocking
        timeout = self.blocking_timeout if blocking_timeout is None else blocking_timeout
        check_seconds("blocking_timeout", timeout, allow_none=True, name=self.name)
        started = time.monotonic()
        deadline = None if timeout is None or not wait else started + timeout
        connection = self._dedicated()
        late = self._closing_later(connection)
        try:
            with map_exceptions(name=self.name, doing="acquiring", refine=self._refine):
                my_id = str(
                    await by_deadline(deadline, lambda: connection.client_id(), late, self.client)
                )
            while True:
                if await by_deadline(
                    deadline, lambda: self._try_book(connection, my_id), late, self.client
                ):
                    self._connection, self._owner_id = connection, my_id
                    self._loop_thread = taken_on_loop(self.key)
                    self._generation = generation()
                    self._taken_at = time.monotonic()
                    lock_waited(self._subject, started, ACQUIRED)
                    return True
                if not wait or (deadline is not None and time.monotonic() >= deadline):
                    await self._close(connection)
                    if wait:  # (a non-blocking try found it busy: not a wait)
                        lock_waited(self._subject, started, TIMEOUT)
                    return False
                pause = self.poll_interval
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - time.monotonic()))
                before_waiting(type(self).__name__, self.key, self.name)
                await sleep(pause)
        except Overdue:
            # The connection is closed when the late call ends (closed now, the
            # client's retry would open another): a booking it made then names a
            # connection that is gone.
            logger.warning(
                "tenure: connection lock %r: the server did not answer by the deadline of "
                "acquire() (blocking_timeout=%s, and %ss more): not acquired",
                self.name,
                timeout,
                GRACE,
            )
            lock_waited(self._subject, started, TIMEOUT)
            return False
        except BaseException as exc:
            lock_gave_up(self._subject, started, exc, is_cancellation(exc))
            await shielded(self._close(connection))
            raise

    def _closing_later(self, connection: redis.asyncio.Redis) -> Callable[[int, Any], None]:
        """A late call's handler: close the dedicated connection once the call ended."""

        def late(index: int, outcome: object) -> None:
            async def close() -> None:
                await self._close(connection)

            start_background(close, "tenure-give-back")

        return late

    async def _close(self, connection: redis.asyncio.Redis) -> bool:
        await connection.aclose()
        await connection.connection_pool.disconnect()  # the pool is ours alone
        return True

    def _dedicated(self) -> redis.asyncio.Redis:
        pool = self.client.connection_pool
        own_pool = type(pool)(
            connection_class=pool.connection_class, max_connections=1, **pool.connection_kwargs
        )
        # One connection, used for every command of this hold: the ID booked is
        # the connection that stays open. If it drops, redis-py's reconnect gets
        # a new ID and the booking is (correctly) lost.
        return redis.asyncio.Redis(connection_pool=own_pool)

    async def _try_book(self, connection: redis.asyncio.Redis, my_id: str) -> bool:
        """WATCH, check the owner is gone, and book, as one transaction."""
        with map_exceptions(name=self.name, doing="acquiring", refine=self._refine):
            try:
                async with connection.pipeline(transaction=True) as transaction:
                    pipe: Any = transaction  # redis-py leaves watch/multi untyped
                    await pipe.watch(self.key)
                    owner = await pipe.get(self.key)
                    if owner is not None and await self._alive(pipe, to_text(owner)):
                        await pipe.unwatch()
                        return False
                    pipe.multi()
                    expiry = None if self.lease is None else to_ms(self.lease)
                    pipe.set(self.key, my_id, px=expiry)
                    pipe.set(self.owner_key, self.owner_name, px=expiry)
                    await pipe.execute()
                    return True
            except redis_errors.WatchError:
                return False  # someone booked between the check and EXEC

    async def _alive(self, pipe: Any, owner: str) -> bool:
        doing = "checking the holder's connection"
        with map_exceptions(name=self.name, doing=doing, refine=self._refine):
            found = await pipe.client_list(client_id=[owner])
        return bool(found)

    async def release(self) -> None:
        """Delete the booking (if it is still ours) and close the dedicated connection."""
        refuse_awaited_call(type(self).__name__, "release", 1)
        connection, my_id = self._held()
        if connection is None or my_id is None:
            raise LockNotOwnedError("cannot release: this object does not hold", name=self.name)
        self._connection = self._owner_id = None
        if self._loop_thread:
            dropped_on_loop(self._loop_thread, self.key)
            self._loop_thread = 0
        try:
            deleted = await shielded(
                registry_for(connection).run(
                    "connlock_release", (self.key, self.owner_key), (my_id,)
                )
            )
        finally:
            await shielded(self._close(connection))
        if int(deleted) != 1:
            lock_lost_found(self._subject)
            raise LockNotOwnedError("the booking was gone (lease ran out)", name=self.name)
        lock_held(self._subject, self._taken_at)

    async def refresh(self) -> None:
        """Reset the opt-in lease; raise :class:`LockNotOwnedError` if no longer held."""
        refuse_awaited_call(type(self).__name__, "refresh", 1)
        connection, my_id = self._held()
        if connection is None or my_id is None or self.lease is None:
            raise LockNotOwnedError("nothing to refresh: not held with a lease", name=self.name)
        reply = await registry_for(connection).run(
            "connlock_refresh", (self.key, self.owner_key), (my_id, to_ms(self.lease))
        )
        if int(reply) != 1:
            raise LockNotOwnedError("the booking was gone (lease ran out)", name=self.name)

    async def owned(self) -> bool:
        """True if this object holds: its booking names its connection, still open.

        One round trip on the client (not the dedicated connection). False once
        the connection dropped (its ``CLIENT ID`` is gone) or the lease ran out.
        """
        my_id = self._held()[1]
        if my_id is None:
            return False
        with map_exceptions(name=self.name, doing="checking the lock", refine=self._refine):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.get(self.key)
                pipe.client_list(client_id=[my_id])
                owner, alive = await pipe.execute()
        return owner is not None and to_text(owner) == my_id and bool(alive)

    async def locked(self) -> bool:
        """True if a live connection holds the lock (two round trips)."""
        with map_exceptions(name=self.name, doing="checking the lock", refine=self._refine):
            owner = await self.client.get(self.key)
        return owner is not None and await self._alive(self.client, to_text(owner))

    def _refine(self, error: BaseException, exc: BaseException) -> BaseException:
        if isinstance(error, PermissionDeniedError):  # say which commands it needs
            return PermissionDeniedError(
                "ConnectionLock needs CLIENT ID, CLIENT LIST, WATCH, MULTI, GET, SET and "
                f"EVALSHA on {self.key!r}; the server's ACL refused one ({exc})",
                name=self.name,
            )
        return error

    async def __aenter__(self) -> AsyncConnectionLock:
        if not await self.acquire():
            raise AcquireTimeoutError(
                f"could not acquire within {self.blocking_timeout}s", name=self.name
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
