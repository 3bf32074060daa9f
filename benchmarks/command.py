"""``tenure bench NAME`` and ``python -m benchmarks NAME``: one subcommand per benchmark.

The benchmarks live in the repository, not in the wheel; the ``tenure``
command hands ``tenure bench ...`` to :func:`main` when it runs in a clone
(:func:`tenure._tools.cli.find_benchmarks`). Errors are one line, as every
tenure command's.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks import BENCHMARKS, load_benchmark
from tenure._tools.cli import Parser, guarded, take_debug

__all__ = ["build_parser", "main"]

PROG = "tenure bench"


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``tenure bench``: a subcommand per entry of :data:`BENCHMARKS`."""
    parser = Parser(
        prog=PROG,
        description="Side-by-side benchmarks on one server in one run; prints a table with "
        "tenure's ratio to each peer. They run from a clone of the repository; the peers come "
        'with: pip install -e ".[bench]".',
    )
    benches = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (_, summary) in BENCHMARKS.items():
        one = benches.add_parser(name, help=summary, description=summary)
        load_benchmark(name).add_arguments(one)
    return parser


def main(argv: Sequence[str], debug: bool = False) -> int:
    """Run ``tenure bench`` with ``argv`` (the arguments after ``bench``); the exit status."""
    arguments, more_debug = take_debug(list(argv))
    options = build_parser().parse_args(arguments)
    command = [*PROG.split(), *argv]
    return guarded(
        "bench",
        debug or more_debug,
        lambda: int(load_benchmark(options.bench).run_command(options, command)),
    )
