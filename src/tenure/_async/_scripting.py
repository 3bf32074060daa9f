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

import weakref
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
from redis import exceptions as redis_errors

from tenure._clients import map_exceptions
from tenure._scripts import Script, ScriptStatistics, load_script

__all__ = ["AsyncClient", "AsyncScriptRegistry", "registry_for"]

AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

_registries: weakref.WeakKeyDictionary[Any, AsyncScriptRegistry] = weakref.WeakKeyDictionary()


class AsyncScriptRegistry:
    """Runs scripts on one client, reloading them transparently on NOSCRIPT."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._stats = ScriptStatistics()

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
    ) -> Any:
        """Run ``script`` with ``keys`` and ``args`` and return the raw reply.

        Raises tenure's :class:`~tenure.BackendError` subclasses for server
        failures; the redis-py error is kept as ``__cause__``.
        """
        if isinstance(script, str):
            script = load_script(script)
        script.check_call(keys, args)
        self._stats.calls += 1
        client = self._client
        with map_exceptions(name=name, doing=f"running {script.name}"):
            try:
                return await client.evalsha(script.sha, len(keys), *keys, *args)
            except redis_errors.NoScriptError:
                self._stats.reloads += 1
                return await client.eval(script.source, len(keys), *keys, *args)


def registry_for(client: AsyncClient) -> AsyncScriptRegistry:
    """The one registry of ``client``, created on first use."""
    registry = _registries.get(client)
    if registry is None:
        registry = _registries[client] = AsyncScriptRegistry(client)
    return registry
