"""The shipped Lua scripts: each parses, and each package keeps its own."""

from __future__ import annotations

import re

import pytest

from tenure._async._semaphore import RW_LIMIT
from tenure._core.exceptions import ArgumentError, ScriptError
from tenure._core.scripts import Script, load_script, script_names


@pytest.mark.parametrize("package", ["tenure", "tenure._tools.demo"])
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
    assert script_names("tenure._tools.demo") == ["market_list", "market_purchase"]
    with pytest.raises(ArgumentError, match="no script named 'market_list' in tenure"):
        load_script("market_list")


def test_the_scripts_know_a_read_write_lock_by_the_limit_python_gives_it() -> None:
    # Only under this limit is a token's first letter its mode (semaphore.lua, is_writer).
    assert f"local RW_LIMIT = {RW_LIMIT}\n" in load_script("semaphore_extend").source


HEAD = "-- tenure script: demo\n-- Do a thing.\n"
BODY = "-- KEYS[1] a key\n-- returns 1\nreturn 1\n"


def test_every_header_says_what_a_resend_does() -> None:
    script = Script.from_source(
        HEAD + "-- on resend: the same token finds its lease set;\n"
        "--   setting it again changes nothing\n" + BODY
    )
    assert script.changes_state
    assert script.on_resend == (
        "the same token finds its lease set; setting it again changes nothing"
    )
    assert script.keys == ("a key",)
    read_only = Script.from_source(HEAD + "-- read only\n" + BODY)
    assert not read_only.changes_state and read_only.on_resend == ""
    with pytest.raises(ScriptError, match="must say '-- read only', or '-- on resend:"):
        Script.from_source(HEAD + BODY)
    with pytest.raises(ScriptError, match="must say"):
        Script.from_source(HEAD + "-- on resend:\n" + BODY)
    with pytest.raises(ScriptError, match="both"):
        Script.from_source(HEAD + "-- read only\n-- on resend: nothing\n" + BODY)
    with pytest.raises(ScriptError, match="two"):
        Script.from_source(HEAD + "-- on resend: a\n-- on resend: b\n" + BODY)


def test_a_script_carries_only_the_library_functions_it_reaches() -> None:
    """Lua builds every ``local function`` of a script on each call (~0.035 us each on
    this machine): a script keeps only what it calls, directly or through another."""
    for name in script_names():
        source = load_script(name).source
        defined = re.findall(r"^local function ([A-Za-z_][A-Za-z0-9_]*)\(", source, re.MULTILINE)
        assert len(defined) == len(set(defined)), name
        for function in defined:
            uses = re.findall(rf"\b{function}\b", source)
            assert len(uses) > 1, f"{name} carries {function} but never calls it"
    assert "local function grant_permits" not in load_script("semaphore_extend").source
    assert "local function receipt" in load_script("semaphore_extend").source
