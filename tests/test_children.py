"""The helper-process guard of tenure's tools: a Ctrl-C while helpers start waits for them."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tenure._tools.children import sigint_blocked

pytestmark = pytest.mark.engine_blind


def test_a_ctrl_c_during_the_block_is_raised_when_it_ends() -> None:
    # A thread started before the block does not block SIGINT (a thread inherits
    # the mask of the one that starts it): the kernel delivers the signal there,
    # and Python would raise it in the main thread, inside the block.
    go = threading.Event()

    def send() -> None:
        go.wait(10)
        os.kill(os.getpid(), signal.SIGINT)

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
