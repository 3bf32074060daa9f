"""Processes on redis-py's Lock and on tenure's ``Lock(..., interop="redis-py")``
cycle one lock name at once, as during a rolling deploy: no two hold together,
and the tenure side's fencing tokens grow with its holds. Standalone and cluster.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tenure.server import Cluster, ServerProcess

KINDS = ("redis-py", "tenure", "redis-py", "tenure")
CYCLES = 40
SECONDS = 40


def _run(port: int, cluster: bool, tmp_path: Path) -> list[dict[str, Any]]:
    outs = [tmp_path / f"worker{i}.jsonl" for i in range(len(KINDS))]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.interop_worker",
                kind,
                str(port),
                "1" if cluster else "0",
                str(SECONDS),
                str(CYCLES),
                str(out),
            ]
        )
        for kind, out in zip(KINDS, outs, strict=True)
    ]
    for worker in workers:
        assert worker.wait(timeout=SECONDS + 60) == 0
    records: list[dict[str, Any]] = []
    for out in outs:
        records.extend(json.loads(line) for line in out.read_text().splitlines())
    return records


def _check(records: list[dict[str, Any]]) -> None:
    problems = [r for r in records if "start" not in r]
    assert problems == []
    holds = sorted(records, key=lambda r: float(r["start"]))
    assert {r["kind"] for r in holds} == {"redis-py", "tenure"}
    assert len(holds) == CYCLES * len(KINDS)
    overlaps = [(a, b) for a, b in itertools.pairwise(holds) if a["end"] > b["start"]]
    assert overlaps == []
    fences = [int(r["fence"]) for r in holds if r["kind"] == "tenure"]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


@pytest.mark.timeout(180)
def test_redis_py_and_tenure_processes_exclude_each_other(
    tenure_server: ServerProcess, tmp_path: Path
) -> None:
    _check(_run(tenure_server.port, False, tmp_path))


@pytest.mark.timeout(180)
def test_they_exclude_each_other_on_a_cluster(tenure_cluster: Cluster, tmp_path: Path) -> None:
    _check(_run(tenure_cluster.masters[0].port, True, tmp_path))
