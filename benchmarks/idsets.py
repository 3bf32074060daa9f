"""``tenure bench idsets``: intersecting large id sets, tenure beside Redis sets and numpy.

    tenure bench idsets [--ids-a 5000000] [--ids-b 7500000] [--dense-below 50000000]
        [--rounds 7] [--others 1000] [--other-ids 100000] [--skip native,overlaps]
        [--url URL [--allow-flush]] [--output FILE.md] [--json FILE]

The data has the shape of Carlson's "Fast set intersection": two sets of
``--ids-a`` and ``--ids-b`` distinct 32-bit ids, (a) spread over the whole
32-bit range and (b) dense below ``--dense-below``. For each, one run
measures: Redis ``SINTERCARD`` on native sets (and the memory the server
gives them), numpy's ``intersect1d`` on sorted uint32 arrays, pyroaring
alone (the bitmaps in memory, no server), and tenure's ``IdSet``: cold
(this process has no copy: fetch, validate, decode, count) and warm
(revalidate both in one round trip, count), with the server memory per id.
Then ``top_overlaps`` of the dense set against ``--others`` sets of
``--other-ids`` ids each, cold and warm. Every time is the median of
``--rounds`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks import (
    BenchmarkError,
    add_output_arguments,
    check_empty,
    package_versions,
    progress,
    require_peer,
    round_trip_us,
    run_timed,
    server_version,
)
from benchmarks.sections import write_section
from tenure.server._process import given_or_private

__all__ = ["add_arguments", "estimated_seconds", "run_command"]

SKIPPABLE = ("native", "overlaps")
_PACKAGES = ("tenure", "redis", "numpy", "pyroaring")
SADD_BATCH = 100_000
NOTE_EVERY = 15.0  # seconds between two lines of progress of a long load

# How long a run takes (estimated_seconds), measured on the 2-core machine of
# docs/benchmarks.md: rates in ids/s, times in seconds.
START = 1.2  # the interpreter, numpy and pyroaring imported, the private server, the report
DRAW_US = {"spread": 1.3, "dense": 3.5}  # µs per distinct id drawn (numpy's unique: a hash)
NUMPY_RATE = 25e6  # ids through intersect1d, per run
BITMAP_RATE = 30e6  # ids made into bitmaps
LOAD_RATE = 8e6  # ids into an IdSet (add_many, compact)
COLD_RATE = 100e6  # ids fetched, validated and decoded by a cold count, per run
WARM_RUN = 0.005  # a warm count: one round trip, the bitmaps' intersection
SADD_RATE = 0.6e6  # ids into a native set
SINTERCARD_RATE = 30e6  # ids of the two sets through SINTERCARD, per run
OTHER_RATE = 2.8e6  # ids of the other sets: drawn, added, compacted
OVERLAP_RATE = 140e6  # ids through a top_overlaps run, cold (warm: a tenth of that time)


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--ids-a", type=int, default=5_000_000, help="the first set (5,000,000)")
    parser.add_argument("--ids-b", type=int, default=7_500_000, help="the second (7,500,000)")
    parser.add_argument(
        "--dense-below", type=int, default=50_000_000, help="the dense data's range (50,000,000)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="runs per figure, median (7)")
    parser.add_argument("--others", type=int, default=1000, help="sets for top_overlaps (1000)")
    parser.add_argument(
        "--other-ids", type=int, default=100_000, help="ids in each of those (100,000)"
    )
    parser.add_argument(
        "--skip", default="", help=f"comma-separated parts to leave out: {', '.join(SKIPPABLE)}"
    )
    parser.add_argument("--json", help="also write the raw results here")
    add_output_arguments(parser, output, None)


def _check(args: argparse.Namespace) -> set[str]:
    if not 1_000 <= args.ids_a <= 50_000_000 or not 1_000 <= args.ids_b <= 50_000_000:
        raise BenchmarkError("--ids-a and --ids-b must be in 1,000..50,000,000")
    if not max(args.ids_a, args.ids_b) * 2 <= args.dense_below <= 2**32:
        raise BenchmarkError("--dense-below must be at least twice the larger set, at most 2**32")
    if not 1 <= args.rounds <= 99:
        raise BenchmarkError("--rounds must be in 1..99")
    if not 1 <= args.others <= 100_000 or not 1 <= args.other_ids <= args.dense_below // 2:
        raise BenchmarkError("--others must be in 1..100,000 and --other-ids in 1..dense-below/2")
    skip = _skipped(args)
    unknown = skip - set(SKIPPABLE)
    if unknown:
        raise BenchmarkError(
            f"--skip: unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(SKIPPABLE)}"
        )
    require_peer("numpy", "numpy")
    require_peer("pyroaring", "pyroaring")
    return skip


def _skipped(args: argparse.Namespace) -> set[str]:
    return {part.strip() for part in args.skip.split(",") if part.strip()}


# -- data ------------------------------------------------------------------------------


def distinct_ids(rng: Any, count: int, below: int) -> Any:
    """``count`` distinct ids drawn uniformly from ``0..below-1``, sorted, as uint32."""
    import numpy as np

    ids = np.unique(rng.integers(0, below, int(count * 1.05) + 1000, dtype=np.uint64))
    while len(ids) < count:  # pragma: no cover - 5% spare covers any sane density
        more = rng.integers(0, below, count, dtype=np.uint64)
        ids = np.unique(np.concatenate([ids, more]))
    return np.sort(rng.choice(ids, count, replace=False)).astype(np.uint32)


def _drawn(rng: Any, count: int, below: int) -> Any:
    """:func:`distinct_ids`, with a line of progress (a few million take seconds each)."""
    started = time.perf_counter()
    ids = distinct_ids(rng, count, below)
    progress(f"  {count:,} ids drawn in {time.perf_counter() - started:.1f} s")
    return ids


# -- measurements ----------------------------------------------------------------------


def median_ms(
    call: Callable[[], Any], rounds: int, *, before: Callable[[], Any] | None = None
) -> tuple[float, Any]:
    """The median time of ``call`` in ms over ``rounds`` runs (``before`` runs untimed first)."""
    times = []
    result = None
    for _ in range(rounds):
        if before is not None:
            before()
        started = time.perf_counter()
        result = call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


@dataclass
class Row:
    """One way of intersecting the two sets: its median time and memory per id."""

    key: str
    label: str
    ms: float
    count: int
    bytes_per_id: float | None = None
    note: str = ""


@dataclass
class Scenario:
    """Every row for one shape of data."""

    name: str
    title: str
    expected: int = 0
    rows: list[Row] = field(default_factory=list)

    def row(self, key: str) -> Row | None:
        """The row ``key`` (None if not measured)."""
        return next((r for r in self.rows if r.key == key), None)


@dataclass
class Overlaps:
    """``top_overlaps`` against many sets, cold and warm."""

    others: int
    other_ids: int
    cold_ms: float
    warm_ms: float
    top_count: int
    bytes_per_id: float


def _memory(client: redis.Redis, keys: Sequence[str]) -> int:
    total = 0
    for key in keys:
        used = client.memory_usage(key, samples=0)
        total += int(used or 0)
    return total


def measure_scenario(
    client: redis.Redis,
    name: str,
    title: str,
    a: Any,
    b: Any,
    args: argparse.Namespace,
    skip: set[str],
) -> Scenario:
    """Every row of one scenario, on sorted uint32 arrays ``a`` and ``b``."""
    import numpy as np

    from tenure import IdSet
    from tenure._tooling import LOCAL_COPIES, bitmap_of

    scenario = Scenario(name, title)
    rounds = args.rounds
    ms, count = median_ms(lambda: len(np.intersect1d(a, b, assume_unique=True)), rounds)
    scenario.expected = int(count)
    scenario.rows.append(
        Row("numpy", "numpy `intersect1d` (sorted uint32 arrays)", ms, int(count), 4.0)
    )
    progress(f"  numpy intersect1d: {ms:.1f} ms ({count:,} shared)")

    bitmap_a, bitmap_b = bitmap_of(a), bitmap_of(b)
    size = len(bitmap_a.serialize()) + len(bitmap_b.serialize())
    ms, count = median_ms(lambda: bitmap_a.intersection_cardinality(bitmap_b), max(rounds, 21))
    scenario.rows.append(
        Row(
            "pyroaring",
            "pyroaring alone (in memory, no server)",
            ms,
            int(count),
            size / (len(a) + len(b)),
        )
    )
    progress(f"  pyroaring alone: {ms:.2f} ms")

    first, second = IdSet(client, f"bench:{name}:a"), IdSet(client, f"bench:{name}:b")
    started = time.perf_counter()
    for item, ids in ((first, a), (second, b)):
        item.add_many(ids)
        item.compact()  # a load past delta_limit compacts by itself; a smaller one now
    progress(f"  tenure: loaded in {time.perf_counter() - started:.1f} s")
    keys = [*first.keys.read, *second.keys.read]
    used = _memory(client, keys)
    per_id = used / (len(a) + len(b))
    ms, count = median_ms(
        lambda: first.intersection_count(second), rounds, before=LOCAL_COPIES.clear
    )
    scenario.rows.append(
        Row(
            "tenure-cold",
            "tenure `IdSet` cold (fetch, validate, decode, count)",
            ms,
            int(count),
            per_id,
        )
    )
    progress(f"  tenure cold: {ms:.1f} ms, {per_id:.2f} bytes per id on the server")
    first.intersection_count(second)
    ms, count = median_ms(lambda: first.intersection_count(second), max(rounds, 21))
    scenario.rows.append(
        Row("tenure-warm", "tenure `IdSet` warm (revalidate both, count)", ms, int(count), per_id)
    )
    progress(f"  tenure warm: {ms:.2f} ms")
    near_first = IdSet(client, f"bench:{name}:a", near=True)
    near_second = IdSet(client, f"bench:{name}:b", near=True)
    _answered_near(near_first, near_second)
    ms, count = median_ms(lambda: near_first.intersection_count(near_second), max(rounds, 21))
    scenario.rows.append(
        Row(
            "tenure-near",
            "tenure `IdSet` warm, `near=True` (no round trip: no write announced)",
            ms,
            int(count),
            per_id,
        )
    )
    progress(f"  tenure warm, near: {ms:.2f} ms")
    first.clear()
    second.clear()
    client.delete(*keys)
    LOCAL_COPIES.clear()

    if "native" not in skip:
        native_a, native_b = f"bench:{name}:native:{{s}}:a", f"bench:{name}:native:{{s}}:b"
        started = time.perf_counter()
        for key, ids in ((native_a, a), (native_b, b)):
            for start in range(0, len(ids), SADD_BATCH):
                client.sadd(key, *ids[start : start + SADD_BATCH].tolist())
        progress(f"  native sets: loaded in {time.perf_counter() - started:.1f} s")
        used = _memory(client, [native_a, native_b])
        ms, count = median_ms(lambda: client.sintercard(2, [native_a, native_b]), rounds)
        scenario.rows.append(
            Row(
                "sintercard",
                "Redis `SINTERCARD` on native sets",
                ms,
                int(count),
                used / (len(a) + len(b)),
            )
        )
        progress(f"  SINTERCARD: {ms:.1f} ms, {used / (len(a) + len(b)):.1f} bytes per id")
        client.unlink(native_a, native_b)
    for row in scenario.rows:
        if row.count != scenario.expected:
            raise BenchmarkError(f"{row.label} counted {row.count:,}, numpy {scenario.expected:,}")
    return scenario


def _answered_near(first: Any, second: Any) -> None:
    """Query until a query is answered from memory (the tracking connection up)."""
    deadline = time.monotonic() + 10
    while True:
        before = first.statistics().near_reads
        first.intersection_count(second)
        if first.statistics().near_reads > before:
            return
        if time.monotonic() > deadline:
            raise BenchmarkError("the near id sets never answered from memory")
        time.sleep(0.01)


def measure_overlaps(
    client: redis.Redis, dense: Any, args: argparse.Namespace, rng: Any
) -> Overlaps:
    """``top_overlaps`` of the dense set against ``--others`` sets, cold and warm."""
    from tenure import IdSet
    from tenure._tooling import LOCAL_COPIES

    mine = IdSet(client, "bench:overlaps:me")
    mine.add_many(dense)
    others = [IdSet(client, f"bench:overlaps:{i}") for i in range(args.others)]
    started = time.perf_counter()
    mine.compact()
    note = started + NOTE_EVERY
    for index, other in enumerate(others):
        other.add_many(distinct_ids(rng, args.other_ids, args.dense_below))
        other.compact()
        if time.perf_counter() >= note:
            progress(f"top_overlaps: {index + 1:,} of {args.others:,} sets loaded")
            note += NOTE_EVERY
    progress(f"top_overlaps: {args.others:,} sets loaded in {time.perf_counter() - started:.1f} s")
    keys = [key for other in others for key in other.keys.read]
    used = sum(_memory(client, keys[i : i + 3]) for i in range(0, len(keys), 3))
    rounds = max(1, min(args.rounds, 5))
    cold_ms, _ = median_ms(lambda: mine.top_overlaps(others, 10), rounds, before=LOCAL_COPIES.clear)
    warm_ms, top = median_ms(lambda: mine.top_overlaps(others, 10), args.rounds)
    progress(f"  cold {cold_ms:,.0f} ms, warm {warm_ms:,.1f} ms")
    for item in (mine, *others):
        client.delete(*item.keys.read)
    LOCAL_COPIES.clear()
    return Overlaps(
        args.others,
        args.other_ids,
        cold_ms,
        warm_ms,
        int(top[0][1]),
        used / (args.others * args.other_ids),
    )


# -- report ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One of the issue's targets and whether this run met it."""

    what: str
    figures: str
    met: bool


