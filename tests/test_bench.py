"""``tenure bench`` (the clone's benchmarks/): short real runs that check the plumbing."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import tenure._async._lock_rules
from benchmarks import (
    BENCHMARKS,
    BenchmarkError,
    about,
    announce,
    load_benchmark,
    require_peer,
    run_timed,
    took,
)
from benchmarks.costs import COST_VARIANTS
from benchmarks.entity import ENTITY_CONTENDERS
from benchmarks.locks import (
    DEFAULT_PARTS,
    PARTS,
    add_arguments,
    check_arguments,
    counts,
    estimated_seconds,
    parts,
)
from benchmarks.locks_arguments import select
from benchmarks.measure import ContendedResult, combine_rounds
from benchmarks.names import measure_names, wait_idle
from benchmarks.scale import WaitersResult, median_crowd
from tenure._tooling import IDLE_TTL
from tests.sql_databases import postgresql

pytestmark = pytest.mark.engine_blind

TENURE = [sys.executable, "-m", "tenure"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``tenure ARGS`` in the clone (where ``tenure bench`` finds the benchmarks)."""
    return subprocess.run(
        [*TENURE, *args], capture_output=True, text=True, timeout=360, check=False, cwd=cwd
    )


def assert_timed(stderr: str, name: str) -> None:
    """The run said how long it would take before it measured, and how long it took, last."""
    lines = stderr.strip().splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith(f"tenure bench {name}: about ")]
    assert said == [0], stderr  # once, before the first line of measurement
    assert lines[0].endswith("; Ctrl-C stops it and cleans up"), lines[0]
    done = rf"tenure bench {name}: done in [0-9.]+ (seconds|minutes)"
    assert re.fullmatch(done, lines[-1]), stderr


def test_every_benchmark_is_a_subcommand() -> None:
    helped = run("bench", "--help")
    assert helped.returncode == 0
    for name in BENCHMARKS:
        assert name in helped.stdout
    missing = run("bench")
    assert missing.returncode == 2  # a benchmark must be named
    assert "NAME" in missing.stderr


def test_the_benchmarks_run_from_the_clone_alone(tmp_path: Path) -> None:
    # from a folder of the clone, and as python -m benchmarks
    below = run("bench", "--help", cwd=ROOT / "docs")
    assert below.returncode == 0, below.stderr
    assert "cache-paths" in below.stdout
    module = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert module.returncode == 0, module.stderr
    assert "usage: tenure bench" in module.stdout
    # elsewhere (the installed wheel has no benchmarks): one line, what to do
    (tmp_path / "benchmarks").mkdir()  # another project's benchmarks folder is not ours
    (tmp_path / "benchmarks" / "__init__.py").write_text("")
    outside = run("bench", "locks", cwd=tmp_path)
    assert outside.returncode == 1
    assert outside.stderr.count("\n") == 1, outside.stderr
    assert "tenure: bench: the benchmarks are not in the installed package" in outside.stderr
    assert "python -m benchmarks NAME" in outside.stderr


def test_a_missing_peer_names_what_to_install() -> None:
    with pytest.raises(BenchmarkError, match=r'pip install -e "\.\[bench\]"'):
        require_peer("no_such_peer_library", "no-such-peer")


def first_table(stdout: str) -> dict[str, str]:
    """The rows of the solo/contended table (the first block of the output), by lock key."""
    block = stdout.split("\n\n", 1)[0]
    return {line.split()[0]: line for line in block.splitlines() if line.strip()}


