"""The script registry on real servers: EVALSHA, NOSCRIPT reload, errors."""

from __future__ import annotations

import pytest
import redis.asyncio
import redis.asyncio.cluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot

from tenure import ArgumentError, ServerUnavailableError
from tenure._async._scripting import registry_for
from tenure.server import Cluster, ServerProcess
from tests.conftest import ServerFactory

pytestmark = pytest.mark.topologies("standalone", "cluster")


async def _set_and_release(client: redis.asyncio.Redis, key: str, token: str) -> int:
    await client.set(key, token)
    return int(await registry_for(client).run("compare_and_delete", (key,), (token,)))


async def test_runs_script_and_is_one_registry_per_client(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    assert registry_for(tenure_async_client) is registry_for(tenure_async_client)
    assert await _set_and_release(tenure_async_client, "k", "t1") == 1
    await tenure_async_client.set("k", "someone-else")
    assert await registry_for(tenure_async_client).run("compare_and_delete", ("k",), ("t1",)) == 0
    assert await tenure_async_client.get("k") == b"someone-else"


async def test_script_flush_and_restart_are_invisible(
    tenure_server_factory: ServerFactory,
) -> None:
    server: ServerProcess = tenure_server_factory()
    client = server.async_client()
    admin = server.async_client()
    try:
        registry = registry_for(client)
        results = []
        for i in range(300):
            if i == 100:
                await admin.script_flush()
            if i == 200:
                await admin.aclose()
                server.restart()
                admin = server.async_client()
            results.append(await _set_and_release(client, f"key:{i % 7}", f"token-{i}"))
        assert results == [1] * 300
        stats = registry.statistics()
        assert stats.calls == 300
        # First use, after the flush, after the restart: three reloads, no more.
        assert stats.reloads == 3
    finally:
        await client.aclose()
        await admin.aclose()


async def test_cluster_reloads_per_node(
    tenure_async_cluster_client: redis.asyncio.cluster.RedisCluster, tenure_cluster: Cluster
) -> None:
    client = tenure_async_cluster_client
    registry = registry_for(client)
    keys = [f"spread:{i}" for i in range(30)]
    slots = {key_slot(key.encode()) for key in keys}
    assert len(slots) > 3
    for round_number in range(3):
        for key in keys:
            await client.set(key, f"r{round_number}")
            reply = await registry.run("compare_and_delete", (key,), (f"r{round_number}",))
            assert reply == 1
            assert await client.exists(key) == 0
        for node in tenure_cluster.masters:
            with node.client() as direct:
                direct.script_flush()
    # Each master lost the script once per flush: at most 3 nodes x 3 rounds.
    assert 3 <= registry.statistics().reloads <= 9


async def test_call_must_match_script_header(tenure_async_client: redis.asyncio.Redis) -> None:
    registry = registry_for(tenure_async_client)
    with pytest.raises(ArgumentError, match="takes 1 keys, got 2"):
        await registry.run("compare_and_delete", ("a", "b"), ("t",))
    with pytest.raises(ArgumentError, match="takes 1 arguments, got 0"):
        await registry.run("compare_and_delete", ("a",), ())
    with pytest.raises(ArgumentError, match="no script named"):
        await registry.run("no_such_script", ("a",), ())


async def test_unreachable_server_is_translated(tenure_server_factory: ServerFactory) -> None:
    server = tenure_server_factory()
    client = server.async_client(socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        server.stop()
        with pytest.raises(ServerUnavailableError, match="while compacting the id set") as caught:
            await registry_for(client).run("compare_and_delete", ("k",), ("t",))
        assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)
        assert caught.value.script == "compare_and_delete"  # not in the text: the user's words
        assert "compare_and_delete" not in str(caught.value)
    finally:
        await client.aclose()
