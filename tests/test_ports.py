"""Loopback ports for test servers: reserved across processes, not only within one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tenure.server import _ports
from tenure.server._ports import release_port, reserve_port

_OTHER_PROCESS = textwrap.dedent(
    """
    import sys
    from tenure.server import _ports

    wanted = [int(sys.argv[1]), int(sys.argv[2])]
    draws = iter(wanted + [int(sys.argv[3])] * 10)
    _ports._RANDOM.randrange = lambda low, high: next(draws)
    print(_ports.reserve_port(False))
    """
)


def _other_process_reserves(first: int, second: int, fallback: int) -> int:
    """The port another process is handed when its first draws are ``first``, ``second``."""
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(first), str(second), str(fallback)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout)


def test_a_port_reserved_here_is_not_handed_out_by_another_process() -> None:
    """A killed server keeps its port reserved; another process (a parallel test
    worker) must not start a server on it and answer in its place."""
    held = reserve_port(False)
    spare = reserve_port(False)
    release_port(spare)  # free, and reserved by nobody: what the other process gets
    try:
        assert _other_process_reserves(held, held, spare) == spare
    finally:
        release_port(held)
    # Released: the other process may have it.
    assert _other_process_reserves(held, spare, spare) == held


def test_a_cluster_nodes_bus_port_is_reserved_with_it() -> None:
    node = reserve_port(True)
    try:
        bus = node + 10000
        fallback = reserve_port(False)
        release_port(fallback)
        assert _other_process_reserves(bus, bus, fallback) == fallback
    finally:
        release_port(node)
    assert node not in _ports._RESERVED_PORTS
