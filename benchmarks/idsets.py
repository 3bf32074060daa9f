"""``python -m benchmarks.idsets``: ``tenure bench idsets`` writing docs/benchmarks.md.

The benchmark itself lives in the package (``tenure._bench.idsets``); this
runner only sets where the report goes.
"""

from __future__ import annotations

from tenure._bench.idsets import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m benchmarks.idsets", output="docs/benchmarks.md"))
