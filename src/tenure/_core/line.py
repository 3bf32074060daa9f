"""What a line's round answers: the readers of the line scripts' replies.

Shared by the asyncio and threaded lines (:mod:`tenure._async._line`); a
line script's ARGV: channel, waiter lease, handoff lease, idle ms, J, L, the
waiter to check, K, the primitive's own arguments (a semaphore's limit), J
(waiter, owner name) pairs joining, L waiters leaving (what was handed to them
is passed on), K waiters giving up (what was handed to them is kept, and
named in the reply). A waiter is named by :func:`line_entry`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tenure._core.leased import Acquired
from tenure._core.values import to_text

__all__ = ["LINE_SCRIPTS", "RoundAnswer", "grant_time", "line_entry"]


def line_entry(token: str, attempt: str) -> str:
    """How a line script names a waiter: its token, with its call's id if it chose it.

    The token, a NUL, and the call's id, for a token of the caller's choosing
    (``attempt``, see :class:`~tenure._core.leased.Acquiring`): the scripts
    tell that waiter's grants from a hold of the same token taken by another call.
    Tokens hold no NUL (``checked_token``).
    """
    return f"{token}\0{attempt}" if attempt else token


@dataclass
class RoundAnswer:
    """What a round's call answered, whichever the primitive's line script."""

    alive: bool  # the process's waiter lease was alive before the round
    server_ms: int  # the server's clock when the round ran
    missing: bool  # the waiter checked neither waits nor holds
    ttl_ms: int  # ms until the owner's lease (the first permit's) runs out; -2 none
    holds: dict[str, Acquired] = field(default_factory=dict)  # members' grants it names
    # The id of the acquire call that took a hold named in ``holds`` ('' none or
    # handed over): a waiter with another id of its own is not granted it.
    calls: dict[str, str] = field(default_factory=dict)
    # Joiners whose token a permit of another call holds: not queued; ms until it ends.
    others: dict[str, int] = field(default_factory=dict)

    def grants(self, token: str, attempt: str) -> bool:
        """Whether the hold it names for ``token`` is the grant of a waiter with ``attempt``.

        Not when the waiter chose its token (``attempt``: its call's id) and
        another acquire call took that hold (the call id answered is neither
        none nor the waiter's). A token of tenure's own is unique to its
        acquisition.
        """
        if token not in self.holds:
            return False
        call = self.calls.get(token, "")
        return not attempt or not call or call == attempt

    stored_limit: int | None = None  # a semaphore's stored limit, if it refused ours
    outsider: bool = False  # a holder outside tenure holds redis-py's key (interop)


def grant_time(granted: Acquired, clock: tuple[float, int] | None, in_flight: float) -> float:
    """When a grant happened, on this process's monotonic clock (never too late).

    Mapped through a line's last round (``clock``: sent at ``clock[0]``, local,
    run at ``clock[1]`` ms, the server's clock), so a grant ``d`` ms from then
    on the server's clock happened no later than ``clock[0] + d`` here --
    before the round too (a grant heard late, after a newer round), which is
    what tells a waiter that it saw its grant late. Without a round answered
    yet: when the round on its way was sent (``in_flight``), or now.
    """
    if granted.server_ms is not None and clock is not None:
        return clock[0] + (granted.server_ms - clock[1]) / 1000
    return in_flight or time.monotonic()


def _lock_round(reply: Any) -> RoundAnswer:
    """``lock_line``'s reply.

    {owner, fence, its lease ms, alive, server ms, missing, outsider, the id of
    the call that took the owner's hold}.
    """
    owner, fence, ttl = to_text(reply[0]), int(reply[1]), int(reply[2])
    outsider = int(reply[6]) == 1
    server_ms = int(reply[4])
    holds = {}
    calls = {}
    if owner and ttl > 0:
        holds[owner] = Acquired(fence=fence, lease_ms=ttl, server_ms=server_ms)
        calls[owner] = to_text(reply[7])
    return RoundAnswer(
        alive=bool(int(reply[3])),
        server_ms=server_ms,
        missing=bool(int(reply[5])),
        ttl_ms=ttl if owner or outsider else -2,
        holds=holds,
        calls=calls,
        outsider=outsider,
    )


def _semaphore_round(reply: Any) -> RoundAnswer:
    """``semaphore_line``'s reply, or its refusal of the limit.

    {0, first permit's ms, alive, server ms, missing, then (token, fence, ms)
    of each member holding, and (token, 0, ms) of each joiner whose token a
    permit of another call holds}, or {2, stored limit}.
    """
    if int(reply[0]) == 2:
        return RoundAnswer(False, 0, False, -2, stored_limit=int(reply[1]))
    server_ms = int(reply[3])
    holds = {}
    others = {}
    for i in range(5, len(reply) - 2, 3):
        token, fence, ms = to_text(reply[i]), int(reply[i + 1]), int(reply[i + 2])
        if fence > 0:
            holds[token] = Acquired(fence=fence, lease_ms=ms, server_ms=server_ms)
        else:  # (fences are > 0)
            others[token] = ms
    return RoundAnswer(
        alive=bool(int(reply[2])),
        server_ms=server_ms,
        missing=bool(int(reply[4])),
        ttl_ms=int(reply[1]),
        holds=holds,
        others=others,
    )


LINE_SCRIPTS: dict[str, Callable[[Any], RoundAnswer]] = {
    "lock_line": _lock_round,
    "semaphore_line": _semaphore_round,
}
"""The line scripts, each with the reader of its reply."""
