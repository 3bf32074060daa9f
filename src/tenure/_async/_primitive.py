"""AsyncLeased: the public face every leased primitive shares, composed of parts.

A leased primitive (a lock, a semaphore, a side of a read-write lock, a
Redlock) is made of four parts, as etcd's concurrency package keeps the
session apart from the mutex:

* its rules (:mod:`tenure._async._rules`): name, keys, settings, script
  calls and errors, one subclass per kind in the kind's own module;
* its holds (:mod:`tenure._async._holds`): who holds what, lost-hold
  notice, counters;
* its lease (:mod:`tenure._async._lease`): taking, renewing, extending;
* its queue (:mod:`tenure._async._queue`, or Redlock's own in
  :mod:`tenure._async._redlock_queue`): how ``acquire`` takes it or waits
  (the :class:`Waiting` protocol).

This class is redis-py's ``Lock`` API over those parts: ``acquire``,
``release``, ``extend``, ``reacquire``, ``local.token``, the settable
``timeout``/``blocking``/``blocking_timeout``, ``with`` blocks. When a
renewal finds the hold gone, the holder is told (``lost``, ``on_lost``,
:class:`~tenure.LockLostError` at ``with`` exit, and optionally the body of
``async with`` is cancelled). Ownership rules: :mod:`tenure._backends.owners`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TypeVar

from tenure._async._holds import AsyncHolds
from tenure._async._lease import AsyncLease
from tenure._async._queue import AsyncQueue
from tenure._async._rules import AsyncRules
from tenure._async._scripting import AsyncClient
from tenure._backends.for_asyncio import (
    CAN_CANCEL_HOLDER,
    TwinHints,
    absorb_guard_cancel,
    refuse_awaited_call,
    shielded,
    start_background,
)
from tenure._core.exceptions import (
    AcquireTimeoutError,
    AlreadyHeldError,
    ArgumentError,
    BackendError,
    NotOwnedError,
)
from tenure._core.leased import (
    NOT_OWNED,
    Hold,
    LockKeys,
    TokenLocal,
    new_attempt,
)
from tenure._core.statistics import (
    LeasedStatistics,
)
from tenure._core.values import check_seconds, to_ms

__all__ = ["AsyncLeased", "Waiting"]

logger = logging.getLogger("tenure.lock")


async def run_to_the_end(
    rules: AsyncRules,
    script: str,
    keys: tuple[str, ...],
    args: tuple[str | int, ...],
    doing: str,
    then: Callable[[Any], None] | None = None,
) -> Any:
    """Run a resend-safe script call shielded from its caller's cancellation; its reply.

    A call cancelled past the shield (a second cancel, or a server silent for
    SPARED_FOR), or interrupted, may not have reached the server (it waited
    for a pooled connection, or reloaded its script): it is finished in the
    background (:func:`_finish_later`), and the cancellation raised. A
    :class:`~tenure.BackendError` is raised as it is.
    """
    try:
        return await shielded(rules.run(script, keys, args))
    except BackendError:
        raise
    except BaseException:
        _finish_later(rules, script, keys, args, doing, then)
        raise


def _finish_later(
    rules: AsyncRules,
    script: str,
    keys: tuple[str, ...],
    args: tuple[str | int, ...],
    doing: str,
    then: Callable[[Any], None] | None = None,
) -> None:
    """Run a (resend-safe) script call again in the background; ``then(reply)`` after.

    For a call its caller stopped waiting for before the server answered: it
    may not have been sent at all. A failure is logged, and what the call was
    to end then ends with its lease.
    """

    async def finish() -> None:
        try:
            reply = await rules.run(script, keys, args)
        except Exception as exc:
            logger.warning(
                "tenure: %s %r: %s, interrupted, could not be finished (%s); "
                "what it was to end ends with its lease",
                rules.noun,
                rules.name,
                doing,
                exc,
            )
            return
        if then is not None:
            then(reply)

    start_background(finish, f"tenure-{doing}")


_P = TypeVar("_P", bound="AsyncLeased")


class Waiting(Protocol):
    """How a primitive waits: :class:`~tenure._async._queue.AsyncQueue`, or Redlock's."""

    async def acquire(
        self, wait: bool, blocking_timeout: float | None, token: str, attempt: str = ""
    ) -> bool:
        """Take it for ``token``, waiting up to ``blocking_timeout`` if ``wait``.

        ``attempt`` is the call's id when the caller chose ``token`` (see
        :meth:`AsyncRules.try_call`), ``""`` for a token of tenure's own.
        """


