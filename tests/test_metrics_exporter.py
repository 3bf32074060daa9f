"""``tenure metrics``: the Prometheus exporter, scraped over HTTP on every topology.

Most tests run the exporter in this process (:class:`Exporter`, its HTTP
server in a thread: the same object ``tenure metrics`` runs); the command
itself runs as a subprocess for SIGTERM and for its one-line errors.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.cluster
from prometheus_client.parser import text_string_to_metric_families
from redis.crc import key_slot

from tenure import CallableSource, IdSet, IngestJob, Lock, Semaphore, StreamConsumer
from tenure._tools.cli import build_parser
from tenure._tools.metrics_cli import OTHER, Exporter
from tenure.inspection import idset_sizes, ingest_jobs, stream_groups
from tenure.server import Cluster, Replicated, ServerProcess
from tests.conftest import ServerFactory, wait_for

TENURE = [sys.executable, "-m", "tenure"]
Client = redis.Redis | redis.cluster.RedisCluster
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of one scrape, by name and labels."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples[metric, tuple(sorted(labels.items()))]


@contextlib.contextmanager
def exporter(url: str, *options: str) -> Iterator[tuple[Exporter, list[str]]]:
    """``tenure metrics --url URL --port 0 OPTIONS`` running here; the lines it says."""
    said: list[str] = []
    parsed = build_parser().parse_args(["metrics", "--url", url, "--port", "0", *options])
    with Exporter(parsed, said.append) as running:
        yield running, said


@contextlib.contextmanager
def busy(client: Client, other: Client) -> Iterator[None]:
    """On any topology: a held lock with a waiter, 2 permits of a semaphore, an ingestion
    job part done with a chunk in work, a stream group with pending and dead-lettered
    messages beside a second group, and an id set."""
    with contextlib.ExitStack() as stack:
        lock = Lock(client, "orders", thread_local=False)
        assert lock.acquire()
        waiter = threading.Thread(target=_wait_in_line, args=(other, "orders"))
        waiter.start()
        stack.callback(waiter.join, 30)  # (after the release: it gets the lock, gives it back)
        stack.callback(lock.release)
        permits = [Semaphore(client, "pool", limit=3, thread_local=False) for _ in range(2)]
        for permit in permits:
            assert permit.acquire()
            stack.callback(permit.release)
        _ingestion(client, stack)
        _stream(client)
        ids = IdSet(client, "users")
        ids.add_many(range(1000))
        ids.compact()
        ids.add(5000)  # written, not compacted
        wait_for(lambda: client.zcard(lock.keys.queue) >= 1, 10, "the waiter in line")
        time.sleep(0.3)  # it has waited 0.3 s
        yield


def _wait_in_line(client: Client, name: str) -> None:
    lock = Lock(client, name)
    if lock.acquire(blocking_timeout=30):
        lock.release()


def _ingestion(client: Client, stack: contextlib.ExitStack) -> None:
    """Job ``copy``: 10 chunks of 10 rows, 3 done, 1 in work (until the stack closes), 6 free."""
    gate = threading.Event()
    gate.set()

    def fetch(first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
        gate.wait(30)
        for key in range(first, last + 1):
            yield key, {"n": key}

    source = CallableSource(fetch, low=0, high=99, name="numbers")
    assert IngestJob(client, "copy", source, chunk_size=10).work(max_chunks=3).rows == 30
    gate.clear()
    working = threading.Thread(
        target=IngestJob(client, "copy", source, chunk_size=10).work, kwargs={"max_chunks": 1}
    )
    working.start()
    stack.callback(working.join, 30)
    stack.callback(gate.set)
    job = IngestJob(client, "copy", source, chunk_size=10)
    wait_for(lambda: job.status().claimed == 1, 10, "a chunk in work")


def _stream(client: Client) -> None:
    """Stream ``{jobs}``: group ``workers`` with 2 pending and 1 dead-lettered; ``audit`` idle."""
    for n in range(3):
        client.xadd("{jobs}", {"n": n})
    client.xgroup_create("{jobs}", "audit", "0")

    def consumer(name: str, count: int) -> StreamConsumer:
        return StreamConsumer(
            client, "{jobs}", "workers", name, count=count, block=0.05, claim_idle=0.05,
            max_deliveries=1,
        )  # fmt: skip

    assert len(consumer("first", 10).read()) == 3  # read, never acknowledged
    time.sleep(0.1)  # idle past claim_idle: a second delivery is one too many
    assert consumer("second", 1).read() == []
    assert client.xlen("{jobs}:dead") == 1


def check_busy(samples: Samples) -> None:
    lock = {"kind": "lock", "name": "orders"}
    assert value(samples, "tenure_held", **lock) == 1
    assert value(samples, "tenure_waiters", **lock) == 1
    assert 0.3 <= value(samples, "tenure_oldest_wait_seconds", **lock) < 30
    pool = {"kind": "semaphore", "name": "pool"}
    assert value(samples, "tenure_held", **pool) == 2
    assert value(samples, "tenure_waiters", **pool) == 0
    assert value(samples, "tenure_oldest_wait_seconds", **pool) == 0
    chunks = {state: value(samples, "tenure_ingest_chunks", ingest_job="copy", state=state)
              for state in ("done", "claimed", "free")}  # fmt: skip
    assert chunks == {"done": 3, "claimed": 1, "free": 6}
    assert value(samples, "tenure_ingest_rows", ingest_job="copy") == 30
    workers = {"stream": "{jobs}", "group": "workers"}
    assert value(samples, "tenure_stream_pending", **workers) == 2
    assert value(samples, "tenure_stream_dead_letters", **workers) == 1
    audit = {"stream": "{jobs}", "group": "audit"}
    assert value(samples, "tenure_stream_pending", **audit) == 0
    assert value(samples, "tenure_stream_dead_letters", **audit) == 0
    assert value(samples, "tenure_idset_ids", name="users") == 1000
    assert value(samples, "tenure_idset_pending", name="users") == 1
    assert value(samples, "tenure_up") == 1
    # (the ingestion's sink and the dead letters are streams without groups: not listed)
    assert {labels for name, labels in samples if name == "tenure_stream_pending"} == {
        tuple(sorted(workers.items())),
        tuple(sorted(audit.items())),
    }


def test_standalone(tenure_client: redis.Redis, tenure_server: ServerProcess) -> None:
    other = tenure_server.client()
    with busy(tenure_client, other), exporter(tenure_server.url) as (running, said):
        check_busy(scrape(running.url))
        assert said == []
    other.close()


def test_the_inspection_readers(tenure_client: redis.Redis, tenure_server: ServerProcess) -> None:
    other = tenure_server.client()
    with busy(tenure_client, other):
        [(name, status)] = ingest_jobs(tenure_client).items()
        assert (name, status.done, status.claimed, status.free) == ("copy", 3, 1, 6)
        assert ingest_jobs(tenure_client, "elsewhere:") == {}
        groups = {group.group: group for group in stream_groups(tenure_client)}
        assert groups["audit"].lag in (3, None) and groups["audit"].consumers == 0
        assert (groups["workers"].consumers, groups["workers"].lag) == (2, 0)
        assert stream_groups(tenure_client, "other*") == []
        [users] = idset_sizes(tenure_client)
        assert (users.name, users.ids, users.pending, users.compacting) == ("users", 1000, 1, False)
    other.close()


def test_a_replica_is_read_as_its_url_says(tenure_replicated: Replicated) -> None:
    primary = tenure_replicated.primary.client()
    primary.flushall()
    other = tenure_replicated.primary.client()
    with busy(primary, other):
        primary.wait(1, 5000)  # the replica has it all
        for node in (tenure_replicated.primary, tenure_replicated.replicas[0]):
            with exporter(node.url) as (running, said):
                check_busy(scrape(running.url))
                assert said == []
    other.close()
    primary.close()


def test_a_cluster_is_read_on_every_primary(
    tenure_cluster_client: redis.cluster.RedisCluster, tenure_cluster: Cluster
) -> None:
    other = tenure_cluster.client()
    with busy(tenure_cluster_client, other):
        spread = [Lock(tenure_cluster_client, f"spread-{n}", thread_local=False) for n in range(6)]
        for lock in spread:
            assert lock.acquire()
        slots = {key_slot(lock.keys.owner.encode()) for lock in spread}
        assert len({tenure_cluster.node_for_slot(slot).port for slot in slots}) == 3
        with exporter(tenure_cluster.masters[1].url, "--cluster") as (running, said):
            samples = scrape(running.url)
            check_busy(samples)
            for n in range(6):
                assert value(samples, "tenure_held", kind="lock", name=f"spread-{n}") == 1
            assert said == []
        for lock in spread:
            lock.release()
        plain = build_parser().parse_args(["metrics", "--url", tenure_cluster.masters[0].url,
                                           "--port", "0"])  # fmt: skip
        with pytest.raises(Exception, match=r"^--cluster: .* is a cluster node: give --cluster"):
            Exporter(plain)
    other.close()


def test_max_names_lists_the_busiest_and_sums_the_rest(
    tenure_client: redis.Redis, tenure_server: ServerProcess
) -> None:
    locks = [Lock(tenure_client, name, thread_local=False) for name in "abcde"]
    for lock in locks:
        assert lock.acquire()
    other = tenure_server.client()
    waiter = threading.Thread(target=_wait_in_line, args=(other, "d"))
    waiter.start()
    try:
        wait_for(lambda: tenure_client.zcard(locks[3].keys.queue) >= 1, 10, "the waiter")
        with exporter(tenure_server.url, "--max-names", "2") as (running, _):
            samples = scrape(running.url)
            elsewhere = running.url.replace("/metrics", "/other")
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(elsewhere, timeout=10)
        listed = {dict(labels)["name"] for name, labels in samples if name == "tenure_held"}
        assert listed == {"d", "a", OTHER}  # most waiters, then most holders, then by name
        assert value(samples, "tenure_held", kind="lock", name=OTHER) == 3  # b, c and e
        assert value(samples, "tenure_waiters", kind="lock", name=OTHER) == 0
        assert value(samples, "tenure_waiters", kind="lock", name="d") == 1
    finally:
        for lock in locks:
            lock.release()
        waiter.join(30)
        other.close()


def test_the_server_going_down_and_back(tenure_server_factory: ServerFactory) -> None:
    server = tenure_server_factory()
    port = server.port
    with exporter(server.url, "--timeout", "1") as (running, said):
        assert value(scrape(running.url), "tenure_up") == 1
        server.stop()
        started = time.monotonic()
        down = scrape(running.url)
        assert time.monotonic() - started < 5
        assert value(down, "tenure_up") == 0
        assert not any(name == "tenure_held" for name, _ in down)  # nothing stale
        scrape(running.url)
        assert len(said) == 1 and said[0].startswith("tenure: metrics: cannot reach the server")
        back = tenure_server_factory(port=port)
        assert value(scrape(running.url), "tenure_up") == 1
        assert said[1:] == ["tenure: metrics: the server answers again"]
        back.pause()  # a server that hangs: the scrape waits --timeout, no more
        try:
            started = time.monotonic()
            assert value(scrape(running.url), "tenure_up") == 0
            assert time.monotonic() - started < 5
        finally:
            back.resume()
        assert said[2].startswith("tenure: metrics: the server did not answer in 1 s"), said
        assert value(scrape(running.url), "tenure_up") == 1


def _started(process: subprocess.Popen[str]) -> str:
    """The URL the command says it serves at (its first line)."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(30)
    assert line and line[0].startswith("serving tenure metrics of "), line
    return line[0].split(" at ")[1].split(";")[0]


