"""Check the installed tenure distribution's metadata (CI runs it in the wheel's venv).

The license file travels with it, the project URLs are there, the long
description (the README) has no relative link (on a package index those lead
nowhere), and neither the benchmarks nor the tests are installed.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

RELATIVE_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)")


def problems() -> list[str]:
    """What is wrong with the installed distribution's metadata (empty: nothing)."""
    metadata = importlib.metadata.metadata("tenure")
    found = []
    if "LICENSE" not in (metadata.get_all("License-File") or []):
        found.append("no License-File: LICENSE")
    files = importlib.metadata.files("tenure") or []
    if not any(file.name == "LICENSE" for file in files):
        found.append("the LICENSE file is not installed")
    shipped = [str(file) for file in files if file.parts[0] in ("benchmarks", "tests")]
    if shipped:  # the benchmarks and tests run from a clone, never from the wheel
        found.append(f"the wheel installs {shipped[0]} (and {len(shipped) - 1} more)")
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    for label in ("Homepage", "Source", "Changelog"):
        if not urls.get(label, "").startswith("https://"):
            found.append(f"no {label} project URL")
    description = metadata.get_payload() or metadata.get("Description", "")  # type: ignore[attr-defined]
    if "## Quickstart" not in description:
        found.append("the long description is not the README")
    found += [
        f"relative link in the description: {link}" for link in RELATIVE_LINK.findall(description)
    ]
    return found


if __name__ == "__main__":
    wrong = problems()
    for line in wrong:
        print(f"distribution: {line}", file=sys.stderr)
    if wrong:
        sys.exit(1)
    version = importlib.metadata.version("tenure")
    print(f"distribution: tenure {version}: license, URLs, description ok")
