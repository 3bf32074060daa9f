"""asyncio: a call that must reach the server runs to its reply in the caller's own task.

``tenure._backends.for_asyncio.shielded`` drives the call in the awaiting
task and spares it that task's first cancellation (raised once the call
ends); a second cancellation, or :data:`SPARED_FOR` seconds, cancel the
call; a timeout of the client's own inside the call is the client's, never
a cancellation of the caller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tenure import AsyncLock, ServerUnavailableError
from tenure._backends import for_asyncio
from tenure._backends.for_asyncio import shielded
from tenure.server import FaultProxy
from tests._backend_asyncio import until
from tests.conftest import upstream_bytes


async def _shielded(call: Awaitable[Any]) -> Any:
    """``shielded`` of a client's call, as a coroutine (what a task runs)."""

    async def called() -> Any:
        return await call

    return await shielded(called())


async def _silent(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> redis.asyncio.Redis:
    """A client connected through ``proxy``, which then lets no reply through (0.3 s spared)."""
    monkeypatch.setattr(for_asyncio, "SPARED_FOR", 0.3)
    client = proxy.async_client()
    await client.ping()
    proxy.blackhole("downstream")
    return client


async def _sent(proxy: FaultProxy, before: int) -> None:
    async def sent() -> bool:
        return upstream_bytes(proxy) > before

    await until(sent, 5, "the call sent to the server")


async def test_the_reply_comes_back_through_the_callers_own_task(
    tenure_async_client: redis.asyncio.Redis,
) -> None:
    async def call() -> object:
        inner = asyncio.current_task()
        await asyncio.sleep(0)  # a bare loop turn, passed through
        await asyncio.sleep(0.01)  # a timer's future
        return inner

    assert await shielded(call()) is asyncio.current_task()
    with pytest.raises(ZeroDivisionError):  # a future's error goes into the call
        await shielded(_fails())


async def _fails() -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, future.set_exception, ZeroDivisionError())
    await future


async def test_a_cancelled_caller_gets_the_cancellation_after_the_reply(
    tenure_proxy: FaultProxy, tenure_async_client: redis.asyncio.Redis
) -> None:
    client = tenure_proxy.async_client()
    await client.ping()
    tenure_proxy.set_latency(0.3, direction="downstream")
    before = upstream_bytes(tenure_proxy)
    task = asyncio.create_task(_shielded(client.set("spared", "1")))
    await _sent(tenure_proxy, before)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started >= 0.1  # it waited for the delayed reply
    assert await tenure_async_client.get("spared") == b"1"
    tenure_proxy.clear()
    assert await client.ping()  # the connection was not dropped mid-reply
    await client.aclose()


async def test_a_second_cancellation_cancels_the_call(tenure_proxy: FaultProxy) -> None:
    client = tenure_proxy.async_client()
    await client.ping()
    tenure_proxy.set_latency(5, direction="downstream")
    before = upstream_bytes(tenure_proxy)
    task = asyncio.create_task(_shielded(client.get("anything")))
    await _sent(tenure_proxy, before)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # the first is spared
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 1
    tenure_proxy.clear()
    await client.aclose()


async def test_a_call_the_server_never_answers_is_cancelled_after_the_spared_time(
    tenure_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await _silent(tenure_proxy, monkeypatch)
    before = upstream_bytes(tenure_proxy)
    task = asyncio.create_task(_shielded(client.get("anything")))
    await _sent(tenure_proxy, before)
    task.cancel()  # once, as an event loop ending does
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 3)
    assert 0.2 <= time.monotonic() - started < 2
    tenure_proxy.clear()
    await client.aclose()


async def test_the_clients_own_timeout_inside_the_call_is_never_the_callers_cancellation(
    tenure_proxy: FaultProxy,
    tenure_async_client: redis.asyncio.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # socket_timeout expires inside a release whose reply is only late: the
    # release is done, and nobody cancelled the caller, so nothing says so.
    monkeypatch.setattr(for_asyncio, "SPARED_FOR", 0.5)
    client = tenure_proxy.async_client(socket_timeout=0.1, retry=Retry(NoBackoff(), 0))
    lock = AsyncLock(client, "own-timeout", timeout=30)
    assert await lock.acquire()
    await lock.release()
    assert await lock.acquire()  # (every script it calls is loaded: one reply each)
    tenure_proxy.set_latency(0.3, direction="downstream")
    await lock.release()
    assert not _cancelling()
    assert not await tenure_async_client.hexists("tenure:lock:{own-timeout}", "token")
    # No reply within the spared time: the client's timeout error, no cancellation
    # (and none spared twice in one call: its retries would time out as configured).
    tenure_proxy.set_latency(3, direction="downstream")
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError):
        await shielded(lock.locked())
    assert time.monotonic() - started < 1.5
    assert not _cancelling()
    tenure_proxy.clear()
    await client.aclose()


def _cancelling() -> int:
    task = asyncio.current_task()
    assert task is not None
    return int(task.cancelling())  # type: ignore[attr-defined]  # (3.11+; mypy reads 3.10)


def test_an_event_loop_ends_while_a_call_waits_for_a_server_that_never_answers(
    tenure_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(for_asyncio, "SPARED_FOR", 0.3)

    async def main() -> None:
        client = tenure_proxy.async_client()
        await client.ping()
        tenure_proxy.blackhole("downstream")
        left = asyncio.create_task(_shielded(client.get("anything")))  # left running
        assert not left.done()
        await asyncio.sleep(0.1)

    started = time.monotonic()
    asyncio.run(main())  # cancels the task once at its end: it ends within the spared time
    assert time.monotonic() - started < 2
    tenure_proxy.clear()


def test_an_event_loop_ends_while_an_acquire_waits_for_a_server_that_never_answers(
    tenure_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The acquire's call is spared, then cancelled; the give-back that follows
    # starts while the task is being cancelled, so it is bounded the same way
    # (a client with no socket_timeout would otherwise wait for ever).
    monkeypatch.setattr(for_asyncio, "SPARED_FOR", 0.3)

    async def main() -> None:
        client = tenure_proxy.async_client()
        lock = AsyncLock(client, "loop-ends", timeout=30)
        assert await lock.acquire()
        await lock.release()  # (its scripts are loaded)
        tenure_proxy.blackhole("downstream")
        left = asyncio.create_task(lock.acquire())  # left running
        await asyncio.sleep(0.1)
        assert not left.done()

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 3
    tenure_proxy.clear()


async def test_a_call_made_while_its_task_is_cancelled_is_bounded(
    tenure_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await _silent(tenure_proxy, monkeypatch)

    async def clean_up_after_a_cancel() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await _shielded(client.ping())  # the server never answers
            raise

    task = asyncio.create_task(clean_up_after_a_cancel())
    await asyncio.sleep(0.05)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 3)
    assert time.monotonic() - started < 2
    tenure_proxy.clear()
    await client.aclose()
