"""Failovers with real processes: what a ClusterLock keeps and what a Lock loses.

Each test starts its own topology (they kill and pause its processes):
Sentinel over a primary and one replica, or a 3-master cluster with one
replica per master. A primary is killed with SIGKILL; Sentinel or the
cluster promotes its replica by itself.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tenure import ClusterLock, Lock, ReplicationError
from tenure.server import Cluster, Engine, Replicated, Sentinel
from tenure.testing import ProxyFactory
from tests.conftest import ServerFactory, reporting_lock, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_an_acknowledged_lock_survives_a_sentinel_failover(tenure_engine: Engine) -> None:
    with Sentinel(replicas=1, sentinels=1, engine=tenure_engine) as topology:
        holder_client = topology.master_client(socket_timeout=1.0)
        other_client = topology.master_client(socket_timeout=1.0)
        # auto_renew: a fixed timeout alone is never renewed (redis-py's rule)
        lock = ClusterLock(holder_client, "survivor", timeout=9, auto_renew=True)  # every 3 s
        assert lock.acquire()
        fence = lock.fencing_token
        assert fence is not None
        old = topology.master_address()
        topology.primary.kill()
        wait_for(lambda: topology.master_address() != old, 30, "the promotion")
        wait_for(lambda: bool(other_client.ping()), 30, "the new primary answering")
        # The promoted replica acknowledged the acquisition: it holds the lock.
        other = ClusterLock(other_client, "survivor", replica_timeout=0.2, min_replicas=0)
        assert not other.acquire(blocking=False)
        renewed = lock.statistics().renewals
        # A renewal reaches the new primary through the client's reconnect (its
        # replicas counted again after the failover), before the 9 s lease ends.
        wait_for(lambda: lock.statistics().renewals > renewed, 9, "a renewal on the new primary")
        assert not lock.lost
        assert lock.owned()
        lock.release()
        assert other.acquire(blocking=False)
        assert other.fencing_token is not None and other.fencing_token > fence
        other.release()
        holder_client.close()
        other_client.close()


def test_a_lock_lost_in_a_failover_is_reported_within_a_third_of_its_lease(
    tenure_engine: Engine, tenure_proxy_factory: ProxyFactory
) -> None:
    # The replica replicates through a proxy that is then cut (a partition
    # between primary and replica); clients reach the primary through an
    # endpoint that moves to the promoted replica (a virtual IP, a DNS name).
    with Replicated(replicas=1, engine=tenure_engine) as servers:
        primary, replica = servers.primary, servers.replicas[0]
        link = tenure_proxy_factory(primary)
        endpoint = tenure_proxy_factory(primary)
        with replica.client() as direct:
            direct.execute_command("REPLICAOF", link.host, link.port)
        wait_for(
            lambda: replica.info("replication").get("master_link_status") == "up",
            20,
            "replication through the proxy",
        )
        link.blackhole()  # replication cut: nothing written from now on reaches the replica
        client = endpoint.client(socket_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ReplicationError, match="0 of 1"):
            ClusterLock(client, "cut", replica_timeout=0.3).acquire()
        assert time.monotonic() - started < 1.5  # refused within replica_timeout
        assert not ClusterLock(client, "cut").locked()
        lease = 6.0
        plain, told = reporting_lock(client, "unreplicated", lease)
        assert plain.acquire()  # a Lock counts with the primary alone (documented)
        primary.kill()
        with replica.client() as direct:
            direct.execute_command("REPLICAOF", "NO", "ONE")
        endpoint.retarget(*replica.address)
        failed_over = time.monotonic()
        wait_for(lambda: bool(told), lease, "the lost notice")
        assert plain.lost
        # Renewals run at a third of the lease at the latest; add one reconnect.
        assert told[0] - failed_over <= lease / 3 + 0.5
        other = Lock(endpoint.client(), "unreplicated")
        assert other.acquire(blocking=False)  # the promoted replica never had it
        other.release()
        client.close()


def test_a_lock_the_server_forgot_is_reported_within_a_third_of_its_lease(
    tenure_server_factory: ServerFactory,
) -> None:
    # A restart without persistence forgets every lock, as a failover to a
    # replica that never received it would: the holder's next renewal finds
    # it gone. (A replica paused with SIGSTOP still reads what the primary
    # had already sent once resumed, so it cannot stand for a lagging one.)
    server = tenure_server_factory()
    client = server.client()
    lease = 6.0
    lock, told = reporting_lock(client, "forgotten", lease)
    assert lock.acquire()
    server.restart()
    restarted = time.monotonic()
    wait_for(lambda: bool(told), lease, "the lost notice")
    assert lock.lost
    # Renewals run at a third of the lease at the latest; add one reconnect.
    assert told[0] - restarted <= lease / 3 + 0.5
    other = Lock(server.client(), "forgotten")
    assert other.acquire(blocking=False)  # the lock is free: the holder was told
    other.release()
    client.close()


def test_an_acknowledged_lock_survives_a_cluster_failover(tenure_engine: Engine) -> None:
    with Cluster(masters=3, replicas_per_master=1, engine=tenure_engine) as cluster:
        client = cluster.client()
        lock = ClusterLock(client, "slot-owner", timeout=15, auto_renew=True)  # every 5 s
        assert lock.acquire()
        fence = lock.fencing_token
        assert fence is not None
        primary = cluster.node_for_key(lock.keys.owner)
        (replica,) = cluster.replicas_of(primary)
        primary.kill()

        def promoted() -> bool:
            with replica.client() as direct:
                return bool(direct.execute_command("ROLE")[0] in (b"master", "master"))

        wait_for(promoted, 30, "the cluster failover")
        fresh = cluster.client()
        try:
            wait_for(lambda: fresh.exists(lock.keys.owner) == 1, 10, "the new primary answering")
            other = ClusterLock(fresh, "slot-owner", min_replicas=0)
            assert not other.acquire(blocking=False)
            renewed = lock.statistics().renewals
            wait_for(  # a renewal finds the new primary (MOVED / reconnect)
                lambda: lock.statistics().renewals > renewed, 15, "a renewal on the new primary"
            )
            assert not lock.lost
            lock.release()
            assert other.acquire(blocking=False)
            assert other.fencing_token is not None and other.fencing_token > fence
            other.release()
        finally:
            fresh.close()
            client.close()


def test_no_two_holds_overlap_through_a_sentinel_failover(
    tenure_engine: Engine, tmp_path: Path
) -> None:
    with Sentinel(replicas=1, sentinels=1, engine=tenure_engine) as topology:
        sentinel_port = topology.sentinels[0].port
        outputs = [tmp_path / f"worker-{index}.jsonl" for index in range(3)]
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.failover_worker",
                    str(sentinel_port),
                    topology.service_name,
                    "9",
                    str(out),
                ],
                cwd=ROOT,
            )
            for out in outputs
        ]
        try:
            with topology.master_client() as primary:  # cycles run before the failover
                owner = ClusterLock(primary, "cycles").keys.owner
                seen: list[int] = []  # the fences (one per hold) seen in the owner hash

                def thirty_holds() -> bool:
                    fence = int(primary.hget(owner, "fence") or 0)
                    if fence:
                        seen.append(fence)
                    return bool(seen) and seen[-1] - seen[0] >= 30

                wait_for(thirty_holds, 60, "30 holds")
            old = topology.master_address()
            topology.primary.kill()
            wait_for(lambda: topology.master_address() != old, 30, "the promotion")
            for worker in workers:
                assert worker.wait(timeout=60) == 0
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        holds = []
        for out in outputs:
            for line in out.read_text().splitlines():
                record = json.loads(line)
                if "start" in record:
                    holds.append((record["start"], record["end"], record["fence"]))
        holds.sort()
        assert len(holds) > 50  # cycles ran before and after the failover
        assert holds[-1][0] > holds[0][0] + 5
        for (_, end, fence), (start, _, next_fence) in itertools.pairwise(holds):
            assert start >= end, "two acknowledged holds overlapped"
            assert next_fence > fence  # fencing tokens kept growing through the failover