def targets(scenarios: dict[str, Scenario], overlaps: Overlaps | None) -> list[Target]:
    """The issue's targets, judged on this run's figures."""
    found = []
    limits = {"spread": 6.0, "dense": 1.0}
    for name, scenario in scenarios.items():
        warm = scenario.row("tenure-warm")
        if warm is None:
            continue
        found.append(
            Target(
                f"warm count <= {limits[name]:g} ms in {scenario.title.split()[0]}",
                f"{warm.ms:.2f} ms",
                warm.ms <= limits[name],
            )
        )
        native = scenario.row("sintercard")
        if native is not None:
            found.append(
                Target(
                    f">= 50x faster than SINTERCARD in {scenario.title.split()[0]}",
                    f"{native.ms / warm.ms:,.0f}x ({native.ms:,.0f} ms / {warm.ms:.2f} ms)",
                    native.ms / warm.ms >= 50,
                )
            )
        near = scenario.row("tenure-near")
        if name == "dense" and near is not None:
            found.append(
                Target(
                    f"warm count with near=True <= 0.3 ms in {scenario.title.split()[0]}",
                    f"{near.ms:.2f} ms",
                    near.ms <= 0.3,
                )
            )
        if name == "spread" and warm.bytes_per_id is not None:
            found.append(
                Target(
                    f"<= 2.2 bytes per id on the server in {scenario.title.split()[0]}",
                    f"{warm.bytes_per_id:.2f}",
                    warm.bytes_per_id <= 2.2,
                )
            )
    if overlaps is not None:
        found.append(
            Target(
                f"top_overlaps against {overlaps.others:,} sets of "
                f"{overlaps.other_ids:,} ids warm < 0.5 s",
                f"{overlaps.warm_ms:,.0f} ms (cold {overlaps.cold_ms:,.0f} ms)",
                overlaps.warm_ms < 500,
            )
        )
    return found


