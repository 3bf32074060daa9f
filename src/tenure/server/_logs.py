"""What a server wrote: its log and console output files, and their last lines.

A server's folder holds ``server.log`` (the server's ``--logfile``) and
``server.out`` (its console output). Both are appended to across restarts, so
:func:`log_offsets` notes their sizes when a run begins and :func:`log_tail`
reads only what that run wrote.
"""

from __future__ import annotations

import os

__all__ = ["LOG_NAME", "OUT_NAME", "TAIL_LINES", "log_offsets", "tail_since"]

LOG_NAME = "server.log"
OUT_NAME = "server.out"
TAIL_LINES = 25


def _tail(path: str, offset: int, lines: int) -> str:
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip()
    return "\n".join(text.splitlines()[-lines:])


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def log_offsets(directory: str) -> tuple[int, int]:
    """The sizes of the console output and the log in ``directory`` (0 if missing)."""
    return (_size(os.path.join(directory, OUT_NAME)), _size(os.path.join(directory, LOG_NAME)))


def tail_since(directory: str, offsets: tuple[int, int], lines: int) -> str:
    """The last ``lines`` lines written after ``offsets``: console output, then log."""
    out = _tail(os.path.join(directory, OUT_NAME), offsets[0], lines)
    log = _tail(os.path.join(directory, LOG_NAME), offsets[1], lines)
    return "\n".join(part for part in (out, log) if part) or "(empty log)"
