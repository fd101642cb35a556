"""SignalFlag: Ctrl-C and SIGTERM as a flag the caller polls, and nested flags (a run inside a suite)."""

from __future__ import annotations

import os
import signal

from kit.run.logs import SignalFlag


def test_a_signal_inside_a_nested_flag_reaches_the_outer_one_too():
    # the suite's flag around a run's: a SIGTERM while the run seals must stop the suite as well
    with SignalFlag() as suite:
        with SignalFlag() as run:
            os.kill(os.getpid(), signal.SIGTERM)
        assert run.received == signal.SIGTERM
        assert suite.received == signal.SIGTERM


def test_a_flag_restores_the_handlers_it_replaced():
    before = signal.getsignal(signal.SIGINT)
    with SignalFlag() as flag:
        os.kill(os.getpid(), signal.SIGINT)
    assert flag.received == signal.SIGINT and signal.getsignal(signal.SIGINT) is before
