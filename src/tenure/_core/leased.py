"""The sans-IO half of every leased primitive: settings, keys, replies, timing.

Nothing here talks to a server. ``tenure._async._primitive`` (and its generated
sync twin) call these functions around each script call, so the rules of the
locks, semaphores and read-write locks are written once and tested without a
server (tests/test_leased_core.py). The scripts' reply codes and the waiting
and renewal timings are named here.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, NamedTuple

from tenure._core.exceptions import ArgumentError
from tenure._core.values import check_seconds, to_ms, to_text

__all__ = [
    "DEFAULT_LEASE",
    "IDLE_TTL",
    "IDLE_TTL_MS",
    "NOT_OWNED",
    "OWNER_EXPIRY_SLACK",
    "RELEASED",
    "RENEW_AT",
    "RENEW_RETRY",
    "RENEW_RETRY_MIN",
    "WAITER_REFRESH",
    "Acquired",
    "Acquiring",
    "Hold",
    "LimitMismatch",
    "LockKeys",
    "LockSettings",
    "TokenLocal",
    "call_id",
    "check_name",
    "lone_surrogate",
    "new_attempt",
    "parse_confirm",
    "parse_grant",
]

DEFAULT_LEASE = 30.0
"""Lease of a lock taken with ``timeout=None``, renewed by the watchdog at a third."""

DEFAULT_WAITER_LEASE = 2.0
"""A waiter refreshes its place every half of this; a dead one is dropped after it."""

DEFAULT_HANDOFF_LEASE = 1.0
"""Lease a waiter is handed the lock with, until it confirms its full lease."""

IDLE_TTL = 60.0
"""Seconds after its last use (acquisition or renewal) that a released primitive leaves no key.

A lock's marker (its owner hash: last fence, release receipt), a semaphore's
fencing counter and limit expire then; the next acquisition goes on from the
server's clock in microseconds, so fencing tokens still only grow for a name.
"""

IDLE_TTL_MS = int(IDLE_TTL * 1000)

WAITER_REFRESH = 0.4
"""A waiter re-checks (and refreshes its place in line) every this share of its waiter lease."""

OWNER_EXPIRY_SLACK = 0.002
"""A waiter re-checks this long after the owner's lease should have run out (a crashed owner)."""

RENEW_AT = 1 / 3
"""A lease is renewed (or a handed-over lease confirmed) when this share of it has passed."""

RENEW_RETRY = 0.1
"""A renewal that failed on the network is retried after this share of the lease ..."""

RENEW_RETRY_MIN = 0.05
"""... but no sooner than this many seconds."""

# Reply codes of the scripts (see each script's header in tenure/lua).
RELEASED, NOT_OWNED = 1, 0
"""``lock_release``: released (and handed on) / not the owner."""


def check_name(name: object) -> str:
    """A cache's or id set's name: a non-empty string without ``{`` or ``}``, encodable as UTF-8.

    Braces are refused because the name becomes the keys' hash tag; a brace
    in it would split one primitive's keys across cluster slots.
    """
    if not isinstance(name, str):
        raise ArgumentError("name", f"must be a str, got {type(name).__name__}")
    if not name:
        raise ArgumentError("name", "must not be empty")
    if "{" in name or "}" in name:
        raise ArgumentError("name", f"must not contain '{{' or '}}' (it is the hash tag): {name!r}")
    _check_utf8(name)
    return name


def _check_utf8(name: str) -> None:
    at = lone_surrogate(name)
    if at is not None:
        raise ArgumentError("name", f"must be UTF-8 text: a lone surrogate at {at} in {name!r}")


def hash_tag(name: str) -> str | None:
    """The hash tag Redis Cluster finds in key ``name``, or None: the whole key is hashed.

    Redis takes the text between the first ``{`` and the first ``}`` after
    it, when that text is not empty.
    """
    start = name.find("{")
    if start < 0:
        return None
    end = name.find("}", start + 1)
    if end <= start + 1:
        return None
    return name[start + 1 : end]


