"""The sans-IO half of Redlock: quorums, validity, masters and what their answers mean.

A Redlock is one lock over ``n`` independent masters (no replication
between them). An acquisition counts when a quorum, ``n // 2 + 1``, of
masters granted it and time is left: its *validity* is the lease minus the
time the attempt took minus an allowance for the masters' clocks running at
different speeds (:func:`drift_ms`: 1% of the lease plus 2 ms, the factor of
the Redlock description, pottery and node-redlock). Everything here is pure;
the I/O is in :mod:`tenure._async._redlock`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import exceptions as redis_errors

from tenure._core.clients import is_cluster, require_client
from tenure._core.exceptions import (
    ArgumentError,
    ClientTypeError,
    QuorumError,
)
from tenure._core.statistics import (
    LockStatistics,
)
from tenure._core.values import to_ms, to_text

__all__ = [
    "ADAPTIVE_MARGIN",
    "DEFAULT_MASTER_TIMEOUT",
    "DRIFT_FACTOR",
    "DRIFT_MIN_MS",
    "FENCE_LIFETIME_MS",
    "MAX_OVERDUE",
    "MIN_MASTER_TIMEOUT",
    "SLOWEST_DECAY",
    "RedlockStatistics",
    "Tally",
    "check_masters",
    "check_redlock_lease",
    "describe_failure",
    "drift_ms",
    "is_slow",
    "quorum",
]

DRIFT_FACTOR = 0.01
"""Share of the lease set aside for the masters' clocks running at different speeds."""

DRIFT_MIN_MS = 2
"""Milliseconds set aside on top of :data:`DRIFT_FACTOR` (expiry granularity)."""

DEFAULT_MASTER_TIMEOUT = 0.1
"""Seconds an attempt waits for the masters' answers (far below any lease)."""

MIN_MASTER_TIMEOUT = 0.005
"""The least time a master is given to answer: a round trip with room for a busy machine.

A Redlock's masters get at most a tenth of its lease, so its lease must be at
least ten times this (:func:`check_redlock_lease`)."""


def check_redlock_lease(lease: float, name: str) -> None:
    """Refuse a lease too short for a quorum's answers and the clocks' drift allowance."""
    shortest = 10 * MIN_MASTER_TIMEOUT
    if lease < shortest:
        raise ArgumentError(
            "timeout",
            f"{lease:g}s is too short for a Redlock: its masters get a tenth of the lease "
            f"to answer ({lease / 10:g}s, less than a round trip), and "
            f"{drift_ms(to_ms(lease)):d} ms of it is set aside for the masters' clocks "
            f"drifting apart; give at least {shortest:g}s",
            name=name,
        )


SETTLE_TIMEOUT = 1.0
"""Seconds a release or give-back waits, at least, for a quorum to answer.

Nothing expires while it waits (unlike an attempt, whose validity shrinks),
so a master slower than ``master_timeout`` costs time there, not a failure;
it ends as soon as a quorum answered, as every call does.
"""

FENCE_LIFETIME_MS = 24 * 3600 * 1000
"""A master's fencing counter lives this long after its last use (a day).

A counter may hold a figure raised from another master's clock; it must
not restart from this master's own clock (which may lag) while that figure
is recent. Clocks a day apart are out of scope.
"""

MAX_OVERDUE = 4
"""Calls to one master that may be running once one of them outlived its timeout.

Beyond this the master is taken for unreachable and skipped (it fails at
once) until they end: a server that accepts connections but never answers
cannot pile up threads or connections.
"""


def quorum(masters: int) -> int:
    """Masters that must agree: a majority, ``masters // 2 + 1``."""
    return masters // 2 + 1


def drift_ms(lease_ms: int) -> int:
    """Milliseconds of an acquisition's lease set aside for clock drift."""
    return int(lease_ms * DRIFT_FACTOR) + DRIFT_MIN_MS


@dataclass(frozen=True, kw_only=True)
class RedlockStatistics(LockStatistics):
    """A :class:`~tenure.Redlock`'s statistics (this object, this process).

    ``masters`` and ``quorum`` count masters. ``attempts`` counts rounds
    sent to the masters to acquire; ``short_attempts`` those that fell short
    of a quorum (or of validity) and were given back; ``master_failures``
    the masters' individual failures (refused, timed out, errored) in any call.
    """

    masters: int
    quorum: int
    attempts: int
    short_attempts: int
    master_failures: int


