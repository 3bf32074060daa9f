"""The shipped Lua scripts: each parses, and each package keeps its own."""

from __future__ import annotations

import pytest

from tenure._exceptions import ArgumentError
from tenure._scripts import load_script, script_names


@pytest.mark.parametrize("package", ["tenure", "tenure._demo"])
def test_every_shipped_script_parses_with_its_own_name(package: str) -> None:
    names = script_names(package)
    assert names
    for name in names:
        script = load_script(name, package)
        assert script.name == name
        assert "--! include" not in script.source  # every include expanded
        assert len(script.sha) == 40


def test_the_library_ships_no_demo_script() -> None:
    assert not [name for name in script_names() if name.startswith("market_")]
    assert script_names("tenure._demo") == ["market_list", "market_purchase"]
    with pytest.raises(ArgumentError, match="no script named 'market_list' in tenure"):
        load_script("market_list")
