"""``python -m benchmarks.ingest``: ``tenure bench ingest`` writing docs/benchmarks.md.

The benchmark itself lives in the package (``tenure._bench.ingest``);
this runner only sets where the report goes.
"""

from __future__ import annotations

from tenure._bench.ingest import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m benchmarks.ingest", output="docs/benchmarks.md"))
