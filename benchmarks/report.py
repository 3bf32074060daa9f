"""The lock benchmark's results as a terminal table, Markdown and JSON data.

The Markdown report is the ``locks`` section of ``docs/benchmarks.md``,
written whole by each run. Ratios are "tenure / row": above 1 means tenure's
``Lock(timeout=10)`` did better. The sections of the bounded pool, the many
waiters and the memory per name are drawn by :mod:`benchmarks.report_resources`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks import ratio as _ratio
from benchmarks.contenders import CONTENDERS, FLOOR, REFERENCE, by_key
from benchmarks.entity import EntityResult
from benchmarks.measure import ContendedResult, SoloResult
from benchmarks.names import NamesResult
from benchmarks.pool import PoolResult, SingleResult
from benchmarks.report_resources import (
    names_section,
    pool_section,
    resource_lines,
    resource_targets,
    waiters_section,
)
from benchmarks.report_scale import (
    TARGET_LABELS,
    entity_lines,
    entity_section,
    entity_targets,
    scale_lines,
    scale_section,
    scale_targets,
)
from benchmarks.report_topology import ack_cost_targets, topology_sections
from benchmarks.scale import HoldResult, WaitersResult
from benchmarks.waiters import CrowdResult

__all__ = ["Results", "RunInfo", "Target", "as_data", "render", "summary_table", "targets"]

BASELINE = "set-nx"
PEER = "redis-py"  # the targets compare with redis-py's default Lock (it polls every 0.1 s)
PEER_RATIO = 0.9  # issue 40: contended acquisitions/s at 0.9x redis-py's, fair
HANDOFF_FLOOR_RATIO = 2.0  # issue 40: a handoff within 2x a token passed by RPUSH/BLPOP
_TENURE_KEYS = ("tenure", "tenure-default")


@dataclass(frozen=True)
class RunInfo:
    """Where, when and how the benchmark ran."""

    command: str
    date: str
    nproc: int
    load: str
    python: str
    platform: str
    server: str
    server_source: str
    round_trip_us: float
    packages: dict[str, str]
    seconds: float
    solo_seconds: float
    solo_runs: int
    processes: int
    critical_ms: float
    elapsed: float
    parts: tuple[str, ...] = ("solo", "contended")
    rounds: int = 1
    single_tries: int = 5
    waiter_pool: int = 8
    idle_cap: float | None = None  # None: the names' idle wait was skipped
    topology: str = "standalone"
    scale_window: float = 3.0  # seconds of each traffic reading of the scale part


@dataclass
class Results:
    """Everything one run measured (a part that did not run stays empty)."""

    solo: list[SoloResult] = field(default_factory=list)
    contended: list[ContendedResult] = field(default_factory=list)
    pool: list[PoolResult] = field(default_factory=list)
    single: list[SingleResult] = field(default_factory=list)
    crowds: list[CrowdResult] = field(default_factory=list)
    names: list[NamesResult] = field(default_factory=list)
    entity: list[EntityResult] = field(default_factory=list)
    holds: list[HoldResult] = field(default_factory=list)
    scale_waiters: list[WaitersResult] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    """One goal from the issue and whether a tenure variant meets it (None: not checked)."""

    goal: str
    key: str
    measured: str
    met: bool | None


def targets(results: Results, info: RunInfo | None = None) -> list[Target]:
    """Check the issue's targets for each tenure variant that was measured."""
    solo, contended = results.solo, results.contended
    found: list[Target] = []
    if info is not None and info.topology != "standalone":
        found += [Target(*t) for t in ack_cost_targets(solo, info.round_trip_us)]
    peer = next((r for r in contended if r.key == PEER), None)
    floor = next((r for r in contended if r.key == FLOOR), None)
    solo_by_key = {r.key: r for r in solo}
    baseline = solo_by_key.get(BASELINE)
    for result in contended:
        if result.key not in _TENURE_KEYS:
            continue
        if peer is not None:
            ratio = result.throughput / peer.throughput
            found.append(
                Target(
                    f"contended acq/s >= {PEER_RATIO}x redis-py's default Lock",
                    result.key,
                    f"{result.throughput:,.0f}/s vs {peer.throughput:,.0f}/s "
                    f"(fairness {peer.fairness:.2f}): {ratio:.2f}x",
                    ratio >= PEER_RATIO,
                )
            )
        p99_ratio = result.wait_p99_ms / result.wait_p50_ms if result.wait_p50_ms > 0 else 0.0
        found.append(
            Target(
                "wait p99 <= 2x wait p50",
                result.key,
                f"{result.wait_p99_ms:.2f} ms / {result.wait_p50_ms:.2f} ms = {p99_ratio:.2f}x",
                result.wait_p50_ms > 0 and p99_ratio <= 2.0,
            )
        )
        found.append(
            Target(
                "fairness >= 0.95", result.key, f"{result.fairness:.3f}", result.fairness >= 0.95
            )
        )
        if floor is not None and floor.gap_p50_ms > 0:
            ratio = result.gap_p50_ms / floor.gap_p50_ms
            found.append(
                Target(
                    f"handoff (release to the next holder's acquire returning) p50 <= "
                    f"{HANDOFF_FLOOR_RATIO:g}x a token passed by `RPUSH`/`BLPOP`",
                    result.key,
                    f"{result.gap_p50_ms:.3f} ms vs {floor.gap_p50_ms:.3f} ms: {ratio:.2f}x",
                    ratio <= HANDOFF_FLOOR_RATIO,
                )
            )
    for key in _TENURE_KEYS:
        mine = solo_by_key.get(key)
        if mine is None or baseline is None:
            continue
        ratio = mine.median / baseline.median
        found.append(
            Target(
                "solo >= 0.95x bare SET NX PX + compare-and-delete",
                key,
                f"{mine.median:,.0f}/s vs {baseline.median:,.0f}/s: {ratio:.2f}x",
                ratio >= 0.95,
            )
        )
    for result in contended:
        found.append(
            Target(
                "no lost updates, no overlapping holds",
                result.key,
                f"{result.lost_updates} lost of {result.increments:,}, {result.overlaps} overlaps",
                result.lost_updates == 0 and result.overlaps == 0,
            )
        )
    for goal, key, measured, met in resource_targets(
        results.pool, results.crowds, results.names, peer=PEER, tenure_keys=_TENURE_KEYS
    ):
        found.append(Target(goal, key, measured, met))
    for goal, key, measured, met in entity_targets(results.entity):
        found.append(Target(goal, key, measured, met))
    for goal, key, measured, met in scale_targets(results.holds, results.scale_waiters):
        found.append(Target(goal, key, measured, met))
    return found


