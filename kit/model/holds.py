"""Hold points: named steps of ``kit run`` where the fault tests hold the kit still, so a signal sent
from outside (SIGKILL, SIGINT, SIGTERM) lands at a known step instead of at a guessed moment.

Only the test environment variable ``KIT_TEST_HOLD_AT=<point>`` turns a point on. A hold never
changes what a run computes or records: it prints one line on stderr, then waits (at most
``HOLD_S``) until a SIGINT or SIGTERM has been handled by whatever handler the kit had installed,
or until the process is killed. The points are listed in ``POINTS`` (tests/evidence/test_run_faults.py
holds at each). Example::

    hold("sealing")        # no-op unless KIT_TEST_HOLD_AT=sealing
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

ENV = "KIT_TEST_HOLD_AT"
HOLD_S = 120.0
_held: set[str] = set()
POINTS = ("preflight", "ray-head", "container", "run-dir", "workload", "logs", "monitors", "validation", "status",
          "sealing", "sealed")


def hold(point: str) -> None:
    """Wait here when ``KIT_TEST_HOLD_AT`` names ``point``; the kit's own signal handlers still run."""
    if os.environ.get(ENV) != point or point in _held:
        return
    _held.add(point)       # once per process: a point passed many times (each step) holds at its first
    got: list[int] = []
    watched = (signal.SIGINT, signal.SIGTERM)
    relayed = threading.current_thread() is threading.main_thread()
    if relayed:
        old = {s: signal.getsignal(s) for s in watched}

        def relay(signum, frame):
            # give the signal to the handler the kit had (a flag, KeyboardInterrupt or the default death)
            got.append(signum)
            for s, handler in old.items():
                signal.signal(s, handler)
            signal.raise_signal(signum)

        for s in watched:
            signal.signal(s, relay)
    sys.stderr.write(f"kit: test hold at {point} (pid {os.getpid()})\n")     # only now may a test signal
    sys.stderr.flush()
    deadline = time.monotonic() + HOLD_S
    try:
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        if relayed and not got:
            for s, handler in old.items():
                signal.signal(s, handler)
