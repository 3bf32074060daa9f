"""Exactly once under resend (issue 24): every state-changing script, its reply lost once.

redis-py resends a command whose reply was lost to a dropped connection (its
default ``Retry``: ten tries on ``ConnectionError``/``TimeoutError``, the whole
send and read again on a fresh connection). So every script that changes
state runs twice now and then, and must apply nothing more the second time,
its caller seeing the outcome of the first run.

Each case below sets state up through the public API, calls the public
method that issues its script, and returns ``(result, snapshot)``. The test
runs it twice on fresh names: once plainly, once with the script's reply
lost once (:meth:`FaultProxy.lose_reply` on its SHA1, armed by the case with
``run.arm()`` right before the call under test), and compares both. Clients
keep redis-py's default retry.

Adding a case: write ``def case(run: Run) -> tuple[object, object]`` and
decorate it with ``@case("<script name>")`` (several cases may name one
script). Make every key contain ``run.name``; give random values a role with
``run.role(value, "holder")`` if they would differ between the two runs
(random hex tokens of 16 or 32 digits, millisecond timestamps and stream
ids are replaced anyway); return the caller's result (compared by its ``repr``,
normalised the same way; ``outcome(call)`` turns an expected exception into
its name) and ``run.snapshot()``. An async case does its work in
``run.run_async(work)``, ``work`` taking a fresh ``redis.asyncio`` client
through the proxy. A script the call under test leaves to the background
(a watchdog's renewal) needs ``run.wait_fired()`` before the case ends.
:func:`test_every_state_changing_script_has_a_case` fails for a script whose
header says ``-- on resend:`` with no case, unless it is in ``PENDING``.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio

from tenure import (
    AsyncFencedKey,
    AsyncLock,
    AsyncSemaphore,
    CallableSource,
    ConnectionLock,
    FencedKey,
    HerdCache,
    IdSet,
    IngestJob,
    Lock,
    ReadWriteLock,
    Redlock,
    ReentrantLock,
    Semaphore,
    StreamConsumer,
)
from tenure._core.fence import fence_keeper
from tenure._core.scripts import Script, load_script, script_names
from tenure._sync._scripting import registry_for
from tenure._tools.demo.market import Market, Trader, open_market
from tenure.server import FaultProxy
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(60)

#: The packages whose scripts must be resend-safe.
PACKAGES = ("tenure", "tenure._tools.demo")

#: State-changing scripts whose cases are still to be written. redlock_fence runs only
#: when a quorum's masters answered different fences: several servers, one of them
#: (the proxied one) behind.
PENDING: frozenset[str] = frozenset()

SOCKET_TIMEOUT = 5.0  # nothing hangs; redis-py's retry is left as it is

# --------------------------------------------------------------------------- the harness


def script_of(name: str) -> Script:
    """The script ``name`` from whichever package ships it."""
    for package in PACKAGES:
        if name in script_names(package):
            return load_script(name, package)
    raise KeyError(name)


@dataclass
class Run:
    """One run of a case: a client through the proxy, fresh names, the fault's trigger."""

    proxy: FaultProxy
    direct: redis.Redis  # straight to the server: snapshots only
    script: Script
    faulted: bool
    name: str = field(default_factory=lambda: f"rs{secrets.token_hex(4)}")
    roles: dict[str, str] = field(default_factory=dict)
    armed: bool = False
    _lost_at_arm: int = 0
    _clients: list[redis.Redis] = field(default_factory=list)

    @property
    def client(self) -> redis.Redis:
        """A client through the proxy with redis-py's default retry (one per run)."""
        if not self._clients:
            self._clients.append(self.proxy.client(socket_timeout=SOCKET_TIMEOUT))
        return self._clients[0]

    def arm(self) -> None:
        """Call right before the call under test: its script's next reply is lost (if faulted)."""
        assert not self.armed, "arm() once per run"
        self.armed = True
        if self.faulted:
            self._lost_at_arm = self.proxy.lost_replies
            self.proxy.lose_reply(self.script.sha.encode())

    def wait_fired(self, timeout: float = 3.0) -> None:
        """In the faulted run, wait until the reply was lost (a script run in the background)."""
        if self.faulted:
            wait_for(
                lambda: self.proxy.lost_replies != self._lost_at_arm,
                timeout,
                f"{self.script.name} called (its reply lost)",
            )

    def role(self, value: object, role: str) -> None:
        """Show ``value`` (a token, a connection ID) as ``<role>`` in the snapshot."""
        self.roles[str(value)] = role

    def run_async(self, work: Callable[[redis.asyncio.Redis], Awaitable[Any]]) -> Any:
        """Run ``work(async client through the proxy)`` in a new event loop; its result."""

        async def main() -> Any:
            client = self.proxy.async_client(socket_timeout=SOCKET_TIMEOUT)
            try:
                return await work(client)
            finally:
                await client.aclose()

        return asyncio.run(main())

    def snapshot(
        self,
        *extra: str,
        ms_values: tuple[str, ...] = (),
        ms_fields: tuple[tuple[str, str], ...] = (),
    ) -> dict[str, Any]:
        """Every key whose name contains ``run.name`` (and ``extra`` patterns), normalised.

        ``ms_values``: keys (as shown, ``NAME`` for the run's name) of hashes
        whose values are durations in ms (a receipt's lease), shown in
        seconds rounded up. ``ms_fields``: (key, field) of hash fields holding
        ``id:ms`` (a lock's receipt of an extend), the ms shown the same way.
        """
        keys: set[bytes] = set(self.direct.scan_iter(match=f"*{self.name}*", count=1000))
        for pattern in extra:
            keys.update(self.direct.scan_iter(match=pattern, count=1000))
        found = {}
        for key in keys:
            dump = self._dump(key)
            if dump["type"] != "none":  # (expired between SCAN and TYPE: absent)
                found[self.normalise(key)] = dump
        for shown in ms_values:
            dump = found[shown]
            dump["value"] = [(f, math.ceil(int(v) / 1000)) for f, v in dump["value"]]
        for shown, name in ms_fields:
            dump = found[shown]
            dump["value"] = [
                (f, f"{v.rpartition(':')[0]}:{math.ceil(int(v.rpartition(':')[2]) / 1000)}s")
                if f == name
                else (f, v)
                for f, v in dump["value"]
            ]
        return dict(sorted(found.items()))

    def _dump(self, key: bytes) -> Any:
        direct: Any = self.direct  # redis-py's annotations do not follow decode_responses
        text = self.normalise
        kind = direct.type(key).decode()
        value: Any
        if kind == "string":
            value = text(direct.get(key))
        elif kind == "hash":
            value = sorted((text(f), text(v)) for f, v in direct.hgetall(key).items())
        elif kind == "list":
            value = [text(v) for v in direct.lrange(key, 0, -1)]
        elif kind == "set":
            value = sorted(text(v) for v in direct.smembers(key))
        elif kind == "zset":
            value = sorted(
                (text(m), "<ms>" if s >= 1e12 else s)
                for m, s in direct.zrange(key, 0, -1, withscores=True)
            )
        elif kind == "stream":
            entries = [
                (text(i), sorted((text(f), text(v)) for f, v in fields.items()))
                for i, fields in direct.xrange(key)
            ]
            groups = []
            for group in direct.xinfo_groups(key):
                pending = direct.xpending_range(key, group["name"], "-", "+", 1000)
                groups.append(
                    (
                        text(group["name"]),
                        text(group["last-delivered-id"]),
                        [
                            (text(p["message_id"]), text(p["consumer"]), p["times_delivered"])
                            for p in pending
                        ],
                    )
                )
            value = {"entries": entries, "groups": sorted(groups)}
        else:
            value = kind
        pttl = int(direct.pttl(key))
        return {"type": kind, "ttl": pttl if pttl < 0 else math.ceil(pttl / 1000), "value": value}

    def normalise(self, raw: object) -> str:
        """Bytes as text, with the run's name, roles, times, stream ids and tokens replaced."""
        value = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
        value = value.replace(self.name, "NAME")
        for found, role in sorted(self.roles.items(), key=lambda item: -len(item[0])):
            value = re.sub(
                rf"(?<![0-9A-Za-z]){re.escape(found)}(?![0-9A-Za-z])", f"<{role}>", value
            )
        # tokens first: a token's digits must not pass for a time
        value = re.sub(r"(?<![0-9a-f])[0-9a-f]{16}(?:[0-9a-f]{16})?(?![0-9a-f])", "<hex>", value)
        value = re.sub(r"(?<!\d)1\d{12}-\d+(?!\d)", "<id>", value)
        return re.sub(r"(?<!\d)1\d{12}(?!\d)", "<ms>", value)

    def close(self) -> None:
        for client in self._clients:
            client.close()


