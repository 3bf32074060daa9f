"""Forking server children that die with this process: the death signal and the spawner.

On Linux each child gets ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel
kills it when the parent dies, even by ``kill -9``. The kernel sends that
signal when the *thread* that forked the child exits, so every fork happens on
one long-lived daemon "spawner" thread: starting a server from a short-lived
thread (a thread pool, ``asyncio.to_thread``) is still safe. Children run in
their own session (``start_new_session=True``), out of reach of the
terminal's Ctrl-C.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from queue import SimpleQueue
from typing import IO, cast

__all__ = ["PRCTL", "PR_SET_PDEATHSIG", "spawn"]

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return cast("Callable[..., int]", prctl)


PRCTL = _load_prctl()
_SIGKILL = int(signal.SIGKILL)


def _make_preexec(parent_pid: int) -> Callable[[], None] | None:
    prctl = PRCTL
    if prctl is None:
        return None

    def preexec() -> None:  # runs in the child between fork and exec: keep it tiny
        prctl(PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """One long-lived daemon thread that forks every server.

    ``PR_SET_PDEATHSIG`` fires when the forking *thread* exits, so forking from
    a thread that lives as long as the process makes it fire only when the
    process dies.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, job: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="tenure-server-spawner", daemon=True
                )
                self._thread.start()
            thread = self._thread
        if threading.current_thread() is thread:
            return job()
        future: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((job, future))
        return future.result()

    def _loop(self) -> None:
        while True:
            job, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:
                future.set_exception(exc)


_SPAWNER = _Spawner()


def _after_fork_in_child() -> None:
    # A forked child starts with no spawner thread: make a new one on first use.
    global _SPAWNER
    _SPAWNER = _Spawner()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def spawn(
    args: Sequence[str],
    *,
    stdout: IO[bytes],
    cwd: str,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``args`` in ``cwd`` as a child that dies with this process.

    ``env`` adds to (or overrides) this process's environment for the child.

    The child is forked on the spawner thread, in its own session, with the
    death signal set (Linux); its stdin is ``/dev/null``, its stdout and
    stderr go to ``stdout``. Raises :class:`OSError` if it cannot run.
    """
    preexec = _make_preexec(os.getpid())

    def job() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
            preexec_fn=preexec,
            close_fds=True,
        )

    return _SPAWNER.run(job)
