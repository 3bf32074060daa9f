"""AsyncLock: a fair, fenced, lease-based lock that never polls.

How it works (each step is one atomic Lua script, see ``tenure/lua``):

* **acquire** takes the lock when it is free and nobody waits, in one round
  trip, and returns a fencing token (a counter that only grows). Otherwise
  the caller joins a FIFO queue with a short waiter lease and blocks on its
  own wake list (BLPOP): no sleep loop.
* **release** hands the lock straight to the first live waiter inside the
  script (so no newcomer can barge in) and pushes the grant onto that
  waiter's wake list: the next waiter learns of the release within about one
  round trip. The handed-over lease is short (``handoff_lease``, 1 s) until
  the new owner's watchdog confirms its full lease, so a waiter that died
  just before its turn delays the queue by at most that.
* A waiter refreshes its place every ``waiter_lease / 2`` (1 s); a waiter
  that died is dropped from the queue within ``waiter_lease`` (2 s). A
  waiter that gives up (timeout, cancellation, error) leaves the queue at
  once and passes on a lock that was handed to it meanwhile.
* Waiters are also woken by the watchdog at their deadline and when the
  owner's lease runs out, because the server's own BLPOP timeout is only as
  precise as its event loop (up to 100 ms late).
* ``timeout=None`` means "held until released": a 30 s lease renewed by the
  watchdog every 10 s, so a crashed holder frees the lock within 30 s. When
  a renewal finds the lock gone, the holder is told (``lost``, ``on_lost``,
  :class:`~tenure.LockLostError` at ``with`` exit, and optionally the body of
  ``async with`` is cancelled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenure._async._leased import AsyncLeased, LeasedScripts
from tenure._async._scripting import AsyncClient
from tenure._clients import translate_error
from tenure._exceptions import LockLostError, LockNotOwnedError
from tenure._lock_core import (
    DEFAULT_HANDOFF_LEASE,
    DEFAULT_WAITER_LEASE,
    LockSettings,
    check_seconds,
    to_text,
)

__all__ = ["AsyncLock", "AsyncReentrantLock"]


class AsyncLock(AsyncLeased):
    """A distributed lock: mutual exclusion, FIFO fairness, fencing, lost-lock notice.

    Arguments follow redis-py's ``Lock`` where they overlap:

    * ``timeout`` — lease in seconds. ``None`` (default): held until
      released, on a 30 s lease the watchdog renews every 10 s.
    * ``sleep`` — accepted for compatibility; tenure never polls.
    * ``blocking`` / ``blocking_timeout`` — defaults for :meth:`acquire`.
      ``blocking_timeout=T`` gives up after T seconds (within ~50 ms).
    * ``thread_local`` — the token belongs to the acquiring thread (sync) or
      task (asyncio); ``False`` lets another thread or task release.
    * ``auto_renew`` — renew the lease in the background (default: only when
      ``timeout`` is None).
    * ``reentrant`` — the owner may acquire again; each acquire needs a release.
    * ``on_lost`` — called with the lock (from the watchdog) when a held lease
      is found lost.
    * ``cancel_on_lost`` — asyncio only: cancel the task in ``async with``
      when its lock is lost; the block then raises :class:`LockLostError`.
    * ``max_hold`` — stop renewing after this many seconds of holding.
    * ``prefix`` — key prefix; keys are ``{prefix}{{{name}}}`` and suffixes.
    * ``waiter_lease`` / ``handoff_lease`` — see the module docstring.
    """

    _scripts = LeasedScripts(
        try_="lock_try",
        acquire="lock_acquire",
        release="lock_release",
        leave="lock_leave",
        extend="lock_extend",
    )
    _not_owned = LockNotOwnedError
    _lost_error = LockLostError
    _noun = "lock"

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        thread_local: bool = True,
        auto_renew: bool | None = None,
        *,
        reentrant: bool = False,
        on_lost: Callable[[AsyncLock], None] | None = None,
        cancel_on_lost: bool = False,
        max_hold: float | None = None,
        prefix: str = "tenure:lock:",
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        handoff_lease: float = DEFAULT_HANDOFF_LEASE,
    ) -> None:
        settings = LockSettings.build(
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            auto_renew=auto_renew,
            reentrant=reentrant,
            max_hold=max_hold,
            waiter_lease=waiter_lease,
            handoff_lease=handoff_lease,
        )
        check_seconds("sleep", sleep, allow_none=False, name=name)
        self._setup(
            client,
            name,
            settings,
            thread_local=thread_local,
            on_lost=on_lost,
            cancel_on_lost=cancel_on_lost,
            prefix=prefix,
        )
        self.timeout = timeout
        self.sleep = sleep

    async def locked(self) -> bool:
        """True if anyone holds the lock (one round trip)."""
        try:
            return bool(await self.client.exists(self._keys.owner))
        except Exception as exc:
            raise translate_error(exc, name=self.name, doing="checking the lock") from exc

    async def owned(self) -> bool:
        """True if this owner holds the lock, as the server sees it (one round trip)."""
        hold = self._slot.get()
        if hold is None:
            return False
        try:
            current = await self.client.hget(self._keys.owner, "token")
        except Exception as exc:
            raise translate_error(exc, name=self.name, doing="checking the lock") from exc
        return current is not None and to_text(current) == hold.token


class AsyncReentrantLock(AsyncLock):
    """An :class:`AsyncLock` with ``reentrant=True``: its owner may acquire it again.

    Each acquire needs a matching release; the lock is handed on at the last.
    """

    def __init__(self, client: AsyncClient, name: str, **kwargs: Any) -> None:
        kwargs.setdefault("reentrant", True)
        super().__init__(client, name, **kwargs)