Case = Callable[[Run], tuple[object, object]]
CASES: dict[str, list[Case]] = {}


def case(script: str) -> Callable[[Case], Case]:
    """Register a case for ``script``."""

    def register(function: Case) -> Case:
        CASES.setdefault(script, []).append(function)
        return function

    return register


def outcome(call: Callable[[], Any]) -> Any:
    """``call()``'s result, or the name of the exception it raised."""
    try:
        return call()
    except Exception as exc:
        return f"raised {type(exc).__name__}"


def execute(
    proxy: FaultProxy, direct: redis.Redis, script: Script, run_case: Case, *, faulted: bool
) -> tuple[object, object, float]:
    """A case's outcome, the server's state after it, and how long it took (s)."""
    run = Run(proxy, direct, script, faulted)
    lost = proxy.lost_replies
    started = time.monotonic()
    try:
        if faulted:  # the script cached, so the call is an EVALSHA that names it
            direct.script_load(script.source)
        result, snapshot = run_case(run)
    finally:
        proxy.lose_reply(b"-", 0)  # disarmed, fired or not
        run.close()
    assert run.armed, f"{run_case.__name__} never called run.arm()"
    if faulted:
        assert proxy.lost_replies - lost == 1, f"{script.name}'s reply was not lost once"
    return run.normalise(repr(result)), snapshot, time.monotonic() - started


