"""The one progress printer of the kit: a line on stderr for long work (hashing, downloads, a run's steps).

On a terminal the line is redrawn in place; elsewhere (a log, CI) each update is a line of its own, so
logs stay readable. Updates come at most once per interval; the closing one always. Example::

    line = ProgressLine(sys.stderr)
    line.update("hashing /models/Qwen3-8B: 2/5 files")          # drawn when the interval has passed
    line.update("hashing /models/Qwen3-8B: 5/5 files", final=True)
"""

from __future__ import annotations

import time
from typing import TextIO


class ProgressLine:
    def __init__(self, stream: TextIO | None, *, tty_interval_s: float = 0.5, log_interval_s: float = 5.0,
                 interval_s: float | None = None, draw_first: bool = False):
        self.stream = stream
        self.tty = stream is not None and hasattr(stream, "isatty") and stream.isatty()
        self.interval_s = interval_s if interval_s is not None else (tty_interval_s if self.tty else log_interval_s)
        self.last = float("-inf") if draw_first else time.monotonic()   # draw_first: the first update shows at once
        self.drawn = False
        self.open = False            # a redrawn line without its newline yet

    def due(self) -> bool:
        """Whether an update now would be drawn (callers skip building the text otherwise)."""
        return self.stream is not None and time.monotonic() - self.last >= self.interval_s

    def update(self, text: str, *, final: bool = False, force: bool = False) -> None:
        if self.stream is None or not (final or force or self.due()):
            return
        self.last = time.monotonic()
        if self.tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
            self.open = not final
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End a redrawn line that never got its final update (an interrupted run)."""
        if self.stream is not None and self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False
