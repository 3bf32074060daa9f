"""Chunked ingestion, the sans-IO half: plans, chunk ranges, keys, replies.

A job reads a source in chunks of primary-key ranges (never OFFSET) and
appends every row to a sink exactly once. The plan — the source's
description, its key range and the chunk size — is frozen on the server
under the job's name; its fingerprint refuses a different plan under the
same name. Every function here is pure and tested without a server
(``tests/test_ingest_core.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tenure._core.exceptions import ArgumentError
from tenure._core.values import to_text

__all__ = [
    "ChunkHolder",
    "Claim",
    "IngestKeys",
    "IngestStatus",
    "Plan",
    "ResetReport",
    "WorkerReport",
    "chunk_range",
    "parse_claim",
    "parse_sink",
    "parse_status",
]

REPLANNED = "replanned"  # parse_claim: the job holds no plan or another one (reset meanwhile)
HOLDERS_LISTED = 100  # running claims listed by a status read
MAX_KEY = 2**53 - 1  # keys the scripts count exactly (as sources.MAX_KEY)
MAX_CHUNKS = 100_000  # a plan's chunks, each a member of the job's free set


@dataclass(frozen=True)
class Plan:
    """What a job ingests: the source, its key range and the chunk size."""

    source: dict[str, Any]  # the source's own description (kind, table, key column...)
    low: int  # the smallest key
    high: int  # the largest key
    chunk_size: int  # keys per chunk (a range of keys, whether or not each exists)

    def __post_init__(self) -> None:
        for name in ("low", "high", "chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentError(name, f"must be an int, got {type(value).__name__}")
        if self.chunk_size < 1:
            raise ArgumentError("chunk_size", f"must be at least 1, got {self.chunk_size}")
        for name in ("low", "high"):
            key = getattr(self, name)
            if not -MAX_KEY <= key <= MAX_KEY:
                raise ArgumentError(
                    name,
                    f"the source's key {key} is outside +-{MAX_KEY:,} (2**53 - 1): the range "
                    "the server's scripts count exactly",
                )
        if self.high < self.low:
            raise ArgumentError("high", f"the key range is empty ({self.low}..{self.high})")
        if self.chunks > MAX_CHUNKS:
            needed = -(-(self.high - self.low + 1) // MAX_CHUNKS)
            raise ArgumentError(
                "chunk_size",
                f"keys {self.low}..{self.high} in chunks of {self.chunk_size:,} make "
                f"{self.chunks:,} chunks, more than {MAX_CHUNKS:,}: use a chunk_size of at "
                f"least {needed:,} (with sparse keys, chunks hold fewer rows than keys)",
            )

    @property
    def chunks(self) -> int:
        """How many chunks the key range makes."""
        return (self.high - self.low) // self.chunk_size + 1

    def as_json(self) -> str:
        """The plan, canonically (sorted keys, no spaces): what the fingerprint hashes."""
        return json.dumps(
            {"source": self.source, "low": self.low, "high": self.high, "chunk": self.chunk_size},
            sort_keys=True,
            separators=(",", ":"),
        )

    @property
    def fingerprint(self) -> str:
        """SHA-256 of :meth:`as_json`: equal plans, equal fingerprints."""
        return hashlib.sha256(self.as_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan :meth:`as_json` wrote."""
        data = json.loads(text)
        return cls(data["source"], data["low"], data["high"], data["chunk"])


def chunk_range(plan: Plan, chunk: int) -> tuple[int, int]:
    """The first and last key (both included) of ``chunk``."""
    if not 0 <= chunk < plan.chunks:
        raise ArgumentError("chunk", f"no chunk {chunk} in a plan of {plan.chunks}")
    first = plan.low + chunk * plan.chunk_size
    return first, min(plan.high, first + plan.chunk_size - 1)


@dataclass(frozen=True)
class IngestKeys:
    """The keys of one job, all under the ``{name}`` hash tag (see ``lua/ingest_*.lua``)."""

    plan: str  # hash: fingerprint, plan (JSON), chunks
    free: str  # zset: chunk -> lease expiry in ms (0: free); done chunks leave it
    leases: str  # hash: chunk -> the claim's token ("done:"/"released:" + it, once done/given back)
    cursors: str  # hash: chunk -> the last key committed
    stats: str  # hash: rows, chunks_done, claims
    fence: str  # counter: each claim's fencing number
    reset: str  # hash: the last reset's operation id and figures (expires; see ingest_reset)

    @classmethod
    def for_job(cls, prefix: str, name: str) -> IngestKeys:
        """The keys of job ``name``."""
        base = f"{prefix}{{{name}}}"  # each key is the base and its field's name
        return cls(**{field: f"{base}:{field}" for field in cls.__dataclass_fields__})

    def default_sink(self) -> str:
        """The job's own stream, in its hash slot."""
        return self.plan.removesuffix(":plan") + ":rows"


