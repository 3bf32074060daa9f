"""AsyncRules: what one kind of leased primitive is, apart from how it waits and holds.

A leased primitive (:mod:`tenure._async._primitive`) is composed of parts:

* its **rules** (this module's :class:`AsyncRules`, one subclass per kind,
  each in the kind's own module): its name, keys, validated settings and
  scripts, the keys and arguments of each script call, how a reply reads,
  how a call runs (one server, a replica-acknowledged write, a quorum of
  masters) and which errors it raises;
* its **holds** (:mod:`tenure._async._holds`): who holds what in this
  process, lost-hold notice, the counters;
* its **lease** (:mod:`tenure._async._lease`): taking a hold, renewing it,
  extending it, confirming a handed-over one;
* its **queue** (:mod:`tenure._async._queue`, or Redlock's own): the fast
  path, the FIFO queue and its wake-ups, giving up.

The rules hold no reference to the primitive object, so the parts never
keep it alive (a hold whose object was collected ends with its lease).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from tenure._async._scripting import AsyncClient, registry_for
from tenure._async._watchdog import JobRunner
from tenure._backends.for_asyncio import IS_ASYNC
from tenure._backends.owners import default_owner_name, new_token
from tenure._backends.telemetry import subject
from tenure._core.clients import require_client
from tenure._core.exceptions import (
    ArgumentError,
    LostError,
    NotOwnedError,
    TenureError,
)
from tenure._core.leased import (
    DEFAULT_HANDOFF_LEASE,
    DEFAULT_WAITER_LEASE,
    Acquired,
    Hold,
    LimitMismatch,
    LockKeys,
    LockSettings,
    check_lock_name,
    check_prefix,
    parse_confirm,
)
from tenure._core.owner_names import check_owner_name
from tenure._core.statistics import (
    LeasedStatistics,
)
from tenure._core.values import check_seconds

__all__ = ["AsyncRules", "Call", "LeasedScripts", "extended", "took_lock"]

logger = logging.getLogger("tenure.lock")

Call = tuple[tuple[str, ...], tuple[str | int, ...]]
"""A script call's ``(keys, args)``."""


@dataclass(frozen=True)
class LeasedScripts:
    """The script names of one kind of primitive (same key and reply layouts).

    (Waiting goes through the process's line, :attr:`AsyncRules.line_script`.)
    """

    try_: str
    release: str
    leave: str
    extend: str

    @classmethod
    def of(cls, kind: str) -> LeasedScripts:
        """The scripts ``{kind}_try``, ``{kind}_release`` and so on."""
        return cls(*(f"{kind}_{step}" for step in ("try", "release", "leave", "extend")))


def took_lock(reply: Any) -> bool:
    """Whether ``lock_confirm``'s reply says the caller holds the lock."""
    return parse_confirm(reply) is not None


def extended(reply: Any) -> bool:
    """Whether an extend script's reply says the lease was set."""
    return int(reply) > 0


