"""AsyncSemaphore: a fair counting semaphore whose permits are leases.

At most ``limit`` holders at any instant. Each permit is a lease on the
server's clock: a holder that stops refreshing (crashed, partitioned) loses
it after ``timeout``, and the permit goes to the next waiter. Waiters are
served in arrival order and woken by the release that frees their permit,
never by polling: the queue, the handoff, the watchdog and the cancellation
rules are the lock's (:mod:`tenure._async._primitive`), with a sorted set of
holders in place of the lock's single owner. Redis in Action's 6.3 fair
semaphore needs a lock and several round trips; this one takes a free permit
in one round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

from tenure._async._primitive import AsyncLeased
from tenure._async._rules import AsyncRules, Call, LeasedScripts, extended
from tenure._async._scripting import AsyncClient
from tenure._backends.owners import new_token
from tenure._core.exceptions import (
    ArgumentError,
    LostError,
    NotOwnedError,
    SemaphoreLimitError,
    SemaphoreLostError,
    SemaphoreNotOwnedError,
    TenureError,
)
from tenure._core.fence import fence_arg
from tenure._core.leased import (
    DEFAULT_HANDOFF_LEASE,
    DEFAULT_WAITER_LEASE,
    IDLE_TTL_MS,
    Acquired,
    LimitMismatch,
    call_id,
    check_lock_name,
)
from tenure._core.statistics import (
    LeasedStatistics,
    SemaphoreStatistics,
)
from tenure._core.values import check_seconds

__all__ = [
    "RW_LIMIT",
    "AsyncPermitRules",
    "AsyncPermits",
    "AsyncSemaphore",
    "AsyncSemaphoreRules",
]

MAX_LIMIT = 2**31 - 2
"""The largest limit a semaphore takes."""
RW_LIMIT = MAX_LIMIT + 1
"""A read-write lock's limit: above any semaphore's, so the scripts know its
tokens carry a mode (a semaphore's chosen ``"worker-1"`` is no writer)."""


class AsyncPermitRules(AsyncRules):
    """Permits on the semaphore's scripts: the rules AsyncSemaphore and the read-write sides share.

    A sorted set of holders in place of the lock's single owner, and the
    limit stored with them; each kind adds its nouns and errors.
    """

    scripts = LeasedScripts.of("semaphore")
    line_script: ClassVar[str] = "semaphore_line"

    def __init__(self, client: AsyncClient, name: str | bytes, limit: int, **options: Any) -> None:
        super().__init__(client, name, **options)
        self.limit = limit

    def try_call(self, token: str, attempt: str = "") -> Call:
        k = self.keys
        keys = (k.owner, k.queue, k.fence, k.limit, k.owners, k.grants)
        args = (token, self.settings.lease_ms, self.limit, IDLE_TTL_MS, self.owner_name, attempt)
        return keys, args

    def line_call(self) -> Call:
        return self.keys.all, (self.limit,)

    def release_call(self, token: str, fence: int = 0, call: str = "") -> Call:
        keys = (*self.keys.all, *self.keys.receipts)
        return keys, (token, self.settings.handoff_ms, self.limit, IDLE_TTL_MS, fence_arg(fence))

    def leave_call(self, token: str, attempt: str = "") -> Call:
        args = (token, self.settings.handoff_ms, self.limit, IDLE_TTL_MS, attempt)
        return self.keys.all, args

    def extend_call(self, token: str, ms: int, mode: str, fence: int = 0, call: str = "") -> Call:
        k = self.keys
        keys = (k.owner, k.limit, k.owners, k.grants, *k.receipts)
        downgraded = self.downgraded_token(token)
        return keys, (token, ms, mode, IDLE_TTL_MS, call_id(mode), downgraded, fence_arg(fence))

    def downgraded_token(self, token: str) -> str:
        """The token a hold carries once downgraded ('' : none; see AsyncWriteLock)."""
        return ""

    async def confirm_now(self, token: str, granted: Acquired) -> Acquired | None:
        """A permit's fence is its grant's: the permit's lease is set anew.

        Only for that grant: a token queued again since (its grant lapsed,
        unconfirmed) and handed a newer permit is told None; the newer
        grant's own answer (a message, or the next call) carries its fence.
        """
        keys, args = self.extend_call(token, self.settings.lease_ms, "set", granted.fence)
        reply = int(await self.run_taking(self.scripts.extend, keys, args, extended))
        return None if reply <= 0 else Acquired(fence=granted.fence, lease_ms=reply)

    def parse_try(self, reply: Any) -> int:
        fence = int(reply)
        if fence < 0:
            raise self.limit_mismatch(LimitMismatch(stored=-fence))
        return fence

    def limit_mismatch(self, answer: LimitMismatch) -> TenureError:
        return SemaphoreLimitError(
            f"the semaphore is in use with limit {answer.stored}, not {self.limit} "
            "(set_limit() changes it for everyone)",
            name=self.name,
            stored=answer.stored,
            given=self.limit,
        )


class AsyncSemaphoreRules(AsyncPermitRules):
    """The semaphore's nouns and errors, and its limit in its statistics."""

    not_owned: ClassVar[type[NotOwnedError]] = SemaphoreNotOwnedError
    lost_error: ClassVar[type[LostError]] = SemaphoreLostError
    statistics_type: ClassVar[type[LeasedStatistics]] = SemaphoreStatistics
    noun = "permit"
    reentry_hint = (
        "a semaphore is not re-entrant: for a second permit, acquire a second "
        "AsyncSemaphore object of the same name"
    )

    def __init__(self, client: AsyncClient, name: str | bytes, limit: int, **options: Any) -> None:
        name = check_lock_name(name)
        _check_limit(limit, name)
        super().__init__(client, name, limit, **options)

    def statistics_extra(self) -> dict[str, Any]:
        return {"limit": self.limit}


class AsyncPermits(AsyncLeased):
    """A leased primitive on permit rules: AsyncSemaphore and the read-write sides."""

    _rules: AsyncPermitRules

    async def owned(self) -> bool:
        """True if this owner holds it, as the server sees it (one round trip)."""
        hold = self._holds.current()
        if hold is None:
            return False
        rules = self._rules
        doing = f"checking the {rules.noun}"
        command = rules.registry.command
        if not hold.fence:  # a hold taken over by its token: is the token's permit there
            score = await command(
                "ZSCORE", rules.keys.owner, hold.token, name=self.name, doing=doing
            )
            return score is not None
        # A permit's fence is kept exactly as long as the permit (lib/semaphore):
        # it says whether the permit is there, and whether it is this acquisition's
        # (a second owner that chose the token may hold it after this one's lease ran out).
        fence = await command("HGET", rules.keys.grants, hold.token, name=self.name, doing=doing)
        return fence is not None and int(fence) == hold.fence


class AsyncSemaphore(AsyncPermits):
    """A distributed counting semaphore: ``limit`` permits, FIFO, leased.

    ``AsyncSemaphore(client, name, limit)``, as every semaphore API has it;
    the rest are keyword-only, with :class:`~tenure.AsyncLock`'s meanings:

    * ``limit`` (required) — how many holders may hold a permit at once. The
      first user stores it with the semaphore on the server; a user with
      another limit gets :class:`~tenure.SemaphoreLimitError` from
      ``acquire``, and :meth:`set_limit` changes it for everyone.
    * ``timeout`` — the permit's lease in seconds. ``None`` (default): held
      until released, on a 30 s lease the watchdog refreshes every 10 s.
    * ``sleep`` — accepted for compatibility; nothing polls.
    * ``blocking`` / ``blocking_timeout`` — defaults for :meth:`acquire`.
    * ``thread_local``, ``raise_on_release_error`` — as for
      :class:`~tenure.AsyncLock`.
    * ``auto_renew`` — refresh in the background (default: only when
      ``timeout`` is None).
    * ``on_lost``, ``max_hold``, ``prefix``, ``waiter_lease``,
      ``handoff_lease``, ``owner_name``, ``metric_name`` — as for :class:`~tenure.AsyncLock`.
    * ``cancel_on_lost`` — asyncio only: as for :class:`~tenure.AsyncLock`.

    ``refresh()`` resets the lease and raises :class:`SemaphoreNotOwnedError`
    once the permit is gone. A holder's permit carries a fencing token.
    """

    _rules: AsyncSemaphoreRules

    def statistics(self) -> SemaphoreStatistics:
        """An immutable snapshot of this semaphore object's counters, with its limit."""
        return cast(SemaphoreStatistics, super().statistics())

    def __init__(
        self,
        client: AsyncClient,
        name: str | bytes,
        limit: int,
        *,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
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
        metric_name: str | None = None,
    ) -> None:
        name = check_lock_name(name)
        check_seconds("sleep", sleep, allow_none=False, name=name)
        rules = AsyncSemaphoreRules(
            client,
            name,
            limit,
            kind=type(self).__name__,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            max_hold=max_hold,
            prefix=prefix,
            waiter_lease=waiter_lease,
            handoff_lease=handoff_lease,
            owner_name=owner_name,
            metric_name=metric_name,
        )
        super().__init__(
            rules,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
            on_lost=on_lost,
            # unasync: async-only
            cancel_on_lost=cancel_on_lost,
            # unasync: sync-only
            # unasync: end
        )
        self.sleep = sleep

    @property
    def limit(self) -> int:
        """How many permits exist (as this object knows it; :meth:`set_limit` changes it)."""
        return self._rules.limit

    async def set_limit(self, limit: int) -> int:
        """Change the limit stored with the semaphore, for every user; return the previous one.

        A larger limit lets waiters in at once. A smaller one takes no permit
        away: holders above it keep theirs until they release. Other objects
        on this name with the old limit then get :class:`SemaphoreLimitError`
        until they are made with the new one (or call ``set_limit``).
        """
        _check_limit(limit, self.name)
        rules = self._rules
        args = (limit, rules.settings.handoff_ms, IDLE_TTL_MS, new_token())
        keys = (*rules.keys.all, *rules.keys.receipts)
        previous = int(await rules.run("semaphore_set_limit", keys, args))
        rules.limit = limit
        return previous

    async def refresh(self) -> bool:
        """Reset the permit's lease to the full ``timeout``.

        Raises :class:`SemaphoreNotOwnedError` if this owner holds no permit,
        or if its permit's lease already ran out.
        """
        return await self.reacquire()

    async def holders(self) -> int:
        """How many permits are held now, counting only live leases (one round trip)."""
        rules = self._rules
        return int(await rules.run("semaphore_holders", (rules.keys.owner,), ()))


def _check_limit(limit: object, name: str) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ArgumentError(
            "limit", f"must be an int from 1 to 2**31 - 2, got {limit!r}", name=name
        )