def every_case() -> Iterator[Any]:
    for script, cases in sorted(CASES.items()):
        for run_case in cases:
            yield pytest.param(script, run_case, id=f"{script}-{run_case.__name__}")


# --------------------------------------------------------------------------- cases: caches


@case("cache_fetch")
def cache_elects_a_refresher(run: Run) -> tuple[object, object]:
    cache = HerdCache(run.client, run.name, ttl=0.05)
    assert cache.set("k", "old")
    time.sleep(0.1)  # stale: the first read cannot serve it, cache_fetch decides
    run.arm()
    got = cache.get("k", default="missing")  # the stale value; the refresh is this object's
    return (got, cache.statistics()), run.snapshot()


@case("cache_fetch")
def cache_elects_a_loader_after_a_hot_run(run: Run) -> tuple[object, object]:
    cache = HerdCache(run.client, run.name, ttl=60)
    assert cache.set("hot", "value")
    for _ in range(200):  # mostly hits: first reads are plain GETs, cache_fetch elects
        assert cache.get("hot") == "value"
    run.arm()
    got = cache.get("k", default="missing")  # elected to load: its mark is this object's
    return (got, cache.statistics()), run.snapshot()


@case("cache_commit")
def cache_stores_a_refresh(run: Run) -> tuple[object, object]:
    cache = HerdCache(run.client, run.name, ttl=60)
    assert cache.get("k") is None  # the lease, for the set() below
    run.arm()
    stored = cache.set("k", "value")
    return (stored, cache.get("k"), cache.statistics()), run.snapshot()


@case("cache_lease")
def cache_gives_a_failed_load_back(run: Run) -> tuple[object, object]:
    cache = HerdCache(run.client, run.name, ttl=60)

    def load() -> str:
        raise ValueError("the loader failed")

    run.arm()
    failed = outcome(lambda: cache.fetch("k", load))
    return (failed, cache.statistics()), run.snapshot()


def test_a_first_read_resent_elects_its_caller_once(
    tenure_proxy: FaultProxy, tenure_client: redis.Redis
) -> None:
    """A herd cache's first read (``SET entry l<token> NX PX ms GET``, not a script)
    resent after its reply was lost finds its own load mark: the caller loads, once,
    and nobody waits out the lease."""
    client = tenure_proxy.client(socket_timeout=SOCKET_TIMEOUT)
    try:
        cache = HerdCache(client, f"rs{secrets.token_hex(4)}", ttl=60, load_lease=30)
        calls: list[int] = []

        def load() -> str:
            calls.append(1)
            return "loaded"

        lost = tenure_proxy.lost_replies
        tenure_proxy.lose_reply(b"\r\nNX\r\n")
        started = time.monotonic()
        assert cache.fetch("k", load) == "loaded"
        assert time.monotonic() - started < 5  # not the 30 s lease of a mark taken for lost
        assert tenure_proxy.lost_replies - lost == 1
        assert calls == [1]
        assert (cache.statistics().loads, cache.statistics().waits) == (1, 0)
        stored: Any = tenure_client.get(cache.key_of("k"))
        assert stored is not None and stored[:1] == b"h"  # the value, not a mark
    finally:
        tenure_proxy.lose_reply(b"-", 0)
        client.close()


# --------------------------------------------------------------------------- cases: keys


@case("fenced_set")
def fenced_write(run: Run) -> tuple[object, object]:
    key = FencedKey(run.client, f"{run.name}:fenced")
    assert key.write("old", 3)
    run.arm()
    written = key.write("new", 5, ttl=60)
    return (written, key.read()), run.snapshot()


def test_a_fenced_write_resent_after_a_newer_one_is_answered_written(
    tenure_client: redis.Redis,
) -> None:
    """The resend comes after a newer token wrote: still the first run's answer."""
    registry = registry_for(tenure_client)
    key = f"rs{secrets.token_hex(4)}:fenced"
    keys = (key, fence_keeper(key))
    assert registry.run("fenced_set", keys, (5, "mine", 0, "write-a")) == [1, 5]
    assert registry.run("fenced_set", keys, (6, "newer", 0, "write-b")) == [1, 6]
    assert registry.run("fenced_set", keys, (5, "mine", 0, "write-a")) == [1, 5]  # resent
    assert registry.run("fenced_set", keys, (5, "late", 0, "write-c")) == [0, 6]
    assert tenure_client.hmget(key, ["value", "fence"]) == [b"newer", b"6"]
    for n in range(10):
        registry.run("fenced_set", keys, (7, n, 0, f"w{n}"))
    ops = b" ".join(f"w{n}".encode() for n in range(2, 10))
    assert tenure_client.hget(keys[1], "ops") == ops
    # A resend after the value expired: still recognised, nothing written again.
    tenure_client.delete(key)
    assert registry.run("fenced_set", keys, (7, 9, 0, "w9")) == [1, 7]
    assert not tenure_client.exists(key)


