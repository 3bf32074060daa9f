"""``python -m benchmarks.caches``: ``tenure bench caches`` writing docs/benchmarks.md.

The benchmark itself lives in the package (``tenure._bench.caches``);
this runner only sets where the report goes.
"""

from __future__ import annotations

from tenure._bench.caches import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m benchmarks.caches", output="docs/benchmarks.md"))
