"""Wake-ups for waiters, on one connection of tenure's own per process and server.

A waiter must learn at once that a release handed it the lock, without
polling and without blocking one of the user's pooled connections (a
``BlockingConnectionPool(max_connections=3)`` with three waiters in BLPOP
has nothing left for the holder's release). So in each process
(or event loop) one :class:`AsyncWakeups` per server keeps one dedicated
subscriber connection on a channel of its own, ``tenure:wake:<random id>``.
A waiter names that channel when it joins a primitive's queue (the scripts
keep it beside the queue), and the script that grants it the primitive
PUBLISHes the grant there; the reader hands it to the waiting thread or task
in memory. Exactly one process hears each grant, however many wait.

* The channel's SUBSCRIBE is confirmed before any waiter joins a queue, so
  no grant can go unheard while the connection stays up.
* A message can still be lost (the connection drops, the server restarts):
  every waiter also re-checks on its own timer (its waiter-lease refresh),
  and a reconnect wakes every waiter to re-check at once. So a lost message
  costs at most one refresh interval, never the lock.
* The connection is closed :data:`LINGER` seconds after its last waiter left.
  Every waiter of the process on any number of primitives of one server
  shares this one connection (``tenure bench locks --part waiters``
  measures it).
* The connection is made from the user's client's connection settings
  (host, port or unix socket, credentials, TLS), but it is never taken from
  the user's pool. On a cluster, PUBLISH reaches every node, so a
  connection to any node hears every grant; but a message that crosses the
  cluster bus can take tens of milliseconds, so a waiter listens on the node
  that serves its primitive's key (one connection per node in use), where
  the script that grants it publishes. After a failover or resharding the
  grant still arrives, over the bus.
"""

from __future__ import annotations

import logging
import secrets
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors

from tenure._backends.for_asyncio import Event, Mutex, scope_key, sleep, start_background
from tenure._core.clients import is_cluster
from tenure._core.leased import Acquired, parse_grant
from tenure._core.line import line_entry
from tenure._core.values import to_text

__all__ = [
    "CONFIRM_TIMEOUT",
    "LINGER",
    "AsyncWaiter",
    "AsyncWakeups",
    "Settings",
    "listen",
    "own_settings",
    "server_target",
    "wakeups_for",
]

CHANNEL_PREFIX = "tenure:wake:"
"""Each process's wake-up channel is this and a random id (ACL: ``&tenure:*``)."""

logger = logging.getLogger("tenure.wakeups")

LINGER = 1.0
"""Seconds the connection is kept once nobody waits."""

CONFIRM_TIMEOUT = 2.0
"""How long a waiter waits for the channel's SUBSCRIBE to be confirmed.

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


class AsyncWaiter(Event):
    """One waiting acquisition: woken with its grant, or to re-check.

    It is its own event (an object fewer for each of 10,000 waiting tasks),
    unless it is given one to share (a Redlock's, set by every master's
    waiter): then that one is set. Its :meth:`wait` is its own; the event's
    methods are called through :class:`Event` itself.
    """

    def __init__(self, wakeups: AsyncWakeups, token: str, event: Event | None = None) -> None:
        Event.__init__(self)
        self.token = token
        self.channel = wakeups.channel
        self.grant: Acquired | None = None
        self.error: BaseException | None = None
        self.recheck = False
        """Set when woken to re-check (a grant may have gone out unheard); cleared by the waiter."""
        self.dismissed = False
        """Set when its give-up went through: out of line, holding only a grant
        delivered with the answer."""
        self._shared = event
        self._wakeups = wakeups
        self.owner_name = ""
        """Its owner name, as the process's line joins it (set at each join)."""
        self.attempt = ""
        """Its acquire call's id if the caller chose its token (see ``Acquiring``), else ''."""

    @property
    def entry(self) -> str:
        """How the line scripts name it (:func:`~tenure._core.line.line_entry`)."""
        return line_entry(self.token, self.attempt)

    def stop(self) -> None:
        """Stop listening (no I/O)."""
        self._wakeups.unregister(self)

    def _wake(self) -> None:
        if self._shared is None:
            Event.set(self)
        else:
            self._shared.set()

    def deliver(self, grant: Acquired | None) -> None:
        """Hand over a grant (or ``None``: re-check now) and wake the waiter."""
        if grant is not None:
            self.grant = grant
        else:
            self.recheck = True
        self._wake()

    def dismiss(self) -> None:
        """Wake the waiter: its give-up went through (out of line; a grant delivered stays)."""
        self.dismissed = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """Wake the waiter with an error: the call made for it failed (raised by :meth:`wait`)."""
        self.error = error
        self._wake()

    @property
    def up(self) -> bool:
        """Whether the channel's subscription is up now."""
        return self._wakeups.up

    async def subscribed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the channel's subscription; True once it is up."""
        return await self._wakeups.subscribed(timeout)

    async def wait(self, timeout: float | None) -> Acquired | None:  # type: ignore[override]
        """Wait up to ``timeout`` seconds (None: until woken); return the grant if one came.

        Raises the error a call made on this waiter's behalf failed with.
        """
        if self.grant is None and self.error is None:
            timeout = None if timeout is None else max(0.0, timeout)
            if self._shared is None:
                await Event.wait(self, timeout)
                Event.clear(self)
            else:  # (a Redlock's: its listener usually waits on it for every master)
                await self._shared.wait(timeout)
                self._shared.clear()
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        grant, self.grant = self.grant, None
        return grant


