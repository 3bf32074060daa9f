"""How long ``tenure bench locks`` will take, from its arguments, before it starts.

Each part's time is built from the structure of its run: the seconds the
arguments fix (``--seconds`` per contended run, times the rounds and the
contenders), counts divided by rates measured here, and per-run overheads
(starting servers and worker processes, waits such as the names part's idle
wait). The constants were measured on the 2-core machine of
``docs/benchmarks.md``; a busy machine takes longer.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from benchmarks import several
from benchmarks.entity import ENTITY_CONTENDERS
from benchmarks.locks_arguments import counts, parts, select
from benchmarks.names import NAME_KINDS
from benchmarks.scale import HOLD_CONTENDERS
from tenure._tooling import IDLE_TTL

__all__ = ["describe", "estimated_seconds"]

START = {"standalone": 0.7, "replicated": 1.0, "cluster": 3.0}
"""The interpreter, the private server(s), the PING sample; and the report at the end."""
SOLO_RUN = 0.03  # a solo run's FLUSHDB, lock object and warm-up cycles
SPAWN = 0.6  # per process of the contended part's pool: spawn, imports, connect
CONTENDED_RUN = 0.4  # per contended run: the common start's margin, collecting the records
STRAGGLER = {"redis-py": 0.5}  # a 0.1 s poller still asleep at the deadline, often longer
POOL_ROUND = {"redis-py": 0.6}  # one bounded-pool round (6 threads x 3 cycles), else 0.2 s
POOL_FAILS = {"python-redis-lock": 15.0}
"""A contender whose waiters hold the pool's connections: three pool timeouts, one round."""
SINGLE_TRY = 0.16  # one single-connection handoff: its settle time and the handoff
SINGLE_FAILS = {"python-redis-lock": 5.0}  # its first try ends in a socket timeout
WAITER_TASK, WAITER_THREAD = 0.0003, 0.002  # seconds per waiter of the waiters part
NAME_RATE = {"tenure": 6_000.0, "redis-py": 10_500.0}  # names/s from 2 processes
NAME_SHARE = {0: 0.5, 1: 0.6}  # of that rate, from this process (0) or one process
NAME_SPAWN = 1.0  # the name processes' start
ENTITY_RUN = 0.9  # per contender and round: the cost breakdown's 2,000 cycles, warm-up
CONSTRUCT = 0.3  # the constructor's timing, at most (benchmarks.entity)
HOLD_OP = 160e-6  # seconds per acquire or release while holding many (the 4 contenders' mean)
HOLD_ROUND = 0.05  # per contender and round of the holds: FLUSHDB, a client, an event loop
CROWD_WAITER = 1.1e-3  # seconds per asyncio waiter of the scale part: queueing, its turn
CROWD_ROUND = 0.1  # per crowd: clients, the holder


def _names(args: argparse.Namespace, keys: Sequence[str]) -> float:
    kinds = [kind for kind in NAME_KINDS if kind in keys]
    share = NAME_SHARE.get(args.name_processes, 1.0)
    spawn = NAME_SPAWN if args.name_processes else 0.0
    total = sum(spawn + args.names / (NAME_RATE[kind] * share) for kind in kinds)
    if "tenure" in kinds and not args.skip_idle_wait:  # its markers go IDLE_TTL after use
        total += min(args.idle_cap, IDLE_TTL + 1.0)
    return float(total)


def _scale(args: argparse.Namespace) -> float:
    holds = counts(args.scale_holds, "--scale-holds")
    ops = 2 * (max(holds) + args.scale_extra * len(holds))  # take, time, release
    per_round = len(HOLD_CONTENDERS) * (HOLD_ROUND + ops * HOLD_OP)
    for waiters in counts(args.scale_waiters, "--scale-waiters"):  # two readings, the drain
        per_round += 2 * args.scale_window + waiters * CROWD_WAITER + CROWD_ROUND
    return float(args.rounds * per_round)


def estimated_seconds(args: argparse.Namespace) -> float:
    """About how long a run with ``args`` (checked) takes, in seconds."""
    contenders = select(args.only, args.topology)
    chosen = parts(args)
    keys = [c.key for c in contenders]
    contended = [c.key for c in contenders if c.contended]
    pooled = [c.key for c in contenders if c.contended and c.pooled]
    total = START[args.topology]
    if "solo" in chosen:
        total += len(keys) * (args.solo_seconds + args.solo_runs * SOLO_RUN)
    if "contended" in chosen and contended:
        runs = sum(args.seconds + CONTENDED_RUN + STRAGGLER.get(key, 0.0) for key in contended)
        total += args.processes * SPAWN + args.rounds * runs
    if "pool" in chosen:
        for key in pooled:
            total += POOL_FAILS.get(key, 0.0) or args.rounds * POOL_ROUND.get(key, 0.2)
            total += SINGLE_FAILS.get(key, 0.0) or args.single_tries * SINGLE_TRY
    if "waiters" in chosen:
        total += 0.4 + args.tasks * WAITER_TASK + args.threads * WAITER_THREAD
    if "names" in chosen:
        total += _names(args, keys)
    if "entity" in chosen:
        run = 2 * args.solo_seconds + min(CONSTRUCT, args.solo_seconds) + ENTITY_RUN
        total += len(ENTITY_CONTENDERS) * args.rounds * run
    if "scale" in chosen:
        total += _scale(args)
    return total


def describe(args: argparse.Namespace) -> str:
    """What a run with ``args`` (checked) does, for its announcement: parts and contenders."""
    contenders = select(args.only, args.topology)
    where = "" if args.topology == "standalone" else f" on a {args.topology} topology"
    return f"{', '.join(parts(args))}{where}; {several(len(contenders), 'contender')}"
