"""``tenure ingest run`` / ``status``: real processes, a real server, a real Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from tenure.server import ServerProcess
from tests.test_ingest import make_table, stream_keys

SINK = "tenure:ingest:{events}:rows"


def tenure(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "REDIS_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "tenure", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=180)
    return process.returncode, out, err


def test_run_status_and_a_rerun(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    ids = make_table(tmp_path / "db.sqlite", 20_000)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ("ingest", "run", source, "--table", "events", "--key", "id", "--chunk-size", "2000")
    code, out, err = finish(tenure(tenure_server.url, *args, "--workers", "2"))
    assert code == 0, err
    assert "events: done, 20,000 rows in" in out
    assert sorted(stream_keys(tenure_client, SINK)) == ids
    code, out, _ = finish(tenure(tenure_server.url, *args))
    assert code == 0 and "already done (20,000 rows" in out
    code, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "events", "--json"))
    status: Any = json.loads(out)
    assert code == 0 and status["finished"] and status["rows"] == 20_000
    assert status["rate"] > 0 and status["holders"] == []
    code, out, _ = finish(tenure(tenure_server.url, "ingest", "status", "events"))
    assert code == 0 and "20,000 rows  chunks" in out and "rows/s over" in out
    code, _, err = finish(tenure(tenure_server.url, "ingest", "status", "nonesuch"))
    assert code == 2 and "no ingestion job named 'nonesuch'" in err and err.count("\n") == 1
    code, _, err = finish(tenure(tenure_server.url, "ingest", "run", source, "--table", "nope",
                                 "--key", "id"))  # fmt: skip
    assert code == 2 and "no table 'nope'" in err and err.count("\n") == 1


def test_ctrl_c_stops_and_the_same_command_resumes(
    tenure_client: redis.Redis, tenure_server: ServerProcess, tmp_path: Path
) -> None:
    ids = make_table(tmp_path / "db.sqlite", 150_000, gaps=False)
    source = f"sqlite:///{tmp_path / 'db.sqlite'}"
    args = ("ingest", "run", source, "--table", "events", "--key", "id", "--chunk-size", "5000",
            "--workers", "2", "--lease", "1")  # fmt: skip
    first = tenure(tenure_server.url, *args)
    while int(tenure_client.hget("tenure:ingest:{events}:stats", "rows") or 0) < 20_000:
        time.sleep(0.02)
    first.send_signal(signal.SIGINT)
    code, _, err = finish(first)
    assert code == 130 and "run the same command again to resume" in err
    assert "Traceback" not in err  # the workers leave Ctrl-C to the command
    assert int(tenure_client.hget("tenure:ingest:{events}:stats", "rows") or 0) < len(ids)
    code, _, err = finish(tenure(tenure_server.url, *args))
    assert code == 0, err
    keys = stream_keys(tenure_client, SINK)
    assert len(keys) == len(ids) and sorted(keys) == ids
