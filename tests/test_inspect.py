"""``tenure inspect``: primitives found with SCAN and described by their views."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import cast

import pytest
import redis
import redis.cluster

from tenure import Cache, ConnectionLock, IdSet, Lock, ReadWriteLock, Redlock, Semaphore
from tenure.inspection import (
    TABLE_WIDTH,
    Primitive,
    View,
    elide,
    inspect,
    near_tracking,
    register_view,
    render_table,
    views,
)
from tenure.server import ServerProcess
from tests.conftest import wait_for, wait_server_past


@pytest.fixture
def busy(tenure_client: redis.Redis, tenure_server: ServerProcess) -> Iterator[None]:
    """A held lock with a waiter, a semaphore, a read-write lock and a connection lock."""
    lock = Lock(tenure_client, "orders", thread_local=False, owner_name="billing-worker")
    assert lock.acquire()
    other = tenure_server.client()

    def wait_in_line() -> None:  # until the fixture's lock is released, then pass it on
        queued = Lock(other, "orders", owner_name="next-in-line")
        if queued.acquire(blocking_timeout=30):
            queued.release()

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    permits = [Semaphore(tenure_client, "pool", limit=3, thread_local=False) for _ in range(2)]
    for permit in permits:
        assert permit.acquire()
    rw = ReadWriteLock(tenure_client, "catalog")
    assert rw.read.acquire()
    booking = ConnectionLock(tenure_client, "nightly", owner_name="cron")
    assert booking.acquire()
    wait_for(lambda: tenure_client.zcard(lock.keys.queue) >= 1, 10, "the waiter in line")
    line = tenure_client.zrange(lock.keys.queue, 0, 0, withscores=True)
    ((_, arrived_us),) = cast("list[tuple[bytes, float]]", line)
    # it has waited 100 ms (arrival in µs, server clock), which inspect() shows
    wait_server_past(tenure_client, arrived_us / 1000 + 100, 5, "a 100 ms wait")
    yield
    booking.release()
    rw.read.release()
    for permit in permits:
        permit.release()
    lock.release()
    waiter.join()
    other.close()


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
    assert "LONGEST" in table
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
    rows = {(row["kind"], row["name"]): row for row in json.loads(done.stdout)}
    assert {("lock", "orders"), ("semaphore", "pool"), ("rwlock", "catalog")} <= set(rows)
    [holder] = rows["lock", "orders"]["holders"]
    assert holder["owner"] == "billing-worker"
    assert len(holder["token"]) == 32  # the token too, beside the name
    [waiter] = rows["lock", "orders"]["waiters"]
    assert waiter["owner"] == "next-in-line" and waiter["token"]
    assert rows["connlock", "nightly"]["holders"][0]["owner"] == "cron"


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
    assert done.stdout.count("LONGEST") == 2


def test_inspect_on_a_cluster(tenure_cluster_client: redis.cluster.RedisCluster) -> None:
    held = [Lock(tenure_cluster_client, f"c{i}", thread_local=False) for i in range(6)]
    for lock in held:
        assert lock.acquire()
    names = sorted(row.name for row in inspect(tenure_cluster_client) if row.kind == "lock")
    assert names == [f"c{i}" for i in range(6)]
    for lock in held:
        lock.release()


def test_names_with_their_own_hash_tag_are_listed_as_given(
    tenure_cluster_client: redis.cluster.RedisCluster,
) -> None:
    held = [
        Lock(tenure_cluster_client, name, thread_local=False)
        for name in ("lock:{user42}", "{user42}", "user42", "job[1]*?")
    ]
    for lock in held:
        assert lock.acquire()
    rows = inspect(tenure_cluster_client)
    assert sorted(row.name for row in rows) == sorted(lock.name for lock in held)
    assert all(row.state == "held" for row in rows)
    assert [row.name for row in inspect(tenure_cluster_client, "lock:{")] == ["lock:{user42}"]
    assert [row.name for row in inspect(tenure_cluster_client, "job[1]")] == ["job[1]*?"]
    for lock in held:
        lock.release()


def test_the_table_escapes_what_a_terminal_would_act_on(tenure_client: redis.Redis) -> None:
    lock = Lock(tenure_client, "evil\n\x1b[31mred\tname", thread_local=False)
    assert lock.acquire()
    table = render_table(inspect(tenure_client))
    assert "\x1b" not in table and "\t" not in table
    assert len(table.splitlines()) == 3  # header, rule, one row
    assert "evil\\n\\x1" in table  # escaped (and cut to the column's width)
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
        import tenure.inspection as module

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
    command = [sys.executable, "-m", "tenure._tools.cli", "inspect", "--url", url]
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
    assert row.holders[0]["owner"] is None  # a lease without a name (tenure 0.1.0 wrote those)
    assert "compacting" in render_table([row])
    # What compact() writes: its token, then who compacts (host:pid).
    tenure_client.set(followers.keys.lease, "deadbeef worker-7:4242", px=60_000)
    [row] = [row for row in inspect(tenure_client) if row.kind == "idset"]
    assert (row.holders[0]["token"], row.holders[0]["owner"]) == ("deadbeef", "worker-7:4242")
    assert "worker-7:4242" in render_table([row])


HOST_PID = f"{socket.gethostname()}:{os.getpid()}"


def test_holders_are_shown_by_owner_name(tenure_client: redis.Redis, busy: None) -> None:
    """A name given with owner_name=, else host:pid, for every kind; tokens stay in the rows."""
    rows = {(row.kind, row.name): row for row in inspect(tenure_client)}
    assert rows["lock", "orders"].holders[0]["owner"] == "billing-worker"
    assert rows["lock", "orders"].waiters[0]["owner"] == "next-in-line"
    assert [h["owner"] for h in rows["semaphore", "pool"].holders] == [HOST_PID, HOST_PID]
    assert rows["rwlock", "catalog"].holders[0]["owner"] == HOST_PID
    assert rows["connlock", "nightly"].holders[0]["owner"] == "cron"
    table = render_table(list(rows.values()))
    assert "billing-worker (" in table and HOST_PID in table and "cron" in table
    assert "next-in-line" in render_table(list(rows.values()), wide=True)


def test_a_handed_over_hold_carries_the_waiters_name(tenure_client: redis.Redis) -> None:
    holder = Lock(tenure_client, "handed", thread_local=False, owner_name="first")
    sem_holder = Semaphore(tenure_client, "handed-sem", limit=1, owner_name="sem-first")
    assert holder.acquire() and sem_holder.acquire()
    waiter = Lock(tenure_client, "handed", owner_name="second")
    sem_waiter = Semaphore(tenure_client, "handed-sem", limit=1, owner_name="sem-second")
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(waiter.acquire(blocking_timeout=5))),
        threading.Thread(target=lambda: results.append(sem_waiter.acquire(blocking_timeout=5))),
    ]
    for thread in threads:
        thread.start()
    wait_for(  # both waiters in line
        lambda: (
            tenure_client.zcard(holder.keys.queue) + tenure_client.zcard(sem_holder.keys.queue) == 2
        ),
        10,
        "the two waiters in line",
    )
    holder.release()
    sem_holder.release()
    for thread in threads:
        thread.join()
    assert results == [True, True]
    rows = {row.name: row for row in inspect(tenure_client)}
    assert [h["owner"] for h in rows["handed"].holders] == ["second"]
    assert [h["owner"] for h in rows["handed-sem"].holders] == ["sem-second"]
    assert tenure_client.hget("tenure:lock:{handed}", "owner") == b"second"
    assert not tenure_client.exists("tenure:lock:{handed}:names")  # no waiter is left
    waiter.release()  # the threads that acquired finished: their holds are orphans
    sem_waiter.release()


def test_owner_names_leave_no_key_behind(tenure_client: redis.Redis) -> None:
    with Lock(tenure_client, "tidy", owner_name="a"):
        pass
    with Semaphore(tenure_client, "tidy-sem", limit=2, owner_name="b"):
        pass
    rw = ReadWriteLock(tenure_client, "tidy-rw", owner_name="c")
    with rw.write:
        rw.write.downgrade()
        [row] = [row for row in inspect(tenure_client) if row.name == "tidy-rw"]
        assert [h["owner"] for h in row.holders] == ["c"]
    with ConnectionLock(tenure_client, "tidy-conn", owner_name="d"):
        pass
    left = {key.decode() for key in tenure_client.scan_iter(match="tenure:*")}
    # a ConnectionLock's release leaves a receipt for a resent release, not a name
    receipt = tenure_client.get("tenure:connlock:{tidy-conn}:owner")
    assert isinstance(receipt, bytes) and receipt.startswith(b"released:")
    assert 0 < tenure_client.pttl("tenure:connlock:{tidy-conn}:owner") <= 60_000
    left.discard("tenure:connlock:{tidy-conn}:owner")
    assert not [key for key in left if key.endswith((":names", ":owners", ":owner"))]


def test_a_redlock_holder_is_named(tenure_client: redis.Redis) -> None:
    lock = Redlock([tenure_client], "named-report", timeout=20, owner_name="reporter")
    with lock:
        [row] = [row for row in inspect(tenure_client) if row.kind == "redlock"]
        assert row.holders[0]["owner"] == "reporter"


def _long_rows() -> list[Primitive]:
    long_name = "n" * 150
    owner = "ip-10-0-0-1.eu-west-1.compute.internal.example.com:4242"
    holders = [{"token": f"t{i}", "owner": owner, "lease_ms": 29_500} for i in range(3)]
    waiters = [{"token": "w", "owner": "x" * 200, "waited_ms": 1_234_567}]
    return [
        Primitive("semaphore", long_name, "3 held", 1795617030257015, holders, waiters),
        Primitive("lock", "short", "held", 7, holders[:1]),
        Primitive("rwlock", long_name, "read-held x1234567", None, holders[:1]),
        Primitive("connlock", "c", "stale", None, [{"id": "99", "owner": None, "lease_ms": -1}]),
    ]


def test_the_table_fits_100_columns_and_wide_shows_everything() -> None:
    rows = _long_rows()
    lines = render_table(rows).splitlines()
    assert TABLE_WIDTH == 100
    assert max(len(line) for line in lines) <= 100
    assert any("…:4242 (29.5s) +2" in line for line in lines)  # the pid kept, the others counted
    assert any(line.startswith("connlock  c") and "99 (no lease)" in line for line in lines)
    wide = render_table(rows, wide=True)
    assert "n" * 150 in wide and "x" * 200 in wide
    assert wide.count("ip-10-0-0-1.eu-west-1.compute.internal.example.com:4242 (29.5s)") == 5
    assert max(len(line) for line in wide.splitlines()) > 100
    assert elide("abcdef", 4) == "ab…f" and elide("abc", 4) == "abc"
    assert elide("some.host.name:12", 10) == "some.h…:12"


def test_cli_table_width_and_wide(tenure_server: ServerProcess, tenure_client: redis.Redis) -> None:
    long_name = "a-very-long-primitive-name-" * 4
    lock = Lock(tenure_client, long_name, thread_local=False, owner_name="w" * 150)
    assert lock.acquire()
    try:
        command = [sys.executable, "-m", "tenure", "inspect", "--url", tenure_server.url]
        narrow = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        assert max(len(line) for line in narrow.stdout.splitlines()) <= 100
        assert long_name not in narrow.stdout
        wide = subprocess.run(
            [*command, "--wide"], capture_output=True, text=True, timeout=60, check=True
        )
        assert long_name in wide.stdout and "w" * 150 in wide.stdout
    finally:
        lock.release()


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        (["--count", "2"], "tenure: inspect: --count: counts --watch rounds: give --watch too"),
        (["--wide", "--json"], "tenure: inspect: --wide:"),
    ],
)
def test_cli_refuses_options_that_do_nothing(
    tenure_server: ServerProcess, extra: list[str], refusal: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tenure", "inspect", "--url", tenure_server.url, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(refusal) and done.stderr.count("\n") == 1, done.stderr


def test_cli_help_names_what_it_shows() -> None:
    from tenure._tools.cli import build_parser

    parser = build_parser()
    [look] = [
        action.choices["inspect"]
        for action in parser._actions
        if isinstance(action.choices, dict) and "inspect" in action.choices
    ]
    text = " ".join(look.format_help().split())
    for shown in ("Redlocks", "id sets", "semaphores", "read-write locks", "connection locks"):
        assert shown in text
    assert "host:pid" in text and "--wide" in text


NEAR_PROCESS = """
import sys, time, redis, tenure
client = redis.Redis.from_url(sys.argv[1])
cache = tenure.Cache(client, "inspect-near", near=True)
cache.set("k", 1)
while not cache.statistics().near_hits:
    cache.get("k")
    time.sleep(0.01)
