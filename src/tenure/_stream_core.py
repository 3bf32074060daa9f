"""Stream consumers' sans-IO half: the message record and reply decoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenure._leased_core import to_text

__all__ = ["StreamMessage", "entry_message"]


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
