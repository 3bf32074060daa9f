"""Benchmarks of tenure against its peers, run by a command, never asserted in tests.

``python -m benchmarks.locks`` compares ``tenure.Lock`` with redis-py's
``Lock``, python-redis-lock and pottery's ``Redlock`` on one server in one
run, and writes ``docs/benchmarks.md``.
"""
