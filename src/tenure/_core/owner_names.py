"""Who holds and waits, as ``tenure inspect`` shows it: owner names checked.

A primitive's ``owner_name`` is stored beside each hold and waiter; by
default it is this process's ``host:pid``
(``tenure._backends.owners.default_owner_name``).
"""

from __future__ import annotations

from tenure._core.exceptions import ArgumentError

__all__ = ["MAX_OWNER_NAME", "check_owner_name"]

MAX_OWNER_NAME = 200
"""The longest ``owner_name`` a primitive accepts, in characters."""


def check_owner_name(owner_name: object, name: str | None = None) -> str | None:
    """An ``owner_name`` argument: None (``host:pid``), or a printable, non-empty str.

    At most :data:`MAX_OWNER_NAME` characters; it is stored beside each hold
    and waiter and shown by ``tenure inspect``.
    """
    if owner_name is None:
        return None
    if not isinstance(owner_name, str):
        raise ArgumentError(
            "owner_name", f"must be a str, got {type(owner_name).__name__}", name=name
        )
    if not owner_name:
        raise ArgumentError("owner_name", "must not be empty", name=name)
    if len(owner_name) > MAX_OWNER_NAME:
        raise ArgumentError(
            "owner_name",
            f"must be at most {MAX_OWNER_NAME} characters, got {len(owner_name)}",
            name=name,
        )
    if not owner_name.isprintable():
        raise ArgumentError(
            "owner_name", f"must be printable (no control characters): {owner_name!r}", name=name
        )
    return owner_name
