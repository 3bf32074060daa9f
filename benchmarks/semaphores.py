"""``python -m benchmarks.semaphores``: ``tenure bench semaphores`` writing docs/benchmarks.md.

The benchmark itself lives in the package (``tenure._bench.semaphores``);
this runner only sets where the report goes.
"""

from __future__ import annotations

from tenure._bench.semaphores import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m benchmarks.semaphores", output="docs/benchmarks.md"))
