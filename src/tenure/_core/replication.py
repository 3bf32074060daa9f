"""Replica acknowledgement, sans I/O: the policy, the commands, the verdicts.

A write to a Redis/Valkey primary reaches its replicas asynchronously; a
failover can promote a replica that never saw it. ``WAIT n timeout`` blocks
the connection that wrote until ``n`` replicas have acknowledged everything
it wrote (``WAITAOF l n timeout`` waits for the writes to be fsynced to the
AOF of the primary, ``l`` = 1, and of ``n`` replicas). It counts only the
issuing connection's own writes, so tenure sends the script and the WAIT in
one pipeline on one connection (the primary of the key's slot on a cluster).

WAIT does not make Redis strongly consistent: an acknowledged write can still
be lost if every replica that has it fails with the primary, or if a replica
that lacks it is promoted against the policy of the failover manager. What it
gives: after an acknowledged write, a failover to any of the acknowledging
replicas keeps it. docs/guarantees.md says what follows for each primitive.

Everything here is pure: the async and sync twins of
:mod:`tenure._async._replication` call it, so the rules live in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenure._core.exceptions import ArgumentError, BackendError, ReplicationError
from tenure._core.values import check_seconds, to_text

__all__ = [
    "DEFAULT_REPLICA_TIMEOUT",
    "Acknowledgement",
    "ReplicationPolicy",
    "majority",
    "parse_role",
    "parse_wait",
    "unsupported_wait",
]

DEFAULT_REPLICA_TIMEOUT = 0.5
"""Seconds a write may wait for its acknowledgements by default."""

REPLICA_COUNT_TTL = 30.0
"""Seconds a discovered replica count is trusted before it is asked again."""


def majority(replicas: int) -> int:
    """A majority of ``replicas`` (0 of 0: a primary alone needs no acknowledgement)."""
    return replicas // 2 + 1 if replicas > 0 else 0


@dataclass(frozen=True)
class ReplicationPolicy:
    """How many acknowledgements a write needs, and how long to wait for them.

    ``min_replicas=None`` asks for a majority of the replicas the primary
    reports (``ROLE``: those attached now), counted when first needed and
    again every :data:`REPLICA_COUNT_TTL` seconds, after a shortfall and
    after a failover. A fixed ``min_replicas`` never changes.
    """

    min_replicas: int | None
    replica_timeout: float
    aof: bool

    @classmethod
    def build(
        cls,
        *,
        min_replicas: int | None,
        replica_timeout: float,
        aof: bool,
        name: str | None = None,
    ) -> ReplicationPolicy:
        """Validate the arguments (typed errors naming each) and build the policy."""
        if min_replicas is not None and (
            isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0
        ):
            raise ArgumentError(
                "min_replicas", f"must be None or an int >= 0, got {min_replicas!r}", name=name
            )
        check_seconds(
            "replica_timeout", replica_timeout, allow_none=False, name=name, positive=True
        )
        if not isinstance(aof, bool):
            raise ArgumentError("aof", f"must be a bool, got {aof!r}", name=name)
        return cls(min_replicas=min_replicas, replica_timeout=float(replica_timeout), aof=aof)

    @property
    def timeout_ms(self) -> int:
        """The WAIT timeout in milliseconds (never 0: WAIT's 0 means forever)."""
        return max(1, round(self.replica_timeout * 1000))

    def required(self, discovered: int) -> int:
        """Acknowledgements needed when the primary reports ``discovered`` replicas."""
        return majority(discovered) if self.min_replicas is None else self.min_replicas

    def wait_command(self, required: int) -> tuple[str | int, ...]:
        """The WAIT (or WAITAOF) command that waits for ``required`` replicas."""
        if self.aof:
            return ("WAITAOF", 1, required, self.timeout_ms)
        return ("WAIT", required, self.timeout_ms)


@dataclass(frozen=True)
class Acknowledgement:
    """What WAIT (or WAITAOF) answered for one write."""

    acknowledged: int
    required: int
    local_fsynced: bool | None = None

    @property
    def short(self) -> bool:
        """True if the write was not acknowledged as the policy asks."""
        return self.acknowledged < self.required or self.local_fsynced is False

    def error(self, doing: str, *, name: str | None = None) -> ReplicationError:
        """The :class:`ReplicationError` for a short acknowledgement of ``doing``."""
        what = "replica AOF" if self.local_fsynced is not None else "replica"
        message = (
            f"{doing}: {self.acknowledged} of {self.required} required {what} "
            "acknowledgement(s) arrived in time"
        )
        if self.local_fsynced is False:
            message += "; the primary's own AOF had not fsynced it"
        return ReplicationError(
            message,
            acknowledged=self.acknowledged,
            required=self.required,
            local_fsynced=self.local_fsynced,
            name=name,
        )


def parse_wait(reply: Any, required: int, *, aof: bool) -> Acknowledgement:
    """Read WAIT's count (or WAITAOF's ``[local, replicas]``)."""
    if aof:
        local, replicas = (int(part) for part in reply)
        return Acknowledgement(int(replicas), required, local_fsynced=local >= 1)
    return Acknowledgement(int(reply), required)


def parse_role(reply: Any) -> tuple[str, int]:
    """``ROLE``'s answer: the node's role and, for a primary, its replica count."""
    role = to_text(reply[0])
    if role != "master":
        return role, 0
    return role, len(reply[2]) if len(reply) > 2 and reply[2] else 0


def unsupported_wait(error: BaseException, policy: ReplicationPolicy) -> BaseException | None:
    """A clear error when the server cannot run the policy's WAIT, else None."""
    text = str(error)
    lowered = text.lower()
    if policy.aof and "unknown command" in lowered:
        return BackendError(
            "aof=True needs WAITAOF, which Redis 7.2+ and Valkey 7.2+ have; "
            f"this server refused it ({text}); use aof=False (WAIT)"
        )
    if policy.aof and "appendonly" in lowered:
        return BackendError(
            "aof=True needs appendonly yes on the primary (WAITAOF with numlocal 1); "
            f"the server said: {text}"
        )
    return None