class AsyncWakeups:
    """The subscriber connection of one server in this process (or event loop)."""

    def __init__(self, connect: Callable[[], Any], describe: str) -> None:
        self._connect = connect
        self._describe = describe
        self.channel = CHANNEL_PREFIX + secrets.token_hex(8)
        self._mutex = Mutex()
        self._waiters: dict[str, AsyncWaiter] = {}
        self._idle_since: float | None = None
        self._confirmed = Event()
        self._conn: Any = None
        self._janitor_wakeup = Event()
        self._reader: Any = None  # the background jobs, strongly referenced
        self._janitor: Any = None  # (see start_background)
        self._closed = False
        self.connects = 0
        self.messages = 0
        self.refusals = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._waiters)} waiting"
        return f"<{type(self).__name__} {self._describe} {self.channel} {state}>"

    @property
    def closed(self) -> bool:
        """True once the connection was closed for idleness (a new one is made on demand)."""
        return self._closed

    async def register(
        self, token: str, timeout: float, event: Event | None = None, confirm: bool = True
    ) -> AsyncWaiter | None:
        """Start listening for grants to ``token``.

        Returns at once when the subscription is up, else once it is
        confirmed, or after ``timeout`` seconds at the most (the waiter then
        relies on its re-checks until it comes up); ``None`` if this
        connection was just closed for idleness (ask :func:`wakeups_for` again).
        ``event`` (shared by waiters on several servers) is set on a wake-up.
        With ``confirm=False`` it returns at once: the caller waits for the
        subscription itself (a process's line, once for all its waiters).
        """
        waiter = AsyncWaiter(self, token, event)
        with self._mutex:
            if self._closed:
                return None
            self._waiters[token] = waiter
            self._idle_since = None
            if self._reader is None:
                self._reader = start_background(self._read, "tenure-wakeups")
                self._janitor = start_background(self._sweep, "tenure-wakeups-janitor")
        if confirm:
            await self.subscribed(timeout)
        return waiter

    @property
    def up(self) -> bool:
        """Whether the SUBSCRIBE is confirmed on the current connection."""
        return self._confirmed.is_set()

    async def subscribed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds (at most :data:`CONFIRM_TIMEOUT`) for the SUBSCRIBE."""
        return await self._confirmed.wait(max(0.0, min(timeout, CONFIRM_TIMEOUT)))

    def unregister(self, waiter: AsyncWaiter) -> None:
        """Stop listening for ``waiter`` (no I/O: the connection lingers, then goes)."""
        with self._mutex:
            if self._waiters.get(waiter.token) is not waiter:
                return
            del self._waiters[waiter.token]
            if not self._waiters:
                # The janitor looks every LINGER seconds; waking it here would
                # cost a thread switch on every uncontended handoff.
                self._idle_since = time.monotonic()

    # -- the reader ------------------------------------------------------------

    async def _read(self) -> None:
        try:
            await self._read_until_closed()
        finally:  # closed, or stopped with its event loop
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
                await conn.send_command("SUBSCRIBE", self.channel, check_health=False)
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
                self._confirmed.clear()
            await _disconnect(conn)

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind = to_text(reply[0])
        if kind == "message":
            self.messages += 1
            token, grant = parse_grant(reply[2])
            with self._mutex:
                waiter = self._waiters.get(token)
            if waiter is not None:
                waiter.deliver(grant)
        elif kind == "subscribe":
            self._confirmed.set()
            if self.connects > 1:
                self._wake_everyone()  # re-check: a grant may have gone out while we were away

    def _refused(self, error: Exception) -> None:
        """The server refused the SUBSCRIBE (an ACL without channel access).

        Waiting still works, by each waiter's re-checks: confirm, so nobody
        waits for a subscription that will not come, and say so once.
        """
        if not self.refusals:
            logger.warning(
                "tenure: %s refused the wake-up channel (%s); waiters re-check every "
                "waiter_lease * 0.4 instead of being woken: allow channels 'tenure:*' "
                "(ACL '&tenure:*') for prompt handoffs",
                self._describe,
                error,
            )
        self.refusals += 1
        self._confirmed.set()

    def _wake_everyone(self) -> None:
        with self._mutex:
            waiters = list(self._waiters.values())
        for waiter in waiters:
            waiter.deliver(None)

    # -- the janitor: close the connection when idle ---------------------------

    async def _sweep(self) -> None:
        while True:
            await self._janitor_wakeup.wait(LINGER)
            self._janitor_wakeup.clear()
            if self.closed:  # the reader ended (its event loop is closing)
                return
            with self._mutex:
                idle = self._idle_since
                if self._waiters or idle is None or time.monotonic() - idle < LINGER:
                    continue
                # Nobody waited for LINGER seconds: close.
                self._closed = True
                _forget(self)
                conn, self._conn = self._conn, None
            if conn is not None:
                await _disconnect(conn)
            return


async def _disconnect(conn: Any) -> None:
    try:
        await conn.disconnect()
    except Exception:  # already broken, or closed by the other side first
        pass


async def listen(
    client: Any,
    token: str,
    timeout: float,
    key: str | None = None,
    event: Event | None = None,
    confirm: bool = True,
) -> AsyncWaiter:
    """Register a waiter for ``token`` with ``client``'s server (see :class:`AsyncWakeups`).

    ``key`` is a key of the primitive waited for: on a cluster the waiter
    listens on the node that serves it. ``event``, when given, is set on
    each wake-up (one event for a waiter listening on several servers).
    """
    while True:
        waiter = await wakeups_for(client, key).register(token, timeout, event, confirm)
        if waiter is not None:
            return waiter


# -- one AsyncWakeups per (event loop, server) --------------------------------------

_registry: dict[tuple[object, tuple[Any, ...]], AsyncWakeups] = {}
_registry_mutex = Mutex()


def _forget(wakeups: AsyncWakeups) -> None:
    with _registry_mutex:
        for key in [k for k, v in _registry.items() if v is wakeups]:
            del _registry[key]


_targets: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], Callable[[], Any], str]] = (
    weakref.WeakKeyDictionary()
)


def wakeups_for(client: Any, key: str | None = None) -> AsyncWakeups:
    """The wake-up connection of ``client``'s server in this process (or event loop).

    On a cluster, that of the node serving ``key`` (any node without a key).
    """
    node = _node_of(client, key) if key is not None and is_cluster(client) else None
    target: tuple[tuple[Any, ...], Callable[[], Any], str] | None
    if node is not None:
        target = (
            ("cluster node", node.host, node.port),
            lambda: _node_connection(node),
            f"cluster node {node.host}:{node.port}",
        )
    else:
        target = _targets.get(client)
        if target is None:
            target = _targets[client] = server_target(client)
    server, connect, describe = target
    entry = (scope_key(), server)
    with _registry_mutex:
        found = _registry.get(entry)
        if found is None or found.closed:
            found = _registry[entry] = AsyncWakeups(connect, describe)
        return found


Settings = Callable[[dict[str, Any]], dict[str, Any]]
"""The settings of a connection of tenure's own, from the user's connection settings."""


def server_target(
    client: Any, settings: Settings | None = None
) -> tuple[tuple[Any, ...], Callable[[], Any], str]:
    """Who ``client`` talks to, and how to open a connection of our own to it.

    ``settings`` makes that connection's settings from the user's (default:
    a subscriber's, which waits for messages indefinitely).
    """
    own = own_settings if settings is None else settings
    if is_cluster(client):
        nodes = sorted((node.host, node.port) for node in client.get_nodes())
        server: tuple[Any, ...] = ("cluster", *nodes) if nodes else ("cluster", id(client))
        return server, lambda: _cluster_connection(client, own), f"cluster {nodes[:1]}"
    pool = client.connection_pool
    kwargs = own(pool.connection_kwargs)
    where = (kwargs.get("path"), kwargs.get("host"), kwargs.get("port"))
    server = (pool.connection_class, *where, kwargs.get("username"))  # the db is not part of it
    describe = str(where[0] or f"{where[1]}:{where[2]}")
    return server, lambda: pool.connection_class(**kwargs), describe


def own_settings(settings: dict[str, Any]) -> dict[str, Any]:
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


def _node_of(client: Any, key: str) -> Any:
    """The node serving ``key`` in the cluster client's slot map, or None (not mapped yet)."""
    try:
        return client.get_node_from_key(key, replica=False)
    except redis_errors.RedisClusterException:  # the slot map is not loaded yet
        return None


def _cluster_connection(client: Any, settings: Settings) -> Any:
    """A connection to a live node of the cluster (any: PUBLISH reaches all)."""
    nodes = client.get_nodes()
    node = nodes[int(time.monotonic() * 10) % len(nodes)]  # spread retries over the nodes
    return _node_connection(node, settings)


def _node_connection(node: Any, settings: Settings = own_settings) -> Any:
    """A connection of tenure's own to one cluster node."""
    if hasattr(node, "connection_class"):  # an async cluster's node (no redis_connection)
        return node.connection_class(**settings(node.connection_kwargs))
    pool = node.redis_connection.connection_pool
    return pool.connection_class(**settings(pool.connection_kwargs))
