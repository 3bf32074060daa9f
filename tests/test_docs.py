"""Every Python example in README.md and docs/ runs as written; the site has every page and name."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@functools.cache
def conf() -> dict[str, Any]:
    """docs/conf.py's names: it writes the reference pages (docs/api/) at build time."""
    return runpy.run_path(str(ROOT / "docs" / "conf.py"))


@functools.cache
def api_pages() -> dict[str, str]:
    pages: dict[str, str] = conf()["api_pages"]()
    return pages


def test_api_reference_documents_every_public_name() -> None:
    # The build itself fails (-W) on a public name missing from its Python domain.
    text = "\n".join(api_pages().values())
    assert {"tenure.server", "tenure.testing", "tenure.inspection"} <= {
        m for m, _ in public_names()
    }
    for module, name in public_names():
        documented = re.findall(
            rf"^\.\. auto\w+:: {re.escape(f'{module}.{name}')}(\(\))?$"
            rf"|^\.\. py:data:: {re.escape(name)}\n   :module: {re.escape(module)}$",
            text,
            re.MULTILINE,
        )
        assert len(documented) == 1, f"{module}.{name}: {len(documented)} entries in docs/api"


def test_the_api_reference_is_organised_by_task() -> None:
    pages = api_pages()
    order = [
        "locks",
        "semaphores",
        "caches",
        "ingest",
        "idsets",
        "testing",
        "inspection",
        "observability",
    ]
    assert list(pages) == [f"{page}.rst" for page in [*order, "cli", "errors"]] + ["index.rst"]
    toctree = pages["index.rst"].split(".. toctree::")[1]
    assert re.findall(r"^   (\w+)$", toctree, re.MULTILINE) == [*order, "cli", "errors"]
    placement = conf()["placement"]
    for name in tenure.__all__:  # a name without a topic raises NoTopicError: no "other" page
        page, _ = placement(name)
        assert page in {*order, "errors", "index"}, name
    on = {page: pages[f"{page}.rst"] for page in order}
    where = {
        "locks": ["Lock", "AsyncReentrantLock", "ClusterLock", "Redlock", "ConnectionLock",
                  "AsyncFencedKey", "LockStatistics", "RedlockStatistics"],
        "semaphores": ["Semaphore", "AsyncReadWriteLock", "WriteLock", "SemaphoreStatistics"],
        "caches": ["Cache", "AsyncHerdCache", "cached", "JsonSerializer", "ZstdCompressor",
                   "IdentityGenerator", "CacheStatistics"],
        "ingest": ["IngestJob", "SqlSource", "AsyncCallableSource", "StreamConsumer",
                   "StreamMessage", "IngestStatus"],
        "idsets": ["IdSet", "AsyncIdSet", "IdSetStatistics"],
    }  # fmt: skip
    for page, names in where.items():
        for name in names:
            assert f":: tenure.{name}\n" in on[page], f"tenure.{name} is not on {page}"
    assert ".. automodule:: tenure.server" in on["testing"]
    assert ".. automodule:: tenure.testing" in on["testing"]
    assert ".. automodule:: tenure.inspection" in on["inspection"]
    assert pages["errors.rst"].count(".. autoexception:: ") == sum(
        isinstance(v, type) and issubclass(v, BaseException)
        for v in map(functools.partial(getattr, tenure), tenure.__all__)
    )
    for page in [*order, "cli", "errors"]:  # each links its guide (a MyST-checked link)
        guides = conf()["PAGES"][page].guides
        if any((ROOT / "docs" / guide.partition("#")[0]).exists() for guide in guides):
            assert ":guide:`" in pages[f"{page}.rst"], f"{page} links no guide"


def test_a_public_name_without_a_topic_stops_the_reference() -> None:
    namespace = conf()
    with pytest.raises(namespace["NoTopicError"], match="TOPICS"):
        namespace["placement"]("__getattr__")  # a callable of tenure defined in no topic


def _rendered_docstrings() -> Iterator[tuple[str, str]]:
    """(where, text) of every docstring the reference renders: modules, names, members."""
    for module_name in {m for m, _ in public_names()}:
        module = importlib.import_module(module_name)
        yield module_name, inspect.getdoc(module) or ""
    yield "errors page", conf()["_errors_intro"]()
    for module_name, name in public_names():
        value = getattr(importlib.import_module(module_name), name)
        yield f"{module_name}.{name}", inspect.getdoc(conf()["_fixture_function"](value)) or ""
        if inspect.isclass(value):
            for attribute, member in inspect.getmembers(value):
                if not attribute.startswith("_") or attribute == "__call__":
                    yield f"{module_name}.{name}.{attribute}", inspect.getdoc(member) or ""


