"""Wake-ups for waiters, on one connection of tenure's own per process and server.

A waiter must learn at once that a release handed it the lock, without
polling and without blocking one of the user's pooled connections (a
``BlockingConnectionPool(max_connections=3)`` with three waiters in BLPOP
has nothing left for the holder's release). So the scripts that grant a
primitive to a waiter PUBLISH the grant on the primitive's channel, and in
each process (each event loop, for asyncio) one :class:`AsyncWakeups` per
server keeps one dedicated subscriber connection: it subscribes to the
channel of every primitive this process waits on, reads the messages, and
hands each grant to the waiting thread or task in memory.

* A waiter registers before it joins the server's queue, and the channel's
  SUBSCRIBE is confirmed before that, so no grant to it can go unheard
  while the connection stays up.
* A message can still be lost (the connection drops, the server restarts):
  every waiter also re-checks on its own timer (its waiter-lease refresh),
  and a reconnect wakes every waiter to re-check at once. So a lost message
  costs at most one refresh interval, never the lock.
* Channels stay subscribed for :data:`LINGER` seconds after their last
  waiter leaves (a lock contended in a loop does not pay a SUBSCRIBE each
  time), and the connection is closed once nothing has been subscribed for
  as long. Waiters of 1,000 tasks or 100 threads on any number of primitives
  of one server share this one connection.
* The connection is made from the user's client's connection settings
  (host, port or unix socket, credentials, TLS), but it is never taken from
  the user's pool. On a cluster, PUBLISH reaches every node, so one
  connection to any node hears every grant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import exceptions as redis_errors

from tenure._backend_asyncio import Event, Mutex, scope_key, sleep, start_background
from tenure._clients import is_cluster
from tenure._lock_core import Acquired, parse_grant, to_text

__all__ = ["CONFIRM_TIMEOUT", "LINGER", "AsyncWaiter", "AsyncWakeups", "listen", "wakeups_for"]

logger = logging.getLogger("tenure.wakeups")

LINGER = 1.0
"""Seconds a channel (and then the connection) is kept once nobody waits on it."""

CONFIRM_TIMEOUT = 2.0
"""How long a waiter waits for its channel's SUBSCRIBE to be confirmed.

