"""``tenure demo``: the marketplace of Redis in Action, Table 6.2, measured again.

For each row of the book's table (1 lister/1 buyer, 5/1, 5/5) and each way of
guarding the market (WATCH/MULTI/EXEC retries, a :class:`tenure.Lock`, one
Lua script per operation), real processes trade for a few seconds on one
server; the table prints what they listed and bought, how often they retried
and how long a purchase took, beside the book's 60-second figures scaled to
the run's length. After every run the books are audited: no money and no
item may appear or vanish. Every number printed is measured in this run,
except the book's.

The market logic is in :mod:`tenure._tools.demo.market`; this module runs the processes,
draws the progress bar and prints the results.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import queue
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing.sharedctypes import RawArray
from typing import Any, TextIO

import redis

from tenure import ArgumentError, TenureError
from tenure._tools.children import die_with_parent, ignore_sigint, sigint_blocked
from tenure._tools.demo.market import MODES, Market, Tally, Trader, audit, close_market, open_market
from tenure.server._process import given_or_private

__all__ = ["BOOK", "DEFAULT_ROWS", "DemoResult", "check_arguments", "run_demo", "server_url"]

DEFAULT_ROWS: tuple[tuple[int, int], ...] = ((1, 1), (5, 1), (5, 5))
MODE_LABELS = {"watch": "WATCH/MULTI/EXEC", "lock": "tenure.Lock", "script": "Lua script"}
BOOK_SECONDS = 60.0

# Redis in Action, Table 6.2 (60 s runs): listed, bought, retries, average wait
# per purchase in ms. A leading "<" is the book's "under". The book has no
# row for one script per operation here (its Lua marketplace is chapter 11).
BOOK: dict[tuple[int, int, str], tuple[str, str, str, float]] = {
    (1, 1, "watch"): ("145000", "27000", "80000", 14.0),
    (5, 1, "watch"): ("331000", "<200", "50000", 150.0),
    (5, 5, "watch"): ("206000", "<600", "161000", 498.0),
    (1, 1, "lock"): ("51000", "50000", "0", 1.0),
    (5, 1, "lock"): ("68000", "13000", "<10", 5.0),
    (5, 5, "lock"): ("21000", "20500", "0", 14.0),
}


@dataclass
class DemoResult:
    """One row of the demo table: one market setup, one mode, all traders together.

    ``purchase_attempts`` counts every purchase tried, including any cut off
    by the deadline. The ``book_*`` figures are the book's,
    scaled to the run's length; those named in ``book_upper_bounds`` are the
    book's "under N" (rounded up).
    """

    listers: int
    buyers: int
    mode: str
    seconds: float
    listed: int
    bought: int
    missed: int
    retries: int
    purchase_attempts: int
    avg_wait_ms: float | None  # per completed purchase; None when nothing was bought
    consistent: bool
    book_listed: int | None
    book_bought: int | None
    book_retries: int | None
    book_wait_ms: float | None
    book_upper_bounds: list[str]


@dataclass(frozen=True)
class _Job:
    prefix: str
    mode: str
    role: str  # "lister" or "buyer"
    user: str
    start_at: float  # wall clock, shared by every process of the run
    seconds: float


def _trade(slot: int, job: _Job, client: redis.Redis, progress: Any) -> Tally:
    trader = Trader(client, Market(job.prefix), job.mode, job.user)
    pause = job.start_at - time.time()
    if pause > 0:
        time.sleep(pause)
    deadline = time.monotonic() + job.seconds
    tally = trader.tally
    parent, next_check = os.getppid(), 0.0
    while (now := time.monotonic()) < deadline:
        if now >= next_check:  # a killed demo must not leave traders running
            if os.getppid() != parent:
                break
            next_check = now + 0.25
        if job.role == "lister":
            trader.list_new_item(deadline)
        elif not trader.buy_something(deadline):
            time.sleep(0.0005)  # nothing listed yet
        progress[2 * slot] = tally.listed
        progress[2 * slot + 1] = tally.bought
    return tally


def _worker(slot: int, parent: int, url: str, jobs: Any, results: Any, progress: Any) -> None:
    """One trading process: run jobs until told to stop or the parent is gone."""
    # Killed with the demo, even mid-purchase (a trader waiting for the lock, or for a
    # server that died with the demo, would not look at its parent for a while).
    die_with_parent(parent)
    ignore_sigint()  # Ctrl-C is the parent's to handle
    client = redis.Redis.from_url(url)
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return  # the demo was killed: do not linger
            continue
        if job is None:
            break
        try:
            results.put((slot, asdict(_trade(slot, job, client, progress)), None))
        except Exception as exc:  # reported to the parent, which raises it
            results.put((slot, None, f"{type(exc).__name__}: {exc}"))
    client.close()


class _Pool:
    """Trading processes, started once and reused by every run."""

    def __init__(self, size: int, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.progress: Any = RawArray("q", 2 * size)
        self.results: Any = context.Queue()
        self._jobs = [context.Queue() for _ in range(size)]
        self._processes = [
            context.Process(
                target=_worker,
                args=(slot, os.getpid(), url, self._jobs[slot], self.results, self.progress),
                name=f"tenure-demo-{slot}",
                daemon=True,
            )
            for slot in range(size)
        ]
        with sigint_blocked():  # Ctrl-C is the parent's alone, even during start-up
            for process in self._processes:
                process.start()

    def submit(self, jobs: Sequence[_Job]) -> None:
        for slot in range(len(self.progress) // 2):
            self.progress[2 * slot] = self.progress[2 * slot + 1] = 0
        for slot, job in enumerate(jobs):
            self._jobs[slot].put(job)

    def collect(self, count: int, timeout: float) -> list[Tally]:
        tallies: list[Tally] = []
        for _ in range(count):
            try:
                _, tally, error = self.results.get(timeout=timeout)
            except queue.Empty:
                raise TenureError("a demo process stopped answering") from None
            if error is not None:
                raise TenureError(f"a demo process failed: {error}")
            tallies.append(Tally(**tally))
        return tallies

    def close(self, *, abort: bool = False) -> None:
        """Stop the processes: after their current job, or at once when ``abort``."""
        for jobs in self._jobs:
            jobs.put(None)
        for process in self._processes:
            if abort:
                process.terminate()
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)


class _Progress:
    """A one-line progress bar on a terminal; a line per run otherwise."""

    def __init__(self, stream: TextIO, runs: int, seconds: float) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.runs = runs
        self.total = runs * seconds
        self.done = 0

    def show(self, label: str, elapsed: float, seconds: float, listed: int, bought: int) -> None:
        if not self.live:
            return
        fraction = min(1.0, (self.done * seconds + min(elapsed, seconds)) / self.total)
        bar = "#" * round(30 * fraction)
        self.stream.write(
            f"\r[{bar:<30}] {self.done + 1}/{self.runs} {label:<28} "
            f"listed {listed:>9,} bought {bought:>9,}"
        )
        self.stream.flush()

    def finish(self, label: str, result: DemoResult) -> None:
        self.done += 1
        if self.live:
            self.stream.write("\r\033[K")  # the bar gives way to the run's line
        print(
            f"{self.done}/{self.runs} {label:<28} listed {result.listed:>9,} "
            f"bought {result.bought:>9,} retries {result.retries:>9,}",
            file=self.stream,
            flush=True,
        )


def _label(listers: int, buyers: int, mode: str) -> str:
    return f"{listers}L/{buyers}B {MODE_LABELS[mode]}"


def _scaled(figure: str, scale: float) -> int:
    value = float(figure.lstrip("<")) * scale
    if figure.startswith("<"):  # "under N" stays an upper bound: round it up
        return math.ceil(value)
    return round(value)


def _run(
    pool: _Pool,
    url: str,
    listers: int,
    buyers: int,
    mode: str,
    seconds: float,
    progress: _Progress,
) -> DemoResult:
    sellers = [f"s{index}" for index in range(listers)]
    shoppers = [f"b{index}" for index in range(buyers)]
    market = Market(f"tenure:demo:{uuid.uuid4().hex[:8]}:")
    label = _label(listers, buyers, mode)
    with redis.Redis.from_url(url) as client:
        open_market(client, market, sellers, shoppers)
        start_at = time.time() + 0.2
        jobs = [
            _Job(market.prefix, mode, role, user, start_at, seconds)
            for role, users in (("lister", sellers), ("buyer", shoppers))
            for user in users
        ]
        pool.submit(jobs)
        while time.time() < start_at + seconds:
            values = list(pool.progress)
            elapsed = max(0.0, time.time() - start_at)
            progress.show(label, elapsed, seconds, sum(values[0::2]), sum(values[1::2]))
            time.sleep(0.1)
        whole = Tally.total(pool.collect(len(jobs), timeout=seconds + 60))
        books = audit(client, market, sellers, shoppers, whole.created)
        close_market(client, market)
    book = BOOK.get((listers, buyers, mode))
    scale = seconds / BOOK_SECONDS
    result = DemoResult(
        listers=listers,
        buyers=buyers,
        mode=mode,
        seconds=seconds,
        listed=whole.listed,
        bought=whole.bought,
        missed=whole.missed,
        retries=whole.retries,
        purchase_attempts=whole.attempts,
        avg_wait_ms=1000 * whole.waited / whole.bought if whole.bought else None,
        consistent=books.consistent,
        book_listed=_scaled(book[0], scale) if book else None,
        book_bought=_scaled(book[1], scale) if book else None,
        book_retries=_scaled(book[2], scale) if book else None,
        book_wait_ms=book[3] if book else None,
        book_upper_bounds=[
            field
            for field, figure in zip(("listed", "bought", "retries"), book[:3], strict=True)
            if figure.startswith("<")
        ]
        if book
        else [],
    )
    progress.finish(label, result)
    return result


@contextmanager
def server_url(url: str | None, out: TextIO) -> Iterator[str]:
    """Yield ``url``, or start a private server (saying so on ``out``) and yield its URL."""
    pid = None
    with given_or_private(url, name="tenure-demo") as (address, server):
        if server is not None:
            pid = server.pid
            print(
                f"started {server.engine.name} {server.engine.version} (pid {pid}) at {address}",
                file=out,
            )
        yield address
    if pid is not None:
        print(f"stopped the server (pid {pid})", file=out)


def _table(results: list[DemoResult], seconds: float) -> str:
    def book(r: DemoResult, field: str) -> str:
        value = getattr(r, f"book_{field}")
        if value is None:
            return "-"
        return f"<{value:,}" if field in r.book_upper_bounds else f"{value:,}"

    head_run = f"this run, {seconds:g} s each"
    head_book = f"the book, scaled to {seconds:g} s"
    lines = [
        f"{head_run:^66}  | {head_book:^34}",
        f"{'L/B':<5}{'guard':<17}{'listed':>9}{'bought':>9}{'retries':>9}{'wait':>11}"
        f"{'books':>6}  |{'listed':>9}{'bought':>8}{'retries':>9}{'wait':>9}",
    ]
    lines.append("-" * len(lines[1]))
    previous: tuple[int, int] | None = None
    for r in results:
        setup = f"{r.listers}/{r.buyers}" if (r.listers, r.buyers) != previous else ""
        previous = (r.listers, r.buyers)
        book_wait = f"{r.book_wait_ms:g} ms" if r.book_wait_ms is not None else "-"
        wait = f"{r.avg_wait_ms:.1f} ms" if r.avg_wait_ms is not None else "-"
        lines.append(
            f"{setup:<5}{MODE_LABELS[r.mode]:<17}{r.listed:>9,}{r.bought:>9,}{r.retries:>9,}"
            f"{wait:>11}{'ok' if r.consistent else 'WRONG':>6}  |"
            f"{book(r, 'listed'):>9}{book(r, 'bought'):>8}{book(r, 'retries'):>9}"
            f"{book_wait:>9}"
        )
    return "\n".join(line.rstrip() for line in lines)


def _summary(results: list[DemoResult]) -> str:
    by_key = {(r.listers, r.buyers, r.mode): r for r in results}
    lines = [
        "L/B = listers/buyers (one process each); wait = average time per completed purchase; "
        "books = money and items conserved (audited after every run).",
    ]
    listers, buyers = max((r.listers, r.buyers) for r in results)
    watch = by_key.get((listers, buyers, "watch"))
    lock = by_key.get((listers, buyers, "lock"))
    script = by_key.get((listers, buyers, "script"))
    if watch:
        lines.append(
            f"{listers}/{buyers}, WATCH: every listing spoils the buyers' transactions: "
            f"{watch.retries:,} retries for {watch.bought:,} purchases."
        )
    if lock:
        lines.append(
            f"{listers}/{buyers}, tenure.Lock: {lock.retries:,} retries; buyers got "
            f"{lock.bought:,} of {lock.listed:,} listed items, in arrival order. The lock also "
            "serialises listings, so fewer are made."
        )
    if script:
        lines.append(
            f"{listers}/{buyers}, one Lua script per operation: no retries and no lock, "
            f"{script.bought:,} bought. When the whole change fits in one script, use a script; "
            "when it does not (other systems, slow work), take a lock."
        )
    return "\n".join(textwrap.fill(line, 88, subsequent_indent="  ") for line in lines)


def check_arguments(rows: Sequence[tuple[int, int]], modes: Sequence[str]) -> None:
    """Refuse listers/buyers pairs and modes the demo cannot run (:class:`ArgumentError`)."""
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise ArgumentError("modes", f"choose some of {', '.join(MODES)}, got {list(modes)}")
    if not rows:
        raise ArgumentError("rows", "name at least one listers/buyers pair")
    for listers, buyers in rows:
        if listers < 1 or buyers < 1 or listers + buyers > 32:
            raise ArgumentError(
                "rows",
                f"{listers}/{buyers} needs at least one lister and one buyer, "
                "and at most 32 processes together",
            )


def run_demo(
    *,
    url: str | None = None,
    seconds: float = 4.0,
    rows: Sequence[tuple[int, int]] = DEFAULT_ROWS,
    modes: Sequence[str] = MODES,
    as_json: bool = False,
    out: TextIO | None = None,
) -> list[DemoResult]:
    """Run the marketplace demo and print its table (or JSON); return the measured rows.

    ``rows`` are (listers, buyers) pairs, ``modes`` a subset of ``watch``,
    ``lock`` and ``script``; each pair runs in each mode for ``seconds``.
    """
    check_arguments(rows, modes)
    stream = out or sys.stdout
    log = sys.stderr if as_json else stream
    results: list[DemoResult] = []
    with server_url(url or os.environ.get("REDIS_URL"), log) as address:
        size = max(listers + buyers for listers, buyers in rows)
        print(
            f"Marketplace of Redis in Action 6.2: {len(rows) * len(modes)} runs of "
            f"{seconds:g} s, up to {size} trading processes...",
            file=log,
            flush=True,
        )
        pool = _Pool(size, address)
        progress = _Progress(sys.stderr, len(rows) * len(modes), seconds)
        try:
            for listers, buyers in rows:
                for mode in modes:
                    results.append(_run(pool, address, listers, buyers, mode, seconds, progress))
        except BaseException:  # Ctrl-C or a failed run: stop the traders now
            pool.close(abort=True)
            raise
        pool.close()
    if as_json:
        json.dump([asdict(r) for r in results], stream, indent=2)
        stream.write("\n")
    else:
        print(file=stream)
        print(_table(results, seconds), file=stream)
        print(file=stream)
        print(_summary(results), file=stream)
    return results