class AsyncLeased(TwinHints):
    """redis-py's lock API over a primitive's parts; see the module docstring."""

    def __init__(
        self,
        rules: AsyncRules,
        *,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        on_lost: Callable[[Any], None] | None = None,
        cancel_on_lost: bool = False,
        queue: Callable[[AsyncRules, AsyncHolds, AsyncLease], Waiting] = AsyncQueue,
    ) -> None:
        name = rules.name
        if on_lost is not None and not callable(on_lost):
            raise ArgumentError("on_lost", "must be callable", name=name)
        if cancel_on_lost and not CAN_CANCEL_HOLDER:
            raise ArgumentError(
                "cancel_on_lost",
                "threads cannot be cancelled; use on_lost or check .lost",
                name=name,
            )
        self._rules = rules
        self.client = rules.client
        self.name = name
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = bool(raise_on_release_error)
        self._holds = AsyncHolds(
            rules, self, per_owner=thread_local, on_lost=on_lost, cancel_on_lost=cancel_on_lost
        )
        self._lease = AsyncLease(rules, self._holds)
        self._queue = queue(rules, self._holds, self._lease)

    # -- redis-py's attributes -------------------------------------------------------

    @property
    def redis(self) -> AsyncClient:
        """The client (redis-py's name for it)."""
        return self.client

    @property
    def timeout(self) -> float | None:
        """The lease in seconds; None: held until released (a renewed 30 s lease).

        Settable, as in redis-py: the next acquisition takes the new lease,
        and a hold held now gets it at its next renewal (with ``timeout=None``
        renewals run; a fixed lease is not renewed unless ``auto_renew``).
        """
        return self._rules.timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._rules.retime(value)

    @property
    def blocking(self) -> bool:
        """Whether :meth:`acquire` waits by default (settable, as in redis-py)."""
        return self._rules.settings.blocking

    @blocking.setter
    def blocking(self, value: bool) -> None:
        self._rules.set_blocking(value)

    @property
    def blocking_timeout(self) -> float | None:
        """How long :meth:`acquire` waits by default, None: forever (settable)."""
        return self._rules.settings.blocking_timeout

    @blocking_timeout.setter
    def blocking_timeout(self, value: float | None) -> None:
        self._rules.set_blocking_timeout(value)

    @property
    def owner_name(self) -> str:
        """Who holds and waits, as ``tenure inspect`` shows it: ``owner_name=``, or ``host:pid``.

        Stored on the server beside each hold and each place in line, with
        the same expiry; ``host:pid`` is this process's (a forked child's own).
        """
        return self._rules.owner_name

    # -- state -----------------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current owner's hold, or None when not held.

        Tokens grow strictly with every acquisition of this name, across key
        expiry, idle periods and (with AOF) server restarts.
        """
        hold = self._holds.current()
        return None if hold is None or not hold.fence else hold.fence

    @property
    def local(self) -> TokenLocal:
        """redis-py's ``lock.local``: ``local.token`` is the current owner's token.

        Hand a hold to another object (or process) by its token, as with
        redis-py: ``other.local.token = lock.local.token``, then
        ``other.release()`` (or ``extend()``, ``owned()``) acts on that hold.
        Per owner, as ``thread_local`` decides. A hold taken over this way has
        no fencing token here (``fencing_token`` is None) and is not renewed
        by this object: its lease is the one the acquiring side keeps.
        """
        return TokenLocal(self._holds)

    @property
    def lost(self) -> bool:
        """True if the current owner's hold was found lost (or its fixed lease ran out).

        Until it is released (the end of a ``with`` block that raised the
        lost error counts: the hold is let go there), or this owner acquires
        again (a re-entrant lock refuses to re-enter a hold found lost).
        """
        hold = self._holds.current()
        return hold is not None and (hold.lost or self._lease.ran_out(hold))

    @property
    def keys(self) -> LockKeys:
        """The Redis keys this primitive uses."""
        return self._rules.keys

    def statistics(self) -> LeasedStatistics:
        """An immutable snapshot of this object's counters in this process."""
        return self._holds.statistics()

    def __repr__(self) -> str:
        settings = self._rules.settings
        renew = "auto-renew" if settings.auto_renew else "fixed lease"
        return (
            f"<{type(self).__name__} {self.name!r} {self._holds.describe()}, "
            f"lease={settings.lease:g}s {renew}>"
        )

    # -- acquire, release, extend ------------------------------------------------

    # unasync: async-only
    async def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
        *,
        sleep: float | None = None,
    ) -> bool:
        """Acquire; return True if acquired, False if not (non-blocking or timed out).

        The arguments are those of redis-py's asyncio ``Lock.acquire``, in its
        order. A blocking acquire waits in FIFO order and is woken by the
        release that hands it over; ``sleep`` (keyword-only here, first in the
        sync API) is accepted for compatibility and ignored: nothing polls.
        ``token`` overrides tenure's token (unique per acquisition).
        """
        # unasync: sync-only
        # def acquire(
        #     self,
        #     sleep: float | None = None,
        #     blocking: bool | None = None,
        #     blocking_timeout: float | None = None,
        #     token: str | bytes | None = None,
        # ) -> bool:
        #     """Acquire; return True if acquired, False if not (non-blocking or timed out).
        #
        #     The arguments are those of redis-py's ``Lock.acquire``, in its order.
        #     A blocking acquire waits in FIFO order and is woken by the release
        #     that hands it over; ``sleep`` is accepted for compatibility and
        #     ignored: nothing polls. ``token`` overrides tenure's token (unique
        #     per acquisition).
        #     """
        # unasync: end
        # (Only the signature differs between the APIs: one body, one frame.)
        # ``await lock.acquire()`` on a sync lock: refused before anything is taken.
        refuse_awaited_call(type(self).__name__, "acquire", 1)
        rules = self._rules
        settings = rules.settings
        if sleep is not None:
            check_seconds("sleep", sleep, allow_none=False, name=self.name)
        wait = settings.blocking if blocking is None else bool(blocking)
        if blocking_timeout is None:
            blocking_timeout = settings.blocking_timeout
        else:
            blocking_timeout = check_seconds(
                "blocking_timeout", blocking_timeout, allow_none=False, name=self.name, forever=True
            )
        if token is not None:
            token = rules.checked_token(token)
        held = self._holds.peek()
        if held is not None and held.lost and settings.reentrant:
            # Entering again would start a new hold under the outer one, hiding
            # the gap in which this owner did not hold it. (A fixed lease that
            # ran out, judged below, is the throttle idiom: acquired afresh.)
            raise rules.lost_error(
                f"cannot re-enter: this owner's hold of the {rules.noun} was lost; "
                "release it (or leave its with block) before acquiring again",
                name=self.name,
            )
        if held is not None and not held.lost and self._lease.ran_out(held):
            # Acquire, and let the lease run out: the hold ended (told as lost).
            self._holds.mark_lost(held, "its lease ran out before it was released")
        if held is not None and not held.lost:
            if not settings.reentrant:
                if not wait:
                    return False  # as redis-py: held (by this owner), so not acquired
                raise AlreadyHeldError(
                    f"this owner already holds the {rules.noun} (a blocking acquire would "
                    f"wait for itself); {rules.reentry_hint}",
                    name=self.name,
                )
            return await self._lease.reenter(held)
        if held is not None:
            self._holds.forget(held)
        rules.check_owner_free()
        if token is None:
            return await self._queue.acquire(wait, blocking_timeout, rules.new_token())
        # A token of the caller's choosing may be given by two owners at once:
        # the call's own id tells its resend from the second owner's call.
        return await self._queue.acquire(wait, blocking_timeout, token, new_attempt())

    async def release(self) -> None:
        """Release, handing the primitive to the next waiter.

        Raises :class:`LockNotOwnedError` (a redis-py ``LockNotOwnedError``)
        if this owner does not hold it, or if its lease ran out (or it was
        taken) before the release. A call that never left the client (its
        pool had no free connection, or no connection could be opened:
        ``never_sent`` on the error) changes nothing: the hold is still this
        owner's, renewed as before, and ``release()`` can be called again. If
        the call fails once sent (its outcome unknown), the hold is forgotten
        and renewals stop: it is then released or expires within its lease.
        """
        rules = self._rules
        hold = self._holds.current()
        if hold is None:
            raise rules.refused(f"cannot release: this owner does not hold the {rules.noun}")
        if self._holds.leave_inner(hold):
            return
        renewal = hold.renewal
        self._holds.forget(hold)  # stop renewing before it can change hands
        keys, args = rules.release_call(hold.token, hold.fence, hold.call)
        try:
            # (a resent release finds its receipt: safe to finish in the background)
            reply = int(await run_to_the_end(rules, rules.scripts.release, keys, args, "releasing"))
        except BackendError as error:
            if error.never_sent:
                self._lease.resume(hold, renewal)
            raise
        if reply == NOT_OWNED:
            self._holds.found_gone(hold)
            raise rules.refused(f"cannot release: the lease ran out or the {rules.noun} was taken")
        self._holds.released(hold)

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lease (or set it, ``replace_ttl=True``).

        Returns True; raises :class:`LockNotOwnedError` if it is not held.
        """
        check_seconds("additional_time", additional_time, allow_none=False, name=self.name)
        hold = self._require_hold("extend")
        return await self._lease.set(hold, to_ms(additional_time), "set" if replace_ttl else "add")

    async def reacquire(self) -> bool:
        """Reset the lease to the full ``timeout``; raise if not held."""
        hold = self._require_hold("reacquire")
        return await self._lease.set(hold, self._rules.settings.lease_ms, "set")

    def _holding(self) -> bool:
        """Whether the current owner has a live hold here (not lost, its lease not run out)."""
        hold = self._holds.peek()
        return hold is not None and not hold.lost and not self._lease.ran_out(hold)

    def _require_hold(self, action: str) -> Hold:
        hold = self._holds.current()
        if hold is None:
            raise self._rules.refused(
                f"cannot {action}: this owner does not hold the {self._rules.noun}"
            )
        return hold

    # -- context manager -------------------------------------------------------

    async def __aenter__(self: _P) -> _P:
        if not await self.acquire():
            settings = self._rules.settings
            within = (
                f"within {settings.blocking_timeout}s" if settings.blocking else "without waiting"
            )
            raise AcquireTimeoutError(f"could not acquire {within}", name=self.name)
        hold = self._holds.peek()
        if hold is not None:
            hold.guarded = self._holds.cancel_on_lost
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        rules = self._rules
        hold = self._holds.current()
        if hold is None:
            if exc is None:
                where = (
                    "held by the parent of this forked process (a child holds nothing it "
                    "inherited; end it with os._exit() or acquire in it)"
                    if self._holds.forgot_at_fork
                    else "released inside the with block"
                )
                self._release_failed(rules.refused(f"the {rules.noun} was {where}"))
            return
        if hold.lost:
            self._holds.forget(hold)
            if absorb_guard_cancel(hold.holder, exc):
                raise rules.lost_error(
                    f"the {rules.noun} was lost; the block was cancelled", name=self.name
                ) from exc
            if exc is None:
                self._release_failed(
                    rules.lost_error(
                        f"the {rules.noun} was lost while the block ran", name=self.name
                    )
                )
            return
        try:
            await self.release()
        except rules.not_owned as error:
            if exc is None:
                lost = rules.lost_error(
                    f"the {rules.noun} was lost before the block ended", name=self.name
                )
                lost.__cause__ = error
                self._release_failed(lost)

    def _release_failed(self, error: NotOwnedError) -> None:
        """At ``with`` exit: raise ``error``, or log it (``raise_on_release_error=False``)."""
        if self.raise_on_release_error:
            raise error
        logger.warning("tenure: %s", error)
