"""AsyncLeased: the waiting and lease machinery shared by tenure's primitives.

AsyncLock and AsyncSemaphore are thin subclasses: they name their scripts,
add their own arguments, and choose their errors; everything below — the
one-round-trip fast path, the FIFO queue and its wake-ups, the handoff and
its confirmation, renewal by the watchdog, lost-hold notice, cancellation
safety and statistics — is written once here. Described for the lock:

How it works (each step is one atomic Lua script, see ``tenure/lua``):

* **acquire** takes the lock when it is free and nobody waits, in one round
  trip, and returns a fencing token (a counter that only grows). Otherwise
  the caller joins a FIFO queue with a short waiter lease and waits in
  memory: no sleep loop, and none of the user's connections is taken.
* **release** hands the lock straight to the first live waiter inside the
  script (so no newcomer can barge in) and publishes the grant on the
  channel of that waiter's process; its one subscriber connection per server
  (:mod:`tenure._async._wakeups`) hands it to the waiting thread or task, so
  the next waiter learns of the release within about one round trip. The
  handed-over lease is short (``handoff_lease``, 1 s) until the new owner's
  watchdog confirms its full lease, so a waiter that died just before its
  turn delays the queue by at most that.
* A waiter refreshes its place every ``waiter_lease / 2`` (1 s); a waiter
  that died is dropped from the queue within ``waiter_lease`` (2 s). A
  waiter that gives up (timeout, cancellation, error) leaves the queue at
  once and passes on a lock that was handed to it meanwhile.
* Waiters also wake on their own timers: at their deadline, when the
  owner's lease runs out (a crashed owner), and to refresh their place, when
  they re-check with the server (so a lost wake-up message costs at most
  that interval, never the lock).
* ``timeout=None`` means "held until released": a 30 s lease renewed by the
  watchdog every 10 s, so a crashed holder frees the lock within 30 s. When
  a renewal finds the lock gone, the holder is told (``lost``, ``on_lost``,
  :class:`~tenure.LockLostError` at ``with`` exit, and optionally the body of
  ``async with`` is cancelled).
* Cancelling or interrupting ``acquire`` at any point leaves no hold without
  a local owner: each script call runs to its reply, and whatever it took is
  given back before the cancellation goes on.
* Renewals hold only a weak reference to the lock object: a hold whose lock
  object was garbage-collected (nobody can release it any more) is not
  renewed and ends with its lease. Ownership rules: :mod:`tenure._backends.owners`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from tenure._async._line import (
    AsyncLine,
    begin_try,
    end_try,
    line_for,
    start_waiting,
    stop_waiting,
)
from tenure._async._scripting import AsyncClient, registry_for
from tenure._async._wakeups import CONFIRM_TIMEOUT, AsyncWaiter, listen
from tenure._async._watchdog import Job, JobRunner, watchdog
from tenure._backends.for_asyncio import (
    CAN_CANCEL_HOLDER,
    IS_ASYNC,
    Mutex,
    OwnerSlot,
    absorb_guard_cancel,
    cancel_holder,
    current_holder,
    shielded,
)
from tenure._core.clients import require_client
from tenure._core.exceptions import (
    AcquireTimeoutError,
    AlreadyHeldError,
    ArgumentError,
    BackendError,
    LostError,
    NotOwnedError,
    PrimitiveError,
    TenureError,
)
from tenure._core.leased import (
    DEFAULT_HANDOFF_LEASE,
    DEFAULT_WAITER_LEASE,
    IDLE_TTL_MS,
    KEPT,
    NOT_OWNED,
    OWNER_EXPIRY_SLACK,
    RENEW_AT,
    RENEW_RETRY,
    RENEW_RETRY_MIN,
    WAITER_REFRESH,
    Acquired,
    Counters,
    Hold,
    LeasedStatistics,
    LimitMismatch,
    LockKeys,
    LockSettings,
    LockStatistics,
    Queued,
    TokenLocal,
    call_id,
    check_lock_name,
    check_owner_name,
    check_prefix,
    default_owner_name,
    grant_time,
    new_token,
    parse_acquire,
)
from tenure._core.values import check_seconds, to_ms

__all__ = ["AsyncLeased", "LeasedScripts", "extended"]

logger = logging.getLogger("tenure.lock")

_P = TypeVar("_P", bound="AsyncLeased")

Call = tuple[tuple[str, ...], tuple[str | int, ...]]
"""A script call's ``(keys, args)``."""


@dataclass(frozen=True)
class LeasedScripts:
    """The script names of one kind of primitive (same key and reply layouts)."""

    try_: str
    acquire: str
    release: str
    leave: str
    extend: str

    @classmethod
    def of(cls, kind: str) -> LeasedScripts:
        """The scripts ``{kind}_try``, ``{kind}_acquire`` and so on."""
        return cls(*(f"{kind}_{step}" for step in ("try", "acquire", "release", "leave", "extend")))


def _took_lock(reply: Any) -> bool:
    """Whether an acquire script's reply says the caller holds it."""
    return isinstance(parse_acquire(reply), Acquired)


