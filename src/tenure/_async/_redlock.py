"""AsyncRedlock: one lock over several independent masters, kept while a majority is.

For users who run several Redis/Valkey servers with no replication between
them and want a lock that survives losing a minority of them (the Redlock
algorithm). Each master keeps its own copy of the lock's keys; an
acquisition counts when a quorum (``n // 2 + 1``) granted it in time.

How it works (the rules are in :mod:`tenure._core.redlock`, each master's
part is one Lua script):

* **acquire** — one attempt sends the acquire script to every master at
  once and returns as soon as a quorum granted it (a slow or dead master
  costs nothing while the others answer), or as soon as a quorum can no
  longer be reached, or after ``master_timeout``. It counts if time is
  left: validity = lease - the attempt's time - drift (1% of the lease +
  2 ms). Otherwise whatever it took is given back at once, on every master
  that granted it, and a grant that comes in later is given back when it
  comes.
* **waiting, fairly** — a caller that finds the lock taken waits in a line
  kept on every master, ordered by a *ticket* (its clock when it began), so
  all masters agree on who is first and grant the free lock to the same
  caller: contenders do not split the masters between them and retry
  forever. A release wakes the first in line (on its process's wake-up
  channel, :mod:`tenure._async._wakeups`); nothing polls. Waiters also
  re-check on their own timers (their place in line is a lease, renewed
  every ``waiter_lease * 0.4``), when the owner's lease runs out on a
  quorum, and at their deadline: ``blocking_timeout`` is a deadline, never
  a number of retries.
* **masters down** — when so many masters fail that the rest cannot make a
  quorum, in two attempts in a row (one may be a passing stall), acquire
  raises :class:`~tenure.QuorumError` at once, naming each failed master and
  why. A master that accepts connections but never
  answers is skipped after :data:`~tenure._core.redlock.MAX_OVERDUE` calls
  left hanging, until one of them ends.
* **renewal, extend** — the watchdog renews on every master and needs a
  quorum; a hold whose renewals keep falling short is lost when its
  validity runs out (``lost``, ``on_lost``, :class:`~tenure.LockLostError`
  from ``with``), as for :class:`~tenure.AsyncLock`.
* **fencing** — each master counts its own acquisitions; a holder's token is
  the largest of its quorum's. When they differ (a master missed some
  acquisitions), the holder raises the others' counters to it before the
  acquisition counts, so every later quorum (which shares a master with
  this one) hands out a larger token. What this does and does not promise
  is in docs/guarantees.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from tenure._async._masters import RELEASE_PATIENCE, answered
from tenure._async._primitive import AsyncLeased
from tenure._async._redlock_queue import AsyncRedlockQueue
from tenure._async._redlock_rules import AsyncRedlockRules
from tenure._async._scripting import AsyncClient
from tenure._backends.for_asyncio import IS_ASYNC
from tenure._core.leased import (
    DEFAULT_HANDOFF_LEASE,
    DEFAULT_WAITER_LEASE,
    check_lock_name,
)
from tenure._core.redlock import (
    RedlockStatistics,
    Tally,
    check_masters,
    holder_of,
    owners_decided,
)
from tenure._core.values import check_seconds

__all__ = ["AsyncRedlock"]


class AsyncRedlock(AsyncLeased):
    """A lock over several independent masters that holds while a majority of them does.

    ``clients`` is a list with one client per master (independent servers,
    no replication between them; 3 or 5 is usual). The other arguments
    follow :class:`AsyncLock` (redis-py's ``Lock`` order after ``name``):

    * ``timeout`` — lease in seconds; ``None``: 30 s renewed by the watchdog.
    * ``sleep`` — accepted for compatibility; nothing polls.
    * ``blocking`` / ``blocking_timeout`` — defaults for :meth:`acquire`;
      ``blocking_timeout`` is a deadline.
    * ``thread_local``, ``raise_on_release_error`` — as for :class:`AsyncLock`.

    Keyword-only: ``auto_renew``, ``on_lost``, ``max_hold``, ``prefix``,
    ``waiter_lease``, ``owner_name``, ``metric_name`` as for :class:`AsyncLock` (each master
    stores the owner name beside its part of the hold), and

    * ``cancel_on_lost`` — asyncio only: as for :class:`AsyncLock`.
    * ``master_timeout`` — seconds an attempt waits for the masters (default
      0.1, or a tenth of a shorter lease; at most a tenth of the lease; an
      acquisition's first attempt waits up to 1 s while no master has
      answered at all). A release
      waits longer for a quorum, up to 1 s: nothing runs out meanwhile. Set the
      clients' own ``socket_timeout`` too, so a call to a master that never answers ends.

    Not re-entrant. Every master gets the same keys
    (``{prefix}{{{name}}}`` and suffixes).
    """

    _rules: AsyncRedlockRules

    def __init__(
        self,
        clients: Sequence[AsyncClient],
        name: str | bytes,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        auto_renew: bool | None = None,
        on_lost: Callable[[AsyncRedlock], None] | None = None,
        # unasync: async-only
        cancel_on_lost: bool = False,
        # unasync: sync-only
        # unasync: end
        max_hold: float | None = None,
        prefix: str = "tenure:redlock:",
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        master_timeout: float | None = None,
        owner_name: str | None = None,
        metric_name: str | None = None,
    ) -> None:
        name = check_lock_name(name)
        described = check_masters(clients, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        check_seconds("sleep", sleep, allow_none=False, name=name)
        rules = AsyncRedlockRules(
            clients,
            name,
            described,
            master_timeout,
            kind=type(self).__name__,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            max_hold=max_hold,
            waiter_lease=waiter_lease,
            handoff_lease=DEFAULT_HANDOFF_LEASE,
            prefix=prefix,
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
            queue=lambda _rules, holds, lease: AsyncRedlockQueue(rules, holds, lease),
        )
        self.sleep = sleep
        self.clients = tuple(clients)
        self._masters = rules.masters

    @property
    def masters(self) -> tuple[str, ...]:
        """Each master, as ``host:port`` (or its socket path, or its Sentinel service)."""
        return self._masters.described

    @property
    def quorum(self) -> int:
        """How many masters must agree: ``len(clients) // 2 + 1``."""
        return self._masters.quorum

    @property
    def master_timeout(self) -> float:
        """Seconds an attempt waits for the masters."""
        return self._masters.call_timeout

    def statistics(self) -> RedlockStatistics:
        """An immutable snapshot of the counters, with the masters' figures."""
        return cast(RedlockStatistics, super().statistics())

    # -- queries ---------------------------------------------------------------

    async def _owners(self, holder: str | None = None) -> Tally:
        """Each master's holder (:func:`holder_of`), asked until they decide for ``holder``."""
        owner = self._rules.keys.owner
        clients = self._masters.clients

        def send(index: int) -> Any:
            return clients[index].hmget(owner, ["token", "call"])

        # A question changes nothing and nothing runs out while it waits: a
        # busy machine's slow answers are waited for (the settle timeout), and
        # masters only slow are asked again, until a quorum answered.
        def held(reply: Any) -> bool:
            return reply[0] is not None

        def decided(tally: Tally) -> bool:
            return owners_decided(tally, holder)

        return await self._masters.persist(send, held, answered, RELEASE_PATIENCE, until=decided)

    async def locked(self) -> bool:
        """True if one owner holds the lock on a quorum of masters.

        Masters only slow to answer are asked again (up to 5 s) before
        :class:`~tenure.QuorumError`.
        """
        tally = await self._owners()
        counts: dict[str, int] = {}
        for reply in tally.good.values():
            counts[holder_of(reply)] = counts.get(holder_of(reply), 0) + 1
        if counts and max(counts.values()) >= self.quorum:
            return True
        if tally.unreachable:
            raise tally.error("checking the lock", self.name)
        return False

    async def owned(self) -> bool:
        """True if this owner holds the lock on a quorum of masters (asked as :meth:`locked`)."""
        hold = self._holds.current()
        if hold is None:
            return False
        me = holder_of((hold.token, hold.call))  # a chosen token's: with its acquire call
        tally = await self._owners(me)
        mine = sum(1 for reply in tally.good.values() if holder_of(reply) == me)
        if mine < self.quorum and tally.unreachable:
            raise tally.error("checking the lock", self.name)
        return mine >= self.quorum
