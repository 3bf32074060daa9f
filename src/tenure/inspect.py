"""``tenure inspect``: what tenure's primitives hold right now, and who waits.

Finds primitives with SCAN (never KEYS), on every primary of a cluster, and
describes each with a *view*: one per kind of primitive, keyed by its key
prefix. A later primitive plugs in by calling :func:`register_view` with its
own view; nothing else changes::

    from tenure.inspect import inspect
    for row in inspect(client):
        print(row.kind, row.name, row.state)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.cluster

from tenure._leased_core import to_text

__all__ = ["Primitive", "View", "inspect", "register_view", "render_table", "views"]

Client = redis.Redis | redis.cluster.RedisCluster


@dataclass
class Primitive:
    """One primitive's state as the server holds it.

    ``holders`` lists ``{"token"/"id", "lease_ms", ...}`` per holder;
    ``waiters`` lists ``{"token", "waited_ms"}`` in queue order. ``idle``
    marks a row with nothing going on that is not ``free`` (an id set at
    rest): like free ones, it is listed only with ``include_free=True``.
    """

    kind: str
    name: str
    state: str
    fencing_token: int | None = None
    holders: list[dict[str, Any]] = field(default_factory=list)
    waiters: list[dict[str, Any]] = field(default_factory=list)
    idle: bool = False


@dataclass(frozen=True)
class View:
    """How to find and describe one kind of primitive.

    ``prefix`` is its key prefix (keys are ``{prefix}{{{name}}}...``);
    ``describe(client, base_key, name, now_ms)`` returns its state.
    """

    kind: str
    prefix: str
    describe: Callable[[Client, str, str, int], Primitive]


_VIEWS: list[View] = []


def register_view(view: View) -> None:
    """Add a view (a later primitive's); a view with the same kind is replaced."""
    _VIEWS[:] = [v for v in _VIEWS if v.kind != view.kind] + [view]


def views() -> list[View]:
    """The registered views."""
    return list(_VIEWS)


def _queue(client: Client, base: str, now_ms: int) -> list[dict[str, Any]]:
    entries: list[Any] = list(client.zrange(f"{base}:queue", 0, -1, withscores=True))
    return [
        {"token": to_text(token), "waited_ms": max(0, now_ms - int(score) // 1000)}
        for token, score in entries
    ]


def _fence(client: Client, base: str) -> int | None:
    value = client.get(f"{base}:fence")
    return None if value is None else int(value)


def _describe_owner(kind: str) -> Callable[[Client, str, str, int], Primitive]:
    """A lock's view, or one master's part of a Redlock (the same keys)."""

    def describe(client: Client, base: str, name: str, now_ms: int) -> Primitive:
        token, fence = client.hmget(base, ["token", "fence"])
        holders = []
        if token is not None:
            holders.append({"token": to_text(token), "lease_ms": int(client.pttl(base))})
        waiters = _queue(client, base, now_ms)
        state = "held" if holders else "free"
        last = int(fence) if fence else _fence(client, base)  # the counter only when free
        return Primitive(kind, name, state, last, holders, waiters)

    return describe


def _describe_leases(kind: str) -> Callable[[Client, str, str, int], Primitive]:
    def describe(client: Client, base: str, name: str, now_ms: int) -> Primitive:
        members: list[Any] = list(client.zrange(base, 0, -1, withscores=True))
        holders: list[dict[str, Any]] = [
            {"token": to_text(token), "lease_ms": int(score) - now_ms}
            for token, score in members
            if int(score) > now_ms
        ]
        if kind == "rwlock":
            writers = [h for h in holders if str(h["token"]).startswith("w")]
            state = "write-held" if writers else f"read-held x{len(holders)}" if holders else "free"
        else:
            state = f"{len(holders)} held" if holders else "free"
        return Primitive(
            kind, name, state, _fence(client, base), holders, _queue(client, base, now_ms)
        )

    return describe


def _describe_connlock(client: Client, base: str, name: str, now_ms: int) -> Primitive:
    owner = client.get(base)
    if owner is None:
        return Primitive("connlock", name, "free")
    owner_id = to_text(owner)
    alive = bool(client.client_list(client_id=[owner_id]))
    holder = {"id": owner_id, "connected": alive, "lease_ms": int(client.pttl(base))}
    return Primitive("connlock", name, "held" if alive else "stale", None, [holder])


def _describe_idset(client: Client, base: str, name: str, now_ms: int) -> Primitive:
    """An id set: its size, the writes not folded in yet, and a running compaction."""
    count, pending, version = client.hmget(f"{base}:meta", ["count", "pending", "version"])
    if version is None:  # only a compaction's leftovers
        return Primitive("idset", name, "free")
    holders = []
    compactor = client.get(f"{base}:lease")
    if compactor is not None:
        holders.append({"token": to_text(compactor), "lease_ms": int(client.pttl(f"{base}:lease"))})
    size, writes = int(count or 0), int(pending or 0)
    state = "compacting" if holders else f"{size:,} (+{writes:,})" if writes else f"{size:,} ids"
    return Primitive("idset", name, state, None, holders, idle=not holders)


for _view in (
    View("lock", "tenure:lock:", _describe_owner("lock")),
    View("semaphore", "tenure:semaphore:", _describe_leases("semaphore")),
    View("rwlock", "tenure:rwlock:", _describe_leases("rwlock")),
    View("connlock", "tenure:connlock:", _describe_connlock),
    View("redlock", "tenure:redlock:", _describe_owner("redlock")),
    View("idset", "tenure:idset:", _describe_idset),
):
    register_view(_view)

_NAME = re.compile(r"^\{(?P<name>[^{}]+)\}")


def _names(client: Client, view_prefix: str, name_prefix: str) -> Iterable[str]:
    seen: set[str] = set()
    pattern = f"{view_prefix}{{{name_prefix}*"
    for key in client.scan_iter(match=pattern, count=500):
        rest = to_text(key)[len(view_prefix) :]
        match = _NAME.match(rest)
        if match and match["name"] not in seen:
            seen.add(match["name"])
            yield match["name"]


def inspect(client: Client, prefix: str = "", *, include_free: bool = False) -> list[Primitive]:
    """Every tenure primitive whose name starts with ``prefix``, with its state.

    A primitive whose state is ``free`` or that is idle, and that nobody
    waits for (a lock's fencing counter lives on for a while after its last
    use; an id set at rest stays), is listed only with ``include_free=True``.
    A Redlock's row is the state of the one master ``client`` talks to.
    """
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    found = []
    for view in _VIEWS:
        for name in sorted(_names(client, view.prefix, prefix)):
            row = view.describe(client, f"{view.prefix}{{{name}}}", name, now_ms)
            if include_free or (row.state != "free" and not row.idle) or row.waiters:
                found.append(row)
    return found


def render_table(rows: list[Primitive]) -> str:
    """A human table: one line per primitive."""
    header = (
        f"{'KIND':<10}{'NAME':<24}{'STATE':<16}{'FENCE':>16}  "
        f"{'HOLDERS (lease left)':<40}{'WAITING':>8}  {'LONGEST WAIT':>12}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        holders = ", ".join(
            f"{str(h.get('token', h.get('id')))[:8]} ({h['lease_ms'] / 1000:.1f}s)"
            if h.get("lease_ms", -1) >= 0
            else f"{str(h.get('token', h.get('id')))[:8]} (no lease)"
            for h in row.holders[:3]
        )
        if len(row.holders) > 3:
            holders += f" +{len(row.holders) - 3}"
        longest = max((w["waited_ms"] for w in row.waiters), default=None)
        longest_text = "-" if longest is None else f"{longest / 1000:.2f}s"
        fence = "-" if row.fencing_token is None else str(row.fencing_token)
        lines.append(
            f"{row.kind:<10}{row.name[:23]:<24}{row.state:<16}{fence:>16}  {holders[:39]:<40}"
            f"{len(row.waiters):>8}  {longest_text:>12}"
        )
    if not rows:
        lines.append("(no tenure primitives found)")
    return "\n".join(lines)
