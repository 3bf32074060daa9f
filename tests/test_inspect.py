"""``tenure inspect``: primitives found with SCAN and described by their views."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.cluster

from tenure import ConnectionLock, IdSet, Lock, ReadWriteLock, Redlock, Semaphore
from tenure.inspect import Primitive, View, inspect, register_view, render_table, views
from tenure.server import ServerProcess


@pytest.fixture
def busy(tenure_client: redis.Redis, tenure_server: ServerProcess) -> Iterator[None]:
    """A held lock with a waiter, a semaphore, a read-write lock and a connection lock."""
    lock = Lock(tenure_client, "orders", thread_local=False)
    assert lock.acquire()
    other = tenure_server.client()
    waiter = threading.Thread(target=lambda: Lock(other, "orders").acquire(blocking_timeout=1.5))
    waiter.start()
    permits = [Semaphore(tenure_client, "pool", limit=3, thread_local=False) for _ in range(2)]
    for permit in permits:
        assert permit.acquire()
    rw = ReadWriteLock(tenure_client, "catalog")
    assert rw.read.acquire()
    booking = ConnectionLock(tenure_client, "nightly")
    assert booking.acquire()
    time.sleep(0.2)  # the waiter is queued
    yield
    waiter.join()
    other.close()
    booking.release()
    rw.read.release()
    for permit in permits:
        permit.release()
    lock.release()


def test_inspect_describes_every_kind(tenure_client: redis.Redis, busy: None) -> None:
    rows = {(row.kind, row.name): row for row in inspect(tenure_client)}
    lock = rows["lock", "orders"]
    assert lock.state == "held"
    assert lock.fencing_token is not None and lock.fencing_token > 0
    assert 0 < lock.holders[0]["lease_ms"] <= 30_000
    assert len(lock.waiters) == 1
    assert lock.waiters[0]["waited_ms"] >= 100
    assert rows["semaphore", "pool"].state == "2 held"
    assert rows["rwlock", "catalog"].state == "read-held x1"
    assert rows["connlock", "nightly"].holders[0]["connected"] is True
    table = render_table(list(rows.values()))
    assert "orders" in table
    assert "LONGEST WAIT" in table
    assert [r.name for r in inspect(tenure_client, prefix="po")] == ["pool"]


def test_cli_json(tenure_server: ServerProcess, busy: None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tenure", "inspect", "--url", tenure_server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    kinds = {(row["kind"], row["name"]) for row in json.loads(done.stdout)}
    assert {("lock", "orders"), ("semaphore", "pool"), ("rwlock", "catalog")} <= kinds


def test_cli_watch_refreshes(tenure_server: ServerProcess, busy: None) -> None:
    command = [sys.executable, "-m", "tenure", "inspect", "--url", tenure_server.url]
    done = subprocess.run(
        [*command, "--watch", "0.1", "--count", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("LONGEST WAIT") == 2


def test_inspect_on_a_cluster(tenure_cluster_client: redis.cluster.RedisCluster) -> None:
    held = [Lock(tenure_cluster_client, f"c{i}", thread_local=False) for i in range(6)]
    for lock in held:
        assert lock.acquire()
    names = sorted(row.name for row in inspect(tenure_cluster_client) if row.kind == "lock")
    assert names == [f"c{i}" for i in range(6)]
    for lock in held:
        lock.release()


def test_a_new_primitive_plugs_in_its_view(tenure_client: redis.Redis) -> None:
    tenure_client.set("tenure:gizmo:{g1}", "x")

    def describe(client: object, base: str, name: str, now_ms: int) -> Primitive:
        return Primitive("gizmo", name, "present")

    before = views()
    register_view(View("gizmo", "tenure:gizmo:", describe))
    try:
        assert [(r.kind, r.name) for r in inspect(tenure_client)] == [("gizmo", "g1")]
    finally:
        import tenure.inspect as module

        module._VIEWS[:] = before


def test_free_primitives_only_with_all(tenure_client: redis.Redis) -> None:
    lock = Lock(tenure_client, "done-with")
    with lock:
        assert [row.name for row in inspect(tenure_client)] == ["done-with"]
    assert inspect(tenure_client) == []  # its fencing counter lives on a while: free
    (row,) = inspect(tenure_client, include_free=True)
    assert (row.name, row.state) == ("done-with", "free")
    kwargs = tenure_client.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}"
    command = [sys.executable, "-m", "tenure.cli", "inspect", "--url", url]
    quiet = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    assert "done-with" not in quiet.stdout
    everything = subprocess.run(
        [*command, "--all"], capture_output=True, text=True, check=True, timeout=60
    )
    assert "done-with" in everything.stdout


def test_a_redlock_is_shown_as_the_master_asked_holds_it(tenure_client: redis.Redis) -> None:
    lock = Redlock([tenure_client], "report", timeout=20)
    assert lock.acquire()
    try:
        [row] = [row for row in inspect(tenure_client) if row.kind == "redlock"]
        assert (row.name, row.state, row.fencing_token) == ("report", "held", lock.fencing_token)
        assert 0 < row.holders[0]["lease_ms"] <= 20_000
    finally:
        lock.release()
    assert not [row for row in inspect(tenure_client) if row.kind == "redlock"]


def test_an_id_set_at_rest_only_with_all_and_a_compaction_always(
    tenure_client: redis.Redis,
) -> None:
    followers = IdSet(tenure_client, "followers", delta_limit=1_000)
    followers.add_many(range(0, 3_000, 3))  # past the limit: compacted
    followers.add_many([1, 2])
    assert not [row for row in inspect(tenure_client) if row.kind == "idset"]
    [row] = [row for row in inspect(tenure_client, include_free=True) if row.kind == "idset"]
    assert (row.name, row.state, row.idle) == ("followers", "1,000 (+2)", True)
    assert followers.compact()
    [row] = [row for row in inspect(tenure_client, include_free=True) if row.kind == "idset"]
    assert row.state == "1,002 ids"
    # A compactor that died holding its lease: shown until the lease runs out.
    tenure_client.set(followers.keys.lease, "deadbeef", px=60_000)
    [row] = [row for row in inspect(tenure_client) if row.kind == "idset"]
    assert row.state == "compacting" and row.holders[0]["token"] == "deadbeef"
    assert "compacting" in render_table([row])
