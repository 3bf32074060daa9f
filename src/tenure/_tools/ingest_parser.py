"""The options of ``tenure ingest``: ``run``, ``status`` and ``reset``.

:mod:`tenure._tools.ingest_cli` runs them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_ingest"]


def add_ingest(commands: Any, positive_int: Any, positive_float: Any) -> None:
    """The ``ingest`` command and its ``run``, ``status`` and ``reset`` subcommands."""
    ingest = commands.add_parser(
        "ingest",
        help="feed a SQL table into a Redis stream in chunks, every row once",
        description="Chunked, crash-safe ingestion of a SQL table into a Redis stream.",
    )
    actions = ingest.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser(
        "run",
        help="ingest a table (resumable: run it again after Ctrl-C or a crash)",
        description="Ingest TABLE of SOURCE_URL (a SQLAlchemy URL, e.g. sqlite:///data.db) "
        "into a stream with --workers processes. Ctrl-C or SIGTERM stops them, and they give "
        "their chunks back: the same command resumes at once.",
    )
    run.add_argument(
        "source_url", metavar="SOURCE_URL", help="SQLAlchemy URL of the database, e.g. "
        "sqlite:///shop.db or postgresql+psycopg://user@host/db"
    )  # fmt: skip
    run.add_argument("--table", required=True, help="the table to read (required)")
    run.add_argument("--key", required=True, help="its integer, unique key column (required)")
    run.add_argument(
        "--chunk-size", type=positive_int, default=10_000,
        help="keys per chunk (default: 10,000); a job keeps the size it was planned with",
    )  # fmt: skip
    run.add_argument(
        "--workers", type=positive_int, default=4, help="worker processes (default: 4)"
    )
    run.add_argument(
        "--sink", help="stream:KEY or list:KEY (default: the job's own stream, "
        "tenure:ingest:{JOB}:rows)"
    )  # fmt: skip
    run.add_argument("--name", help="the job's name (default: the table's name)")
    run.add_argument(
        "--lease", type=positive_float, default=30.0,
        help="seconds a claim lasts without progress: a killed worker's chunk waits this long "
        "(default: 30)",
    )  # fmt: skip
    run.add_argument("--url", help="Redis URL (default: $REDIS_URL)")
    status = actions.add_parser(
        "status", help="a job's progress", description="A job's progress, without its source."
    )
    status.add_argument("name", metavar="JOB", help="the job's name")
    status.add_argument("--url", help="Redis URL (default: $REDIS_URL)")
    status.add_argument("--json", action="store_true", help="print JSON (default: text)")
    reset = actions.add_parser(
        "reset",
        help="remove a job so it can start over (its rows stay unless --sink)",
        description="Remove job JOB: its plan, chunks, cursors, claims and counters. The "
        "rows it wrote stay in its sink unless --sink. Refused while its workers hold "
        "claims (stop them first, or --force). Asks for --yes.",
    )
    reset.add_argument("name", metavar="JOB", help="the job's name")
    reset.add_argument(
        "--sink", action="store_true",
        help="delete the sink too: the stream or list the job wrote to (default: keep it)",
    )  # fmt: skip
    reset.add_argument(
        "--force", action="store_true",
        help="reset even while claims are running; their workers stop (default: refuse)",
    )  # fmt: skip
    reset.add_argument("--yes", action="store_true", help="do it (default: say what would go)")
    reset.add_argument("--url", help="Redis URL (default: $REDIS_URL)")
