"""AsyncLock: a fair, fenced, lease-based lock that never polls.

The mechanism — one-round-trip acquire, FIFO queue with handoff inside the
release script, wake lists instead of polling, the watchdog, lost-lock
notice — is described in :mod:`tenure._async._primitive`, which implements it
for every leased primitive; this module adds the lock's scripts, re-entry,
and redis-py's signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from tenure._async._lock_rules import AsyncLockRules, holding_redis_py_key
from tenure._async._primitive import AsyncLeased
from tenure._async._scripting import AsyncClient
from tenure._core.exceptions import ArgumentError
from tenure._core.leased import DEFAULT_HANDOFF_LEASE, DEFAULT_WAITER_LEASE, check_lock_name
from tenure._core.values import check_seconds, to_text

__all__ = ["AsyncLock", "AsyncReentrantLock"]


class AsyncLock(AsyncLeased):
    """A distributed lock: mutual exclusion, FIFO fairness, fencing, lost-lock notice.

    Arguments follow redis-py's ``Lock`` where they overlap:

    * ``timeout`` — lease in seconds. ``None`` (default): held until
      released, on a 30 s lease the watchdog renews every 10 s.
    * ``sleep`` — accepted for compatibility; tenure never polls, except with
      ``interop="redis-py"`` while a redis-py process holds (every ``sleep`` s).
    * ``blocking`` / ``blocking_timeout`` — defaults for :meth:`acquire`.
      ``blocking_timeout=T`` gives up after T seconds (within ~50 ms).
    * ``thread_local`` — the token belongs to the acquiring task: a task
      started from it after it acquired, or the next user of a hold whose
      owner finished, may release it too, another may not ("Re-entrancy and
      ownership" in docs/locks.md); ``False`` lets any task release.
    * ``raise_on_release_error`` — at ``with`` exit, a lock that was lost or
      released inside the block raises :class:`LockNotOwnedError` (or its
      subclass :class:`LockLostError`); ``False`` logs a warning instead.

    These eight come in redis-py's order, so ``client.lock(name,
    lock_class=AsyncLock)`` works. The rest are keyword-only:

    * ``auto_renew`` — renew the lease in the background (default: only when
      ``timeout`` is None).
    * ``reentrant`` — the owner may acquire again; each acquire needs a release.
    * ``on_lost`` — called with the lock (from the watchdog) when a held lease
      is found lost.
    * ``cancel_on_lost`` — asyncio only: cancel the task in ``async with``
      when its lock is lost; the block then raises :class:`LockLostError`.
    * ``max_hold`` — end the hold after this many seconds (no renewal past
      it); the holder is then told as for a lost lock.
    * ``prefix`` — key prefix; keys are ``{prefix}{{{name}}}`` and suffixes
      (``{prefix}({name})`` for a name with its own hash tag, which is kept).
    * ``waiter_lease`` — seconds a process's place in the queue lasts
      unless refreshed (every ``waiter_lease`` x 0.4): the waiters of a
      process that died are dropped within it.
    * ``handoff_lease`` — the short lease a waiter is handed the lock on,
      until its ``acquire`` sets the full one: a waiter that died just
      before its turn holds the others up by at most this, once ("Failure
      bounds" in docs/locks.md).
    * ``owner_name`` — who holds and waits, as ``tenure inspect`` shows it
      (default ``host:pid``); stored on the server beside the hold. A
      printable str of at most 200 characters.
    * ``metric_name`` — report this lock's measurements with ``tenure.name``
      set to it (docs/observability.md); by default no name is reported
      unless :func:`~tenure.set_metric_names` matches ``name``.
    * ``interop`` — ``"redis-py"``: also hold redis-py's own key of the lock
      (``name``, holding the token, with the hold's expiry) in the same
      script that takes, renews, hands on and releases the hold, so processes
      still on redis-py's ``Lock`` (or any ``SET name token NX PX`` code) and
      on tenure exclude each other during a migration. While such a process
      holds, tenure's waiters look again every ``sleep`` seconds (its release
      is announced to nobody). See "Migrating a running system" in
      docs/redis-py.md.
    """

    _rules_type: ClassVar[type[AsyncLockRules]] = AsyncLockRules

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
        auto_renew: bool | None = None,
        reentrant: bool = False,
        on_lost: Callable[[AsyncLock], None] | None = None,
        # unasync: async-only
        cancel_on_lost: bool = False,
        # unasync: sync-only
        # unasync: end
        max_hold: float | None = None,
        prefix: str = "tenure:lock:",
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        handoff_lease: float = DEFAULT_HANDOFF_LEASE,
        owner_name: str | None = None,
        metric_name: str | None = None,
        interop: str | None = None,
    ) -> None:
        if interop not in (None, "redis-py"):
            raise ArgumentError(
                "interop",
                f"must be None or 'redis-py', got {interop!r}",
                name=check_lock_name(name),
            )
        # Only the locks that hold redis-py's key too pay for it (lock_rules.py).
        rules_type = self._rules_type if interop is None else holding_redis_py_key(self._rules_type)
        rules = rules_type(
            client,
            name,
            kind=type(self).__name__,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            reentrant=reentrant,
            max_hold=max_hold,
            waiter_lease=waiter_lease,
            handoff_lease=handoff_lease,
            prefix=prefix,
            owner_name=owner_name,
            metric_name=metric_name,
        )
        check_seconds("sleep", sleep, allow_none=False, name=rules.name)
        if interop is not None:
            if not sleep > 0:
                raise ArgumentError(
                    "sleep",
                    "must be > 0 with interop='redis-py' (how often waiters look)",
                    name=rules.name,
                )
            rules.outsider_poll = float(sleep)
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
        self.interop = interop

    async def locked(self) -> bool:
        """True if anyone holds the lock (one round trip).

        With ``interop="redis-py"``, a holder of redis-py's key counts too
        (a second round trip when tenure's hash names nobody).
        """
        command = self._rules.registry.command
        owner = self._rules.keys.owner
        # The owner hash without a token is the marker a release left (its fence).
        if await command("HEXISTS", owner, "token", name=self.name, doing="checking the lock"):
            return True
        for key in self._rules.outer_keys:  # interop: a holder of redis-py's key
            if await command("EXISTS", key, name=self.name, doing="checking redis-py's key"):
                return True
        return False

    async def owned(self) -> bool:
        """True if this owner holds the lock, as the server sees it (one round trip).

        With ``interop="redis-py"``, redis-py's key must hold its token too (a
        second round trip).
        """
        hold = self._holds.current()
        if hold is None:
            return False
        command = self._rules.registry.command
        token, fence = await command(
            "HMGET",
            self._rules.keys.owner,
            "token",
            "fence",
            name=self.name,
            doing="checking the lock",
        )
        if token is None or to_text(token) != hold.token:
            return False
        if hold.fence and fence is not None and int(fence) != hold.fence:
            return False  # the token's, taken again by another acquisition

        for key in self._rules.outer_keys:  # interop: redis-py's key must hold the token too
            theirs = await command("GET", key, name=self.name, doing="checking redis-py's key")
            if theirs is None or to_text(theirs) != hold.token:
                return False
        return True


class AsyncReentrantLock(AsyncLock):
    """An :class:`AsyncLock` with ``reentrant=True``: its owner may acquire it again.

    Each acquire needs a matching release; the lock is handed on at the last.
    The arguments are :class:`AsyncLock`'s (redis-py's eight first, in order).
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
        *,
        reentrant: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            client,
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            reentrant=reentrant,
            **kwargs,
        )