def as_data(info: RunInfo, results: Results) -> dict[str, Any]:
    """Everything measured, as JSON-ready data."""
    contended = [{k: v for k, v in asdict(r).items() if k != "waits_ms"} for r in results.contended]
    return {
        "run": asdict(info),
        "solo": [asdict(r) for r in results.solo],
        "contended": contended,
        "pool": [asdict(r) for r in results.pool],
        "single_connection": [asdict(r) for r in results.single],
        "waiters": [asdict(r) for r in results.crowds],
        "names": [asdict(r) for r in results.names],
        "entity": [asdict(r) for r in results.entity],
        "scale": {
            "holds": [asdict(r) for r in results.holds],
            "waiters": [asdict(r) for r in results.scale_waiters],
        },
        "targets": [asdict(t) for t in targets(results, info)],
    }


def render(info: RunInfo, results: Results, plot: str | None = None) -> str:
    """The ``locks`` section of the report; ``plot`` is the wait-time figure's relative path."""
    parts = [
        _header(info),
        _targets_table(targets(results, info)),
        _solo_table(results.solo, info),
        _contended_table(results.contended, info),
        topology_sections(results.solo, results.contended, info.round_trip_us, info.topology)
        if info.topology != "standalone"
        else "",
        _plot_figure(plot, info) if results.contended else "",
        _handoff_table(results.contended),
        pool_section(results.pool, results.single, info.single_tries, info.rounds),
        waiters_section(results.crowds),
        names_section(results.names, info.idle_cap),
        entity_section(results.entity, info.command, info.solo_seconds),
        scale_section(results.holds, results.scale_waiters, info.command, info.scale_window),
        _contenders_notes(),
    ]
    return "\n".join(part for part in parts if part)


