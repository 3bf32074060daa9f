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
from typing import ClassVar

from tenure._async._leased import AsyncLeased, LeasedScripts
from tenure._async._scripting import AsyncClient
from tenure._exceptions import (
    ArgumentError,
    LostError,
    NotOwnedError,
    SemaphoreLostError,
    SemaphoreNotOwnedError,
)
from tenure._lock_core import DEFAULT_HANDOFF_LEASE, DEFAULT_WAITER_LEASE

__all__ = ["AsyncSemaphore"]


class AsyncSemaphore(AsyncLeased):
    """A distributed counting semaphore: ``limit`` permits, FIFO, leased.

    * ``limit`` — how many holders may hold a permit at once. Every user of
      one semaphore name must pass the same limit.
    * ``timeout`` — the permit's lease in seconds. ``None`` (default): held
      until released, on a 30 s lease the watchdog refreshes every 10 s.
    * ``blocking`` / ``blocking_timeout`` — defaults for :meth:`acquire`.
    * ``auto_renew`` — refresh in the background (default: only when
      ``timeout`` is None).
    * ``thread_local``, ``on_lost``, ``cancel_on_lost``, ``max_hold``,
      ``prefix``, ``waiter_lease``, ``handoff_lease`` — as for
      :class:`~tenure.AsyncLock`.

    ``refresh()`` resets the lease and raises :class:`SemaphoreNotOwnedError`
    once the permit is gone. A holder's permit carries a fencing token.
    """

    _scripts = LeasedScripts.of("semaphore")
    _not_owned: ClassVar[type[NotOwnedError]] = SemaphoreNotOwnedError
    _lost_error: ClassVar[type[LostError]] = SemaphoreLostError
    _noun = "permit"

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        limit: int,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        auto_renew: bool | None = None,
        *,
        on_lost: Callable[[AsyncSemaphore], None] | None = None,
        cancel_on_lost: bool = False,
        max_hold: float | None = None,
        prefix: str = "tenure:semaphore:",
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        handoff_lease: float = DEFAULT_HANDOFF_LEASE,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ArgumentError("limit", f"must be an int >= 1, got {limit!r}", name=name)
        self._setup(
            client,
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            reentrant=False,
            max_hold=max_hold,
            waiter_lease=waiter_lease,
            handoff_lease=handoff_lease,
            thread_local=thread_local,
            on_lost=on_lost,
            cancel_on_lost=cancel_on_lost,
            prefix=prefix,
        )
        self.limit = limit
        self.timeout = timeout

    def _try_args(self, token: str) -> tuple[str | int, ...]:
        return (token, self._settings.lease_ms, self.limit)

    def _acquire_extra(self, reenter: bool) -> int:
        return self.limit

    def _release_args(self, token: str) -> tuple[str | int, ...]:
        return (token, self._settings.handoff_ms, self.limit)

    def _leave_args(self, token: str, mode: str) -> tuple[str | int, ...]:
        return (token, self._settings.handoff_ms, mode, self.limit)

    async def refresh(self) -> bool:
        """Reset the permit's lease to the full ``timeout``.

        Raises :class:`SemaphoreNotOwnedError` if this owner holds no permit,
        or if its permit's lease already ran out.
        """
        return await self.reacquire()

    async def holders(self) -> int:
        """How many permits are held now, counting only live leases (one round trip)."""
        return int(await self._run("semaphore_holders", (self._keys.owner,), ()))
