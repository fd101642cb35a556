"""Figures drawn in worker processes, so that drawing overlaps the statistics and uses both cores.

Drawing is most of ``kit analyze``'s time with figures, and matplotlib's import is a large part of it.
The pool forks its workers when the command starts; each imports matplotlib and draws a tiny figure
(fonts, glyph caches, the PDF writer) while the parent still reads the logs and runs the bootstrap.
The figures are then drawn in parallel, one task per figure. Where fork is not available, or the pool
cannot start, everything is drawn in this process instead: the same files, only slower.
Workers pay off only on idle cores: on a host whose load already fills its cores, they would only add
matplotlib's import to each of them, so the default is one worker per figure (``most``: 2 unless the
command says how many figures it draws), never more than the cores no other runnable task holds
(``idle_cores``) less the one this process needs for the statistics: on two idle cores, one worker. ``KIT_FIGURE_WORKERS`` sets the number (0 draws here). Example::

    with FigurePool() as pool:              # before reading the logs
        report = analyze_perf(load_arms(paths))
        written = perf_figures(report, out_dir, pool)
        # or: collect = pool.start(perf_figure_tasks(report, out_dir)); write the tables; collect()
"""

from __future__ import annotations

import io
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

WORKERS = 2
WORKERS_ENV = "KIT_FIGURE_WORKERS"


def _warm() -> None:
    """Import the drawing stack and draw once, so the first real figure finds every cache filled."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 1))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="warm")
    ax.set_title("warm-up 0123456789 −×", fontsize=8)
    ax.legend(fontsize=7)
    for fmt in ("png", "pdf"):
        fig.savefig(io.BytesIO(), format=fmt, dpi=20)


def idle_cores(loadavg: str | None = None) -> int:
    """Cores that no other runnable task holds right now, from /proc/loadavg's ``running/total`` field
    (this process counts itself once); where it is missing, the 1-minute load average. A command of two
    seconds needs the cores of the next two seconds: the 1-minute average still carries work that
    has just ended (the previous command), which would leave cores unused.

    ``idle_cores("0.50 0.40 0.30 1/250 9")`` is every core; ``"2.0 1.0 0.5 3/250 9"`` is two fewer."""
    cores = os.cpu_count() or 1
    try:
        if loadavg is None:
            with open("/proc/loadavg") as fh:
                loadavg = fh.read()
        busy = max(0, int(loadavg.split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        try:
            busy = os.getloadavg()[0]
        except (AttributeError, OSError):
            return cores
    return max(0, min(cores, int(cores - busy + 0.5)))


class FigurePool:
    """Up to ``workers`` forked drawing processes (fewer on fewer cores); ``map`` runs figure tasks.

    ``most``: how many figures the command draws, the most workers worth starting by default."""

    def __init__(self, workers: int | None = None, *, most: int = WORKERS):
        self._executor = None
        if workers is None:
            text = os.environ.get(WORKERS_ENV, "")
            # one idle core stays with this process, which runs the statistics while the workers draw
            workers = int(text) if text.isdigit() else min(most, idle_cores() - 1)
        workers = min(workers, os.cpu_count() or 1)
        if workers < 1 or "fork" not in multiprocessing.get_all_start_methods():
            return
        try:
            self._executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                                 initializer=_warm)
            for _ in range(workers):        # start every worker now: each warms up during the statistics
                self._executor.submit(int)
        except (OSError, ValueError):
            self._executor = None

    def map(self, tasks) -> list:
        """``[fn(*args) for fn, args in tasks]``, in workers when the pool runs, else here."""
        return self.start(tasks)()

    def start(self, tasks):
        """Hand ``tasks`` to the workers now; returns the function that waits for their results, in order."""
        here = lambda: [fn(*args) for fn, args in tasks]      # noqa: E731
        try:
            futures = [self._executor.submit(fn, *args) for fn, args in tasks] if self._executor else None
        except BrokenProcessPool:            # a worker died while warming up
            self.close()
            futures = None
        if futures is None:
            return here

        def results() -> list:
            try:
                return [f.result() for f in futures]
            except BrokenProcessPool:        # a worker died (e.g. out of memory): draw here instead
                self.close()
                return here()
        return results

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
