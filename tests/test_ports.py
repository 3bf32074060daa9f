"""Loopback ports for test servers: reserved across processes, not only within one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


_LEAVES_NOTHING = textwrap.dedent(
    """
    import os, sys
    from tenure.server import _ports

    folder = _ports._LOCK_FOLDER
    ports = [_ports.reserve_port(False), _ports.reserve_port(True)]
    held = sorted(os.listdir(folder))
    for port in ports:
        _ports.release_port(port)
    print(len(held), os.path.exists(folder))
    if sys.argv[1] == "die":  # reserved, then killed outright: its file stays, unlocked
        _ports.reserve_port(False)
        os._exit(0)
    """
)


def test_released_ports_leave_no_file_and_a_killed_owners_files_are_swept(tmp_path: Path) -> None:
    # A private TMPDIR: the test's own folder of port files, which nobody else uses.
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def run(how: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", _LEAVES_NOTHING, how],
            capture_output=True, text=True, timeout=60, check=True, env=env,
        ).stdout.strip()  # fmt: skip

    assert run("release") == "3 False"  # a port, a node and its bus port; then nothing
    assert run("die") == "3 False"
    left = list((tmp_path / f"tenure-ports-{os.getuid()}").iterdir())
    assert len(left) == 1  # the killed process's file
    assert run("release") == "3 False"  # the next process removed it, and the folder
    assert not (tmp_path / f"tenure-ports-{os.getuid()}").exists()
