"""Run a pytest selection N times in a row while other processes keep every core busy.

    python scripts/busy_machine.py --runs 20 -- tests/test_redlock_faults.py

A test that fails on a busy machine fails a user's busy service the same
way; this is how tenure checks that a fault test does not depend on a quiet
machine. The burners (one per core) run at the same priority as the tests
and stop when the runs end (or after ``--cap`` seconds). Prints one line per
run and exits 1 unless every run passed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def _burn(until: float) -> None:
    while time.time() < until:
        pass


def main() -> int:
    """Parse the arguments, start the burners, run pytest ``--runs`` times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="pytest runs in a row (20)")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="busy processes")
    parser.add_argument("--cap", type=float, default=3600.0, help="seconds at most, all runs")
    parser.add_argument("pytest_args", nargs="+", help="what to pass to pytest (after --)")
    args = parser.parse_args()
    until = time.time() + args.cap
    burners = [
        multiprocessing.Process(target=_burn, args=(until,), daemon=True)
        for _ in range(args.burners)
    ]
    for burner in burners:
        burner.start()
    passed = 0
    try:
        for run in range(1, args.runs + 1):
            left = until - time.time()
            if left <= 0:
                print(f"run {run}: out of time (--cap {args.cap:g} s)", flush=True)
                break
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                capture_output=True,
                text=True,
                timeout=left,
                check=False,
            )
            took = time.monotonic() - started
            tail = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
            if done.returncode == 0:
                passed += 1
                print(f"run {run}: passed in {took:.0f} s ({tail})", flush=True)
            else:
                print(f"run {run}: FAILED in {took:.0f} s ({tail})", flush=True)
                for line in done.stdout.splitlines():
                    if line.startswith(("FAILED", "E   ")):
                        print(f"    {line[:200]}", flush=True)
    finally:
        for burner in burners:
            burner.terminate()
            burner.join(5)
    print(f"{passed} of {args.runs} runs passed with {args.burners} busy processes", flush=True)
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
