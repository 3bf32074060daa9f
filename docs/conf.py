"""Sphinx configuration: the guides in docs/*.md and an API reference from the docstrings.

Build it with ``scripts/build_docs.sh`` (warnings are errors). The reference
pages under ``docs/api/`` are written at every build (:func:`api_pages`), one
per task, in the order of :data:`PAGES`: every name in ``tenure.__all__`` goes
to its topic's page and section (:data:`TOPICS`, by the module that defines
it, or :data:`NAMED`), each public module to its page (:data:`MODULES`), and
the command line page is generated from the commands' argparse parsers
(:func:`cli_page`), so none of it can drift from the code. A public name
without a topic stops the build (and fails ``tests/test_docs.py``): give it
one here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import inspect
import logging
import os
import pkgutil
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

import tenure  # noqa: E402

project = "tenure"
author = "The tenure developers"
copyright = "The tenure developers"
release = tenure.__version__
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

# Every cross-reference must resolve (-n). There is no network at build time,
# so no intersphinx: names from other libraries are left as plain text.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(redis|sqlalchemy|numpy|pytest|_pytest|pyroaring|msgpack|zstandard)(\..*)?"),
    (r"py:.*", r"(asyncio|concurrent\.futures|threading|collections\.abc|types|socket)\..*"),
    (r"py:.*", r"(contextlib|enum|logging|random|re|pathlib|subprocess|argparse|json|os)\..*"),
    # private types in signatures (type variables, internal parts) with no public
    # name: shown by their short name, unlinked (a private path with a public name
    # is linked to it by _public_reference)
    (r"py:class", r"tenure\.(.*\.)?_.*"),
]

# The guides link to each other's headings (``guarantees.md#redlock-...``).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Defaults show their values (``herd_timeout: float = 60.0``), never the names
# of the constants that hold them: the objects used as defaults have a repr
# that reads as code (checked by _check_signature).
autodoc_preserve_defaults = False
# Types that Python expands in a signature (numpy's aliases), shown as written
# (autodoc_type_aliases would do it but renders them inside unions as
# ``TypeAliasForwardRef(...)``): see _check_signature.
TYPE_ALIASES = {
    # the type, as Python evaluates it: as the reference shows it
    "numpy.typing.ArrayLike": "~numpy.typing.ArrayLike",
    "numpy.typing.NDArray[numpy.uint32]": "~numpy.typing.NDArray[~numpy.uint32]",
}

html_theme = "furo"
html_title = f"tenure {release}"
html_static_path: list[str] = []


class Page(NamedTuple):
    """A reference page: its title, what it holds, and the guide sections it links."""

    title: str
    intro: str
    guides: tuple[str, ...]  # "locks.md", "locks.md#semaphores": docs/ pages and headings


PAGES: dict[str, Page] = {
    # page (docs/api/<page>.rst): in the order of the reference's table of contents
    "locks": Page(
        "Locks",
        "Mutual exclusion: the fair, fenced lock and its variants (re-entrant, "
        "acknowledged by replicas, over independent masters, bound to a connection), "
        "and keys whose writes are checked against fencing tokens.",
        ("locks.md", "guarantees.md#the-short-version-which-lock-to-choose"),
    ),
    "semaphores": Page(
        "Semaphores and read-write locks",
        "At most ``limit`` holders at once, and shared readers beside one exclusive "
        "writer; both run on the lock's machinery (queue, handoff, watchdog, fencing).",
        ("locks.md#semaphores", "locks.md#read-write-locks"),
    ),
    "caches": Page(
        "Caches",
        "Caches whose values are loaded once across every process, the ``@cached`` "
        "decorator, and how entries become bytes (serializers, compressors) and get "
        "their names.",
        ("caches.md",),
    ),
    "ingest": Page(
        "Ingestion and stream consumers",
        "A SQL table (or any source) fed into a Redis stream in chunks, every row once "
        "whatever dies; and the consumer groups that read such a stream.",
        ("ingest.md", "ingest.md#consumers"),
    ),
    "idsets": Page(
        "Id sets",
        "Compact sets of 32-bit ids stored on the server and intersected in memory "
        '(``pip install "tenure[idsets]"``: they need numpy and pyroaring).',
        ("idsets.md",),
    ),
    "testing": Page(
        "Servers and the pytest plugin",
        "Real Redis or Valkey servers (standalone, replicated, cluster, Sentinel) as "
        "context managers, a proxy that injects network faults, and the same as pytest "
        "fixtures.",
        ("testing.md",),
    ),
    "inspection": Page(
        "Inspection",
        "What ``tenure inspect`` prints, as a library: tenure's primitives on a server, "
        "who holds them and who waits.",
        ("inspect.md",),
    ),
    "observability": Page(
        "Metrics and traces",
        "What tenure reports through OpenTelemetry (the instruments are listed in the "
        "guide), and which primitives carry their name on their measurements.",
        ("observability.md",),
    ),
    "cli": Page(
        "The command line",
        "The ``tenure`` command (also ``python -m tenure``). Each section below is what "
        "the command's ``--help`` prints, generated from its argument parser at each "
        "build. ``--debug``, anywhere on a command line, adds the traceback to an error.",
        (
            "demo.md",
            "inspect.md",
            "ingest.md",
            "testing.md#a-server-to-try-things-on-tenure-server",
            "benchmarks.md",
        ),
    ),
    "errors": Page(
        "Errors",
        "",  # the tree from the docstring of tenure._core.exceptions, see _errors_intro
        ("guarantees.md#bad-input-system-by-system", "guarantees.md#faults-one-by-one"),
    ),
}

# A name of ``tenure`` goes to the page and section of the module that defines it,
# by the module's stem: ``tenure._sync._lock`` and ``tenure._async._lock`` are both
# ``lock``. Sections come in this order on their page; a page with one section
# (named "") has no headings. Errors (every exception) have their own page, and
# values (``__version__``) are on the reference's first page.
TOPICS: dict[str, tuple[str, str]] = {
    "lock": ("locks", "Lock and ReentrantLock"),
    "cluster_lock": ("locks", "ClusterLock: acknowledged by replicas"),
    "redlock": ("locks", "Redlock: over independent masters"),
    "connlock": ("locks", "ConnectionLock: owned by a connection"),
    "fence": ("locks", "FencedKey: writes checked against fencing tokens"),
    "semaphore": ("semaphores", "Semaphore"),
    "rwlock": ("semaphores", "ReadWriteLock"),
    "cache": ("caches", "Cache and HerdCache"),
    "cached": ("caches", "@cached"),
    "near": ("caches", "Near caching"),
    "codec": ("caches", "Serializers, compressors and entry names"),
    "ingest": ("ingest", "IngestJob"),
    "sources": ("ingest", "Sources"),
    "consumer": ("ingest", "StreamConsumer"),
    "stream": ("ingest", "StreamConsumer"),
    "idset": ("idsets", ""),
    "telemetry": ("observability", ""),
}
# Names placed one by one: their module (tenure._core.statistics) serves several topics.
NAMED: dict[str, tuple[str, str]] = {
    "LeasedStatistics": ("locks", "Statistics"),
    "LockStatistics": ("locks", "Statistics"),
    "ClusterLockStatistics": ("locks", "Statistics"),
    "RedlockStatistics": ("locks", "Statistics"),
    "SemaphoreStatistics": ("semaphores", "Statistics"),
    "ReadWriteStatistics": ("semaphores", "Statistics"),
}
# Public modules: (page, section, names first in this order; the rest after).
MODULES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "tenure.server": (
        "testing",
        "Servers: ``tenure.server``",
        ("Standalone", "Replicated", "Cluster", "Sentinel", "ServerProcess", "FaultProxy"),
    ),
    "tenure.testing": ("testing", "The pytest plugin: ``tenure.testing``", ()),
    "tenure.inspection": ("inspection", "", ("inspect", "render_table", "Primitive")),
}
# Values (not classes or functions) have no docstring of their own.
DATA_DOCS = {"__version__": "The installed release of tenure: a PEP 440 version string."}
PUBLIC_MODULES = ["tenure"] + [
    f"tenure.{each.name}" for each in pkgutil.iter_modules(tenure.__path__) if each.name[0] != "_"
]


class NoTopicError(LookupError):
    """A public name or module that no page of the reference is planned for."""


def public_names() -> list[str]:
    """``module.name`` for every name in each public module's ``__all__``."""
    return [
        f"{module}.{name}"
        for module in PUBLIC_MODULES
        for name in importlib.import_module(module).__all__
    ]