def _where(client: Any) -> tuple[tuple[Any, ...], str]:
    """Who a client talks to: an identity for duplicates, and a description."""
    pool = client.connection_pool
    service = getattr(pool, "service_name", None)
    if service is not None:  # a Sentinel-managed client: the service is the master
        return ("sentinel", service), f"sentinel service {service}"
    kwargs = pool.connection_kwargs
    path = kwargs.get("path")
    if path:
        return ("unix", path), str(path)
    host = str(kwargs.get("host", "localhost"))
    port = int(kwargs.get("port", 6379))
    same = "127.0.0.1" if host in ("localhost", "127.0.0.1") else host.lower()
    return ("tcp", same, port), f"{host}:{port}"


def check_masters(clients: Any, *, is_async: bool, owner: str, name: str) -> tuple[str, ...]:
    """Validate a Redlock's clients; return a description of each master.

    One client per independent server: a sequence of at least one, every
    one of the kind the primitive needs (sync or asyncio), no cluster client
    (a cluster is one system: use ClusterLock), no two for one server.
    """
    if not isinstance(clients, Sequence) or isinstance(clients, (str, bytes)):
        raise ClientTypeError(
            "clients",
            f"{owner} needs a list of clients, one per master; got {type(clients).__name__} "
            "(for one server use Lock)",
            name=name,
        )
    if not clients:
        raise ArgumentError("clients", "needs at least one client (one per master)", name=name)
    seen: dict[tuple[Any, ...], int] = {}
    described: list[str] = []
    for index, client in enumerate(clients):
        try:
            require_client(client, is_async=is_async, owner=owner)
        except ClientTypeError as exc:
            reason = str(exc.message).removeprefix("client: ")
            mixed = " (the masters' clients must all be of one kind)" if index else ""
            raise ClientTypeError(f"clients[{index}]", reason + mixed, name=name) from None
        if is_cluster(client):
            raise ClientTypeError(
                f"clients[{index}]",
                "a cluster is one system, not an independent master: pass a client per "
                "independent server, or use ClusterLock on the cluster",
                name=name,
            )
        identity, where = _where(client)
        if identity in seen:
            raise ArgumentError(
                f"clients[{index}]",
                f"{where} is also clients[{seen[identity]}]: each master must be a different "
                "server, or one failure counts twice",
                name=name,
            )
        seen[identity] = index
        described.append(where)
    return tuple(described)


SLOWEST_DECAY = 0.95
"""Each answer lets the slowest recent answer time of the masters decay by this."""

ADAPTIVE_MARGIN = 2.5
"""An attempt waits this many times the slowest recent answer (at least ``master_timeout``)."""


def is_slow(error: BaseException) -> bool:
    """Whether a master's failure was only slowness (no answer in time), not a refusal."""
    if isinstance(error, TimeoutError):
        return True
    cause = error.__cause__
    return isinstance(cause, redis_errors.TimeoutError)


def holder_of(reply: Any) -> str:
    """Who a master's ``[token, call]`` answer says holds a Redlock, as one text.

    The token, and the acquire call's id after a NUL when the token was
    chosen: two owners that chose one token are two holders.
    """
    token, call = (to_text(part) if part is not None else "" for part in reply)
    return f"{token}\0{call}" if call else token


def owners_decided(tally: Tally, token: str | None) -> bool:
    """Whether the masters' answers so far decide who holds a Redlock.

    The replies in ``tally.good`` are ``[token, call]`` answers
    (:func:`holder_of`). With ``token`` (a :func:`holder_of` text): whether
    that holder holds on a quorum, or can no longer, whatever the masters yet
    to answer say; without: the same for whichever holds the most. A master
    that is dead or slow then costs nothing more.
    """
    counts: dict[str, int] = {}
    for reply in tally.good.values():
        text = holder_of(reply)
        counts[text] = counts.get(text, 0) + 1
    best = counts.get(token, 0) if token is not None else max(counts.values(), default=0)
    missing = len(tally.masters) - len(tally.good) - len(tally.refused) - len(tally.failed)
    return best >= tally.quorum or best + missing < tally.quorum