print("near", flush=True)
sys.stdin.read()
"""


def test_inspect_near_lists_the_processes_that_near_cache(tenure_server: ServerProcess) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", NEAR_PROCESS, tenure_server.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    command = [sys.executable, "-m", "tenure", "inspect", "--near", "--url", tenure_server.url]
    who = f"{socket.gethostname()}:{process.pid}"
    try:
        assert process.stdout is not None and process.stdout.readline() == "near\n"
        table = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        assert who in table.stdout and "tenure process(es) near-caching" in table.stdout
        done = subprocess.run(
            [*command, "--json"], capture_output=True, text=True, timeout=60, check=True
        )
        [server] = json.loads(done.stdout)
        assert server["tracking_clients"] >= 1 and server["prefixes"] >= 1
        [idle] = [idle for name, _, idle in server["processes"] if name == who]
        assert idle <= 1  # pinging
    finally:
        process.communicate("", timeout=30)
    admin = tenure_server.client()

    def gone() -> bool:
        return who not in [name for name, _, _ in near_tracking(admin)[0].processes]

    wait_for(gone, 5, "its connection gone with it")
    admin.close()


def test_near_tracking_on_a_cluster(tenure_cluster_client: redis.cluster.RedisCluster) -> None:
    cache = Cache(tenure_cluster_client, "inspect-near-cluster", near=True)
    cache.set("k", 1)
    cache.get("k")
    mine = f"{socket.gethostname()}:{os.getpid()}"

    def every_primary() -> bool:
        found = near_tracking(tenure_cluster_client)
        return len(found) == 3 and all(mine in [p[0] for p in s.processes] for s in found)

    wait_for(every_primary, 5, "this process tracking on every primary")
