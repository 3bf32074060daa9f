"""Id sets under hostile input: the right answer or one clear typed error, at once.

What each case gets is documented in docs/idsets.md. New findings land here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis.asyncio

from tenure import ArgumentError, AsyncIdSet, ClientTypeError
from tenure.server import ServerProcess


async def test_a_decoding_client_is_refused_at_construction(tenure_server: ServerProcess) -> None:
    """Its reads would fail on the binary bitmaps (IdSetCorruptError on fine data)."""
    decoding = redis.asyncio.Redis.from_url(tenure_server.url, decode_responses=True)
    try:
        with pytest.raises(ClientTypeError, match="decode_responses=False"):
            AsyncIdSet(decoding, "ids")
    finally:
        await decoding.aclose()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "-1 is outside 0..4294967295"),
        (2**32, "4294967296 is outside 0..4294967295"),
        (1.5, "must be an int in 0..4294967295, got float"),
        ("7", "got str"),
        (True, "got bool"),
    ],
)
async def test_a_bad_id_is_refused_and_nothing_written(
    tenure_async_client: redis.asyncio.Redis, value: Any, message: str
) -> None:
    ids = AsyncIdSet(tenure_async_client, "hostile")
    with pytest.raises(ArgumentError, match=message):
        await ids.add(value)
    assert await tenure_async_client.dbsize() == 0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (np.array([1.5]), "must hold integers, got an array of float64"),
        (np.array([3, -1]), r"-1 \(at position 1\) is outside"),
        ([1, "x"], r"'x' \(at position 1\) is not an int"),
        ([True], r"True \(at position 0\) is not an int"),
        (np.array([2**40]), r"1099511627776 \(at position 0\) is outside"),
    ],
)
async def test_a_bad_batch_is_refused_whole(
    tenure_async_client: redis.asyncio.Redis, values: Any, message: str
) -> None:
    ids = AsyncIdSet(tenure_async_client, "hostile")
    with pytest.raises(ArgumentError, match=message):
        await ids.add_many(values)
    assert await tenure_async_client.dbsize() == 0  # not half of it


@pytest.mark.parametrize("name", ["", "a{b", "}"])
async def test_names_follow_the_lock_rules(
    tenure_async_client: redis.asyncio.Redis, name: str
) -> None:
    with pytest.raises(ArgumentError, match="name: must"):
        AsyncIdSet(tenure_async_client, name)
