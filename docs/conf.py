"""Sphinx configuration: the guides in docs/*.md and an API reference from the docstrings.

Build it with ``scripts/build_docs.sh`` (warnings are errors). The reference
pages under ``docs/api/`` are generated at every build from the modules'
``__all__`` (:func:`api_pages`), so a new public name appears without an edit
here; a name whose defining module has no topic in :data:`TOPICS` lands on
the "Other names" page until it is given one.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

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
    # private types in signatures (type variables, protocols of the internals)
    (r"py:class", r"tenure\.(.*\.)?_.*"),
]

# The guides link to each other's headings (``guarantees.md#redlock-...``).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = f"tenure {release}"
html_static_path: list[str] = []

# Public modules and their reference pages. ``tenure`` is split by topic: a
# name's topic is the stem of the module that defines it (``tenure._sync._lock``
# and ``tenure._async._lock`` are both ``lock``); errors have their own page.
MODULES = ["tenure"] + [
    f"tenure.{each.name}" for each in pkgutil.iter_modules(tenure.__path__) if each.name[0] != "_"
]
TOPICS: dict[str, tuple[str, str]] = {
    # stem: (page, title)
    "lock": ("locks", "Locks, semaphores and fenced keys"),
    "cluster_lock": ("locks", ""),
    "redlock": ("locks", ""),
    "connlock": ("locks", ""),
    "fence": ("locks", ""),
    "semaphore": ("locks", ""),
    "rwlock": ("locks", ""),
    "leased": ("locks", ""),
    "cache": ("caches", "Caches"),
    "cache_codec": ("caches", ""),
    "cached": ("caches", ""),
    "ingest": ("ingest", "Chunked ingestion"),
    "ingest_sources": ("ingest", ""),
    "consumer": ("streams", "Stream consumers"),
    "stream": ("streams", ""),
    "idset": ("idsets", "Id sets"),
    "exceptions": ("errors", "Errors"),
}
PAGE_ORDER = ["index", "locks", "caches", "ingest", "streams", "idsets", "errors", "other"]
# Values (not classes or functions) have no docstring of their own.
DATA_DOCS = {"__version__": "The installed release of tenure: a PEP 440 version string."}
GUIDES = {
    "locks": "../locks.md",
    "caches": "../caches.md",
    "ingest": "../ingest.md",
    "idsets": "../idsets.md",
    "errors": "",
}
MODULE_TITLES = {
    "tenure.server": "Servers for tests and demos: ``tenure.server``",
    "tenure.testing": "The pytest plugin: ``tenure.testing``",
    "tenure.inspection": "``tenure inspect`` as a library: ``tenure.inspection``",
    "tenure._tools.cli": "The ``tenure`` command: ``tenure._tools.cli``",
}


def _topic(name: str, value: Any) -> str:
    if isinstance(value, type) and issubclass(value, BaseException):
        return "errors"
    if not isinstance(value, type) and not callable(value):
        return "index"  # a value, such as __version__: on the reference's first page
    return TOPICS.get(_stem(value), ("other", ""))[0]


def _stem(value: Any) -> str:
    """``lock`` for ``tenure._sync._lock``, ``leased`` for ``tenure._core.leased``."""
    return str(getattr(value, "__module__", "")).rsplit(".", 1)[-1].strip("_").removesuffix("_core")


def _title(page: str) -> str:
    for topic_page, title in TOPICS.values():
        if topic_page == page and title:
            return title
    return "Other names"


def _directive(module: str, name: str, value: Any) -> str:
    target = f"{module}.{name}"
    if isinstance(value, type) and issubclass(value, BaseException):
        return f".. autoexception:: {target}\n   :members:\n   :show-inheritance:\n"
    if isinstance(value, type):
        return f".. autoclass:: {target}\n   :members:\n   :inherited-members:\n"
    if type(value).__name__ == "FixtureFunctionDefinition":  # a pytest fixture
        return f".. autofunction:: {target}\n"
    if callable(value):
        return f".. autofunction:: {target}\n"
    doc = DATA_DOCS.get(name, "")
    return f".. py:data:: {name}\n   :module: {module}\n   :value: {value!r}\n\n   {doc}\n"


def _order(name: str) -> tuple[Any, ...]:
    """A page's order: errors as their tree, the rest by topic, each next to its asyncio twin.

    ``Lock``, ``AsyncLock``, ``ReentrantLock``, ``AsyncReentrantLock``, then
    ``ClusterLock``...: the order of the defining modules in :data:`TOPICS`.
    """
    value = getattr(tenure, name)
    if isinstance(value, type) and issubclass(value, BaseException):
        tree = [c.__name__ for c in reversed(value.__mro__) if issubclass(c, tenure.TenureError)]
        return (-1, tree)
    topics = list(TOPICS)
    stem = _stem(value)
    topic = topics.index(stem) if stem in topics else len(topics)
    return (topic, name.removeprefix("Async"), name.startswith("Async"))


def _underline(title: str, char: str) -> str:
    return f"{title}\n{char * len(title)}\n"


def api_pages() -> dict[str, str]:
    """Every reference page's reStructuredText, keyed by its path under docs/api/.

    Every name in each public module's ``__all__`` is on exactly one page.
    """
    pages: dict[str, str] = {}
    by_page: dict[str, list[str]] = {}
    for name in sorted(tenure.__all__, key=_order):
        by_page.setdefault(_topic(name, getattr(tenure, name)), []).append(name)
    toc = []
    values = by_page.pop("index", [])
    for page in sorted(by_page, key=PAGE_ORDER.index):
        title = _title(page)
        guide = GUIDES.get(page)
        body = [_underline(title, "="), ".. currentmodule:: tenure\n"]
        if guide:
            body.append(f"How these work and how to choose: :doc:`{guide[:-3]}`.\n")
        for name in by_page[page]:
            body.append(_directive("tenure", name, getattr(tenure, name)))
        pages[f"tenure-{page}.rst"] = "\n".join(body)
        toc.append(f"tenure-{page}")
    for module_name in sorted(MODULES[1:], key=[*MODULE_TITLES, *MODULES].index):
        title = MODULE_TITLES.get(module_name, f"``{module_name}``")
        module = importlib.import_module(module_name)
        body = [_underline(title, "="), f".. automodule:: {module_name}\n"]
        for name in module.__all__:
            body.append(_directive(module_name, name, getattr(module, name)))
        pages[f"{module_name}.rst"] = "\n".join(body)
        toc.append(module_name)
    index = [
        _underline("API reference", "="),
        ".. automodule:: tenure\n",
        "Everything public is importable from ``tenure`` itself (``tenure.__all__``);",
        "the servers, the pytest plugin, ``tenure inspect`` and the command have",
        "modules of their own.\n",
        ".. toctree::\n   :maxdepth: 2\n\n" + "".join(f"   {page}\n" for page in toc),
        *(_directive("tenure", name, getattr(tenure, name)) for name in values),
    ]
    pages["index.rst"] = "\n".join(index)
    return pages


def public_names() -> list[str]:
    """``module.name`` for every name in each public module's ``__all__``."""
    return [
        f"{module}.{name}" for module in MODULES for name in importlib.import_module(module).__all__
    ]


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
    from sphinx.util import logging

    documented = env.get_domain("py").objects
    for name in public_names():
        if name not in documented:
            logging.getLogger(__name__).warning("public name %s is not in the API reference", name)


def _factory_defaults(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None, annotation: Any
) -> tuple[str | None, Any] | None:
    """A dataclass field's ``= <factory>`` (not Python, so unparsed) shown as ``= list()``."""
    if signature is None or not dataclasses.is_dataclass(obj):
        return None
    for each in dataclasses.fields(obj):
        if each.default_factory is not dataclasses.MISSING:
            factory = getattr(each.default_factory, "__name__", "factory")
            signature = signature.replace("= <factory>", f"= {factory}()", 1)
    return signature, annotation


def setup(app: Any) -> dict[str, Any]:
    """Generate the reference pages before reading; check every public name after."""
    connect: Callable[[str, Callable[..., None]], int] = app.connect
    connect("builder-inited", _write_api_pages)
    connect("env-check-consistency", _check_every_name_documented)
    connect("autodoc-process-signature", _factory_defaults)
    return {"parallel_read_safe": True}