def _header(info: RunInfo) -> str:
    packages = ", ".join(f"{name} {version}" for name, version in info.packages.items())
    title = "tenure vs peers" if info.topology == "standalone" else f"on a {info.topology} topology"
    return f"""<!-- Generated by `{info.command}`; do not edit: re-run it. -->
# Lock benchmarks: {title}

Generated by `{info.command}` on {info.date}, in {info.elapsed:.0f} s.
Every contender ran on the same server in the same run, one after another,
with `FLUSHDB` between measurements.

To run it, with the peers installed (`pip install -e ".[bench]"`):

```
tenure bench locks [--parts solo,contended,pool,waiters,names,entity,scale] [--skip PART,...] \\
    [--seconds 5] [--solo-seconds 3] [--solo-runs 3] [--rounds 3] \\
    [--processes 4] [--critical-ms 1] [--single-tries 5] \\
    [--tasks 1000] [--threads 100] [--waiter-pool 8] \\
    [--names 1000000] [--name-processes 2] [--idle-cap 120] [--skip-idle-wait] \\
    [--scale-holds 1000,10000,20000] [--scale-extra 500] \\
    [--scale-waiters 1000,10000] [--scale-window 3] \\
    [--url redis://host:port] [--output FILE.md] [--json FILE] [--plot FILE.png] \\
    [--only tenure,redis-py,...] [--topology standalone|replicated|cluster]
```

{_where(info)} This run: parts {", ".join(info.parts) or "none"}.
{_busy_note(info)}
| Machine | |
|---|---|
| CPUs (`nproc`) | {info.nproc} |
| Load average at start (1 / 5 / 15 min) | {info.load} |
| Python | {info.python} |
| Platform | {info.platform} |
| Server | {info.server} ({info.server_source}) |
| `PING` round trip, median | {info.round_trip_us:.0f} µs |
| Packages | {packages} |
"""


def _where(info: RunInfo) -> str:
    """How the run got its servers, and how long such a run takes."""
    if info.topology != "standalone":
        return (
            "With `--topology replicated` it starts a primary with two replicas "
            "(`tenure.server.Replicated`), with `--topology cluster` three masters with "
            "two replicas each (`tenure.server.Cluster`), on loopback, and stops them at "
            "the end. Only the solo and contended parts run there (the others are about "
            "one server), in about two minutes."
        )
    return (
        "Without `--url` it starts a private server (`tenure.server.ServerProcess`) on\n"
        "loopback and stops it at the end; a database given by `--url` is emptied\n"
        "(`FLUSHDB`), so it must hold no keys unless `--allow-flush` is passed. The\n"
        "default run takes about ten minutes, most of it the million names and the\n"
        "wait for their keys to expire (`--names 100000`, `--skip-idle-wait` or\n"
        "`--skip names` shorten it). The scale part is not in the default parts\n"
        "(it takes several minutes more, longer when holding many locks is slow):\n"
        "ask for it with `--parts scale` or `--parts all`."
    )


def _busy_note(info: RunInfo) -> str:
    try:
        busy = float(info.load.split("/")[0]) > info.nproc / 2
    except ValueError:
        return ""
    if not busy:
        return ""
    return (
        f"\n**The machine was busy when this run started (load {info.load.split('/')[0].strip()} "
        f"on {info.nproc} CPUs): other processes competed for the CPUs, so the numbers "
        "are noisier than usual.**\n"
    )


def _label(key: str) -> str:
    if key in TARGET_LABELS:
        return TARGET_LABELS[key]
    return by_key(key).label


