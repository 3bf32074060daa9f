"""Shared test configuration; the server fixtures come from ``tenure.testing``.

Topologies beyond ``tenure.testing``'s: a primary with two replicas (so a
majority is two and one replica may fail), and a 3-master cluster with a
replica per master, both for the session. Tests that pause or kill their
processes start private ones instead.
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis

from tenure import Lock
from tenure.server import Cluster, Engine, FaultProxy, Replicated, ServerProcess
from tenure.testing import ServerFactory, _engine_name

__all__ = [
    "ServerFactory",
    "fresh_until",
    "reporting_lock",
    "server_ms",
    "upstream_bytes",
    "wait_for",
    "wait_server_past",
]


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``condition`` until true; return when it became true (monotonic)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():
                return time.monotonic()
        except Exception:  # a node or sentinel mid-failover may refuse to answer
            pass
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen within {seconds}s")


def server_ms(client: redis.Redis) -> int:
    """The server's clock (``TIME``) in milliseconds: the clock its leases run on."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_server_past(client: redis.Redis, expiry_ms: float, seconds: float, what: str) -> None:
    """Wait until the server's clock is past ``expiry_ms`` (a lease's expiry as the
    server stored it): that lease, unless renewed, has run out."""
    wait_for(lambda: server_ms(client) > expiry_ms, seconds, what)


def fresh_until(client: redis.Redis, cache: str) -> int:
    """When the one entry of cache ``cache`` goes stale (ms, server clock): the
    ``h<fresh until>:`` head of its stored value (``lua/lib/cache.lua``)."""
    pattern = f"*{cache}:{{*"
    keys = client.scan_iter(match=pattern, _type="string")
    values = [cast("bytes | None", client.get(key)) for key in keys]
    (entry,) = [value for value in values if value is not None and value.startswith(b"h")]
    return int(entry[1:].split(b":")[0])


def upstream_bytes(proxy: FaultProxy) -> int:
    """The bytes ``proxy`` has read from its clients (over its live connections)."""
    return sum(conn.upstream_bytes for conn in proxy.connections())


def reporting_lock(client: redis.Redis, name: str, lease: float) -> tuple[Lock, list[float]]:
    """A renewed Lock and the list its lost notices are timed into (monotonic)."""
    told: list[float] = []
    lock = Lock(
        client,
        name,
        timeout=lease,
        auto_renew=True,
        on_lost=lambda _lock: told.append(time.monotonic()),
    )
    return lock, told


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run each test marked ``engine_blind`` (tenure's tools: the CLI, the demos, the
    benchmarks, the documentation's examples) on one engine only: what they check is
    the tools' own plumbing, and the library under them is tested on both engines.

    That engine is Valkey; with ``TENURE_TOOLS_ENGINE=split`` (CI, which runs
    the Valkey and the redis-server passes one after the other) each such test runs in
    one of the two passes, chosen by its id, so both passes take about as long.
    """
    # The slow tests (many processes, much CPU) first: spread over the workers from
    # the start, they do not end the run alone on one worker after the rest.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    engine = _engine_name(config) or "valkey"
    split = os.environ.get("TENURE_TOOLS_ENGINE") == "split"
    if engine == "valkey" and not split:
        return
    for item in items:
        if item.get_closest_marker("engine_blind") is None:
            continue
        runs_on = tools_pass(item.nodeid) if split else "valkey"
        if runs_on != engine:
            where = f"in the {runs_on} pass" if split else "on Valkey"
            item.add_marker(
                pytest.mark.skip(reason=f"engine-blind (tenure's tools): checked once, {where}")
            )


def tools_pass(nodeid: str) -> str:
    """The pass (engine) that runs a tools test when they are split: by its id, stable."""
    return ("valkey", "redis")[zlib.crc32(nodeid.encode()) % 2]


@pytest.fixture(scope="session")
def replicated_pair(tenure_engine: Engine) -> Iterator[Replicated]:
    """A primary with two replicas (session)."""
    with Replicated(replicas=2, engine=tenure_engine) as topology:
        yield topology


@pytest.fixture(scope="session")
def replicated_cluster(tenure_engine: Engine) -> Iterator[Cluster]:
    """Three masters with one replica each (session)."""
    with Cluster(masters=3, replicas_per_master=1, engine=tenure_engine) as topology:
        yield topology


@pytest.fixture(scope="session")
def redlock_servers(tenure_engine: Engine) -> Iterator[tuple[ServerProcess, ...]]:
    """Three independent servers, a Redlock's masters (session)."""
    with contextlib.ExitStack() as stack:
        servers = tuple(
            stack.enter_context(ServerProcess(engine=tenure_engine, name=f"master{i}"))
            for i in range(3)
        )
        yield servers
