"""monitors.png draws what the run recorded: vmstat's host CPU when psutil is absent (it is no declared
dependency), and no empty panel for a monitor no run recorded."""

from __future__ import annotations

import struct
from pathlib import Path

from kit.analysis.monitors import monitor_figure, parse_vmstat, read_monitors

VMSTAT = """procs -----------memory---------- ---swap-- -----io---- -system-- ------cpu----- -----timestamp-----
 r  b   swpd   free   buff  cache   si   so    bi    bo   in   cs us sy id wa st                 UTC
 3  0      0 20127344  52524 3045928    0    0  9715  5807  851 1826 58 12 29  1  0 2026-12-06 01:14:57
 3  0      0 20127344  52524 3045928    0    0  1588     0  809  753 87 13  0  0  0 2026-12-06 01:14:58
 5  0      0 20126320  52524 3045928    0    0   260   112  717  833 93  8  0  0  0 2026-12-06 01:14:59
"""
GPU_PAIR = Path(__file__).resolve().parents[1] / "data" / "gpu-pair"


def png_height(path: Path) -> int:
    return struct.unpack(">I", path.read_bytes()[20:24])[0]


def test_vmstat_lines_become_host_cpu_and_free_memory():
    s = parse_vmstat(VMSTAT)
    assert s["t"] == [0.0, 1.0, 2.0] and s["cpu_pct"] == [70.0, 100.0, 101.0]
    assert s["free_mib"][0] == 20127344 / 1024 and s["wait_pct"][0] == 1.0
    assert parse_vmstat("no header\n1 2 3\n")["t"] == []


def test_a_cpu_run_gets_its_vmstat_drawn_and_no_empty_gpu_panels(tmp_path):
    series = {"interval_s": 1.0, "gpu": None, "host": parse_vmstat(VMSTAT), "missing": ["gpu", "psutil"]}
    assert monitor_figure({"smoke (R/R)": (series, [1.2, 0.6])}, tmp_path, "controlled comparison") == \
        ["monitors.png", "monitors.pdf"]
    assert png_height(tmp_path / "monitors.png") == 560          # host CPU + step time: two panels, not four


def test_a_gpu_run_keeps_its_gpu_panels(tmp_path):
    run = next(p for p in sorted(GPU_PAIR.iterdir()) if p.is_dir())
    series = read_monitors(run)
    assert series["gpu"] and series["gpu"]["t"]
    monitor_figure({run.name: (series, [1.0, 1.0])}, tmp_path, "single arm")
    panels = 1 + 2 + (1 if series["host"] and series["host"]["t"] else 0)
    assert png_height(tmp_path / "monitors.png") == round((2.5 * panels + 0.6) * 100)
