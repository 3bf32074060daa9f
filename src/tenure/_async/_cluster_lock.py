"""AsyncClusterLock: a Lock that counts only once its primary's replicas hold it.

Everything a :class:`~tenure.AsyncLock` does (FIFO handoff, watchdog,
fencing, lost notice, redis-py's signature) plus a replication policy: each
acquisition, handoff and renewal is followed by ``WAIT`` (or ``WAITAOF``)
on the connection that wrote it (:mod:`tenure._async._replication`), and
counts only when enough replicas acknowledged it:

* **acquire** — the fast path and the queue's script travel in one pipeline
  with their WAIT: one round trip plus the replicas' acknowledgement. On a
  shortfall the lock is given back (by token: nothing of another owner's is
  touched) and :class:`~tenure.ReplicationError` says how many replicas
  acknowledged and how many were required.
* **handoff** — a waiter handed the lock by another owner's release did not
  write it itself, so it confirms the full lease with a write of its own and
  WAITs for that before it counts as the owner (one more round trip, paid
  only by waiters, and it replaces the later confirmation a Lock makes). A
  caller that joins the queue does not WAIT for its place in line (nothing
  is held yet); if that call finds the lock free and takes it, it is
  confirmed the same way. Fewer WAITs also means fewer ``REPLCONF GETACK``
  bursts: two in quick succession can meet a replica's delayed TCP ACK and
  cost ~40 ms on loopback.
* **renewal** — the watchdog's renewals WAIT too; one that falls short is
  retried like a failed one, and the hold is reported lost if no renewal is
  acknowledged before its lease runs out.
* **release** is not acknowledged: a release lost in a failover leaves the
  lock held on the promoted replica until its lease ends, never two owners.

Fencing tokens come from the same script as the acquisition, so an
acknowledged acquisition's token is on the acknowledging replicas too: after
a failover to one of them, tokens go on growing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, cast

from tenure._async._lock import AsyncLock
from tenure._async._lock_rules import AsyncLockRules
from tenure._async._replication import AsyncAcknowledger
from tenure._async._rules import extended
from tenure._async._scripting import AsyncClient
from tenure._async._watchdog import Job, JobRunner
from tenure._core.exceptions import ArgumentError
from tenure._core.leased import (
    DEFAULT_WAITER_LEASE,
    Hold,
    LockSettings,
)
from tenure._core.replication import DEFAULT_REPLICA_TIMEOUT, ReplicationPolicy
from tenure._core.statistics import (
    ClusterLockStatistics,
    LeasedStatistics,
)
from tenure._core.values import MAX_SECONDS

__all__ = ["AsyncClusterLock"]


def _seconds(value: object) -> bool:
    """Whether ``value`` is a duration that passes (it is checked in full elsewhere).

    One that does not derives nothing: the error names it, not ``waiter_lease``.
    """
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_SECONDS
    )


class AsyncClusterLockRules(AsyncLockRules):
    """The lock's rules, each taking call acknowledged by replicas before it counts."""

    statistics_type: ClassVar[type[LeasedStatistics]] = ClusterLockStatistics
    confirm_every_grant = True  # a grant is acknowledged by the replicas before it counts
    reentry_hint = "make it with reentrant=True to re-enter"
    acks: AsyncAcknowledger
    """Set by :class:`AsyncClusterLock` once its policy is checked."""

    def check_settings(self, settings: LockSettings) -> None:
        replica_timeout = self.acks.policy.replica_timeout
        if replica_timeout >= settings.lease:
            raise ArgumentError(
                "replica_timeout",
                f"{replica_timeout:g}s is not below the lease ({settings.lease:g}s)",
                name=self.name,
            )

    def statistics_extra(self) -> dict[str, Any]:
        last = self.acks.last
        return {
            "required_replicas": None if last is None else last.required,
            "acknowledged_replicas": None if last is None else last.acknowledged,
            "shortfalls": self.acks.shortfalls,
        }

    async def run_taking(
        self,
        script: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        took: Callable[[Any], bool],
    ) -> Any:
        return await self.acks.run_checked(script, keys, args, took)

    def renewal_runner(self, hold: Hold) -> JobRunner | None:
        acks = self.acks

        async def renew(job: Job) -> Any:
            return await acks.run_checked(job.script, job.keys, job.args, extended)

        return renew


class AsyncClusterLock(AsyncLock):
    """A lock whose acquisitions count only once replicas acknowledged them.

    Takes :class:`AsyncLock`'s arguments (redis-py's eight first, in order, so
    ``client.lock(name, lock_class=AsyncClusterLock)`` works) and these,
    keyword-only:

    * ``min_replicas`` — acknowledgements each acquisition, handoff and
      renewal needs. ``None`` (default): a majority of the replicas the
      primary reports (``ROLE``; 0 with none, so a lone primary works as a
      Lock), counted again every 30 s and after a failover.
    * ``replica_timeout`` — seconds to wait for them (default 0.5); at most
      a quarter of ``waiter_lease`` (a waiter's refresh waits too) and less
      than the lease. Without ``waiter_lease``, it is derived: the larger of
      2 s and four times ``replica_timeout``.
    * ``aof`` — wait with ``WAITAOF 1 n`` instead: the write must be fsynced
      to the AOF of the primary (which needs ``appendonly yes``) and of
      ``n`` replicas. Redis 7.2+ and Valkey; Redis 7.0 raises a clear error.

    ``client`` may be a plain client of the primary, one from
    ``Sentinel.master_for`` (it follows failovers) or a cluster client (the
    primary of the key's slot is asked).
    """

    _rules_type = AsyncClusterLockRules
    _rules: AsyncClusterLockRules

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
        min_replicas: int | None = None,
        replica_timeout: float = DEFAULT_REPLICA_TIMEOUT,
        aof: bool = False,
        **kwargs: Any,
    ) -> None:
        if "waiter_lease" not in kwargs and _seconds(replica_timeout):
            # A waiter refreshes its place within a quarter of its lease, each
            # refresh waiting up to replica_timeout: derive it when not set.
            kwargs["waiter_lease"] = min(
                MAX_SECONDS, max(DEFAULT_WAITER_LEASE, 4 * float(replica_timeout))
            )
        # The Lock's arguments, positional ones in redis-py's order, pass through.
        super().__init__(
            client,
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            **kwargs,
        )
        name = self.name
        policy = ReplicationPolicy.build(
            min_replicas=min_replicas, replica_timeout=replica_timeout, aof=aof, name=name
        )
        settings = self._rules.settings
        if policy.replica_timeout > settings.waiter_lease / 4:
            raise ArgumentError(
                "replica_timeout",
                f"{replica_timeout:g}s is more than a quarter of waiter_lease "
                f"({settings.waiter_lease:g}s): a waiter refreshing its place would "
                "outlive it; raise waiter_lease or lower replica_timeout",
                name=name,
            )
        self._acks = self._rules.acks = AsyncAcknowledger(self.client, policy, name)
        self._rules.check_settings(settings)

    @property
    def min_replicas(self) -> int | None:
        """The policy's replica count (None: a majority of those discovered)."""
        return self._acks.policy.min_replicas

    @property
    def replica_timeout(self) -> float:
        """Seconds each write waits for its acknowledgements."""
        return self._acks.policy.replica_timeout

    @property
    def aof(self) -> bool:
        """Whether writes wait for AOF fsyncs (WAITAOF) rather than replication (WAIT)."""
        return self._acks.policy.aof

    def statistics(self) -> ClusterLockStatistics:
        """An immutable snapshot of the counters, with the last acknowledgement."""
        return cast(ClusterLockStatistics, super().statistics())