Past it the waiter goes on regardless and learns of its grant by its own
re-checks, so a broken subscriber connection slows waiting down but never
stops it.
"""

_RECONNECT_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0)

# Connection settings of the user's pool that belong to that pool alone.
_POOL_ONLY = frozenset(
    {
        "maint_notifications_pool_handler",
        "maint_notifications_config",
        "oss_cluster_maint_notifications_handler",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
        "himport_registry",
        "redis_connect_func",
    }
)


class AsyncWaiter:
    """One waiting acquisition: woken with its grant, or to re-check."""

    def __init__(self, wakeups: AsyncWakeups, channel: str, token: str) -> None:
        self.channel = channel
        self.token = token
        self.grant: Acquired | None = None
        self._event = Event()
        self._wakeups = wakeups

    def stop(self) -> None:
        """Stop listening (no I/O: the channel lingers a while, then goes)."""
        self._wakeups.unregister(self)

    def deliver(self, grant: Acquired | None) -> None:
        """Hand over a grant (or ``None``: re-check now) and wake the waiter."""
        if grant is not None:
            self.grant = grant
        self._event.set()

    async def wait(self, timeout: float) -> Acquired | None:
        """Wait up to ``timeout`` seconds; return the grant if one came."""
        if self.grant is None:
            await self._event.wait(max(0.0, timeout))
            self._event.clear()
        grant, self.grant = self.grant, None
        return grant


@dataclass
class _Channel:
    waiters: dict[str, AsyncWaiter] = field(default_factory=dict)
    confirmed: Event = field(default_factory=Event)
    idle_since: float | None = None


class AsyncWakeups:
    """The subscriber connection of one server in this process (or event loop)."""

    def __init__(self, connect: Callable[[], Any], describe: str) -> None:
        self._connect = connect
        self._describe = describe
        self._mutex = Mutex()
        self._channels: dict[str, _Channel] = {}
        self._conn: Any = None
        self._janitor_wakeup = Event()
        self._reader: Any = None
        self._janitor: Any = None
        self._closed = False
        self.connects = 0
        self.messages = 0
        self.refusals = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._channels)} channels"
        return f"<{type(self).__name__} {self._describe} {state}>"

    @property
    def closed(self) -> bool:
        """True once the connection was closed for idleness (a new one is made on demand)."""
        return self._closed

    @property
    def channels(self) -> int:
        """How many channels are subscribed (or being subscribed) now."""
        return len(self._channels)

    async def register(self, channel: str, token: str, timeout: float) -> AsyncWaiter | None:
        """Start listening for grants to ``token`` on ``channel``.

        Returns once the channel's subscription is confirmed, or after
        ``timeout`` seconds at the most (the waiter then relies on its
        re-checks until the subscription comes up); ``None`` if this
        connection was just closed for idleness (ask :func:`wakeups_for` again).
        """
        waiter = AsyncWaiter(self, channel, token)
        subscribe = False
        with self._mutex:
            if self._closed:
                return None
            entry = self._channels.get(channel)
            if entry is None:
                entry = self._channels[channel] = _Channel()
                subscribe = True
            entry.waiters[token] = waiter
            entry.idle_since = None
            start = self._reader is None
            if start:
                self._reader = start_background(self._read, "tenure-wakeups")
                self._janitor = start_background(self._sweep, "tenure-wakeups-janitor")
        if subscribe and not start:
            await self._send("SUBSCRIBE", channel)
        await entry.confirmed.wait(min(timeout, CONFIRM_TIMEOUT))
        return waiter

    def unregister(self, waiter: AsyncWaiter) -> None:
        """Stop listening for ``waiter`` (no I/O: the channel lingers, then goes)."""
        with self._mutex:
            entry = self._channels.get(waiter.channel)
            if entry is None or entry.waiters.get(waiter.token) is not waiter:
                return
            del entry.waiters[waiter.token]
            if not entry.waiters:
                entry.idle_since = time.monotonic()
                self._janitor_wakeup.set()

    async def _send(self, *args: str) -> None:
        conn = self._conn
        if conn is None:
            return  # the reader subscribes every channel once it is connected
        try:
            await conn.send_command(*args, check_health=False)
        except Exception as exc:  # the reader sees the broken connection and reconnects
            logger.debug("tenure wake-ups: sending %s failed: %s", args[0], exc)

    # -- the reader ------------------------------------------------------------

    async def _read(self) -> None:
        try:
            await self._read_until_closed()
        finally:  # closed, or cancelled with its event loop
            with self._mutex:
                self._closed = True
                conn, self._conn = self._conn, None
            _forget(self)
            self._janitor_wakeup.set()
            if conn is not None:
                await _disconnect(conn)

    async def _read_until_closed(self) -> None:
        attempt = 0
        while not self._closed:
            try:
                conn = self._connect()
                await conn.connect()
            except Exception as exc:
                delay = _RECONNECT_DELAYS[min(attempt, len(_RECONNECT_DELAYS) - 1)]
                attempt += 1
                logger.debug("tenure wake-ups: cannot connect to %s: %s", self._describe, exc)
                self._wake_everyone()
                await sleep(delay)
                continue
            attempt = 0
            self.connects += 1
            with self._mutex:
                if self.closed:  # closed for idleness while we connected
                    break
                self._conn = conn
                channels = list(self._channels)
            if channels:
                await self._send("SUBSCRIBE", *channels)
            self._wake_everyone()  # re-check: a grant may have gone out while we were away
            try:
                while True:
                    try:
                        reply = await conn.read_response()
                    except redis_errors.ResponseError as refused:
                        self._refused(refused)
                        continue
                    self._dispatch(reply)
            except Exception as exc:
                if not self._closed:
                    logger.debug("tenure wake-ups: connection to %s lost: %s", self._describe, exc)
            with self._mutex:
                self._conn = None
                for entry in self._channels.values():
                    entry.confirmed.clear()
            await _disconnect(conn)

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind = to_text(reply[0])
        channel = to_text(reply[1])
        if kind == "message":
            self.messages += 1
            token, grant = parse_grant(reply[2])
            with self._mutex:
                entry = self._channels.get(channel)
                waiter = None if entry is None else entry.waiters.get(token)
            if waiter is not None:
                waiter.deliver(grant)
        elif kind == "subscribe":
            with self._mutex:
                entry = self._channels.get(channel)
            if entry is not None:
                entry.confirmed.set()

    def _refused(self, error: Exception) -> None:
        """The server refused a SUBSCRIBE (an ACL without channel access).

        Waiting still works, by each waiter's re-checks: confirm the channels
        so nobody waits for a subscription that will not come, and say so once.
        """
        if not self.refusals:
            logger.warning(
                "tenure: %s refused the wake-up channels (%s); waiters re-check every "
                "waiter_lease * 0.4 instead of being woken: allow channels 'tenure:*' "
                "(ACL '&tenure:*') for prompt handoffs",
                self._describe,
                error,
            )
        self.refusals += 1
        with self._mutex:
            entries = list(self._channels.values())
        for entry in entries:
            entry.confirmed.set()

    def _wake_everyone(self) -> None:
        with self._mutex:
            waiters = [w for entry in self._channels.values() for w in entry.waiters.values()]
        for waiter in waiters:
            waiter.deliver(None)

    # -- the janitor: unsubscribe idle channels, close when idle ----------------

    async def _sweep(self) -> None:
        conn = None
        while True:
            await self._janitor_wakeup.wait(LINGER)
            self._janitor_wakeup.clear()
            if self.closed:  # the reader ended (its event loop is closing)
                return
            now = time.monotonic()
            with self._mutex:
                stale = [
                    name
                    for name, entry in self._channels.items()
                    if entry.idle_since is not None and now - entry.idle_since >= LINGER
                ]
                for name in stale:
                    del self._channels[name]
                if not self._channels:
                    # Nothing wanted for LINGER seconds (the last channel went
                    # stale just now, or never came): close.
                    self._closed = True
                    _forget(self)
                    conn = self._conn
                    self._conn = None
            if stale and not self._closed:
                await self._send("UNSUBSCRIBE", *stale)
            if self._closed:
                if conn is not None:
                    await _disconnect(conn)
                return


async def _disconnect(conn: Any) -> None:
    try:
        await conn.disconnect()
    except Exception:  # already broken, or closed by the other side first
        pass


async def listen(client: Any, channel: str, token: str, timeout: float) -> AsyncWaiter:
    """Register a waiter for ``token`` on ``channel`` with ``client``'s server."""
    while True:
        waiter = await wakeups_for(client).register(channel, token, timeout)
        if waiter is not None:
            return waiter


