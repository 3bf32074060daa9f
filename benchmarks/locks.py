"""``python -m benchmarks.locks``: ``tenure bench locks`` writing docs/benchmarks.md.

The benchmark itself lives in the package (``tenure._bench.locks``) so that
an installed tenure can run it; this runner only sets where the report goes.
"""

from __future__ import annotations

from tenure._bench.locks import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m benchmarks.locks", output="docs/benchmarks.md"))