def test_the_reference_names_no_private_module_and_no_text_it_does_not_show() -> None:
    text = "\n".join(api_pages().values())
    assert not re.findall(r"\b_(core|backends|async|sync|tools|tooling)\.", text)
    assert "Other names" not in text and "module docstring" not in text
    wrong = []
    for where, doc in _rendered_docstrings():
        flat = " ".join(doc.split())
        for found in re.findall(r"tenure\.(?:\w+\.)*_\w+|module docstring", flat):
            wrong.append(f"{where}: {found}")
    assert wrong == []


def _signatures() -> Iterator[tuple[str, Any]]:
    """Every callable whose signature the reference shows, by where it is shown."""
    for module_name, name in public_names():
        value = getattr(importlib.import_module(module_name), name)
        if conf()["_is_fixture"](value) or not callable(value):
            continue  # a fixture is shown by what it gives a test
        yield f"{module_name}.{name}", value
        if inspect.isclass(value):
            for attribute, member in inspect.getmembers(value):
                if (not attribute.startswith("_") or attribute == "__call__") and callable(member):
                    yield f"{module_name}.{name}.{attribute}", member


_BARE = object()


def _with_a_bare_sentinel(x: object = _BARE) -> object:
    return x


def test_signatures_show_default_values_not_constants() -> None:
    # autodoc shows the values (autodoc_preserve_defaults would show the names of
    # the constants: "= DEFAULT_HERD_TIMEOUT", "= _DEFAULT_IDENTITY"); each value's
    # repr must read as one.
    assert conf()["autodoc_preserve_defaults"] is False
    unreadable = conf()["unreadable_defaults"]
    wrong = {where: found for where, value in _signatures() if (found := unreadable(value))}
    assert wrong == {}
    assert unreadable(_with_a_bare_sentinel) == [f"x={_BARE!r}"]  # the check does check
    assert repr(inspect.signature(tenure.HerdCache).parameters["compressor"].default) == (
        "ZlibCompressor(threshold=1024, level=6)"
    )


def test_the_pytest_hooks_are_not_api() -> None:
    import tenure.testing

    hooks = [name for name in dir(tenure.testing) if name.startswith("pytest_")]
    assert hooks  # pytest finds them as the module's attributes...
    assert not set(hooks) & set(tenure.testing.__all__)  # ...not as its API
    assert "pytest_" not in api_pages()["testing.rst"]


def test_every_command_is_on_the_command_line_page() -> None:
    from tenure._tools.cli import build_parser

    page = api_pages()["cli.rst"]
    commands = conf()["commands"]()
    progs = [parser.prog for _, parser in commands]
    subcommands = {"demo", "inspect", "ingest", "metrics", "server", "bench"}
    assert {f"tenure {name}" for name in subcommands} <= set(progs)
    assert {"tenure ingest run", "tenure ingest status", "tenure ingest reset"} <= set(progs)
    assert {
        f"tenure {each.prog.split()[-1]}" for each in conf()["_subcommands"](build_parser())
    } == {f"tenure {name}" for name in subcommands}
    from benchmarks import BENCHMARKS

    assert {f"tenure bench {name}" for name in BENCHMARKS} <= set(progs)
    for _, parser in commands:
        assert f"``{parser.prog}``\n" in page, parser.prog
        usage = parser.format_usage().split("\n")[0]
        assert usage.split("[")[0].strip() in page, parser.prog
        for action in parser._actions:
            for option in action.option_strings:
                assert f" {option}" in page, f"{parser.prog} {option}"
    assert "runs from a clone of tenure's repository only" in page
    widths = {len(line) for line in page.splitlines() if line.startswith("   ")}
    assert max(widths) <= 3 + conf()["CLI_WIDTH"]


def test_the_errors_page_draws_every_error_in_its_tree() -> None:
    tree = conf()["_errors_intro"]()
    for name in tenure.__all__:
        value = getattr(tenure, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert re.search(rf"[─ ]{name}\b", tree), f"{name} is not in the tree of errors"


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
