"""Error texts: what the user called, said once, on one line (issue 39, item 6).

Here, what needs no server or only a live one: every public constructor given
bad arguments or a client it cannot use, ``@cached``'s own mistakes, and the
table of the scripts' operation words. The paths through a server (down,
exhausted pool, not owned, WRONGTYPE, a failing script, an ACL) are contract
tests: ``tests/_async/test_error_texts.py`` and its sync twin.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import tenure
from tenure import (
    ArgumentError,
    Cache,
    CallableSource,
    ClientTypeError,
    ClusterLock,
    ConnectionLock,
    FencedKey,
    HerdCache,
    IdSet,
    IngestJob,
    Lock,
    PickleSerializer,
    ReadWriteLock,
    Redlock,
    ReentrantLock,
    Semaphore,
    StreamConsumer,
    TenureError,
    cached,
)
from tenure._core.scripts import OPERATIONS, operation
from tenure.server import ServerProcess
from tests.error_texts import SCRIPT_NAMES, assert_clear, repeated_fragment


def _rows(first: int, last: int) -> Any:
    return iter(())


def _source() -> CallableSource:
    return CallableSource(_rows, low=1, high=10, name="rows")


# -- the table and the checker -------------------------------------------------------


def test_every_script_has_words_for_its_operation_and_none_names_a_script() -> None:
    assert set(OPERATIONS) == SCRIPT_NAMES
    for script, words in OPERATIONS.items():
        assert operation(script) == words
        assert re.fullmatch(r"[a-z][a-z' ]+[a-z]", words), (script, words)
        assert not any(name in words for name in SCRIPT_NAMES), (script, words)
    assert operation("not_a_script") == "calling the server"


@pytest.mark.parametrize(
    "message",
    [  # the texts issue 39 quotes (and the like), each said twice somewhere
        "client: @cached function __main__.f needs a redis.Redis or RedisCluster: client: "
        "HerdCache stores bytes (compressed values among them): use a client with "
        "decode_responses=False, redis-py's default (name '__main__.f') (name '__main__.f')",
        "client: @cached function f needs a redis.asyncio client: client: AsyncHerdCache "
        "cannot use a redis.client.Redis",
        "cannot release: not held (name 'orders') (name 'orders')",
        "lock 'orders' cannot be released (name 'orders')",
        "server unavailable while acquiring: server unavailable while acquiring: refused",
        "cache_key: cannot name a call of make.<locals>.scaled by its arguments "
        "(name 'app.prices.make.<locals>.scaled')",
    ],
)
def test_the_checker_finds_context_said_twice(message: str) -> None:
    assert repeated_fragment(message) is not None


@pytest.mark.parametrize(
    "message",
    [  # identifiers and stems said twice are no repeat
        "the client's connection pool is exhausted while acquiring: all its connections are "
        "in use (max_connections=1; the server is fine): give the client a "
        "redis.BlockingConnectionPool, which waits for a free connection, or raise "
        "max_connections (name 'p1')",
        "a key holds another type while acquiring: WRONGTYPE Operation against a key holding "
        "the wrong kind of value script: 4a3c2b61c7, on @user_script:283. (name 'wt')",
        "clients[1]: 127.0.0.1:23981 is also clients[0]: each master must be a different "
        "server, or one failure counts twice (name 'x')",
        "row 37, column 'price' holds nan: JSON (RFC 8259) has no NaN or infinity (name 'prices')",
    ],
)
def test_the_checker_lets_innocent_texts_pass(message: str) -> None:
    assert repeated_fragment(message) is None


def test_a_message_that_names_its_primitive_is_not_suffixed_again() -> None:
    named = tenure.LockNotOwnedError("lock 'orders' is not held", name="orders")
    assert str(named) == "lock 'orders' is not held"
    assert str(tenure.LockNotOwnedError("not held", name="orders")) == "not held (name 'orders')"
    again = ArgumentError("client", "client: Lock cannot use a str")
    assert str(again) == "client: Lock cannot use a str"
    assert again.argument == "client"


# -- bad arguments to every public constructor ---------------------------------------

BadCall = Callable[[redis.Redis], object]

BAD_ARGUMENTS: dict[str, BadCall] = {
    "Lock timeout": lambda c: Lock(c, "a", timeout=-1),
    "Lock name": lambda c: Lock(c, ""),
    "Lock blocking_timeout": lambda c: Lock(c, "a", blocking_timeout=float("nan")),
    "Lock max_hold": lambda c: Lock(c, "a", max_hold=-1),
    "Lock prefix": lambda c: Lock(c, "a", prefix=3),  # type: ignore[arg-type]
    "Lock waiter_lease": lambda c: Lock(c, "a", waiter_lease=0),
    "Lock handoff_lease": lambda c: Lock(c, "a", handoff_lease=-1),
    "Lock owner_name": lambda c: Lock(c, "a", owner_name=""),
    "Lock interop": lambda c: Lock(c, "a", interop="nonsense"),
    "ReentrantLock timeout": lambda c: ReentrantLock(c, "a", timeout=1e12),
    "Semaphore limit": lambda c: Semaphore(c, "a", limit=0),
    "Semaphore limit type": lambda c: Semaphore(c, "a", limit="3"),  # type: ignore[arg-type]
    "ReadWriteLock timeout": lambda c: ReadWriteLock(c, "a", timeout=0),
    "ReadWriteLock reentrant": lambda c: ReadWriteLock(c, "a", reentrant=True),
    "Redlock no clients": lambda c: Redlock([], "a"),
    "Redlock one client": lambda c: Redlock(c, "a"),  # type: ignore[arg-type]
    "Redlock same master": lambda c: Redlock([c, c, c], "a"),
    "Redlock master_timeout": lambda c: Redlock([c], "a", master_timeout=-1),
    "ClusterLock min_replicas": lambda c: ClusterLock(c, "a", min_replicas=-1),
    "ClusterLock replica_timeout": lambda c: ClusterLock(c, "a", replica_timeout=-1),
    "ClusterLock aof": lambda c: ClusterLock(c, "a", aof="yes"),  # type: ignore[arg-type]
    "ConnectionLock name": lambda c: ConnectionLock(c, ""),
    "ConnectionLock lease": lambda c: ConnectionLock(c, "a", lease=-1),
    "ConnectionLock poll_interval": lambda c: ConnectionLock(c, "a", poll_interval=-1),
    "FencedKey key": lambda c: FencedKey(c, ""),
    "FencedKey token": lambda c: FencedKey(c, "a").write("v", -1),
    "FencedKey value": lambda c: FencedKey(c, "a").write(object(), 1),  # type: ignore[arg-type]
    "FencedKey ttl": lambda c: FencedKey(c, "a").write("v", 1, ttl=-1),
    "FencedKey ttl 0": lambda c: FencedKey(c, "a").write("v", 1, ttl=0),
    "Cache name": lambda c: Cache(c, ""),
    "Cache ttl": lambda c: Cache(c, "a", ttl=1e17),
    "Cache serializer": lambda c: Cache(c, "a", serializer=3),
    "Cache compressor": lambda c: Cache(c, "a", compressor=3),
    "Cache key": lambda c: Cache(c, "a").get(object()),  # type: ignore[arg-type]
    "Cache value": lambda c: Cache(c, "a").set("k", object()),
    "Cache set ttl": lambda c: Cache(c, "a").set("k", 1, ttl=-1),
    "HerdCache ttl": lambda c: HerdCache(c, "a", ttl=-1),
    "HerdCache herd_timeout": lambda c: HerdCache(c, "a", ttl=1, herd_timeout=1e17),
    "HerdCache load_lease": lambda c: HerdCache(c, "a", ttl=1, load_lease=0),
    "HerdCache early": lambda c: HerdCache(c, "a", ttl=1, early=-1),
    "StreamConsumer claim_idle": lambda c: StreamConsumer(c, "s", "g", claim_idle=-1),
    "StreamConsumer count": lambda c: StreamConsumer(c, "s", "g", count=0),
    "StreamConsumer block": lambda c: StreamConsumer(c, "s", "g", block=-1),
    "StreamConsumer max_deliveries": lambda c: StreamConsumer(c, "s", "g", max_deliveries=0),
    "IdSet name": lambda c: IdSet(c, ""),
    "IdSet delta_limit": lambda c: IdSet(c, "a", delta_limit=0),
    "IdSet chunk_bytes": lambda c: IdSet(c, "a", chunk_bytes=0),
    "IdSet id": lambda c: IdSet(c, "a").add(-1),
    "IngestJob chunk_size": lambda c: IngestJob(c, "j", _source(), chunk_size=0),
    "IngestJob batch": lambda c: IngestJob(c, "j", _source(), batch=0),
    "IngestJob lease": lambda c: IngestJob(c, "j", _source(), lease=-1),
    "IngestJob source": lambda c: IngestJob(c, "j", "sqlite:///x.db"),  # type: ignore[arg-type]
    "CallableSource range": lambda c: CallableSource(_rows, low=2, high=1, name="n"),
    "ZlibCompressor level": lambda c: tenure.ZlibCompressor(level=99),
    "PickleSerializer key": lambda c: PickleSerializer(b""),
    "cached ttl": lambda c: cached(c, ttl=-1),
    "cached error_ttl": lambda c: cached(c, ttl=1, error_ttl=0),
    "cached cache_errors": lambda c: cached(c, ttl=1, cache_errors=[KeyError]),  # type: ignore[arg-type]
    "cached func": lambda c: cached(c, ttl=1)(3),  # type: ignore[type-var]
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_a_bad_argument_is_said_once_naming_it(case: str, tenure_client: redis.Redis) -> None:
    with pytest.raises(TenureError) as refused:
        BAD_ARGUMENTS[case](tenure_client)
    message = assert_clear(refused.value)
    if isinstance(refused.value, ArgumentError):
        assert message.startswith(f"{refused.value.argument}: "), message


# -- clients a primitive cannot use --------------------------------------------------

_MADE_WITH: dict[str, tuple[Any, ...]] = {
    "Lock": ("a",),
    "ReentrantLock": ("a",),
    "Semaphore": ("a", 2),
    "ReadWriteLock": ("a",),
    "ClusterLock": ("a",),
    "ConnectionLock": ("a",),
    "FencedKey": ("a",),
    "Cache": ("a",),
    "HerdCache": ("a", 1),
    "StreamConsumer": ("s", "g"),
    "IdSet": ("a",),
}
"""Each primitive's arguments after its client (a Redlock's and an ingestion job's below)."""