def render(
    info: dict[str, Any],
    scenarios: dict[str, Scenario],
    overlaps: Overlaps | None,
    found: list[Target],
) -> str:
    """The ``idsets`` section of docs/benchmarks.md."""
    parts = [
        "## Id sets: intersecting large sets of 32-bit ids",
        "",
        f"`{info['command']}` — {info['date']}, {info['nproc']} CPUs (load {info['load']}), "
        f"{info['python']}, {info['server']} on loopback (PING {info['rtt_us']:.0f} µs); "
        + ", ".join(f"{k} {v}" for k, v in info["packages"].items())
        + ".",
        "",
        f"Two sets of {info['ids_a']:,} and {info['ids_b']:,} distinct ids; every time is the "
        f"median of {info['rounds']} runs (21 for the fastest rows). Memory is what the server "
        "reports (`MEMORY USAGE`) for the set's keys, per id; numpy's is its arrays'.",
    ]
    for scenario in scenarios.values():
        parts += [
            "",
            f"### {scenario.title.capitalize()}: {scenario.expected:,} ids shared",
            "",
            "| intersection count | median | bytes per id | tenure warm is faster by |",
            "|---|---:|---:|---:|",
        ]
        warm = scenario.row("tenure-warm")
        for row in scenario.rows:
            faster = f"{row.ms / warm.ms:,.2f}x" if warm and row is not warm else "—"
            per_id = "—" if row.bytes_per_id is None else f"{row.bytes_per_id:.2f}"
            parts.append(f"| {row.label} | {row.ms:,.2f} ms | {per_id} | {faster} |")
    if overlaps is not None:
        parts += [
            "",
            f"### `top_overlaps` against {overlaps.others:,} sets of {overlaps.other_ids:,} ids",
            "",
            f"The dense set's ten largest overlaps among {overlaps.others:,} sets (ids below "
            f"{info['dense_below']:,}; {overlaps.bytes_per_id:.2f} bytes per id on the server): "
            f"cold (this process has no copy) {overlaps.cold_ms:,.0f} ms, warm (every set "
            f"revalidated in one round trip, then counted) {overlaps.warm_ms:,.1f} ms; the "
            f"largest overlap is {overlaps.top_count:,} ids.",
        ]
    parts += ["", "### Targets", "", "| target | this run | met |", "|---|---|---|"]
    for target in found:
        parts.append(f"| {target.what} | {target.figures} | {'yes' if target.met else '**no**'} |")
    return "\n".join(parts) + "\n"


