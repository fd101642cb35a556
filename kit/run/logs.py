"""What a run shows and keeps while its job runs: the two logs of a run dir (kit.log, run.log), the
progress line on stderr, and the Ctrl-C/SIGTERM flag the stream loop polls. Example::

    with SignalFlag() as signals:
        status = runtime.follow(logs.emit, lambda: signals.received is not None)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable, TextIO

from kit.engines.vime.records import parse_records
from kit.evidence import bundle as E
from kit.evidence.redact import Redactor
from kit.gates.rules import MISMATCH_KEY, mismatch_count, step_global_batch_size
from kit.model.holds import hold
from kit.model.progress import ProgressLine


class Progress:
    """Steps done of N from the step records, ETA and the last step's mismatched-token count, on stderr.

    The engine logs the mismatch as a per-sample mean; the display shows the count (mean × global
    batch size, reference §4.2), the same figure the run summary and ``kit analyze`` report."""

    def __init__(self, total: int, stream: TextIO | None, arm: dict | None = None):
        self.total, self.arm = total, arm
        self.line = ProgressLine(stream, tty_interval_s=0.0, log_interval_s=2.0, draw_first=True)
        self.done, self.started = 0, time.monotonic()
        self.mismatch = None

    def record(self, rec) -> None:
        if self.line.stream is None or rec.kind != "step":
            return
        self.done += 1
        if MISMATCH_KEY in rec.payload:
            self.mismatch = mismatch_count(rec.payload[MISMATCH_KEY], step_global_batch_size(rec.payload, self.arm))
        final = self.done == self.total
        if final or self.line.due():
            eta = (time.monotonic() - self.started) / self.done * max(self.total - self.done, 0)
            shown = "-" if self.mismatch is None else f"{self.mismatch:g} tokens"
            self.line.update(f"step {self.done}/{self.total}  ETA {eta:5.0f} s  last step mismatched {shown}",
                             final=final)

    def finish(self) -> None:
        self.line.close()


class SignalFlag:
    """Ctrl-C and SIGTERM set a flag the caller polls (the stream loop, the suite between arms): the job is
    stopped, evidence kept, no traceback. A context manager that restores the previous handlers."""

    def __init__(self):
        self.received: int | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:   # not the main thread: leave the handlers alone
                pass
        return self

    def _handle(self, signum, frame):
        self.received = signum
        # A flag inside another (a run inside a suite) passes the signal out too: a SIGTERM that lands
        # while the run seals must still stop the suite before its next arm.
        outer = self._old.get(signum)
        if isinstance(getattr(outer, "__self__", None), SignalFlag):
            outer(signum, frame)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class RunLogs:
    """The open logs of one run dir: kit.log (the kit's events, recorded secrets redacted) and run.log (the
    job's own lines as the engine wrote them, parsed for the progress display and kept for the gates)."""

    def __init__(self, run_dir: Path, redactor: Redactor, bar: "Progress", log: Callable[[str], None], *,
                 run_log: TextIO, kit_log_mode: str = "x"):
        self.run_dir, self.redactor, self.bar, self.log = run_dir, redactor, bar, log
        self.kit_log = open(run_dir / E.KIT_LOG, kit_log_mode, encoding="utf-8")
        self.run_log = run_log
        self.engine_lines: list[str] = []

    def kit_event(self, text: str) -> None:
        self.kit_log.write(f"{E.utc_now()} {self.redactor.text(text)}\n")
        self.kit_log.flush()
        self.log(text)

    def emit(self, line: str) -> None:
        line = line.rstrip("\n")            # the engine's output, byte for byte: redaction never rewrites it
        self.engine_lines.append(line)
        self.run_log.write(line + "\n")
        self.run_log.flush()
        for rec in parse_records([line]):
            self.bar.record(rec)
            if rec.kind == "step":
                hold("workload")      # tests: a signal in the middle of the job's steps

    def close_run_log(self) -> None:
        self.bar.finish()
        if not self.run_log.closed:
            self.run_log.close()
