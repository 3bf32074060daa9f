"""AsyncStreamConsumer: a stream read through a consumer group, every message at least once.

* New messages come with XREADGROUP, ``count`` at a time; a message is done
  when its handler returns and it is acknowledged (XACK). :meth:`run`
  acknowledges a batch's messages together, once the batch is handled: one
  XACK per batch, not per message (a consumer that dies may have handled
  the messages of its batch in hand without acknowledging them: they are
  delivered again, to another consumer, after ``claim_idle``).
* A message whose consumer died (idle past ``claim_idle``) is claimed by
  another consumer (XAUTOCLAIM, its cursor kept from one read to the next),
  so nothing is lost. A consumer looks for such messages at its first read,
  then every quarter of ``claim_idle`` (at once again while a look finds a
  full batch), not before every read.
* A message delivered more than ``max_deliveries`` times (a poison
  message) goes to the dead-letter stream with its delivery count, and is
  acknowledged, in the same script call as the claim (``stream_claim``).
* While a batch is handled, a heartbeat (the watchdog, every third of
  ``claim_idle``) keeps its messages claimed, so a long job is not claimed
  twice while its consumer is alive.
* :meth:`AsyncStreamConsumer.stop` ends :meth:`AsyncStreamConsumer.run`
  after the message in hand; what was handled is acknowledged first.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors

from tenure._async._scripting import AsyncClient, registry_for
from tenure._async._watchdog import Job, watchdog
from tenure._backends.for_asyncio import IS_ASYNC, on_signals, refuse_awaited_call
from tenure._backends.telemetry import metrics, subject
from tenure._core.clients import is_cluster, map_exceptions, require_client
from tenure._core.exceptions import ArgumentError
from tenure._core.stream import (
    ConsumerStatistics,
    StreamMessage,
    check_slots,
    claim_record_key,
    dead_letter_key,
    parse_claimed,
    read_messages,
)
from tenure._core.telemetry import ACKED, DEAD_LETTERED, FAILED
from tenure._core.values import MAX_SECONDS, check_seconds, to_ms

__all__ = ["AsyncStreamConsumer"]

logger = logging.getLogger("tenure.consumer")

CLAIM_EVERY = 0.25
"""The share of ``claim_idle`` between two looks for abandoned messages."""

HANDED_BACK_IDLE_MS = MAX_SECONDS * 1000
"""The idle time given to messages a stopped consumer read and did not handle:
the longest ``claim_idle`` there is, so the next consumer that looks takes them."""


class AsyncStreamConsumer:
    """One consumer of ``stream`` in consumer group ``group``.

    * ``consumer`` — this consumer's name (default: random); give a restarted
      process the same name to get its own pending messages back at once.
    * ``count`` / ``block`` — messages per read, seconds a read waits (0:
      it does not wait).
    * ``claim_idle`` — seconds after which another consumer's unacknowledged
      message is taken over (its consumer is presumed dead); above 0.
      Each duration is at most ten years, like every primitive's.
    * ``max_deliveries`` — deliveries after which a message is dead-lettered.
    * ``dead_letter`` — the dead-letter stream (default ``<stream>:dead``).
      On a cluster both must share a slot: name the stream with a hash tag
      (``"{jobs}"``); a pair in two slots is refused with an ArgumentError.
    * ``start`` — where a new group starts: ``"0"`` (everything, default) or
      ``"$"`` (only what arrives from now on).
    * ``metric_name`` — report this consumer's measurements with ``tenure.name``
      set to it (docs/observability.md); by default no name is reported
      unless :func:`~tenure.set_metric_names` matches ``stream``.
    """

    def __init__(
        self,
        client: AsyncClient,
        stream: str,
        group: str,
        consumer: str | None = None,
        *,
        count: int = 100,
        block: float = 1.0,
        claim_idle: float = 30.0,
        max_deliveries: int = 5,
        dead_letter: str | None = None,
        start: str = "0",
        metric_name: str | None = None,
    ) -> None:
        require_client(client, is_async=IS_ASYNC, owner=type(self).__name__, name=stream)
        self._subject = subject(None, stream, metric_name)
        if not isinstance(count, int) or count < 1:
            raise ArgumentError("count", f"must be a positive int, got {count!r}", name=stream)
        if not isinstance(max_deliveries, int) or max_deliveries < 1:
            raise ArgumentError("max_deliveries", "must be a positive int", name=stream)
        check_seconds("block", block, allow_none=False, name=stream)
        check_seconds("claim_idle", claim_idle, allow_none=False, name=stream, positive=True)
        self.client = client
        self.stream = stream
        self.group = group
        self.consumer = consumer or f"consumer-{secrets.token_hex(4)}"
        self.count = count
        self.block_ms = to_ms(block)  # 0: a read does not wait
        self.claim_idle_ms = to_ms(claim_idle)  # at least 1 ms: 0 would claim every message
        self.max_deliveries = max_deliveries
        self.dead_letter = dead_letter or dead_letter_key(stream)
        self.start = start
        # where a claim is recorded, so a resent one answers the same messages
        self._claim_record = claim_record_key(stream, self.consumer)
        if is_cluster(client):
            check_slots(stream, self.dead_letter, self._claim_record, dead_letter is not None)
        self._registry = registry_for(client)
        self._ready = False
        self._stopping = False
        self._cursor = "0-0"  # where the scan for abandoned messages goes on
        self._claim_due = 0.0  # when read() next looks for them (0: at the first read)
        self.processed = 0
        self.failed = 0  # handler calls that raised (each logged on "tenure.consumer")
        self.dead_lettered = 0
        self.handed_back = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.stream!r} group={self.group!r} as {self.consumer!r}>"

    def statistics(self) -> ConsumerStatistics:
        """An immutable snapshot of this consumer's counters in this process."""
        return ConsumerStatistics(
            processed=self.processed,
            failed=self.failed,
            dead_lettered=self.dead_lettered,
            handed_back=self.handed_back,
        )

    async def setup(self) -> None:
        """Create the group (and the stream) if they do not exist; idempotent."""
        refuse_awaited_call(type(self).__name__, "setup", 1)
        with map_exceptions(name=self.stream, doing="creating the consumer group"):
            try:
                await self.client.xgroup_create(self.stream, self.group, self.start, mkstream=True)
            except redis_errors.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._ready = True

    async def read(self) -> list[StreamMessage]:
        """The next messages: those of dead consumers when a look is due, else new ones.

        A look for dead consumers' messages (idle past ``claim_idle``) is due
        at the first read, then every quarter of ``claim_idle``, and at once
        again after a look that found a full batch. New ones come with
        XREADGROUP, which waits up to ``block``. Messages delivered more than
        ``max_deliveries`` times are moved to the dead-letter stream instead
        of being returned.
        """
        refuse_awaited_call(type(self).__name__, "read", 1)
        if not self._ready:
            await self.setup()
        if time.monotonic() >= self._claim_due:
            messages = await self._claim_abandoned()
            # A full batch: more may wait. Else the next look in a while.
            wait = 0.0 if len(messages) >= self.count else CLAIM_EVERY * self.claim_idle_ms / 1000
            self._claim_due = time.monotonic() + wait
            if messages:
                return messages
        with map_exceptions(name=self.stream, doing="reading the stream"):
            reply: Any = await self.client.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: ">"},
                count=self.count,
                block=self.block_ms or None,
            )
        return read_messages(reply)

    async def _claim_abandoned(self) -> list[StreamMessage]:
        with map_exceptions(name=self.stream, doing="claiming abandoned messages"):
            reply = await self._registry.run(
                "stream_claim",
                (self.stream, self.dead_letter, self._claim_record),
                (self.group, self.consumer, self.claim_idle_ms, self._cursor, self.count,
                 self.max_deliveries, secrets.token_hex(8)),
                name=self.stream,
            )  # fmt: skip
        self._cursor, messages, dead = parse_claimed(reply)
        self.dead_lettered += dead
        if dead and (recorder := metrics()) is not None:
            recorder.stream_messages(self._subject, dead, DEAD_LETTERED)
        return messages

    async def ack(self, *messages: StreamMessage) -> int:
        """Acknowledge ``messages``: done, never delivered again. How many were pending."""
        refuse_awaited_call(type(self).__name__, "ack", 1)
        if not messages:
            return 0
        with map_exceptions(name=self.stream, doing="acknowledging messages"):
            return int(await self.client.xack(self.stream, self.group, *(m.id for m in messages)))

    def stop(self) -> None:
        """Make :meth:`run` return after the message in hand (a signal handler may call it).

        The messages of the batch read and not handled yet are handed back:
        another consumer takes them at once, not after ``claim_idle``.
        """
        self._stopping = True

    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    async def run(
        self, handler: Callable[[StreamMessage], Any], *, stop_signals: tuple[int, ...] = ()
    ) -> int:
        """Handle messages until :meth:`stop`; acknowledge those their handler finished.

        The messages of a batch (one :meth:`read`) are acknowledged together
        once the batch is handled: one XACK, sent with the next read in one
        round trip, and on the way out of ``run`` (a stop, an error, a
        cancellation). A process killed in the middle of
        a batch leaves the messages of that batch unacknowledged: at most
        ``count`` messages per consumer are delivered again, after
        ``claim_idle``, to another consumer. Handle each message so that a
        second delivery does no harm (at least once).

        A handler that raises leaves its message unacknowledged: it comes back
        (to any consumer) after ``claim_idle``, and goes to the dead-letter
        stream after ``max_deliveries``; each failure is logged as a warning
        with its traceback (logger ``tenure.consumer``) and counted in
        ``failed``. Returns how many messages were handled.

        ``stop_signals`` (e.g. ``(signal.SIGTERM, signal.SIGINT)``): each of
        them calls :meth:`stop` while ``run`` runs, so the process ends after
        the message in hand, acknowledged, and within ``block`` seconds when
        idle.
        """
        refuse_awaited_call(type(self).__name__, "run", 1)
        with on_signals(stop_signals, self.stop):
            return await self._run(handler)

    async def _run(self, handler: Callable[[StreamMessage], Any]) -> int:
        handled = 0
        done: list[StreamMessage] = []  # handled, not acknowledged yet
        try:
            while not self.stopping():
                batch = await self._acked_then_read(done)
                self._acked(len(done))
                done = []
                if not batch:
                    continue
                heartbeat = self._keep_claimed(batch)
                try:
                    for index, message in enumerate(batch):
                        if self.stopping():  # the handler, or a signal, asked
                            await self._hand_back(batch[index:])
                            break
                        try:  # (inline: the loop runs once per message)
                            result = handler(message)
                            # unasync: async-only
                            if hasattr(result, "__await__"):
                                await result
                            # unasync: sync-only
                            # unasync: end
                        except Exception:
                            self._failed_on(message)
                            continue
                        done.append(message)
                finally:
                    watchdog().cancel(heartbeat)
                handled += len(done)
            if done:  # stopped: the last batch's, acknowledged on the way out
                await self.ack(*done)
                self._acked(len(done))
                done = []
        except BaseException:
            # Out of run (an error, a cancellation, an interrupt): what was handled
            # is acknowledged if the server answers, else it comes back later.
            if done and await self._ack_quietly(done):
                self._acked(len(done))
            raise
        return handled

    async def _acked_then_read(self, done: list[StreamMessage]) -> list[StreamMessage]:
        """:meth:`read`, with ``done`` acknowledged first, in the same round trip if it can be.

        XACK and XREADGROUP go in one pipeline unless a look for dead
        consumers' messages is due (then the ack, and :meth:`read`).
        """
        if not done or not self._ready or time.monotonic() >= self._claim_due:
            if done:
                await self.ack(*done)
            return await self.read()
        with map_exceptions(name=self.stream, doing="acknowledging messages and reading on"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.xack(self.stream, self.group, *(m.id for m in done))
                pipe.xreadgroup(
                    self.group,
                    self.consumer,
                    {self.stream: ">"},
                    count=self.count,
                    block=self.block_ms or None,
                )
                replies: Any = await pipe.execute()
        return read_messages(replies[1])

    async def _ack_quietly(self, messages: list[StreamMessage]) -> bool:
        """Acknowledge ``messages`` on the way out of :meth:`run`; False (logged) if it failed."""
        try:
            await self.ack(*messages)
        except Exception as exc:
            logger.warning(
                "%s: %d handled messages could not be acknowledged (%s): they are "
                "delivered again after claim_idle",
                self.stream,
                len(messages),
                exc,
            )
            return False
        return True

    def _failed_on(self, message: StreamMessage) -> None:
        """The handler raised on ``message``: logged (with the traceback) and counted.

        The message stays unacknowledged: it comes back after ``claim_idle``,
        never silently dropped.
        """
        last = message.deliveries >= self.max_deliveries
        logger.warning(
            "%s: the handler failed on message %s (delivery %d of %d): %s",
            self.stream,
            message.id,
            message.deliveries,
            self.max_deliveries,
            "it goes to the dead letters next"
            if last
            else f"it comes back after claim_idle ({self.claim_idle_ms / 1000:g} s)",
            exc_info=True,
        )
        self.failed += 1
        if (recorder := metrics()) is not None:
            recorder.stream_messages(self._subject, 1, FAILED)

    def _acked(self, count: int) -> None:
        """Count ``count`` messages handled and acknowledged."""
        self.processed += count
        if count and (recorder := metrics()) is not None:
            recorder.stream_messages(self._subject, count, ACKED)

    async def _hand_back(self, messages: list[StreamMessage]) -> None:
        """Let another consumer take ``messages`` (read, not handled) at once.

        They stay pending under this consumer, marked idle for a long time
        (``XCLAIM ... IDLE ... JUSTID``), so the next consumer that looks for
        abandoned messages claims them now rather than after ``claim_idle``.
        Their delivery count is set back by one (``RETRYCOUNT``): the claim
        counts the delivery again, and a message no handler saw is not
        brought nearer the dead letters by a consumer stopping.
        """
        by_count: dict[int, list[Any]] = {}
        for message in messages:
            by_count.setdefault(max(0, message.deliveries - 1), []).append(message.id)
        with map_exceptions(name=self.stream, doing="handing back unhandled messages"):
            for count, ids in by_count.items():
                await self.client.xclaim(
                    self.stream,
                    self.group,
                    self.consumer,
                    0,
                    ids,
                    idle=HANDED_BACK_IDLE_MS,
                    retrycount=count,
                    justid=True,
                )
        self.handed_back += len(messages)

    def _keep_claimed(self, batch: list[StreamMessage]) -> Job:
        """The heartbeat of a batch: its messages kept claimed while it is handled."""
        every = self.claim_idle_ms / 3000

        def touched(reply: Any, error: BaseException | None) -> float | None:
            # (again while this consumer still holds any of them)
            return time.monotonic() + every if error is None and int(reply) > 0 else None

        return watchdog().schedule(
            Job(
                due=time.monotonic() + every,
                client=self.client,
                script="stream_touch",
                keys=(self.stream,),
                args=(self.group, self.consumer, *(message.id for message in batch)),
                on_result=touched,
                name=self.stream,
                slack=every / 4,
            )
        )
