"""The lock's rules: one owner (a hash), re-entry counted by its owner, the lock's errors.

Also the rules of a lock made with ``interop="redis-py"``, for a migration
from redis-py's ``Lock``: processes still on redis-py's ``Lock`` (or any
``SET name token NX PX`` code) and processes on tenure must exclude each
other. Every script that takes, renews, hands on or releases such a hold
also sets (or deletes) redis-py's key of the lock (its name, holding the
token, with the hold's expiry), in the same call (``mirror`` in
``lua/lib/lock.lua``). While a process outside tenure holds that key, its
release is announced to nobody, so tenure's waiters look again every
``sleep`` seconds. Only the locks that ask for it pay for it: the rules of
every other lock add no key and make no check.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

from tenure._async._rules import AsyncRules, Call, LeasedScripts, took_lock
from tenure._core.exceptions import (
    LockLostError,
    LockNotOwnedError,
    LostError,
    NotOwnedError,
    PrimitiveError,
    TenureError,
)
from tenure._core.fence import fence_arg
from tenure._core.leased import IDLE_TTL_MS, Acquired, LimitMismatch, call_id, parse_confirm
from tenure._core.statistics import LeasedStatistics, LockStatistics

__all__ = ["AsyncLockRules", "AsyncRedisPyKeyRules", "holding_redis_py_key"]

CONFIRM_SCRIPT = "lock_confirm"
"""Re-entry, and a waiter's confirmation of a lock handed to it (the lock's alone)."""


class AsyncLockRules(AsyncRules):
    """The lock's rules: one owner (a hash), re-entry counted by its owner, the lock's errors."""

    scripts = LeasedScripts.of("lock")
    line_script: ClassVar[str] = "lock_line"
    not_owned: ClassVar[type[NotOwnedError]] = LockNotOwnedError
    lost_error: ClassVar[type[LostError]] = LockLostError
    statistics_type: ClassVar[type[LeasedStatistics]] = LockStatistics
    reentry_hint = "make it with reentrant=True (or use AsyncReentrantLock) to re-enter"

    def try_call(self, token: str, attempt: str = "") -> Call:
        k = self.keys
        return (k.owner, k.queue), (token, self.settings.lease_ms, self.owner_name, attempt)

    def confirm_call(self, token: str) -> Call:
        """``lock_confirm``: ``token`` holds; its full lease set, its fence answered."""
        return self.keys.lock, (token, self.settings.lease_ms, self.owner_name)

    def release_call(self, token: str, fence: int = 0, call: str = "") -> Call:
        return self.keys.lock, (token, self.settings.handoff_ms, IDLE_TTL_MS, fence_arg(fence))

    def leave_call(self, token: str, attempt: str = "") -> Call:
        return self.keys.lock, (token, self.settings.handoff_ms, IDLE_TTL_MS, attempt)

    def extend_call(self, token: str, ms: int, mode: str, fence: int = 0, call: str = "") -> Call:
        args = (token, ms, mode, call_id(mode), fence_arg(fence), call)
        return (self.keys.owner,), args

    def line_call(self) -> Call:
        return self.keys.lock, ()

    def parse_try(self, reply: Any) -> int:
        return int(reply)

    def limit_mismatch(self, answer: LimitMismatch) -> TenureError:
        return PrimitiveError(f"unexpected reply {answer!r}", name=self.name)

    async def confirm_now(self, token: str, granted: Acquired) -> Acquired | None:
        """The lock's: ``lock_confirm`` checks that the token holds and sets its lease.

        It answers the hold's fence as the server has it -- newer than
        ``granted``'s if the token was handed the lock again since (its line
        joined it again).
        """
        return await self.reenter_now(token)

    async def reenter_now(self, token: str) -> Acquired | None:
        keys, args = self.confirm_call(token)
        return parse_confirm(await self.run_taking(CONFIRM_SCRIPT, keys, args, took_lock))


class AsyncRedisPyKeyRules(AsyncLockRules):
    """A lock's rules whose every call also holds redis-py's key of the lock (its name).

    Its waiters look again every ``outsider_poll`` seconds (the lock's
    ``sleep``) while a holder outside tenure holds that key.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # redis-py's key of the lock: its name, as redis-py's Lock encodes it.
        self.outer_keys = (self.name,)

    def _held_too(self, call: Call) -> Call:
        """``call`` with redis-py's key after the lock's own keys (the scripts' last KEYS)."""
        keys, args = call
        return (*keys, *self.outer_keys), args

    def try_call(self, token: str, attempt: str = "") -> Call:
        return self._held_too(super().try_call(token, attempt))

    def confirm_call(self, token: str) -> Call:
        return self._held_too(super().confirm_call(token))

    def release_call(self, token: str, fence: int = 0, call: str = "") -> Call:
        return self._held_too(super().release_call(token, fence, call))

    def leave_call(self, token: str, attempt: str = "") -> Call:
        return self._held_too(super().leave_call(token, attempt))

    def extend_call(self, token: str, ms: int, mode: str, fence: int = 0, call: str = "") -> Call:
        return self._held_too(super().extend_call(token, ms, mode, fence, call))

    def line_call(self) -> Call:
        return self._held_too(super().line_call())


_WITH_REDIS_PY_KEY: dict[type[AsyncLockRules], type[AsyncRedisPyKeyRules]] = {}


def holding_redis_py_key(rules_type: type[AsyncLockRules]) -> type[AsyncRedisPyKeyRules]:
    """``rules_type`` (a lock's, or a kind's derived from it) holding redis-py's key too."""
    if issubclass(rules_type, AsyncRedisPyKeyRules):
        return rules_type
    made = _WITH_REDIS_PY_KEY.get(rules_type)
    if made is None:
        made = _WITH_REDIS_PY_KEY[rules_type] = cast(
            type[AsyncRedisPyKeyRules],
            type(
                f"{rules_type.__name__}WithRedisPyKey",
                (AsyncRedisPyKeyRules, rules_type),
                {"__doc__": f"{rules_type.__name__} holding redis-py's key of the lock too."},
            ),
        )
    return made
