"""The package's floors, checked from its imports (ARCHITECTURE.md, "Layout").

1. ``tenure._core``: sans-IO, imports only ``tenure._core``; no threads, no
   event loop, no process state.
2. ``tenure._backends``: the asyncio/threads pair and per-process state, on ``_core``.
3. ``tenure._async`` / ``tenure._sync``: the primitives, on the floors below.
4. the public modules.
5. ``tenure._tools``: public names and ``tenure._tooling`` only.
6. the clone's ``benchmarks`` (not in the wheel): as the tools, and the tools.

The public modules never import ``tenure._tooling``: the seam serves the tools alone.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = SRC / "tenure"
BENCHMARKS = ROOT / "benchmarks"

STATEFUL = {"threading", "asyncio", "concurrent.futures", "weakref"}


def modules() -> Iterator[tuple[str, Path]]:
    for base, folder in ((SRC, PACKAGE), (ROOT, BENCHMARKS)):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def of_tenure(names: set[str]) -> set[str]:
    return {name for name in names if name == "tenure" or name.startswith("tenure.")}


def within(name: str, *packages: str) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


@pytest.mark.parametrize(("module", "path"), list(modules()), ids=lambda value: str(value))
def test_each_module_imports_only_from_the_floors_below(module: str, path: Path) -> None:
    used = imports(path)
    mine = of_tenure(used)
    if within(module, "tenure._core"):
        assert all(within(name, "tenure._core") for name in mine), mine
        held = {name for name in used if within(name, *STATEFUL)}
        assert not held, f"{module} is sans-IO: no {sorted(held)}"
    elif within(module, "tenure._backends"):
        assert all(within(name, "tenure._core", "tenure._backends") for name in mine), mine
    elif within(module, "tenure._async", "tenure._sync"):
        assert not any(within(name, "tenure._tools", "tenure._tooling") for name in mine), mine
        assert "tenure" not in mine, "a primitive imports the package's public face"
    elif within(module, "tenure._tools", "benchmarks"):
        if within(module, "tenure._tools"):
            assert not any(within(name, "benchmarks") for name in used), "the wheel's tools"
        inner = {
            name
            for name in mine
            if within(name, "tenure._async", "tenure._sync", "tenure._core", "tenure._backends")
        }
        assert not inner, f"a tool reaches past tenure._tooling: {sorted(inner)}"
    else:  # the public floor: never the tools, nor their seam
        assert not any(within(name, "tenure._tooling") for name in mine), mine
        assert not any(within(name, "tenure._tools") for name in mine) or module in {
            "tenure.__main__"
        }, mine


def test_the_floors_exist_and_nothing_else_sits_at_the_top() -> None:
    top = sorted(path.name for path in PACKAGE.iterdir() if not path.name.startswith("__"))
    assert top == [
        "_async",
        "_backends",
        "_cached.py",
        "_core",
        "_sync",
        "_tooling.py",
        "_tools",
        "_version.py",
        "inspection.py",
        "lua",
        "py.typed",
        "server",
        "testing.py",
    ]


def test_the_command_starts_without_the_optional_extras() -> None:
    # The wheel installed alone (no numpy, pyroaring, SQLAlchemy, ...) still answers
    # `tenure --version`: nothing on the command's import path needs an extra.
    blocked = ["numpy", "pyroaring", "sqlalchemy", "msgpack", "zstandard", "matplotlib"]
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "from tenure._tools.cli import main\n"
        "sys.exit(main(['--version']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tenure ")


MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 350


def _hand_written() -> Iterator[Path]:
    for path in [*sorted(PACKAGE.rglob("*.py")), *sorted(BENCHMARKS.rglob("*.py"))]:
        if "_sync" not in path.parts:  # generated from _async
            yield path


def test_no_module_and_no_class_outgrows_a_reader() -> None:
    # Issue 27: small parts composed; a module of more than 600 lines or a class
    # of more than 350 is a sign that one thing does the work of several.
    too_big = []
    for path in _hand_written():
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT)
        if text.count("\n") > MAX_MODULE_LINES:
            too_big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    too_big.append(f"{name}: class {node.name} has {lines} lines")
    assert not too_big, "\n".join(too_big)
