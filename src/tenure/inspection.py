"""``tenure inspect``: what tenure's primitives hold right now, and who waits.

Finds primitives with SCAN (never KEYS), on every primary of a cluster, and
describes each with a *view*: one per kind of primitive, keyed by its key
prefix. A later primitive plugs in by calling :func:`register_view` with its
own view; nothing else changes::

    from tenure.inspection import inspect
    for row in inspect(client):
        print(row.kind, row.name, row.state)

Beside the primitives, the same SCANs find what ``tenure metrics`` exports:
ingestion jobs (:func:`ingest_jobs`), stream consumer groups
(:func:`stream_groups`) and id sets' sizes (:func:`idset_sizes`); and
:func:`near_tracking` lists the processes that near-cache (``near=``) on
each server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.cluster

from tenure._backends.near_tracking import NAME_PREFIX
from tenure._core.ingest import IngestKeys, IngestStatus
from tenure._core.leased import base_key, name_from_key
from tenure._core.stream import dead_letter_key
from tenure._core.values import to_text
from tenure._sync._ingest import read_status

__all__ = [
    "IdSetSize",
    "NearTracking",
    "Primitive",
    "StreamGroup",
    "View",
    "elide",
    "idset_sizes",
    "ingest_jobs",
    "inspect",
    "near_tracking",
    "register_view",
    "render_near",
    "render_table",
    "stream_groups",
    "views",
]

Client = redis.Redis | redis.cluster.RedisCluster


@dataclass
class Primitive:
    """One primitive's state as the server holds it.

    ``holders`` lists ``{"token"/"id", "owner", "lease_ms", ...}`` per holder;
    ``waiters`` lists ``{"token", "owner", "waited_ms"}`` in queue order.
    ``owner`` is the owner name stored beside the hold or place in line
    (``host:pid`` unless the primitive was given ``owner_name=``), or None
    where none is stored (a Redlock's waiters). ``idle``
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


def _owners(client: Client, key: str, tokens: list[str]) -> list[str | None]:
    """The owner names a hash ``key`` keeps for ``tokens`` (None where it has none)."""
    if not tokens:
        return []
    found: list[Any] = list(client.hmget(key, tokens))
    return [None if owner is None else to_text(owner) for owner in found]


def _queue(client: Client, base: str, now_ms: int) -> list[dict[str, Any]]:
    entries: list[Any] = list(client.zrange(f"{base}:queue", 0, -1, withscores=True))
    tokens = [to_text(token) for token, _ in entries]
    owners = _owners(client, f"{base}:names", tokens)
    return [
        {"token": token, "owner": owner, "waited_ms": max(0, now_ms - int(score) // 1000)}
        for token, owner, (_, score) in zip(tokens, owners, entries, strict=True)
    ]


def _fence(client: Client, base: str) -> int | None:
    value = client.get(f"{base}:fence")
    return None if value is None else int(value)


def _describe_owner(kind: str) -> Callable[[Client, str, str, int], Primitive]:
    """A lock's view, or one master's part of a Redlock (the same keys)."""

    def describe(client: Client, base: str, name: str, now_ms: int) -> Primitive:
        token, fence, owner = client.hmget(base, ["token", "fence", "owner"])
        holders = []
        if token is not None:
            holders.append(
                {
                    "token": to_text(token),
                    "owner": None if owner is None else to_text(owner),
                    "lease_ms": int(client.pttl(base)),
                }
            )
        waiters = _queue(client, base, now_ms)
        state = "held" if holders else "free"
        last = int(fence) if fence else _fence(client, base)  # the counter only when free
        return Primitive(kind, name, state, last, holders, waiters)

    return describe


def _describe_leases(kind: str) -> Callable[[Client, str, str, int], Primitive]:
    def describe(client: Client, base: str, name: str, now_ms: int) -> Primitive:
        members: list[Any] = list(client.zrange(base, 0, -1, withscores=True))
        live = [(to_text(token), int(score)) for token, score in members if int(score) > now_ms]
        owners = _owners(client, f"{base}:owners", [token for token, _ in live])
        holders: list[dict[str, Any]] = [
            {"token": token, "owner": owner, "lease_ms": expiry - now_ms}
            for (token, expiry), owner in zip(live, owners, strict=True)
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
    named = client.get(f"{base}:owner")
    holder = {
        "id": owner_id,
        "owner": None if named is None else to_text(named),
        "connected": alive,
        "lease_ms": int(client.pttl(base)),
    }
    return Primitive("connlock", name, "held" if alive else "stale", None, [holder])


def _idset_numbers(client: Client, base: str) -> tuple[int, int] | None:
    """An id set's ids in its compact form and ids written since; None: no id set there."""
    count, pending, version = client.hmget(f"{base}:meta", ["count", "pending", "version"])
    if version is None:  # only a compaction's leftovers
        return None
    return int(count or 0), int(pending or 0)


def _describe_idset(client: Client, base: str, name: str, now_ms: int) -> Primitive:
    """An id set: its size, the writes not folded in yet, and a running compaction."""
    numbers = _idset_numbers(client, base)
    if numbers is None:
        return Primitive("idset", name, "free")
    holders = []
    compactor = client.get(f"{base}:lease")
    if compactor is not None:
        lease_ms = int(client.pttl(f"{base}:lease"))
        token, _, owner = to_text(compactor).partition(" ")  # "token host:pid"
        holders.append({"token": token, "owner": owner or None, "lease_ms": lease_ms})
    size, writes = numbers
    state = "compacting" if holders else f"{size:,} (+{writes:,})" if writes else f"{size:,} ids"
    return Primitive("idset", name, state, None, holders, idle=not holders)


_IDSET_PREFIX = "tenure:idset:"

for _view in (
    View("lock", "tenure:lock:", _describe_owner("lock")),
    View("semaphore", "tenure:semaphore:", _describe_leases("semaphore")),
    View("rwlock", "tenure:rwlock:", _describe_leases("rwlock")),
    View("connlock", "tenure:connlock:", _describe_connlock),
    View("redlock", "tenure:redlock:", _describe_owner("redlock")),
    View("idset", _IDSET_PREFIX, _describe_idset),
):
    register_view(_view)


def _glob(text: str) -> str:
    """``text`` matched literally in a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _names(client: Client, view_prefix: str, name_prefix: str) -> Iterable[str]:
    seen: set[str] = set()
    for opening in ("{", "("):
        pattern = f"{_glob(view_prefix)}{_glob(opening + name_prefix)}*"
        for key in client.scan_iter(match=pattern, count=500):
            name = name_from_key(to_text(key), view_prefix)
            if name is not None and name not in seen:
                seen.add(name)
                yield name


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
            row = view.describe(client, base_key(view.prefix, name), name, now_ms)
            if include_free or (row.state != "free" and not row.idle) or row.waiters:
                found.append(row)
    return found


@dataclass(frozen=True)
class IdSetSize:
    """An id set's size, as :func:`idset_sizes` reads it.

    ``ids``: the ids in its compact form (as of its last compaction);
    ``pending``: ids written since and not folded in yet (adds and removes);
    ``compacting``: whether a compaction is running.
    """

    name: str
    ids: int
    pending: int
    compacting: bool


def idset_sizes(client: Client, prefix: str = "") -> list[IdSetSize]:
    """Every id set whose name starts with ``prefix``, at rest or not, by name."""
    found = []
    for name in sorted(_names(client, _IDSET_PREFIX, prefix)):
        base = base_key(_IDSET_PREFIX, name)
        numbers = _idset_numbers(client, base)
        if numbers is not None:
            compacting = bool(client.exists(f"{base}:lease"))
            found.append(IdSetSize(name, *numbers, compacting=compacting))
    return found


def ingest_jobs(client: Client, prefix: str = "tenure:ingest:") -> dict[str, IngestStatus]:
    """Every ingestion job under ``prefix`` (:class:`~tenure.IngestJob`'s default), by name.

    Each job is found by its plan's key (SCAN) and read as ``tenure ingest
    status`` reads it (one script call, no source needed); a job reset
    meanwhile is left out.
    """
    names = set()
    for key in client.scan_iter(match=IngestKeys.for_job(_glob(prefix), "*").plan, count=500):
        name = name_from_key(to_text(key), prefix)
        if name and IngestKeys.for_job(prefix, name).plan == to_text(key):
            names.add(name)
    found = {}
    for name in sorted(names):
        status = read_status(client, IngestKeys.for_job(prefix, name), name=name)
        if status.chunks:
            found[name] = status
    return found


@dataclass
class NearTracking:
    """One server's near caching, as :func:`near_tracking` reads it.

    ``tracking_clients`` and ``prefixes``: the server's own count of the
    connections that track keys (tenure's and any other) and of the prefixes
    tracked (INFO). ``processes``: each tenure process's tracking connection,
    as ``(host:pid, seconds connected, seconds idle)``: it pings four times
    per ``max_staleness``, so one idle longer than that has stopped (and its
    process's near caches read from the server meanwhile).
    """

    server: str
    tracking_clients: int
    prefixes: int
    processes: list[tuple[str, int, int]] = field(default_factory=list)


def near_tracking(client: Client) -> list[NearTracking]:
    """Near caching on each server of ``client`` (each primary of a cluster), by server."""
    if isinstance(client, redis.cluster.RedisCluster):
        nodes = [(str(n.name), n.redis_connection) for n in client.get_primaries()]  # type: ignore[no-untyped-call]
    else:
        kwargs = client.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        nodes = [(str(where), client)]
    found = []
    for where, node in nodes:
        if node is None:
            continue
        info = node.info()  # (tracking_clients: clients; tracking_total_prefixes: stats)
        seen = NearTracking(
            where, int(info.get("tracking_clients", 0)), int(info.get("tracking_total_prefixes", 0))
        )
        for each in node.client_list():
            name = to_text(each.get("name", ""))
            if name.startswith(NAME_PREFIX):
                process = name.removeprefix(NAME_PREFIX)
                seen.processes.append((process, int(each["age"]), int(each["idle"])))
        seen.processes.sort()
        found.append(seen)
    return found


_DEAD_LETTERS_COUNTED = 10_000  # entries read of a dead-letter stream several groups share


@dataclass(frozen=True)
class StreamGroup:
    """One consumer group of a stream, as the server holds it.

    ``pending``: messages delivered to its consumers and not acknowledged;
    ``lag``: entries not delivered to it yet (None where the server cannot
    say: before Redis 7, or after entries were deleted); ``dead_letters``: its
    messages in the stream's dead-letter stream ``<stream>:dead``
    (:class:`~tenure.StreamConsumer`'s default), counted from the
    ``tenure-group`` field of its first 10,000 entries when several groups
    share it.
    """

    stream: str
    group: str
    consumers: int
    pending: int
    lag: int | None
    dead_letters: int


def stream_groups(client: Client, match: str = "*") -> list[StreamGroup]:
    """The consumer groups of every stream whose key matches the SCAN pattern ``match``.

    Streams without a group (a dead-letter stream, an ingestion sink nobody
    reads yet) are left out. By stream, then group.
    """
    streams = {to_text(key) for key in client.scan_iter(match=match, count=500, _type="stream")}
    found = []
    for stream in sorted(streams):
        groups: list[dict[str, Any]] = list(client.xinfo_groups(stream))
        names = [to_text(group["name"]) for group in groups]
        dead = _dead_letters(client, dead_letter_key(stream), names)
        for name, group in zip(names, groups, strict=True):
            lag = group.get("lag")
            found.append(
                StreamGroup(
                    stream,
                    name,
                    int(group["consumers"]),
                    int(group["pending"]),
                    None if lag is None else int(lag),
                    dead.get(name, 0),
                )
            )
    return found


def _dead_letters(client: Client, dead: str, groups: list[str]) -> dict[str, int]:
    """Entries of dead-letter stream ``dead`` per group (each entry names its group)."""
    if len(groups) <= 1:  # (no group: nothing asked; one: every entry is its)
        return {group: int(client.xlen(dead)) for group in groups}
    counts = dict.fromkeys(groups, 0)
    start, page = "-", 1000
    for _ in range(_DEAD_LETTERS_COUNTED // page):
        entries: list[Any] = list(client.xrange(dead, start, "+", count=page) or [])
        for _, fields in entries:
            group = fields.get(b"tenure-group", fields.get("tenure-group"))
            if group is not None and to_text(group) in counts:
                counts[to_text(group)] += 1
        if len(entries) < page:
            break
        start = "(" + to_text(entries[-1][0])
    return counts


TABLE_WIDTH = 100
"""The widest line :func:`render_table` writes unless ``wide=True``."""

# (header, width, right-aligned) of each column of the 100-column table; the
# widths and their one-space gaps add up to TABLE_WIDTH.
_COLUMNS = (
    ("KIND", 9, False),
    ("NAME", 18, False),
    ("STATE", 13, False),
    ("FENCE", 16, True),
    ("HOLDER (lease left)", 26, False),
    ("WAIT", 4, True),
    ("LONGEST", 7, True),
)
_WIDE_HEADERS = ("KIND", "NAME", "STATE", "FENCE", "HOLDERS (lease left)", "WAIT", "LONGEST")


def elide(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters by a ``…`` in its middle.

    A short last part after ``:`` (the pid of ``host:pid``) is kept whole.
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    tail = (width - 1) // 2
    _, colon, last = text.rpartition(":")
    if colon and len(last) + 1 <= tail:
        tail = len(last) + 1
    return text[: width - 1 - tail] + "…" + (text[-tail:] if tail else "")


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on (newline, tab, escape) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _who(entry: dict[str, Any]) -> str:
    """A holder's or waiter's owner name, else its token's (or connection id's) start."""
    owner = entry.get("owner")
    if owner:
        return printable(str(owner))
    return printable(str(entry.get("token", entry.get("id")))[:8])


def _seconds(ms: int | None) -> str:
    """A wait in seconds, in at most 7 characters below 11 days."""
    if ms is None:
        return "-"
    return f"{ms / 1000:.2f}s" if ms < 100_000 else f"{ms / 1000:.0f}s"


def render_near(rows: list[NearTracking]) -> str:
    """:func:`near_tracking`'s findings as text: a line per server, a line per process."""
    lines = []
    for row in rows:
        lines.append(
            f"{row.server}: {len(row.processes)} tenure process(es) near-caching; the server "
            f"counts {row.tracking_clients} tracking client(s), {row.prefixes} prefix(es)"
        )
        for process, age, idle in row.processes:
            lines.append(f"  {elide(printable(process), 50):<50}  connected {age:,}s  idle {idle}s")
    return "\n".join(lines)


def _lease(holder: dict[str, Any]) -> str:
    lease_ms = holder.get("lease_ms", -1)
    return f"({lease_ms / 1000:.1f}s)" if lease_ms >= 0 else "(no lease)"


def _holders_cell(row: Primitive, width: int | None) -> str:
    """The first holder with its lease (and ``+N`` more); every holder when ``width`` is None."""
    if not row.holders:
        return "-"
    if width is None:
        return ", ".join(f"{_who(h)} {_lease(h)}" for h in row.holders)
    first = row.holders[0]
    suffix = f" {_lease(first)}"
    if len(row.holders) > 1:
        suffix += f" +{len(row.holders) - 1}"
    return elide(_who(first), max(1, width - len(suffix))) + suffix


def _waiters_cell(row: Primitive) -> str:
    return ", ".join(f"{_who(w)} ({w['waited_ms'] / 1000:.1f}s)" for w in row.waiters) or "-"


def render_table(rows: list[Primitive], *, wide: bool = False) -> str:
    """A human table, one line per primitive, at most 100 columns wide.

    Long names are cut in the middle and only the first holder is shown
    (with ``+N`` for the others). ``wide=True`` shows everything in full:
    every holder, and a last column with every waiter and how long it has
    waited.
    """
    cells: list[list[Any]] = []
    for row in rows:
        longest = max((w["waited_ms"] for w in row.waiters), default=None)
        cells.append(
            [
                row.kind,
                printable(row.name),
                row.state,
                "-" if row.fencing_token is None else str(row.fencing_token),
                row,
                str(len(row.waiters)),
                _seconds(longest),
            ]
        )
    if wide:
        return _render_wide(rows, cells)
    lines = [_line([(h, w, right) for h, w, right in _COLUMNS])]
    lines.append("-" * TABLE_WIDTH)
    for row_cells in cells:
        parts = []
        for (_, width, right), cell in zip(_COLUMNS, row_cells, strict=True):
            text = _holders_cell(cell, width) if isinstance(cell, Primitive) else elide(cell, width)
            parts.append((text, width, right))
        lines.append(_line(parts))
    if not rows:
        lines.append("(no tenure primitives found)")
    return "\n".join(lines)


def _line(parts: list[tuple[str, int, bool]]) -> str:
    return " ".join(
        f"{text:>{width}}" if right else f"{text:<{width}}" for text, width, right in parts
    ).rstrip()


def _render_wide(rows: list[Primitive], cells: list[list[Any]]) -> str:
    table = [
        [_holders_cell(cell, None) if isinstance(cell, Primitive) else cell for cell in row_cells]
        + [_waiters_cell(row)]
        for row, row_cells in zip(rows, cells, strict=True)
    ]
    headers = [*_WIDE_HEADERS, "WAITERS (waited)"]
    widths = [max([len(h)] + [len(r[i]) for r in table]) for i, h in enumerate(headers)]
    right = [False, False, False, True, False, True, True, False]
    lines = [_line(list(zip(headers, widths, right, strict=True)))]
    lines.append("-" * len(lines[0]))
    lines += [_line(list(zip(r, widths, right, strict=True))) for r in table]
    if not rows:
        lines.append("(no tenure primitives found)")
    return "\n".join(lines)
