"""The virtualenv a redis-py version's own tests run in, for ``redis_py_lock_tests.py``.

redis-py's tests import what their version needs (pytest plugins, ``mock``,
``packaging``...); this module finds those imports in the extracted test
files, asks the interpreter which are missing, and makes a throwaway
virtualenv with that redis-py version, tenure (editable) and the rest.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from redis_py_lock_tests import ALWAYS, DISTRIBUTIONS, ROOT, TEST_FILES, HarnessError


def _optional(node: ast.Try) -> bool:
    """A ``try`` whose handler catches ImportError: its imports are optional."""
    names = {"ImportError", "ModuleNotFoundError", "Exception"}
    for handler in node.handlers:
        caught = handler.type
        if caught is None:
            return True
        elts = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if any(isinstance(elt, ast.Name) and elt.id in names for elt in elts):
            return True
    return False


def _module_imports(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when imported (not those inside functions or optional)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            yield from _module_imports(node.body)
            yield from _module_imports(node.orelse)
        elif isinstance(node, ast.Try) and not _optional(node):
            yield from _module_imports(node.body)


def _local_file(folder: Path, module: str) -> Path | None:
    base = folder.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def third_party_imports(folder: Path) -> set[str]:
    """Top-level names of the packages the tests' conftests and helpers import at load time."""
    todo = [folder / "tests" / "conftest.py", folder / "tests" / "test_asyncio" / "conftest.py"]
    todo += [folder / name for name in TEST_FILES]
    seen: set[Path] = set()
    found: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        package = ".".join(path.relative_to(folder).parent.parts)
        for node in _module_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                prefix = f"{base}.{node.module}" if node.module else base
                modules = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
            else:
                assert node.module is not None
                modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for module in modules:
                top = module.split(".")[0]
                if top == "tests":
                    local = _local_file(folder, module)
                    if local is not None:
                        todo.append(local)
                elif top != "redis" and top not in sys.stdlib_module_names:
                    found.add(top)
    return found


def requirements(folder: Path) -> dict[str, str]:
    """Import name -> requirement of everything the run needs besides redis and tenure."""
    names = third_party_imports(folder) | set(ALWAYS)
    needed = {name: DISTRIBUTIONS.get(name, name) for name in sorted(names)}
    # redis-py 5.0.x's asyncio tests take pytest-asyncio's ``event_loop`` fixture,
    # which pytest-asyncio 1.0 removed.
    if any(
        re.search(r"\bevent_loop\b", (folder / name).read_text())
        for name in (*TEST_FILES, "tests/test_asyncio/conftest.py")
        if (folder / name).exists()
    ):
        needed["pytest_asyncio"] = "pytest-asyncio<1"
    return needed


def missing_modules(python: str, modules: Iterable[str]) -> list[str]:
    """The modules ``python`` cannot import."""
    probe = (
        "import importlib.util, sys; "
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    done = subprocess.run(
        [python, "-c", probe, *modules], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def pip_install(python: str, arguments: Sequence[str]) -> None:
    """``python -m pip install -q ...``, showing pip's output only when it fails."""
    command = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run([*command, *arguments], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HarnessError(f"pip install {' '.join(arguments)} failed:\n{done.stdout}{done.stderr}")


def make_venv(folder: Path, version: str, needed: dict[str, str]) -> str:
    """A throwaway virtualenv with that redis-py, this project and ``needed``; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = str(folder / "bin" / "python")
    pip_install(python, [f"redis=={version}", "-e", str(ROOT), *needed.values()])
    installed = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('redis'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if installed != version:
        raise HarnessError(f"the throwaway venv got redis {installed}, not {version}")
    return python


# --------------------------------------------------------------------------- the run
