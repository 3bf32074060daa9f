"""AsyncSemaphore: a fair counting semaphore whose permits are leases.

At most ``limit`` holders at any instant. Each permit is a lease on the
server's clock: a holder that stops refreshing (crashed, partitioned) loses
it after ``timeout``, and the permit goes to the next waiter. Waiters are
served in arrival order and woken by the release that frees their permit,
never by polling: the queue, the handoff, the watchdog and the cancellation
rules are the lock's (:mod:`tenure._async._leased`), with a sorted set of
holders in place of the lock's single owner. Redis in Action's 6.3 fair
semaphore needs a lock and several round trips; this one takes a free permit
in one round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

from tenure._async._leased import AsyncLeased, Call, LeasedScripts, extended
from tenure._async._scripting import AsyncClient
from tenure._core.exceptions import (
    ArgumentError,
    LostError,
    NotOwnedError,
    SemaphoreLimitError,
    SemaphoreLostError,
    SemaphoreNotOwnedError,
    TenureError,
)
from tenure._core.leased import (
    DEFAULT_HANDOFF_LEASE,
    DEFAULT_WAITER_LEASE,
    IDLE_TTL_MS,
    Acquired,
    LeasedStatistics,
    LimitMismatch,
    SemaphoreStatistics,
    call_id,
    check_lock_name,
    new_token,
)
from tenure._core.values import check_seconds

__all__ = ["AsyncPermits", "AsyncSemaphore"]


class AsyncPermits(AsyncLeased):
    """Permits on the semaphore's scripts: the base of AsyncSemaphore and the read-write sides.

    It holds what those share (the scripts' calls, the stored limit); the
    semaphore-only API (``limit``, ``set_limit``, ``refresh``, ``holders``)
    is :class:`AsyncSemaphore`'s.
    """

    _scripts = LeasedScripts.of("semaphore")
    _line_script = "semaphore_line"
    _limit: int

    def _setup_permits(
        self, client: AsyncClient, name: str | bytes, limit: int, **options: Any
    ) -> None:
        """Check ``limit``, then set up as every leased primitive does (``_setup``)."""
        name = check_lock_name(name)
        _check_limit(limit, name)
        self._setup(client, name, **options)
        self._limit = limit

    def _try_call(self, token: str) -> Call:
        k = self._keys
        keys = (k.owner, k.queue, k.fence, k.limit, k.owners, k.grants)
        args = (token, self._settings.lease_ms, self._limit, IDLE_TTL_MS, self.owner_name)
        return keys, args

    def _acquire_argv4(self, reenter: bool) -> int:
        return self._limit  # the semaphore scripts' ARGV[4]: the limit

    def _acquire_keys(self) -> tuple[str, ...]:
        return self._keys.all

    def _line_call(self) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
        return self._keys.all, (self._limit,)

    def _release_call(self, token: str) -> Call:
        keys = (*self._keys.all, *self._keys.receipts)
        return keys, (token, self._settings.handoff_ms, self._limit, IDLE_TTL_MS)

    def _leave_call(self, token: str, mode: str) -> Call:
        args = (token, self._settings.handoff_ms, mode, self._limit, IDLE_TTL_MS)
        return self._keys.all, args

    def _extend_call(self, token: str, ms: int, mode: str) -> Call:
        k = self._keys
        keys = (k.owner, k.limit, k.owners, k.grants, *k.receipts)
        return keys, (token, ms, mode, IDLE_TTL_MS, call_id(mode))

    async def _confirm_now(self, token: str, granted: Acquired) -> Acquired | None:
        # A permit's fence is its grant's: the permit's lease is set anew.
        keys, args = self._extend_call(token, self._settings.lease_ms, "set")
        reply = int(await self._run_taking(self._scripts.extend, keys, args, extended))
        return None if reply <= 0 else Acquired(fence=granted.fence, lease_ms=reply)

    def _parse_try(self, reply: Any) -> int:
        fence = int(reply)
        if fence < 0:
            raise self._limit_mismatch(LimitMismatch(stored=-fence))
        return fence

    def _limit_mismatch(self, answer: LimitMismatch) -> TenureError:
        return SemaphoreLimitError(
            f"the semaphore is in use with limit {answer.stored}, not {self._limit} "
            "(set_limit() changes it for everyone)",
            name=self.name,
            stored=answer.stored,
            given=self._limit,
        )


class AsyncSemaphore(AsyncPermits):
    """A distributed counting semaphore: ``limit`` permits, FIFO, leased.

    The positional arguments are :class:`~tenure.AsyncLock`'s (redis-py's
    ``Lock``'s eight, in order); the rest are keyword-only, ``limit`` too:

    * ``timeout`` — the permit's lease in seconds. ``None`` (default): held
      until released, on a 30 s lease the watchdog refreshes every 10 s.
    * ``sleep`` — accepted for compatibility; nothing polls.
    * ``blocking`` / ``blocking_timeout`` — defaults for :meth:`acquire`.
    * ``thread_local``, ``raise_on_release_error`` — as for
      :class:`~tenure.AsyncLock`.
    * ``limit`` (required) — how many holders may hold a permit at once. The
      first user stores it with the semaphore on the server; a user with
      another limit gets :class:`~tenure.SemaphoreLimitError` from
      ``acquire``, and :meth:`set_limit` changes it for everyone.
    * ``auto_renew`` — refresh in the background (default: only when
      ``timeout`` is None).
    * ``on_lost``, ``max_hold``, ``prefix``, ``waiter_lease``,
      ``handoff_lease``, ``owner_name`` — as for :class:`~tenure.AsyncLock`.
    * ``cancel_on_lost`` — asyncio only: as for :class:`~tenure.AsyncLock`.

    ``refresh()`` resets the lease and raises :class:`SemaphoreNotOwnedError`
    once the permit is gone. A holder's permit carries a fencing token.
    """

    _not_owned: ClassVar[type[NotOwnedError]] = SemaphoreNotOwnedError
    _lost_error: ClassVar[type[LostError]] = SemaphoreLostError
    _noun = "permit"
    _reentry_hint = (
        "a semaphore is not re-entrant: for a second permit, acquire a second "
        "AsyncSemaphore object of the same name"
    )
    _statistics_type: ClassVar[type[LeasedStatistics]] = SemaphoreStatistics

    def statistics(self) -> SemaphoreStatistics:
        """An immutable snapshot of this semaphore object's counters, with its limit."""
        return cast(SemaphoreStatistics, super().statistics())

    def _statistics_extra(self) -> dict[str, Any]:
        return {"limit": self._limit}

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
        *,
        limit: int,
        auto_renew: bool | None = None,
        on_lost: Callable[[AsyncSemaphore], None] | None = None,
        # unasync: async-only
        cancel_on_lost: bool = False,
        # unasync: sync-only
        # unasync: end
        max_hold: float | None = None,
        prefix: str = "tenure:semaphore:",
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        handoff_lease: float = DEFAULT_HANDOFF_LEASE,
        owner_name: str | None = None,
    ) -> None:
        name = check_lock_name(name)
        check_seconds("sleep", sleep, allow_none=False, name=name)
        self._setup_permits(
            client,
            name,
            limit,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            auto_renew=auto_renew,
            on_lost=on_lost,
            # unasync: async-only
            cancel_on_lost=cancel_on_lost,
            # unasync: sync-only
            # unasync: end
            max_hold=max_hold,
            prefix=prefix,
            waiter_lease=waiter_lease,
            handoff_lease=handoff_lease,
            raise_on_release_error=raise_on_release_error,
            owner_name=owner_name,
        )
        self.sleep = sleep

    @property
    def limit(self) -> int:
        """How many permits exist (as this object knows it; :meth:`set_limit` changes it)."""
        return self._limit

    async def set_limit(self, limit: int) -> int:
        """Change the limit stored with the semaphore, for every user; return the previous one.

        A larger limit lets waiters in at once. A smaller one takes no permit
        away: holders above it keep theirs until they release. Other objects
        on this name with the old limit then get :class:`SemaphoreLimitError`
        until they are made with the new one (or call ``set_limit``).
        """
        _check_limit(limit, self.name)
        args = (limit, self._settings.handoff_ms, IDLE_TTL_MS, new_token())
        keys = (*self._keys.all, *self._keys.receipts)
        previous = int(await self._run("semaphore_set_limit", keys, args))
        self._limit = limit
        return previous

    async def refresh(self) -> bool:
        """Reset the permit's lease to the full ``timeout``.

        Raises :class:`SemaphoreNotOwnedError` if this owner holds no permit,
        or if its permit's lease already ran out.
        """
        return await self.reacquire()

    async def holders(self) -> int:
        """How many permits are held now, counting only live leases (one round trip)."""
        return int(await self._run("semaphore_holders", (self._keys.owner,), ()))


def _check_limit(limit: object, name: str) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit < 2**31:
        raise ArgumentError(
            "limit", f"must be an int from 1 to 2**31 - 1, got {limit!r}", name=name
        )