# -- one AsyncWakeups per (process or event loop, server) ------------------------

_registry: dict[tuple[object, tuple[Any, ...]], AsyncWakeups] = {}
_registry_mutex = Mutex()


def _forget(wakeups: AsyncWakeups) -> None:
    with _registry_mutex:
        for key in [k for k, v in _registry.items() if v is wakeups]:
            del _registry[key]


def wakeups_for(client: Any) -> AsyncWakeups:
    """The wake-up connection of ``client``'s server in this process (or event loop)."""
    server, connect, describe = _target(client)
    key = (scope_key(), server)
    with _registry_mutex:
        found = _registry.get(key)
        if found is None or found.closed:
            found = _registry[key] = AsyncWakeups(connect, describe)
        return found


def _target(client: Any) -> tuple[tuple[Any, ...], Callable[[], Any], str]:
    """Who ``client`` talks to, and how to open a connection of our own to it."""
    if is_cluster(client):
        nodes = sorted((node.host, node.port) for node in client.get_nodes())
        server: tuple[Any, ...] = ("cluster", *nodes) if nodes else ("cluster", id(client))
        return server, lambda: _cluster_connection(client), f"cluster {nodes[:1]}"
    pool = client.connection_pool
    kwargs = _own_settings(pool.connection_kwargs)
    where = (kwargs.get("path"), kwargs.get("host"), kwargs.get("port"))
    server = (pool.connection_class, *where, kwargs.get("username"))  # the db is not part of it
    describe = str(where[0] or f"{where[1]}:{where[2]}")
    return server, lambda: pool.connection_class(**kwargs), describe


def _own_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The user's connection settings, for a subscriber connection of tenure's own."""
    kwargs = {k: v for k, v in settings.items() if k not in _POOL_ONLY}
    kwargs.update(
        protocol=2,  # pub/sub messages as plain arrays
        socket_timeout=None,  # a subscriber waits for messages indefinitely
        socket_keepalive=True,
        health_check_interval=0,  # no PING of redis-py's own racing our reads
        decode_responses=False,
    )
    return kwargs


def _cluster_connection(client: Any) -> Any:
    """A connection to a live node of the cluster (any: PUBLISH reaches all)."""
    nodes = client.get_nodes()
    node = nodes[int(time.monotonic() * 10) % len(nodes)]  # spread retries over the nodes
    if hasattr(node, "connection_class"):  # an asyncio cluster's node
        return node.connection_class(**_own_settings(node.connection_kwargs))
    pool = node.redis_connection.connection_pool
    return pool.connection_class(**_own_settings(pool.connection_kwargs))