class AsyncRules:
    """One kind of leased primitive: identity, settings, script calls, errors.

    A subclass per kind names its scripts and writes its calls; the base
    validates the arguments every kind shares and runs calls on one server.
    """

    scripts: ClassVar[LeasedScripts]
    line_script: ClassVar[str]
    """The script of a line of waiters per process (:mod:`tenure._async._line`):
    every kind that waits in :class:`~tenure._async._queue.AsyncQueue` has one."""
    confirm_every_grant: ClassVar[bool] = False
    """Whether a handed-over hold is confirmed before acquire() returns, however fresh."""
    not_owned: ClassVar[type[NotOwnedError]] = NotOwnedError
    lost_error: ClassVar[type[LostError]] = LostError
    statistics_type: ClassVar[type[LeasedStatistics]]
    noun: str = "lock"
    reentry_hint: str = "it is not re-entrant: release it before acquiring again"
    """What an :class:`~tenure.AlreadyHeldError` suggests: only what this kind has."""
    outer_keys: tuple[str, ...] = ()
    """Keys held beside the primitive's own: redis-py's key of a lock made with
    ``interop="redis-py"`` (:class:`~tenure._async._lock_rules.AsyncRedisPyKeyRules`)."""
    outsider_poll: float = 0.1
    """How often waiters look while a holder outside tenure holds an outer key."""

    def __init__(
        self,
        client: AsyncClient,
        name: str | bytes,
        *,
        kind: str,
        prefix: str,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        reentrant: bool = False,
        max_hold: float | None = None,
        waiter_lease: float = DEFAULT_WAITER_LEASE,
        handoff_lease: float = DEFAULT_HANDOFF_LEASE,
        owner_name: str | None = None,
        metric_name: str | None = None,
    ) -> None:
        name = check_lock_name(name)
        self.settings = LockSettings.build(
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
        require_client(client, is_async=IS_ASYNC, owner=kind, name=name)
        self._owner_name = check_owner_name(owner_name, name)
        check_prefix(prefix, name)
        self.client = client
        self.name = name
        self.timeout = timeout
        self._auto_renew_asked = auto_renew
        self.keys = LockKeys.for_name(prefix, name)
        self.registry = registry_for(client)
        self.subject = subject(kind, name, metric_name)
        """Who this primitive's metrics are about (:mod:`tenure._backends.telemetry`)."""

    # -- settings --------------------------------------------------------------

    @property
    def owner_name(self) -> str:
        """``owner_name=``, or this process's ``host:pid``."""
        return self._owner_name or default_owner_name()

    def retime(self, timeout: float | None) -> None:
        """Take a new ``timeout`` (the lease of the next acquisitions and renewals)."""
        s = self.settings
        settings = LockSettings.build(
            self.name,
            timeout=timeout,
            blocking=s.blocking,
            blocking_timeout=s.blocking_timeout,
            auto_renew=self._auto_renew_asked,
            reentrant=s.reentrant,
            max_hold=s.max_hold,
            waiter_lease=s.waiter_lease,
            handoff_lease=s.handoff_lease,
        )
        self.check_settings(settings)
        self.settings = settings
        self.timeout = timeout

    def set_blocking(self, blocking: bool) -> None:
        """Take a new default for :meth:`acquire`'s ``blocking``."""
        self.settings = dataclasses.replace(self.settings, blocking=bool(blocking))

    def set_blocking_timeout(self, value: float | None) -> None:
        """Take a new default for :meth:`acquire`'s ``blocking_timeout``."""
        value = check_seconds(
            "blocking_timeout", value, allow_none=True, name=self.name, forever=True
        )
        self.settings = dataclasses.replace(self.settings, blocking_timeout=value)

    def check_settings(self, settings: LockSettings) -> None:
        """Refuse settings this kind cannot work with (a changed ``timeout``)."""

    def check_owner_free(self) -> None:
        """Refuse to wait on a hold this owner has through another object."""

    def checked_token(self, token: object) -> str:
        """A token as the scripts take it: a non-empty str (UTF-8 bytes decoded)."""
        if isinstance(token, bytes):  # redis-py takes bytes tokens too
            try:
                token = token.decode("utf-8")
            except UnicodeDecodeError:
                raise ArgumentError("token", "bytes must be UTF-8", name=self.name) from None
        if not isinstance(token, str) or not token:
            raise ArgumentError("token", "must be a non-empty str", name=self.name)
        if "\0" in token:  # (the line scripts name a waiter "token\0call id")
            raise ArgumentError("token", "must not contain NUL characters", name=self.name)
        return token

    def new_token(self) -> str:
        """A fresh token for one acquisition (``tenure._backends.owners.new_token``)."""
        return new_token()

    def statistics_extra(self) -> dict[str, Any]:
        """The fields this kind's statistics record adds to the shared ones."""
        return {}

    def refused(self, doing: str) -> NotOwnedError:
        """The not-owned error of this kind, saying what could not be done."""
        return self.not_owned(doing, name=self.name)

    # -- the script calls (each kind writes its own) ------------------------------

    def try_call(self, token: str, attempt: str = "") -> Call:
        """The fast path's call: take it if free and nobody waits.

        ``attempt`` is the acquire call's id when the caller chose ``token``
        (``""`` for a random one): it tells that call's resend from a second
        owner that chose the same token.
        """
        raise NotImplementedError

    def release_call(self, token: str, fence: int = 0, call: str = "") -> Call:
        """End the hold, handing it to the next waiter.

        ``fence``: the hold's fencing token (0: not known); a hold the token
        has with another fence (a second owner that chose the same token took
        it after this one's lease ran out) is left alone. ``call``: a
        Redlock's acquire call id (its masters' fences differ), checked alike.
        """
        raise NotImplementedError

    def leave_call(self, token: str, attempt: str = "") -> Call:
        """Undo an acquire: leave the queue, passing on a hold handed over meanwhile.

        ``attempt``: the acquire call's id (see :meth:`try_call`); a hold its
        token has under another call's id is a second owner's, left alone.
        """
        raise NotImplementedError

    def extend_call(self, token: str, ms: int, mode: str, fence: int = 0, call: str = "") -> Call:
        """Set (``mode`` "set") or add to ("add") the lease of ``token``'s hold.

        ``fence``: that hold's fencing token, checked as :meth:`release_call`'s.
        """
        raise NotImplementedError

    def line_call(self) -> Call:
        """The line script's keys and this kind's own arguments of it (``LINE_SCRIPTS``)."""
        raise NotImplementedError

    def parse_try(self, reply: Any) -> int:
        """The fencing token the fast path took (> 0), or 0."""
        raise NotImplementedError

    def limit_mismatch(self, answer: LimitMismatch) -> TenureError:
        """The error of a script that refused this primitive's limit."""
        raise NotImplementedError

    async def confirm_now(self, token: str, granted: Acquired) -> Acquired | None:
        """Set the full lease of a hold handed to ``token``; its answer, or None if it lapsed."""
        raise NotImplementedError

    async def reenter_now(self, token: str) -> Acquired | None:
        """Check that ``token`` holds and reset its full lease (a re-entry); None if not held.

        Only the kinds that may be re-entrant (the locks on one server) have it.
        """
        raise NotImplementedError

    # -- replies ----------------------------------------------------------------

    def took_on_try(self, reply: Any) -> bool:
        """Whether the try script's reply says it was taken."""
        return self.parse_try(reply) > 0

    def line_refusal(self, stored_limit: int) -> TenureError:
        """The error of a line whose script refused this primitive's limit."""
        return self.limit_mismatch(LimitMismatch(stored=stored_limit))

    # -- running calls ------------------------------------------------------------

    async def run(self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Any:
        """Run a script call that takes nothing."""
        return await self.registry.run(script, keys, args, name=self.name)

    async def run_taking(
        self,
        script: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        took: Callable[[Any], bool],
    ) -> Any:
        """Run a call that may take or extend a hold (``took(reply)`` says if it did).

        Replica-acknowledged kinds wait for their replicas here and raise
        :class:`~tenure.ReplicationError` when a taking call fell short.
        """
        return await self.registry.run(script, keys, args, name=self.name)

    def renewal_runner(self, hold: Hold) -> JobRunner | None:
        """How the watchdog runs ``hold``'s renewals (None: batched EVALSHA)."""
        return None

    async def leave_quietly(self, token: str, quiet: bool = False, attempt: str = "") -> bool:
        """Leave the queue and give back anything taken for ``token``, never raising.

        Returns False if the server could not be told (the waiter lease then
        drops it from the queue within ``waiter_lease``, a taken lease ends
        with its lease).
        """
        try:
            keys, args = self.leave_call(token, attempt)
            await self.run(self.scripts.leave, keys, args)
        except Exception as exc:  # (also a client closed under a background give-back)
            log = logger.debug if quiet else logger.warning
            log("tenure: could not leave the queue of %r: %s", self.name, exc)
            return False
        return True