def _kinds(prefix: str) -> dict[str, Callable[[Any], object]]:
    """How to make each primitive of one API (``""`` threads, ``"Async"`` asyncio)."""

    def make(cls: Any, args: tuple[Any, ...]) -> Callable[[Any], object]:
        if cls.__name__.endswith("Semaphore"):
            return lambda c: cls(c, args[0], limit=args[1])
        if cls.__name__.endswith("HerdCache"):
            return lambda c: cls(c, args[0], ttl=args[1])
        return lambda c: cls(c, *args)

    kinds = {
        prefix + name: make(getattr(tenure, prefix + name), args)
        for name, args in _MADE_WITH.items()
    }
    redlock, ingest = getattr(tenure, prefix + "Redlock"), getattr(tenure, prefix + "IngestJob")
    kinds[prefix + "Redlock"] = lambda c: redlock([c], "a")
    kinds[prefix + "IngestJob"] = lambda c: ingest(c, "j", _source())
    return kinds


SYNC_KINDS = _kinds("")
ASYNC_KINDS = _kinds("Async")


def _refused_client(make: Callable[[Any], object], client: object, kind: str) -> str:
    with pytest.raises(ClientTypeError) as refused:
        make(client)
    message = assert_clear(refused.value)
    assert refused.value.argument.startswith("client"), message
    assert re.search(rf"\b{kind}\b", message), message  # what was called
    return message


