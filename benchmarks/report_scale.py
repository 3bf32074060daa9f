"""The per-entity and scale parts of the lock benchmark as Markdown, terminal lines and targets.

Per-entity locks (:mod:`benchmarks.entity`) and the cost of holding many
locks and of many waiters (:mod:`benchmarks.scale`);
:mod:`benchmarks.report` puts them into the ``locks`` section and its
targets table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from benchmarks.costs import COST_VARIANTS
from benchmarks.entity import (
    CONSTRUCT_SECONDS,
    ENTITY_CONTENDERS,
    ENTITY_RATIO,
    KIN_RATIO,
    REUSE_SPACE,
    EntityResult,
    entity_kin,
    entity_pairs,
)
from benchmarks.scale import (
    HANDOFF_RATIO,
    HOLD_CONTENDERS,
    HOLD_RATIO,
    QUEUE_SECONDS,
    QUEUE_SHARE,
    REFRESH_RATIO,
    REFRESH_SLACK,
    SCALE_CAP,
    HoldResult,
    WaitersResult,
)
from tenure._tooling import IDLE_TTL

__all__ = [
    "TARGET_LABELS",
    "entity_lines",
    "entity_section",
    "entity_targets",
    "scale_lines",
    "scale_section",
    "scale_targets",
]

Goal = tuple[str, str, str, "bool | None"]  # (goal, lock key, measured, met)

TARGET_LABELS = {
    "tenure-async": "tenure `AsyncLock()` (30 s lease, background renewal)",
}
"""Labels of the target rows whose key is not a contender of the other parts."""

_TARGET_KEY = {"sync": "tenure-default", "asyncio": "tenure-async"}

DEFAULTS_NOTE = (
    "Each library's defaults: tenure's `Lock(client, name)` has `timeout=None`, "
    "held until released on a 30 s lease that a background watchdog renews every 10 s "
    "(a holder that dies frees the lock within 30 s), waiters queue in FIFO order and "
    "are woken by the release, and every acquire returns a fencing token, the last one "
    f"+ 1 from a marker the release leaves for `IDLE_TTL` = {IDLE_TTL:g} s (else the "
    "server's clock in microseconds). redis-py's `client.lock(name)` has "
    "`timeout=None` too, which there means "
    "a key with no expiry (a holder that dies keeps the lock until someone deletes the "
    "key), a blocked acquire polls every `sleep=0.1` s, `blocking_timeout=None` waits "
    "forever; it keeps nothing on the server once released."
)


def _us(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _rate(value: float | None) -> str:
    if value is None:
        return "—"
    return "0" if abs(value) < 0.5 else f"{value:,.0f}"  # no "-0" from a tiny negative


def _times(high: float, low: float) -> str:
    """``high / low`` as "1.23x", or "—" when ``low`` is not above 0."""
    return f"{high / low:.2f}x" if low > 0 else "—"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


# -- targets ----------------------------------------------------------------------


def _versus(
    by: dict[tuple[str, str], EntityResult], mine: str, theirs: str
) -> Iterator[tuple[str, EntityResult, EntityResult, float]]:
    """Each name variant measured for both: tenure's result, the peer's, and their ratio."""
    for variant in ("fresh", "reused"):
        ours, peer = by.get((mine, variant)), by.get((theirs, variant))
        if ours is not None and peer is not None:
            yield variant, ours, peer, ours.median / peer.median if peer.median > 0 else 0.0


def entity_targets(entity: Sequence[EntityResult]) -> list[Goal]:
    """Per mode and variant, cycles/s against a goal.

    tenure's lock over redis-py's (``ENTITY_RATIO``), and each of tenure's
    other kinds over tenure's own lock (``KIN_RATIO``).
    """
    by = {(r.key, r.variant): r for r in entity}
    against = [
        (mode, mine, theirs, "per-entity locks ({mode}, {variant} names)", "redis-py's "
         "`client.lock(name)`", ENTITY_RATIO) for mode, mine, theirs in entity_pairs()
    ] + [
        (mode, kind, lock, f"per-entity {ENTITY_CONTENDERS[kind][1]} ({{variant}} names)",
         f"tenure's {'Lock' if mode == 'sync' else 'AsyncLock'}", KIN_RATIO)
        for mode, kind, lock in entity_kin()
    ]  # fmt: skip
    return [
        (
            f"{what.format(mode=mode, variant=variant)}: cycles/s >= {goal:g}x {peer_name}",
            _TARGET_KEY[mode],
            f"{ours.median:,.0f}/s vs {peer.median:,.0f}/s: {ratio:.2f}x",
            ratio >= goal,
        )
        for mode, mine, theirs, what, peer_name, goal in against
        for variant, ours, peer, ratio in _versus(by, mine, theirs)
    ]


def _ends(sizes: Sequence[int]) -> tuple[int, int] | None:
    return None if len(set(sizes)) < 2 else (min(sizes), max(sizes))


def scale_targets(holds: Sequence[HoldResult], waiters: Sequence[WaitersResult]) -> list[Goal]:
    """Flat cost with many held locks; many waiters queued, served and refreshed."""
    found: list[Goal] = []
    for key, mode in (("tenure", "sync"), ("tenure-async", "asyncio")):
        mine = {r.held: r for r in holds if r.key == key}
        ends = _ends(list(mine))
        if ends is None:
            continue
        few, many = mine[ends[0]], mine[ends[1]]
        for what in ("acquire", "release"):
            goal = (
                f"{what} while holding {ends[1]:,} locks <= {HOLD_RATIO:g}x "
                f"while holding {ends[0]:,} ({mode})"
            )
            if not (few.finished and many.finished):
                found.append((goal, _TARGET_KEY[mode], f"not finished: {many.error}", False))
                continue
            low = few.acquire_us if what == "acquire" else few.release_us
            high = many.acquire_us if what == "acquire" else many.release_us
            ratio = high / low if low > 0 else float("inf")
            found.append(
                (
                    goal,
                    _TARGET_KEY[mode],
                    f"{_us(high)} µs vs {_us(low)} µs: {ratio:.2f}x",
                    ratio <= HOLD_RATIO,
                )
            )
    if not waiters:
        return found
    key = _TARGET_KEY["asyncio"]
    most = max(waiters, key=lambda r: r.waiters)
    queued = (
        f"{most.queued:,} of {most.waiters:,} queued within {SCALE_CAP * QUEUE_SHARE:g} s"
        if most.queue_seconds is None
        else f"{most.queue_seconds:.3f} s"
    )
    found.append(
        (
            f"{most.waiters:,} waiting tasks queued in <= {QUEUE_SECONDS:g} s",
            key,
            queued,
            most.queue_seconds is not None and most.queue_seconds <= QUEUE_SECONDS,
        )
    )
    fewest = min(waiters, key=lambda r: r.waiters)
    if fewest.waiters == most.waiters:
        return found
    goal = f"handoffs/s with {most.waiters:,} waiters >= {HANDOFF_RATIO:g}x with {fewest.waiters:,}"
    if most.handoff_rate is None or fewest.handoff_rate is None:
        found.append((goal, key, "not measured: no waiter was served", False))
    else:
        ratio = most.handoff_rate / fewest.handoff_rate
        unserved = most.unserved + fewest.unserved
        found.append(
            (
                goal,
                key,
                f"{most.handoff_rate:,.0f}/s vs {fewest.handoff_rate:,.0f}/s: {ratio:.2f}x"
                + (f"; {unserved:,} waiter(s) not served within the cap" if unserved else ""),
                ratio >= HANDOFF_RATIO and not unserved,
            )
        )
    goal = (
        f"refresh traffic (script calls/s) with {most.waiters:,} waiters <= "
        f"{REFRESH_RATIO:g}x with {fewest.waiters:,} (+{REFRESH_SLACK:g}/s)"
    )
    if most.scripts_per_s is None or fewest.scripts_per_s is None:
        found.append((goal, key, "not measured: the cap ran out first", False))
    else:
        high, low = most.scripts_per_s, fewest.scripts_per_s
        partial = [
            f"{w.queued_in_window or 0:,} of {w.waiters:,} queued"
            for w in (most, fewest)
            if w.queue_seconds is None
        ]
        found.append(
            (
                goal,
                key,
                f"{_rate(high)}/s vs {_rate(low)}/s: {_times(high, low)}"
                + (f" (only {', '.join(partial)})" if partial else ""),
                not partial and high <= REFRESH_RATIO * max(low, 0.0) + REFRESH_SLACK,
            )
        )
    return found


# -- Markdown -----------------------------------------------------------------------


def entity_section(entity: Sequence[EntityResult], command: str, seconds: float) -> str:
    """The "Per-entity locks" section."""
    if not entity:
        return ""
    by = {(r.key, r.variant): r for r in entity}
    rounds = max(len(r.runs) for r in entity)
    lines = [
        "## Per-entity locks",
        "",
        f"Measured by `{command}` (this part alone: `tenure bench locks --parts entity`).",
        "",
        'What `with Lock(client, f"order:{id}")` costs: each cycle makes a new lock object '
        "on a name from a large space, enters it (acquire) and leaves it (release), with no "
        "contention; sync on one `redis.Redis`, asyncio as one task doing sequential cycles "
        "on one `redis.asyncio.Redis`. Fresh = names never used before (tenure starts "
        "each one's fencing tokens from the server's clock); reused = the names the "
        "fresh run of the same round had "
        f"just used (at most {REUSE_SPACE:,}), again in order, each used again within a "
        f"minute. Cycles per second, each run {seconds:g} s, median of {rounds} round(s) "
        "interleaved across the locks (every other round in reverse order, `FLUSHDB` "
        "before each lock).",
        "",
        DEFAULTS_NOTE,
        "",
        "| Mode | Names | tenure cycles/s | rounds | redis-py cycles/s | rounds "
        "| tenure / redis-py |",
        "|---|---|---:|---|---:|---|---:|",
    ]
    for mode, mine, theirs in entity_pairs():
        for variant, ours, peer, ratio in _versus(by, mine, theirs):
            lines.append(
                f"| {mode} | {variant} | {ours.median:,.0f} | "
                f"{', '.join(f'{x:,.0f}' for x in ours.runs)} | {peer.median:,.0f} | "
                f"{', '.join(f'{x:,.0f}' for x in peer.runs)} | {ratio:.2f} |"
            )
    kin = [
        (mode, kind, lock, *row)
        for mode, kind, lock in entity_kin()
        for row in _versus(by, kind, lock)
    ]
    if kin:
        lines += [
            "",
            "tenure's other kinds, the same cycles in the same rounds, beside tenure's own "
            "lock (a semaphore's and a read-write lock's names hold their holders in a "
            "sorted set and their fences in a key of their own):",
            "",
            "| Kind | Names | cycles/s | rounds | tenure lock cycles/s | kind / lock |",
            "|---|---|---:|---|---:|---:|",
        ]
        for _, kind, _, variant, ours, peer, ratio in kin:
            lines.append(
                f"| {ENTITY_CONTENDERS[kind][1]} | {variant} | {ours.median:,.0f} | "
                f"{', '.join(f'{x:,.0f}' for x in ours.runs)} | {peer.median:,.0f} | "
                f"{ratio:.2f} |"
            )
    lines += [
        "",
        f"The constructor alone (nothing sent; the names made beforehand), µs per object, "
        f"timed up to {min(CONSTRUCT_SECONDS, seconds):g} s per round, median of the rounds:",
        "",
        "| Constructor | µs per object | rounds | tenure / redis-py |",
        "|---|---:|---|---:|",
    ]
    for _, mine, theirs in entity_pairs():
        peer_made = by.get((theirs, "constructor"))
        for key in (mine, theirs):
            made = by.get((key, "constructor"))
            if made is None:
                continue
            times = (
                f"{made.median / peer_made.median:.2f}"
                if key == mine and peer_made is not None and peer_made.median > 0
                else ""
            )
            lines.append(
                f"| {ENTITY_CONTENDERS[key][1]} | {made.median:.2f} | "
                f"{', '.join(f'{x:.2f}' for x in made.runs)} | {times} |"
            )
    return "\n".join(lines + _cost_lines(by)) + "\n"


def _cost_lines(by: dict[tuple[str, str], EntityResult]) -> list[str]:
    """Where a cycle's time goes (benchmarks.costs), medians of the rounds."""
    rows = [key for key in ENTITY_CONTENDERS if (key, "server_us") in by]
    if not rows:
        return []
    cycles = by[(rows[0], "server_us")].names[0]
    lines = [
        "",
        f"Where a cycle goes: {cycles:,} cycles on fresh names after `FLUSHDB` and `CONFIG "
        "RESETSTAT`, each lock alone, per cycle: the server's µs in the commands the "
        "client sent (`EVALSHA`, `EVAL`, `SET`, from `INFO commandstats`; a script's own "
        "commands count in its `EVALSHA`), those commands (round trips), the client's CPU "
        "µs (its thread's CPU time: waiting for the server is not counted; the object is "
        "made inside the acquire), and the keys and bytes (`MEMORY USAGE`, the mean of "
        "up to 200 of its keys) each released name leaves. Medians of the rounds.",
        "",
        "| Lock | server µs | round trips | acquire CPU µs | release CPU µs "
        "| keys per idle name | bytes per idle name |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key in rows:
        f = {variant: by[(key, variant)].median for variant in COST_VARIANTS}
        lines.append(
            f"| {ENTITY_CONTENDERS[key][1]} | {f['server_us']:.1f} | {f['round_trips']:.1f} | "
            f"{f['acquire_cpu_us']:.0f} | {f['release_cpu_us']:.0f} | {f['keys_idle']:.1f} | "
            f"{f['bytes_idle']:.0f} |"
        )
    return lines


def scale_section(
    holds: Sequence[HoldResult],
    waiters: Sequence[WaitersResult],
    command: str,
    window: float,
) -> str:
    """The "Scale: holds and waiters" section."""
    if not holds and not waiters:
        return ""
    lines = [
        "## Scale: holds and waiters",
        "",
        f"Measured by `{command}` (this part alone: `tenure bench locks --parts scale`; "
        "it is not in the default parts and must be asked for). Every size is bounded "
        f"by {SCALE_CAP:g} s; a size that does not finish in it is reported as not finished.",
        "",
    ]
    if holds:
        extra = holds[0].extra
        rounds = max(len(r.acquire_runs) for r in holds)
        lines += [
            "### Holding many locks",
            "",
            "One thread (sync, one `redis.Redis`) or one task (asyncio, one "
            "`redis.asyncio.Redis`) takes N locks of distinct names with default "
            "arguments and keeps them (and their lock objects), then times "
            f"{extra:,} further acquire + release pairs on new names, acquire and release "
            "apart: µs per call, the mean of the pairs; N grows within a round, the "
            f"locks of the smaller N staying held. Median of {rounds} round(s), "
            "interleaved across the locks. redis-py keeps nothing per held lock: its "
            "row is the flat reference.",
            "",
            "| Lock | held | acquire µs | rounds | release µs | rounds | finished |",
            "|---|---:|---:|---|---:|---|---|",
        ]
        for r in holds:
            lines.append(
                f"| {HOLD_CONTENDERS[r.key][1]} | {r.held:,} | {_us(r.acquire_us)} | "
                f"{', '.join(_us(x) for x in r.acquire_runs)} | {_us(r.release_us)} | "
                f"{', '.join(_us(x) for x in r.release_runs)} | "
                f"{'yes' if r.finished else 'no'} |"
            )
        ratios = _hold_ratios(holds)
        if ratios:
            lines += ["", "Cost at the most held / at the fewest:", ""]
            lines += [f"- {line}" for line in ratios]
        failed = {r.key: r.error for r in holds if r.error}
        for key, error in failed.items():
            lines.append(f"\n{HOLD_CONTENDERS[key][1]}: `{error}`.")
        lines.append("")
    if waiters:
        lines += [
            "### Many asyncio waiters on one lock",
            "",
            "N asyncio tasks of one process, sharing one `redis.asyncio.Redis` over "
            f"`BlockingConnectionPool(max_connections={waiters[0].pool_size})` "
            "(`--waiter-pool`), each with its own `AsyncLock(client, name)` (default "
            "arguments), wait on one name that another client holds. Queued in = from "
            "creating the tasks until the server's queue (`ZCARD` of `lock.keys.queue`, "
            f"read every 10 ms) holds N, allowed {SCALE_CAP * QUEUE_SHARE:g} s (if not all "
            "have joined by then, the rest is measured with those that have). Traffic: "
            f"the server's counters over {window:g} s while they wait, minus the same over "
            f"{window:g} s with the holder alone (baseline); commands count those run "
            "inside scripts, script calls are `EVALSHA`/`EVAL` (one round trip each). "
            "Then the holder releases and each task in turn takes the lock and releases "
            "it at once: handoffs/s = waiters served / (last release - the holder's "
            "release).",
            "",
            "| Waiters | queued in s | most queued | queued while read "
            "| baseline commands/s | commands/s waiting | script calls/s (- baseline) "
            "| commands/s (- baseline) | handoffs | drained in s | handoffs/s | unserved "
            "| errors | finished |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for w in waiters:
            in_window = "—" if w.queued_in_window is None else f"{w.queued_in_window:,}"
            lines.append(
                f"| {w.waiters:,} | {_seconds(w.queue_seconds)} | {w.queued:,} | {in_window} "
                f"| {w.baseline_per_s:,.0f} | {_rate(w.waiting_per_s)} "
                f"| {_rate(w.scripts_per_s)} | {_rate(w.refresh_per_s)} | {w.handoffs:,} "
                f"| {_seconds(w.drain_seconds)} | {_rate(w.handoff_rate)} | {w.unserved:,} "
                f"| {w.errors} | {'yes' if w.finished else 'no'} |"
            )
        for w in waiters:
            if w.first_error:
                lines.append(f"\n{w.waiters:,} waiters: first error `{w.first_error}`.")
    return "\n".join(lines) + "\n"


def _hold_ratios(holds: Sequence[HoldResult]) -> list[str]:
    lines: list[str] = []
    for key, label in ((k, v[1]) for k, v in HOLD_CONTENDERS.items()):
        mine = {r.held: r for r in holds if r.key == key and r.acquire_runs}
        ends = _ends(list(mine))
        if ends is None:
            continue
        few, many = mine[ends[0]], mine[ends[1]]
        acquire = many.acquire_us / few.acquire_us if few.acquire_us > 0 else float("inf")
        release = many.release_us / few.release_us if few.release_us > 0 else float("inf")
        lines.append(
            f"{label}: acquire {acquire:.2f}x, release {release:.2f}x "
            f"({ends[1]:,} held / {ends[0]:,} held)"
        )
    return lines


# -- terminal -----------------------------------------------------------------------


def entity_lines(entity: Sequence[EntityResult]) -> list[str]:
    """The per-entity part as terminal lines (after a blank line)."""
    if not entity:
        return []
    by = {(r.key, r.variant): r for r in entity}
    lines = ["", "per-entity locks (a new lock object per cycle, default arguments):"]
    for mode, mine, theirs in entity_pairs():
        for variant, ours, peer, ratio in _versus(by, mine, theirs):
            lines.append(
                f"  {mode:<8}{variant:<8}tenure {ours.median:>8,.0f}/s  redis-py "
                f"{peer.median:>8,.0f}/s  tenure/redis-py {ratio:.2f}"
            )
        made, peer_made = by.get((mine, "constructor")), by.get((theirs, "constructor"))
        if made is not None and peer_made is not None:
            lines.append(
                f"  {mode:<8}constructor: tenure {made.median:.2f} us, "
                f"redis-py {peer_made.median:.2f} us"
            )
        kinds = [kind for kind_mode, kind, _ in entity_kin() if kind_mode == mode]
        for kind in kinds:
            for variant, ours, _peer, ratio in _versus(by, kind, mine):
                lines.append(
                    f"  {mode:<8}{variant:<8}{kind} {ours.median:>8,.0f}/s  "
                    f"{kind}/tenure lock {ratio:.2f}"
                )
        for key in (mine, theirs, *kinds):
            if (key, "server_us") in by:
                f = {variant: by[(key, variant)].median for variant in COST_VARIANTS}
                lines.append(
                    f"  {mode:<8}{key}: server {f['server_us']:.1f} us, "
                    f"{f['round_trips']:.1f} round trips, CPU acquire {f['acquire_cpu_us']:.0f} "
                    f"us + release {f['release_cpu_us']:.0f} us, {f['keys_idle']:.1f} keys and "
                    f"{f['bytes_idle']:.0f} bytes per idle name"
                )
    return lines


def scale_lines(holds: Sequence[HoldResult], waiters: Sequence[WaitersResult]) -> list[str]:
    """The scale part as terminal lines (after a blank line)."""
    lines: list[str] = []
    if holds:
        lines += ["", "holding many locks (us per further acquire / release):"]
        for r in holds:
            done = "" if r.finished else "  NOT FINISHED"
            lines.append(
                f"  {r.key:<16}{r.held:>8,} held: acquire {_us(r.acquire_us):>7} us, "
                f"release {_us(r.release_us):>7} us{done}"
            )
        lines += [f"  {line}" for line in _hold_ratios(holds)]
    if waiters:
        lines += ["", "many asyncio waiters on one lock:"]
        for w in waiters:
            lines.append(
                f"  {w.waiters:>7,}: queued in {_seconds(w.queue_seconds)} s, "
                f"script calls {_rate(w.scripts_per_s)}/s, commands {_rate(w.refresh_per_s)}/s "
                f"(minus baseline), {w.handoffs:,} handoffs at {_rate(w.handoff_rate)}/s, "
                f"{w.unserved:,} unserved, {w.errors} errors"
                + ("" if w.finished else f"  NOT FINISHED ({w.queued:,} queued at most)")
            )
    return lines
