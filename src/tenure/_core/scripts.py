"""Lua scripts shipped as package data, and the sans-IO half of running them.

Every tenure operation on the server is one atomic Lua script. Scripts live
in ``tenure/lua/<name>.lua`` (the demo's in ``tenure/_tools/demo/lua``: a package
keeps its scripts in its own ``lua`` folder) and open with a header that declares each key
and argument::

    -- tenure script: compare_and_delete
    -- Delete KEYS[1] only if it holds ARGV[1].
    -- on resend: the key is gone: answered 0, nothing deleted (its one caller
    --   ignores the answer)
    -- KEYS[1] the key to delete
    -- ARGV[1] the value it must hold
    -- returns 1 if deleted, 0 otherwise

The header is the contract: :func:`load_script` parses it, and
:meth:`Script.check_call` refuses a call whose number of keys or arguments
differs from it, so a caller cannot pass a key through ARGV (which would
break cluster routing) or forget one. A trailing ``ARGV[n...]`` line declares
a variable number of arguments from ``n`` on.

Every header also says what happens when the same call runs twice, as it
does when a client library resends a command whose reply was lost to a
dropped connection (redis-py's default retry does): a line ``-- read only``
(the script changes nothing), or a line ``-- on resend: <how>`` telling how
a resent call is recognised, or why running it again changes nothing more,
so that the caller sees the outcome of the first run. Lines right below it
that start with ``--`` and two spaces continue it. :func:`load_script`
refuses a header with neither or both (``Script.changes_state`` and
``Script.on_resend`` carry the declaration), and ``tests/test_resend.py``
runs every script that changes state with its reply lost once.

Below the header, a line ``--! include <lib>`` is replaced by the text of
``tenure/lua/lib/<lib>.lua``, so helpers shared by several scripts (grant a
lock to the next waiter, purge dead waiters) are written once. The SHA1 is
that of the expanded source, which is what the server sees.

A script's name is for its file and for debugging, never for the user: an
error raised while a script ran names the operation the user called, in
their words (:data:`OPERATIONS`: ``lock_try`` is "acquiring"), and keeps the
script's name in the error's ``script`` attribute. ``tests/test_error_texts.py``
fails while a script in ``tenure/lua`` or ``tenure/_tools/demo/lua`` has no
entry there.

The I/O half (EVALSHA, reload on NOSCRIPT, error translation) is in
``tenure._async._scripting`` and its generated sync twin.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from tenure._core.exceptions import ArgumentError, ScriptError

__all__ = [
    "OPERATIONS",
    "Script",
    "ScriptStatistics",
    "load_script",
    "operation",
    "script_names",
]

_HEADER_NAME = re.compile(r"^--\s*tenure script:\s*(?P<name>[a-z0-9_]+)\s*$")
_INCLUDE = re.compile(r"^--!\s*include\s+(?P<lib>[a-z0-9_]+)\s*$", re.MULTILINE)
_READ_ONLY = re.compile(r"^--\s*read only\s*$")
_ON_RESEND = re.compile(r"^--\s*on resend:\s*(?P<how>.*)$")
_CONTINUED = re.compile(r"^--\s{2,}(?P<more>\S.*)$")
_DECL = re.compile(r"^--\s*(?P<kind>KEYS|ARGV)\[(?P<index>\d+)(?P<more>\.\.\.)?\]\s+(?P<doc>.+)$")


OPERATIONS: dict[str, str] = {
    # tenure/lua: the words follow "while", as in "server unavailable while acquiring".
    "cache_commit": "writing a cache entry",
    "cache_fetch": "fetching from the cache",
    "cache_lease": "updating a cache load's lease",
    "compare_and_delete": "compacting the id set",
    "connlock_refresh": "refreshing",
    "connlock_release": "releasing",
    "fenced_set": "writing the fenced key",
    "idset_clear": "clearing the id set",
    "idset_read": "reading the id set",
    "idset_swap": "compacting the id set",
    "idset_write": "writing to the id set",
    "ingest_claim": "claiming a chunk",
    "ingest_commit": "committing a batch",
    "ingest_plan": "planning the job",
    "ingest_release": "giving a claim back",
    "ingest_reset": "resetting the job",
    "ingest_status": "reading the job's status",
    "lock_confirm": "confirming the lock",
    "lock_extend": "extending the lease",
    "lock_leave": "leaving the line of waiters",
    "lock_line": "waiting in line",
    "lock_release": "releasing",
    "lock_try": "acquiring",
    "pexpire_if": "resetting a key's expiry",
    "redlock_acquire": "acquiring",
    "redlock_fence": "acquiring",
    "redlock_release": "releasing",
    "rw_downgrade": "downgrading to a read lock",
    "semaphore_extend": "extending the lease",
    "semaphore_holders": "counting the holders",
    "semaphore_leave": "leaving the line of waiters",
    "semaphore_line": "waiting in line",
    "semaphore_release": "releasing",
    "semaphore_set_limit": "setting the limit",
    "semaphore_try": "acquiring",
    "stream_claim": "claiming abandoned messages",
    "stream_touch": "keeping a message claimed",
    # tenure/_tools/demo/lua
    "market_list": "listing an item",
    "market_purchase": "buying an item",
}
"""What the user was doing when each script ran, in their words (never the script's name).

Errors raised while a script ran say ``while <words>``; one entry per script
of ``tenure/lua`` and ``tenure/_tools/demo/lua`` (``tests/test_error_texts.py``).
"""


def operation(script: str) -> str:
    """The words naming what the user was doing when ``script`` ran (see :data:`OPERATIONS`).

    A script missing from the table (a test fails then) is "calling the server",
    never its own name.
    """
    return OPERATIONS.get(script, "calling the server")


@dataclass(frozen=True)
class Script:
    """One Lua script with its SHA1 and its declared keys and arguments.

    ``keys`` and ``args`` hold the header's description of each position;
    ``variadic_from`` is the 1-based ARGV index from which any number of
    further arguments may follow (``None`` when the count is fixed).
    ``optional_keys`` counts the last keys a call may leave out (declared
    ``-- KEYS[n] optional: ...``, e.g. redis-py's key of a lock in interop mode).
    ``changes_state`` is ``False`` for a script declared ``-- read only``;
    ``on_resend`` is the ``-- on resend:`` text of one that changes state
    (how a resent call changes nothing more), ``""`` for a read-only one.
    """

    name: str
    source: str
    sha: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    variadic_from: int | None = None
    changes_state: bool = True
    on_resend: str = ""
    optional_keys: int = 0

    @classmethod
    def from_source(cls, source: str, *, name: str | None = None) -> Script:
        """Parse a script's header and compute its SHA1."""
        lines = source.splitlines()
        header_name: str | None = None
        keys: dict[int, str] = {}
        args: dict[int, str] = {}
        variadic_from: int | None = None
        read_only = False
        on_resend: list[str] | None = None
        continuing = False
        for line in lines:
            stripped = line.strip()
            if not stripped.startswith("--"):
                break
            if continuing and (match := _CONTINUED.match(stripped)):
                assert on_resend is not None
                on_resend.append(match["more"].strip())
                continue
            continuing = False
            if match := _HEADER_NAME.match(stripped):
                header_name = match["name"]
            elif _READ_ONLY.match(stripped):
                read_only = True
            elif match := _ON_RESEND.match(stripped):
                if on_resend is not None:
                    raise ScriptError("script header has two '-- on resend:' lines")
                on_resend = [match["how"].strip()]
                continuing = True
            elif match := _DECL.match(stripped):
                index = int(match["index"])
                table = keys if match["kind"] == "KEYS" else args
                if index in table:
                    raise ScriptError(f"script header declares {match['kind']}[{index}] twice")
                table[index] = match["doc"].strip()
                if match["more"]:
                    if match["kind"] == "KEYS":
                        raise ScriptError("scripts take a fixed number of KEYS")
                    variadic_from = index
        script_name = name or header_name
        if script_name is None:
            raise ScriptError("script header lacks a '-- tenure script: <name>' line")
        if header_name is not None and name is not None and header_name != name:
            raise ScriptError(f"script file {name!r} names itself {header_name!r}")
        for kind, table in (("KEYS", keys), ("ARGV", args)):
            if sorted(table) != list(range(1, len(table) + 1)):
                raise ScriptError(
                    f"script {script_name!r} declares {kind} {sorted(table)}, not 1..n in order"
                )
        optional = [i for i, doc in keys.items() if doc.startswith("optional:")]
        if optional and sorted(optional) != list(
            range(len(keys) - len(optional) + 1, len(keys) + 1)
        ):
            raise ScriptError(f"script {script_name!r}: only the last KEYS may be optional")
        if variadic_from is not None and variadic_from != len(args):
            raise ScriptError(f"script {script_name!r}: only the last ARGV may be variadic")
        how = " ".join(part for part in on_resend or () if part)
        if read_only and on_resend is not None:
            raise ScriptError(
                f"script {script_name!r} is declared both '-- read only' and '-- on resend:'"
            )
        if not read_only and not how:
            raise ScriptError(
                f"script {script_name!r}: its header must say '-- read only', or "
                "'-- on resend: <why running it twice changes nothing more>'"
            )
        sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        return cls(
            name=script_name,
            source=source,
            sha=sha,
            keys=tuple(keys[i] for i in sorted(keys)),
            args=tuple(args[i] for i in sorted(args)),
            variadic_from=variadic_from,
            changes_state=not read_only,
            on_resend=how,
            optional_keys=len(optional),
        )

    def check_call(self, keys: tuple[str, ...], args: tuple[object, ...]) -> None:
        """Raise :class:`ArgumentError` unless the call matches the header."""
        if not len(self.keys) - self.optional_keys <= len(keys) <= len(self.keys):
            wanted = (
                f"{len(self.keys) - self.optional_keys} to {len(self.keys)}"
                if self.optional_keys
                else str(len(self.keys))
            )
            raise ArgumentError(
                "keys", f"script {self.name!r} takes {wanted} keys, got {len(keys)}"
            )
        if self.variadic_from is None:
            if len(args) != len(self.args):
                raise ArgumentError(
                    "args",
                    f"script {self.name!r} takes {len(self.args)} arguments, got {len(args)}",
                )
        elif len(args) < self.variadic_from - 1:
            raise ArgumentError(
                "args",
                f"script {self.name!r} takes at least {self.variadic_from - 1} arguments, "
                f"got {len(args)}",
            )


@dataclass
class ScriptStatistics:
    """Counters of one client's script registry.

    ``calls`` counts script calls made; ``reloads`` counts the calls the
    server answered with NOSCRIPT (cache flushed, restart, failover) that
    were re-sent with the script's source.
    """

    calls: int = 0
    reloads: int = 0


def script_names(package: str = "tenure") -> list[str]:
    """Names of every script shipped in ``package``'s ``lua`` folder."""
    folder = resources.files(package).joinpath("lua")
    return sorted(
        entry.name.removesuffix(".lua") for entry in folder.iterdir() if entry.name.endswith(".lua")
    )


@functools.cache
def load_script(name: str, package: str = "tenure") -> Script:
    """Load ``<package>/lua/<name>.lua`` (cached; the files never change at run time).

    ``--! include`` lines always take the library's own ``tenure/lua/lib``.
    """
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ArgumentError("name", f"not a script name: {name!r}")
    resource = resources.files(package).joinpath("lua").joinpath(f"{name}.lua")
    try:
        source = resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArgumentError("name", f"no script named {name!r} in {package}") from None
    return Script.from_source(_expand_includes(source), name=name)


def _expand_includes(source: str) -> str:
    """``source`` with each ``--! include`` line replaced by what it uses of that library.

    A library's functions that the script never reaches (directly, or through
    another function it keeps) are left out: Lua builds every ``local function``
    of a script as a closure on each call, so an unused one costs server time
    on every run. Its constants (top-level ``local`` lines) are always kept.
    """
    libraries = {match["lib"]: _library_units(match["lib"]) for match in _INCLUDE.finditer(source)}
    words = _words(_INCLUDE.sub("", source))
    kept: set[str] = set()
    while True:  # functions reached from the script, then from those kept: a fixpoint
        reached = {
            unit.name
            for units in libraries.values()
            for unit in units
            if unit.name and unit.name not in kept and unit.name in words
        }
        if not reached:
            break
        kept |= reached
        for units in libraries.values():
            for unit in units:
                if unit.name in reached:
                    words |= _words(unit.text)

    def include(match: re.Match[str]) -> str:
        units = libraries[match["lib"]]
        return "\n".join(unit.text for unit in units if not unit.name or unit.name in kept)

    return _INCLUDE.sub(include, source)


@dataclass(frozen=True)
class _Unit:
    """A piece of a Lua library: a function (``name``) or a top-level statement (``""``)."""

    name: str
    text: str


_FUNCTION = re.compile(r"^local function (?P<name>[A-Za-z_][A-Za-z0-9_]*)\(")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.cache
def _library_units(lib: str) -> tuple[_Unit, ...]:
    """The functions and top-level statements of ``tenure/lua/lib/<lib>.lua``, in order.

    A function runs from its ``local function`` line to the first ``end`` at
    the start of a line; comments are dropped (they never run).
    """
    path = resources.files("tenure").joinpath("lua").joinpath("lib").joinpath(f"{lib}.lua")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"script includes unknown library {lib!r}") from None
    units: list[_Unit] = []
    lines = iter(text.splitlines())
    for line in lines:
        if not line.strip() or line.startswith("--"):
            continue
        function = _FUNCTION.match(line)
        if function is None:
            units.append(_Unit("", line))  # a constant: `local RW_LIMIT = ...`
            continue
        body = [line]
        for inner in lines:
            body.append(inner)
            if inner == "end":
                break
        else:
            raise ScriptError(f"library {lib!r}: function {function['name']} has no end")
        units.append(_Unit(function["name"], "\n".join(body)))
    return tuple(units)


def _words(lua: str) -> set[str]:
    """The identifiers ``lua`` names outside its comments."""
    code = "\n".join(line.split("--", 1)[0] for line in lua.splitlines())
    return set(_WORD.findall(code))
