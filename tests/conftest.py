"""Shared test configuration; the server fixtures come from ``tenure.testing``.

Topologies beyond ``tenure.testing``'s: a primary with two replicas (so a
majority is two and one replica may fail), and a 3-master cluster with a
replica per master, both for the session. Tests that pause or kill their
processes start private ones instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tenure.server import Cluster, Engine, Replicated
from tenure.testing import ServerFactory

__all__ = ["ServerFactory"]


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
