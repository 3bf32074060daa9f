"""AsyncAcknowledger: run a script, then WAIT for replicas, on one connection.

The rules (policy, commands, verdicts) are in :mod:`tenure._core.replication`;
this module does the I/O. A script and its WAIT travel in one pipeline, so
they share a connection (WAIT counts only its own connection's writes) and
cost one round trip plus the replicas' acknowledgement:

* a plain client, or one from ``Sentinel.master_for`` (which follows the
  primary through failovers): a non-transactional pipeline;
* a cluster client: the primary of the key's slot, on one of that node's
  connections. A node that answers MOVED, or cannot be reached, makes the
  cluster client refresh its slot map (one keyed read) and the call is sent
  once more to the slot's new primary.

A script missing from the node (NOSCRIPT) is sent again as EVAL, with its
WAIT. The replica count behind the default policy (a majority) is read with
``ROLE`` from the node that will be asked to WAIT, and read again after
:data:`~tenure._core.replication.REPLICA_COUNT_TTL` seconds, after a
shortfall (a failover's new primary has fewer replicas; a replica was lost)
and when the slot's primary changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors

from tenure._async._scripting import AsyncClient, primary_node
from tenure._backends.for_asyncio import node_pipeline
from tenure._core.clients import is_cluster, map_exceptions, translate_error
from tenure._core.exceptions import BackendError
from tenure._core.replication import (
    REPLICA_COUNT_TTL,
    Acknowledgement,
    ReplicationPolicy,
    parse_role,
    parse_wait,
    unsupported_wait,
)
from tenure._core.scripts import load_script, operation

__all__ = ["AsyncAcknowledger"]

_REROUTE = (redis_errors.MovedError, redis_errors.ConnectionError, redis_errors.TimeoutError)


class AsyncAcknowledger:
    """Runs scripts under a :class:`ReplicationPolicy` on one client."""

    def __init__(self, client: AsyncClient, policy: ReplicationPolicy, name: str) -> None:
        self.client = client
        self.policy = policy
        self.name = name
        self._counted: dict[str, tuple[int, float]] = {}  # node -> (replicas, when)
        self.last: Acknowledgement | None = None
        self.shortfalls = 0

    async def run(
        self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]
    ) -> tuple[Any, Acknowledgement]:
        """Run ``script`` and wait for the policy's acknowledgements.

        Returns the script's reply and the acknowledgement; the caller decides
        whether a short one matters (a script that took nothing needs none).
        Server failures raise tenure's :class:`~tenure.BackendError` subclasses.
        """
        loaded = load_script(script)
        loaded.check_call(keys, args)
        required = await self.required(keys[0])
        wait = self.policy.wait_command(required)
        call: tuple[Any, ...] = ("EVALSHA", loaded.sha, len(keys), *keys, *args)
        replies = await self._send(keys[0], [call, wait], operation(script))
        if isinstance(replies[0], redis_errors.NoScriptError):
            call = ("EVAL", loaded.source, len(keys), *keys, *args)
            replies = await self._send(keys[0], [call, wait], operation(script))
        reply, waited = replies
        if isinstance(reply, BaseException):
            doing = operation(script)
            raise translate_error(reply, name=self.name, doing=doing, script=script) from reply
        if isinstance(waited, BaseException):
            clear = unsupported_wait(waited, self.policy)
            if clear is None:
                clear = translate_error(waited, name=self.name, doing="waiting for replicas")
            raise clear from waited
        ack = parse_wait(waited, required, aof=self.policy.aof)
        self.last = ack
        if ack.short:
            self.shortfalls += 1
            # A failover or a lost replica changes the count: ask again next time.
            self._counted.pop(await self._node_name(keys[0]), None)
        return reply, ack

    async def run_checked(
        self,
        script: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        took: Callable[[Any], bool],
    ) -> Any:
        """Run ``script`` and return its reply; a short acknowledgement raises.

        Only when ``took(reply)`` says the call took or kept a hold: a call
        that took nothing needs no acknowledgement.
        """
        reply, ack = await self.run(script, keys, args)
        if ack.short and took(reply):
            raise ack.error(f"not acknowledged while {operation(script)}", name=self.name)
        return reply

    async def required(self, key: str) -> int:
        """Acknowledgements the policy needs for a write to ``key``'s primary."""
        if self.policy.min_replicas is not None:
            return self.policy.min_replicas
        node = await self._node_name(key)
        counted = self._counted.get(node)
        now = time.monotonic()
        if counted is None or now - counted[1] > REPLICA_COUNT_TTL:
            (reply,) = await self._send(key, [("ROLE",)], "counting the primary's replicas")
            if isinstance(reply, BaseException):
                raise translate_error(
                    reply, name=self.name, doing="counting the primary's replicas"
                ) from reply
            role, replicas = parse_role(reply)
            if role != "master":
                raise BackendError(
                    f"replica acknowledgement needs a client of the primary; this node is a {role}",
                    name=self.name,
                )
            counted = self._counted[node] = (replicas, now)
        return self.policy.required(counted[0])

    async def _node_name(self, key: str) -> str:
        if not is_cluster(self.client):
            return ""
        return str((await primary_node(self.client, key)).name)

    async def _send(self, key: str, commands: list[tuple[Any, ...]], doing: str) -> list[Any]:
        """``commands`` on one connection to the primary of ``key``; replies in order."""
        client = self.client
        with map_exceptions(name=self.name, doing=doing):
            if not is_cluster(client):
                async with client.pipeline(transaction=False) as pipe:
                    for command in commands:
                        pipe.execute_command(*command)
                    return list(await pipe.execute(raise_on_error=False))
            for attempt in (1, 2):
                node = await primary_node(client, key)
                try:
                    replies = await node_pipeline(node, commands)
                except _REROUTE:
                    if attempt == 2:
                        raise
                else:
                    moved = next((r for r in replies if isinstance(r, _REROUTE)), None)
                    if moved is None or attempt == 2:
                        return replies
                # The slot moved (a failover, a resharding): let the cluster
                # client learn the new primary, then send once more.
                self._counted.pop(str(node.name), None)
                await client.exists(key)
        raise AssertionError("unreachable")  # pragma: no cover
