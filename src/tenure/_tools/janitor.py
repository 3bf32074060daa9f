"""The janitor of a command's folder: removes it once the command is gone.

Started by :func:`tenure._tools.workspace.command_folder` as a script
(``python .../janitor.py FOLDER``, standard library only until it acts, so
it costs a bare interpreter while it waits). It waits for the end of its
standard input: the command and every helper that shares the pipe have
ended, whether they exited or were killed. Then it removes ``FOLDER``
(retrying while a server killed with its owner is still exiting) and the
port reservations that killed processes left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

__all__ = ["main"]


def main(folder: str) -> None:
    """Wait for the command's end, then remove ``folder`` and sweep the ports."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # (a closed terminal ends the command)
    while sys.stdin.buffer.read(4096):
        pass
    if not os.path.lexists(folder):
        return  # the command removed it itself, and released its own ports
    deadline = time.monotonic() + 10
    while True:
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.lexists(folder) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run as a script: its folder is no place to import from
    from tenure._tooling import sweep_ports

    sweep_ports()


if __name__ == "__main__":
    main(sys.argv[1])