@pytest.mark.slow
def test_bench_locks_prints_ratios_and_writes_report_json_and_plot(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text("# Kept\n\nsome other section\n")
    data, plot = tmp_path / "run.json", tmp_path / "waits.png"
    done = run(
        "bench", "locks", "--parts", "solo,contended", "--seconds", "0.5",
        "--solo-seconds", "0.3", "--solo-runs", "1", "--rounds", "2", "--processes", "2",
        "--only", "tenure,redis-py,python-redis-lock,pottery,set-nx,handoff-floor",
        "--output", str(report), "--json", str(data), "--plot", str(plot),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "locks")
    rows = first_table(done.stdout)
    for key in ("tenure", "redis-py", "python-redis-lock", "pottery", "set-nx"):
        assert key in rows, done.stdout
    assert "tenure/row" in done.stdout
    assert rows["tenure"].split()[2] == "1.00"  # tenure against itself
    results = json.loads(data.read_text())
    assert results["run"]["parts"] == ["solo", "contended"]
    assert results["pool"] == results["waiters"] == results["names"] == []
    contended = {r["key"]: r for r in results["contended"]}
    assert set(contended) == {"tenure", "redis-py", "python-redis-lock", "pottery", "handoff-floor"}
    for result in contended.values():
        assert result["acquisitions"] > 0
        assert len(result["rounds"]) == 2  # one throughput per round, the median reported
        assert min(result["rounds"]) <= result["throughput"] <= max(result["rounds"])
        assert result["lost_updates"] == 0 and result["overlaps"] == 0
        assert "waits_ms" not in result  # samples go to the plot, not the JSON
    goals = {(t["goal"], t["key"]): t for t in results["targets"]}
    for goal in (
        "contended acq/s >= 0.9x redis-py's default Lock",
        "handoff (release to the next holder's acquire returning) p50 <= 2x a token passed "
        "by `RPUSH`/`BLPOP`",
        "wait p99 <= 2x wait p50",
        "fairness >= 0.95",
        "solo >= 0.95x bare SET NX PX + compare-and-delete",
    ):
        assert isinstance(goals[goal, "tenure"]["met"], bool)  # checked, whatever the outcome
    assert "targets:" in done.stdout and "[met]" in done.stdout  # no lost updates at least
    text = report.read_text()
    assert text.startswith("# Kept")  # other sections stay
    assert "<!-- tenure-bench:locks:start -->" in text
    assert "Generated by `tenure bench locks --parts solo,contended" in text
    assert "| Goal | Lock | Measured | Met |" in text and "2 round(s) per lock" in text
    assert "## Memory per lock name" not in text  # parts not run have no section
    assert plot.read_bytes().startswith(PNG_MAGIC)
    assert plot.stat().st_size > 20_000  # a drawn figure, not an empty canvas


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["replicated", "cluster"])
def test_bench_locks_on_a_topology_prices_the_acknowledgement(
    tmp_path: Path, topology: str
) -> None:
    report, data = tmp_path / "report.md", tmp_path / "run.json"
    done = run(
        "bench", "locks", "--topology", topology, "--seconds", "0.4", "--solo-seconds", "0.3",
        "--solo-runs", "1", "--rounds", "1", "--processes", "2",
        "--output", str(report), "--json", str(data),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "locks")
    rows = first_table(done.stdout)
    for key in ("tenure", "tenure-cluster-1", "tenure-cluster-2", "tenure-plus-rtt", "redis-py"):
        assert key in rows, done.stdout
    assert "pottery" not in rows and "set-nx" not in rows  # standalone-only contenders
    results = json.loads(data.read_text())
    assert results["run"]["topology"] == topology
    assert results["run"]["parts"] == ["solo", "contended"]  # the others are about one server
    for result in results["contended"]:
        assert result["acquisitions"] > 0
        assert result["lost_updates"] == 0 and result["overlaps"] == 0
    costs = [t for t in results["targets"] if t["goal"].startswith("ClusterLock costs")]
    assert {t["key"] for t in costs} == {"tenure-cluster-1", "tenure-cluster-2"}
    assert all(isinstance(t["met"], bool) and "Lock + 1 PING" in t["measured"] for t in costs)
    text = report.read_text()
    assert f"<!-- tenure-bench:locks-{topology}:start -->" in text
    assert f"# Lock benchmarks: on a {topology} topology" in text
    assert f"## What an acknowledgement costs ({topology})" in text
    assert f"## tenure against redis-py's Lock ({topology})" in text


