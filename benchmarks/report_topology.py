"""The lock benchmark on a replicated or cluster topology: what acknowledgement costs.

``tenure bench locks --topology replicated|cluster`` measures tenure's Lock,
its ClusterLock with one and two replicas acknowledging, and redis-py's Lock
on one topology in one run. This module renders its own section of
``docs/benchmarks.md`` (``locks-replicated``, ``locks-cluster``) from the
solo and contended tables of :mod:`benchmarks.report` plus two of its
own: the price of an acknowledgement in round trips (the issue's target: at
most one extra round trip per acquisition over Lock), and each tenure row's
ratio to redis-py's Lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks import ratio
from benchmarks.contenders import REFERENCE, by_key
from benchmarks.measure import ContendedResult, SoloResult

__all__ = ["ACKNOWLEDGED", "RATIO_PEERS", "ack_cost_targets", "topology_sections"]

ACKNOWLEDGED = ("tenure-cluster-1", "tenure-cluster-2")
"""The ClusterLock rows (1 and 2 replicas acknowledging)."""

RATIO_PEERS = ("redis-py", "redis-py-1ms")

YARDSTICK = "tenure-plus-rtt"
"""Lock plus one PING per acquisition: what one extra round trip costs, measured."""


def ack_cost_targets(
    solo: Sequence[SoloResult], round_trip_us: float
) -> list[tuple[str, str, str, bool]]:
    """``(goal, key, measured, met)`` for each ClusterLock row measured solo.

    The yardstick is measured, not computed: tenure's Lock plus one ``PING``
    per acquisition, timed in the same interleaved solo runs, so the noise of
    the machine falls on both sides alike. ClusterLock meets the target when
    its cycles/s are at least the yardstick's.
    """
    by = {r.key: r for r in solo}
    plain, yardstick = by.get(REFERENCE), by.get(YARDSTICK)
    found = []
    for key in ACKNOWLEDGED:
        mine = by.get(key)
        if mine is None or plain is None or yardstick is None:
            continue
        extra_us = (1 / mine.median - 1 / plain.median) * 1e6
        trip_us = (1 / yardstick.median - 1 / plain.median) * 1e6
        found.append(
            (
                "ClusterLock costs <= 1 extra round trip per cycle over Lock (the WAIT)",
                key,
                f"{mine.median:,.0f}/s vs Lock + 1 PING {yardstick.median:,.0f}/s "
                f"({extra_us:,.0f} µs extra per cycle; a round trip costs {trip_us:,.0f} µs "
                f"here, a bare PING {round_trip_us:.0f} µs)",
                mine.median >= yardstick.median,
            )
        )
    return found


def topology_sections(
    solo: Sequence[SoloResult],
    contended: Sequence[ContendedResult],
    round_trip_us: float,
    topology: str,
) -> str:
    """The cost-of-acknowledgement and ratio-to-redis-py tables."""
    by_solo = {r.key: r for r in solo}
    by_contended = {r.key: r for r in contended}
    lines = [
        f"## What an acknowledgement costs ({topology})",
        "",
        "Per acquire + release cycle, from the solo medians: ClusterLock's cycle minus "
        "Lock's, beside what one more round trip costs, measured in the same runs "
        "(Lock + one `PING` per acquisition). The WAIT travels in the same round trip "
        "as the acquisition, so the extra is the replicas' acknowledgement "
        "(primary → replicas → primary).",
        "",
        "| Lock | cycle µs | Lock's cycle µs | extra µs | one round trip µs | extra / round trip |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    plain, yardstick = by_solo.get(REFERENCE), by_solo.get(YARDSTICK)
    for key in ACKNOWLEDGED:
        mine = by_solo.get(key)
        if mine is None or plain is None or yardstick is None:
            continue
        cycle, base = 1e6 / mine.median, 1e6 / plain.median
        trip = 1e6 / yardstick.median - base
        share = f"{(cycle - base) / trip:.2f}" if trip > 0 else "—"
        lines.append(
            f"| {by_key(key).label} | {cycle:,.0f} | {base:,.0f} | {cycle - base:,.0f} "
            f"| {trip:,.0f} | {share} |"
        )
    lines += [
        "",
        f"## tenure against redis-py's Lock ({topology})",
        "",
        "Each tenure row divided by each redis-py row of this run: solo cycles/s, "
        "contended acquisitions/s, and redis-py's p99 and worst wait over tenure's "
        "(above 1: tenure waited less). redis-py's lock lets the releaser retake it at "
        "once, so most of its waits are short and a few are seconds; tenure's are "
        "first come, first served.",
        "",
        "| tenure lock | vs | solo | contended acq/s | p99 wait | max wait |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key in (REFERENCE, *ACKNOWLEDGED):
        for peer in RATIO_PEERS:
            mine_solo, their_solo = by_solo.get(key), by_solo.get(peer)
            mine_run, their_run = by_contended.get(key), by_contended.get(peer)
            if (mine_solo is None or their_solo is None) and (
                mine_run is None or their_run is None
            ):
                continue
            solo_ratio = (
                ratio(mine_solo.median, their_solo.median)
                if mine_solo is not None and their_solo is not None
                else "—"
            )
            acq = p99 = worst = "—"
            if mine_run is not None and their_run is not None:
                acq = ratio(mine_run.throughput, their_run.throughput)
                p99 = ratio(their_run.wait_p99_ms, mine_run.wait_p99_ms)
                worst = ratio(their_run.wait_max_ms, mine_run.wait_max_ms)
            lines.append(
                f"| {by_key(key).label} | {by_key(peer).label} | {solo_ratio} | {acq} "
                f"| {p99} | {worst} |"
            )
    return "\n".join(lines) + "\n"
