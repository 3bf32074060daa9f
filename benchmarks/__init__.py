"""Side-by-side benchmarks of tenure and its peers: ``tenure bench <name>`` in a clone.

They are not part of the wheel: from a clone of the repository, ``tenure
bench NAME`` or ``python -m benchmarks NAME`` runs one (:mod:`benchmarks.command`).
Each benchmark is a module with ``add_arguments(parser)`` and
``run_command(args, command) -> int``, listed in :data:`BENCHMARKS`; the
command builds one subcommand per entry, so a later primitive adds its
benchmark here and touches nothing else. The peers and matplotlib come with
the ``bench`` extra (``pip install -e ".[bench]"``). ``--output
docs/benchmarks.md`` updates that page (each benchmark rewrites only its own
section).

Once its arguments are checked (an argument error is one line on stderr), a
benchmark's ``run_command`` hands its run to :func:`run_timed`: one line
saying about how long it will take, from its module's
``estimated_seconds(args)``, then its lines of progress, and last the time it
took, also when it failed or was stopped midway.

Numbers are measured by running these, never asserted in timed tests.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

from tenure import TenureError

__all__ = [
    "BENCHMARKS",
    "ROOT",
    "TENURE_BENCHMARKS",
    "BenchmarkError",
    "about",
    "add_output_arguments",
    "announce",
    "check_empty",
    "load_benchmark",
    "package_versions",
    "progress",
    "ratio",
    "require_peer",
    "round_trip_us",
    "run_timed",
    "server_cpu_us",
    "server_version",
    "several",
    "took",
]

# Marks this package as tenure's benchmarks (`tenure bench` checks it before running).
TENURE_BENCHMARKS = True
# The clone: benchmarks' worker processes (python -m benchmarks.<worker>) run from here.
ROOT = Path(__file__).resolve().parent.parent

# subcommand -> (module under benchmarks, one line of help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "locks": ("locks", "tenure.Lock beside redis-py, python-redis-lock and pottery"),
    "semaphores": ("semaphores", "tenure.Semaphore beside Redis in Action's fair semaphore"),
    "caches": ("caches", "tenure's HerdCache beside dogpile.cache, cashews and aiocache"),
    "cache-paths": ("cache_paths", "every cache hit and miss path beside bare GET / SET"),
    "ingest": ("ingest", "tenure's IngestJob beside the CLIENT SETNAME chunk booking"),
    "redlock": ("redlock", "tenure's Redlock beside pottery's and aioredlock over three masters"),
    "idsets": ("idsets", "tenure's IdSet beside Redis SINTERCARD, numpy and pyroaring"),
    "consumers": ("consumers", "tenure's StreamConsumer.run beside a bare consumer-group loop"),
    "otel": ("otel", "what reporting through OpenTelemetry costs a lock and a cache hit"),
}


class BenchmarkError(TenureError):
    """A benchmark could not run or complete (a peer missing, a worker failed or hung)."""


def server_cpu_us(client: redis.Redis) -> float:
    """The server's CPU time so far, in µs (``INFO cpu``: its main thread, user + system).

    Everything the server did for its clients: reading and parsing commands,
    running them (scripts and the commands they call, each counted once,
    where ``INFO commandstats`` counts a script's commands in the script's
    time and again on their own), writing replies.
    """
    cpu: Any = client.info("cpu")
    user = cpu.get("used_cpu_user_main_thread", cpu.get("used_cpu_user", 0.0))
    system = cpu.get("used_cpu_sys_main_thread", cpu.get("used_cpu_sys", 0.0))
    return 1e6 * (float(user) + float(system))


def load_benchmark(name: str) -> ModuleType:
    """The module of benchmark ``name`` (a key of :data:`BENCHMARKS`)."""
    module, _ = BENCHMARKS[name]
    return importlib.import_module(f"benchmarks.{module}")


def require_peer(module: str, package: str) -> ModuleType:
    """Import a peer library, or say which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BenchmarkError(
            f'the benchmark needs {package}: pip install -e ".[bench]" (in the clone)'
        ) from exc


