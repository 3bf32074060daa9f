"""``python -m benchmarks.redlock``: ``tenure bench redlock`` writing docs/benchmarks.md.

The benchmark itself lives in the package (``tenure._bench.redlock``); this
runner only sets where the report goes.
"""

from __future__ import annotations

from tenure._bench.redlock import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m benchmarks.redlock", output="docs/benchmarks.md"))