@pytest.mark.engine_blind
def test_the_command_serves_until_sigterm(tenure_server: ServerProcess) -> None:
    process = subprocess.Popen(
        [*TENURE, "metrics", "--url", tenure_server.url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = _started(process)
        assert url.startswith("http://127.0.0.1:")
        assert value(scrape(url), "tenure_up") == 1
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert out.strip().endswith("metrics stopped") and err == ""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the port is closed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.engine_blind
def test_each_error_is_one_line(tenure_server: ServerProcess) -> None:
    url = tenure_server.url
    gone = f"redis://127.0.0.1:{_free_port()}"
    with socket.socket() as busy_port:
        busy_port.bind(("127.0.0.1", 0))
        busy_port.listen()
        taken = str(busy_port.getsockname()[1])
        cases: list[tuple[list[str], int, str]] = [
            (["--url", "notaurl", "--port", "0"], 2, "tenure: metrics: --url: "),
            (["--url", url, "--port", "0", "--cluster"], 2, "tenure: metrics: --cluster: "),
            (["--url", url, "--port", taken], 2, "tenure: metrics: --port: cannot listen on "),
            (["--url", gone, "--port", "0"], 1, "tenure: metrics: cannot reach the server: "),
            (["--url", url, "--port", "70000"], 2, "tenure: metrics --port: must be 0..65535"),
        ]
        for arguments, code, start in cases:
            done = subprocess.run(
                [*TENURE, "metrics", *arguments],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert (done.returncode, done.stdout) == (code, ""), (arguments, done.stderr)
            assert done.stderr.startswith(start) and done.stderr.count("\n") == 1, done.stderr
    without = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from tenure._tools.cli import main\n"
        f"sys.exit(main(['metrics', '--url', {url!r}, '--port', '0']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", without], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stderr == (
        'tenure: metrics: tenure metrics needs prometheus-client: pip install "tenure[metrics]"\n'
    )
