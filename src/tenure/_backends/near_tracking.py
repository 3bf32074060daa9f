"""The invalidation connection of near caching: one per process and server, in a thread.

A :class:`Tracker` holds a connection of its own to one server, in RESP2
whatever the application's clients speak: it turns on ``CLIENT TRACKING``
in broadcast mode for the prefixes of the near caches registered with it,
redirected to itself, and subscribes to ``__redis__:invalidate``. Every
write under those prefixes, by any client, is then announced on it; a
flush (``FLUSHALL``) too. It pings every quarter of the smallest
``max_staleness`` registered, and each answer confirms the entries
(:class:`~tenure._core.near.Confirmation`). A connection lost, or silent
past its pings, ends that confirmation and drops every entry; the thread
connects again (a new prefix does the same: a tracking connection cannot
change its prefixes once subscribed). Serves sync and asyncio caches alike:
the thread reads; the caches only look at what it has confirmed.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure._backends import near_sentinel
from tenure._backends.owners import default_owner_name
from tenure._core.exceptions import ArgumentError
from tenure._core.near import Confirmation, NearEntries

__all__ = ["Tracker", "master_check", "servers_of", "tracker_for"]

logger = logging.getLogger("tenure.cache")

CHANNEL = b"__redis__:invalidate"
NAME_PREFIX = "tenure-near:"
"""The tracking connections' client names open with this, then the process's
``host:pid`` (``tenure inspect --near`` finds them by it)."""
SILENCE_PINGS = 8
"""Pings unanswered in a row after which the connection is taken for lost."""
WARN_AFTER = 1.0
"""Seconds tracking must have failed for before a WARNING says so."""
CHANGE_WITHIN = 0.05
"""Seconds within which a new prefix is tracked (on a new connection)."""
RECONNECT_PAUSE = (0.05, 1.0)
"""The first and the longest pause between two connection attempts (doubling)."""

_COPIED = (
    "host",
    "port",
    "path",
    "db",
    "username",
    "password",
    "client_name",
    "socket_connect_timeout",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_data",
    "ssl_check_hostname",
)
"""The connection settings taken from the application's client (its address, its login)."""


