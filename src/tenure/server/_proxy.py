"""A fault-injecting TCP proxy: latency, partitions, resets and refusals on demand.

:class:`FaultProxy` listens on loopback and forwards every connection to one
target (a server's ``(host, port)``). Faults are set per direction at any time
while it runs, from any thread:

* ``"upstream"`` is client -> server (commands), ``"downstream"`` is
  server -> client (replies), ``"both"`` is both.
* Latency: every chunk read from one side is written to the other ``seconds``
  after it was read; the order of bytes is kept (a chunk never overtakes the
  one before it, even when the latency is lowered meanwhile). The TCP
  handshake itself is not delayed.
* Blackhole (a partition): bytes are read and discarded, connections stay
  open, nobody is told. A chunk is dropped when its direction is blackholed
  at the moment it is read *or* at the moment it is due, so bytes in flight
  when the partition starts are lost too. A close (FIN) is not lost: it waits
  until the partition heals, like a retransmitted FIN would.
* Reset: every current connection is closed at once with RST (``SO_LINGER``
  0) on both sides.
* Refusal of new connections: ``"refuse"`` stops listening (connects fail
  with ECONNREFUSED; the port stays the proxy's), ``"reset"`` accepts and
  resets at once, ``"close"`` accepts and closes at once.
* A lost reply (:meth:`FaultProxy.lose_reply`): a command whose bytes contain
  a pattern reaches the server and runs; its reply is discarded and the
  connection reset, as when a connection drops between a command and its
  answer. A client that resends the command runs it twice.

The proxy is pure Python: one asyncio event loop in a daemon thread, so it
serves sync and asyncio code alike, and its own thread never blocks yours for
more than a control round trip. :meth:`FaultProxy.stop` resets the remaining
connections, closes every socket and joins the thread.

The parts are composed by :class:`FaultProxy` (the control API, here): the
faults and the lost-reply rule (``_proxy_faults``), the listening socket
(``_proxy_listener``), the connections relayed both ways (``_proxy_relay``)
and the event loop's thread (``_proxy_thread``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

import redis
import redis.asyncio

from tenure._core.exceptions import ArgumentError, EmbeddedServerError
from tenure.server._lifecycle import Lifecycle
from tenure.server._proxy_faults import (
    NO_FAULTS,
    REFUSE_MODES,
    Direction,
    FaultRules,
    ProxyFaults,
    RefuseMode,
    directed,
)
from tenure.server._proxy_listener import Listener, loopback_host
from tenure.server._proxy_relay import ProxyConnection, Relay, resolve
from tenure.server._proxy_thread import LoopThread
from tenure.server._registry import register, unregister

__all__ = ["Direction", "FaultProxy", "ProxyConnection", "ProxyFaults", "RefuseMode"]


class FaultProxy(Lifecycle):
    """A TCP proxy on loopback in front of ``(target_host, target_port)``, with faults.

    Nothing runs until :meth:`start` (or ``with`` / ``async with``)::

        with ServerProcess() as server, FaultProxy(*server.address) as proxy:
            client = proxy.client(socket_timeout=0.5)
            proxy.set_latency(0.1, "downstream")  # every reply 100 ms late
            client.ping()
            proxy.blackhole()  # a partition: the next command times out
            proxy.clear()  # healed (a new connection is needed: redis-py makes one)
            client.close()

    ``host`` must be a loopback address; ``port=0`` picks a free port (below
    the kernel's ephemeral range, like the servers'). ``connect_timeout``
    bounds the proxy's connect to the target; when that connect fails, the
    client's connection is reset. ``name`` labels the proxy in ``repr``.

    Faults (:meth:`set_latency`, :meth:`blackhole`, :meth:`refuse_connections`,
    :meth:`reset_connections`, :meth:`lose_reply`, :meth:`clear`) can be set
    before start and at any time while running, from any thread or event
    loop; each method says what it does. A direction is ``"upstream"``
    (client -> server: commands), ``"downstream"`` (server -> client:
    replies) or ``"both"``. Latency keeps the order of the bytes (a chunk
    never overtakes the one before it, even when the latency is lowered) and
    does not delay the TCP handshake. A blackhole drops a chunk when its
    direction is blackholed as the chunk is read *or* when it is due, so the
    bytes in flight as a partition starts are lost too; a close (FIN) is not
    lost but waits until the partition heals. Faults are kept across
    :meth:`stop` and :meth:`start`. :meth:`stop` resets the connections
    left, closes every socket, frees the port and joins the proxy's thread;
    a restart gets a new port unless ``port`` was given.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        connect_timeout: float = 5.0,
        name: str = "proxy",
    ) -> None:
        if not 0 < target_port < 65536:
            raise ArgumentError("target_port", f"not a TCP port: {target_port!r}")
        if not 0 <= port < 65536:
            raise ArgumentError("port", f"not a TCP port: {port!r}")
        if not (connect_timeout > 0 and math.isfinite(connect_timeout)):
            raise ArgumentError("connect_timeout", "must be a positive number of seconds")
        self._target = (target_host, target_port)
        self._host = loopback_host(host)
        self._name = name
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
        self._rules = FaultRules()
        self._relay = Relay(self._rules, connect_timeout)
        self._listener = Listener(self._host, port, self._rules, self._relay.accept)
        self._thread = LoopThread(self)

    # ------------------------------------------------------------------ addresses

    @property
    def running(self) -> bool:
        """Whether the proxy is started (and not stopped)."""
        return self._thread.running

    @property
    def host(self) -> str:
        """The loopback address the proxy listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The port the proxy listens on.

        Raises :class:`~tenure.EmbeddedServerError` while not running.
        """
        port = self._listener.port
        if port is None:
            raise EmbeddedServerError(f"{self!r} is not running: it has no port")
        return port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` to connect to instead of the target."""
        return (self._host, self.port)

    @property
    def url(self) -> str:
        """``redis://host:port`` of the proxy (IPv6 hosts in brackets)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"redis://{host}:{self.port}"

    @property
    def target(self) -> tuple[str, int]:
        """``(host, port)`` the proxy forwards to."""
        return self._target

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` connected through the proxy; ``kwargs`` go to its constructor."""
        return redis.Redis(host=self._host, port=self.port, **kwargs)

    def async_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """A new ``redis.asyncio.Redis`` through the proxy; ``kwargs`` go to its constructor."""
        return redis.asyncio.Redis(host=self._host, port=self.port, **kwargs)

    # ------------------------------------------------------------------ faults

    @property
    def faults(self) -> ProxyFaults:
        """The faults applied now."""
        return self._rules.now

    def set_latency(self, seconds: float, direction: Direction = "both") -> None:
        """Delay every chunk read from now on by ``seconds`` (0 removes the delay).

        Each chunk is written ``seconds`` after the proxy read it, in order.
        Chunks already waiting keep the delay they were read with.
        """
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ArgumentError("seconds", f"must be a finite number >= 0, not {seconds!r}")
        self._update(directed(direction, "latency", float(seconds)))

    def blackhole(self, direction: Direction = "both", *, enabled: bool = True) -> None:
        """Drop every byte in ``direction`` (a partition); ``enabled=False`` stops dropping.

        Connections stay open and nobody is told: a client waits for its
        reply until its own timeout. New connections are still accepted
        (the handshake is the kernel's), and then hear nothing either.
        """
        self._update(directed(direction, "blackhole", bool(enabled)))

    def refuse_connections(self, mode: RefuseMode | None = "refuse") -> None:
        """Turn new connections away; ``None`` accepts them again.

        ``"refuse"``: the proxy stops listening, so connects fail with
        ECONNREFUSED (the port stays bound to the proxy). ``"reset"``: a
        connect succeeds, then the connection is reset at once. ``"close"``:
        it is closed at once (the client reads EOF). Connections already open
        are not touched (see :meth:`reset_connections`). Takes effect before
        this method returns.
        """
        if mode is not None and mode not in REFUSE_MODES:
            raise ArgumentError("mode", f"expected 'refuse', 'reset', 'close' or None: {mode!r}")
        self._update({"refusing": mode})

    def lose_reply(self, match: bytes, count: int = 1) -> None:
        """Lose the reply of the next ``count`` commands whose bytes contain ``match``.

        When bytes a client sends on a connection contain ``match`` (say the
        SHA1 an ``EVALSHA`` names, or a key), they are forwarded as usual and
        the server runs the command; the next bytes the server sends back on
        that connection (its reply) are discarded, and the connection is reset
        (RST to both peers) — a reply lost to a dropped connection. The
        client's read fails with ``ConnectionError`` only after the server
        executed the command, so a client that resends it (redis-py does, by
        default) runs it a second time. After ``count`` matching commands the
        fault disarms itself; ``count=0`` disarms it at once, and so does
        :meth:`clear`. :attr:`lost_replies` counts the replies lost.

        A match may span two chunks of the stream. Meant for one command at a
        time per connection: with commands pipelined, the bytes discarded may
        begin with the replies of commands sent before the matching one.
        Takes effect before this method returns (only connections' future
        bytes are matched).
        """
        if not isinstance(match, bytes) or not match:
            raise ArgumentError("match", f"must be non-empty bytes, not {match!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ArgumentError("count", f"must be an integer >= 0, not {count!r}")
        with self._lock:
            self._arm_lose(match, count)

    @property
    def lost_replies(self) -> int:
        """How many replies :meth:`lose_reply` discarded since the proxy was created."""
        return self._rules.lost_replies.lost

    @property
    def replies_to_lose(self) -> int:
        """How many more matching commands :meth:`lose_reply` loses a reply of (0: disarmed)."""
        return self._rules.lost_replies.left

    def clear(self) -> None:
        """Remove every fault: no latency, no blackhole, new connections accepted.

        No reply is lost any more either (see :meth:`lose_reply`). Chunks
        already waiting keep their delay; dropped bytes stay lost, so a
        connection that lost bytes is usually out of step and best replaced.
        """
        with self._lock:
            self._rules.now = NO_FAULTS
            self._arm_lose(b"", 0)
            self._apply()

    def retarget(self, host: str, port: int, *, reset: bool = True) -> None:
        """Forward new connections to ``host:port`` from now on (a moved endpoint).

        Models a virtual IP or DNS name that follows the primary through a
        failover: clients keep the proxy's address and reach the new target
        when they reconnect. With ``reset`` (default) the current connections
        are reset, so no client keeps talking to the old target.
        """
        if not 0 < port < 65536:
            raise ArgumentError("port", f"not a TCP port: {port!r}")
        with self._lock:
            self._target = (host, port)
            if self.running:
                self._relay.target = resolve(host, port, self)
                if reset:
                    self._thread.call(self._relay.abort_all())

    def reset_connections(self) -> int:
        """Reset every current connection (RST to both peers); return how many.

        When this returns, the RSTs are sent. A command in flight fails with
        ``ConnectionError``, and so does the next command of a
        ``redis.asyncio`` client. The sync ``redis.Redis`` pool checks an idle
        connection when it hands it out and silently reconnects, so there the
        reset of an idle connection reaches the caller only on a
        ``single_connection_client=True`` client.
        """
        with self._lock:
            if not self.running:
                return 0
            return self._thread.call(self._relay.abort_all())

    def connections(self) -> list[ProxyConnection]:
        """The live connections, oldest first."""
        return self._relay.snapshots()

    def wait_connections(self, count: int, timeout: float = 5.0) -> None:
        """Wait until exactly ``count`` connections are live.

        A connection closed by its client leaves after the close went through
        the proxy (a few milliseconds; later under latency or a partition).
        Raises :class:`TimeoutError` naming the number seen.
        """
        deadline = time.monotonic() + timeout
        while True:
            live = len(self.connections())
            if live == count:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self!r}: {live} connections live after {timeout:g} s, not {count}"
                )
            time.sleep(0.002)

    def _update(self, changes: dict[str, Any]) -> None:
        with self._lock:
            self._rules.update(changes)
            self._apply()

    def _apply(self) -> None:
        """Tell the proxy's thread the faults changed (and wait for listening to follow)."""
        if self.running:
            self._thread.call(self._faults_changed())

    def _arm_lose(self, match: bytes, count: int) -> None:
        """Set the lost-reply rule: on the proxy's loop while it runs (under the lock)."""
        if self.running:
            self._thread.call(self._rearm(match, count))
        else:
            self._rules.lost_replies.arm(match, count)

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        with self._lock:
            if os.getpid() != self._owner_pid:
                raise EmbeddedServerError(f"{self!r} was created by another process (pid changed)")
            if self.running:
                return
            self._relay.target = resolve(*self._target, self)
            self._listener.bind(self)
            self._thread.start(f"tenure-proxy-{self._listener.port}")
            try:
                self._thread.call(self._open())
            except BaseException:
                self._halt(5.0)
                raise
            register(self)

    def _stop(self, timeout: float) -> None:
        with self._lock:
            if os.getpid() != self._owner_pid:
                return  # a forked child: the proxy belongs to the parent
            self._halt(timeout)
            unregister(self)

    def _halt(self, timeout: float) -> None:
        self._thread.stop(timeout, self._close_all)
        self._listener.release()
        self._rules.close()

    # ------------------------------------------------------------------ on the proxy's loop

    async def _open(self) -> None:
        self._rules.open()
        self._listener.open()

    async def _rearm(self, match: bytes, count: int) -> None:
        self._rules.lost_replies.arm(match, count)
        self._relay.restart_matches()

    async def _faults_changed(self) -> None:
        self._rules.changed()
        await self._listener.follow()

    async def _close_all(self) -> None:
        await self._listener.close()
        await self._relay.abort_all()

    def __repr__(self) -> str:
        port = self._listener.port
        where = f"{self._host}:{port}" if port is not None else "no address"
        target = f"{self._target[0]}:{self._target[1]}"
        state = "running" if self.running else "stopped"
        faults = self._rules.now
        extra = f" faults={faults}" if faults.active else ""
        return f"<FaultProxy {self._name!r} {where} -> {target} {state}{extra}>"
