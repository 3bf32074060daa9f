"""The options of ``tenure bench locks``: the parts to run and the counts of each.

:mod:`benchmarks.locks` runs them; this module declares them
(``add_arguments``), checks them before anything starts
(``check_arguments``), and reads the part and contender selections
(``parts``, ``select``).
"""

from __future__ import annotations

import argparse

from benchmarks import BenchmarkError, add_output_arguments
from benchmarks.contenders import CONTENDERS, TOPOLOGIES, Contender
from benchmarks.names import DEFAULT_IDLE_CAP
from benchmarks.otel import OTEL_HELP

__all__ = [
    "DEFAULT_PARTS",
    "MAX_SCALE",
    "PARTS",
    "TOPOLOGY_PARTS",
    "add_arguments",
    "counts",
    "parts",
    "select",
]

DEFAULT_PARTS = ("solo", "contended", "pool", "waiters", "names", "entity")
PARTS = (*DEFAULT_PARTS, "scale")
"""Every part, in run order; ``scale`` runs only when asked for (``--parts``)."""
MAX_SCALE = 100_000  # the largest --scale-holds / --scale-waiters count
TOPOLOGY_PARTS = ("solo", "contended")
"""The parts a replicated or cluster run measures (the others are about one server)."""


def add_arguments(parser: argparse.ArgumentParser, *, output: str | None = None) -> None:
    """The options of this benchmark (see the module docstring)."""
    parser.add_argument("--seconds", type=float, default=5.0, help="per contended run (5)")
    parser.add_argument(
        "--solo-seconds", type=float, default=3.0, help="per solo contender, all runs (3)"
    )
    parser.add_argument("--solo-runs", type=int, default=3, help="solo runs, median taken (3)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="contended and bounded-pool rounds, median taken (3)"
    )
    parser.add_argument("--processes", type=int, default=4, help="contending processes (4)")
    parser.add_argument("--critical-ms", type=float, default=1.0, help="time held (1 ms)")
    parser.add_argument(
        "--parts",
        default=None,
        help=f"comma-separated parts to run, or all (default: {','.join(DEFAULT_PARTS)}; "
        f"known: {','.join(PARTS)})",
    )
    parser.add_argument("--skip", default="", help="comma-separated parts not to run")
    parser.add_argument(
        "--otel",
        action="store_true",
        help="with --parts solo: " + OTEL_HELP.format(what="the solo lock loop"),
    )
    parser.add_argument(
        "--single-tries", type=int, default=5, help="single-connection handoffs, median taken (5)"
    )
    parser.add_argument("--tasks", type=int, default=1000, help="waiting asyncio tasks (1000)")
    parser.add_argument("--threads", type=int, default=100, help="waiting threads (100)")
    parser.add_argument(
        "--waiter-pool",
        type=int,
        default=8,
        help="connections of the waiters' pool, waiters and scale parts (8)",
    )
    parser.add_argument(
        "--names", type=int, default=1_000_000, help="distinct lock names (1,000,000)"
    )
    parser.add_argument(
        "--name-processes",
        type=int,
        default=2,
        help="processes driving the names; 0: this process (2)",
    )
    parser.add_argument(
        "--idle-cap",
        type=float,
        default=DEFAULT_IDLE_CAP,
        help=f"longest wait for the names' keys to go ({DEFAULT_IDLE_CAP:g} s)",
    )
    parser.add_argument(
        "--skip-idle-wait",
        action="store_true",
        help="read the names' keys right after the run only",
    )
    parser.add_argument(
        "--scale-holds",
        default="1000,10000,20000",
        help="scale: comma-separated counts of locks held (1000,10000,20000)",
    )
    parser.add_argument(
        "--scale-extra",
        type=int,
        default=500,
        help="scale: acquire + release pairs timed at each count held (500)",
    )
    parser.add_argument(
        "--scale-waiters",
        default="1000,10000",
        help="scale: comma-separated counts of asyncio tasks waiting on one lock (1000,10000)",
    )
    parser.add_argument(
        "--scale-window",
        type=float,
        default=3.0,
        help="scale: seconds of each refresh-traffic reading (3)",
    )
    add_output_arguments(parser, output, "wait-time")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument(
        "--only", help="comma-separated contender keys (default: all)", default=None
    )
    parser.add_argument(
        "--topology",
        choices=TOPOLOGIES,
        default="standalone",
        help="standalone (default), replicated (primary + 2 replicas) or cluster "
        "(3 masters x 2 replicas), started privately",
    )


def counts(text: str, option: str) -> tuple[int, ...]:
    """The distinct counts of a comma-separated option, ascending, each in 1..MAX_SCALE."""
    found: set[int] = set()
    for item in (t.strip() for t in text.split(",")):
        try:
            value = int(item.replace("_", ""))
        except ValueError:
            value = 0
        if not 1 <= value <= MAX_SCALE:
            raise BenchmarkError(
                f"{option} takes comma-separated counts in 1..{MAX_SCALE} (got {item!r})"
            )
        found.add(value)
    return tuple(sorted(found))


def parts(args: argparse.Namespace) -> tuple[str, ...]:
    """The parts to run, in run order: ``--parts`` (default: all but scale) less ``--skip``."""
    given = ",".join(DEFAULT_PARTS) if args.parts is None else args.parts
    chosen = {p.strip() for p in given.split(",") if p.strip()}
    if "all" in chosen:
        chosen = (chosen - {"all"}) | set(PARTS)
    skipped = {p.strip() for p in args.skip.split(",") if p.strip()}
    unknown = (chosen | skipped) - set(PARTS)
    if unknown:
        raise BenchmarkError(
            f"unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}"
        )
    allowed = PARTS if args.topology == "standalone" else TOPOLOGY_PARTS
    return tuple(p for p in allowed if p in chosen - skipped)


def select(only: str | None, topology: str = "standalone") -> list[Contender]:
    """The contenders to run on ``topology``, in report order."""
    here = [c for c in CONTENDERS if topology in c.topologies]
    if only is None:
        return here
    keys = {k.strip() for k in only.split(",") if k.strip()}
    unknown = keys - {c.key for c in here}
    if unknown:
        known = ", ".join(c.key for c in here)
        raise BenchmarkError(
            f"unknown contender(s) {', '.join(sorted(unknown))} on {topology}; known: {known}"
        )
    return [c for c in here if c.key in keys]