@pytest.mark.slow
def test_bench_locks_pool_waiters_and_names_parts(tmp_path: Path) -> None:
    report, data = tmp_path / "report.md", tmp_path / "run.json"
    done = run(
        "bench", "locks", "--skip", "solo,contended,entity", "--only", "tenure,redis-py",
        "--rounds", "1", "--single-tries", "2", "--tasks", "30", "--threads", "6",
        "--names", "300", "--name-processes", "1", "--skip-idle-wait",
        "--output", str(report), "--json", str(data),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "locks")
    results = json.loads(data.read_text())
    assert results["run"]["parts"] == ["pool", "waiters", "names"]
    assert results["solo"] == results["contended"] == []
    assert results["entity"] == [] and results["scale"] == {"holds": [], "waiters": []}
    pool = {r["key"]: r for r in results["pool"]}
    assert set(pool) == {"tenure", "redis-py"}
    for result in pool.values():  # 6 threads x 3 cycles through 3 connections, no errors
        assert result["errors"] == 0, result["first_error"]
        assert result["cycles"] == 18 and len(result["runs"]) == 1
    single = {r["key"]: r for r in results["single_connection"]}
    assert single["tenure"]["errors"] == 0, single["tenure"]["first_error"]
    assert len(single["tenure"]["latencies_ms"]) == 2
    crowds = {r["kind"]: r for r in results["waiters"]}
    assert set(crowds) == {"tasks", "threads"}
    for kind, count in (("tasks", 30), ("threads", 6)):
        crowd = crowds[kind]
        assert crowd["errors"] == 0, crowd["first_error"]
        assert crowd["waiters"] == crowd["queued"] == crowd["handoffs"] == count
        assert crowd["overlaps"] == 0
        assert crowd["pool_connections"] <= 8
        assert crowd["extra"] <= 2  # waiting shares one pub/sub connection per process
        assert crowd["handoff_p50_ms"] > 0
    names = {r["key"]: r for r in results["names"]}
    assert names["redis-py"]["keys_after"] == 0  # redis-py deletes its only key on release
    # One marker each (the last fence and the release's receipt), for IDLE_TTL.
    assert names["tenure"]["keys_after"] == 300
    for result in names.values():
        assert result["errors"] == 0, result["first_error"]
        assert result["keys_idle"] is None and result["idle_waited"] is None  # wait skipped
    goals = {t["goal"]: t for t in results["targets"]}
    assert goals["bounded pool: time <= 2x redis-py's, 0 errors"]["met"] is not None
    assert goals["30 waiting tasks: <= 2 extra connections, every waiter served"]["met"]
    assert goals["6 waiting threads: <= 2 extra connections, every waiter served"]["met"]
    assert goals["300 names used once: 0 keys after the idle time"]["met"] is None
    text = report.read_text()
    for heading in (
        "## Few connections: a bounded pool, a single connection",
        "### Release → waiter holding it, on one `single_connection_client=True` client",
        "## Many waiters in one process",
        "## Memory per lock name",
    ):
        assert heading in text
    assert "The idle wait was skipped in this run." in text
    assert "## Solo" in text and "Not measured in this run." in text
    assert "bounded pool (6 threads" in done.stdout and "memory per name:" in done.stdout


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--scale-holds", "0", "--scale-holds takes comma-separated counts in 1..100000 (got '0')"),
        ("--scale-holds", "1000,lots", "(got 'lots')"),
        ("--scale-holds", "1000,,2000", "(got '')"),
        ("--scale-waiters", "", "--scale-waiters takes comma-separated counts in 1..100000"),
        ("--scale-waiters", "200000", "(got '200000')"),
        ("--scale-extra", "0", "--scale-extra must be in 1..100000"),
        ("--scale-window", "0", "--scale-window must be in (0, 60] seconds"),
    ],
)
def test_scale_arguments_are_checked(option: str, value: str, message: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(BenchmarkError, match=re.escape(message)):
        check_arguments(parser.parse_args(["--parts", "scale", option, value]))
    fine = parser.parse_args(["--scale-holds", "20000,1_000,1000", "--scale-waiters", " 10 "])
    check_arguments(fine)
    assert counts(fine.scale_holds, "--scale-holds") == (1000, 20000)
    assert counts(fine.scale_waiters, "--scale-waiters") == (10,)


def test_bench_locks_entity_part(tmp_path: Path) -> None:
    report, data = tmp_path / "report.md", tmp_path / "run.json"
    done = run(
        "bench", "locks", "--parts", "entity", "--solo-seconds", "0.2", "--rounds", "1",
        "--output", str(report), "--json", str(data),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "locks")
    results = json.loads(data.read_text())
    assert results["run"]["parts"] == ["entity"]
    assert results["solo"] == results["names"] == []
    assert results["scale"] == {"holds": [], "waiters": []}
    entity = {(r["key"], r["variant"]): r for r in results["entity"]}
    keys = tuple(ENTITY_CONTENDERS)  # the two locks, redis-py's, and tenure's other kinds
    assert {"tenure-semaphore", "tenure-read", "tenure-write-async"} <= set(keys)
    variants = ("fresh", "reused", "constructor", *COST_VARIANTS)
    assert set(entity) == {(k, v) for k in keys for v in variants}
    for (key, variant), result in entity.items():
        assert result["mode"] == ("asyncio" if key.endswith("async") else "sync")
        assert len(result["runs"]) == 1, (key, variant)
        if variant in ("keys_idle", "bytes_idle") and key.startswith("redis-py"):
            assert result["median"] == 0, (key, variant)  # redis-py deletes its only key
            continue
        assert result["median"] > 0, (key, variant)
        if variant == "fresh":  # as many names as cycles
            assert result["names"][0] >= result["median"] * 0.2 * 0.5
        if variant == "reused":  # the fresh run's names again
            assert result["names"] == entity[key, "fresh"]["names"]
    goals = {(t["goal"], t["key"]): t for t in results["targets"]}
    for mode, key in (("sync", "tenure-default"), ("asyncio", "tenure-async")):
        for variant in ("fresh", "reused"):
            goal = (
                f"per-entity locks ({mode}, {variant} names): cycles/s >= 1x "
                "redis-py's `client.lock(name)`"
            )
            assert isinstance(goals[goal, key]["met"], bool)  # checked, whatever the outcome
    kin = (
        "per-entity tenure `Semaphore(client, name, limit=5)` (fresh names): cycles/s >= "
        "0.9x tenure's Lock"
    )
    assert isinstance(goals[kin, "tenure-default"]["met"], bool)
    assert len(results["targets"]) == 4 + 2 * 6  # redis-py's lock; tenure's other kinds
    text = report.read_text()
    assert "## Per-entity locks" in text and "## Scale: holds and waiters" not in text
    assert "this part alone: `tenure bench locks --parts entity`" in text
    assert "Measured by `tenure bench locks --parts entity --solo-seconds 0.2" in text
    assert "redis-py's `client.lock(name)` has `timeout=None` too" in text  # the defaults
    for row in ("| sync | fresh |", "| sync | reused |", "| asyncio | fresh |"):
        assert row in text
    assert "| tenure `AsyncLock(client, name)` |" in text  # the constructor table
    assert "| Lock | server µs | round trips |" in text  # where a cycle goes
    # Per cycle: two round trips each (redis-py: SET, then its release script); a
    # released tenure name leaves one key (its marker), redis-py's none.
    assert entity["tenure", "round_trips"]["median"] == 2.0
    assert entity["redis-py", "round_trips"]["median"] == 2.0
    assert entity["tenure", "keys_idle"]["median"] == 1.0
    # A semaphore's cycle: two scripts too (the SETs inside them are not round trips).
    assert entity["tenure-semaphore", "round_trips"]["median"] == 2.0
    assert "| tenure `ReadWriteLock(client, name).write` | fresh |" in text  # beside the lock
    assert "tenure `AsyncLock()` (30 s lease, background renewal)" in text  # a target row
    assert "per-entity locks (a new lock object per cycle" in done.stdout
    assert "solo/s" not in done.stdout  # no empty solo/contended table
    assert "tenure/redis-py" in done.stdout and "constructor: tenure" in done.stdout


def test_a_crowd_over_rounds_reports_each_figures_median() -> None:
    def crowd(queue: float | None, rate: float, errors: int = 0) -> WaitersResult:
        return WaitersResult(
            waiters=10, pool_size=8, queued=10, queue_seconds=queue, window_seconds=1.0,
            queued_in_window=10, baseline_per_s=1.0, waiting_per_s=3.0, refresh_per_s=2.0,
            scripts_per_s=2.0, handoffs=10, drain_seconds=10 / rate, handoff_rate=rate,
            unserved=0, finished=queue is not None, errors=errors,
            first_error="boom" if errors else None,
        )  # fmt: skip

    got = median_crowd([crowd(1.4, 900.0), crowd(0.8, 1500.0, errors=1), crowd(1.0, 1200.0)])
    assert got.queue_seconds == 1.0 and got.handoff_rate == 1200.0
    assert got.errors == 1 and got.first_error == "boom" and got.finished
    slow = median_crowd([crowd(None, 900.0), crowd(None, 1000.0), crowd(0.5, 1100.0)])
    assert slow.queue_seconds is None and not slow.finished  # most rounds did not queue all
    assert slow.handoff_rate == 1000.0


def test_bench_locks_scale_part(tmp_path: Path) -> None:
    report, data = tmp_path / "report.md", tmp_path / "run.json"
    done = run(
        "bench", "locks", "--parts", "scale", "--rounds", "1", "--scale-holds", "200,100",
        "--scale-extra", "20", "--scale-waiters", "50,100", "--scale-window", "0.3",
        "--output", str(report), "--json", str(data),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "locks")
    results = json.loads(data.read_text())
    assert results["run"]["parts"] == ["scale"] and results["entity"] == []
    holds = {(r["key"], r["held"]): r for r in results["scale"]["holds"]}
    keys = ("tenure", "redis-py", "tenure-async", "redis-py-async")
    assert set(holds) == {(k, n) for k in keys for n in (100, 200)}
    for result in holds.values():
        assert result["finished"] and result["error"] is None
        assert result["extra"] == 20 and len(result["acquire_runs"]) == 1
        assert result["acquire_us"] > 0 and result["release_us"] > 0
    waiters = results["scale"]["waiters"]
    assert [w["waiters"] for w in waiters] == [50, 100]
    for w in waiters:
        assert w["errors"] == 0, w["first_error"]
        assert w["finished"] and w["queued"] == w["handoffs"] == w["waiters"]
        assert w["queued_in_window"] == w["waiters"] and w["unserved"] == 0
        assert w["queue_seconds"] > 0 and w["handoff_rate"] > 0 and w["drain_seconds"] > 0
        assert w["scripts_per_s"] is not None and w["window_seconds"] == 0.3
    goals = {t["goal"]: t for t in results["targets"]}
    for mode in ("sync", "asyncio"):
        for what in ("acquire", "release"):
            goal = f"{what} while holding 200 locks <= 1.2x while holding 100 ({mode})"
            assert isinstance(goals[goal]["met"], bool)
    assert isinstance(goals["100 waiting tasks queued in <= 0.4 s"]["met"], bool)
    assert isinstance(goals["handoffs/s with 100 waiters >= 0.8x with 50"]["met"], bool)
    refresh = "refresh traffic (script calls/s) with 100 waiters <= 1.2x with 50 (+5/s)"
    assert isinstance(goals[refresh]["met"], bool)
    text = report.read_text()
    assert "## Scale: holds and waiters" in text and "## Per-entity locks" not in text
    assert "this part alone: `tenure bench locks --parts scale`" in text
    assert "### Holding many locks" in text and "### Many asyncio waiters on one lock" in text
    assert "| tenure `Lock(client, name)` | 200 |" in text
    assert "holding many locks" in done.stdout and "many asyncio waiters" in done.stdout


def test_names_keys_reach_zero_after_the_idle_time(
    tenure_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # IDLE_TTL (60 s) is passed to the scripts by the client, so a shorter one
    # here exercises the idle wait for real without a minute of waiting.
    monkeypatch.setattr(tenure._async._lock_rules, "IDLE_TTL_MS", 300)
    kwargs = tenure_client.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}"
    used = measure_names(url, "tenure", 40, processes=0, concurrency=8)
    assert used.errors == 0 and used.first_error is None
    assert used.keys_peak > 0  # fencing counters were left, for a while
    assert used.keys_idle is None
    waited = wait_idle(url, used, cap=20)
    assert waited.keys_idle == 0
    assert waited.zero_after is not None and waited.zero_after < 20
    assert waited.idle_waited is not None and waited.used_idle is not None
    assert int(tenure_client.dbsize()) == 0


def test_names_wait_stops_at_its_cap(tenure_client: redis.Redis) -> None:
    kwargs = tenure_client.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}"
    used = measure_names(url, "tenure", 10, processes=0, concurrency=4)
    assert used.keys_after == 10  # a marker each (fence, receipt), for the real IDLE_TTL: a minute
    waited = wait_idle(url, used, cap=0.5)
    assert waited.keys_idle == 10 and waited.zero_after is None
    assert waited.idle_waited is not None and waited.idle_waited < 5


