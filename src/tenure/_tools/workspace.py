"""A command's own temporary folder, removed when the command ends, however it ends.

``tenure demo``, ``tenure bench`` and ``tenure server`` make files: a
server's folder (data, logs, socket), the demo's SQLite table, a benchmark's
database. Each runs inside :func:`command_folder`: a folder
``tenure-<command>-*`` in the temporary directory becomes the temporary
directory of the command and of every process it starts (``TMPDIR``), so
everything they make lands in it. The command removes it on its way out
(an error, Ctrl-C, SIGTERM), and a *janitor* process removes it when the
command is killed outright (``kill -9``, the OOM killer): the janitor holds
the read end of a pipe whose write end only the command and its children
hold, so it wakes when the last of them is gone, removes the folder, and
removes the port reservations they left (:func:`tenure._tooling.sweep_ports`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from tenure._tooling import PORTS_FOLDER_VARIABLE, ports_folder
from tenure._tools import janitor as janitor_script

__all__ = ["command_folder"]


@contextlib.contextmanager
def command_folder(command: str) -> Iterator[str]:
    """Run the block with a temporary folder of its own; the folder goes at the end.

    Port reservations stay shared with every other tenure process (their
    folder is set in the environment before the temporary directory moves).
    """
    saved = {name: os.environ.get(name) for name in ("TMPDIR", PORTS_FOLDER_VARIABLE)}
    saved_tempdir = tempfile.tempdir
    os.environ[PORTS_FOLDER_VARIABLE] = ports_folder()
    folder = tempfile.mkdtemp(prefix=f"tenure-{command}-")
    janitor = _start_janitor(folder)
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder
    try:
        yield folder
    finally:
        tempfile.tempdir = saved_tempdir
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(folder, ignore_errors=True)
        if janitor is not None:
            _dismiss(janitor)


def _dismiss(janitor: subprocess.Popen[bytes]) -> None:
    """Close the janitor's pipe (it finds the folder gone and ends) and reap it."""
    if janitor.stdin is not None:
        with contextlib.suppress(OSError):
            janitor.stdin.close()
    try:
        janitor.wait(timeout=10)
    except subprocess.TimeoutExpired:  # (it would end by itself: never left waiting)
        janitor.kill()
        janitor.wait()


def _start_janitor(folder: str) -> subprocess.Popen[bytes] | None:
    """The process that removes ``folder`` once this one is gone (None: could not start)."""
    try:
        janitor = subprocess.Popen(
            [sys.executable, janitor_script.__file__, folder],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the terminal's group: Ctrl-C is not for it
        )
    except OSError:
        return None
    assert janitor.stdin is not None
    # The write end stays open in this process and in the helpers it forks (the read
    # end's EOF means every one of them is gone), never in those it execs.
    os.set_inheritable(janitor.stdin.fileno(), False)
    return janitor
