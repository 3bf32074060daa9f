"""A lock whose cluster slot is resharded while threads hammer it (issue 39, item 7).

While a slot moves (``CLUSTER SETSLOT ... MIGRATING``, its keys sent one at a
time with ``MIGRATE``), a node answers TRYAGAIN or ASK to a script on several of
the slot's keys, and redis-py's cluster client gives up after its request TTL.
tenure asks again until the move ends: the lock keeps working, exclusion holds,
and what cannot finish in time says a slot is moving, changing nothing.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot

import tenure._sync._scripting as scripting
from tenure import BackendError, Lock
from tenure.server import Cluster, Engine, ServerProcess
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tenure_engine: Engine) -> Iterator[Cluster]:
    """A private 3-master cluster: its slots are moved here."""
    with Cluster(masters=3, engine=tenure_engine) as topology:
        yield topology


class _Move:
    """One slot on its way from the node that owns it to another master."""

    def __init__(self, cluster: Cluster, slot: int) -> None:
        self.cluster, self.slot = cluster, slot
        self.source = cluster.node_for_slot(slot)
        self.target = next(node for node in cluster.masters if node is not self.source)

    def _command(self, node: ServerProcess, *args: object) -> object:
        with node.client() as client:
            return client.execute_command(*args)

    def begin(self) -> None:
        target_id = self.cluster.node_id(self.target)
        self._command(
            self.target,
            "CLUSTER",
            "SETSLOT",
            self.slot,
            "IMPORTING",
            self.cluster.node_id(self.source),
        )
        self._command(self.source, "CLUSTER", "SETSLOT", self.slot, "MIGRATING", target_id)

    def move_keys(self, pause: float, count: int | None = None) -> int:
        """Send the slot's keys one at a time, ``pause`` s apart (at most ``count``)."""
        moved = 0
        while count is None or moved < count:
            keys = self._command(self.source, "CLUSTER", "GETKEYSINSLOT", self.slot, 10)
            assert isinstance(keys, list)
            if not keys:
                break
            for key in keys[: None if count is None else count - moved]:
                self._command(
                    self.source, "MIGRATE", self.target.host, self.target.port, key, 0, 5000
                )
                moved += 1
                time.sleep(pause)  # the window under test: the slot's keys on two nodes
        return moved

    def end(self) -> None:
        target_id = self.cluster.node_id(self.target)
        for node in (self.target, self.source, *self.cluster.masters):
            self._command(node, "CLUSTER", "SETSLOT", self.slot, "NODE", target_id)


def test_a_lock_keeps_working_while_its_slot_is_resharded(cluster: Cluster) -> None:
    name = "resharded"
    slot = key_slot(name.encode())
    clients = [cluster.client() for _ in range(3)]
    holder = Lock(clients[0], name, timeout=10, thread_local=False)  # released in a thread
    assert holder.acquire()  # its keys exist on the slot's node before the move
    windows: list[tuple[float, float]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    mutex = threading.Lock()

    def hammer(client: redis.cluster.RedisCluster) -> None:
        lock = Lock(client, name, timeout=10)
        while not stop.is_set():
            try:
                if lock.acquire(blocking_timeout=20):
                    began = time.monotonic()
                    time.sleep(0.002)
                    ended = time.monotonic()
                    lock.release()
                    with mutex:
                        windows.append((began, ended))
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=hammer, args=(client,)) for client in clients[1:]]
    for thread in threads:
        thread.start()
    move = _Move(cluster, slot)
    released: list[BaseException | None] = []

    def release() -> None:  # asked again until the move ends: then it ends the hold
        try:
            holder.release()
            released.append(None)
        except BaseException as exc:
            released.append(exc)

    try:
        move.begin()
        assert move.move_keys(pause=0.3, count=1) == 1  # the holder's keys now split
        releasing = threading.Thread(target=release)
        releasing.start()
        move.move_keys(pause=0.3)  # the rest, one at a time
        move.end()
        releasing.join(30)
        assert released == [None]
        cluster.wait_healthy()
        after = len(windows)
        wait_for(lambda: len(windows) >= after + 20, 30, "holds after the move")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        for client in clients:
            client.close()
    assert not errors, errors
    assert cluster.node_for_slot(slot) is move.target
    ordered = sorted(windows)
    for (_, first_end), (second_begin, _) in itertools.pairwise(ordered):
        assert second_begin >= first_end, "two holds overlapped"


def test_a_release_refused_for_the_whole_move_says_so_and_stays_retryable(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scripting, "SLOT_MOVE_PATIENCE", 1.0)
    name = "stuck-move"
    client = cluster.client()
    lock = Lock(client, name, timeout=30)
    try:
        assert lock.acquire()
        move = _Move(cluster, key_slot(name.encode()))
        move.begin()
        move.move_keys(pause=0, count=1)  # one key moved, the others not: split
        started = time.monotonic()
        with pytest.raises(BackendError, match="moving the slot of .* nothing was done") as caught:
            lock.release()
        assert time.monotonic() - started < 5
        assert caught.value.never_sent
        assert "lock_release" not in str(caught.value)
        assert lock.statistics().held  # still this object's: the release never ran
        move.move_keys(pause=0)
        move.end()
        cluster.wait_healthy()
        lock.release()  # the same call, once the slot has moved
        assert not lock.locked()
    finally:
        client.close()
