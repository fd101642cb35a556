"""`kit analyze perf` with all figures against the predecessor's analyzer, side by side on the same logs.

The predecessor is `analyze_performance.py` of the published study (not part of this repository; give
its path with --predecessor or RLK_PREDECESSOR_ANALYZER, and where it came from with --origin). Both
read the published G10/G11 data as VIME logs (2 arms x 200 steps) with the keys the predecessor needs
(benchmarks/analysis_speed.py: predecessor_ready_logs) and write every figure as PNG + PDF.

Interleaved pairs in fresh interpreters, the order alternating from pair to pair; pair 0 warms the
file cache and byte-code and is not counted. Per pair: the predecessor, `kit analyze perf` as a user
runs it (figures drawn by worker processes on the cores the load leaves idle), and the same with
KIT_FIGURE_WORKERS=0 (every figure drawn in the one process). Wall time and CPU time (user + sys of
the process and its workers) of each; the ratios are per pair, then the median. Goal: >= 2x.

    python benchmarks/analyze_vs_predecessor.py --predecessor PATH/analyze_performance.py [--pairs 7]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from analysis_speed import predecessor_ready_logs  # noqa: E402  (the logs both analyzers read)

FIGURES = {".png", ".pdf"}


def timed(cmd, env) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children); a failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def figures(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.suffix in FIGURES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--predecessor", type=Path, default=os.environ.get("RLK_PREDECESSOR_ANALYZER"),
                        help="the predecessor's analyze_performance.py (or RLK_PREDECESSOR_ANALYZER)")
    parser.add_argument("--origin", default="the published study's analyze_performance.py, transcribed from its "
                                            "public commit da6c7da", help="where the predecessor's script came from")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--note", default="", help="a line about the host, printed with the results")
    args = parser.parse_args()
    if args.predecessor is None or not Path(args.predecessor).is_file():
        raise SystemExit("--predecessor PATH (or RLK_PREDECESSOR_ANALYZER): the predecessor's analyze_performance.py")
    predecessor = Path(args.predecessor).resolve()
    # this checkout first; a PYTHONPATH already set (packages installed with --target) stays behind it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg")
    env.pop("KIT_FIGURE_WORKERS", None)
    serial_env = dict(env, KIT_FIGURE_WORKERS="0")
    load_before = os.getloadavg()
    runs: dict[str, list[tuple[float, float]]] = {"old": [], "kit": [], "serial": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        logs = predecessor_ready_logs(tmp / "logs")
        for i in range(args.pairs + 1):
            steps = {
                "old": lambda: timed([sys.executable, predecessor, "--g10-log", logs["G10"], "--g11-log", logs["G11"],
                                      "--output-dir", tmp / f"old{i}"], env),
                "kit": lambda: timed([sys.executable, "-m", "kit", "analyze", "perf", logs["G10"], logs["G11"],
                                      "--out", tmp / f"kit{i}"], env),
                "serial": lambda: timed([sys.executable, "-m", "kit", "analyze", "perf", logs["G10"], logs["G11"],
                                         "--out", tmp / f"serial{i}"], serial_env),
            }
            order = ("old", "kit", "serial") if i % 2 else ("serial", "kit", "old")
            measured = {name: steps[name]() for name in order}
            if i:
                for name, value in measured.items():
                    runs[name].append(value)
            print(f"pair {i}{' (warm-up)' if not i else ''}: " + ", ".join(
                f"{n} {w:.2f} s wall {c:.2f} s CPU" for n, (w, c) in measured.items()), file=sys.stderr)
        old_figs, kit_figs, serial_figs = figures(tmp / "old1"), figures(tmp / "kit1"), figures(tmp / "serial1")
        assert kit_figs == serial_figs, (kit_figs, serial_figs)
    load_after = os.getloadavg()

    med = statistics.median

    def ratio(name, k):
        per_pair = [o[k] / n[k] for o, n in zip(runs["old"], runs[name])]
        return med(per_pair), min(per_pair), max(per_pair)

    lines = [
        "kit analyze perf with all figures vs the predecessor's analyzer: 2 arms x 200 steps "
        "(published G10/G11 as VIME logs), 20,000 bootstrap draws",
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average (1, 5, 15 min) {', '.join(f'{x:.1f}' for x in load_before)} at the start, "
        f"{', '.join(f'{x:.1f}' for x in load_after)} at the end",
        *([f"host: {args.note}"] if args.note else []),
        f"predecessor: {predecessor.name}, sha256 {hashlib.sha256(predecessor.read_bytes()).hexdigest()}",
        f"  from: {args.origin}",
        f"  figure files: {len(old_figs)} ({', '.join(old_figs)})",
        f"kit: figure files: {len(kit_figs)} ({', '.join(kit_figs)})",
        f"{args.pairs} interleaved pairs (order alternating), fresh interpreters, same 2 logs:",
        f"  {'':<52}{'median wall s':>14}{'min wall s':>11}{'median CPU s':>13}",
    ]
    labels = {"old": "predecessor analyze_performance.py (figures)",
              "kit": "kit analyze perf, all figures",
              "serial": "kit analyze perf, all figures, KIT_FIGURE_WORKERS=0"}
    for name, label in labels.items():
        walls, cpus = [w for w, _ in runs[name]], [c for _, c in runs[name]]
        lines.append(f"  {label:<52}{med(walls):>14.3f}{min(walls):>11.3f}{med(cpus):>13.3f}")
    for name in ("kit", "serial"):
        w, c = ratio(name, 0), ratio(name, 1)
        lines.append(f"  per-pair ratio predecessor / {labels[name]}: wall {w[0]:.2f}x (min {w[1]:.2f}x, "
                     f"max {w[2]:.2f}x), CPU {c[0]:.2f}x")
    best = ratio("kit", 0)[0]
    lines.append(f"goal: >= 2x faster with all figures (wall, median of per-pair ratios): {best:.2f}x -> "
                 f"{'met' if best >= 2 else 'NOT met'}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
