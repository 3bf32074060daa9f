"""AsyncRedlockRules: a Redlock's rules, its calls run on a quorum of masters.

The lock's keys, scripts' arguments and renewals (:mod:`tenure._async._lock_rules`),
with the calls that take nothing (release, leave) settled on every master
and those that set a lease (extend, renewals) counted when a quorum held it.
How a Redlock waits is :mod:`tenure._async._redlock_queue`; its public face
:mod:`tenure._async._redlock`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from tenure._async._lock_rules import AsyncLockRules
from tenure._async._masters import RELEASE_PATIENCE, AsyncMasters
from tenure._async._rules import Call, LeasedScripts
from tenure._async._scripting import AsyncClient
from tenure._async._watchdog import Job, JobRunner
from tenure._core.exceptions import ArgumentError
from tenure._core.leased import IDLE_TTL_MS, RENEW_AT, Hold, LockSettings
from tenure._core.redlock import DEFAULT_MASTER_TIMEOUT, RedlockStatistics, check_redlock_lease
from tenure._core.statistics import LeasedStatistics
from tenure._core.values import check_seconds

__all__ = ["AsyncRedlockRules"]


class AsyncRedlockRules(AsyncLockRules):
    """A Redlock's rules: the lock's keys and renewals, run on a quorum of masters."""

    scripts = LeasedScripts(
        try_="redlock_acquire",
        release="redlock_release",
        leave="redlock_release",
        extend="lock_extend",
    )
    statistics_type: ClassVar[type[LeasedStatistics]] = RedlockStatistics
    reentry_hint = "a Redlock is not re-entrant: release it before acquiring again"

    def __init__(
        self,
        clients: Sequence[AsyncClient],
        name: str,
        described: tuple[str, ...],
        master_timeout: float | None,
        **options: Any,
    ) -> None:
        super().__init__(clients[0], name, **options)
        settings = self.settings
        check_redlock_lease(settings.lease, name)
        check_seconds("master_timeout", master_timeout, allow_none=True, name=name)
        if master_timeout is None:
            master_timeout = min(DEFAULT_MASTER_TIMEOUT, settings.lease / 10)
        elif not master_timeout > 0 or master_timeout > settings.lease / 10:
            raise ArgumentError(
                "master_timeout",
                f"must be above 0 and at most a tenth of the lease (timeout={settings.lease:g}s: "
                f"at most {settings.lease / 10:g}s), got {master_timeout:g}s",
                name=name,
            )
        longest = settings.lease / 10
        self.masters = AsyncMasters(clients, described, master_timeout, name, longest)
        self.attempts = 0
        self.short_attempts = 0

    def check_settings(self, settings: LockSettings) -> None:
        check_redlock_lease(settings.lease, self.name)
        masters = self.masters
        if masters.call_timeout > settings.lease / 10:
            raise ArgumentError(
                "timeout",
                f"{settings.lease:g}s is less than ten times master_timeout "
                f"({masters.call_timeout:g}s)",
                name=self.name,
            )
        masters.longest = settings.lease / 10

    def statistics_extra(self) -> dict[str, Any]:
        return {
            "masters": len(self.masters.described),
            "quorum": self.masters.quorum,
            "attempts": self.attempts,
            "short_attempts": self.short_attempts,
            "master_failures": self.masters.failures,
        }

    def release_call(self, token: str, fence: int = 0, call: str = "") -> Call:
        return self.release_keys(), (token, "leave", "", IDLE_TTL_MS, call)

    def extend_call(self, token: str, ms: int, mode: str, fence: int = 0, call: str = "") -> Call:
        # Each master's owner fence may be below the hold's (a quorum's highest):
        # the masters check the token and, when it was chosen, the acquire call.
        return super().extend_call(token, ms, mode, call=call)

    def leave_call(self, token: str, attempt: str = "") -> Call:
        # A chosen token's acquire call gives back only what that call took.
        return self.release_keys(), (token, "leave", "", IDLE_TTL_MS, attempt)

    def release_keys(self) -> tuple[str, ...]:
        """The redlock_release script's keys: the queue's, then the receipts."""
        return (*self.keys.queued[:4], *self.keys.receipts)

    async def run(self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Any:
        # Release and leave (the only plain script calls the other parts make):
        # 1 if a quorum still held it for the token, else 0 (it ran out meanwhile).
        within = min(self.settings.lease, RELEASE_PATIENCE)
        tally = await self.masters.settle(script, keys, args, within)
        if tally.reached:
            return 1
        if tally.unreachable:
            raise tally.error("releasing", self.name)
        return 0

    async def run_taking(
        self,
        script: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        took: Callable[[Any], bool],
    ) -> Any:
        # extend() and reacquire(): the lease a quorum holds.
        return await self.masters.extend(keys, args, self.settings.lease / 3)

    def renewal_runner(self, hold: Hold) -> JobRunner | None:
        masters = self.masters  # not the lock: renewals must not keep it alive
        settings = self.settings

        async def renew(job: Job) -> Any:
            # Slow masters are asked again until the next renewal would be due,
            # but not past the hold's validity: its loss is told when it ends.
            left = hold.expires_at - time.monotonic()
            within = max(0.0, min(settings.lease * RENEW_AT, left))
            return await masters.extend(job.keys, job.args, within)

        return renew