class Tracker:
    """One server's invalidation connection for this process (see the module docstring)."""

    def __init__(self, make: Any, where: str) -> None:
        self._make = make  # () -> a connected-on-demand RESP2 redis.Connection
        self.where = where
        self.confirmation = Confirmation()
        self._mutex = threading.Lock()
        self._stores: dict[str, weakref.WeakSet[NearEntries]] = {}
        self._prefixes: tuple[str, ...] = ()  # those the live connection tracks
        self._ping_every = 1.0
        self._registered = 0  # registrations so far: a change makes the thread look again
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stopped = False
        self._said = ""  # the last failure logged
        self._failing_since: float | None = None  # when tracking began to fail

    def register(self, prefix: str, entries: NearEntries) -> None:
        """Announce writes of keys under ``prefix`` to ``entries`` (kept weakly).

        A prefix the live connection tracks already serves ``entries`` at once;
        a new one is tracked by a new connection within :data:`CHANGE_WITHIN`.
        """
        with self._mutex:
            self._stores.setdefault(prefix, weakref.WeakSet()).add(entries)
            self._ping_every = min(self._ping_every, entries.settings.ping_every)
            self._registered += 1
            if any(prefix.startswith(tracked) for tracked in self._prefixes):
                entries.mark_tracked(self.confirmation)
        self.start()
        self._wake.set()  # an idle thread connects at once

    def unregister(self, entries: NearEntries) -> None:
        """Announce nothing more to ``entries`` (its server left the cluster or the service).

        Once no near cache is left, the thread closes its connection and idles.
        """
        with self._mutex:
            for stores in self._stores.values():
                stores.discard(entries)
        self._wake.set()

    def start(self) -> None:
        """Start the thread unless it runs (and after a fork, anew)."""
        if self._thread is not None:
            return
        with self._mutex:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"tenure-near {self.where}", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """Close the connection and end the thread (for a tracker made on its own)."""
        self._stopped = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(5)

    def forked(self) -> None:
        """In a forked child: the parent's thread and connection are not here."""
        self._thread = None
        self._mutex = threading.Lock()
        self.confirmation.ended()
        self._flush_all()

    # -- the thread ------------------------------------------------------------

    def _wanted(self) -> tuple[str, ...]:
        """The prefixes to track: every registered one, those inside another left out."""
        with self._mutex:
            prefixes = sorted(p for p, stores in self._stores.items() if len(stores))
        kept: list[str] = []
        for prefix in prefixes:  # sorted: a prefix comes before those it contains
            if not any(prefix.startswith(other) for other in kept):
                kept.append(prefix)
        return tuple(kept)

    def _run(self) -> None:
        pause = RECONNECT_PAUSE[0]
        while not self._stopped:
            registered = self._registered  # (read first: a later registration is noticed)
            wanted = self._wanted()
            if not wanted:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self._track(wanted, registered)
                pause = RECONNECT_PAUSE[0]
            except Exception as exc:  # lost, refused, silent: drop everything, connect again
                self._failed(exc)
                pause = min(pause * 2, RECONNECT_PAUSE[1])
            finally:
                self.confirmation.ended()
                self._flush_all()
            time.sleep(pause)

    def _idle(self) -> None:
        """Every near cache of this server is gone: the next one sets the pings again."""
        with self._mutex:
            self._ping_every = 1.0
            for prefix in [p for p, stores in self._stores.items() if not len(stores)]:
                del self._stores[prefix]

    def _failed(self, exc: Exception) -> None:
        """Say once, at WARNING, that tracking has failed for :data:`WARN_AFTER` seconds.

        A connection lost once (a server restarted, a failover) and made again
        at once is only worth a DEBUG line.
        """
        why = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since < WARN_AFTER or why == self._said:
            logger.debug("tenure near cache: tracking writes on %s: %s", self.where, why)
            return
        self._said = why
        logger.warning(
            "tenure near cache: cannot track writes on %s (%s); reads go to the server "
            "until it can",
            self.where,
            why,
        )

    def _track(self, prefixes: tuple[str, ...], registered: int) -> None:
        """One life of the connection: until it fails, goes silent or is not wanted.

        A new prefix is handed over to a new connection within the same life
        (:meth:`_hand_over`): what the old one confirmed stays served.
        """
        connection = self._open(prefixes)
        try:
            self._flush_all()  # what was kept before this life is not covered by it
            self.confirmation.began(time.monotonic())
            self._said, self._failing_since = "", None  # tracking: a failure is news again
            self._mark_tracked(prefixes)  # (a method: no frame of this life holds a cache)
            self._prefixes = prefixes
            pings: collections.deque[float] = collections.deque()
            while self._listen(connection, prefixes, registered, pings):
                registered = self._registered  # (read first: a later registration is noticed)
                prefixes = self._wanted()
                connection = self._hand_over(connection, prefixes, pings)
                pings = collections.deque()
        finally:
            connection.disconnect()

    def _open(self, prefixes: tuple[str, ...]) -> Any:
        """A new connection, tracking ``prefixes`` (redirected to itself) and subscribed."""
        connection = self._make()
        try:
            connection.connect()
            connection.send_command("CLIENT", "ID")
            own_id = connection.read_response()
            connection.send_command("CLIENT", "SETNAME", client_name())
            with contextlib.suppress(redis.ResponseError):  # (an ACL may refuse names only)
                connection.read_response()
            arguments: list[Any] = ["CLIENT", "TRACKING", "ON", "REDIRECT", own_id, "BCAST"]
            for prefix in prefixes:
                arguments += ["PREFIX", prefix]
            connection.send_command(*arguments)
            connection.read_response()
            connection.send_command("SUBSCRIBE", CHANNEL)
            connection.read_response()
        except BaseException:
            connection.disconnect()
            raise
        return connection

    def _hand_over(self, old: Any, prefixes: tuple[str, ...], pings: Any) -> Any:
        """Track ``prefixes`` on a new connection, then close ``old``: no entry is lost.

        The new one announces every write from its tracking on; ``old`` is
        read up to the answer of a PING sent after that (every announcement
        it owed for the writes before, applied), then closed. Its pings
        answered meanwhile confirm as before (the PING sent as a barrier
        does not: the new connection's announcements are not read yet);
        the caches under a new prefix keep only reads begun once the new
        connection tracked.
        """
        new = self._open(prefixes)
        since = time.monotonic()
        try:
            old.send_command("PING")
            barrier = time.monotonic()
            deadline = barrier + SILENCE_PINGS * self._ping_every
            while True:
                if not old.can_read(timeout=max(0.0, deadline - time.monotonic())):
                    raise TimeoutError("no answer to the handover's PING")
                barrier_next = not pings  # every earlier ping answered: a PONG now is the barrier's
                if self._apply(old.read_response(), pings) and barrier_next:
                    break
        except BaseException:
            new.disconnect()
            raise
        old.disconnect()
        self._mark_tracked(prefixes, since)
        self._prefixes = prefixes
        return new

    def _mark_tracked(self, prefixes: tuple[str, ...], since: float | None = None) -> None:
        """Mark the caches under ``prefixes`` tracked by this life: they may keep reads."""
        with self._mutex:
            stores = [(p, list(s)) for p, s in self._stores.items()]
            self._ping_every = min(
                [1.0, *(each.settings.ping_every for _, s in stores for each in s)]
            )
        for prefix, entries in stores:
            if any(prefix.startswith(tracked) for tracked in prefixes):
                for each in entries:
                    each.mark_tracked(self.confirmation, since)

    def _listen(
        self,
        connection: Any,
        prefixes: tuple[str, ...],
        registered: int,
        pings: collections.deque[float],
    ) -> bool:
        """Read announcements and ping; True when a new prefix is to be tracked."""
        next_ping = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_ping:
                if len(pings) >= SILENCE_PINGS:
                    raise TimeoutError(f"{len(pings)} pings unanswered")
                if not self._wanted():
                    self._idle()
                    return False  # no near cache of this server is left: no connection
                connection.send_command("PING")
                pings.append(now)
                next_ping = now + self._ping_every
            if self._stopped:
                return False
            if self._registered != registered and self._wanted() != prefixes:
                return True  # a new prefix: handed over to a new connection
            wait = min(CHANGE_WITHIN, max(0.0, next_ping - time.monotonic()))
            if connection.can_read(timeout=wait):
                self._apply(connection.read_response(), pings)

    def _apply(self, message: Any, pings: collections.deque[float]) -> bool:
        """Apply one message of the connection (True if it was a PING's answer).

        A PING's answer confirms its ping, the oldest still unanswered; one
        with none left is a handover's barrier, which confirms nothing.
        """
        kind = message[0] if isinstance(message, list) and message else None
        if kind == b"pong":
            if pings:
                self.confirmation.answered(pings.popleft())
            return True
        if kind == b"message" and len(message) == 3 and message[1] == CHANNEL:
            self.invalidated(message[2])
        return False

    def invalidated(self, keys: Any) -> None:
        """Drop the entries of ``keys`` (None: every entry): the server announced their writes."""
        if keys is None:
            self._flush_all()
            return
        with self._mutex:
            stores = [(p, list(s)) for p, s in self._stores.items()]
        for raw in keys:
            key = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)
            for prefix, entries in stores:
                if key.startswith(prefix):
                    for each in entries:
                        each.invalidate(key)

    def _flush_all(self) -> None:
        with self._mutex:
            stores = [each for s in self._stores.values() for each in s]
        for each in stores:
            each.flush()