def check_lock_name(name: object) -> str:
    """A lock-family name as text: a non-empty str, or bytes that are UTF-8 (as redis-py takes).

    A name may carry its own hash tag (``lock:{user42}``): the lock's keys
    then all live in the tag's slot, beside the user's data and beside
    redis-py's key of that name. Braces that form no hash tag (``a}b``,
    ``a{b``, ``x{}``) are refused: Redis would hash such a key whole, and
    no set of keys can both share one slot and contain it.
    """
    if type(name) is str and name.isascii() and name and "{" not in name and "}" not in name:
        return name  # the usual name, checked at every lock made: nothing to decode or look at
    if isinstance(name, (bytes, bytearray, memoryview)):
        raw = bytes(name)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArgumentError(
                "name", f"bytes must be UTF-8 text: byte {exc.start} of {raw!r} is not"
            ) from None
    elif isinstance(name, str):
        text = name
    else:
        raise ArgumentError("name", f"must be a str or bytes, got {type(name).__name__}")
    if not text:
        raise ArgumentError("name", "must not be empty")
    if ("{" in text or "}" in text) and hash_tag(text) is None:
        raise ArgumentError(
            "name",
            f"has braces but no hash tag ('{{tag}}', a non-empty tag between the first '{{' "
            f"and the next '}}'): {text!r}; Redis would hash such a key whole, so tenure "
            "could not keep the lock's keys in one cluster slot",
        )
    _check_utf8(text)
    return text


def base_key(prefix: str, name: str) -> str:
    """The key every other key of lock-family primitive ``name`` starts with.

    A plain name becomes the hash tag: ``{prefix}{{{name}}}``. A name with its
    own hash tag keeps it, in parentheses: ``{prefix}({name})`` (so the keys
    land in the tag's slot, and no two names share keys).
    """
    if "{" in name:
        return f"{prefix}({name})"
    return f"{prefix}{{{name}}}"


def name_from_key(key: str, prefix: str) -> str | None:
    """The name :func:`base_key` made ``key`` from (its suffix cut off), or None: not one."""
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix) :]
    if rest.startswith("{"):
        end = rest.find("}")
        return rest[1:end] if end > 1 else None
    if rest.startswith("("):
        end = rest.rfind(")")
        name = rest[1:end] if end > 1 else ""
        return name if hash_tag(name) is not None else None
    return None