def _stem(value: Any) -> str:
    """``lock`` for ``tenure._sync._lock``, ``sources`` for ``tenure._core.sources``."""
    return str(getattr(value, "__module__", "")).rsplit(".", 1)[-1].strip("_")


def _is_error(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


def _is_value(value: Any) -> bool:
    return not isinstance(value, type) and not callable(value)


def placement(name: str) -> tuple[str, str]:
    """The page and section of ``tenure.<name>``; NoTopicError if it has none."""
    value = getattr(tenure, name)
    if _is_error(value):
        return "errors", ""
    if _is_value(value):
        return "index", ""
    if name in NAMED:
        return NAMED[name]
    stem = _stem(value)
    if stem in TOPICS:
        return TOPICS[stem]
    raise NoTopicError(
        f"tenure.{name} (defined in {value.__module__}) has no page in the API reference: "
        f"add its module's stem {stem!r} to TOPICS, or the name to NAMED, in docs/conf.py"
    )


def _line(value: Any) -> int:
    try:
        return inspect.getsourcelines(value)[1]
    except (OSError, TypeError):
        return 0


def _order(name: str) -> tuple[Any, ...]:
    """Within a section: by topic, the primitives first, each beside its asyncio twin.

    ``Lock``, ``AsyncLock``, ``ReentrantLock``, ``AsyncReentrantLock``: those the
    section's heading names, then the other primitives, then what the topic's
    module defines beside them, each in its module's order. Errors: as their tree.
    """
    section = placement(name)[1]  # NoTopicError first
    value = getattr(tenure, name)
    if _is_error(value):
        tree = [c.__name__ for c in reversed(value.__mro__) if issubclass(c, tenure.TenureError)]
        return (-1, tree)
    if _is_value(value):
        return (-2, name)
    topics = list(TOPICS)
    rank = (
        topics.index(_stem(value)) if name not in NAMED else len(topics) + list(NAMED).index(name)
    )
    twin = getattr(tenure, name.removeprefix("Async"), value) if name in tenure.__all__ else value
    primitive = str(getattr(twin, "__module__", "")).startswith(("tenure._sync", "tenure._cached"))
    named = name.removeprefix("Async") in re.findall(r"\w+", section)  # the section's own
    return (rank, not named, not primitive, _line(twin), name.startswith("Async"))


def _module_order(module: Any, name: str) -> tuple[Any, ...]:
    """In a public module: its fixtures first (in their order), then the names it lists."""
    value = getattr(module, name)
    first = MODULES[module.__name__][2]
    defined = _fixture_function(value)
    here = getattr(defined, "__module__", None) == module.__name__
    return (
        not _is_fixture(value),
        first.index(name) if name in first else len(first),
        _line(defined) if here else 0,
        module.__all__.index(name),
    )


def _underline(title: str, char: str) -> str:
    return f"{title}\n{char * len(title)}\n"


def _indent(text: str, by: str = "   ") -> str:
    return textwrap.indent(text, by, lambda line: bool(line.strip()))


# -- one entry ------------------------------------------------------------------------------


def _is_fixture(value: Any) -> bool:
    return type(value).__name__ == "FixtureFunctionDefinition" or hasattr(
        value, "_pytestfixturefunction"
    )


def _fixture_function(value: Any) -> Any:
    """The function a pytest fixture wraps (``value`` itself for anything else)."""
    unwrap = getattr(value, "_get_wrapped_function", None)
    return unwrap() if callable(unwrap) else getattr(value, "__wrapped__", value)


_YIELDS = re.compile(r"^(?:Async)?(?:Iterator|Iterable)\[(.*)\]$")


@functools.cache
def _public_objects() -> dict[int, tuple[Any, str]]:
    """Every public object by its id, with where it is public."""
    found: dict[int, tuple[Any, str]] = {}
    for public in reversed(public_names()):  # the first place wins: tenure's own
        module, _, name = public.rpartition(".")
        value = getattr(importlib.import_module(module), name)
        found[id(value)] = (value, public)
    return found


def _public_path(value: Any) -> str | None:
    """Where ``value`` is public (``tenure.server.ServerProcess``), or None."""
    known, public = _public_objects().get(id(value), (None, None))
    return public if known is value else None


def _fixture(module: str, name: str, value: Any) -> str:
    """A fixture as what a test receives: its type, scope, the fixtures it asks for."""
    function = _fixture_function(value)
    annotation = str(function.__annotations__.get("return", ""))
    yields = _YIELDS.sub(r"\1", annotation)
    namespace = vars(importlib.import_module(module))

    def public(match: re.Match[str]) -> str:
        found = namespace.get(match.group(0))
        return (_public_path(found) if found is not None else None) or match.group(0)

    yields = re.sub(r"\b(?<!\.)[A-Z]\w*\b", public, yields)
    marker = getattr(value, "_fixture_function_marker", None)
    scope = getattr(marker, "scope", "function")
    asks = [f"``{each}``" for each in inspect.signature(function).parameters if each != "request"]
    uses = f"; requests {', '.join(asks)}" if asks else ""
    kind = "An async fixture" if inspect.isasyncgenfunction(function) else "A fixture"
    doc = inspect.getdoc(function) or ""
    lines = [f".. py:data:: {name}", f"   :module: {module}"]
    if yields:
        lines.append(f"   :type: {yields}")
    return "\n".join(lines) + f"\n\n   {kind}, {scope} scope{uses}.\n\n{_indent(doc)}\n"


def _directive(module: str, name: str, value: Any) -> str:
    target = f"{module}.{name}"
    if _is_error(value):
        return f".. autoexception:: {target}\n   :members:\n   :show-inheritance:\n"
    if _is_fixture(value):
        return _fixture(module, name, value)
    if isinstance(value, type) and getattr(value, "_is_protocol", False):
        # a type to annotate with (a fixture's factory): what calling one does
        return f".. autoclass:: {target}()\n   :members:\n   :special-members: __call__\n"
    if isinstance(value, type):
        bases = [b for b in value.__bases__ if b is not object]
        shown = bases and all(_public_path(b) for b in bases)
        inheritance = "   :show-inheritance:\n" if shown else ""
        return f".. autoclass:: {target}\n   :members:\n   :inherited-members:\n{inheritance}"
    if callable(value):
        return f".. autofunction:: {target}\n"
    doc = DATA_DOCS.get(name, "")
    return f".. py:data:: {name}\n   :module: {module}\n   :value: {value!r}\n\n   {doc}\n"


# -- the pages --------------------------------------------------------------------------------


def _guide_title(path: Path) -> str:
    """A guide's short title: ``Locks`` for "# Locks: `Lock`, `ReentrantLock`, ..."."""
    first = path.read_text(encoding="utf-8").split("\n", 1)[0]
    return first.removeprefix("# ").split(": ", 1)[0].replace("`", "")


def _guides(page: str) -> str:
    """The page's links to its guides, and to their sections (those present in docs/)."""
    links = []
    for guide in PAGES[page].guides:
        path = HERE / guide.partition("#")[0]
        if path.exists():  # a section's link shows the section's title
            links.append(
                f":guide:`{guide}`" if "#" in guide else f":guide:`{_guide_title(path)} <{guide}>`"
            )
    if not links:
        return ""
    return f"In the guides: {'; '.join(links)}.\n"


def _head(page: str) -> list[str]:
    title, intro, _ = PAGES[page]
    return [_underline(title, "="), *([intro + "\n"] if intro else []), _guides(page)]


def _errors_intro() -> str:
    """The tree of errors, as the docstring of ``tenure._core.exceptions`` draws it."""
    return inspect.getdoc(importlib.import_module("tenure._core.exceptions")) or ""


def _sections(page: str, entries: dict[tuple[str, str], list[str]]) -> list[str]:
    """The page's sections with entries, in their order (errors: the page's one)."""
    found = [section for each, section in [*TOPICS.values(), *NAMED.values()] if each == page]
    found += [section for each, section, _ in MODULES.values() if each == page]
    found += [section for each, section in entries if each == page]
    return [section for section in dict.fromkeys(found) if (page, section) in entries]


def api_pages() -> dict[str, str]:
    """Every reference page's reStructuredText, keyed by its path under docs/api/.

    Every name in each public module's ``__all__`` is on exactly one page;
    NoTopicError if one has no page planned.
    """
    entries: dict[tuple[str, str], list[str]] = {}
    for name in sorted(tenure.__all__, key=_order):
        entries.setdefault(placement(name), []).append(
            _directive("tenure", name, getattr(tenure, name))
        )
    for module_name in PUBLIC_MODULES[1:]:
        if module_name not in MODULES:
            raise NoTopicError(f"{module_name} has no page in the API reference: add it to MODULES")
        module = importlib.import_module(module_name)
        page, section, _ = MODULES[module_name]
        body = entries.setdefault((page, section), [])
        body.append(f".. automodule:: {module_name}\n")
        for name in sorted(module.__all__, key=lambda name: _module_order(module, name)):
            body.append(_directive(module_name, name, getattr(module, name)))
    pages: dict[str, str] = {}
    for page in PAGES:
        body = _head(page)
        body.insert(1, ".. currentmodule:: tenure\n")
        if page == "errors":
            body.append(_errors_intro() + "\n")
        if page == "cli":
            body.append(cli_page())
        for section in _sections(page, entries):
            if section:
                body.append(_underline(section, "-"))
            body.extend(entries.pop((page, section)))
        pages[f"{page}.rst"] = "\n".join(body)
    index = [
        _underline("API reference", "="),
        ".. automodule:: tenure\n",
        "Everything public is importable from ``tenure`` itself (``tenure.__all__``),",
        "by task on the pages below; the servers, the pytest plugin and the inspection",
        "of a server have modules of their own.\n",
        ".. toctree::\n   :maxdepth: 2\n\n" + "".join(f"   {page}\n" for page in PAGES),
        *entries.pop(("index", ""), []),
    ]
    pages["index.rst"] = "\n".join(index)
    assert not entries, f"entries without a page: {sorted(entries)}"
    return pages


# -- the command line page ------------------------------------------------------------------

CLI_WIDTH = 88
"""Columns of the ``--help`` texts on the page, whatever the terminal that builds it."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def _fixed_terminal() -> Iterator[None]:
    """A fixed width for argparse's help (from COLUMNS), and no colours (Python 3.14 has them)."""
    saved = {name: os.environ.get(name) for name in ("COLUMNS", "NO_COLOR", "FORCE_COLOR")}
    os.environ.update(COLUMNS=str(CLI_WIDTH), NO_COLOR="1")
    os.environ.pop("FORCE_COLOR", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.values())
    return found


def commands() -> list[tuple[int, argparse.ArgumentParser]]:
    """Every (sub)command of ``tenure``, with its depth; ``tenure bench`` from the clone's.

    ``tenure bench`` hands its arguments to the repository's ``benchmarks``
    package (not installed with tenure), whose parser has a subcommand per benchmark.
    """
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # the clone's top-level benchmarks/ package
    from benchmarks.command import build_parser as bench_parser
    from tenure._tools.cli import build_parser

    def walk(parser: argparse.ArgumentParser, depth: int) -> Iterator[tuple[int, Any]]:
        yield depth, parser
        for sub in _subcommands(parser):
            if sub.prog == "tenure bench":
                continue  # placed last, from the benchmarks' own parser
            yield from walk(sub, depth + 1)

    with _fixed_terminal():
        return [*walk(build_parser(), 0), *walk(bench_parser(), 1)]


def _help(parser: argparse.ArgumentParser) -> str:
    with _fixed_terminal():
        return _ANSI.sub("", parser.format_help()).rstrip()


BENCH_NOTE = (
    "``tenure bench`` runs from a clone of tenure's repository only: the benchmarks are "
    "the repository's top-level ``benchmarks/`` package, which the installed package does "
    'not contain (``pip install -e ".[bench]"`` in the clone installs the peers they '
    "compare with). ``python -m benchmarks NAME`` is the same as ``tenure bench NAME``. "
    "Each benchmark is a subcommand.\n"
)


def cli_page() -> str:
    """Every command's ``--help``, under a heading per command."""
    body = []
    for depth, parser in commands():
        body.append(_underline(f"``{parser.prog}``", "-" if depth <= 1 else "~"))
        if parser.prog == "tenure bench":
            body.append(BENCH_NOTE)
        body.append(f".. code-block:: text\n\n{_indent(_help(parser))}\n")
    return "\n".join(body)


# -- build hooks ------------------------------------------------------------------------------


def _write_api_pages(app: Any) -> None:
    folder = HERE / "api"
    folder.mkdir(exist_ok=True)
    pages = api_pages()
    for stale in folder.glob("*.rst"):
        if stale.name not in pages:
            stale.unlink()
    for name, text in pages.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:  # unchanged pages stay unread
            path.write_text(text)


def _check_every_name_documented(app: Any, env: Any) -> None:
    from sphinx.util import logging as sphinx_logging

    documented = env.get_domain("py").objects
    for name in public_names():
        if name not in documented:
            sphinx_logging.getLogger(__name__).warning(
                "public name %s is not in the API reference", name
            )


def unreadable_defaults(obj: Any) -> list[str]:
    """``name=repr`` of each default of ``obj``'s signature whose repr is no value to read.

    A repr is readable unless it names a private module (``tenure._core...``),
    shows an address (``<... object at 0x...>``) or a class or function. A
    sentinel reads as a phrase in angle brackets: ``<a new token per acquisition>``.
    """
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return []
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    wrong = []
    for each in parameters:
        if each.default is inspect.Parameter.empty or each.name in fields:
            continue
        shown = repr(each.default)
        if (
            "tenure._" in shown
            or " at 0x" in shown
            or (shown.startswith("<") and not re.fullmatch(r"<[a-z]+ [^<>]+>", shown))
            or re.match(r"<(class|function|bound|module|built-in|method) ", shown)
        ):
            wrong.append(f"{each.name}={shown}")
    return wrong


@functools.cache
def _aliases() -> dict[str, str]:
    """Each of :data:`TYPE_ALIASES` as a signature spells it out, and as it is shown."""
    from sphinx.util.typing import stringify_annotation

    try:
        import numpy.typing
    except ImportError:  # not installed: no signature uses them
        return {}
    namespace = {"numpy": numpy}
    return {
        stringify_annotation(eval(spelled, namespace), "smart"): shown
        for spelled, shown in TYPE_ALIASES.items()
    }


def _check_signature(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None, annotation: Any
) -> tuple[str | None, Any] | None:
    """Make a signature readable; warn (so fail the build) where it is not.

    A dataclass field's ``= <factory>`` becomes ``= list()``, a large integer
    gets its digits grouped (``100_000``), a method that returns its own
    object (``start(self: _L) -> _L``) returns the class it is documented on.
    """
    from sphinx.util import logging as sphinx_logging

    if signature is None:
        return None
    if dataclasses.is_dataclass(obj):
        for each in dataclasses.fields(obj):
            if each.default_factory is not dataclasses.MISSING:
                factory = getattr(each.default_factory, "__name__", "factory")
                signature = signature.replace("= <factory>", f"= {factory}()", 1)
    signature = re.sub(r"(?<== )(\d{5,})(?=[,)])", lambda m: f"{int(m.group(1)):_}", signature)
    for expanded, alias in _aliases().items():
        signature = signature.replace(expanded, alias)
        if isinstance(annotation, str):
            annotation = annotation.replace(expanded, alias)
    hints = getattr(obj, "__annotations__", {})
    if what == "method" and "self" in hints and hints.get("self") == hints.get("return"):
        annotation = "~" + name.rsplit(".", 1)[0]
    for wrong in unreadable_defaults(obj):
        sphinx_logging.getLogger(__name__).warning(
            "%s: the default %s does not read as a value: give it a repr", name, wrong
        )
    return signature, annotation


def public_target(target: str) -> str | None:
    """``tenure.Y.x`` for ``tenure._core.y.Y.x``: a private path's public name, if it has one."""
    if not target.startswith("tenure.") or "._" not in target:
        return None
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        value = getattr(module, parts[split], None)
        public = _public_path(value) if value is not None else None
        return None if public is None else ".".join([public, *parts[split + 1 :]])
    return None


def _public_reference(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A reference to a private path of a public object (``tenure._core.x.Y``) links ``tenure.Y``.

    Type hints name the module that defines a class; the reference documents
    it where it is public.
    """
    target = public_target(str(node.get("reftarget", "")))
    if node.get("refdomain") != "py" or target is None:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], target, node, contnode
    )


def _public_titles(app: Any, doctree: Any, docname: str) -> None:
    """A link's tooltip names the public path, not the defining module's.

    autodoc registers each class under the path that defines it too
    (``:canonical:``), so a type hint links by that path and shows it on hover.
    """
    from docutils import nodes

    for reference in doctree.findall(nodes.reference):
        title = public_target(str(reference.get("reftitle", "")))
        if title is not None:
            reference["reftitle"] = title


def _guide_role(
    name: str,
    rawtext: str,
    text: str,
    lineno: int,
    inliner: Any,
    options: Any = None,
    content: Any = None,
) -> tuple[list[Any], list[Any]]:
    """``:guide:`locks.md#semaphores```: a link to a guide's section, checked as MyST's are.

    ``:guide:`Locks <locks.md>``` shows its own text; without one, the link shows
    the title of the section (or page) it points to.
    """
    from docutils import nodes
    from sphinx import addnodes
    from sphinx.util.nodes import split_explicit_title

    explicit, title, target = split_explicit_title(text)
    path, _, slug = target.partition("#")
    node = addnodes.pending_xref(
        rawtext,
        refdomain="doc",
        reftype="myst",
        reftarget=path.removesuffix(".md"),
        reftargetid=slug or None,
        refexplicit=explicit,
        refdoc=inliner.document.settings.env.docname,
    )
    node += nodes.inline(title, title)
    return [node], []


class _ShortMystConfig(logging.Filter):
    """MyST's line at the start of a build: its version, not every setting it has."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and "MdParserConfig" in type(record.args[-1]).__name__:
            record.args = (*record.args[:-1], "configured in docs/conf.py")
        return True


def setup(app: Any) -> dict[str, Any]:
    """Generate the reference pages before reading; check every public name after."""
    connect: Callable[[str, Callable[..., Any]], int] = app.connect
    connect("builder-inited", _write_api_pages)
    connect("env-check-consistency", _check_every_name_documented)
    connect("autodoc-process-signature", _check_signature)
    connect("missing-reference", _public_reference)
    connect("doctree-resolved", _public_titles)
    app.add_role("guide", _guide_role)
    logging.getLogger("sphinx.myst_parser.sphinx_ext.main").addFilter(_ShortMystConfig())
    return {"parallel_read_safe": True}