_trackers: dict[tuple[Any, ...], Tracker] = {}
_making = threading.Lock()


def _sync_class(connection_class: type) -> type:
    """The sync redis-py connection class of the same kind as ``connection_class``.

    (A Sentinel client's ``SentinelManaged...`` connection: the plain kind, to an address.)
    """
    name = connection_class.__name__.removeprefix("SentinelManaged")
    found = getattr(redis.connection, name, None)
    if isinstance(found, type) and issubclass(found, redis.connection.AbstractConnection):
        return found
    return redis.connection.Connection


def _copied(connection_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The settings of a client's connections a connection of tenure's own takes."""
    return {k: v for k, v in connection_kwargs.items() if k in _COPIED}


def servers_of(client: Any) -> list[tuple[type, dict[str, Any]]]:
    """(connection class, connection settings) of each server ``client`` may write to.

    A plain client's one server; a cluster client's primaries, as it knows
    them now; a Sentinel client's master and replicas, as its sentinels
    last said (:mod:`tenure._backends.near_sentinel`: none before they answer).
    """
    primaries = getattr(client, "get_primaries", None)
    if primaries is None:
        pool = client.connection_pool
        if near_sentinel.is_sentinel_pool(pool):
            watch = near_sentinel.watch_for(pool, _copied, _sync_class)
            kind = _sync_class(pool.connection_class)
            settings = _copied(pool.connection_kwargs)
            return [(kind, {**settings, "host": h, "port": p}) for h, p in watch.servers()]
        return [(pool.connection_class, pool.connection_kwargs)]
    found = []
    for node in primaries():
        pool = getattr(getattr(node, "redis_connection", None), "connection_pool", None)
        if pool is not None:  # a sync cluster's node
            found.append((pool.connection_class, pool.connection_kwargs))
        else:  # an asyncio cluster's node
            found.append((node.connection_class, node.connection_kwargs))
    return found


def master_check(client: Any) -> near_sentinel.MasterCheck | None:
    """For a Sentinel client, whether it reads from the master now; None for any other."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not near_sentinel.is_sentinel_pool(pool):
        return None
    return near_sentinel.MasterCheck(pool, near_sentinel.watch_for(pool, _copied, _sync_class))


def client_name() -> str:
    """The client name of this process's tracking connections (no spaces, as servers need)."""
    owner = default_owner_name()
    return NAME_PREFIX + "".join(c if c.isprintable() and not c.isspace() else "_" for c in owner)


def dropped_here(keys: Sequence[str]) -> None:
    """Drop every near entry of ``keys`` at once: this process wrote or deleted them.

    Whatever cache object wrote them, with ``near=`` or not, and whichever
    near caches of this process keep them (on every server: a key of the
    same name elsewhere only costs a read). Nothing to do, and nearly
    nothing done, while this process has no near cache.
    """
    if _trackers:
        for tracker in list(_trackers.values()):
            tracker.invalidated(keys)


def tracker_for(connection_class: type, connection_kwargs: dict[str, Any]) -> Tracker:
    """The tracker of the server these connection settings (a client's pool's) reach."""
    settings = _copied(connection_kwargs)
    if not (settings.get("host") or settings.get("path")):
        raise ArgumentError("near", "near caching needs a client of a server's address")
    kind = _sync_class(connection_class)
    where = (
        kind.__name__,
        settings.get("host"),
        settings.get("port"),
        settings.get("path"),
        settings.get("username"),
    )
    found = _trackers.get(where)
    if found is not None:
        return found
    with _making:
        found = _trackers.get(where)
        if found is None:

            def make() -> Any:
                return kind(
                    **settings,
                    protocol=2,
                    socket_timeout=5.0,
                    retry=Retry(NoBackoff(), 0),
                )

            label = settings.get("path") or f"{settings.get('host')}:{settings.get('port')}"
            found = _trackers[where] = Tracker(make, str(label))
        return found


def _after_fork_in_child() -> None:
    for tracker in list(_trackers.values()):
        tracker.forked()
    near_sentinel.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
