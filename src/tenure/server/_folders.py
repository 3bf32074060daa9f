"""Private server folders, and sweeping up those a killed owner left behind.

A server's folder is removed when its owner stops it, or at the owner's exit.
An owner killed with ``kill -9`` runs neither: its servers die with it (by
their death signal), but their folders stay. So every folder carries a marker
naming its owner's process and its server's; the next folder made (and the
end of a pytest session) removes every marked folder whose processes are all
gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

__all__ = ["make_folder", "note_server", "sweep_stale_folders"]

MARKER = ".tenure-owner"
"""The file in a folder that names the processes using it, one pid a line."""

PREFIX = "tenure-"


def make_folder(kind: str) -> str:
    """A new private folder ``tenure-<kind>-*``, marked as this process's."""
    sweep_stale_folders()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-")
    with open(os.path.join(path, MARKER), "w", encoding="utf-8") as marker:
        marker.write(f"{os.getpid()}\n")
    return path


def note_server(path: str, pid: int) -> None:
    """Record that server ``pid`` uses the folder (it may outlive its owner briefly)."""
    with (
        contextlib.suppress(OSError),
        open(os.path.join(path, MARKER), "a", encoding="utf-8") as marker,
    ):
        marker.write(f"{pid}\n")


def sweep_stale_folders(directory: str | None = None) -> int:
    """Remove the marked folders whose processes are all gone; return how many.

    Only folders made for tenure's servers (they carry the marker) are
    touched, in ``directory`` (default: the temporary directory).
    """
    where = directory or tempfile.gettempdir()
    removed = 0
    try:
        entries = list(os.scandir(where))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        pids = _pids(os.path.join(entry.path, MARKER))
        if pids and not any(_alive(pid) for pid in pids):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def _pids(marker: str) -> list[int]:
    try:
        with open(marker, encoding="utf-8") as file:
            return [int(line) for line in file.read().split() if line.isdigit()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
