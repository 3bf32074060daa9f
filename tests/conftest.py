"""Shared test configuration; the server fixtures come from ``tenure.testing``."""

from __future__ import annotations

from tenure.testing import ServerFactory

__all__ = ["ServerFactory"]
