"""Run tenure's Lua scripts: EVALSHA first, EVAL when the server lost the script.

One :class:`AsyncScriptRegistry` exists per client object (found with
:func:`registry_for`), so statistics are per client and nothing is shared
between a sync and an async client. A SCRIPT FLUSH, a server restart or a
failover to a replica that never saw the script shows up as NOSCRIPT; the
registry answers with EVAL, which runs the script and caches it on that
node, so the caller never sees it. On a cluster, the command is routed by its
keys, and the node that lacks the script gets it the same way.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
from redis import exceptions as redis_errors

from tenure._backends.for_asyncio import node_pipeline, sleep
from tenure._core.clients import (
    SLOT_MOVE_PATIENCE,
    SLOT_MOVE_PAUSE,
    STALE_CONNECTION_RETRIES,
    is_cluster,
    map_exceptions,
    slot_moving,
    slot_moving_error,
    stale_connection,
)
from tenure._core.exceptions import BackendError
from tenure._core.scripts import Script, ScriptStatistics, load_script, operation

__all__ = ["AsyncClient", "AsyncScriptRegistry", "primary_node", "registry_for"]

AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

_SENT_AGAIN = (
    redis_errors.NoScriptError,
    redis_errors.MovedError,
    redis_errors.AskError,
    redis_errors.TryAgainError,
)
"""Replies to a pipelined call that :meth:`AsyncScriptRegistry.run` sends again alone."""

_checked: set[tuple[str, int, int]] = set()
"""The (script, keys, arguments) shapes whose calls were checked against their headers."""

_registries: weakref.WeakKeyDictionary[Any, AsyncScriptRegistry] = weakref.WeakKeyDictionary()


class AsyncScriptRegistry:
    """Runs scripts on one client, reloading them transparently on NOSCRIPT."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._stats = ScriptStatistics()
        # The slowest recent answer of this client's server, as this process saw it
        # (decaying with every answer): how long Redlock attempts wait, shared by
        # every Redlock on the client, so a fresh one in a burst knows it too.
        self.slowest = 0.0

    def statistics(self) -> ScriptStatistics:
        """A snapshot of this registry's counters."""
        return ScriptStatistics(calls=self._stats.calls, reloads=self._stats.reloads)

    async def run(
        self,
        script: Script | str,
        keys: tuple[str, ...],
        args: tuple[str | int | float | bytes, ...],
        *,
        name: str | None = None,
        doing: str | None = None,
    ) -> Any:
        """Run ``script`` with ``keys`` and ``args`` and return the raw reply.

        Raises tenure's :class:`~tenure.BackendError` subclasses for server
        failures, saying ``while <doing>``: the caller's operation, by default
        the script's in :data:`~tenure._core.scripts.OPERATIONS` (never the
        script's name, which is the error's ``script``); the redis-py error is
        kept as ``__cause__``.
        """
        if isinstance(script, str):
            script = load_script(script)
        if (script.sha, len(keys), len(args)) not in _checked:
            script.check_call(keys, args)
            _checked.add((script.sha, len(keys), len(args)))
        self._stats.calls += 1
        try:  # the usual case first, with nothing set up for the others
            # EVALSHA through execute_command, as redis-py's evalsha() sends it
            # (two frames fewer on every call of every primitive).
            send: Any = self._client.execute_command  # (untyped in the sync client)
            return await send("EVALSHA", script.sha, len(keys), *keys, *args)
        except Exception as exc:
            first: Exception | None = exc
        try:
            return await self._run_again(script, keys, args, first, name, doing)
        finally:
            # The error's traceback holds this frame: no cycle through it to the
            # error (it would keep the caller's objects alive until collected).
            first = None

    async def _run_again(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[str | int | float | bytes, ...],
        first: Exception | None,
        name: str | None,
        doing: str | None,
    ) -> Any:
        """:meth:`run` after its first EVALSHA raised ``first``: reload, resend or translate."""
        client = self._client
        doing = doing or operation(script.name)
        pending, first = first, None  # held by no frame once raised (see run)
        with map_exceptions(name=name, doing=doing, script=script.name):
            stale = 0
            moving_since: float | None = None
            reload = False
            while True:
                try:
                    if pending is not None:
                        try:
                            raise pending
                        finally:
                            pending = None  # no frame of this call holds the error
                    if reload:
                        return await client.eval(script.source, len(keys), *keys, *args)
                    return await client.evalsha(script.sha, len(keys), *keys, *args)
                except redis_errors.NoScriptError:
                    self._stats.reloads += 1
                    reload = True
                except RuntimeError as exc:
                    stale += 1
                    if stale > STALE_CONNECTION_RETRIES or not stale_connection(exc):
                        raise
                    # redis-py dropped that connection: the next call connects
                    # anew. Every script is safe to run twice, so resend it.
                except (redis_errors.ClusterError, redis_errors.TryAgainError) as exc:
                    if not slot_moving(exc):
                        raise
                    # The slot's keys are on their way to another node: the call
                    # was refused, not run. Asked again (redis-py paused between
                    # its own tries) until the move ends or patience runs out.
                    now = time.monotonic()
                    if moving_since is None:
                        moving_since = now
                    elif now - moving_since >= SLOT_MOVE_PATIENCE:
                        moving = slot_moving_error(keys[0], doing, SLOT_MOVE_PATIENCE, name=name)
                        raise moving from exc
                    if isinstance(exc, redis_errors.TryAgainError):
                        await sleep(SLOT_MOVE_PAUSE)

    async def command(self, *args: Any, name: str | None, doing: str) -> Any:
        """Send one plain command (``execute_command``'s arguments), errors translated.

        Like :meth:`run`, a call that meets a connection of an event loop that
        ended is sent again: only reads go through here.
        """
        with map_exceptions(name=name, doing=doing):
            for attempt in itertools.count(1):
                try:
                    return await self._client.execute_command(*args)  # type: ignore[no-untyped-call,unused-ignore]
                except RuntimeError as exc:
                    if attempt > STALE_CONNECTION_RETRIES or not stale_connection(exc):
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def run_many(
        self,
        script: Script | str,
        calls: Sequence[tuple[tuple[str, ...], tuple[str | int | float | bytes, ...]]],
        *,
        name: str | None = None,
        doing: str | None = None,
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)`` in ``calls``, in one round trip.

        A pipeline (on a cluster, one per node, sent together); the calls a
        server lost the script for are sent again with EVAL. Returns the
        replies in order; the first call that failed raises, translated
        (``doing`` as :meth:`run`'s).
        """
        if isinstance(script, str):
            script = load_script(script)
        for keys, args in calls:
            script.check_call(keys, args)
        if not calls:
            return []
        self._stats.calls += len(calls)
        client = self._client
        doing = doing or operation(script.name)
        with map_exceptions(name=name, doing=doing, script=script.name):
            if is_cluster(client):
                replies = await self._by_node(script, calls)
            else:
                pipe = client.pipeline(transaction=False)
                for keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                replies = list(await pipe.execute(raise_on_error=False))
            # Sent again one by one, routed and reloaded as run() does: calls
            # whose node lost the script, or whose slot moved.
            for i, reply in enumerate(replies):
                if isinstance(reply, _SENT_AGAIN):
                    keys, args = calls[i]
                    self._stats.calls -= 1  # counted again by run()
                    replies[i] = await self.run(script, keys, args, name=name, doing=doing)
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        return replies

    async def _by_node(
        self,
        script: Script,
        calls: Sequence[tuple[tuple[str, ...], tuple[str | int | float | bytes, ...]]],
    ) -> list[Any]:
        """A cluster client's calls, one pipeline per primary.

        redis-py refuses scripts in its cluster pipelines.
        """
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, (keys, _) in enumerate(calls):
            node = await primary_node(self._client, keys[0])
            groups.setdefault(str(node.name), (node, []))[1].append(i)
        replies: list[Any] = [None] * len(calls)
        for node, indices in groups.values():
            commands = [
                ("EVALSHA", script.sha, len(calls[i][0]), *calls[i][0], *calls[i][1])
                for i in indices
            ]
            for i, reply in zip(indices, await node_pipeline(node, commands), strict=True):
                replies[i] = reply
        return replies


async def primary_node(cluster: Any, key: str) -> Any:
    """The cluster node serving ``key``'s slot as primary, from the client's slot map."""
    try:
        node = cluster.get_node_from_key(key, replica=False)
    except redis_errors.SlotNotCoveredError:
        node = None
    if node is None:
        # A cluster client may map its slots lazily, on its first command.
        await cluster.exists(key)
        node = cluster.get_node_from_key(key, replica=False)
    if node is None:
        raise BackendError(f"the cluster client knows no primary for the slot of {key!r}")
    return node


def registry_for(client: AsyncClient) -> AsyncScriptRegistry:
    """The one registry of ``client``, created on first use."""
    registry = _registries.get(client)
    if registry is None:
        registry = _registries[client] = AsyncScriptRegistry(client)
    return registry