def _solo_table(solo: Sequence[SoloResult], info: RunInfo) -> str:
    if not solo:
        return "## Solo\n\nNot measured in this run.\n"
    by_key_ = {r.key: r for r in solo}
    reference = by_key_.get(REFERENCE)
    mine = None if reference is None else reference.median
    baseline = by_key_.get(BASELINE)
    each = info.solo_seconds / info.solo_runs
    lines = [
        "## Solo: one process, acquire + release, no critical section",
        "",
        f"Cycles per second, median of {info.solo_runs} runs of {each:g} s "
        "(runs interleaved across contenders).",
        "",
        "| Lock | cycles/s (median) | runs | row / bare SET NX | tenure / row |",
        "|---|---:|---|---:|---:|",
    ]
    for result in solo:
        runs = ", ".join(f"{r:,.0f}" for r in result.runs)
        floor = "—" if baseline is None else _ratio(result.median, baseline.median)
        lines.append(
            f"| {_label(result.key)} | {result.median:,.0f} | {runs} | {floor} "
            f"| {_ratio(mine, result.median)} |"
        )
    lines += [
        "",
        "Runs that disagree by more than a few percent mean the machine was "
        "disturbed (another process, the hypervisor): compare ratios within one run only.",
    ]
    return "\n".join(lines) + "\n"


