"""A fault proxy's rules: the faults it applies now, and the replies it is to lose.

:class:`ProxyFaults` is the public, immutable snapshot of the faults
(:attr:`FaultProxy.faults <tenure.server.FaultProxy.faults>`);
:class:`LostReplies` is the :meth:`~tenure.server.FaultProxy.lose_reply`
rule; :class:`FaultRules` holds both for one proxy, read by its relaying
tasks and changed by its control methods (the semantics are drawn in the
module docstring of ``tenure.server._proxy``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Literal

from tenure._core.exceptions import ArgumentError

__all__ = [
    "NO_FAULTS",
    "REFUSE_MODES",
    "Direction",
    "FaultRules",
    "LostReplies",
    "ProxyFaults",
    "RefuseMode",
    "directed",
]

#: Which way a fault applies: client -> server, server -> client, or both.
Direction = Literal["upstream", "downstream", "both"]
#: How new connections are turned away (see :meth:`FaultProxy.refuse_connections`).
RefuseMode = Literal["refuse", "reset", "close"]

_DIRECTIONS: dict[str, tuple[bool, bool]] = {
    "upstream": (True, False),
    "downstream": (False, True),
    "both": (True, True),
}
REFUSE_MODES = ("refuse", "reset", "close")


@dataclasses.dataclass(frozen=True)
class ProxyFaults:
    """The faults a :class:`FaultProxy` applies now (an immutable snapshot).

    Latencies are in seconds; ``refusing`` is ``None`` when new connections
    are accepted, else the :meth:`FaultProxy.refuse_connections` mode.
    """

    upstream_latency: float = 0.0
    downstream_latency: float = 0.0
    upstream_blackhole: bool = False
    downstream_blackhole: bool = False
    refusing: RefuseMode | None = None

    @property
    def active(self) -> bool:
        """Whether any fault is set."""
        return self != NO_FAULTS

    def _latency(self, upstream: bool) -> float:
        return self.upstream_latency if upstream else self.downstream_latency

    def _blackholed(self, upstream: bool) -> bool:
        return self.upstream_blackhole if upstream else self.downstream_blackhole

    def __str__(self) -> str:
        parts = []
        for label, upstream in (("up", True), ("down", False)):
            if self._blackholed(upstream):
                parts.append(f"{label}:blackhole")
            if self._latency(upstream):
                parts.append(f"{label}:+{self._latency(upstream):g}s")
        if self.refusing is not None:
            parts.append(f"new:{self.refusing}")
        return " ".join(parts) or "none"


NO_FAULTS = ProxyFaults()


def directed(direction: str, fault: str, value: object) -> dict[str, Any]:
    """The changes setting ``<side>_<fault>`` to ``value`` for the side(s) of ``direction``."""
    try:
        upstream, downstream = _DIRECTIONS[direction]
    except KeyError:
        raise ArgumentError(
            "direction", f"expected 'upstream', 'downstream' or 'both', not {direction!r}"
        ) from None
    sides = [side for side, on in (("upstream", upstream), ("downstream", downstream)) if on]
    return {f"{side}_{fault}": value for side in sides}


class LostReplies:
    """The :meth:`~tenure.server.FaultProxy.lose_reply` rule: what to match, how often more.

    Changed while the proxy runs only on its event loop (the proxy sees to
    that), where its connections scan their upstream bytes with it.
    """

    def __init__(self) -> None:
        self.match = b""
        self.left = 0  # matching commands whose reply is still to be lost
        self.lost = 0  # replies lost since the proxy was created

    def arm(self, match: bytes, count: int) -> None:
        """Lose the reply of the next ``count`` commands containing ``match`` (0: disarm)."""
        self.match, self.left = match, count

    def scan(self, tail: bytes, data: bytes) -> tuple[bool, bytes]:
        """Whether ``data`` completes a match, and the connection's tail to keep.

        ``tail`` is the end of what the connection sent before, so a match
        may span two chunks; a match counts against :attr:`left`.
        """
        match = self.match
        if self.left <= 0 or not match:
            return False, tail
        window = tail + data
        if match in window:
            self.left -= 1
            return True, b""
        return False, window[max(0, len(window) - len(match) + 1) :]


class FaultRules:
    """One proxy's faults: the snapshot applied now, the lost-reply rule, the heal signal.

    :attr:`now` is replaced whole (from any thread, under the proxy's lock)
    and read by the relaying tasks without a lock. The heal signal is an
    event of the proxy's loop, made by :meth:`open` there.
    """

    def __init__(self) -> None:
        self.now = NO_FAULTS
        self.lost_replies = LostReplies()
        self._changed: asyncio.Event | None = None

    def update(self, changes: dict[str, Any]) -> None:
        """Apply ``changes`` (field names of :class:`ProxyFaults`) to the snapshot."""
        self.now = dataclasses.replace(self.now, **changes)

    def open(self) -> None:
        """On the proxy's loop, as it starts: the signal writers wait on for a heal."""
        self._changed = asyncio.Event()

    def close(self) -> None:
        """Once the proxy's loop is gone."""
        self._changed = None

    def changed(self) -> None:
        """On the proxy's loop: the faults changed; wake writers waiting for a partition."""
        changed = self._changed
        if changed is not None:
            changed.set()
            self._changed = asyncio.Event()

    async def healed(self, upstream: bool) -> None:
        """Return once ``upstream`` (or downstream) is not blackholed (or the proxy stops)."""
        while True:
            changed = self._changed
            if changed is None or not self.now._blackholed(upstream):
                return
            await changed.wait()
