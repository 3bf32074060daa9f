"""Redlock under real faults: processes contending with a master cut off, masters killed and
restarted without persistence (the known Redlock caveat, and what fencing does about it).

Each test starts its own three servers when it kills or restarts them; the
contract tests (tests/_async/test_redlock.py) cover slow and refused masters.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure import QuorumError, Redlock
from tenure.server import FaultProxy, ServerProcess
from tenure.testing import ProxyFactory
from tests.conftest import ServerFactory, wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_exclusion_holds_over_thousands_of_cycles_with_a_master_cut_off(
    redlock_servers: tuple[ServerProcess, ...], tenure_proxy_factory: ProxyFactory, tmp_path: Path
) -> None:
    for server in redlock_servers:
        with server.client() as client:
            client.flushall()
    proxies = [tenure_proxy_factory(server) for server in redlock_servers]
    proxies[0].blackhole()  # unreachable: connections open, nothing answers
    ports = ",".join(str(proxy.port) for proxy in proxies)
    outs = [tmp_path / f"worker{i}.jsonl" for i in range(3)]
    workers = [
        subprocess.Popen(
            # 800 cycles each, or 45 s: a machine whose cores are both busy
            # elsewhere makes about half of them in 20 s.
            [sys.executable, "-m", "tests.redlock_worker", ports, "45", "800", str(out)],
            cwd=ROOT,
        )
        for out in outs
    ]
    for worker in workers:
        assert worker.wait(timeout=90) == 0
    records = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    holds = sorted((r for r in records if "start" in r), key=lambda r: r["start"])
    problems = [r for r in records if "start" not in r]

    # Liveness: a call may fail on a machine so busy that two masters do not answer
    # in master_timeout (an acquire's QuorumError or timeout; a release's QuorumError,
    # whose hold then ends with its lease), but rarely; a worker may stop at its 45 s
    # before its 800th hold. On a CI machine starved for seconds both live masters
    # missed the last fraction of a waiter's second more than once in fifty holds:
    # one in ten is the bound. Safety (below) holds whatever the load.
    def under_load(record: dict[str, Any]) -> bool:
        error = record.get("error", record.get("release_error", ""))
        return "timeout" in record or str(error).startswith("QuorumError")

    assert all(under_load(r) for r in problems), problems
    assert len(problems) <= len(holds) // 10, problems[:5]
    assert len(holds) >= 1000, len(holds)
    for before, after in itertools.pairwise(holds):
        assert after["start"] >= before["end"], f"two holds overlap: {before} {after}"
        assert after["fence"] > before["fence"], f"fences out of order: {before} {after}"


def test_a_majority_killed_fails_fast_naming_the_masters(
    tenure_server_factory: ServerFactory,
) -> None:
    servers = [tenure_server_factory(name=f"master{i}") for i in range(3)]
    clients = [server.client(socket_timeout=0.5) for server in servers]
    lock = Redlock(clients, "killed", timeout=10, blocking_timeout=30)
    assert lock.acquire()
    lock.release()
    servers[0].kill()
    servers[2].kill()
    started = time.monotonic()
    with pytest.raises(QuorumError) as caught:
        lock.acquire()
    # a few attempts, not the 30 s blocking timeout (a busy 2-core machine took 2.2 s)
    assert time.monotonic() - started < 10.0
    failures = caught.value.failures
    killed = {lock.masters[0], lock.masters[2]}
    assert killed <= set(failures)
    # The live master is named too only if it was slow to answer (a busy machine).
    for where in set(failures) - killed:
        assert any(slow in failures[where] for slow in ("no answer", "Timeout", "not answering"))
    failed = len(failures)
    assert f"{failed} of 3 masters failed and a quorum needs 2 ({lock.masters[0]}" in str(
        caught.value
    )


def _masters(
    factory: ServerFactory, proxies: ProxyFactory, *, appendonly: bool = False
) -> tuple[list[ServerProcess], list[FaultProxy]]:
    servers = [factory(name=f"master{i}", appendonly=appendonly) for i in range(3)]
    return servers, [proxies(server) for server in servers]


def _clients(proxies: list[FaultProxy]) -> list[redis.Redis]:
    # No retries: redis-py resends a command after a connection error, so an
    # acquire sent into a partition would otherwise land when it heals (the
    # reset that ends the partition is such an error), and the tests need the
    # partitioned master to have missed it.
    return [proxy.client(socket_timeout=0.5, retry=Retry(NoBackoff(), 0)) for proxy in proxies]


def test_a_restart_without_persistence_can_give_a_second_holder_with_a_larger_fence(
    tenure_server_factory: ServerFactory, tenure_proxy_factory: ProxyFactory
) -> None:
    servers, proxies = _masters(tenure_server_factory, tenure_proxy_factory)
    told: list[float] = []
    # A lease long enough for a starved CI worker: the first holder's renewal
    # (every lease / 3) must not come before the second holder is in, and the
    # restart plus the second acquire took over a second there (twice in CI).
    lease = 6.0
    # master_timeout at its most (a tenth of the lease): a CI worker starved for half a
    # second made every master miss the default 0.1 s four attempts in a row.
    first = Redlock(
        _clients(proxies),
        "caveat",
        timeout=lease,
        master_timeout=lease / 10,
        auto_renew=True,
        on_lost=lambda _lock: told.append(time.monotonic()),
    )
    proxies[2].blackhole()  # master 2 is away: the hold is on masters 0 and 1
    assert first.acquire()
    first_fence = first.fencing_token
    assert first_fence is not None
    # Master 0 restarts without persistence (it forgets the hold and its
    # counter); master 2 comes back. Masters 0 and 2 now make a quorum that
    # knows nothing of the first hold.
    servers[0].restart()
    proxies[2].clear()
    proxies[2].reset_connections()
    second = Redlock(_clients(proxies), "caveat", timeout=lease, master_timeout=lease / 10)
    asked = time.monotonic()
    acquired = second.acquire(blocking_timeout=lease / 3)
    assert acquired, (time.monotonic() - asked, second.statistics(), first.statistics())
    both = time.monotonic()
    assert not first.lost  # two holders at once: the caveat
    # Fencing sees it: the second holder's token is larger (master 0's counter
    # restarted from its clock), so a store that checks fences refuses the first.
    assert second.fencing_token is not None and second.fencing_token > first_fence
    # The first holder's next renewal finds a quorum refusing it: it is told.
    wait_for(lambda: bool(told), lease, "the first holder being told")
    # Renewals run every lease / 3; a busy machine may make one of them late,
    # never two (told before the lease it believed it had could run out).
    assert told[0] - both < 2 * lease / 3 + 0.5
    assert first.statistics().lost == 1
    second.release()


def test_a_restart_with_persistence_keeps_the_hold(
    tenure_server_factory: ServerFactory, tenure_proxy_factory: ProxyFactory
) -> None:
    servers, proxies = _masters(tenure_server_factory, tenure_proxy_factory, appendonly=True)
    # A tenth of the lease to answer: a starved CI worker made all three masters
    # miss the default 0.1 s (master 2 is blackholed next, but not yet).
    first = Redlock(_clients(proxies), "kept", timeout=10, master_timeout=1.0)
    proxies[2].blackhole()
    assert first.acquire()
    servers[0].restart()  # the AOF brings the hold back
    proxies[2].clear()
    proxies[2].reset_connections()
    # What is under test is the hold kept, not speed: a master just restarted on
    # a busy machine may take longer than the default master_timeout to answer.
    second = Redlock(_clients(proxies), "kept", timeout=10, master_timeout=1.0)
    assert not second.acquire(blocking=False)
    first.release()
    assert second.acquire(blocking=False)
    assert second.fencing_token is not None and first.fencing_token is None
    second.release()
