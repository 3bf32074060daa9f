"""@tenure.cached on plain and async functions, and through a server outage."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure import ArgumentError, ClientTypeError, cached
from tenure.server import Engine, ServerProcess
from tests.conftest import fresh_until, wait_for, wait_server_past


def test_a_plain_function_is_called_once_per_arguments(tenure_client: redis.Redis) -> None:
    calls: list[tuple[int, int]] = []

    @cached(tenure_client, ttl=30)
    def price(item: int, qty: int = 1) -> dict[str, int]:
        calls.append((item, qty))
        return {"item": item, "total": item * qty}

    assert price(3) == {"item": 3, "total": 3}
    assert price(3, 1) == price(item=3) == price(3, qty=1) == {"item": 3, "total": 3}
    assert price(3, 2) == {"item": 3, "total": 6}
    assert calls == [(3, 1), (3, 2)]
    assert price.invalidate(3)  # type: ignore[attr-defined]
    assert price(3) == {"item": 3, "total": 3}
    assert calls == [(3, 1), (3, 2), (3, 1)]
    assert price.uncached(3) == {"item": 3, "total": 3}  # type: ignore[attr-defined]
    assert len(calls) == 4
    assert price.__name__ == "price"
    assert price.cache.name.endswith("price")  # type: ignore[attr-defined]


def test_threads_share_one_load(tenure_client: redis.Redis) -> None:
    calls = 0

    @cached(tenure_client, ttl=30)
    def slow(key: str) -> str:
        nonlocal calls
        calls += 1
        time.sleep(0.3)  # the load's work: the other threads come meanwhile
        return key.upper()

    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(slow("a"))) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["A"] * 20
    assert calls == 1


async def test_an_async_function(tenure_async_client: redis.asyncio.Redis) -> None:
    calls = 0

    @cached(tenure_async_client, ttl=30, name="reports")
    async def report(month: str) -> list[int]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.2)  # the load's work: the other tasks come meanwhile
        return [1, 2, 3]

    results = await asyncio.gather(*(report("2026-11") for _ in range(25)))
    assert results == [[1, 2, 3]] * 25
    assert calls == 1
    assert await report.invalidate("2026-11")  # type: ignore[attr-defined]
    assert await report("2026-11") == [1, 2, 3]
    assert calls == 2


def test_errors_are_never_cached(tenure_client: redis.Redis) -> None:
    attempts = 0

    @cached(tenure_client, ttl=30)
    def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionRefusedError("database restarting")
        return "ok"

    with pytest.raises(ConnectionRefusedError):
        flaky()
    assert flaky() == "ok"
    assert flaky() == "ok"
    assert attempts == 2


class NotFound(Exception):
    """A lookup that found nothing: worth caching for a while."""


def test_negative_caching_stores_chosen_errors_for_their_ttl(tenure_client: redis.Redis) -> None:
    calls = 0

    @cached(tenure_client, ttl=30, cache_errors=(NotFound,), error_ttl=0.3)
    def user(user_id: int) -> dict[str, int]:
        nonlocal calls
        calls += 1
        if user_id < 0:
            raise NotFound("no such user", user_id)
        if user_id == 0:
            raise ValueError("zero is not an id")
        return {"id": user_id}

    for _ in range(3):
        with pytest.raises(NotFound) as raised:
            user(-1)
        assert raised.value.args == ("no such user", -1)
    assert calls == 1  # the error was cached
    for _ in range(2):
        with pytest.raises(ValueError, match="zero"):
            user(0)
    assert calls == 3  # other errors are not
    stale_at = fresh_until(tenure_client, user.cache.name)  # type: ignore[attr-defined]
    wait_server_past(tenure_client, stale_at, 5, "the cached error's error_ttl")
    with pytest.raises(NotFound):
        user(-1)  # stale: served once more while one caller refreshes
    wait_for(lambda: calls == 4, 5, "the refresh")
    assert calls == 4
    with pytest.raises(ArgumentError, match="cache_errors"):
        cached(tenure_client, ttl=1, cache_errors=(int,))  # type: ignore[arg-type]


def test_refresh_recomputes_and_stores(tenure_client: redis.Redis) -> None:
    version = 0

    @cached(tenure_client, ttl=30)
    def config() -> int:
        nonlocal version
        version += 1
        return version

    assert config() == 1
    assert config() == 1
    assert config.refresh() == 2  # type: ignore[attr-defined]
    assert config() == 2


def test_cache_key_names_calls_of_methods(tenure_client: redis.Redis) -> None:
    class Repository:
        def __init__(self) -> None:
            self.calls = 0

        @cached(tenure_client, ttl=30, cache_key=lambda self, user_id: user_id)
        def user(self, user_id: int) -> dict[str, int]:
            self.calls += 1
            return {"id": user_id}

    first, second = Repository(), Repository()
    assert first.user(7) == second.user(7) == {"id": 7}
    assert first.calls + second.calls == 1

    @cached(tenure_client, ttl=30)
    def unnamed(handle: object) -> int:
        return 1

    with pytest.raises(ArgumentError, match="cache_key"):
        unnamed(object())


def test_the_client_kind_must_match_the_function(
    tenure_client: redis.Redis, tenure_async_client: redis.asyncio.Redis
) -> None:
    with pytest.raises(
        ClientTypeError, match="@cached on an async function .*; pass a redis.asyncio client"
    ):

        @cached(tenure_client, ttl=1)
        async def needs_async() -> int:
            return 1

    with pytest.raises(ClientTypeError, match="@cached on a function .*; pass a redis.Redis"):

        @cached(tenure_async_client, ttl=1)
        def needs_sync() -> int:
            return 1


def test_a_server_outage_computes_and_caching_resumes(
    tenure_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with ServerProcess(tenure_engine, name="tenure-cache-outage") as server:
        # One retry without backoff: the outage, not redis-py's retry policy, is under test.
        client = server.client(
            socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 1)
        )
        calls = 0

        @cached(client, ttl=30)
        def lookup(key: str) -> str:
            nonlocal calls
            calls += 1
            return f"value of {key}"

        assert lookup("a") == "value of a"
        assert lookup("a") == "value of a"
        assert calls == 1
        server.kill()
        with caplog.at_level(logging.WARNING, logger="tenure.cache"):
            assert [lookup("a") for _ in range(3)] == ["value of a"] * 3
        assert calls == 4
        assert sum("is out of reach" in r.message for r in caplog.records) == 1
        server.restart()
        answers: list[str] = []

        def recovered() -> bool:  # a probe finds the server in the background
            try:
                answers.append(lookup("a"))  # meanwhile the loader answers
            except Exception as exc:  # noted here: wait_for would only retry
                answers.append(repr(exc))
            return bool(lookup.cache.statistics().recoveries)  # type: ignore[attr-defined]

        wait_for(recovered, 10, "caching resumed")
        assert set(answers) == {"value of a"}
        before = calls
        assert lookup("a") == "value of a"
        assert calls == before  # cached again
        assert lookup.cache.statistics().fallbacks >= 3  # type: ignore[attr-defined]
        client.close()


def test_cached_checks_its_arguments(tenure_client: redis.Redis) -> None:
    with pytest.raises(ArgumentError, match="ttl"):
        cached(tenure_client, ttl=-5)(lambda: 1)
    decorate: Any = cached(tenure_client, ttl=5)
    with pytest.raises(ArgumentError, match="function"):
        decorate(42)


def test_equal_but_different_arguments_name_different_entries(tenure_client: redis.Redis) -> None:
    @cached(tenure_client, ttl=30)
    def kind(value: object) -> str:
        return type(value).__name__

    assert [kind(1), kind(True), kind(1.0), kind("1"), kind(1)] == [
        "int",
        "bool",
        "float",
        "str",
        "int",
    ]


def test_cached_on_a_cluster(tenure_cluster_client: redis.cluster.RedisCluster) -> None:
    calls = 0

    @cached(tenure_cluster_client, ttl=30, name="on-cluster")
    def square(n: int) -> int:
        nonlocal calls
        calls += 1
        return n * n

    assert [square(n) for n in range(40)] == [n * n for n in range(40)]
    assert [square(n) for n in range(40)] == [n * n for n in range(40)]
    assert calls == 40  # entries spread over the masters, each loaded once
    assert square.invalidate(3)  # type: ignore[attr-defined]
    assert square.cache.clear() == 39  # type: ignore[attr-defined]
