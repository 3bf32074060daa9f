"""The helper-process guard of tenure's tools: a Ctrl-C while helpers start waits for them."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from tenure._tools.children import sigint_blocked

pytestmark = pytest.mark.engine_blind


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """Python's own SIGINT handler, as in a terminal (a shell's background job ignores it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_where_sigint_is_ignored_it_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with sigint_blocked():
        os.kill(os.getpid(), signal.SIGINT)  # blocked here: pending until the block ends
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_ctrl_c_during_the_block_is_raised_when_it_ends() -> None:
    # A thread started before the block does not block SIGINT (a thread inherits
    # the mask of the one that starts it): the kernel delivers the signal there,
    # and Python would raise it in the main thread, inside the block.
    go = threading.Event()

    def send() -> None:
        go.wait(10)
        # To this thread, which does not block it: a Ctrl-C sent to the process may
        # go to any such thread, and one that only runs later (a daemon thread left
        # by an earlier test, on a busy machine) would take it after the block.
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    sender = threading.Thread(target=send)
    sender.start()
    inside = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_blocked():
            go.set()
            sender.join()
            for _ in range(1000):  # bytecode boundaries, where Python runs handlers
                inside.append(1)
        pytest.fail("the Ctrl-C was lost")
    assert len(inside) == 1000, "raised inside the block"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_the_block_changes_nothing() -> None:
    with sigint_blocked():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
