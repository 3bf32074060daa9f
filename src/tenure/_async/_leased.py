"""AsyncLeased: the waiting and lease machinery shared by tenure's primitives.

AsyncLock and AsyncSemaphore are thin subclasses: they name their scripts,
add their own arguments, and choose their errors; everything below — the
one-round-trip fast path, the FIFO queue and its wake-ups, the handoff and
its confirmation, renewal by the watchdog, lost-hold notice, cancellation
safety and statistics — is written once here. Described for the lock:

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

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, ClassVar, TypeVar

from tenure._async._scripting import AsyncClient, registry_for
from tenure._async._watchdog import Job, watchdog
from tenure._backend_asyncio import (
    CAN_CANCEL_HOLDER,
    IS_ASYNC,
    OwnerSlot,
    absorb_guard_cancel,
    cancel_holder,
    current_holder,
    shielded,
)
from tenure._clients import require_client, translate_error
from tenure._exceptions import (
    AcquireTimeoutError,
    AlreadyHeldError,
    ArgumentError,
    LostError,
    NotOwnedError,
    TenureError,
)
from tenure._lock_core import (
    Acquired,
    Counters,
    Hold,
    LockKeys,
    LockSettings,
    LockStatistics,
    check_seconds,
    grant_time,
    new_token,
    parse_acquire,
    parse_wake,
    to_ms,
)

__all__ = ["AsyncLeased", "LeasedScripts"]

logger = logging.getLogger("tenure.lock")

_P = TypeVar("_P", bound="AsyncLeased")

_WAKE_SAFETY = 0.25  # the server's BLPOP timeout backs up the watchdog's wake-up by this much
_WAKE_TTL_MS = 10_000


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


class AsyncLeased:
    """Base of the leased primitives; see the module docstring."""

    _scripts: ClassVar[LeasedScripts]
    _not_owned: ClassVar[type[NotOwnedError]] = NotOwnedError
    _lost_error: ClassVar[type[LostError]] = LostError
    _noun: ClassVar[str] = "lock"

    def _setup(
        self,
        client: AsyncClient,
        name: str,
        *,
        timeout: float | None,
        blocking: bool,
        blocking_timeout: float | None,
        auto_renew: bool | None,
        reentrant: bool,
        max_hold: float | None,
        waiter_lease: float,
        handoff_lease: float,
        thread_local: bool,
        on_lost: Callable[[Any], None] | None,
        cancel_on_lost: bool,
        prefix: str,
    ) -> None:
        """Validate the shared arguments and set up the state (called by __init__)."""
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
        if not isinstance(prefix, str):
            raise ArgumentError("prefix", f"must be a str, got {type(prefix).__name__}", name=name)
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
        self._keys = LockKeys.for_name(prefix, name)
        keys = self._keys
        self._release_keys = (keys.owner, keys.queue, keys.waiters, keys.fence)
        self._try_keys = (keys.owner, keys.queue, keys.fence)
        self._registry = registry_for(client)
        self._slot: OwnerSlot[Hold] = OwnerSlot(per_owner=thread_local)
        self._counters = Counters()
        self._on_lost = on_lost
        self._cancel_on_lost = cancel_on_lost
        self._seen_busy = False  # the last acquire had to wait: skip the fast path

    # -- hooks: the arguments each kind adds to its scripts ------------------------

    def _new_token(self) -> str:
        return new_token()

    def _try_args(self, token: str) -> tuple[str | int, ...]:
        return (token, self._settings.lease_ms)

    def _acquire_extra(self, reenter: bool) -> int:
        """ARGV[4] of the acquire script."""
        return int(reenter)

    def _release_args(self, token: str) -> tuple[str | int, ...]:
        return (token, self._settings.handoff_ms)

    def _leave_args(self, token: str, mode: str) -> tuple[str | int, ...]:
        return (token, self._settings.handoff_ms, mode)

    # -- state -----------------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current owner's hold, or None when not held.

        Tokens grow strictly with every acquisition of this lock name, across
        key expiry and (with AOF) server restarts.
        """
        hold = self._slot.get()
        return None if hold is None else hold.fence

    @property
    def lost(self) -> bool:
        """True if the current owner's hold was found lost and not yet released."""
        hold = self._slot.get()
        return hold is not None and hold.lost

    @property
    def keys(self) -> LockKeys:
        """The Redis keys this lock uses."""
        return self._keys

    def statistics(self) -> LockStatistics:
        """Counters of this lock object in this process (see :class:`LockStatistics`)."""
        hold = self._slot.get()
        return LockStatistics(
            name=self.name,
            held=hold is not None and not hold.lost,
            fencing_token=None if hold is None else hold.fence,
            **asdict(self._counters),
        )

    def __repr__(self) -> str:
        hold = self._slot.get()
        if hold is None:
            state = "not held"
        elif hold.lost:
            state = f"LOST fence={hold.fence}"
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

    async def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | None = None,
    ) -> bool:
        """Acquire the lock; return True if acquired, False if not (non-blocking or timed out).

        A blocking acquire waits in FIFO order. ``token`` overrides the random
        token (it must be unique per acquisition).
        """
        settings = self._settings
        wait = settings.blocking if blocking is None else bool(blocking)
        if blocking_timeout is None:
            blocking_timeout = settings.blocking_timeout
        else:
            check_seconds("blocking_timeout", blocking_timeout, allow_none=False, name=self.name)
        if token is not None and (not isinstance(token, str) or not token):
            raise ArgumentError("token", "must be a non-empty str", name=self.name)
        held = self._slot.get()
        if held is not None and not held.lost:
            if not settings.reentrant:
                raise AlreadyHeldError(
                    f"this owner already holds the {self._noun}; pass reentrant=True to re-enter",
                    name=self.name,
                )
            return await self._reenter(held)
        if held is not None:
            self._forget(held)
        return await self._acquire(wait, blocking_timeout, token or self._new_token())

    async def _acquire(self, wait: bool, blocking_timeout: float | None, token: str) -> bool:
        settings = self._settings
        started = time.monotonic()
        deadline = None if blocking_timeout is None else started + blocking_timeout
        holder = current_holder()
        if not (wait and self._seen_busy):
            # Free and nobody waiting: one round trip. Skipped while this lock
            # object keeps finding the lock busy, where it would be wasted.
            sent = time.monotonic()
            fence = int(await self._run(self._scripts.try_, self._try_keys, self._try_args(token)))
            if fence > 0:
                taken = Acquired(fence=fence, lease_ms=settings.lease_ms)
                self._took(token, taken, sent, started, holder, queued=False)
                self._seen_busy = False
                return True
            if not wait:
                return False
        keys = self._acquire_keys(token)
        args = (
            token,
            settings.lease_ms,
            settings.waiter_lease_ms if wait else 0,
            self._acquire_extra(False),
            settings.handoff_ms,
        )
        queued = False
        try:
            while True:
                sent = time.monotonic()
                answer = parse_acquire(await self._run(self._scripts.acquire, keys, args))
                if isinstance(answer, Acquired):
                    self._took(token, answer, sent, started, holder, queued)
                    self._seen_busy = queued
                    return True
                if not queued:
                    queued = True
                    self._seen_busy = True
                    self._counters.waiters += 1
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return await self._give_up(token, started, holder)
                # Wake at the first of: our deadline, the owner's lease running
                # out (a crashed owner), the time to refresh our place in line.
                refresh_at = now + settings.waiter_lease * 0.4
                wake_at = refresh_at
                if answer.owner_ttl_ms >= 0:
                    wake_at = min(wake_at, now + answer.owner_ttl_ms / 1000 + 0.002)
                if deadline is not None:
                    wake_at = min(wake_at, deadline)
                granted = await self._wait(token, wake_at, precise=wake_at < refresh_at)
                if granted is not None:
                    at = grant_time(sent, answer, granted)
                    self._took(token, granted, at, started, holder, queued)
                    return True
        except BaseException:
            if wait:
                await shielded(self._leave_quietly(token))
            raise
        finally:
            if queued:
                self._counters.waiters -= 1

    async def _reenter(self, hold: Hold) -> bool:
        settings = self._settings
        sent = time.monotonic()
        args = (hold.token, settings.lease_ms, 0, self._acquire_extra(True), settings.handoff_ms)
        answer = parse_acquire(
            await self._run(self._scripts.acquire, self._acquire_keys(hold.token), args)
        )
        if not isinstance(answer, Acquired):
            self._mark_lost(hold)
            raise self._not_owned(f"re-entry found the {self._noun} lost", name=self.name)
        hold.count += 1
        hold.expires_at = sent + answer.lease_ms / 1000
        return True

    def _acquire_keys(self, token: str) -> tuple[str, str, str, str, str]:
        k = self._keys
        return (k.owner, k.queue, k.waiters, k.fence, k.wake(token))

    async def _wait(self, token: str, wake_at: float, precise: bool) -> Acquired | None:
        """Block until woken: by a release's grant, or at ``wake_at``.

        The server's BLPOP timeout can be up to 100 ms late, which is fine
        for refreshing our place in line; a ``precise`` wake-up (a deadline,
        an owner's lease running out) is pushed by the watchdog instead.
        """
        wake_key = self._keys.wake(token)
        dog = watchdog()
        poke = None
        if precise:
            poke = dog.schedule(
                Job(
                    due=wake_at,
                    client=self.client,
                    script="wake",
                    keys=(wake_key,),
                    args=("wake", _WAKE_TTL_MS),
                    on_result=_ignore,
                    name=self.name,
                )
            )
        timeout = max(0.05, wake_at - time.monotonic()) + (_WAKE_SAFETY if precise else 0.0)
        try:
            reply = await self.client.blpop([wake_key], timeout=timeout)
        except Exception as exc:
            raise translate_error(
                exc, name=self.name, doing=f"waiting for the {self._noun}"
            ) from exc
        finally:
            dog.cancel(poke)
        if not reply:
            return None
        return parse_wake(reply[1])

    async def _give_up(self, token: str, started: float, holder: object) -> bool:
        """The deadline passed: leave the queue, unless the lock was handed over meanwhile."""
        sent = time.monotonic()
        reply = await shielded(
            self._run(
                self._scripts.leave, self._acquire_keys(token), self._leave_args(token, "keep")
            )
        )
        if int(reply[0]) == 1:
            granted = Acquired(fence=int(reply[1]), lease_ms=max(1, int(reply[2])))
            self._took(token, granted, sent, started, holder, queued=True)
            return True
        self._counters.timeouts += 1
        return False

    async def _leave_quietly(self, token: str) -> bool:
        """Leave the queue after a failure or cancellation; pass on a lock handed to us.

        Returns False if the server could not be told (the waiter lease then
        drops us from the queue within ``waiter_lease``).
        """
        try:
            keys = self._acquire_keys(token)
            await self._run(self._scripts.leave, keys, self._leave_args(token, "pass"))
        except TenureError as exc:
            logger.warning("tenure: could not leave the queue of %r: %s", self.name, exc)
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
        self._slot.set(hold)
        self._counters.record_acquired(hold.waited, contended=queued)
        settings = self._settings
        if answer.lease_ms < settings.lease_ms:
            # Handed over on a short lease: confirm the full lease at a third of
            # it. A short hold is released before then and never pays for it.
            self._schedule_renewal(hold, sent + answer.lease_ms / 3000)
        elif settings.auto_renew or settings.max_hold is not None:
            self._schedule_renewal(hold, sent + settings.lease / 3)

    # -- renewal ---------------------------------------------------------------

    def _schedule_renewal(self, hold: Hold, due: float) -> None:
        ms = self._renewal_ms(hold)
        if ms is None:
            return

        def on_result(reply: Any, error: BaseException | None) -> float | None:
            return self._renewed(hold, job, reply, error)

        job = Job(
            due=due,
            client=self.client,
            script=self._scripts.extend,
            keys=(self._keys.owner,),
            args=(hold.token, ms, "set"),
            on_result=on_result,
            name=self.name,
            slack=(due - time.monotonic()) / 2,
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
        now = time.monotonic()
        settings = self._settings
        if error is not None:
            if now >= hold.expires_at:
                self._mark_lost(hold)
                return None
            logger.warning("tenure: renewing %r failed, retrying: %s", self.name, error)
            return min(hold.expires_at, now + max(0.05, settings.lease / 10))
        granted_ms = int(reply)
        if granted_ms <= 0:
            self._mark_lost(hold)
            return None
        self._counters.renewals += 1
        # The job was sent no earlier than it was due: a conservative expiry.
        hold.expires_at = job.due + granted_ms / 1000
        if not settings.auto_renew and settings.max_hold is None:
            return None
        ms = self._renewal_ms(hold)
        if ms is None:
            return None
        job.args = (hold.token, ms, "set")
        return now + ms / 3000

    def _mark_lost(self, hold: Hold) -> None:
        if hold.lost:
            return
        hold.lost = True
        self._counters.lost += 1
        logger.warning("tenure: lock %r was lost while held (fence %s)", self.name, hold.fence)
        if self._cancel_on_lost and hold.guarded:
            cancel_holder(hold.holder)
        if self._on_lost is not None:
            self._on_lost(self)

    def _forget(self, hold: Hold) -> None:
        if hold.renewal is not None:
            watchdog().cancel(hold.renewal)
            hold.renewal = None
        self._slot.clear()

    # -- release, extend -------------------------------------------------------

    async def release(self) -> None:
        """Release the lock, handing it to the next waiter.

        Raises :class:`LockNotOwnedError` if this owner does not hold it, or
        if its lease ran out (or it was taken) before the release. If the
        call fails on the network, the hold is forgotten and renewals stop:
        the lock is then released or expires within its lease.
        """
        hold = self._slot.get()
        if hold is None:
            raise self._not_owned(
                f"cannot release: this owner does not hold the {self._noun}", name=self.name
            )
        keys = self._release_keys
        if hold.count == 1:
            self._forget(hold)  # stop renewing before the lock can change hands
        reply = int(
            await shielded(self._run(self._scripts.release, keys, self._release_args(hold.token)))
        )
        if reply == 2:
            hold.count -= 1
            return
        if hold.count > 1:
            self._forget(hold)  # the server held no more re-entries than this one
        if reply == 0:
            if not hold.lost:
                hold.lost = True
                self._counters.lost += 1
            raise self._not_owned(
                f"cannot release: the lease ran out or the {self._noun} was taken", name=self.name
            )
        self._counters.record_released(hold)

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Add ``additional_time`` seconds to the lease (or set it, ``replace_ttl=True``).

        Returns True; raises :class:`LockNotOwnedError` if the lock is not held.
        """
        check_seconds("additional_time", additional_time, allow_none=False, name=self.name)
        hold = self._require_hold("extend")
        return await self._set_lease(hold, to_ms(additional_time), "set" if replace_ttl else "add")

    async def reacquire(self) -> bool:
        """Reset the lease to the lock's full ``timeout``; raise if not held."""
        hold = self._require_hold("reacquire")
        return await self._set_lease(hold, self._settings.lease_ms, "set")

    async def _set_lease(self, hold: Hold, ms: int, mode: str) -> bool:
        sent = time.monotonic()
        reply = int(
            await self._run(self._scripts.extend, (self._keys.owner,), (hold.token, ms, mode))
        )
        if reply <= 0:
            self._mark_lost(hold)
            raise self._not_owned(
                f"the {self._noun} is no longer held by this owner", name=self.name
            )
        hold.expires_at = sent + reply / 1000
        return True

    def _require_hold(self, action: str) -> Hold:
        hold = self._slot.get()
        if hold is None:
            raise self._not_owned(
                f"cannot {action}: this owner does not hold the lock", name=self.name
            )
        return hold

    async def owned(self) -> bool:
        """True if this owner holds it, as the server sees it (one round trip)."""
        hold = self._slot.get()
        if hold is None:
            return False
        try:
            score = await self.client.zscore(self._keys.owner, hold.token)
        except Exception as exc:
            doing = f"checking the {self._noun}"
            raise translate_error(exc, name=self.name, doing=doing) from exc
        return score is not None

    async def _run(self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Any:
        return await self._registry.run(script, keys, args, name=self.name)

    # -- context manager -------------------------------------------------------

    async def __aenter__(self: _P) -> _P:
        if not await self.acquire():
            raise AcquireTimeoutError(
                f"could not acquire within {self._settings.blocking_timeout}s", name=self.name
            )
        hold = self._slot.get()
        if hold is not None and self._cancel_on_lost:
            hold.guarded = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._slot.get()
        if hold is None:
            return
        if hold.lost:
            self._forget(hold)
            if absorb_guard_cancel(hold.holder, exc):
                raise self._lost_error(
                    f"the {self._noun} was lost; the block was cancelled", name=self.name
                ) from exc
            if exc is None:
                raise self._lost_error(
                    f"the {self._noun} was lost while the block ran", name=self.name
                )
            return
        try:
            await self.release()
        except self._not_owned as error:
            if exc is None:
                raise self._lost_error(
                    f"the {self._noun} was lost before the block ended", name=self.name
                ) from error


def _ignore(reply: Any, error: BaseException | None) -> None:
    return None
