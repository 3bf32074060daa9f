"""A server whose clock jumps: what leases and fencing tokens do (libfaketime).

The server runs under libfaketime (``LD_PRELOAD``) reading its offset from
a file, so a test moves that one server's wall clock while it runs; its
monotonic clock is left alone, as a stepped system clock would leave it.
Debian's package ``faketime`` provides the library; CI installs it and sets
``TENURE_REQUIRE_FAKETIME=1`` so that these tests fail rather than skip.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import pytest

from tenure import Lock, Redlock
from tenure.server import Engine, ServerProcess
from tests.conftest import ServerFactory, reporting_lock, wait_for

pytestmark = pytest.mark.slow


def _libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if found:
        return found[0]
    if os.environ.get("TENURE_REQUIRE_FAKETIME"):
        pytest.fail("libfaketime is required (apt-get install faketime)")
    pytest.skip("libfaketime is not installed (apt-get install faketime)")


def server_with_clock(factory: ServerFactory, engine: Engine, clock: Path) -> ServerProcess:
    """A server whose wall clock is offset by what ``clock`` says ("+60", "-3600")."""
    if engine.name == "redis":
        pytest.skip(
            "Debian's redis-server is built with jemalloc, whose start-up calls to "
            "clock_gettime libfaketime cannot wrap; the clock tests run on Valkey"
        )
    clock.write_text("+0")
    return factory(
        env={
            "LD_PRELOAD": _libfaketime(),
            "FAKETIME_TIMESTAMP_FILE": str(clock),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
    )


def test_a_server_clock_jumping_forward_ends_the_lease_and_the_holder_is_told(
    tenure_server_factory: ServerFactory, tenure_engine: Engine, tmp_path: Path
) -> None:
    clock = tmp_path / "clock"
    server = server_with_clock(tenure_server_factory, tenure_engine, clock)
    with server.client() as client, server.client() as other_client:
        before = client.time()[0]
        lease = 6.0
        holder, told = reporting_lock(client, "jump", lease)
        assert holder.acquire()
        fence = holder.fencing_token
        assert fence is not None
        clock.write_text("+120")  # the server's clock steps two minutes ahead
        jumped = time.monotonic()
        assert client.time()[0] >= before + 110
        other = Lock(other_client, "jump")
        assert other.acquire(blocking=False)  # by the server's clock the lease is over
        assert other.fencing_token is not None and other.fencing_token > fence
        wait_for(lambda: bool(told), lease, "the lost notice")
        assert holder.lost
        assert told[0] - jumped <= lease / 3 + 0.5  # told at its next renewal
        other.release()


def test_a_server_clock_stepped_back_stretches_leases_and_can_repeat_fences(
    tenure_server_factory: ServerFactory, tenure_engine: Engine, tmp_path: Path
) -> None:
    clock = tmp_path / "clock"
    server = server_with_clock(tenure_server_factory, tenure_engine, clock)
    with server.client() as client:
        first = Lock(client, "back", timeout=1)
        assert first.acquire()
        fence = first.fencing_token
        assert fence is not None
        clock.write_text("-3600")  # an hour back: the lease now ends an hour later
        time.sleep(1.3)
        assert Lock(client, "back").locked()  # still held past its 1 s lease
        # As if its holder had released it and the marker holding the last
        # fence had idled out (a minute of the server's time): the next token
        # restarts from the server's clock, an hour behind, the documented case
        # where tokens can go backwards.
        client.delete(first.keys.owner)
        second = Lock(client, "back", timeout=1)
        assert second.acquire()
        assert second.fencing_token is not None and second.fencing_token < fence
        second.release()


def test_redlock_fences_go_backwards_only_when_a_quorum_lost_its_counters_on_clocks_behind(
    tenure_server_factory: ServerFactory, tenure_engine: Engine, tmp_path: Path
) -> None:
    # Three masters; masters 1 and 2 run an hour behind master 0.
    clocks = [tmp_path / f"clock{i}" for i in range(3)]
    servers = [server_with_clock(tenure_server_factory, tenure_engine, c) for c in clocks]
    for clock in clocks[1:]:
        clock.write_text("-3600")
    clients = [server.client(socket_timeout=0.5) for server in servers]
    servers[2].pause()  # the first hold is on masters 0 and 1
    first = Redlock(clients, "backwards", timeout=5)
    assert first.acquire()
    high = first.fencing_token
    assert high is not None
    with servers[1].client() as direct:
        assert int(direct.get("tenure:redlock:{backwards}:fence")) == high  # sealed
    first.release()
    servers[2].resume()
    # Masters 1 and 2 (a quorum) lose their counters; master 0, the one that
    # issued the high fence, is gone. Their counters restart from their own
    # clocks, an hour behind: the next fence is lower. (With one of the two
    # keeping its counter, or clocks in step, it would be higher: see
    # _async/test_redlock.py and test_redlock_faults.py.)
    servers[1].restart()
    servers[2].restart()
    servers[0].kill()
    second = Redlock([server.client(socket_timeout=0.5) for server in servers], "backwards")
    assert second.acquire()
    assert second.fencing_token is not None and second.fencing_token < high
    second.release()