def describe_failure(error: BaseException, timeout: float) -> str:
    """A few words on why a master failed a call, for :class:`~tenure.QuorumError`."""
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g}s"
    text = str(error) or type(error).__name__
    text = text.split(" while ")[0].removeprefix("server unavailable: ")
    connecting = _CONNECTING.match(text)
    if connecting is None:
        return text
    # redis-py's "Error 111 connecting to host:port. Connection refused.": the
    # listing names the master already (asyncio's text names it a third time).
    why = connecting["why"]
    if why.startswith("Connect call failed"):
        why = os.strerror(int(connecting["errno"]))
    return why.rstrip(".")


_CONNECTING = re.compile(r"^Error (?P<errno>\d+) connecting to \S+?\. (?P<why>.+)$")


@dataclass
class Tally:
    """The masters' answers to one call, as they come in.

    ``good`` maps a master's index to its reply where it did what was asked
    (granted, released, extended), ``refused`` where it answered no,
    ``failed`` to a short reason where it did not answer.
    """

    masters: tuple[str, ...]
    quorum: int
    good: dict[int, Any] = field(default_factory=dict)
    refused: dict[int, Any] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    slow: set[int] = field(default_factory=set)
    """The failed masters that did not answer in time (rather than refusing a
    connection or answering an error): on a busy machine, a healthy one can."""
    unsent: set[int] = field(default_factory=set)
    """The failed masters whose call never left the client (``never_sent``)."""
    exhausted: set[int] = field(default_factory=set)
    """The failed masters whose client's pool had no free connection for the call."""

    @property
    def crowded(self) -> bool:
        """Every master that failed failed for want of a free connection in its client's pool."""
        return bool(self.failed) and set(self.failed) <= self.exhausted

    @property
    def may_recover(self) -> bool:
        """A quorum is still possible if the masters only slow to answer do answer."""
        hard = len(set(self.failed) - self.slow)
        return len(self.masters) - hard >= self.quorum

    def merge(self, later: Tally) -> None:
        """Take in the answers of a call repeated to the masters that failed this one."""
        for index in (*later.good, *later.refused, *later.failed):
            self.failed.pop(index, None)
            self.slow.discard(index)
            self.unsent.discard(index)
            self.exhausted.discard(index)
        self.good.update(later.good)
        self.refused.update(later.refused)
        self.failed.update(later.failed)
        self.slow |= later.slow
        self.unsent |= later.unsent
        self.exhausted |= later.exhausted

    @property
    def reached(self) -> bool:
        """A quorum of masters did what was asked."""
        return len(self.good) >= self.quorum

    @property
    def settled(self) -> bool:
        """The quorum was reached, or can no longer be, whatever the rest answer."""
        missing = len(self.masters) - len(self.refused) - len(self.failed)
        return self.reached or missing < self.quorum

    @property
    def lost(self) -> bool:
        """So many masters refused that no quorum can hold it."""
        return len(self.refused) > len(self.masters) - self.quorum

    @property
    def unreachable(self) -> bool:
        """So many masters failed that the others cannot make a quorum."""
        return len(self.masters) - len(self.failed) < self.quorum

    def error(self, doing: str, name: str) -> QuorumError:
        """The :class:`~tenure.QuorumError` of a call that too many masters failed."""
        failures = {self.masters[i]: why for i, why in sorted(self.failed.items())}
        answered = len(self.masters) - len(self.failed)
        masters_by_why: dict[str, list[str]] = {}  # masters that failed alike, said once
        for where, why in failures.items():
            masters_by_why.setdefault(why, []).append(where)
        listed = "; ".join(f"{', '.join(where)}: {why}" for why, where in masters_by_why.items())
        error = QuorumError(
            f"{doing}: {len(self.failed)} of {len(self.masters)} masters failed and a quorum "
            f"needs {self.quorum} ({listed})",
            failures=failures,
            answered=answered,
            required=self.quorum,
            name=name,
        )
        # No master did anything, and every failed one was never sent the call.
        error.never_sent = not self.good and set(self.failed) <= self.unsent
        return error
