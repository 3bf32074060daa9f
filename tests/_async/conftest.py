"""Fixtures of the contract tests (asyncio source; the sync twin is generated)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from tenure.server import ServerProcess


@pytest.fixture
async def other_client(tenure_server: ServerProcess) -> AsyncIterator[redis.asyncio.Redis]:
    """A second client to the same server, as a second process would have."""
    client = tenure_server.async_client()
    yield client
    await client.aclose()


@pytest.fixture
async def clients(tenure_server: ServerProcess) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """Eight clients to the same server, as eight processes would have."""
    made = [tenure_server.async_client() for _ in range(8)]
    yield made
    for client in made:
        await client.aclose()
