"""Stream consumers in real processes: one killed with kill -9 loses no message."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import redis

from tenure.server import ServerProcess


def test_a_consumer_killed_with_kill_9_loses_no_message(
    tenure_client: redis.Redis, tenure_server: ServerProcess
) -> None:
    for n in range(2_000):
        tenure_client.xadd("work", {"n": str(n)})
    command = [sys.executable, "-m", "tests.consumer_worker", tenure_server.url]
    victim = subprocess.Popen([*command, "victim"])
    while int(tenure_client.scard("handled")) < 200:  # it is in the middle of its work
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    survivor = subprocess.Popen([*command, "survivor"])
    assert survivor.wait(timeout=120) == 0
    handled = {int(n) for n in tenure_client.smembers("handled")}
    assert handled == set(range(2_000))  # at least once: none lost
    pending = tenure_client.xpending("work", "g")
    assert pending["pending"] == 0  # the victim's unacknowledged ones were claimed and acked
