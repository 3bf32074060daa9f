"""Every Python example in README.md and docs/ runs as written; the site has every page and name."""

from __future__ import annotations

import importlib
import pkgutil
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import tenure

pytestmark = pytest.mark.engine_blind

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def examples() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, code in enumerate(BLOCK.findall(path.read_text()), start=1):
            if "def test_" in code:  # a pytest example: run by test_fixture_example
                continue
            found.append((f"{path.relative_to(ROOT)}#{number}", code))
    return found


@pytest.mark.parametrize(("where", "code"), examples(), ids=[w for w, _ in examples()])
def test_example_runs(where: str, code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stderr}"


def test_fixture_example(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    tests = [code for code in BLOCK.findall(readme) if "def test_" in code]
    assert tests
    (tmp_path / "test_readme.py").write_text("\n\n".join(tests))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def public_names() -> list[tuple[str, str]]:
    """(module, name) for every name in ``__all__`` of tenure and its public modules."""
    found = pkgutil.iter_modules(tenure.__path__)
    modules = ["tenure"] + [f"tenure.{each.name}" for each in found if each.name[0] != "_"]
    return [(m, name) for m in modules for name in importlib.import_module(m).__all__]


def test_api_reference_documents_every_public_name() -> None:
    # docs/conf.py generates the reference pages from __all__ at build time; the
    # build itself fails (-W) on a public name missing from its Python domain.
    pages = runpy.run_path(str(ROOT / "docs" / "conf.py"))["api_pages"]()
    text = "\n".join(pages.values())
    assert {"tenure.server", "tenure.testing", "tenure.inspection"} <= {
        m for m, _ in public_names()
    }
    for module, name in public_names():
        documented = re.findall(
            rf"^\.\. auto\w+:: {re.escape(f'{module}.{name}')}$"
            rf"|^\.\. py:data:: {re.escape(name)}\n   :module: {re.escape(module)}$",
            text,
            re.MULTILINE,
        )
        assert len(documented) == 1, f"{module}.{name}: {len(documented)} entries in docs/api"


def test_every_docs_page_is_in_the_site() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    toctree = "\n".join(re.findall(r"```\{toctree\}\n(.*?)```", index, re.DOTALL))
    listed = {line for line in toctree.splitlines() if line and not line.startswith(":")}
    pages = {path.stem for path in (ROOT / "docs").glob("*.md")} - {"index"}
    assert pages <= listed, f"docs/index.md's toctree lacks {sorted(pages - listed)}"


_OUTSIDE = {"os", "threading", "asyncio", "redis", "execute_command", "await", "def"}
"""Names ARCHITECTURE.md cites that are Python's, redis-py's or keywords, not tenure's."""


def test_the_architecture_cites_files_modules_and_names_that_exist() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if ".git" not in p.parts]
    code = "\n".join(
        p.read_text()
        for folder in ("src", "scripts", "tests")
        for p in (ROOT / folder).rglob("*.py")
    )
    wrong = []
    for cited in sorted(set(re.findall(r"`([^`\s]+)`", text))):
        if cited.endswith(".py"):
            if not any(f.endswith(cited.lstrip("/")) for f in files):
                wrong.append(f"{cited}: no such file")
        elif cited.startswith("tenure."):
            if importlib.util.find_spec(cited) is None:
                wrong.append(f"{cited}: no such module")
        elif re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", cited):
            if cited.split(".")[0] in _OUTSIDE or re.fullmatch(r"[A-Z]+", cited):
                continue  # Python's, redis-py's, a server command
            name = cited.split(".")[-1]
            if not re.search(rf"(def|class) {name}\b|\b{name}\s*[:=]", code):
                wrong.append(f"{cited}: defined nowhere")
    # Every module the layout draws is a file of that folder.
    tree = text[text.index("```\nsrc/tenure/") : text.index("\ntests/\n")]
    folder = ""
    for line in tree.splitlines()[2:]:
        entry = re.match(r"( *)([\w.]+/?)", line)
        if entry is None or not entry.group(2).strip():
            continue
        name, depth = entry.group(2), len(entry.group(1))
        if name.endswith("/") and depth == 2:
            folder = name
        elif (name.endswith(".py") and depth == 4 and folder) and not (
            ROOT / "src/tenure" / folder / name
        ).exists():
            wrong.append(f"{folder}{name}: drawn in the layout, not a file")
    assert not wrong, wrong