@dataclass(frozen=True)
class Claim:
    """One claimed chunk: its number, the claim's fencing number, and where to resume."""

    chunk: int
    fence: int
    cursor: int | None  # the last key committed by an earlier claim, if any
    taken_over: bool = False  # its last lease ran out unreleased (a dead worker's chunk)


def parse_claim(reply: Any) -> Claim | float | str | None:
    """``ingest_claim``'s reply: a :class:`Claim`, seconds to wait (all leased), None (done).

    :data:`REPLANNED` when the job holds no plan or another one than the caller's.
    """
    if not isinstance(reply, (list, tuple)) or not reply:
        raise ValueError(f"unexpected ingest_claim reply: {reply!r}")
    status = int(reply[0])
    if status in (0, -3):  # -3: this claim was given back before it arrived (never read)
        return None
    if status == -2:
        return REPLANNED
    if status == -1:
        return max(0.0, int(reply[1]) / 1000)
    if status == 1 and len(reply) in (4, 5):  # (4: a resent call's answer)
        cursor = None if reply[3] is None else int(reply[3])
        taken_over = len(reply) == 5 and int(reply[4]) == 1
        return Claim(chunk=int(reply[1]), fence=int(reply[2]), cursor=cursor, taken_over=taken_over)
    raise ValueError(f"unexpected ingest_claim reply: {reply!r}")


@dataclass(frozen=True)
class ChunkHolder:
    """A running claim: its chunk, the worker holding it, its lease and its cursor."""

    chunk: int
    worker: str  # the worker's name (IngestJob's ``worker``: host:pid by default)
    lease_left: float  # seconds before another worker may take the chunk over
    cursor: int | None  # the last key committed in the chunk, if any


@dataclass(frozen=True)
class IngestStatus:
    """Where a job stands, read at one instant of the server's clock.

    Chunks done, claimed (lease running) and free; rows committed; claims made
    (more claims than chunks: chunks taken over from workers that died or
    hung); when the first claim and the last commit happened (server time,
    ms since the epoch; 0 before); and the running claims' holders (up to
    100).
    """

    chunks: int
    done: int
    claimed: int
    free: int
    rows: int
    claims: int
    started_ms: int = 0
    updated_ms: int = 0
    holders: tuple[ChunkHolder, ...] = ()

    @property
    def finished(self) -> bool:
        """Whether every chunk is done."""
        return self.chunks > 0 and self.done == self.chunks

    @property
    def elapsed(self) -> float:
        """Seconds from the first claim to the last commit."""
        return max(0, self.updated_ms - self.started_ms) / 1000 if self.started_ms else 0.0

    @property
    def rate(self) -> float:
        """Rows per second from the first claim to the last commit (0 before two instants)."""
        return self.rows / self.elapsed if self.elapsed > 0 else 0.0


@dataclass(frozen=True)
class WorkerReport:
    """What one :meth:`IngestJob.work` call did."""

    chunks: int
    rows: int
    refused: int  # batches refused: the chunk's lease had passed to another worker


@dataclass(frozen=True)
class ResetReport:
    """What :meth:`IngestJob.reset` removed: the job's keys, and the sink's entries if asked."""

    keys: int  # the job's keys that existed and were deleted (plan, chunks, claims...)
    sink: str | None  # the sink key deleted (``sink=True``), else None
    sink_entries: int  # entries the deleted sink held (0 when it was kept)
    released: int  # running claims dropped (``force=True``)


def parse_status(reply: Any) -> IngestStatus:
    """``ingest_status``'s reply as an :class:`IngestStatus`."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 10:
        raise ValueError(f"unexpected ingest_status reply: {reply!r}")
    chunks, left, claimed, rows, done, claims, started, updated, _ = (int(x) for x in reply[:9])
    holders = tuple(
        ChunkHolder(
            chunk=int(chunk),
            worker=to_text(token).partition("@")[2] if token else "?",
            lease_left=int(left_ms) / 1000,
            cursor=None if cursor is None else int(cursor),
        )
        for chunk, token, left_ms, cursor in reply[9]
    )
    return IngestStatus(
        chunks=chunks,
        done=done,
        claimed=claimed,
        free=left - claimed,
        rows=rows,
        claims=claims,
        started_ms=started,
        updated_ms=updated,
        holders=holders,
    )


def parse_sink(sink: str | None, default: str, name: str) -> tuple[str, str]:
    """``"stream:KEY"`` or ``"list:KEY"`` as (kind, key); ``None`` is the default stream."""
    if sink is None:
        return "stream", default
    kind, sep, key = sink.partition(":")
    if not sep or kind not in ("stream", "list") or not key:
        raise ArgumentError("sink", f"must be 'stream:KEY' or 'list:KEY', got {sink!r}", name=name)
    return kind, key
