"""Every Python example in README.md and docs/ runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
