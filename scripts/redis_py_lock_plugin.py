"""The pytest plugin of ``scripts/redis_py_lock_tests.py``, loaded in its pytest child.

``-p redis_py_lock_plugin`` (``scripts/`` on the child's PYTHONPATH): swaps
redis-py's ``Lock`` classes for tenure's (``interop="redis-py"`` in that mode)
as the tests are collected, records each test's outcome with the statement
and error a failed one stopped at, and writes them where the harness reads
them (the files named by its environment variables).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis_py_lock_tests import ENV_EXPECTED, ENV_OUTCOMES, ENV_SWAP, SWAPS, Entry

if TYPE_CHECKING:
    import pytest


_outcomes: dict[str, dict[str, str]] = {}
_failed_at: dict[str, str] = {}  # node id -> "<statement> -> <error>" of a failed call
_collected: list[str] = []
_RANK = {"passed": 0, "skipped": 1, "xpassed": 2, "xfailed": 2, "failed": 3, "error": 3}


_interop_classes: dict[type, type] = {}


def _in_interop_mode(cls: type) -> type:
    """``cls`` made with ``interop="redis-py"`` unless told otherwise (one class per ``cls``)."""
    if cls not in _interop_classes:
        original: Any = vars(cls)["__init__"]

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("interop", "redis-py")
            original(self, *args, **kwargs)

        _interop_classes[cls] = type(cls.__name__, (cls,), {"__init__": __init__})
    return _interop_classes[cls]


def _swap_lock_classes(items: Sequence[pytest.Item], mode: str) -> None:
    import tenure

    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ not in SWAPS:
            continue
        source, replacement = SWAPS[module.__name__]
        current = getattr(module, "Lock", None)
        tenure_class = getattr(tenure, replacement)
        if mode == "interop":
            tenure_class = _in_interop_mode(tenure_class)
        if current is tenure_class:
            continue
        if current is not importlib.import_module(source).Lock:
            raise RuntimeError(f"{module.__name__}.Lock is not {source}.Lock: {current!r}")
        module.Lock = tenure_class


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Swap the test modules' ``Lock`` for tenure's; mark the expected failures."""
    import pytest

    mode = os.environ.get(ENV_SWAP, "tenure")
    if mode != "baseline":
        _swap_lock_classes(items, mode)
    listed = json.loads(Path(os.environ[ENV_EXPECTED]).read_text())
    entries = [Entry(test, "*", "", reason) for test, reason in listed]
    for item in items:
        entry = next((entry for entry in entries if entry.matches(item.nodeid)), None)
        if entry is not None:
            item.add_marker(pytest.mark.xfail(reason=entry.reason, strict=False))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Remember every test that will run."""
    _collected.extend(item.nodeid for item in session.items)


def _where(item: pytest.Item, excinfo: Any) -> str:
    """The statement of the test's own file that raised (whitespace collapsed), and the error."""
    statement = ""
    path = str(getattr(item, "path", ""))
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == path:
            statement = " ".join(str(entry.statement).split())
            break
    message = excinfo.exconly().strip().splitlines()
    return f"{statement} -> {message[0] if message else ''}"


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Keep where each test failed: the statement of its file that raised, and the error."""
    if call.excinfo is not None and call.when == "call":
        _failed_at[item.nodeid] = _where(item, call.excinfo)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the worst outcome of each test's setup, call and teardown."""
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call" and hasattr(report, "wasxfail"):
        outcome = "xpassed"
    else:
        outcome = "passed"
    record = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    if _RANK[outcome] > _RANK[record["outcome"]]:
        record["outcome"] = outcome
        crash = getattr(report.longrepr, "reprcrash", None)
        message = getattr(crash, "message", None) or str(report.longrepr or "")
        record["message"] = message.strip().splitlines()[0] if message.strip() else ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the outcomes for the parent process."""
    for nodeid, where in _failed_at.items():
        if nodeid in _outcomes:
            _outcomes[nodeid]["where"] = where
    results = {"collected": _collected, "outcomes": _outcomes, "exitstatus": int(exitstatus)}
    Path(os.environ[ENV_OUTCOMES]).write_text(json.dumps(results, indent=1))
