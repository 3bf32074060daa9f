"""Stream consumers in real processes: one killed with kill -9 loses no message."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import redis

from tenure.server import ServerProcess
from tests.conftest import wait_for


@pytest.mark.parametrize("mode", ["read", "batches"])
def test_a_consumer_killed_with_kill_9_loses_no_message(
    tenure_client: redis.Redis, tenure_server: ServerProcess, mode: str
) -> None:
    """``read``: the worker's own loop, acknowledging each message; ``batches``:
    ``StreamConsumer.run``, a batch (10) acknowledged at a time. Handled again
    after the kill: at most one message, or at most the batch in hand."""
    for n in range(2_000):
        tenure_client.xadd("work", {"n": str(n)})
    command = [sys.executable, "-m", "tests.consumer_worker", tenure_server.url]
    victim = subprocess.Popen([*command, "victim", mode])
    wait_for(  # it is in the middle of its work
        lambda: int(tenure_client.scard("handled")) >= 200 or victim.poll() is not None,
        60,
        "200 messages handled",
    )
    assert victim.poll() is None, "the victim ended before it was killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    survivor = subprocess.Popen([*command, "survivor", mode])
    assert survivor.wait(timeout=120) == 0
    handled = {int(n) for n in tenure_client.smembers("handled")}
    assert handled == set(range(2_000))  # at least once: none lost
    again = int(tenure_client.llen("handlings")) - len(handled)
    assert 0 <= again <= (1 if mode == "read" else 10)  # the message, or the batch, in hand
    pending = tenure_client.xpending("work", "g")
    assert pending["pending"] == 0  # the victim's unacknowledged ones were claimed and acked


@pytest.mark.parametrize("mode", ["run", "arun"])
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_run_after_the_message_in_hand(
    tenure_client: redis.Redis, tenure_server: ServerProcess, mode: str, stop: signal.Signals
) -> None:
    # 20 messages of 0.15 s: a CI worker starved for over a second between seeing the
    # second one start and sending the signal let the first consumer finish all of 10.
    messages = 20
    for n in range(messages):
        tenure_client.xadd("work", {"n": str(n)})
    command = [sys.executable, "-m", "tests.consumer_worker", tenure_server.url]
    first = subprocess.Popen([*command, "first", mode], stderr=subprocess.PIPE, text=True)
    wait_for(  # in the middle of its second message
        lambda: int(tenure_client.llen("started")) >= 2 or first.poll() is not None,
        30,
        "the second message started",
    )
    assert first.poll() is None, "it ended before it was stopped"
    first.send_signal(stop)
    _, errors = first.communicate(timeout=10)
    assert first.returncode == 0, errors
    assert "Traceback" not in errors
    started = tenure_client.lrange("started", 0, -1)
    assert tenure_client.lrange("finished", 0, -1) == started  # the message in hand finished
    assert 2 <= len(started) < messages
    assert tenure_client.xpending("work", "g")["pending"] == 0  # ...and was acknowledged
    second = subprocess.Popen([*command, "second", mode])
    try:
        wait_for(lambda: int(tenure_client.llen("finished")) >= messages, 60, "the rest handled")
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=10) == 0
    finished = [int(n) for n in tenure_client.lrange("finished", 0, -1)]
    assert sorted(finished) == list(range(messages))  # each once, across both