def check_empty(url: str, allow_flush: bool) -> None:
    """Refuse to empty a server's database that holds data, unless told it may.

    The benchmarks reset their state with FLUSHDB between measurements; on a
    private server that costs nothing, on a server given by ``--url`` it
    would delete the user's data.
    """
    with redis.Redis.from_url(url) as client:
        keys = int(client.dbsize())
    if keys and not allow_flush:
        raise BenchmarkError(
            f"the database at {url} holds {keys:,} keys, and the benchmark empties it "
            "(FLUSHDB) between measurements: point --url at an empty database, or pass "
            "--allow-flush"
        )


def progress(message: str) -> None:
    """One line of progress on stderr."""
    print(message, file=sys.stderr, flush=True)


def about(seconds: float) -> str:
    """An estimate in words: ``40 seconds`` under 90 s, else ``12 minutes``."""
    if seconds < 90:
        step = 5 if seconds >= 30 else 1
        return several(max(1, step * round(seconds / step)), "second")
    return f"{int(seconds / 60 + 0.5)} minutes"


def took(seconds: float) -> str:
    """A measured duration in words: ``7.4 seconds``, ``43 seconds``, ``11.8 minutes``."""
    if seconds < 10:
        return f"{seconds:.1f} seconds"
    if seconds < 90:
        return f"{seconds:.0f} seconds"
    return f"{seconds / 60:.1f} minutes"


def several(count: int, thing: str) -> str:
    """``1 round``, ``3 rounds``: a count and what it counts, for a line of progress."""
    return f"{count:,} {thing}{'' if count == 1 else 's'}"


def announce(name: str, seconds: float, what: str) -> None:
    """The line a benchmark prints before it measures: how long it will take, and what."""
    progress(f"tenure bench {name}: about {about(seconds)} ({what}); Ctrl-C stops it and cleans up")


def run_timed(name: str, seconds: float, what: str, body: Callable[[], object]) -> int:
    """Announce benchmark ``name`` (``seconds`` estimated), run ``body``, say how long it took.

    Called once the arguments are checked (an argument error stays one line).
    Returns the exit status: 0, or 1 when the run failed midway (a
    :class:`BenchmarkError` or a server error, told on stderr first). The last
    line on stderr says the time it took, ``done in`` or ``stopped after``,
    also when Ctrl-C or an unexpected error stopped it.
    """
    announce(name, seconds, what)
    began = time.monotonic()
    ended = "stopped after"
    try:
        body()
        ended = "done in"
    except (BenchmarkError, redis.RedisError) as exc:
        progress(f"benchmark failed: {type(exc).__name__}: {exc}")
        return 1
    finally:
        progress(f"tenure bench {name}: {ended} {took(time.monotonic() - began)}")
    return 0


def package_versions(names: Sequence[str]) -> dict[str, str]:
    """The installed version of each package in ``names`` (those installed)."""
    versions: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return versions


def server_version(client: redis.Redis) -> str:
    """``valkey 8.1.x`` or ``redis 7.x`` from ``INFO server``."""
    info = client.info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info.get('redis_version', '?')}"


def round_trip_us(client: redis.Redis, count: int = 500) -> float:
    """Median ``PING`` round trip in microseconds: the floor of every operation."""
    samples = []
    for _ in range(count):
        sent = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - sent)
    return statistics.median(samples) * 1e6


def add_output_arguments(
    parser: argparse.ArgumentParser, output: str | None, plotted: str | None
) -> None:
    """The options every benchmark shares: where it runs and what it writes.

    ``plotted`` names what ``--plot`` draws (None: no ``--plot``).
    """
    parser.add_argument("--url", help="use this server instead of starting one")
    parser.add_argument(
        "--allow-flush",
        action="store_true",
        help="let the benchmark empty (FLUSHDB) a --url database that holds keys",
    )
    parser.add_argument(
        "--output", default=output, help=f"write the Markdown report section here ({output})"
    )
    if plotted is not None:
        parser.add_argument("--plot", help=f"draw the {plotted} distributions to this PNG")


def ratio(mine: float | None, theirs: float) -> str:
    """``mine / theirs`` to two decimals for a report, or "—" when it has no meaning."""
    if mine is None or theirs <= 0:
        return "—"
    return f"{mine / theirs:.2f}"
