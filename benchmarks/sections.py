"""Each benchmark owns one section of docs/benchmarks.md and rewrites only it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_section"]


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- tenure-bench:{name}:start -->", f"<!-- tenure-bench:{name}:end -->"


def write_section(path: Path, name: str, text: str) -> None:
    """Put ``text`` between the markers of section ``name``; other sections stay."""
    start, end = _markers(name)
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if start in old and end in old:
        before, _, rest = old.partition(start)
        _, _, after = rest.partition(end)
        new = before + block + after.lstrip("\n")
    elif old.strip():
        new = old.rstrip() + "\n\n" + block
    else:
        new = block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new, encoding="utf-8")
