"""A fenced key's half: its fencing tokens checked and the key that keeps its fence.

A :class:`~tenure.FencedKey` keeps its value in the key the user names and
the highest fencing token it ever accepted in a second key, its *fence
keeper*, that never expires: a value written with a time to live may vanish,
its fence does not, so a holder paused past that point still has its late
write refused. Both keys live in one cluster slot, so one script sees both.
"""

from __future__ import annotations

from tenure._core.exceptions import ArgumentError
from tenure._core.leased import hash_tag

__all__ = ["FENCE_KEEPER_SUFFIX", "MAX_FENCE", "check_fencing_token", "fence_arg", "fence_keeper"]

MAX_FENCE = 2**53
"""The largest fencing token a write takes: the scripts compare tokens as doubles."""

FENCE_KEEPER_SUFFIX = ":tenure-fence"
"""What a fenced key's keeper adds to its name (after a hash tag naming the key's slot)."""


def fence_keeper(key: str) -> str:
    """The name of the key that keeps ``key``'s highest fencing token, in ``key``'s slot.

    A key with a hash tag keeps it (``account:{7}`` -> ``account:{7}:tenure-fence``);
    a key without one becomes the keeper's tag (``account:7`` ->
    ``{account:7}:tenure-fence``), which Redis Cluster hashes as it hashes the
    key. A key that has a ``}`` but no hash tag cannot be a tag and has no
    keeper in its slot: refused.
    """
    if hash_tag(key) is not None:
        return key + FENCE_KEEPER_SUFFIX
    if "}" in key:
        raise ArgumentError(
            "key",
            f"has a '}}' but no hash tag ('{{tag}}', a non-empty tag between the first '{{' "
            f"and the next '}}'): {key!r}; a FencedKey keeps its fence in a second key of "
            "the same cluster slot and cannot name one for it; add a hash tag, "
            "e.g. '{account:7}'",
        )
    return "{" + key + "}" + FENCE_KEEPER_SUFFIX


def check_fencing_token(fencing_token: object, name: str | None = None) -> int:
    """A fencing token a script can compare exactly: an int from 0 to 2**53.

    ``name``: the key (or primitive) the error names.
    """
    if isinstance(fencing_token, bool) or not isinstance(fencing_token, int):
        raise ArgumentError(
            "fencing_token",
            f"must be an int (a lock's fencing_token), got {type(fencing_token).__name__}",
            name=name,
        )
    if not 0 <= fencing_token <= MAX_FENCE:
        # Lua compares numbers as doubles: above 2**53 two tokens can compare equal.
        raise ArgumentError(
            "fencing_token",
            f"must be from 0 to 2**53 (a lock's fencing_token), got {fencing_token}",
            name=name,
        )
    return fencing_token


def fence_arg(fence: int) -> str:
    """A hold's fencing token as the owner-checked scripts take it ('' when not known).

    Fences are unique per acquisition: with the token, they tell a hold from
    another acquisition of the same token (two owners that chose one).
    """
    return str(fence) if fence else ""
