"""AsyncIngestJob: a source read in chunks by many workers, every row in the sink exactly once.

* **Plan.** The source's key range is split into chunks of ``chunk_size``
  keys; the plan (source description, range, chunk size) is frozen on the
  server under the job's name by one script (``ingest_plan``). A later run
  with the same source and chunk size uses the frozen plan (a finished job
  is then a no-op); another source or chunk size under the name raises
  :class:`~tenure.PlanMismatchError`.
* **Claim.** ``ingest_claim`` gives a worker the next chunk that is free or
  whose lease ran out, with a token and a fencing number, in one call.
* **Commit.** Rows go out in batches of ``batch`` rows. ``ingest_commit``
  checks the claim, appends the batch to the sink (a stream by default) and
  moves the chunk's cursor to the batch's last key, atomically, and renews
  the lease. A worker that is killed, or hangs past its lease, loses the
  chunk; its successor resumes after the cursor, and the late worker's
  commits are refused. So every row lands once, whatever dies when.
* **Give back.** A worker interrupted mid-chunk (KeyboardInterrupt, a
  signal turned into one, a cancelled task, an error of its source: its
  database lost, :class:`~tenure.SourceUnavailableError`; a row with no
  strict JSON form, :class:`~tenure.SourceRowError`) gives its claim back
  before the exception goes on (``ingest_release``, resend-safe), so the
  chunk is free at once and the next claim resumes after its cursor; a
  worker killed outright leaves its lease to run out.
* **State stays.** Counters, cursors and the chunks left are kept after the
  job ends, so ``status`` can tell, and a rerun does nothing, until
  :meth:`AsyncIngestJob.reset` removes the job (and, if asked, its sink).

Every key is under the job's ``{name}`` hash tag, the default sink included.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket

from tenure._async._scripting import AsyncClient, registry_for
from tenure._backends.for_asyncio import (
    IS_ASYNC,
    in_batches,
    refuse_awaited_call,
    shielded,
    sleep,
    source_call,
)
from tenure._backends.telemetry import metrics, subject
from tenure._core.clients import map_exceptions, require_client
from tenure._core.exceptions import ArgumentError, BackendError, JobBusyError, PlanMismatchError
from tenure._core.ingest import (
    HOLDERS_LISTED,
    REPLANNED,
    Claim,
    IngestKeys,
    IngestStatus,
    Plan,
    ResetReport,
    WorkerReport,
    chunk_range,
    parse_claim,
    parse_sink,
    parse_status,
)
from tenure._core.leased import check_name
from tenure._core.rows import RowEncoder
from tenure._core.telemetry import DONE, TAKEN_OVER
from tenure._core.values import check_seconds, to_ms, to_text

# isort: split
# unasync: async-only
from tenure._core.sources import AsyncRowSource, KeyOrder, RowSource, declared_range

# unasync: sync-only
# from tenure._core.sources import KeyOrder, RowSource, declared_range
# unasync: end

__all__ = ["AsyncIngestJob", "read_status"]

RESET_MARKER_MS = 60_000  # how long a reset's marker recognises a resent call
SHORTEST_LEASE = 0.1  # seconds: a claim's lease must outlast a batch's round trip


class AsyncIngestJob:
    """A chunked, crash-safe ingestion of ``source`` into a Redis stream (or list).

    * ``name`` — the job; its plan and progress live under ``{prefix}{{name}}``.
    * ``source`` — a :class:`~tenure.SqlSource`, a :class:`~tenure.CallableSource`
      or any object with their three methods.
    * ``chunk_size`` — keys per chunk (10,000).
    * ``sink`` — ``"stream:KEY"`` (each row an entry with fields ``key`` and
      ``row``, strict JSON) or ``"list:KEY"`` (the row's JSON); default: the job's own
      stream ``{prefix}{{name}}:rows``. On a cluster the sink key must carry the
      job's ``{name}`` hash tag.
    * ``lease`` — seconds a claim lasts without progress (30; at least 0.1,
      at most ten years, checked as the locks' durations are); each batch
      renews it, so a worker that hangs loses its chunk after this.
    * ``batch`` — rows per commit (500).
    * ``worker`` — how this worker is named in :meth:`status`'s holders
      (default ``host:pid``).
    * ``metric_name`` — report this job's measurements with ``tenure.name``
      set to it (docs/observability.md); by default no name is reported
      unless :func:`~tenure.set_metric_names` matches ``name``.
    * ``source`` — asyncio only: a source's calls run in a worker thread, a
      batch of rows at a time, so a blocking source (SQLAlchemy) never stalls
      the event loop; a source whose ``key_range`` is a coroutine function
      and whose ``rows`` is an async iterator (:class:`~tenure.AsyncCallableSource`)
      is awaited instead.
    """

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        # unasync: async-only
        source: RowSource | AsyncRowSource,
        # unasync: sync-only
        # source: RowSource,
        # unasync: end
        *,
        chunk_size: int = 10_000,
        sink: str | None = None,
        lease: float = 30.0,
        batch: int = 500,
        prefix: str = "tenure:ingest:",
        worker: str | None = None,
        metric_name: str | None = None,
    ) -> None:
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=name)
        check_name(name)  # (as a cache's: it is the keys' hash tag)
        self._subject = subject(None, name, metric_name)
        for argument, value in (("chunk_size", chunk_size), ("batch", batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(argument, f"must be a positive int, got {value!r}", name=name)
        missing = [
            m for m in ("describe", "key_range", "rows") if not callable(getattr(source, m, None))
        ]
        if missing and source is not None:  # None: a job for status() and reset() alone
            hint = (
                " (an SqlSource takes the URL: SqlSource(url, table, key))"
                if isinstance(source, str)
                else ""
            )
            raise ArgumentError(
                "source",
                f"must be a row source (SqlSource, CallableSource...), got {type(source).__name__}"
                f" without {', '.join(missing)}{hint}",
                name=name,
            )
        check_seconds("lease", lease, allow_none=False, name=name, least=SHORTEST_LEASE)
        self.client = client
        self.name = name
        self.source = source
        self.chunk_size = chunk_size
        self.lease_ms = to_ms(lease)
        self.batch = batch
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.keys = IngestKeys.for_job(prefix, name)
        self.sink_kind, self.sink_key = parse_sink(sink, self.keys.default_sink(), name)
        self._registry = registry_for(client)
        self._plan: Plan | None = None
        self._rows = RowEncoder()  # one JSON encoder per worker, not one per row

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} sink={self.sink_kind}:{self.sink_key}>"

    # -- the plan ----------------------------------------------------------------

    async def plan(self) -> Plan:
        """The job's plan: frozen now, or the one frozen before (checked to match)."""
        refuse_awaited_call(type(self).__name__, "plan", 1)
        if self._plan is not None:
            return self._plan
        if self.source is None:
            raise ArgumentError(
                "source", "the job was made without one: status() and reset() only", name=self.name
            )
        sink = f"{self.sink_kind}:{self.sink_key}"
        frozen, frozen_sink = await self._frozen()
        if frozen is None:
            low, high = await source_call(self.source.key_range)
            wanted = Plan(self.source.describe(), low, high, self.chunk_size)
            with map_exceptions(name=self.name, doing="freezing the plan"):
                reply = await self._registry.run(
                    "ingest_plan",
                    (self.keys.plan, self.keys.free),
                    (wanted.fingerprint, wanted.as_json(), wanted.chunks, sink),
                    name=self.name,
                )
            if int(reply[0]) == 1:
                frozen, frozen_sink = wanted, sink
            else:
                frozen, frozen_sink = await self._frozen()
            if frozen is None:  # pragma: no cover - the script says a plan exists
                raise PlanMismatchError("the plan vanished while it was frozen", name=self.name)
        differences = []
        if frozen.source != self.source.describe():
            differences.append(f"source {frozen.source}, not {self.source.describe()}")
        if frozen.chunk_size != self.chunk_size:
            differences.append(f"chunks of {frozen.chunk_size:,}, not {self.chunk_size:,}")
        declared = declared_range(self.source)  # a callable source's range is its own
        if declared is not None and declared != (frozen.low, frozen.high):
            differences.append(
                f"keys {frozen.low}..{frozen.high}, not {declared[0]}..{declared[1]}"
            )
        if frozen_sink is not None and frozen_sink != sink:  # plans of 0.1.0 kept no sink
            differences.append(f"sink {frozen_sink}, not {sink}")
        if differences:
            raise PlanMismatchError(
                f"job {self.name!r} was planned with {'; '.join(differences)}: use another "
                f"job name, or reset the job (reset(); tenure ingest reset {self.name})",
                name=self.name,
            )
        self._plan = frozen
        return frozen

    async def _frozen(self) -> tuple[Plan | None, str | None]:
        """The plan frozen under this job's name, and the sink it was frozen with."""
        with map_exceptions(name=self.name, doing="reading the plan"):
            text, sink = await self.client.hmget(self.keys.plan, ["plan", "sink"])
        plan = None if text is None else Plan.from_json(to_text(text))
        return plan, None if sink is None else to_text(sink)

    # -- working -----------------------------------------------------------------

    async def work(self, *, max_chunks: int | None = None, wait: bool = True) -> WorkerReport:
        """Claim and ingest chunks until the job is done (or ``max_chunks`` are).

        When every chunk left is leased by others, waits for the first lease
        to run out (``wait=False``: returns instead), since its worker may
        have died.
        """
        refuse_awaited_call(type(self).__name__, "work", 1)
        plan = await self.plan()
        chunks = rows = refused = 0
        claim: Claim | float | str | None = None
        while max_chunks is None or chunks < max_chunks:
            token = f"{secrets.token_hex(8)}@{self.worker}"
            chunk: int | None = None  # None: the claim may be made; found by its token
            try:
                with map_exceptions(name=self.name, doing="claiming a chunk"):
                    reply = await self._registry.run(
                        "ingest_claim",
                        (self.keys.free, self.keys.leases, self.keys.cursors, self.keys.stats,
                         self.keys.fence, self.keys.plan),
                        (token, self.lease_ms, plan.fingerprint),
                        name=self.name,
                    )  # fmt: skip
                claim = parse_claim(reply)
                if claim is None or claim == REPLANNED:
                    break  # done; or reset (nothing claimed), raised below
                if isinstance(claim, float):
                    if not wait:
                        break
                    await sleep(min(claim + 0.05, 1.0))
                    continue
                assert isinstance(claim, Claim)
                chunk = claim.chunk
                if claim.taken_over and (recorder := metrics()) is not None:
                    recorder.ingest_chunk(self._subject, TAKEN_OVER)
                done, added = await self._ingest_chunk(plan, claim, token)
            except BaseException as exc:
                # Interrupted at any point (Ctrl-C, SIGTERM, a cancellation, a
                # failure): give the claim back, found by its token if its reply
                # was never read.
                await self._give_back(chunk, token, exc)
                raise
            rows += added
            if done:
                chunks += 1
                if (recorder := metrics()) is not None:
                    recorder.ingest_chunk(self._subject, DONE)
            else:
                refused += 1
        if claim == REPLANNED:
            self._plan = None
            raise PlanMismatchError(
                f"job {self.name!r} was reset (or planned anew) while this worker ran",
                name=self.name,
            )
        return WorkerReport(chunks=chunks, rows=rows, refused=refused)

    async def _give_back(self, chunk: int | None, token: str, exc: BaseException) -> None:
        """Give back the claim ``token`` (of ``chunk``; None: look it up) as ``exc`` ends work.

        Nothing is tried when the server is the trouble (its lease runs out
        instead), and a failed give-back leaves ``exc`` to be raised.
        """
        if isinstance(exc, BackendError):
            return
        with (
            contextlib.suppress(BackendError),
            map_exceptions(name=self.name, doing="giving a claim back"),
        ):
            await shielded(
                self._registry.run(
                    "ingest_release",
                    (self.keys.free, self.keys.leases),
                    (token, "" if chunk is None else chunk),
                    name=self.name,
                )
            )

    async def _ingest_chunk(self, plan: Plan, claim: Claim, token: str) -> tuple[bool, int]:
        """Stream the chunk after its cursor, a batch per commit; (finished, rows).

        A full batch is committed at once; a short one is the chunk's last and
        goes with the chunk's end in one call.
        """
        first, last = chunk_range(plan, claim.chunk)
        after = "" if claim.cursor is None else str(claim.cursor)
        if claim.cursor is not None:
            first = claim.cursor + 1
        added = 0
        if first <= last:
            # Checked before anything is written: a source that repeats a key
            # (2.5 read as 2) would otherwise append the same rows for ever.
            order = KeyOrder(first, last, argument="source")
            async for rows in in_batches(self.source.rows(first, last), self.batch):
                final = len(rows) < self.batch
                for key, _ in rows:
                    order.check(key)
                batch = self._rows.parts(rows, name=self.name)
                if not await self._commit(claim.chunk, token, after, batch, final=final):
                    return False, added
                added += len(rows)
                if (recorder := metrics()) is not None:
                    recorder.ingest_rows(self._subject, len(rows))
                after = batch[-2]
                if final:
                    return True, added
        if not await self._commit(claim.chunk, token, after, [], final=True):
            return False, added
        return True, added

    async def _commit(
        self, chunk: int, token: str, after: str, batch: list[str], *, final: bool
    ) -> bool:
        """Commit ``batch`` (following cursor ``after``); False if the claim was lost.

        The script answers a resent call (a client library retrying after a
        dropped connection) without applying it twice.
        """
        with map_exceptions(name=self.name, doing="committing a batch"):
            reply = await self._registry.run(
                "ingest_commit",
                (self.keys.free, self.keys.leases, self.keys.cursors, self.keys.stats,
                 self.sink_key),
                (token, chunk, self.lease_ms, 1 if final else 0, self.sink_kind, after, *batch),
                name=self.name,
            )  # fmt: skip
        return int(reply) == 1

    # -- reset ---------------------------------------------------------------------

    async def reset(self, *, sink: bool = False, force: bool = False) -> ResetReport:
        """Remove the job: its plan, chunks, cursors, claims and counters, in one script.

        The next :meth:`plan` or :meth:`work` starts the job over (with this
        object's source and ``chunk_size``). ``sink=True`` deletes the sink
        this job writes to as well (a stream or a list; another type raises
        :class:`~tenure.ArgumentError` and nothing is deleted); by default
        the rows already ingested stay. While claims are running (workers at
        work, or a worker killed less than a lease ago) it raises
        :class:`~tenure.JobBusyError` and deletes nothing, unless
        ``force=True``: then the running workers' commits are refused and
        they stop at their next claim (:class:`~tenure.PlanMismatchError`).
        Resend-safe: a call resent by the client library after a dropped
        connection deletes nothing more (a marker key of the job's, kept a
        minute, recognises it). A job that does not exist is a no-op.
        """
        refuse_awaited_call(type(self).__name__, "reset", 1)
        operation = secrets.token_hex(8)
        with map_exceptions(name=self.name, doing="resetting the job"):
            reply = await self._registry.run(
                "ingest_reset",
                (self.keys.plan, self.keys.free, self.keys.leases, self.keys.cursors,
                 self.keys.stats, self.keys.fence, self.sink_key, self.keys.reset),
                (operation, 1 if force else 0, 1 if sink else 0, RESET_MARKER_MS),
                name=self.name,
            )  # fmt: skip
        status = int(reply[0])
        if status == 0:
            claimed = int(reply[1])
            raise JobBusyError(
                f"job {self.name!r} has {claimed} running claim(s): stop its workers "
                "(they give their claims back) or reset with force=True",
                claimed=claimed,
                name=self.name,
            )
        if status == -1:
            raise ArgumentError(
                "sink",
                f"{self.sink_key!r} holds a {to_text(reply[1])}, not a stream or list: "
                "nothing was deleted",
                name=self.name,
            )
        self._plan = None
        return ResetReport(
            keys=int(reply[1]),
            sink=self.sink_key if sink else None,
            sink_entries=int(reply[2]),
            released=int(reply[3]),
        )

    # -- status --------------------------------------------------------------------

    async def status(self) -> IngestStatus:
        """Chunks done, claimed and free, rows, claims, rate and holders, as the server has them."""
        return await read_status(self.client, self.keys, name=self.name)


async def read_status(client: AsyncClient, keys: IngestKeys, *, name: str) -> IngestStatus:
    """The status of the job with ``keys``; no source needed (``tenure ingest status``)."""
    with map_exceptions(name=name, doing="reading the job's status"):
        reply = await registry_for(client).run(
            "ingest_status",
            (keys.plan, keys.free, keys.stats, keys.leases, keys.cursors),
            (HOLDERS_LISTED,),
            name=name,
        )
    return parse_status(reply)