@pytest.mark.parametrize("kind", sorted(SYNC_KINDS))
def test_a_sync_primitive_refuses_other_clients_in_one_clear_line(
    kind: str, tenure_server: ServerProcess
) -> None:
    make = SYNC_KINDS[kind]
    asyncio_client = tenure_server.async_client()
    assert "asyncio client; pass a redis.Redis" in _refused_client(make, asyncio_client, kind)
    assert "expected redis.client.Redis" in _refused_client(make, "localhost:6379", kind)
    client = tenure_server.client()
    try:
        assert "pipeline" in _refused_client(make, client.pipeline(), kind)
    finally:
        client.close()


@pytest.mark.parametrize("kind", sorted(ASYNC_KINDS))
def test_an_asyncio_primitive_refuses_other_clients_in_one_clear_line(
    kind: str, tenure_client: redis.Redis, tenure_server: ServerProcess
) -> None:
    make = ASYNC_KINDS[kind]
    assert "synchronous client" in _refused_client(make, tenure_client, kind)
    assert "pipeline" in _refused_client(make, tenure_server.async_client().pipeline(), kind)
    assert "expected redis.asyncio" in _refused_client(make, None, kind)


@pytest.mark.parametrize("kind", ["Cache", "HerdCache", "IdSet"])
def test_a_primitive_storing_bytes_says_why_a_decoding_client_cannot_serve(
    kind: str, tenure_server: ServerProcess
) -> None:
    client = tenure_server.client(decode_responses=True)
    try:
        message = _refused_client(SYNC_KINDS[kind], client, kind)
    finally:
        client.close()
    assert "decode_responses=True" in message and "decode_responses=False" in message
    assert "cannot use" not in message  # it is the right kind of client


