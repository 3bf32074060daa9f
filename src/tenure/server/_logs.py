"""What a server wrote: its log and console output files, and their last lines.

A server's folder holds ``server.log`` (the server's ``--logfile``) and
``server.out`` (its console output). Both are appended to across restarts, so
:func:`log_offsets` notes their sizes when a run begins and :func:`log_tail`
reads only what that run wrote.
"""

from __future__ import annotations

import os

__all__ = ["LOG_NAME", "OUT_NAME", "TAIL_LINES", "log_offsets", "notable", "tail_since"]

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


# Warnings every server prints on a stock Linux machine: never the reason it failed.
_ROUTINE = ("Memory overcommit", "Transparent Huge Pages", "somaxconn", "WARNING supervised")


def notable(tail: str) -> str:
    """The lines of ``tail`` that say why a server failed, on one line.

    Redis and Valkey mark warnings with ``#`` after the timestamp; the routine
    ones about the machine's settings are left out. Without any warning, the
    last line is kept.
    """
    said = []
    for line in tail.splitlines():
        head, mark, message = line.partition(" # ")
        if mark and head[:1].isdigit() and not any(word in message for word in _ROUTINE):
            said.append(message.strip())
    if not said:
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        said = lines[-1:]
    return "; ".join(said) or "(nothing in its log)"


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
