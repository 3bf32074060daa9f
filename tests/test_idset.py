"""What only the sync IdSet has: ``len()`` and ``in`` (one round trip each)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tenure import ArgumentError, IdSet


def test_len_and_in_ask_the_server(tenure_client: redis.Redis) -> None:
    ids = IdSet(tenure_client, "plain")
    other = IdSet(redis.Redis(**_kwargs(tenure_client)), "plain")
    assert len(ids) == 0 and 3 not in ids
    other.add_many([3, 4])
    assert len(ids) == 2 and 3 in ids and 5 not in ids
    with pytest.raises(ArgumentError, match="id: must be an int in 0..4294967295, got str"):
        "3" in ids  # noqa: B015 - the refusal is the point
    other.client.close()


def _kwargs(client: redis.Redis) -> dict[str, Any]:
    kwargs = client.connection_pool.connection_kwargs
    return {"host": kwargs["host"], "port": kwargs["port"]}
