"""Fixtures of the contract tests (asyncio source; the sync twin is generated).

The primitives' contract tests run on two topologies: a standalone server
and a real 3-master cluster (limits' storage matrix is the model). A test
asks for ``tenure_async_client`` (and ``other_client`` / ``clients``) and
gets, per run, a plain client or a cluster client; the test id says which
(``[standalone]``, ``[cluster]``). A test runs on the topologies its
``topologies`` marker names (a module sets ``pytestmark =
pytest.mark.topologies("standalone", "cluster")``; without one, standalone
only); tests that ask for one server process themselves (:data:`ONE_SERVER`:
a proxy in front of it, a restart, an ACL user) and tests marked
``standalone_only`` run on the standalone server only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tenure.server import Cluster, ServerProcess
from tenure.testing import _flush_cluster  # the plugin's own flush of every master

TOPOLOGIES = ("standalone", "cluster")
"""Every topology a test may name in its ``topologies`` marker."""

ONE_SERVER = frozenset({"tenure_server", "tenure_server_factory", "tenure_proxy"})
"""Fixtures that tie a test to one standalone server process."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that uses a topology's client once per topology."""
    if "topology" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("topologies")
    topologies = list(marker.args) if marker is not None else ["standalone"]
    unknown = set(topologies) - set(TOPOLOGIES)
    if unknown or not topologies:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: topologies {topologies!r}")
    if (
        not ONE_SERVER.isdisjoint(metafunc.fixturenames)
        or metafunc.definition.get_closest_marker("standalone_only") is not None
    ):
        topologies = ["standalone"]
    metafunc.parametrize("topology", topologies, indirect=True)


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """``"standalone"`` or ``"cluster"``: where this run of the test's clients point."""
    return str(request.param)


async def _connect(request: pytest.FixtureRequest, topology: str, **kwargs: Any) -> Any:
    """A connected client (``kwargs`` to its constructor): a cluster client maps its slots
    before the test's clock starts."""
    client: Any
    if topology == "cluster":
        cluster: Cluster = request.getfixturevalue("tenure_cluster")
        client = cluster.async_client(**kwargs)
    else:
        server: ServerProcess = request.getfixturevalue("tenure_server")
        client = server.async_client(**kwargs)
    await client.ping()
    return client


@pytest.fixture
async def tenure_async_client(topology: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A client of this run's topology, every key and script flushed first."""
    if topology == "cluster":
        _flush_cluster(request.getfixturevalue("tenure_cluster"))
    client = await _connect(request, topology)
    if topology == "standalone":
        await client.flushall()
        await client.script_flush()
    yield client
    await client.aclose()


@pytest.fixture
async def other_client(topology: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A second client of the same topology, as a second process would have."""
    client = await _connect(request, topology)
    yield client
    await client.aclose()


@pytest.fixture
async def client_with(
    topology: str, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Any]]:
    """Make clients of the same topology with constructor options: ``await client_with(**kw)``."""
    made: list[Any] = []

    async def connect(**kwargs: Any) -> Any:
        made.append(await _connect(request, topology, **kwargs))
        return made[-1]

    yield connect
    for client in made:
        await client.aclose()


@pytest.fixture
async def clients(topology: str, request: pytest.FixtureRequest) -> AsyncIterator[list[Any]]:
    """Eight clients of the same topology, as eight processes would have."""
    made = [await _connect(request, topology) for _ in range(8)]
    yield made
    for client in made:
        await client.aclose()


@pytest.fixture
async def no_channels_client(tenure_server: ServerProcess) -> AsyncIterator[Any]:
    """A client of the standalone server whose ACL user may not PUBLISH or SUBSCRIBE."""
    admin = tenure_server.async_client()
    await admin.acl_setuser(
        "nochannels",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        commands=["+@all"],
        reset_channels=True,
    )
    client = tenure_server.async_client(username="nochannels", password="pw")
    yield client
    await client.aclose()
    await admin.acl_deluser("nochannels")
    await admin.aclose()