def extended(reply: Any) -> bool:
    """Whether an extend script's reply says the lease was set."""
    return int(reply) > 0


GIVE_UP_PATIENCE = 10.0
"""Seconds a waiter giving up waits for its line's answer before leaving on its own."""


class AsyncLeased:
    """Base of the leased primitives; see the module docstring."""

    _scripts: ClassVar[LeasedScripts]
    _not_owned: ClassVar[type[NotOwnedError]] = NotOwnedError
    _lost_error: ClassVar[type[LostError]] = LostError
    _noun: ClassVar[str] = "lock"
    _reentry_hint: ClassVar[str] = "it is not re-entrant: release it before acquiring again"
    """What an :class:`AlreadyHeldError` suggests: only what this primitive has."""
    _statistics_type: ClassVar[type[LeasedStatistics]] = LockStatistics
    _line_script: ClassVar[str | None] = None
    """The script of a line of waiters per process (:mod:`tenure._async._line`);
    None: each waiter joins and refreshes on its own."""
    _confirm_every_grant: ClassVar[bool] = False
    """Whether a handed-over hold is confirmed before acquire() returns, however fresh."""

    def _setup(
        self,
        client: AsyncClient,
        name: str | bytes,
        *,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        reentrant: bool = False,
        max_hold: float | None = None,
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        handoff_lease: float = DEFAULT_HANDOFF_LEASE,
        thread_local: bool = True,
        on_lost: Callable[[Any], None] | None = None,
        cancel_on_lost: bool = False,
        prefix: str,
        raise_on_release_error: bool = True,
        owner_name: str | None = None,
    ) -> None:
        """Validate the shared arguments and set up the state (called by __init__).

        The defaults are the public constructors' (redis-py's where they overlap).
        """
        name = check_lock_name(name)
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
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        self._owner_name = check_owner_name(owner_name, name)
        check_prefix(prefix, name)
        if on_lost is not None and not callable(on_lost):
            raise ArgumentError("on_lost", "must be callable", name=name)
        if cancel_on_lost and not CAN_CANCEL_HOLDER:
            raise ArgumentError(
                "cancel_on_lost",
                "threads cannot be cancelled; use on_lost or check .lost",
                name=name,
            )
        self._settings = settings
        self.client = client
        self.name = name
        self._timeout = timeout
        self._auto_renew_asked = auto_renew
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = bool(raise_on_release_error)
        self._keys = LockKeys.for_name(prefix, name)
        self._registry = registry_for(client)
        self._slot: OwnerSlot[Hold] = OwnerSlot(per_owner=thread_local)
        self._counters = Counters()
        self._mutex = Mutex()  # the watchdog and the owners' threads share holds and counters
        self._on_lost = on_lost
        self._cancel_on_lost = cancel_on_lost
        self._seen_busy = False  # the last acquire had to wait: skip the fast path
        # Keys held beside the primitive's own (redis-py's key, interop="redis-py"),
        # and how often waiters look while a holder outside tenure holds them.
        self._outer_keys: tuple[str, ...] = ()
        self._outsider_poll = 0.1

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
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        s = self._settings
        settings = LockSettings.build(
            self.name,
            timeout=value,
            blocking=s.blocking,
            blocking_timeout=s.blocking_timeout,
            auto_renew=self._auto_renew_asked,
            reentrant=s.reentrant,
            max_hold=s.max_hold,
            waiter_lease=s.waiter_lease,
            handoff_lease=s.handoff_lease,
        )
        self._check_settings(settings)
        self._settings = settings
        self._timeout = value

    def _check_owner_free(self) -> None:
        """A hook: refuse to wait on a hold this owner has through another object."""

    def _check_settings(self, settings: LockSettings) -> None:
        """A hook: refuse settings a kind cannot work with (a changed ``timeout``)."""

    @property
    def blocking(self) -> bool:
        """Whether :meth:`acquire` waits by default (settable, as in redis-py)."""
        return self._settings.blocking

    @blocking.setter
    def blocking(self, value: bool) -> None:
        self._settings = dataclasses.replace(self._settings, blocking=bool(value))

    @property
    def blocking_timeout(self) -> float | None:
        """How long :meth:`acquire` waits by default, None: forever (settable)."""
        return self._settings.blocking_timeout

    @blocking_timeout.setter
    def blocking_timeout(self, value: float | None) -> None:
        value = check_seconds(
            "blocking_timeout", value, allow_none=True, name=self.name, forever=True
        )
        self._settings = dataclasses.replace(self._settings, blocking_timeout=value)

    @property
    def owner_name(self) -> str:
        """Who holds and waits, as ``tenure inspect`` shows it: ``owner_name=``, or ``host:pid``.

        Stored on the server beside each hold and each place in line, with
        the same expiry; ``host:pid`` is this process's (a forked child's own).
        """
        return self._owner_name or default_owner_name()

    # -- hooks: each kind's script calls (the lock's here) -----------------------

    def _new_token(self) -> str:
        return new_token()

    def _try_call(self, token: str) -> Call:
        k = self._keys
        args = (token, self._settings.lease_ms, IDLE_TTL_MS, self.owner_name)
        return (k.owner, k.queue, k.fence, *self._outer_keys), args

    def _acquire_call(
        self, token: str, waiter_lease_ms: int, reenter: bool, channel: str = ""
    ) -> Call:
        settings = self._settings
        args = (
            token,
            settings.lease_ms,
            waiter_lease_ms,
            self._acquire_argv4(reenter),
            settings.handoff_ms,
            channel,
            IDLE_TTL_MS,
            self.owner_name,
        )
        return self._acquire_keys(), args

    def _acquire_argv4(self, reenter: bool) -> int:
        """ARGV[4] of the acquire script: the lock's re-entry flag."""
        return int(reenter)

    def _acquire_keys(self) -> tuple[str, ...]:
        return (*self._keys.lock, *self._outer_keys)

    def _release_call(self, token: str) -> Call:
        keys = (*self._keys.lock, *self._keys.receipts, *self._outer_keys)
        return keys, (token, self._settings.handoff_ms, IDLE_TTL_MS)

    def _leave_call(self, token: str, mode: str) -> Call:
        keys = (*self._keys.lock, *self._outer_keys)
        return keys, (token, self._settings.handoff_ms, mode, IDLE_TTL_MS)

    def _extend_call(self, token: str, ms: int, mode: str) -> Call:
        keys = (self._keys.owner, *self._keys.receipts, *self._outer_keys)
        return keys, (token, ms, mode, call_id(mode), IDLE_TTL_MS)

    def _took_on_try(self, reply: Any) -> bool:
        """Whether the try script's reply says the lock (a permit) was taken."""
        return self._parse_try(reply) > 0

    def _parse_try(self, reply: Any) -> int:
        """The fencing token the fast path took (> 0), or 0."""
        return int(reply)

    def _limit_mismatch(self, answer: LimitMismatch) -> TenureError:
        return PrimitiveError(f"unexpected reply {answer!r}", name=self.name)

    # -- state -----------------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current owner's hold, or None when not held.

        Tokens grow strictly with every acquisition of this name, across key
        expiry, idle periods and (with AOF) server restarts.
        """
        hold = self._slot.get()
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
        return TokenLocal(self)

    def _current_token(self) -> str | None:
        hold = self._slot.get()
        return None if hold is None else hold.token

    def _take_token(self, value: bytes | str | None) -> None:
        """Make the current owner's hold the one with token ``value`` (None: none)."""
        held = self._slot.get(adopt=False)
        if value is None:
            if held is not None:
                self._forget(held)
            return
        token = self._checked_token(value)
        if held is not None:
            if held.token == token:
                return
            self._forget(held)  # this object no longer tracks it (nor renews it)
        now = time.monotonic()
        hold = Hold(
            token=token, fence=0, acquired_at=now, expires_at=math.inf, holder=current_holder()
        )
        with self._mutex:
            self._slot.set(hold)

    def _checked_token(self, token: object) -> str:
        """A token as the scripts take it: a non-empty str (UTF-8 bytes decoded)."""
        if isinstance(token, bytes):  # redis-py takes bytes tokens too
            try:
                token = token.decode("utf-8")
            except UnicodeDecodeError:
                raise ArgumentError("token", "bytes must be UTF-8", name=self.name) from None
        if not isinstance(token, str) or not token:
            raise ArgumentError("token", "must be a non-empty str", name=self.name)
        return token

    @property
    def lost(self) -> bool:
        """True if the current owner's hold was found lost (or its fixed lease ran out).

        Until it is released, or this owner acquires again.
        """
        hold = self._slot.get()
        return hold is not None and (hold.lost or self._ran_out(hold))

    @property
    def keys(self) -> LockKeys:
        """The Redis keys this primitive uses."""
        return self._keys

    def statistics(self) -> LeasedStatistics:
        """An immutable snapshot of this object's counters in this process."""
        hold = self._slot.get(adopt=False)
        with self._mutex:
            counters = asdict(self._counters)
        return self._statistics_type(
            name=self.name,
            held=hold is not None and not hold.lost,
            fencing_token=None if hold is None or not hold.fence else hold.fence,
            **counters,
            **self._statistics_extra(),
        )

    def _statistics_extra(self) -> dict[str, Any]:
        """The fields a kind's statistics record adds (none for a lock)."""
        return {}

    def __repr__(self) -> str:
        hold = self._slot.get(adopt=False)
        if hold is None:
            state = "not held"
        elif hold.lost:
            state = f"LOST fence={hold.fence}"
        elif not hold.fence:
            state = "held by a token taken over (local.token)"
        else:
            left = max(0.0, hold.expires_at - time.monotonic())
            state = f"held fence={hold.fence} lease~{left:.1f}s"
            if hold.count > 1:
                state += f" count={hold.count}"
        renew = "auto-renew" if self._settings.auto_renew else "fixed lease"
        return (
            f"<{type(self).__name__} {self.name!r} {state}, "
            f"lease={self._settings.lease:g}s {renew}>"
        )

    # -- acquire ---------------------------------------------------------------

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
        ``token`` overrides the random token (unique per acquisition).
        """
        return await self._acquire_as_asked(sleep, blocking, blocking_timeout, token)

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
    #     ignored: nothing polls. ``token`` overrides the random token (unique
    #     per acquisition).
    #     """
    #     return self._acquire_as_asked(sleep, blocking, blocking_timeout, token)
    #
    # unasync: end
    async def _acquire_as_asked(
        self,
        sleep: float | None,
        blocking: bool | None,
        blocking_timeout: float | None,
        token: str | bytes | None,
    ) -> bool:
        settings = self._settings
        if sleep is not None:
            check_seconds("sleep", sleep, allow_none=False, name=self.name, forever=True)
        wait = settings.blocking if blocking is None else bool(blocking)
        if blocking_timeout is None:
            blocking_timeout = settings.blocking_timeout
        else:
            blocking_timeout = check_seconds(
                "blocking_timeout", blocking_timeout, allow_none=False, name=self.name, forever=True
            )
        if token is not None:
            token = self._checked_token(token)
        held = self._slot.get(adopt=False)
        if held is not None and not held.lost and self._ran_out(held):
            # Acquire, and let the lease run out: the hold ended (told as lost).
            self._mark_lost(held, "its lease ran out before it was released")
        if held is not None and not held.lost:
            if not settings.reentrant:
                if not wait:
                    return False  # as redis-py: held (by this owner), so not acquired
                raise AlreadyHeldError(
                    f"this owner already holds the {self._noun} (a blocking acquire would "
                    f"wait for itself); {self._reentry_hint}",
                    name=self.name,
                )
            return await self._reenter(held)
        if held is not None:
            self._forget(held)
        self._check_owner_free()
        return await self._acquire(wait, blocking_timeout, token or self._new_token())

    async def _acquire(self, wait: bool, blocking_timeout: float | None, token: str) -> bool:
        started = time.monotonic()
        deadline = None if blocking_timeout is None else started + blocking_timeout
        holder = current_holder()
        trying = self._may_try(wait)
        # An acquirer allowed to try is counted as this process's first waiter
        # (begin_try); the joins of those who came after it wait until it is
        # in line (end_try), so it stays ahead of them.
        tried = trying if isinstance(trying, tuple) else None
        counted = tried
        in_line = False  # the process's line takes the token out of line if this fails
        try:
            if trying is not False:
                # Free and nobody waiting: one round trip. Skipped while this
                # object keeps finding it busy, or this process's waiters for
                # it are in line (or one of them is trying), where it would be
                # wasted.
                sent = time.monotonic()
                keys, args = self._try_call(token)
                reply = await shielded(
                    self._run_taking(self._scripts.try_, keys, args, self._took_on_try)
                )
                fence = self._parse_try(reply)
                if fence > 0:
                    taken = Acquired(fence=fence, lease_ms=self._settings.lease_ms)
                    self._took(token, taken, sent, started, holder, queued=False)
                    self._seen_busy = False
                    return True
                if not wait:
                    return False
            if self._line_script is None:
                return await self._wait_in_line(token, started, deadline, holder)
            alone = True
            if counted is None:
                counted, alone = start_waiting(self._registry, self._keys.owner)
            if alone:
                return await self._wait_in_line(token, started, deadline, holder, tried)
            in_line = True
            return await self._wait_in_process_line(token, started, deadline, holder)
        except BaseException as exc:
            # Cancelled, interrupted or failed after a script may have taken it
            # (or queued us) for this token: give back whatever it did.
            if not isinstance(exc, PrimitiveError) and not in_line:
                await shielded(self._leave_quietly(token, quiet=isinstance(exc, BackendError)))
            raise
        finally:
            if tried is not None:
                end_try(tried)
            if counted is not None:
                stop_waiting(counted)

    async def _wait_in_line(
        self,
        token: str,
        started: float,
        deadline: float | None,
        holder: object,
        tried: tuple[object, ...] | None = None,
    ) -> bool:
        settings = self._settings
        room = CONFIRM_TIMEOUT if deadline is None else max(0.0, deadline - time.monotonic())
        waiter = await listen(self.client, token, room, self._keys.owner)
        keys, args = self._acquire_call(token, settings.waiter_lease_ms, False, waiter.channel)
        queued = False
        try:
            while True:
                sent = time.monotonic()
                # Plain: a call that queues needs no acknowledgement, and one that
                # takes the lock is confirmed like a handoff (replicated kinds).
                answer = self._answer(await shielded(self._run(self._scripts.acquire, keys, args)))
                if tried is not None:
                    end_try(tried)  # in line (or holding): the joins behind may go
                    tried = None
                if isinstance(answer, Acquired):
                    confirmed = await self._confirm_grant(token, answer, sent)
                    if confirmed is None:
                        continue  # lapsed before it was confirmed: ask again
                    self._took(token, confirmed[0], confirmed[1], started, holder, queued)
                    self._seen_busy = queued
                    return True
                if not queued:
                    queued = True
                    self._seen_busy = True
                    with self._mutex:
                        self._counters.waiters += 1
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return await self._give_up(token, started, holder)
                # Wake at the first of: a grant, our deadline, the owner's lease
                # running out (a crashed owner), the time to refresh our place.
                wake_at = now + settings.waiter_lease * WAITER_REFRESH
                if answer.owner_ttl_ms >= 0:
                    wake_at = min(wake_at, now + answer.owner_ttl_ms / 1000 + OWNER_EXPIRY_SLACK)
                if answer.outsider:  # its release is announced to nobody: look again
                    wake_at = min(wake_at, now + self._outsider_poll)
                if deadline is not None:
                    wake_at = min(wake_at, deadline)
                granted = await waiter.wait(wake_at - now)
                if granted is not None:
                    at = grant_time(sent, answer, granted)
                    confirmed = await self._confirm_grant(token, granted, at)
                    if confirmed is None:
                        continue  # the handoff lapsed before it was confirmed: wait on
                    self._took(token, confirmed[0], confirmed[1], started, holder, queued)
                    return True
        finally:
            waiter.stop()
            if queued:
                with self._mutex:
                    self._counters.waiters -= 1

    async def _wait_in_process_line(
        self, token: str, started: float, deadline: float | None, holder: object
    ) -> bool:
        """Wait in this process's line for the lock (:mod:`tenure._async._line`).

        The line joins, refreshes and re-checks for every waiter of the process
        at once; this waiter only waits for its grant (on the wake-up channel,
        or named by a round's answer), or its deadline.
        """
        # The line waits for the wake-up subscription before it joins anyone.
        waiter = await listen(self.client, token, 0.0, self._keys.owner, confirm=False)
        line = self._line(waiter.channel)
        while not line.join(waiter, self.owner_name):
            line = self._line(waiter.channel)  # it closed just now: a new one
        self._seen_busy = True
        with self._mutex:
            self._counters.waiters += 1
        left = True
        try:
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return await self._give_up_in_line(line, waiter, started, holder)
                granted = await waiter.wait(None if deadline is None else deadline - now)
                if granted is None:
                    if waiter.recheck:
                        # Woken to re-check (the wake-up connection came back: a
                        # grant may have gone out unheard, and lapsed): join again,
                        # which keeps the place of a waiter still in line.
                        waiter.recheck = False
                        line.join(waiter, self.owner_name)
                    continue
                confirmed = await self._confirm_grant(token, granted, line.local_time(granted))
                if confirmed is None:
                    line.join(waiter, self.owner_name)  # the handoff lapsed: in line again
                    continue
                self._took(token, confirmed[0], confirmed[1], started, holder, queued=True)
                return True
        except BaseException:
            # Out of line through the line itself: after its join (which may
            # still be on its way), passing on what was handed to it.
            left = False
            raise
        finally:
            waiter.stop()
            line.done(token, left=left)
            with self._mutex:
                self._counters.waiters -= 1

    async def _give_up_in_line(
        self, line: AsyncLine, waiter: AsyncWaiter, started: float, holder: object
    ) -> bool:
        """The deadline passed: leave the line with the others giving up (one call).

        A lock (or permit) handed over meanwhile is kept and confirmed, as
        :meth:`_give_up` does for a lone waiter.
        """
        line.give_up(waiter)
        patience = time.monotonic() + GIVE_UP_PATIENCE
        while True:
            # The line's round answers (a grant kept, then dismissed), or fails
            # (raised here); a grant heard on the channel may come first.
            granted = await waiter.wait(max(0.0, patience - time.monotonic()))
            if granted is not None:
                at = line.local_time(granted)
                if await self._keep_handed(waiter.token, granted, at, started, holder):
                    return True
            if waiter.dismissed:
                return self._timed_out()
            if time.monotonic() >= patience:
                # The line never answered (its job ended): leave on our own.
                return await self._give_up(waiter.token, started, holder)
            waiter.recheck = False

    def _may_try(self, wait: bool) -> tuple[object, ...] | bool | None:
        """Whether to try before queueing.

        False: queue at once; None: try; a key: try, then :func:`end_try` it
        (other waiting acquirers of this process queue meanwhile).
        """
        if not wait:
            return None
        if self._seen_busy:
            return False
        if self._line_script is None:
            return None
        key = begin_try(self._registry, self._keys.owner)
        return False if key is None else key

    def _line(self, channel: str) -> AsyncLine:
        settings = self._settings
        assert self._line_script is not None
        keys, own_args = self._line_call()
        return line_for(
            self._registry,
            self._line_script,
            keys,
            own_args,
            channel,
            settings.waiter_lease_ms,
            settings.handoff_ms,
            self.name,
            self._line_refusal,
            self._outsider_poll,
        )

    def _line_call(self) -> tuple[tuple[str, ...], tuple[str | int, ...]]:
        """The line script's keys and this primitive's own arguments of it (``LINE_SCRIPTS``)."""
        return (*self._keys.lock, *self._outer_keys), ()

    def _line_refusal(self, stored_limit: int) -> TenureError:
        """The error of a line whose script refused this primitive's limit (semaphores)."""
        return self._limit_mismatch(LimitMismatch(stored=stored_limit))

    def _answer(self, reply: Any) -> Acquired | Queued:
        answer = parse_acquire(reply)
        if isinstance(answer, LimitMismatch):
            raise self._limit_mismatch(answer)
        return answer

    async def _reenter(self, hold: Hold) -> bool:
        """Enter a hold again: the count is kept here; the server checks the hold, resets its lease.

        Nothing is counted on the server, so a resent call, a cancelled one or
        one whose replicas fell short leaves nothing to take back.
        """
        sent = time.monotonic()
        keys, args = self._acquire_call(hold.token, 0, reenter=True)
        answer = self._answer(
            await shielded(self._run_taking(self._scripts.acquire, keys, args, _took_lock))
        )
        if not isinstance(answer, Acquired):
            self._mark_lost(hold)
            raise self._not_owned(f"re-entry found the {self._noun} lost", name=self.name)
        with self._mutex:
            hold.count += 1
            hold.expires_at = sent + answer.lease_ms / 1000
        return True

    async def _give_up(self, token: str, started: float, holder: object) -> bool:
        """The deadline passed: leave the queue, unless it was handed over meanwhile."""
        sent = time.monotonic()
        keys, args = self._leave_call(token, "keep")
        reply = await shielded(self._run(self._scripts.leave, keys, args))
        if int(reply[0]) == KEPT:
            granted = Acquired(fence=int(reply[1]), lease_ms=max(1, int(reply[2])))
            if await self._keep_handed(token, granted, sent, started, holder):
                return True
        return self._timed_out()

    async def _keep_handed(
        self, token: str, granted: Acquired, at: float, started: float, holder: object
    ) -> bool:
        """A waiter giving up was handed the lock meanwhile: keep it if it is confirmed."""
        confirmed = await self._confirm_grant(token, granted, at)
        if confirmed is None:
            return False
        self._took(token, confirmed[0], confirmed[1], started, holder, queued=True)
        return True

    def _timed_out(self) -> bool:
        """Count a waiter that gave up at its deadline; False, what ``acquire()`` returns."""
        with self._mutex:
            self._counters.timeouts += 1
        return False

    async def _leave_quietly(self, token: str, quiet: bool = False) -> bool:
        """Leave the queue and give back anything taken for ``token``.

        Returns False if the server could not be told (the waiter lease then
        drops us from the queue within ``waiter_lease``, a taken lease ends
        with its lease).
        """
        try:
            keys, args = self._leave_call(token, "pass")
            await self._run(self._scripts.leave, keys, args)
        except TenureError as exc:
            log = logger.debug if quiet else logger.warning
            log("tenure: could not leave the queue of %r: %s", self.name, exc)
            return False
        return True

    def _took(
        self,
        token: str,
        answer: Acquired,
        sent: float,
        started: float,
        holder: object,
        queued: bool,
    ) -> None:
        now = time.monotonic()
        hold = Hold(
            token=token,
            fence=answer.fence,
            acquired_at=now,
            expires_at=sent + answer.lease_ms / 1000,
            holder=holder,
            waited=now - started,
        )
        settings = self._settings
        with self._mutex:
            self._slot.set(hold)
            self._counters.record_acquired(hold.waited, contended=queued)
            if answer.lease_ms < settings.lease_ms:
                # Handed over on a short lease: confirm the full lease at a third
                # of it. A short hold is released before then and never pays.
                self._schedule_renewal(hold, sent + answer.lease_ms / 1000 * RENEW_AT)
            elif settings.auto_renew or settings.max_hold is not None:
                self._schedule_renewal(hold, sent + settings.lease * RENEW_AT)

    # -- renewal ---------------------------------------------------------------

    def _schedule_renewal(self, hold: Hold, due: float) -> None:
        ms = self._renewal_ms(hold)
        if ms is None:
            return
        me = weakref.ref(self)  # a lock object nobody holds any more is not renewed
        kind = type(self).__name__

        def wanted() -> bool:
            if me() is not None:
                return True
            logger.warning(
                "tenure: a %s of %r was garbage-collected while held; it ends with its lease",
                kind,
                job.name,
            )
            return False

        def on_result(reply: Any, error: BaseException | None) -> float | None:
            lock = me()
            return None if lock is None else lock._renewed(hold, job, reply, error)

        keys, args = self._extend_call(hold.token, ms, "set")
        job = Job(
            due=due,
            client=self.client,
            script=self._scripts.extend,
            keys=keys,
            args=args,
            on_result=on_result,
            name=self.name,
            slack=(due - time.monotonic()) / 2,
            runner=self._renewal_runner(hold),
            wanted=wanted,
        )
        hold.renewal = watchdog().schedule(job)

    def _renewal_ms(self, hold: Hold) -> int | None:
        """The lease the next renewal sets, or None once ``max_hold`` is used up."""
        lease_ms = self._settings.lease_ms
        max_hold = self._settings.max_hold
        if max_hold is None:
            return lease_ms
        left = hold.acquired_at + max_hold - time.monotonic()
        if left <= 0:
            return None
        return min(lease_ms, to_ms(left))

    def _renewed(
        self, hold: Hold, job: Job, reply: Any, error: BaseException | None
    ) -> float | None:
        """Handle a renewal's outcome; return when the next one is due (or None)."""
        with self._mutex:
            if not self._slot.holds(hold) or hold.renewal is not job:
                return None  # released (or replaced) while the renewal was in flight
            if job.args[0] != hold.token:
                # The hold changed its token while the renewal was in flight (a
                # write lock downgraded): renew under the new token now.
                job.args = self._extend_call(hold.token, int(job.args[1]), "set")[1]
                return time.monotonic()
            next_due, lost = self._next_renewal(hold, job, reply, error)
        if lost:
            self._mark_lost(hold)
        return next_due

    def _next_renewal(
        self, hold: Hold, job: Job, reply: Any, error: BaseException | None
    ) -> tuple[float | None, bool]:
        """When the next renewal is due (None: no more), and whether the hold was lost."""
        now = time.monotonic()
        settings = self._settings
        if error is not None:
            if now >= hold.expires_at:
                return None, True
            logger.warning("tenure: renewing %r failed, retrying: %s", self.name, error)
            retry = max(RENEW_RETRY_MIN, settings.lease * RENEW_RETRY)
            return min(hold.expires_at, now + retry), False
        granted_ms = int(reply)
        if granted_ms <= 0:
            return None, True
        self._counters.renewals += 1
        # The job was sent no earlier than it was due: a conservative expiry.
        hold.expires_at = job.due + granted_ms / 1000
        if not settings.auto_renew and settings.max_hold is None:
            return None, False
        ms = self._renewal_ms(hold)
        if ms is None:
            return None, False
        job.args = self._extend_call(hold.token, ms, "set")[1]
        return now + ms / 1000 * RENEW_AT, False

    def _ran_out(self, hold: Hold) -> bool:
        """Whether ``hold``'s lease ran out: a fixed lease (or one past ``max_hold``) ended.

        A lease the watchdog renews for ever is not judged here: its renewal
        tells when it is lost.
        """
        settings = self._settings
        if settings.auto_renew and settings.max_hold is None:
            return False
        return time.monotonic() >= hold.expires_at

    def _mark_lost(self, hold: Hold, why: str = "it was lost while held") -> None:
        """Record that ``hold`` was lost while held (only a live hold, once)."""
        with self._mutex:
            if hold.lost or not self._slot.holds(hold):
                return
            hold.lost = True
            self._counters.lost += 1
        logger.warning("tenure: %s %r: %s (fence %s)", self._noun, self.name, why, hold.fence)
        if self._cancel_on_lost and hold.guarded:
            cancel_holder(hold.holder)
        if self._on_lost is not None:
            self._on_lost(self)

    def _forget(self, hold: Hold) -> None:
        with self._mutex:
            if hold.renewal is not None:
                watchdog().cancel(hold.renewal)
                hold.renewal = None
            self._slot.clear(hold)

    # -- release, extend -------------------------------------------------------

    async def release(self) -> None:
        """Release, handing the primitive to the next waiter.

        Raises :class:`LockNotOwnedError` (a redis-py ``LockNotOwnedError``)
        if this owner does not hold it, or if its lease ran out (or it was
        taken) before the release. If the call fails on the network, the hold
        is forgotten and renewals stop: it is then released or expires within
        its lease.
        """
        hold = self._slot.get()
        if hold is None:
            raise self._not_owned(
                f"cannot release: this owner does not hold the {self._noun}", name=self.name
            )
        with self._mutex:
            inner = hold.count > 1 and not hold.lost
            if inner:
                hold.count -= 1  # an inner release: the outer hold goes on
        if inner:
            return
        self._forget(hold)  # stop renewing before it can change hands
        keys, args = self._release_call(hold.token)
        reply = int(await shielded(self._run(self._scripts.release, keys, args)))
        if reply == NOT_OWNED:
            with self._mutex:
                if not hold.lost:
                    hold.lost = True
                    self._counters.lost += 1
            raise self._not_owned(
                f"cannot release: the lease ran out or the {self._noun} was taken", name=self.name
            )
        with self._mutex:
            self._counters.record_released(hold)

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lease (or set it, ``replace_ttl=True``).

        Returns True; raises :class:`LockNotOwnedError` if it is not held.
        """
        check_seconds("additional_time", additional_time, allow_none=False, name=self.name)
        hold = self._require_hold("extend")
        return await self._set_lease(hold, to_ms(additional_time), "set" if replace_ttl else "add")

    async def reacquire(self) -> bool:
        """Reset the lease to the full ``timeout``; raise if not held."""
        hold = self._require_hold("reacquire")
        return await self._set_lease(hold, self._settings.lease_ms, "set")

    async def _set_lease(self, hold: Hold, ms: int, mode: str) -> bool:
        sent = time.monotonic()
        keys, args = self._extend_call(hold.token, ms, mode)
        reply = int(await self._run_taking(self._scripts.extend, keys, args, extended))
        if reply <= 0:
            self._mark_lost(hold)
            raise self._not_owned(
                f"the {self._noun} is no longer held by this owner", name=self.name
            )
        with self._mutex:
            hold.expires_at = sent + reply / 1000
        return True

    def _require_hold(self, action: str) -> Hold:
        hold = self._slot.get()
        if hold is None:
            raise self._not_owned(
                f"cannot {action}: this owner does not hold the {self._noun}", name=self.name
            )
        return hold

    async def owned(self) -> bool:
        """True if this owner holds it, as the server sees it (one round trip)."""
        hold = self._slot.get()
        if hold is None:
            return False
        score = await self._registry.command(
            "ZSCORE",
            self._keys.owner,
            hold.token,
            name=self.name,
            doing=f"checking the {self._noun}",
        )
        return score is not None

    async def _run(self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Any:
        return await self._registry.run(script, keys, args, name=self.name)

    async def _run_taking(
        self,
        script: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        took: Callable[[Any], bool],
    ) -> Any:
        """Run a script that may take or extend a hold (``took(reply)`` says if it did).

        A hook: replica-acknowledged kinds wait for their replicas here and
        raise :class:`~tenure.ReplicationError` when a taking call fell short.
        """
        return await self._run(script, keys, args)

    async def _confirm_grant(
        self, token: str, granted: Acquired, at: float
    ) -> tuple[Acquired, float] | None:
        """Make a hold handed over by another's release (at ``at``) this owner's own.

        Returns the hold's answer and when its lease started, or None if it
        lapsed first. A fresh grant is taken as granted: the watchdog confirms
        the full lease at a third of the handoff lease, as it would renew,
        and a hold found gone then is reported lost. A grant this owner saw
        late (its process or event loop was busy, or stopped) is confirmed
        now, before ``acquire()`` returns: its short lease may have run out
        and the lock gone to the next waiter. Replica-acknowledged kinds
        confirm every grant now.
        """
        seen_after = time.monotonic() - at
        if not self._confirm_every_grant and seen_after < granted.lease_ms / 1000 * RENEW_AT:
            return granted, at
        sent = time.monotonic()
        confirmed = await self._confirm_now(token, granted)
        return None if confirmed is None else (confirmed, sent)

    async def _confirm_now(self, token: str, granted: Acquired) -> Acquired | None:
        """Set the full lease of a hold handed to ``token``; its answer, or None if it lapsed.

        The lock's: its acquire script, re-entering, which checks that the
        token holds, sets the lease, and answers the hold's fence as the
        server has it -- newer than ``granted``'s if the token was handed the
        lock again since (its line joined it again).
        """
        keys, args = self._acquire_call(token, 0, reenter=True)
        reply = await self._run_taking(self._scripts.acquire, keys, args, _took_lock)
        answer = self._answer(reply)
        return answer if isinstance(answer, Acquired) else None

    def _renewal_runner(self, hold: Hold) -> JobRunner | None:
        """A hook: how the watchdog runs ``hold``'s renewals (None: batched EVALSHA)."""
        return None

    # -- context manager -------------------------------------------------------

    async def __aenter__(self: _P) -> _P:
        if not await self.acquire():
            settings = self._settings
            within = (
                f"within {settings.blocking_timeout}s" if settings.blocking else "without waiting"
            )
            raise AcquireTimeoutError(f"could not acquire {within}", name=self.name)
        hold = self._slot.get(adopt=False)
        if hold is not None:
            hold.guarded = self._cancel_on_lost
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._slot.get()
        if hold is None:
            if exc is None:
                where = (
                    "held by the parent of this forked process (a child holds nothing it "
                    "inherited; end it with os._exit() or acquire in it)"
                    if self._slot.forgot_at_fork
                    else "released inside the with block"
                )
                self._release_failed(
                    self._not_owned(f"the {self._noun} was {where}", name=self.name)
                )
            return
        if hold.lost:
            self._forget(hold)
            if absorb_guard_cancel(hold.holder, exc):
                raise self._lost_error(
                    f"the {self._noun} was lost; the block was cancelled", name=self.name
                ) from exc
            if exc is None:
                self._release_failed(
                    self._lost_error(
                        f"the {self._noun} was lost while the block ran", name=self.name
                    )
                )
            return
        try:
            await self.release()
        except self._not_owned as error:
            if exc is None:
                lost = self._lost_error(
                    f"the {self._noun} was lost before the block ended", name=self.name
                )
                lost.__cause__ = error
                self._release_failed(lost)

    def _release_failed(self, error: NotOwnedError) -> None:
        """At ``with`` exit: raise ``error``, or log it (``raise_on_release_error=False``)."""
        if self.raise_on_release_error:
            raise error
        logger.warning("tenure: %s", error)