def check_prefix(prefix: object, name: str) -> str:
    """A key prefix: a str without braces (they would take the hash tag from the name)."""
    if not isinstance(prefix, str):
        raise ArgumentError("prefix", f"must be a str, got {type(prefix).__name__}", name=name)
    if "{" in prefix or "}" in prefix:
        raise ArgumentError(
            "prefix",
            f"must not contain '{{' or '}}' (the name gives the hash tag): {prefix!r}",
            name=name,
        )
    return prefix


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` cannot be UTF-8 (a lone surrogate), or None: it can."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def new_attempt() -> str:
    """A fresh id for one acquire call with a token of the caller's choosing.

    Kept with the hold: a resent call carries the same id; a second owner of
    the same token another, and is refused (as redis-py's ``SET NX`` is).
    """
    return secrets.token_hex(8)


def call_id(mode: str) -> str:
    """The id of an extend call: a fresh one for ``add`` (its receipt), none for ``set``.

    Setting a lease twice sets the same lease; adding twice would add twice,
    so an ``add`` leaves a receipt under this id (``lua/lib/receipt.lua``).
    """
    return secrets.token_hex(8) if mode == "add" else ""


class LockKeys(NamedTuple):
    """The Redis keys of one primitive; all share the ``{name}`` hash tag (one slot).

    ``grants``, ``limit`` and ``owners`` are a semaphore's only. ``wakes``
    maps each waiter to the pub/sub channel of its process, where its grant
    is announced; ``names`` maps each waiter to its owner name. A lock keeps
    its holder's owner name in the owner hash (field ``owner``), a
    semaphore in ``owners`` (token -> owner name) and each permit's fence in
    ``grants``. ``done`` and ``done_old`` (not a lock's) keep the receipts of
    releases, so a resend is recognised (``lua/lib/receipt.lua``).
    """

    owner: str
    queue: str
    waiters: str
    wakes: str
    fence: str
    grants: str
    limit: str
    names: str
    owners: str
    done: str
    done_old: str

    @classmethod
    def for_name(cls, prefix: str, name: str) -> LockKeys:
        """Keys for primitive ``name`` under ``prefix``."""
        owner = base_key(prefix, name)
        return cls(
            owner,
            owner + ":queue",
            owner + ":waiters",
            owner + ":wakes",
            owner + ":fence",
            owner + ":grants",
            owner + ":limit",
            owner + ":names",
            owner + ":owners",
            owner + ":done",
            owner + ":done:old",
        )

    @property
    def queued(self) -> tuple[str, str, str, str, str]:
        """The keys of a queue: owner, queue, waiters, wakes, fence (a Redlock's KEYS)."""
        return (self.owner, self.queue, self.waiters, self.wakes, self.fence)

    @property
    def lock(self) -> tuple[str, str, str, str, str]:
        """The lock scripts' KEYS: owner (its fence and receipts too: lua/lib/lock), the line's."""
        return (self.owner, self.queue, self.waiters, self.wakes, self.names)

    @property
    def receipts(self) -> tuple[str, str]:
        """The receipts of calls that end a hold or change it by an amount (``lua/lib/receipt``)."""
        return (self.done, self.done_old)

    @property
    def all(self) -> tuple[str, str, str, str, str, str, str, str, str]:
        """Every key, in the order of the semaphore scripts' KEYS."""
        return (*self.queued, self.grants, self.limit, self.names, self.owners)


@dataclass(frozen=True)
class LockSettings:
    """A lock's validated configuration (the constructor's arguments).

    The ``*_ms`` fields are the leases in whole milliseconds, as the scripts
    take them; the handoff lease is never longer than the lease.
    """

    lease: float
    auto_renew: bool
    blocking: bool
    blocking_timeout: float | None
    reentrant: bool
    max_hold: float | None
    waiter_lease: float
    handoff_lease: float

    lease_ms: int
    handoff_ms: int
    waiter_lease_ms: int

    @classmethod
    def build(
        cls,
        name: object,
        *,
        timeout: float | None,
        blocking: bool,
        blocking_timeout: float | None,
        auto_renew: bool | None,
        reentrant: bool,
        max_hold: float | None,
        waiter_lease: float,
        handoff_lease: float,
    ) -> LockSettings:
        """Validate the constructor's arguments; raise ArgumentError naming the bad one.

        Settings are immutable and shared: the same arguments (of the same
        types) give the same object, validated once.
        """
        key: tuple[object, ...] = (
            timeout,
            type(timeout),
            blocking,
            type(blocking),
            blocking_timeout,
            type(blocking_timeout),
            auto_renew,
            reentrant,
            type(reentrant),
            max_hold,
            type(max_hold),
            waiter_lease,
            type(waiter_lease),
            handoff_lease,
            type(handoff_lease),
        )
        try:
            found = _SETTINGS.get(key)
        except TypeError:  # an unhashable argument: validation names it
            found, key = None, ()
        if found is not None:
            return found
        checked = check_lock_name(name)  # for the messages (the caller checked it)
        check_seconds("timeout", timeout, allow_none=True, name=checked, positive=True)
        blocking_timeout = check_seconds(
            "blocking_timeout", blocking_timeout, allow_none=True, name=checked, forever=True
        )
        check_seconds("max_hold", max_hold, allow_none=True, name=checked, positive=True)
        check_seconds("waiter_lease", waiter_lease, allow_none=False, name=checked, least=0.2)
        check_seconds("handoff_lease", handoff_lease, allow_none=False, name=checked, least=0.05)
        lease = DEFAULT_LEASE if timeout is None else float(timeout)
        renew = (timeout is None) if auto_renew is None else bool(auto_renew)
        lease_ms = to_ms(lease)
        settings = cls(
            lease=lease,
            auto_renew=renew,
            blocking=bool(blocking),
            blocking_timeout=blocking_timeout,
            reentrant=bool(reentrant),
            max_hold=max_hold,
            waiter_lease=float(waiter_lease),
            handoff_lease=float(handoff_lease),
            lease_ms=lease_ms,
            handoff_ms=min(to_ms(handoff_lease), lease_ms),
            waiter_lease_ms=to_ms(waiter_lease),
        )
        if key:
            if len(_SETTINGS) >= SETTINGS_CACHED:
                _SETTINGS.clear()
            _SETTINGS[key] = settings
        return settings


SETTINGS_CACHED = 256
"""How many distinct argument sets :meth:`LockSettings.build` keeps validated."""

_SETTINGS: dict[tuple[object, ...], LockSettings] = {}


class TokenLocal:
    """``lock.local`` as redis-py has it: the current owner's ``token``, to read or to set.

    ``token`` is the token of the current owner's hold (bytes, as redis-py
    gives it; None when it holds nothing). Setting it makes the current owner
    act on the hold with that token, taken by another object or process:
    ``release()``, ``extend()``, ``reacquire()`` and ``owned()`` then apply to
    it (the server checks the token). Setting None forgets the hold here.
    """

    __slots__ = ("_holds",)

    def __init__(self, holds: Any) -> None:
        self._holds = holds  # a primitive's holds: current_token() and take_token()

    @property
    def token(self) -> bytes | None:
        """The current owner's token, or None."""
        token: str | None = self._holds.current_token()
        return None if token is None else token.encode("utf-8")

    @token.setter
    def token(self, value: bytes | str | None) -> None:
        self._holds.take_token(value)


class Acquiring:
    """One ``acquire()`` call as it goes: what each step of taking or waiting needs.

    One record handed from step to step (the try, the line, the confirmation
    of a grant, the give-up at the deadline) instead of five values each.
    """

    __slots__ = ("attempt", "deadline", "holder", "queued", "started", "token")

    def __init__(
        self, token: str, attempt: str, started: float, deadline: float | None, holder: object
    ) -> None:
        self.token = token
        """The token it takes the primitive for."""
        self.attempt = attempt
        """The call's own id when the caller chose ``token`` (``""``: a random token)."""
        self.started = started
        """When the call began (``time.monotonic()``)."""
        self.deadline = deadline
        """When it gives up (``started + blocking_timeout``), or None: it waits for ever."""
        self.holder = holder
        """The thread or task it acquires for."""
        self.queued = False
        """Whether it has waited in line (counted as a contended acquisition)."""


@dataclass(slots=True)
class Hold:
    """One acquisition, as its owner sees it (``expires_at``: measured from before its call).

    ``expires_at`` is a conservative estimate on the client's monotonic clock.
    """

    token: str
    fence: int
    acquired_at: float
    expires_at: float
    count: int = 1
    lost: bool = False
    guarded: bool = False
    holder: object = None
    renewal: Any = None
    waited: float = 0.0
    ending: bool = False
    """``max_hold`` is used up: the watchdog's next call ends the lease and tells."""
    loop_thread: int = 0
    """The thread it was taken on while that thread's asyncio event loop ran (sync only), or 0."""
    call: str = ""  # a Redlock's: its acquire call's id when the token was chosen


@dataclass(frozen=True)
class Acquired:
    """The script's answer: the caller holds the lock.

    ``server_ms`` is the server's clock when a waiter was handed the lock
    (``None`` when the caller's own call took it).
    """

    fence: int
    lease_ms: int
    server_ms: int | None = None


@dataclass(frozen=True)
class LimitMismatch:
    """The script's answer: the semaphore's stored limit is ``stored``, not the caller's."""

    stored: int


def parse_confirm(reply: Any) -> Acquired | None:
    """Interpret ``lock_confirm``'s reply: the hold's fence and lease, or None (not held)."""
    if int(reply[0]) != 1:
        return None
    return Acquired(fence=int(reply[1]), lease_ms=int(reply[2]))


def parse_grant(message: Any) -> tuple[str, Acquired | None]:
    """Interpret a grant announced on a primitive's channel: ``(token, grant)``.

    The message is ``token:fence:handoff_ms:server_ms``; the token itself may
    contain colons (a caller's own token), so it is split from the right. A
    message that does not parse yields ``(text, None)``: nobody's grant.
    """
    text = to_text(message)
    parts = text.rsplit(":", 3)
    if len(parts) != 4:
        return text, None
    token, fence, lease, server_ms = parts
    try:
        return token, Acquired(fence=int(fence), lease_ms=int(lease), server_ms=int(server_ms))
    except ValueError:
        return text, None