def test_a_key_written_before_fence_keepers_keeps_its_fence(tenure_client: redis.Redis) -> None:
    """A hash holding ``fence`` and ``ops`` itself (tenure before keepers) still refuses."""
    registry = registry_for(tenure_client)
    key = f"rs{secrets.token_hex(4)}:fenced"
    tenure_client.hset(key, mapping={"value": "old", "fence": 8, "ops": "w1 w2"})
    keys = (key, fence_keeper(key))
    assert registry.run("fenced_set", keys, (8, "old", 0, "w2")) == [1, 8]  # its resend
    assert registry.run("fenced_set", keys, (7, "late", 0, "w3")) == [0, 8]
    assert registry.run("fenced_set", keys, (9, "new", 0, "w4")) == [1, 9]
    assert tenure_client.hgetall(key) == {b"value": b"new", b"fence": b"9"}
    assert tenure_client.hmget(keys[1], ["fence", "ops"]) == [b"9", b"w1 w2 w4"]


@case("fenced_set")
def fenced_write_async(run: Run) -> tuple[object, object]:
    async def write(client: redis.asyncio.Redis) -> object:
        key = AsyncFencedKey(client, f"{run.name}:fenced")
        assert await key.write("old", 3)
        run.arm()
        return await key.write("new", 5), await key.read()

    return run.run_async(write), run.snapshot()


@case("pexpire_if")
def pexpire_if_held(run: Run) -> tuple[object, object]:
    key = f"{run.name}:held"
    run.client.set(key, "mine", px=5000)
    run.arm()
    reset = registry_for(run.client).run("pexpire_if", (key,), ("mine", 60000))
    return reset, run.snapshot()


@case("connlock_refresh")
def connlock_refresh(run: Run) -> tuple[object, object]:
    lock = ConnectionLock(run.client, run.name, lease=30, owner_name="holder")
    assert lock.acquire()
    run.role(lock.owner_id, "holder")
    run.arm()
    refreshed = outcome(lock.refresh)
    snapshot = run.snapshot()
    lock.release()
    return refreshed, snapshot


@case("connlock_release")
def connlock_release(run: Run) -> tuple[object, object]:
    lock = ConnectionLock(run.client, run.name, lease=30, owner_name="holder")
    assert lock.acquire()
    run.role(lock.owner_id, "holder")
    run.arm()
    released = outcome(lock.release)
    return (released, lock.locked()), run.snapshot()


# --------------------------------------------------------------------------- cases: id sets


@case("idset_write")
def idset_write(run: Run) -> tuple[object, object]:
    ids = IdSet(run.client, run.name)
    ids.add_many([1, 2, 3])
    run.arm()
    ids.remove_many([2, 9])
    return (ids.to_numpy().tolist(), ids.version()), run.snapshot()


@case("idset_clear")
def idset_clear(run: Run) -> tuple[object, object]:
    ids = IdSet(run.client, run.name)
    ids.add_many([1, 2, 3])
    run.arm()
    ids.clear()
    ids.add(7)
    return (ids.to_numpy().tolist(), ids.version()), run.snapshot()


@case("idset_swap")
def idset_compaction(run: Run) -> tuple[object, object]:
    ids = IdSet(run.client, run.name)
    ids.add_many(range(0, 100, 3))
    ids.remove(3)
    run.arm()
    compacted = ids.compact()
    return (compacted, ids.count(), ids.statistics().compactions), run.snapshot()


@case("compare_and_delete")
def idset_compaction_lease(run: Run) -> tuple[object, object]:
    ids = IdSet(run.client, run.name)
    ids.add_many([5, 6])
    run.arm()
    compacted = ids.compact()  # its lease given back by compare_and_delete
    return (compacted, ids.to_numpy().tolist()), run.snapshot()


# --------------------------------------------------------------------------- cases: ingestion


def rows(first: int, last: int) -> Iterator[tuple[int, dict[str, int]]]:
    for key in range(first, last + 1):
        yield key, {"n": key}


def ingest_job(run: Run, fetch: Callable[[int, int], Any] = rows) -> IngestJob:
    source = CallableSource(fetch, low=1, high=40, name="numbers")
    return IngestJob(
        run.client, run.name, source, chunk_size=10, batch=4, sink=f"stream:{run.name}:sink"
    )


@case("ingest_plan")
def ingest_plan(run: Run) -> tuple[object, object]:
    job = ingest_job(run)
    run.arm()
    plan = job.plan()
    return (plan.chunks, plan.fingerprint), run.snapshot()


@case("ingest_claim")
def ingest_claim(run: Run) -> tuple[object, object]:
    job = ingest_job(run)
    job.plan()
    run.arm()
    report = job.work(max_chunks=1)
    return (report, job.status().rows), run.snapshot()


@case("ingest_commit")
def ingest_commit(run: Run) -> tuple[object, object]:
    job = ingest_job(run)
    job.plan()
    run.arm()
    report = job.work(max_chunks=2)
    return (report, job.status().rows), run.snapshot()


