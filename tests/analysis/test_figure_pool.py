"""Figures drawn by worker processes are the files drawn in-process; the exact mean equals statistics.mean."""

from __future__ import annotations

import random
import statistics

import pytest

from fixtures_vime_logs import write_published_logs
from kit.analysis.figure_pool import FigurePool, idle_cores
from kit.analysis.perf import analyze_perf
from kit.analysis.plots import PERF_DRAWINGS, perf_figure_tasks, perf_figures
from kit.analysis.stats import exact_mean
from kit.analysis.table import load_arms


def test_two_workers_draw_the_same_bytes_as_this_process(tmp_path):
    logs = write_published_logs(tmp_path / "logs")
    report = analyze_perf(load_arms([logs["G10"], logs["G11"]]), draws=200)
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    serial = perf_figures(report, here)
    with FigurePool(workers=2) as pool:
        assert pool._executor is not None       # fork is available on Linux: the workers really draw
        parallel = perf_figures(report, there, pool)
    assert serial == parallel == [f"{s}.{e}" for s in PERF_DRAWINGS for e in ("png", "pdf")]
    for name in serial:
        assert (here / name).read_bytes() == (there / name).read_bytes(), name


def test_early_figures_come_from_descriptives_and_equal_the_full_reports(tmp_path):
    """The figures handed out before the bootstrap (on_descriptives) are the bytes the full report draws."""
    logs = write_published_logs(tmp_path / "logs")
    arms = load_arms([logs["G10"], logs["G11"]])
    seen = []
    report = analyze_perf(arms, draws=200, on_descriptives=seen.append)
    (early,) = seen
    assert list(early.summary) == ["subsets", "arms"] and list(early.summary["subsets"]) == ["all"]
    assert early.summary["subsets"]["all"]["comparisons"] == []                 # drawn before any bootstrap
    assert report.summary["subsets"]["all"]["comparisons"]
    assert early.summary["subsets"]["all"]["arms"] == report.summary["subsets"]["all"]["arms"]
    assert all("comparison" not in r for r in early.rows) and all("comparison" in r for r in report.rows)
    early_dir, full_dir = tmp_path / "early", tmp_path / "full"
    early_dir.mkdir(), full_dir.mkdir()
    drawn = [n for fn, args in perf_figure_tasks(early, early_dir, "early") for n in fn(*args)]
    assert sorted(drawn) == ["stage-time-series.pdf", "stage-time-series.png", "token-normalized-throughput.pdf",
                             "token-normalized-throughput.png"]
    for fn, args in perf_figure_tasks(report, full_dir):
        fn(*args)
    for name in drawn:
        assert (early_dir / name).read_bytes() == (full_dir / name).read_bytes(), name
    late = [fn.__name__ for fn, _ in perf_figure_tasks(report, full_dir, "late")]
    assert late == ["length_controlled_scaling", "performance_decomposition"]


def test_a_failing_figure_is_an_error_not_a_hang(tmp_path):
    with FigurePool(workers=1) as pool, pytest.raises(ZeroDivisionError):
        pool.map([(divmod, (1, 0))])


def test_worker_count(monkeypatch):
    monkeypatch.setenv("KIT_FIGURE_WORKERS", "0")
    with FigurePool() as pool:
        assert pool._executor is None
        assert pool.map([(divmod, (7, 2))]) == [(3, 1)]      # drawn here
    assert 0 <= idle_cores() <= 2 or idle_cores() <= (__import__("os").cpu_count() or 1)


def test_idle_cores_are_the_ones_no_other_runnable_task_holds(monkeypatch):
    monkeypatch.setattr("kit.analysis.figure_pool.os.cpu_count", lambda: 4)
    assert idle_cores("3.90 3.10 2.00 1/250 999") == 4      # a busy minute that has ended: all idle now
    assert idle_cores("0.10 0.10 0.10 3/250 999") == 2      # two other tasks run right now
    assert idle_cores("0.10 0.10 0.10 9/250 999") == 0
    monkeypatch.setattr("kit.analysis.figure_pool.os.getloadavg", lambda: (1.2, 0.0, 0.0))
    assert idle_cores("garbled") == 3                        # no running count: the 1-minute load average


def test_one_worker_per_figure_on_idle_cores_only(monkeypatch):
    import kit.analysis.figure_pool as figure_pool

    monkeypatch.delenv("KIT_FIGURE_WORKERS", raising=False)
    monkeypatch.setattr(figure_pool.os, "cpu_count", lambda: 16)
    for idle, most, expected in ((16, 4, 4), (16, None, 2), (2, 4, 1), (1, 4, 0), (0, 4, 0)):
        monkeypatch.setattr(figure_pool, "idle_cores", lambda idle=idle: idle)
        with FigurePool(**({"most": most} if most else {})) as pool:
            assert (pool._executor._max_workers if pool._executor else 0) == expected, (idle, most)


def test_exact_mean_is_statistics_mean():
    rng = random.Random(20)
    for trial in range(3000):
        n = rng.randint(1, 250)
        values = [rng.choice([rng.uniform(-1e3, 1e3), rng.lognormvariate(0, 20), 1e-300 * rng.random(), 7])
                  for _ in range(n)]
        assert exact_mean(values) == float(statistics.mean(values)), values
    assert exact_mean([1.0, float("inf")]) == float("inf")
    with pytest.raises(statistics.StatisticsError):
        exact_mean([])