def test_rounds_are_combined_into_medians() -> None:
    def result(rate: float, p50: float, per: tuple[int, ...], lost: int = 0) -> ContendedResult:
        return ContendedResult(
            key="tenure", processes=2, seconds=1.0, critical_ms=1.0, acquisitions=int(rate),
            per_process=per, throughput=rate, wait_p50_ms=p50, wait_p99_ms=2 * p50,
            wait_max_ms=3 * p50, worst_over_median=3.0, fairness=min(per) / max(per),
            hold_p50_ms=1.0, gap_p50_ms=0.2, gap_p99_ms=0.5, handed_on=1.0, overlaps=0,
            increments=int(rate), counter=int(rate) - lost, lost_updates=lost, timeouts=0,
            waits_ms=(p50,),
        )  # fmt: skip

    combined = combine_rounds(
        [
            result(500, 5.0, (250, 250)),
            result(300, 9.0, (100, 200), lost=1),
            result(400, 4.0, (190, 210)),
        ]
    )
    assert combined.throughput == 400.0
    assert combined.rounds == (500.0, 300.0, 400.0)
    assert combined.wait_p50_ms == 5.0 and combined.wait_p99_ms == 10.0
    assert combined.per_process == (190, 210)  # the median-rate round's
    assert combined.lost_updates == 1  # counts that must be 0 are summed
    assert combined.waits_ms == (5.0, 9.0, 4.0)
    with pytest.raises(ValueError, match="no rounds"):
        combine_rounds([])