def _contended_table(contended: Sequence[ContendedResult], info: RunInfo) -> str:
    if not contended:
        return "## Contended\n\nNot measured in this run.\n"
    reference = next((r for r in contended if r.key == REFERENCE), None)
    mine = None if reference is None else reference.throughput
    lines = [
        f"## Contended: {info.processes} processes, {info.critical_ms:g} ms critical section",
        "",
        f"Each process loops acquire → racy `GET`/sleep {info.critical_ms:g} ms/`SET` "
        f"increment → release for {info.seconds:g} s from a common start instant; "
        f"{info.rounds} round(s) per lock, interleaved across locks (every other round "
        "in reverse order). Every figure is the median over the rounds, each taken on "
        "its own; per process is from the round with the median rate. "
        "Wait = time from calling acquire to it returning. Fairness = least served "
        "process / most served process. Lost updates = increments the counter missed, "
        "all rounds (must be 0).",
        "",
        "| Lock | acq/s | rounds acq/s | wait p50 ms | p99 ms | max ms | p99 / p50 "
        "| fairness | per process | lost updates | tenure / row |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in contended:
        per = " / ".join(str(n) for n in r.per_process)
        rounds = ", ".join(f"{x:,.0f}" for x in r.rounds) or f"{r.throughput:,.0f}"
        spread = r.wait_p99_ms / r.wait_p50_ms if r.wait_p50_ms > 0 else float("inf")
        lines.append(
            f"| {_label(r.key)} | {r.throughput:,.0f} | {rounds} | {r.wait_p50_ms:.2f} "
            f"| {r.wait_p99_ms:.2f} | {r.wait_max_ms:.1f} | {spread:.1f} "
            f"| {r.fairness:.2f} | {per} | {r.lost_updates} | {_ratio(mine, r.throughput)} |"
        )
    timeouts = [r for r in contended if r.timeouts]
    for r in timeouts:
        lines.append(f"\n{_label(r.key)}: {r.timeouts} acquire(s) gave up after the bound.")
    return "\n".join(lines) + "\n"


def _plot_figure(plot: str | None, info: RunInfo) -> str:
    if plot is None:
        return ""
    return f"""### Wait-time distributions from the same run

![Wait times per lock: cumulative share, and the tail on log-log axes]({plot})

Left: the share of acquisitions that waited at most t (log time axis). Right:
the share that waited at least t, on log-log axes, where the worst waits show.
A lock that barges (the releaser retakes it at once) has many tiny waits and
a long tail; a FIFO handoff has every wait near (processes - 1) x the hold
time, and no tail. Drawn by `--plot`.
"""


def _handoff_table(contended: Sequence[ContendedResult]) -> str:
    if not contended:
        return ""
    lines = [
        "### Where the time goes: hold windows from the same run",
        "",
        "A hold runs from acquire returning to release being called (one clock, "
        "`CLOCK_MONOTONIC`, shared by the processes). Gap = from one holder calling "
        "release to the next holder's acquire returning: the time the lock is idle "
        "between holders. Handed on = share of holds whose predecessor was another "
        "process (the rest are the same process re-acquiring). Overlapping holds must be 0.",
        "",
        "Medians over the rounds; overlapping holds are summed.",
        "",
        "| Lock | hold p50 ms | gap p50 ms | gap p99 ms | handed on | overlapping holds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in contended:
        lines.append(
            f"| {_label(r.key)} | {r.hold_p50_ms:.2f} | {r.gap_p50_ms:.2f} "
            f"| {r.gap_p99_ms:.1f} | {r.handed_on:.0%} | {r.overlaps} |"
        )
    return "\n".join(lines) + "\n"


def _met(met: bool | None) -> str:
    if met is None:
        return "not checked"
    return "met" if met else "**not met**"


def _targets_table(found: Sequence[Target]) -> str:
    lines = [
        "## Targets",
        "",
        "The issue's goals for tenure, checked against this run (details in the tables "
        "below; contended and pool figures are medians of the rounds).",
        "",
        "| Goal | Lock | Measured | Met |",
        "|---|---|---|---|",
    ]
    for t in found:
        lines.append(f"| {t.goal} | {_label(t.key)} | {t.measured} | {_met(t.met)} |")
    return "\n".join(lines) + "\n"


def _contenders_notes() -> str:
    keys = ", ".join(f"`{c.key}`" for c in CONTENDERS)
    return f"""## Notes

- Contenders (`--only` takes these keys): {keys}.
- Every lock has a 10 s lease except tenure's default `Lock()`, which holds
  until released on a 30 s lease renewed in the background. A blocking
  acquire is bounded at 10 s so no run can hang.
- In the solo and contended parts, one lock object per process is reused for
  every cycle; each process has its own `redis.Redis` client (one connection
  in use at a time). The per-entity and scale parts make a lock object per
  name, with each library's default arguments (see their sections).
- The bare `SET NX PX` loop never waits, so it is a solo baseline only.
- The critical section's `GET` and `SET` add two round trips to every hold;
  they are the same for every contender.
"""


def summary_table(results: Results, info: RunInfo | None = None) -> str:
    """The results as plain text for the terminal, with tenure's ratio to each row.

    The first block (one row per lock) is the solo and contended table (left
    out when neither ran); the other parts and the targets follow, each after
    a blank line.
    """
    solo_by_key = {r.key: r for r in results.solo}
    contended_by_key = {r.key: r for r in results.contended}
    reference_solo = solo_by_key.get(REFERENCE)
    reference = contended_by_key.get(REFERENCE)
    head = (
        f"{'lock':<20}{'solo/s':>9}{'tenure/row':>11}{'acq/s':>9}{'tenure/row':>11}"
        f"{'wait p50':>10}{'p99':>9}{'max':>9}{'fairness':>9}{'lost':>6}"
    )
    lines = [head, "-" * len(head)]
    for contender in CONTENDERS:
        mine, theirs = solo_by_key.get(contender.key), contended_by_key.get(contender.key)
        if mine is None and theirs is None:
            continue
        row = f"{contender.key:<20}"
        if mine is not None:
            ratio = _ratio(None if reference_solo is None else reference_solo.median, mine.median)
            row += f"{mine.median:>9,.0f}{ratio:>11}"
        else:
            row += f"{'-':>9}{'-':>11}"
        if theirs is not None:
            ratio = _ratio(None if reference is None else reference.throughput, theirs.throughput)
            row += (
                f"{theirs.throughput:>9,.0f}{ratio:>11}{theirs.wait_p50_ms:>8.2f}ms"
                f"{theirs.wait_p99_ms:>7.1f}ms{theirs.wait_max_ms:>7.0f}ms"
                f"{theirs.fairness:>9.2f}{theirs.lost_updates:>6}"
            )
        lines.append(row)
    lines.append(
        "tenure/row above 1: tenure Lock(timeout=10) did more. fairness = least served "
        "process / most served. Contended figures: medians of the rounds."
    )
    if not solo_by_key and not contended_by_key:
        lines = []  # neither part ran: no empty table
    lines += resource_lines(results.pool, results.single, results.crowds, results.names)
    lines += entity_lines(results.entity)
    lines += scale_lines(results.holds, results.scale_waiters)
    found = targets(results, info)
    if found:
        lines += ["", "targets:"]
        for t in found:
            verdict = {None: "not checked", True: "met", False: "NOT MET"}[t.met]
            lines.append(f"  [{verdict}] {t.key}: {t.goal}: {t.measured}")
    return "\n".join(lines).lstrip("\n")
