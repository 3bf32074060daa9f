"""The asyncio implementation: the one hand-written source of every primitive.

``tenure/_sync`` is generated from this package by ``scripts/unasync.py``;
edit here, then run ``python scripts/unasync.py``.
"""