@case("ingest_release")
def ingest_release(run: Run) -> tuple[object, object]:
    def failing(first: int, last: int) -> Iterator[tuple[int, dict[str, int]]]:
        yield first, {"n": first}
        raise ValueError("the source failed")

    job = ingest_job(run, failing)
    job.plan()
    run.arm()
    failed = outcome(job.work)
    return (failed, job.status().claimed), run.snapshot()


@case("ingest_release")
def ingest_release_by_token(run: Run) -> tuple[object, object]:
    """A claim interrupted before its reply was read is given back by its token alone."""
    job = ingest_job(run)
    plan = job.plan()
    keys = job.keys
    claim_keys = (keys.free, keys.leases, keys.cursors, keys.stats, keys.fence, keys.plan)
    registry = registry_for(run.client)
    assert registry.run("ingest_claim", claim_keys, ("tok@w", 30000, plan.fingerprint))[0] == 1
    run.arm()
    released = registry.run("ingest_release", (keys.free, keys.leases), ("tok@w", ""))
    return (released, job.status().claimed), run.snapshot()


@case("ingest_reset")
def ingest_reset(run: Run) -> tuple[object, object]:
    job = ingest_job(run)
    job.work(max_chunks=1)
    run.arm()
    report = job.reset(sink=True)
    return report, run.snapshot()


# --------------------------------------------------------------------------- cases: streams


def abandoned(run: Run, messages: int) -> str:
    """A stream with ``messages`` read by a consumer that went quiet."""
    stream = f"{run.name}:jobs"
    for n in range(messages):
        run.client.xadd(stream, {"n": n})
    quiet = StreamConsumer(run.client, stream, "workers", "quiet", block=0)
    assert len(quiet.read()) == messages

    def idle() -> bool:  # past the takers' claim_idle (0.05 s), as the server counts
        pending = run.client.xpending_range(stream, "workers", "-", "+", messages)
        return all(int(entry["time_since_delivered"]) > 60 for entry in pending)

    wait_for(idle, 5, "the quiet consumer's messages idle")
    return stream


@case("stream_claim")
def stream_takes_over(run: Run) -> tuple[object, object]:
    stream = abandoned(run, 3)
    taker = StreamConsumer(run.client, stream, "workers", "taker", claim_idle=0.05, block=0)
    run.arm()
    taken = taker.read()
    result = [(m.fields, m.deliveries) for m in taken], taker.dead_lettered
    return result, run.snapshot()


@case("stream_claim")
def stream_dead_letters(run: Run) -> tuple[object, object]:
    stream = abandoned(run, 2)
    taker = StreamConsumer(
        run.client, stream, "workers", "taker", claim_idle=0.05, block=0, max_deliveries=1
    )
    run.arm()
    taken = taker.read()
    return (len(taken), taker.dead_lettered), run.snapshot()


@case("stream_touch")
def stream_keeps_a_message(run: Run) -> tuple[object, object]:
    stream = f"{run.name}:jobs"
    run.client.xadd(stream, {"n": 1})
    consumer = StreamConsumer(run.client, stream, "workers", "worker", claim_idle=0.3, block=0)
    seen = []

    def handle(message: Any) -> None:
        seen.append(message.fields)
        time.sleep(0.25)  # the handler's work: the watchdog touches it meanwhile (every 0.1 s)
        run.wait_fired()  # (a busy machine may run the first touch late)
        consumer.stop()

    consumer.setup()
    run.arm()
    handled = consumer.run(handle)
    return (handled, seen), run.snapshot()


# --------------------------------------------------------------------------- cases: the demo


def market(run: Run) -> tuple[Market, Trader, Trader]:
    place = Market(f"{run.name}:")
    open_market(run.client, place, ["seller"], ["buyer"])
    seller = Trader(run.client, place, "script", "seller")
    seller._random = random.Random(7)  # the same price in both runs
    return place, seller, Trader(run.client, place, "script", "buyer")


@case("market_list")
def market_list(run: Run) -> tuple[object, object]:
    _, seller, _ = market(run)
    run.arm()
    seller.list_new_item(time.monotonic() + 5)
    return seller.tally, run.snapshot()


@case("market_purchase")
def market_purchase(run: Run) -> tuple[object, object]:
    _, seller, buyer = market(run)
    seller.list_new_item(time.monotonic() + 5)
    run.arm()
    assert buyer.buy_something(time.monotonic() + 5)
    buyer.tally.waited = 0.0
    return buyer.tally, run.snapshot()


# --------------------------------------------------------------------------- cases: the lock family


def held_by_another(run: Run, make: Callable[[], Any]) -> Any:
    """A primitive from ``make()`` acquired now (by this thread, through the proxy)."""
    holder = make()
    assert holder.acquire(blocking=False)
    return holder


def handed_over(run: Run, make: Callable[[], Any]) -> tuple[object, object]:
    """A waiter joins the line (its script's reply lost), and is handed the hold on release."""
    holder = held_by_another(run, make)
    waiter = make()
    got: list[bool] = []
    run.arm()
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(blocking_timeout=5)))
    thread.start()
    wait_for(lambda: bool(run.direct.zcard(holder.keys.queue)), 5, "the waiter in line")
    holder.release()
    thread.join(10)
    wait_for(  # the handoff's short lease confirmed (by the watchdog), if it was handed over
        lambda: got != [True] or run.direct.pttl(holder.keys.owner) >= 2000,
        3,
        "the handoff's lease confirmed",
    )
    snapshot = run.snapshot()
    return got, snapshot


