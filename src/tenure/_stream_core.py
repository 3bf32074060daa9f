"""Stream consumers' sans-IO half: the message record and reply decoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenure._leased_core import to_text

__all__ = ["StreamMessage", "entry_message", "parse_claimed"]


@dataclass(frozen=True)
class StreamMessage:
    """One stream entry as a consumer gets it."""

    id: str
    fields: dict[str, bytes]
    deliveries: int  # 1 the first time; more when it was claimed from a consumer that died


def entry_message(entry_id: Any, fields: Any, deliveries: int) -> StreamMessage:
    """A stream entry (as redis-py returns it) as a :class:`StreamMessage`."""
    decoded = {
        to_text(k): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()
    }
    return StreamMessage(id=to_text(entry_id), fields=decoded, deliveries=deliveries)


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
