"""An ingested row as compact, strict JSON (RFC 8259): one encoder, refusals named.

Every row a job appends to its sink is encoded here: dates ISO 8601, decimals
and UUIDs as strings, bytes as hex. JSON has no NaN or infinity (JavaScript,
Go and jq refuse them), so a row holding one is refused, naming the row's key
and the column, before its batch is written.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import uuid
from collections.abc import Sequence
from typing import Any

from tenure._core.exceptions import SourceRowError

__all__ = ["REFUSED", "Row", "RowEncoder", "encode_row"]

Row = tuple[int, dict[str, Any]]
"""A source's row: its key and its columns."""


class _NoJsonForm(TypeError):
    """A value of a type the rows' JSON has no form for (raised by the encoder's default)."""


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    raise _NoJsonForm(f"a {type(value).__name__} has no JSON form")


REFUSED = "refused before it was written"
"""How a refusal ends: nothing of the batch holding the row was written."""


class RowEncoder:
    """Rows as compact, strict JSON (RFC 8259), by one encoder built once.

    Dates and times ISO 8601, decimals and UUIDs as strings, bytes as hex. A
    float NaN or infinity (which RFC 8259 has no form for, and JavaScript, Go
    and jq refuse) or a value of another type is refused with
    :class:`~tenure.SourceRowError` naming the row's key and the column. A
    job builds one per worker; encoding is thread-safe.
    """

    def __init__(self) -> None:
        encoder = json.JSONEncoder(
            separators=(",", ":"), ensure_ascii=False, default=_json_default, allow_nan=False
        )
        self._encode = encoder.encode

    def encode(
        self, row: dict[str, Any], *, key: int | None = None, name: str | None = None
    ) -> str:
        """``row`` as JSON; :class:`~tenure.SourceRowError` (naming ``key``) if it has none.

        ``name`` is the job's, carried by the error.
        """
        try:
            return self._encode(row)
        except (ValueError, TypeError) as exc:
            raise self.refusal(key, row, exc, name=name) from exc

    def parts(self, rows: Sequence[Row], *, name: str | None = None) -> list[str]:
        """``key, JSON, key, JSON...`` of ``rows`` (a commit's arguments), all or none.

        :class:`~tenure.SourceRowError` names the first row and column with no
        JSON form; nothing of the batch is returned then.
        """
        encode = self._encode
        try:
            return [part for key, row in rows for part in (str(key), encode(row))]
        except (ValueError, TypeError):
            for key, row in rows:  # which one (an error path: each row again)
                self.encode(row, key=key, name=name)
            raise

    def refusal(
        self, key: int | None, row: Any, exc: BaseException, *, name: str | None = None
    ) -> SourceRowError:
        """The error for ``row`` (of ``key``), whose encoding raised ``exc``: column named."""
        where = "a row" if key is None else f"row {key}"
        if isinstance(row, dict):
            for column, value in row.items():
                try:
                    self._encode({column: value})
                except (ValueError, TypeError) as found:
                    said = repr(value)
                    said = said if len(said) <= 60 else said[:57] + "..."
                    return SourceRowError(
                        f"{where}, column {str(column)!r} holds {said}: {_no_json(value, found)} "
                        f"({REFUSED})",
                        key=key,
                        column=str(column),
                        name=name,
                    )
        return SourceRowError(
            f"{where} cannot be stored as JSON: {exc} ({REFUSED})",
            key=key,
            column=None,
            name=name,
        )


def _no_json(value: Any, exc: BaseException) -> str:
    """Why ``value`` has no JSON form (``exc``: what the encoder said)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "JSON (RFC 8259) has no NaN or infinity; store NULL or a finite number"
    if isinstance(exc, _NoJsonForm):
        return str(exc)
    if isinstance(exc, ValueError) and "Out of range float" in str(exc):
        return "it holds a NaN or an infinity, which JSON (RFC 8259) has no form for"
    return str(exc)


_ROWS = RowEncoder()


def encode_row(row: dict[str, Any], *, key: int | None = None) -> str:
    """A row as compact, strict JSON (see :class:`RowEncoder`); refused naming ``key``."""
    return _ROWS.encode(row, key=key)