@case("lock_try")
def lock_try(run: Run) -> tuple[object, object]:
    lock = Lock(run.client, run.name, timeout=30)
    run.arm()
    got = lock.acquire(blocking=False)
    snapshot = run.snapshot()
    lock.release()
    return (got, lock.fencing_token is not None), snapshot


@case("lock_try")
def lock_try_with_a_chosen_token(run: Run) -> tuple[object, object]:
    """A token of the caller's choosing: the resend carries the call's id, so it is
    answered as taken, not refused as a second owner's."""
    lock = Lock(run.client, run.name, timeout=30)
    run.arm()
    got = lock.acquire(blocking=False, token=f"{run.name}-worker-1")
    snapshot = run.snapshot()
    lock.release()
    return (got, lock.fencing_token is not None), snapshot


@case("lock_confirm")
def lock_waiter_with_a_chosen_token(run: Run) -> tuple[object, object]:
    """A waiter with a chosen token in line, its reply lost, then handed the hold."""
    holder = held_by_another(run, lambda: Lock(run.client, run.name, timeout=30))
    waiter = Lock(run.client, run.name, timeout=30)
    got: list[bool] = []
    run.arm()
    thread = threading.Thread(
        target=lambda: got.append(waiter.acquire(blocking_timeout=5, token=f"{run.name}-worker-2"))
    )
    thread.start()
    wait_for(lambda: bool(run.direct.zcard(holder.keys.queue)), 5, "the waiter in line")
    holder.release()
    thread.join(10)
    wait_for(
        lambda: got != [True] or run.direct.pttl(holder.keys.owner) >= 2000,
        3,
        "the handoff's lease confirmed",
    )
    return got, run.snapshot()


@case("lock_line")
def lock_second_owner_of_a_token_gives_up(run: Run) -> tuple[object, object]:
    """A second owner that chose the holder's token waits in line (a round's reply
    lost), and gives up: the holder's hold stays."""
    token = f"{run.name}-worker-3"
    holder = Lock(run.client, run.name, timeout=30)
    assert holder.acquire(blocking=False, token=token)
    got = gives_up(run, Lock(run.client, run.name, timeout=30), token)
    return (got, holder.owned()), run.snapshot()


def gives_up(run: Run, waiter: Any, token: str | None = None) -> list[bool]:
    """``waiter`` waits in its process's line, then gives up; a round's reply lost meanwhile.

    The round is its refresh or its give-up, whichever comes first.
    """
    got: list[bool] = []
    thread = threading.Thread(
        target=lambda: got.append(waiter.acquire(blocking_timeout=1.0, token=token))
    )
    thread.start()
    wait_for(lambda: bool(run.direct.zcard(waiter.keys.queue)), 5, "the waiter in line")
    run.arm()
    thread.join(10)
    return got


async def cancelled_in_its_try(run: Run, primitive: Any) -> tuple[object, object]:
    """``primitive.acquire()`` cancelled while its try is on its way: the try runs to
    its reply, and what it took is given back (the give-back's reply lost)."""
    run.arm()
    task = asyncio.ensure_future(primitive.acquire())
    await asyncio.sleep(0)  # the try sent (or connecting): shielded to its reply
    task.cancel()
    results = await asyncio.gather(task, return_exceptions=True)
    return type(results[0]).__name__, await primitive.owned()


@case("lock_leave")
def lock_acquire_cancelled_in_its_try(run: Run) -> tuple[object, object]:
    async def work(client: redis.asyncio.Redis) -> object:
        return await cancelled_in_its_try(run, AsyncLock(client, run.name, timeout=30))

    return run.run_async(work), run.snapshot()


@case("lock_confirm")
def lock_handed_over(run: Run) -> tuple[object, object]:
    return handed_over(run, lambda: Lock(run.client, run.name, timeout=30))


@case("lock_line")
def lock_waiters_of_one_process_join_together(run: Run) -> tuple[object, object]:
    return waiting_together(run, lambda: Lock(run.client, run.name, timeout=30))