def test_parts_are_chosen_and_skipped() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parts(parser.parse_args([])) == DEFAULT_PARTS == PARTS[:-1]  # all but scale
    assert "scale" not in DEFAULT_PARTS and PARTS[-1] == "scale"
    assert parts(parser.parse_args(["--parts", "names,pool"])) == ("pool", "names")
    assert parts(parser.parse_args(["--skip", "names"])) == (*DEFAULT_PARTS[:-2], "entity")
    assert parts(parser.parse_args(["--parts", "all"])) == PARTS
    assert parts(parser.parse_args(["--parts", "all", "--skip", "names,entity"])) == (
        "solo", "contended", "pool", "waiters", "scale"
    )  # fmt: skip
    assert parts(parser.parse_args(["--parts", "scale,entity"])) == ("entity", "scale")
    topology = parser.parse_args(["--parts", "all", "--topology", "cluster"])
    assert parts(topology) == ("solo", "contended")  # the others are about one server
    with pytest.raises(BenchmarkError, match="unknown part"):
        parts(parser.parse_args(["--parts", "solo,nonesuch"]))


@pytest.mark.slow
def test_bench_semaphores_prints_ratio_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "acquires.png"
    done = run("bench", "semaphores", "--seconds", "0.3", "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "semaphores")
    assert "tenure Semaphore" in done.stdout and "Redis in Action 6.3.5" in done.stdout
    book = next(line for line in done.stdout.splitlines() if line.startswith("Redis in Action"))
    assert float(book.split()[-2]) == pytest.approx(7.0)  # the book's round trips
    assert plot.read_bytes().startswith(PNG_MAGIC)


def test_bench_caches_measures_stampedes_and_hits(tmp_path: Path) -> None:
    plot, report = tmp_path / "waits.png", tmp_path / "report.md"
    done = run(
        "bench", "caches", "--rounds", "1", "--processes", "2", "--callers", "3",
        "--load", "0.05", "--fresh", "0.2", "--seconds", "0.2",
        "--only", "tenure-async,tenure-threads,cashews-early",
        "--plot", str(plot), "--output", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "caches")
    rows = {line.split("  ")[0]: line.split() for line in done.stdout.splitlines()}
    for label in ("tenure `@cached` (asyncio)", "tenure `@cached` (threads)"):
        row = next(v for k, v in rows.items() if k.startswith(label))
        # no stampede: at most one load cold, one just expired (a busy machine may
        # start a process's callers after the short window)
        assert row[-8] in ("0", "1") and row[-5] in ("0", "1"), row
    assert "bare GET + json.loads" in done.stdout
    assert "hits: " in done.stdout and "x the bare loop" in done.stdout
    assert plot.read_bytes().startswith(PNG_MAGIC)
    text = report.read_text()
    assert "<!-- tenure-bench:caches:start -->" in text and "cashews `early`" in text
    unknown = run("bench", "caches", "--only", "nonesuch")
    assert unknown.returncode == 2 and "no contender 'nonesuch'" in unknown.stderr
    bad = run("bench", "caches", "--callers", "0")
    assert bad.returncode == 2 and "--callers 1..200" in bad.stderr


def test_bench_caches_batch_measures_every_loop_beside_mget(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    done = run("bench", "caches", "--batch", "--rounds", "1", "--output", str(report))
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "caches --batch")
    for loop in ("| MGET + json.loads |", "| HerdCache.get_many |", "| Cache.get_many, near |"):
        assert loop in done.stdout, loop
    row = next(
        line for line in done.stdout.splitlines() if line.startswith("| HerdCache.get_many |")
    )
    assert row.rstrip(" |").endswith("mget 1")  # one round trip, no script: every entry fresh
    assert "<!-- tenure-bench:batch:start -->" in report.read_text()


def test_bench_caches_near_measures_hits_writes_seen_memory_and_the_bound(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.md"
    done = run("bench", "caches", "--near", "--rounds", "1", "--output", str(report))
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "caches --near")
    for line in (
        "| Cache.get, near |",
        "| redis-py cache_config GET + json.loads (its Redis 7.4 check set aside) |",
        "| near cache |",
        "Memory per near entry",
        "| blackhole",
    ):
        assert line in done.stdout, line
    phases = [line for line in done.stdout.splitlines() if line.endswith(" | 0 |")]
    assert len(phases) == 7, done.stdout  # no read past the bound in any phase
    assert "<!-- tenure-bench:near:start -->" in report.read_text()


@pytest.mark.timeout(400)  # about 30 s alone here (the fault run waits out killed workers' claims)
def test_bench_ingest_measures_speed_faults_and_memory(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    database = postgresql()
    try:
        done = run(
            "bench", "ingest", "--rows", "5000", "--rounds", "1", "--workers", "1,4",
            "--fault-rows", "20000", "--memory-rows", "5000,10000", "--output", str(report),
            "--postgresql", database.url,
        )  # fmt: skip
    finally:
        database.stop()
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "ingest")
    out = done.stdout
    assert "| one process: a `sqlite3` cursor, each row `json` encoded" in out
    assert "| one process: a psycopg cursor, each row `json` encoded" in out
    for design in ("tenure IngestJob", "the post (CLIENT SETNAME)"):
        for workers in (1, 4):
            assert f"| {design} | {workers} |" in out
    for goal in ("one worker >= 1.0x", "4 workers >= 1.5x", "PostgreSQL: one worker >= 0.9x"):
        assert f"| {goal}" in out
    speed = next(line for line in out.splitlines() if line.startswith("| tenure IngestJob | 1 |"))
    assert float(speed.split("|")[-2]) > 0  # server µs per row
    faults = out[out.index("## Faults") :]
    tenure_faults = next(
        line for line in faults.splitlines() if line.startswith("| tenure IngestJob |")
    )  # fmt: skip
    kills, _, entries, lost, duplicated = (c.strip() for c in tenure_faults.split("|")[2:7])
    assert int(kills) >= 1 and entries == "20,000" and lost == duplicated == "0"
    assert "| 5,000 | " in out and "| 10,000 | " in out and " MiB |" in out
    assert "<!-- tenure-bench:ingest:start -->" in report.read_text()
    bad = run("bench", "ingest", "--workers", "0")
    assert bad.returncode == 2 and "--workers" in bad.stderr and bad.stderr.count("\n") == 1
    small = run("bench", "ingest", "--rows", "10")
    assert small.returncode == 2 and "--rows and --fault-rows 1,000..10,000,000" in small.stderr


@pytest.mark.slow
def test_bench_redlock_measures_both_scenarios_and_judges_the_targets(tmp_path: Path) -> None:
    report, raw = tmp_path / "report.md", tmp_path / "raw.json"
    done = run(
        "bench", "redlock", "--seconds", "0.3", "--solo-seconds", "0.3", "--solo-runs", "1",
        "--rounds", "1", "--processes", "2", "--only", "tenure,pottery,aioredlock",
        "--output", str(report), "--json", str(raw),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "redlock")
    out = done.stdout
    assert "### All masters well" in out and "### One master slow" in out
    for label in ("tenure `Redlock(timeout=10)`", "pottery `Redlock", "aioredlock `Aioredlock"):
        assert out.count(f"| {label}") == 2, label
    assert "| slow master: tenure's acquire p50 unchanged within 10% |" in out
    data = json.loads(raw.read_text())
    for scenario in data["scenarios"].values():
        assert all(c["lost_updates"] == 0 and c["overlaps"] == 0 for c in scenario["contended"])
    assert "<!-- tenure-bench:redlock:start -->" in report.read_text()
    unknown = run("bench", "redlock", "--only", "tenure,nonesuch")
    assert unknown.returncode == 2
    assert "unknown contender(s) nonesuch; known: tenure, tenure-async" in unknown.stderr


@pytest.mark.slow
def test_bench_idsets_measures_every_row_and_judges_the_targets(tmp_path: Path) -> None:
    report, raw = tmp_path / "report.md", tmp_path / "raw.json"
    done = run(
        "bench", "idsets", "--ids-a", "20000", "--ids-b", "30000", "--dense-below", "200000",
        "--others", "30", "--other-ids", "2000", "--rounds", "2",
        "--output", str(report), "--json", str(raw),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "idsets")
    out = done.stdout
    assert "### (a) spread over the 32-bit range:" in out and "### (b) dense below 200,000:" in out
    for label in (
        "numpy `intersect1d`", "pyroaring alone", "`IdSet` cold", "`IdSet` warm (",
        "`IdSet` warm, `near=True`",
    ):  # fmt: skip
        assert out.count(label) == 2, label
    assert out.count("Redis `SINTERCARD` on native sets") == 2
    assert "| warm count <= 6 ms in (a) |" in out and "| warm count <= 1 ms in (b) |" in out
    assert "| warm count with near=True <= 0.3 ms in (b) |" in out
    assert "top_overlaps against 30 sets of 2,000 ids warm < 0.5 s" in out
    data = json.loads(raw.read_text())
    for scenario in data["scenarios"].values():
        assert {row["count"] for row in scenario["rows"]} == {scenario["expected"]}
        assert len(scenario["rows"]) == 6
    assert "<!-- tenure-bench:idsets:start -->" in report.read_text()
    bad = run("bench", "idsets", "--skip", "native,nonesuch")
    assert bad.returncode == 2
    assert "--skip: unknown part(s) nonesuch; known: native, overlaps" in bad.stderr


@pytest.mark.slow
def test_bench_consumers_measures_every_contender_and_judges_the_targets(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    done = run(
        "bench", "consumers", "--messages", "2000", "--rounds", "1", "--processes", "1,2",
        "--output", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "consumers")
    for label in ("StreamConsumer.run", "AsyncStreamConsumer.run", "bare loop, redis-py"):
        assert label in done.stdout
    assert done.stdout.count("process(es): >= 0.8x") == 4  # two twins, two process counts
    text = report.read_text()
    assert "<!-- tenure-bench:consumers:start -->" in text and "| 2 | tenure" in text
    refused = run("bench", "consumers", "--processes", "0")
    assert refused.returncode == 2 and "--processes takes" in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr  # one line, no traceback


def test_bench_otel_measures_every_loop_with_recording_on_and_paused(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    done = run("bench", "otel", *SMALL_RUNS["otel"], "--output", str(report))
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "otel")
    for loop in ("| lock |", "| cache hit |", "| async lock |", "| async cache hit |"):
        assert loop in done.stdout
    assert "<!-- tenure-bench:otel:start -->" in report.read_text()
    refused = run("bench", "otel", "--rounds", "0")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr


def test_bench_cache_paths_measures_every_path_beside_its_bare_loop(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    done = run(
        "bench", "cache-paths", "--rounds", "1", "--seconds", "0.2",
        "--only", "herd-fetch,cached-miss", "--output", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_timed(done.stderr, "cache-paths")
    for label in ("bare `GET` + `json.loads`", "`HerdCache.fetch`", "`@cached` function, a miss"):
        rows = [line for line in done.stdout.splitlines() if line.startswith(label + " ")]
        assert len(rows) == 2, label  # redis-py and redis.asyncio
    assert done.stdout.count("<= 1.1x bare") == 2 and done.stdout.count("<= 1.5x bare") == 2
    text = report.read_text()
    assert "<!-- tenure-bench:cache-paths:start -->" in text and "**redis.asyncio**" in text
    row = next(line for line in text.splitlines() if line.startswith("| `HerdCache.fetch` |"))
    assert row.split(" | ")[5] == "1.00"  # one round trip a hit
    refused = run("bench", "cache-paths", "--only", "nonesuch")
    assert refused.returncode == 2 and "no path 'nonesuch'" in refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr  # one line, no traceback


def test_bench_refuses_bad_values() -> None:
    bad = run("bench", "locks", "--seconds", "0")
    assert bad.returncode == 2
    assert "--seconds" in bad.stderr
    assert "tenure: bench: --seconds and --solo-seconds must be in (0, 600]" in bad.stderr
    unknown = run("bench", "locks", "--only", "tenure,nonesuch")
    assert unknown.returncode == 2
    assert "unknown contender(s) nonesuch on standalone; known: tenure, tenure-default" in (
        unknown.stderr
    )
    elsewhere = run("bench", "locks", "--topology", "cluster", "--only", "pottery")
    assert elsewhere.returncode == 2
    assert "unknown contender(s) pottery on cluster; known: tenure, tenure-cluster-1" in (
        elsewhere.stderr
    )
    given = run("bench", "locks", "--topology", "replicated", "--url", "redis://127.0.0.1:1")
    assert given.returncode == 2
    assert "--topology starts its own servers: leave out --url" in given.stderr
    twice = run("bench", "redlock", "--url", "redis://127.0.0.1:1", "--url", "redis://127.0.0.1:1")
    assert twice.returncode == 2
    assert "--url names one master twice: give each master once" in twice.stderr
    local = run("bench", "redlock", "--url", "unix:///tmp/nonesuch.sock")
    assert local.returncode == 2
    assert "the masters must be TCP servers (host:port)" in local.stderr
    part = run("bench", "locks", "--skip", "memory")
    assert part.returncode == 2
    assert "unknown part(s) memory; known: solo, contended, pool, waiters, names" in part.stderr
    names = run("bench", "locks", "--names", "0")
    assert names.returncode == 2
    assert "--names must be in 1..10000000" in names.stderr
    scale = run("bench", "locks", "--parts", "scale", "--scale-holds", "1000,lots")
    assert scale.returncode == 2
    assert "--scale-holds takes comma-separated counts in 1..100000 (got 'lots')" in scale.stderr
    assert scale.stderr.count("\n") == 1, scale.stderr  # one line, no traceback
    semaphores = run("bench", "semaphores", "--limit", "0")
    assert semaphores.returncode == 2
    assert "--limit in 1..10000" in semaphores.stderr
    for refused in (bad, unknown, elsewhere, given, twice, local, part, names, scale, semaphores):
        assert refused.stderr.count("\n") == 1, refused.stderr  # no estimate before the error


def test_a_given_server_with_data_is_not_emptied(tenure_client: redis.Redis) -> None:
    tenure_client.set("precious", "data")
    kwargs = tenure_client.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}"
    for name in BENCHMARKS:
        short = {
            "ingest": ["--rows", "1000"],
            "idsets": ["--rounds", "1"],
            "consumers": ["--messages", "1000", "--rounds", "1"],
        }.get(name, ["--seconds", "0.2"])
        refused = run("bench", name, *short, "--url", url)
        assert refused.returncode == 2, refused.stderr
        assert "holds 1 keys" in refused.stderr and "--allow-flush" in refused.stderr
    assert tenure_client.get("precious") == b"data"


def test_durations_are_said_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert about(0.2) == "1 second" and about(12.4) == "12 seconds" and about(41) == "40 seconds"
    assert about(89) == "90 seconds" and about(90) == "2 minutes" and about(725) == "12 minutes"
    assert took(7.44) == "7.4 seconds" and took(43.4) == "43 seconds"
    assert took(708) == "11.8 minutes"
    announce("locks", 725, "solo, names; 2 contenders")
    assert capsys.readouterr().err == (
        "tenure bench locks: about 12 minutes (solo, names; 2 contenders); "
        "Ctrl-C stops it and cleans up\n"
    )


def test_a_timed_run_ends_with_the_time_it_took(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_timed("x", 5, "a part", lambda: None) == 0
    said, done = capsys.readouterr().err.splitlines()
    assert said.startswith("tenure bench x: about 5 seconds (a part); Ctrl-C")
    assert re.fullmatch(r"tenure bench x: done in [0-9.]+ seconds", done)

    def fails() -> None:
        raise BenchmarkError("a worker hung")

    assert run_timed("x", 5, "a part", fails) == 1  # a run that fails midway
    lines = capsys.readouterr().err.splitlines()
    assert lines[1] == "benchmark failed: BenchmarkError: a worker hung"
    assert re.fullmatch(r"tenure bench x: stopped after [0-9.]+ seconds", lines[-1])

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C: the command's own exit status
        run_timed("x", 5, "a part", interrupted)
    assert capsys.readouterr().err.splitlines()[-1].startswith("tenure bench x: stopped after ")


def test_the_locks_estimate_follows_the_structure_of_the_run() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def estimate(*argv: str) -> float:
        return estimated_seconds(parser.parse_args(argv))

    default = estimate()
    assert 8 * 60 <= default <= 20 * 60  # about ten minutes on two cores
    contended = sum(c.contended for c in select(None))
    # Twice --seconds: 5 s more per contended run, 3 rounds of each contended contender.
    assert estimate("--seconds", "10") - default == pytest.approx(3 * contended * 5.0)
    assert estimate("--rounds", "6") > default + 3 * contended * 5.0  # and pool, entity rounds
    # The names' idle wait: until tenure's markers expire, or the cap.
    assert IDLE_TTL <= default - estimate("--skip-idle-wait") <= IDLE_TTL + 5
    assert estimate("--idle-cap", "10") == pytest.approx(estimate("--skip-idle-wait") + 10)
    assert estimate("--names", "2000000") - default > 2 * 60  # a million names more
    assert estimate("--skip", "names") < default - 4 * 60
    assert estimate("--parts", "all") - default > 2 * 60  # the scale part
    assert estimate("--only", "tenure,redis-py") < default
    assert estimate("--topology", "cluster") < 3 * 60  # solo and contended only


SMALL_RUNS = {
    "locks": ["--parts", "solo,contended", "--seconds", "0.5", "--solo-seconds", "0.3",
              "--solo-runs", "1", "--rounds", "2", "--processes", "2"],
    "semaphores": ["--seconds", "0.3"],
    "caches": ["--rounds", "1", "--processes", "2", "--callers", "3", "--load", "0.05",
               "--fresh", "0.2", "--seconds", "0.2", "--only", "tenure-async,tenure-threads"],
    "cache-paths": ["--rounds", "1", "--seconds", "0.2", "--only", "herd-fetch,cached-miss"],
    "ingest": ["--rows", "5000", "--rounds", "1", "--workers", "1,4", "--fault-rows", "20000",
               "--memory-rows", "5000,10000"],
    "redlock": ["--seconds", "0.3", "--solo-seconds", "0.3", "--solo-runs", "1", "--rounds", "1",
                "--processes", "2", "--only", "tenure,pottery,aioredlock"],
    "idsets": ["--ids-a", "20000", "--ids-b", "30000", "--dense-below", "200000", "--others",
               "30", "--other-ids", "2000", "--rounds", "2"],
    "consumers": ["--messages", "2000", "--rounds", "1", "--processes", "1,2"],
    "otel": ["--rounds", "1", "--seconds", "0.2"],
}  # fmt: skip
"""Arguments of a short run of each benchmark (those of the real runs above)."""
DEFAULT_MINUTES = {
    "locks": (8, 20), "semaphores": (0.05, 0.3), "caches": (1.5, 6), "cache-paths": (1.5, 6),
    "ingest": (1.5, 6), "redlock": (1.5, 6), "idsets": (1.5, 6), "consumers": (0.3, 2),
    "otel": (0.5, 2),
}  # fmt: skip
"""Bounds of each benchmark's estimate for its defaults (measured on two cores)."""


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_estimates_its_run_from_its_arguments(name: str) -> None:
    module = load_benchmark(name)
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    default = module.estimated_seconds(parser.parse_args([]))
    low, high = DEFAULT_MINUTES[name]
    assert low * 60 <= default <= high * 60, default
    small = module.estimated_seconds(parser.parse_args(SMALL_RUNS[name]))
    assert 0 < small < default / 3, (small, default)
