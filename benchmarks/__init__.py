"""Runners for the benchmarks of tenure against its peers (never asserted in tests).

``python -m benchmarks.locks`` and ``python -m benchmarks.semaphores`` run
``tenure bench locks`` and ``tenure bench semaphores`` (``tenure._bench``)
and write their sections of ``docs/benchmarks.md``. The peers and matplotlib
come with ``pip install -e ".[bench]"``.
"""