def waiting_together(run: Run, make: Callable[[], Any]) -> tuple[object, object]:
    """Three waiters of one process join its line (a round's reply lost) and give up."""
    holder = held_by_another(run, make)
    waiters = [make() for _ in range(3)]
    got: list[bool] = []
    run.arm()
    threads = [
        threading.Thread(target=lambda w=w: got.append(w.acquire(blocking_timeout=0.5)))
        for w in waiters
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    # A give-up the server answered past the deadline's grace finishes in the
    # background: the state is compared once those have ended (a starved CI worker).
    for thread in threading.enumerate():
        if thread.name == "tenure-give-back":
            thread.join(10)
    snapshot = run.snapshot()
    holder.release()
    return got, snapshot


@case("lock_confirm")
def lock_entered_again(run: Run) -> tuple[object, object]:
    lock = ReentrantLock(run.client, run.name, timeout=30)
    assert lock.acquire()
    run.arm()
    again = lock.acquire()
    lock.release()  # the inner release: still held
    still = lock.locked(), lock.owned()
    snapshot = run.snapshot()
    lock.release()
    return (again, still, lock.locked()), snapshot


@case("lock_line")
def lock_waiter_gives_up(run: Run) -> tuple[object, object]:
    held_by_another(run, lambda: Lock(run.client, run.name, timeout=30))
    got = gives_up(run, Lock(run.client, run.name, timeout=30))
    return got, run.snapshot()


@case("lock_extend")
def lock_extend(run: Run) -> tuple[object, object]:
    lock = Lock(run.client, run.name, timeout=30)
    assert lock.acquire()
    run.arm()
    extended = lock.extend(20)
    return extended, run.snapshot(ms_fields=(("tenure:lock:{NAME}", "added"),))


@case("lock_release")
def lock_release(run: Run) -> tuple[object, object]:
    lock = Lock(run.client, run.name, timeout=30)
    assert lock.acquire()
    run.arm()
    released = outcome(lock.release)
    return (released, lock.locked()), run.snapshot()


def interop_lock(run: Run) -> Lock:
    """A lock that also holds redis-py's key (``run.name`` itself, in the snapshot)."""
    return Lock(run.client, run.name, timeout=30, interop="redis-py")


@case("lock_try")
def interop_lock_try(run: Run) -> tuple[object, object]:
    lock = interop_lock(run)
    run.arm()
    got = lock.acquire(blocking=False)
    snapshot = run.snapshot()
    lock.release()
    return got, snapshot


@case("lock_confirm")
def interop_lock_handed_over(run: Run) -> tuple[object, object]:
    return handed_over(run, lambda: interop_lock(run))


@case("lock_line")
def interop_lock_waiters_of_one_process_join_together(run: Run) -> tuple[object, object]:
    return waiting_together(run, lambda: interop_lock(run))


@case("lock_line")
def interop_lock_waiter_gives_up(run: Run) -> tuple[object, object]:
    held_by_another(run, lambda: interop_lock(run))
    got = gives_up(run, interop_lock(run))
    return got, run.snapshot()


@case("lock_leave")
def interop_lock_acquire_cancelled_in_its_try(run: Run) -> tuple[object, object]:
    async def work(client: redis.asyncio.Redis) -> object:
        lock = AsyncLock(client, run.name, timeout=30, interop="redis-py")
        return await cancelled_in_its_try(run, lock)

    return run.run_async(work), run.snapshot()


@case("lock_extend")
def interop_lock_extend(run: Run) -> tuple[object, object]:
    lock = interop_lock(run)
    assert lock.acquire()
    run.arm()
    extended = lock.extend(20)
    return extended, run.snapshot(ms_fields=(("tenure:lock:{NAME}", "added"),))


@case("lock_release")
def interop_lock_release(run: Run) -> tuple[object, object]:
    lock = interop_lock(run)
    assert lock.acquire()
    run.arm()
    released = outcome(lock.release)
    return (released, lock.locked()), run.snapshot()


def semaphore(run: Run, limit: int = 1) -> Semaphore:
    return Semaphore(run.client, run.name, timeout=30, limit=limit)


@case("semaphore_line")
def semaphore_waiters_of_one_process_join_together(run: Run) -> tuple[object, object]:
    return waiting_together(run, lambda: semaphore(run))


@case("semaphore_try")
def semaphore_try(run: Run) -> tuple[object, object]:
    sem = semaphore(run, 2)
    run.arm()
    got = sem.acquire(blocking=False)
    return got, run.snapshot()


@case("semaphore_try")
def semaphore_try_with_a_chosen_token(run: Run) -> tuple[object, object]:
    """A chosen token's permit: its resend is answered as taken, not refused."""
    sem = semaphore(run, 2)
    run.arm()
    got = sem.acquire(blocking=False, token=f"{run.name}-worker-1")
    return got, run.snapshot()


@case("semaphore_line")
def semaphore_second_owner_of_a_token_gives_up(run: Run) -> tuple[object, object]:
    """A second owner that chose a holder's token asks its line (that round's reply
    lost), is not queued while the holder's permit lasts, and gives up: the holder's
    permit stays."""
    token = f"{run.name}-worker-2"
    holder = semaphore(run, 1)
    assert holder.acquire(blocking=False, token=token)
    second = semaphore(run, 1)
    run.arm()
    got = second.acquire(blocking_timeout=0.3, token=token)
    return (got, holder.owned()), run.snapshot()


@case("semaphore_line")
def semaphore_handed_over(run: Run) -> tuple[object, object]:
    return handed_over(run, lambda: semaphore(run))


@case("semaphore_line")
def semaphore_waiter_gives_up(run: Run) -> tuple[object, object]:
    held_by_another(run, lambda: semaphore(run))
    got = gives_up(run, semaphore(run))
    return got, run.snapshot()


@case("semaphore_leave")
def semaphore_acquire_cancelled_in_its_try(run: Run) -> tuple[object, object]:
    async def work(client: redis.asyncio.Redis) -> object:
        primitive = AsyncSemaphore(client, run.name, timeout=30, limit=1)
        return await cancelled_in_its_try(run, primitive)

    return run.run_async(work), run.snapshot()


@case("semaphore_extend")
def semaphore_extend(run: Run) -> tuple[object, object]:
    sem = semaphore(run, 2)
    assert sem.acquire()
    run.arm()
    extended = sem.extend(20)
    return extended, run.snapshot(ms_values=("tenure:semaphore:{NAME}:done",))


@case("semaphore_release")
def semaphore_release(run: Run) -> tuple[object, object]:
    sem = semaphore(run, 2)
    assert sem.acquire()
    run.arm()
    released = outcome(sem.release)
    return released, run.snapshot()


@case("semaphore_set_limit")
def semaphore_set_limit(run: Run) -> tuple[object, object]:
    sem = semaphore(run, 2)
    run.arm()
    previous = sem.set_limit(3)
    return previous, run.snapshot()


@case("rw_downgrade")
def rw_downgrade(run: Run) -> tuple[object, object]:
    rw = ReadWriteLock(run.client, run.name, timeout=30)
    assert rw.write.acquire()
    run.arm()
    downgraded = outcome(rw.write.downgrade)
    reader = ReadWriteLock(run.client, run.name, timeout=30)
    return (downgraded, reader.read.acquire(blocking=False)), run.snapshot()


def redlock(run: Run) -> Redlock:
    # master_timeout: a resent call that a busy machine answers late is still
    # the same attempt (a late attempt is given back and retried: another state)
    return Redlock([run.client], run.name, timeout=30, master_timeout=3)


@case("redlock_acquire")
def redlock_acquire(run: Run) -> tuple[object, object]:
    lock = redlock(run)
    run.arm()
    got = lock.acquire(blocking=False)
    return (got, lock.fencing_token is not None), run.snapshot()


@case("redlock_release")
def redlock_release(run: Run) -> tuple[object, object]:
    lock = redlock(run)
    assert lock.acquire()
    run.arm()
    released = outcome(lock.release)
    return (released, lock.locked()), run.snapshot()


@case("redlock_fence")
def redlock_fence_raised(run: Run) -> tuple[object, object]:
    # Made only when the masters of a quorum gave different fences and this
    # one is behind; so here on one master, as the Redlock makes it: raise
    # its counter to the holder's fence.
    lock = redlock(run)
    assert lock.acquire()
    fence = lock.fencing_token
    assert fence is not None
    run.role(fence, "fence")
    run.role(fence + 1000, "raised")
    token = run.direct.hget(lock.keys.owner, "token")
    assert token is not None
    run.arm()
    raised = registry_for(run.client).run(
        "redlock_fence", (lock.keys.owner, lock.keys.fence), (token, fence + 1000, 60_000)
    )
    return raised, run.snapshot()


# ------------------------------------------------------------- the tests (after every case)


def test_every_state_changing_script_has_a_case() -> None:
    declared: dict[str, bool] = {}
    for package in PACKAGES:
        for name in script_names(package):
            declared[name] = load_script(name, package).changes_state
    changing = {name for name, changes in declared.items() if changes}
    missing = changing - set(CASES) - PENDING
    assert not missing, f"state-changing scripts with no resend case: {sorted(missing)}"
    assert not set(CASES) - set(declared), "cases name scripts that do not exist"
    assert not PENDING - set(declared), "PENDING names scripts that do not exist"
    assert not PENDING & set(CASES), f"remove from PENDING: {sorted(PENDING & set(CASES))}"


@pytest.mark.parametrize(("script", "run_case"), list(every_case()))
def test_a_resent_call_changes_nothing_more(
    script: str, run_case: Case, tenure_proxy: FaultProxy, tenure_client: redis.Redis
) -> None:
    loaded = script_of(script)
    plain = execute(tenure_proxy, tenure_client, loaded, run_case, faulted=False)
    resent = execute(tenure_proxy, tenure_client, loaded, run_case, faulted=True)
    assert resent[0] == plain[0], "the caller saw another outcome"
    assert_same_state(resent[1], plain[1], TTL_SLACK_S + max(plain[2], resent[2]))


# A key's remaining time in the two runs differs by the time between its write
# and the snapshot, which is longer in the faulted run (and on a busy machine):
# at most the longer run's duration (a starved CI worker took 3 s once), plus this.
TTL_SLACK_S = 2


def assert_same_state(resent: Any, plain: Any, slack: float = TTL_SLACK_S) -> None:
    """The same keys, types and values; each key's remaining time within ``slack`` seconds."""

    def masked(state: Any) -> Any:
        return {key: {**dump, "ttl": dump["ttl"] >= 0} for key, dump in state.items()}

    assert masked(resent) == masked(plain), "the server's state differs"
    for key, dump in plain.items():
        left, expected = resent[key]["ttl"], dump["ttl"]
        assert abs(left - expected) <= slack, f"{key}: {left} s left, not {expected} s"