def run_command(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run with parsed ``args``; ``command`` is how it was called (for the report)."""
    skip = _check(args)
    if args.url:
        check_empty(args.url, args.allow_flush)
    rows = ["numpy", "pyroaring", "IdSet", *(["SINTERCARD"] if "native" not in skip else [])]
    what = f"{', '.join(rows)} on two shapes of data" + (
        "" if "overlaps" in skip else f", top_overlaps against {args.others:,} sets"
    )
    estimate = estimated_seconds(args)
    return run_timed("idsets", estimate, what, lambda: run(args, command, skip))


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long a run with ``args`` (checked) takes: its ids over each step's rate."""
    skip = _skipped(args)
    ids, rounds = int(args.ids_a) + int(args.ids_b), int(args.rounds)
    many = max(rounds, 21)  # the fast rows' runs
    scenario = ids / BITMAP_RATE + ids / LOAD_RATE + many * WARM_RUN
    scenario += rounds * (ids / NUMPY_RATE + ids / COLD_RATE) + many * ids / BITMAP_RATE / 20
    if "native" not in skip:
        scenario += ids / SADD_RATE + rounds * ids / SINTERCARD_RATE
    total = START + 2 * scenario + ids * sum(DRAW_US.values()) / 1e6
    if "overlaps" not in skip:
        others = int(args.others) * int(args.other_ids)
        runs = min(rounds, 5) + rounds / 10
        total += others / OTHER_RATE + runs * (others + args.ids_a) / OVERLAP_RATE
    return float(total)


@contextlib.contextmanager
def _client(url: str | None) -> Iterator[redis.Redis]:
    with (
        given_or_private(url, name="bench-idsets") as (where, _),
        redis.Redis.from_url(where, socket_timeout=120) as client,
    ):
        client.flushdb()
        yield client


def run(args: argparse.Namespace, command: Sequence[str], skip: set[str]) -> None:
    """Measure both scenarios (and top_overlaps), print the report and write what was asked."""
    import numpy as np

    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    rng = np.random.default_rng(2026)
    scenarios: dict[str, Scenario] = {}
    overlaps = None
    with _client(args.url) as client:
        server, rtt_us = server_version(client), round_trip_us(client, 300)
        for name, title, below in (
            ("spread", "(a) spread over the 32-bit range", 2**32),
            ("dense", f"(b) dense below {args.dense_below:,}", args.dense_below),
        ):
            progress(f"{title}:")
            a, b = (_drawn(rng, count, below) for count in (args.ids_a, args.ids_b))
            scenarios[name] = measure_scenario(client, name, title, a, b, args, skip)
            if name == "dense" and "overlaps" not in skip:
                overlaps = measure_overlaps(client, a, args, rng)
    found = targets(scenarios, overlaps)
    info = {
        "command": shlex.join(command),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count() or 0,
        "load": load,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "server": server,
        "rtt_us": rtt_us,
        "packages": package_versions(_PACKAGES),
        "ids_a": args.ids_a,
        "ids_b": args.ids_b,
        "dense_below": args.dense_below,
        "rounds": args.rounds,
    }
    text = render(info, scenarios, overlaps, found)
    print(text, flush=True)
    if args.output:
        write_section(Path(args.output), "idsets", text)
        progress(f"wrote {args.output}")
    if args.json:
        data = {
            "info": info,
            "scenarios": {name: asdict(s) for name, s in scenarios.items()},
            "overlaps": None if overlaps is None else asdict(overlaps),
            "targets": [asdict(t) for t in found],
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        progress(f"wrote {args.json}")
