"""Stream consumers' sans-IO half: the message record and reply decoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from tenure._core.exceptions import ArgumentError
from tenure._core.values import to_text

__all__ = [
    "ConsumerStatistics",
    "StreamMessage",
    "check_slots",
    "claim_record_key",
    "dead_letter_key",
    "entry_message",
    "parse_claimed",
    "read_messages",
]


@dataclass(frozen=True)
class StreamMessage:
    """One stream entry as a consumer gets it.

    ``fields`` is the entry's field-value dict exactly as redis-py returns it
    for the consumer's client: bytes keys and values on a plain client
    (``m.fields[b"row"]``), str keys and values on one made with
    ``decode_responses=True`` (``m.fields["row"]``), whatever the protocol.
    ``id`` is always a str, ``deliveries`` an int (1 the first time; more
    when it was claimed from a consumer that died).
    """

    id: str
    fields: dict[Any, Any]
    deliveries: int


@dataclass(frozen=True)
class ConsumerStatistics:
    """An immutable snapshot of one stream consumer's counters (this process only).

    * ``processed`` — messages its handler finished (and that were acknowledged).
    * ``failed`` — handler calls that raised (each logged with its traceback
      and message id on logger ``tenure.consumer``; the message comes back
      after ``claim_idle``, or goes to the dead letters after ``max_deliveries``).
    * ``dead_lettered`` — messages it moved to the dead-letter stream.
    * ``handed_back`` — messages read and not handled when it stopped, handed
      back for another consumer to take at once.
    """

    processed: int = 0
    failed: int = 0
    dead_lettered: int = 0
    handed_back: int = 0


def entry_message(entry_id: Any, fields: Any, deliveries: int) -> StreamMessage:
    """A stream entry (as redis-py returns it) as a :class:`StreamMessage`; fields as given."""
    return _message(to_text(entry_id), dict(fields), deliveries)


_new = object.__new__


def _message(entry_id: str, fields: dict[Any, Any], deliveries: int) -> StreamMessage:
    """A :class:`StreamMessage` made without the frozen dataclass's ``__init__``.

    Every message a consumer reads is made here: filling the instance's
    ``__dict__`` costs half of what ``__init__``'s three ``object.__setattr__``
    calls do. The object is the same (equal, frozen, its repr).
    """
    message = _new(StreamMessage)
    attributes = message.__dict__
    attributes["id"] = entry_id
    attributes["fields"] = fields
    attributes["deliveries"] = deliveries
    return message


def read_messages(reply: Any) -> list[StreamMessage]:
    """XREADGROUP's reply, in any shape redis-py gives it, as first deliveries.

    RESP2 gives ``[[stream, entries]]``; RESP3 ``{stream: [entries]}``;
    redis-py 8's ``legacy_responses=False`` ``{stream: entries}``. Each entry
    is ``(id, fields)``; an entry deleted since it was delivered has no fields
    and is left out.
    """
    if not reply:
        return []
    groups = reply.values() if isinstance(reply, dict) else [entries for _, entries in reply]
    found: list[StreamMessage] = []
    for group in groups:
        entries = group
        if len(group) == 1 and isinstance(group[0], list):  # RESP3: the entries list, wrapped
            first = group[0][0] if group[0] else None
            if first is None or isinstance(first, (list, tuple)):
                entries = group[0]
        # (the hot path of every consumer: no call per entry but the message's own)
        for entry_id, fields in entries:
            if fields is not None:
                found.append(
                    _message(
                        entry_id.decode() if type(entry_id) is bytes else str(entry_id),
                        fields if type(fields) is dict else dict(fields),
                        1,
                    )
                )
    return found


def dead_letter_key(stream: str) -> str:
    """The dead-letter stream of ``stream`` unless a consumer is given its own."""
    return f"{stream}:dead"


def check_slots(stream: str, dead_letter: str, claim_record: str, named: bool) -> None:
    """Refuse, on a cluster, a stream whose keys cannot share its slot.

    One script moves messages to ``dead_letter`` and records a claim at
    ``claim_record``: both must hash to ``stream``'s slot. ``named``: the
    dead-letter stream was given (else derived from ``stream``).
    """
    slot = key_slot(stream.encode())
    if key_slot(dead_letter.encode()) != slot:
        raise ArgumentError(
            "dead_letter" if named else "stream",
            f"on a cluster {stream!r} and its dead-letter stream {dead_letter!r} "
            "must share a slot (one script moves messages between them): give the "
            "stream a hash tag, e.g. '{jobs}', whose dead-letter stream is then '{jobs}:dead'",
            name=stream,
        )
    if key_slot(claim_record.encode()) != slot:
        raise ArgumentError(
            "stream", f"{stream!r} has a stray brace: no key can share its slot", name=stream
        )


def claim_record_key(stream: str, consumer: str) -> str:
    """Where ``stream_claim`` records a consumer's last claim (a key in the stream's slot).

    A resent claim finds its first run there. The stream's own hash tag is
    kept; a stream without one becomes the tag (``{orders}`` hashes as
    ``orders`` does).
    """
    suffix = f":tenure-claim:{consumer}"
    slot = key_slot(stream.encode())
    tagged = f"{stream}{suffix}"
    if key_slot(tagged.encode()) == slot:
        return tagged
    wrapped = f"{{{stream}}}{suffix}"
    if key_slot(wrapped.encode()) == slot:
        return wrapped
    return tagged  # a name no tag can follow (a stray brace): only a cluster could mind


def parse_claimed(reply: Any) -> tuple[str, list[StreamMessage], int]:
    """``stream_claim``'s reply: (the next cursor, the messages taken over, how many dead-lettered).

    Each message comes as ``[id, [field, value, ...], deliveries]``.
    """
    if not isinstance(reply, (list, tuple)) or len(reply) != 3:
        raise ValueError(f"unexpected stream_claim reply: {reply!r}")
    cursor, entries, dead = reply
    messages = []
    for entry_id, flat, deliveries in entries:
        fields = dict(zip(flat[0::2], flat[1::2], strict=True))
        messages.append(entry_message(entry_id, fields, int(deliveries)))
    return to_text(cursor), messages, int(dead)
