"""tenure.server.FaultProxy against a real server: latency, blackholes, resets, refusals."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure._core.exceptions import ArgumentError, EmbeddedServerError
from tenure.server import FaultProxy, ProxyFaults, ServerProcess
from tenure.testing import ProxyFactory, ServerFactory
from tests._backend_asyncio import until
from tests.conftest import upstream_bytes, wait_for

pytestmark = pytest.mark.timeout(10)

DELAY = 0.2


def no_retry(proxy: FaultProxy, **kwargs: Any) -> redis.Redis:
    """A client that surfaces every error at once (redis-py retries by default)."""
    return proxy.client(retry=Retry(NoBackoff(), 0), **kwargs)


def proxy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tenure-proxy")]


def is_running(proxy: FaultProxy) -> bool:
    """Read afresh (a plain property access would stay narrowed by an earlier assert)."""
    return proxy.running


def client_addresses(direct: redis.Redis) -> set[str]:
    return {str(entry["addr"]) for entry in direct.client_list()}


def blocked_through(proxy: FaultProxy, direct: redis.Redis) -> bool:
    """Whether a connection through ``proxy`` is blocked in BLPOP on the server."""
    ours = {
        f"{conn.outbound_address[0]}:{conn.outbound_address[1]}"
        for conn in proxy.connections()
        if conn.outbound_address is not None
    }
    return any(c["cmd"] == "blpop" and str(c["addr"]) in ours for c in direct.client_list())


def timed(call: Any) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


@pytest.fixture
def client(tenure_proxy: FaultProxy) -> Iterator[redis.Redis]:
    """A client through the proxy, connected before any fault, with a short timeout."""
    client = no_retry(tenure_proxy, socket_timeout=0.3, single_connection_client=True)
    assert client.ping()
    try:
        yield client
    finally:
        client.close()


# --------------------------------------------------------------------------- forwarding


def test_commands_pass_through(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis, client: redis.Redis
) -> None:
    big = b"x" * 3_000_000  # many chunks each way
    client.set("big", big)
    assert tenure_client.get("big") == big
    assert client.get("big") == big
    [conn] = tenure_proxy.connections()
    assert conn.upstream_bytes > len(big) and conn.downstream_bytes > len(big)
    outbound = conn.outbound_address
    assert outbound is not None
    assert f"{outbound[0]}:{outbound[1]}" in client_addresses(tenure_client)
    assert tenure_proxy.url == f"redis://127.0.0.1:{tenure_proxy.port}"
    assert tenure_proxy.address == ("127.0.0.1", tenure_proxy.port)
    assert not tenure_proxy.faults.active


def test_client_close_ends_the_connection(tenure_proxy: FaultProxy) -> None:
    with tenure_proxy.client() as client:
        client.ping()
        assert len(tenure_proxy.connections()) == 1
    tenure_proxy.wait_connections(0, timeout=1.0)


# --------------------------------------------------------------------------- latency


@pytest.mark.parametrize(
    ("direction", "low", "high"),
    [
        ("downstream", DELAY, 2 * DELAY),
        ("upstream", DELAY, 2 * DELAY),
        ("both", 2 * DELAY, 3 * DELAY),
    ],
)
def test_latency(tenure_proxy: FaultProxy, direction: Any, low: float, high: float) -> None:
    with no_retry(tenure_proxy, socket_timeout=2, single_connection_client=True) as client:
        assert client.ping()  # connected before the fault
        tenure_proxy.set_latency(DELAY, direction)
        assert low <= timed(client.ping) < high
        tenure_proxy.set_latency(0, direction)
        assert timed(client.ping) < DELAY / 2


def test_latency_keeps_the_order_of_bytes(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis
) -> None:
    with socket.create_connection(tenure_proxy.address, timeout=2) as raw:
        start = time.monotonic()
        tenure_proxy.set_latency(DELAY, "upstream")
        first = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nfirst\r\n"
        before = upstream_bytes(tenure_proxy)
        raw.sendall(first)
        wait_for(  # read under the latency
            lambda: upstream_bytes(tenure_proxy) >= before + len(first), 5, "the first SET read"
        )
        tenure_proxy.set_latency(0)  # the second command may not overtake the first
        raw.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$6\r\nsecond\r\n")
        replies = b""
        while len(replies) < 10:
            replies += raw.recv(100)
        assert replies == b"+OK\r\n+OK\r\n"
        assert time.monotonic() - start >= DELAY
    assert tenure_client.get("k") == b"second"


# --------------------------------------------------------------------------- blackhole


def test_blackhole_times_out_and_clear_restores(
    tenure_proxy: FaultProxy, client: redis.Redis
) -> None:
    # The client's connection: only those open before the fault count (a second
    # connection, not the client's, was once listed in CI after the ping).
    before = {conn.id for conn in tenure_proxy.connections()}
    assert before
    tenure_proxy.blackhole()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    # redis-py closed its connection, but the FIN is held by the partition too.
    held = before & {conn.id for conn in tenure_proxy.connections()}
    assert held
    fresh = no_retry(tenure_proxy, socket_timeout=0.2, socket_connect_timeout=0.2)
    with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        fresh.ping()  # a new connection is accepted, and then hears nothing
    assert held <= {conn.id for conn in tenure_proxy.connections()}  # 0.2 s on: still held
    tenure_proxy.clear()
    assert fresh.ping()
    assert client.ping()  # reconnects
    fresh.close()


def test_upstream_blackhole_loses_commands(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis, client: redis.Redis
) -> None:
    tenure_proxy.blackhole("upstream")
    assert tenure_proxy.faults == ProxyFaults(upstream_blackhole=True)
    with pytest.raises(redis.TimeoutError):
        client.set("k", "v")
    assert tenure_client.get("k") is None


def test_downstream_blackhole_loses_replies(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis, client: redis.Redis
) -> None:
    tenure_proxy.blackhole("downstream")
    with pytest.raises(redis.TimeoutError):
        client.set("k", "v")  # the outcome is unknown to the client...
    assert tenure_client.get("k") == b"v"  # ...but the command ran
    tenure_proxy.blackhole("downstream", enabled=False)
    assert client.get("k") == b"v"


# --------------------------------------------------------------------------- reset


def test_reset_breaks_the_next_command_then_redis_py_reconnects(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis, client: redis.Redis
) -> None:
    [conn] = tenure_proxy.connections()
    assert conn.outbound_address is not None
    outbound = f"{conn.outbound_address[0]}:{conn.outbound_address[1]}"
    assert tenure_proxy.reset_connections() == 1
    assert tenure_proxy.connections() == []
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert client.ping()
    wait_for(  # the server got a RST too
        lambda: outbound not in client_addresses(tenure_client), 5, "the server's side closed"
    )


def test_reset_fails_a_command_in_flight(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis
) -> None:
    pooled = no_retry(tenure_proxy)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(pooled.blpop, ["nothing"], 5)
        # This client's BLPOP, by its address through the proxy (a blocked
        # call of an earlier test, not yet ended on the server, is not it).
        wait_for(lambda: blocked_through(tenure_proxy, tenure_client), 4, "the BLPOP blocked")
        tenure_proxy.reset_connections()
        with pytest.raises(redis.ConnectionError):
            waiting.result(timeout=4)  # before BLPOP would end by itself (5 s)
    assert pooled.ping()
    pooled.close()


# --------------------------------------------------------------------------- lost replies


def test_lost_reply_is_resent_by_redis_py_default_retry(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis
) -> None:
    """The problem issue 24 names: a resent INCR counts twice."""
    resending = tenure_proxy.client(socket_timeout=2)  # redis-py's default retry
    try:
        assert resending.ping()
        tenure_proxy.lose_reply(b"lost-counter")
        assert tenure_proxy.replies_to_lose == 1
        assert resending.incr("lost-counter") == 2  # ran, reply lost, resent: ran again
        assert tenure_proxy.lost_replies == 1
        assert tenure_proxy.replies_to_lose == 0  # disarmed after one
        assert resending.incr("lost-counter") == 3
        assert tenure_proxy.lost_replies == 1
        assert tenure_client.get("lost-counter") == b"3"
    finally:
        resending.close()


def test_lost_reply_surfaces_without_retry_after_the_command_ran(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis, client: redis.Redis
) -> None:
    tenure_proxy.lose_reply(b"other-key")
    assert client.set("unmatched", "v")  # no match: untouched
    assert tenure_proxy.lost_replies == 0
    tenure_proxy.lose_reply(b"k-lost", count=2)
    for _ in range(2):
        with pytest.raises(redis.ConnectionError):
            client.incr("k-lost")
    assert tenure_proxy.lost_replies == 2
    assert tenure_client.get("k-lost") == b"2"  # both ran
    assert client.incr("k-lost") == 3
    tenure_proxy.lose_reply(b"k-lost")
    tenure_proxy.clear()  # disarms it
    assert tenure_proxy.replies_to_lose == 0
    assert client.incr("k-lost") == 4


def test_lost_reply_matches_across_chunks(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis
) -> None:
    raw = socket.create_connection(tenure_proxy.address, timeout=2)
    try:
        tenure_proxy.lose_reply(b"split-key")
        head = b"*2\r\n$4\r\nINCR\r\n$9\r\nspli"
        before = upstream_bytes(tenure_proxy)
        raw.sendall(head)
        wait_for(  # read by the proxy as a chunk of its own
            lambda: upstream_bytes(tenure_proxy) >= before + len(head), 5, "the first part read"
        )
        raw.sendall(b"t-key\r\n")
        with pytest.raises(ConnectionResetError):
            while raw.recv(100):
                pass
    finally:
        raw.close()
    assert tenure_proxy.lost_replies == 1
    assert tenure_client.get("split-key") == b"1"


# --------------------------------------------------------------------------- refusal


def test_refuse_keeps_the_port_and_spares_open_connections(
    tenure_proxy: FaultProxy, client: redis.Redis
) -> None:
    tenure_proxy.refuse_connections()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(tenure_proxy.address, timeout=1).close()
    stranger = socket.socket()
    with pytest.raises(OSError, match="in use"):
        stranger.bind(tenure_proxy.address)
    stranger.close()
    assert client.ping()  # already open
    tenure_proxy.refuse_connections(None)
    with no_retry(tenure_proxy) as fresh:
        assert fresh.ping()


@pytest.mark.parametrize("mode", ["refuse", "reset", "close"])
def test_refused_clients_get_a_connection_error(tenure_proxy: FaultProxy, mode: Any) -> None:
    tenure_proxy.refuse_connections(mode)
    assert tenure_proxy.faults.refusing == mode
    with no_retry(tenure_proxy, socket_timeout=1) as fresh:
        with pytest.raises(redis.ConnectionError):
            fresh.ping()
        tenure_proxy.clear()
        assert fresh.ping()
    tenure_proxy.wait_connections(0, timeout=1.0)


# --------------------------------------------------------------------------- lifecycle


def test_stop_frees_the_port_and_the_thread(tenure_server: ServerProcess) -> None:
    before = set(threading.enumerate())
    proxy = FaultProxy(*tenure_server.address, name="lifecycle").start()
    assert proxy.running and len(proxy_threads()) == 1
    port = proxy.port
    client = no_retry(proxy, single_connection_client=True)
    assert client.ping()
    proxy.stop()
    proxy.stop()  # idempotent
    assert not is_running(proxy)
    assert set(threading.enumerate()) <= before
    assert proxy_threads() == []
    with pytest.raises(redis.ConnectionError):
        client.ping()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with socket.socket() as free:
        free.bind(("127.0.0.1", port))
    with pytest.raises(EmbeddedServerError):
        proxy.port  # noqa: B018
    with proxy:  # starts again, on a new port
        assert client.connection is not None
        client.connection.port = proxy.port
        assert client.ping()
    client.close()
    assert proxy_threads() == []


def test_no_tracebacks_when_peers_misbehave(
    tenure_proxy: FaultProxy, capfd: pytest.CaptureFixture[str]
) -> None:
    for _ in range(5):
        raw = socket.create_connection(tenure_proxy.address)
        raw.sendall(b"*1\r\n$4\r\nPING\r\n")
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        raw.close()  # RST from the client
    with tenure_proxy.client() as client:
        client.ping()
        tenure_proxy.reset_connections()
    tenure_proxy.wait_connections(0, timeout=1.0)
    out, err = capfd.readouterr()
    assert err == "" and out == ""


def test_target_down_resets_the_client(tenure_proxy_factory: ProxyFactory) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = probe.getsockname()
        proxy = tenure_proxy_factory(nobody)  # bound, not listening: refused
        with no_retry(proxy) as client, pytest.raises(redis.ConnectionError):
            client.ping()
    proxy.wait_connections(0, timeout=1.0)


def test_factory_targets(tenure_proxy_factory: ProxyFactory, tenure_server: ServerProcess) -> None:
    proxies = [
        tenure_proxy_factory(),
        tenure_proxy_factory(tenure_server),
        tenure_proxy_factory(tenure_server.address, name="by-address"),
    ]
    assert len({proxy.port for proxy in proxies}) == 3
    for proxy in proxies:
        assert proxy.target == tenure_server.address
        with proxy.client() as client:
            assert client.ping()
    assert "by-address" in repr(proxies[2])


def test_retarget_moves_the_endpoint(
    tenure_proxy_factory: ProxyFactory,
    tenure_server: ServerProcess,
    tenure_server_factory: ServerFactory,
) -> None:
    other = tenure_server_factory()
    with other.client() as direct:
        direct.set("where", "other")
    proxy = tenure_proxy_factory(tenure_server)
    with proxy.client() as client:
        client.set("where", "first")
        proxy.retarget(*other.address)
        assert proxy.target == other.address
        assert client.get("where") == b"other"  # reset, reconnected to the new target
    with pytest.raises(ArgumentError, match="^port"):
        proxy.retarget("127.0.0.1", 0)


def test_faults_are_kept_across_restarts(tenure_server: ServerProcess) -> None:
    proxy = FaultProxy(*tenure_server.address)
    proxy.set_latency(0.05, "downstream")
    proxy.refuse_connections("reset")
    assert "down:+0.05s" in repr(proxy) and "new:reset" in repr(proxy)
    with proxy, no_retry(proxy) as client:
        with pytest.raises(redis.ConnectionError):
            client.ping()
        proxy.refuse_connections(None)
        assert timed(client.ping) >= 0.05


def test_arguments_are_checked(tenure_server: ServerProcess) -> None:
    with pytest.raises(ArgumentError, match="host"):
        FaultProxy(*tenure_server.address, host="0.0.0.0")
    with pytest.raises(ArgumentError, match="target_port"):
        FaultProxy("127.0.0.1", 0)
    proxy = FaultProxy(*tenure_server.address)
    with pytest.raises(ArgumentError, match="direction"):
        proxy.set_latency(0.1, "sideways")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="seconds"):
        proxy.set_latency(-1)
    with pytest.raises(ArgumentError, match="seconds"):
        proxy.set_latency(float("nan"))
    with pytest.raises(ArgumentError, match="mode"):
        proxy.refuse_connections("drop")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="match"):
        proxy.lose_reply(b"")
    with pytest.raises(ArgumentError, match="count"):
        proxy.lose_reply(b"x", count=-1)
    assert proxy.reset_connections() == 0  # not running: nothing to reset
    assert not proxy.faults.active


# --------------------------------------------------------------------------- asyncio


async def test_asyncio_client_under_faults(tenure_server: ServerProcess) -> None:
    async with FaultProxy(*tenure_server.address) as proxy:
        client = proxy.async_client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
        try:
            assert await client.ping()
            proxy.set_latency(DELAY, "downstream")
            start = time.monotonic()
            assert await client.ping()
            assert DELAY <= time.monotonic() - start < 2 * DELAY
            proxy.clear()
            proxy.blackhole()
            with pytest.raises(redis.TimeoutError):
                await client.ping()
            proxy.clear()
            assert await client.ping()
            assert proxy.reset_connections() == 1
            with pytest.raises(redis.ConnectionError):
                await client.ping()
            assert await client.ping()  # reconnected

            async def wait_for_nothing() -> Any:
                return await client.blpop(["nothing"], 5)

            other = asyncio.create_task(wait_for_nothing())
            with tenure_server.client() as direct:

                async def blocked() -> bool:
                    return blocked_through(proxy, direct)

                await until(blocked, 5, "the BLPOP blocked")
            proxy.reset_connections()
            with pytest.raises(redis.ConnectionError):
                await other
        finally:
            await client.aclose()
    assert proxy_threads() == []