def test_a_resp3_or_decoding_client_serves_every_other_primitive(
    tenure_server: ServerProcess,
) -> None:
    for settings in ({"protocol": 3}, {"decode_responses": True}):
        client = tenure_server.client(**settings)
        try:
            lock = Lock(client, "resp")
            assert lock.acquire(blocking_timeout=5) and lock.owned()
            lock.release()
            semaphore = Semaphore(client, "resp", limit=2)
            assert semaphore.acquire(blocking_timeout=5)
            semaphore.release()
            assert FencedKey(client, "resp").write("v", 1)
            client.xadd("resp-stream", {"a": "1"})
            assert len(StreamConsumer(client, "resp-stream", "g").read()) == 1
            if "protocol" in settings:
                assert HerdCache(client, "resp", ttl=5).fetch("k", lambda: [1]) == [1]
                assert Cache(client, "resp").set("k", 2) and Cache(client, "resp").get("k") == 2
        finally:
            client.flushall()
            client.close()


# -- @cached ---------------------------------------------------------------------------


def test_cached_on_a_decoding_client_says_what_is_wrong(tenure_server: ServerProcess) -> None:
    client = tenure_server.client(decode_responses=True)
    try:
        with pytest.raises(ClientTypeError) as refused:

            @cached(client, ttl=1)
            def price(item: str) -> int:
                return 1

    finally:
        client.close()
    message = assert_clear(refused.value)
    assert message.startswith("client: @cached stores results as binary entries"), message
    assert "decode_responses=True" in message and "decode_responses=False" in message
    assert "needs a redis.Redis" not in message and "HerdCache" not in message
    assert refused.value.name is not None and refused.value.name.endswith(".price")
    assert message.endswith(f"(name {refused.value.name!r})"), message


def test_cached_on_the_wrong_kind_of_client_names_the_decorator_once(
    tenure_client: redis.Redis, tenure_server: ServerProcess
) -> None:
    with pytest.raises(ClientTypeError) as refused:

        @cached(tenure_client, ttl=1)
        async def load() -> int:
            return 1

    message = assert_clear(refused.value)
    assert message.startswith("client: @cached on an async function cannot use a redis.client")
    assert "pass a redis.asyncio client, or cache a plain function" in message
    with pytest.raises(ClientTypeError) as refused:

        @cached(tenure_server.async_client(), ttl=1)
        def load_sync() -> int:
            return 1

    message = assert_clear(refused.value)
    assert message.startswith("client: @cached on a function cannot use a redis.asyncio")
    assert "AsyncHerdCache" not in message and "HerdCache" not in message


def test_cached_calls_that_cannot_be_named_say_why_once(tenure_client: redis.Redis) -> None:
    @cached(tenure_client, ttl=5)
    def by_arguments(handle: object) -> int:
        return 1

    @cached(tenure_client, ttl=5, cache_key=lambda handle: object())
    def by_hook(handle: object) -> int:
        return 1

    with pytest.raises(ArgumentError) as refused:
        by_arguments(object())
    message = assert_clear(refused.value)
    assert message.startswith("cache_key: cannot name this call by its arguments: ")
    assert "pass cache_key=" in message
    assert "param:" not in message  # the cache's own argument, not the user's
    with pytest.raises(ArgumentError) as refused:
        by_hook(1)
    message = assert_clear(refused.value)
    assert "by what cache_key returned" in message and "pass cache_key=" not in message
