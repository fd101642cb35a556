"""Wall time of `kit analyze` on 2 arms x 200 steps (the published G10/G11 data as VIME logs).

Stages are timed separately in-process: reading the logs, the statistics (perf: descriptives of
3 subsets, OLS, bootstrap CIs with 20,000 draws; convergence tables), and figure rendering (PNG +
PDF). Then the command a user types, end to end in a fresh interpreter (start-up, imports, reading,
statistics, writing the outputs): `kit analyze perf G10.log G11.log --out DIR`, with --no-figures
and with figures. Side by side in the same run, the seed's way of bootstrapping (a fresh index
matrix for every metric) against the kit's (one seeded index matrix shared by all metrics).
Goal (issue 6): 2 arms x 200 steps with 20,000 draws in < 1 s on 2 cores.

Side by side with the predecessor's analyzer (analyze_performance.py of the published study, given with
--predecessor; it is not part of this repository): interleaved pairs, each running the predecessor's
script and then `kit analyze perf` with all figures (PNG + PDF) on the same two logs, in fresh
interpreters. The predecessor needs keys the published rounds.csv lacks, so these logs add
rollout/total_lengths = response + 512, perf/actor_train_time = 0.8 x train_time and
perf/data_preprocess_time = 0.05 s, a pair of tqdm bars per step, and no colour codes. Goal (issue 20): >= 2x faster.

    python benchmarks/analysis_speed.py --predecessor PATH/analyze_performance.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def best_of(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def cli_perf(logs, out: Path, *extra: str) -> float:
    """Wall time of one `kit analyze perf` in a fresh interpreter; a failure stops the benchmark."""
    cmd = [sys.executable, "-m", "kit", "analyze", "perf", str(logs["G10"]), str(logs["G11"]), "--out", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed


def best_of_cli(logs, root: Path, repeat: int, *extra: str):
    root.mkdir()
    times = [cli_perf(logs, root / str(i), *extra) for i in range(repeat)]
    return min(times), statistics.median(times)


def seed_style_bootstrap(values_by_metric, draws=20_000, seed=1234):
    # the seed script: independent resampling, a new index draw per metric and arm
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for name, (a, b) in values_by_metric.items():
        a, b = np.asarray(a), np.asarray(b)
        ma = a[rng.integers(0, len(a), size=(draws, len(a)))].mean(axis=1)
        mb = b[rng.integers(0, len(b), size=(draws, len(b)))].mean(axis=1)
        out[name] = np.percentile(mb - ma, [2.5, 97.5])
    return out


def predecessor_ready_logs(directory: Path) -> dict:
    """The published logs with the keys and bars the predecessor requires (module doc)."""
    from fixtures_vime_logs import published_rounds, write_log

    directory.mkdir(parents=True)
    out = {}
    for group, rows in published_rounds().items():
        path = write_log(directory / f"{group}.log", rows, with_tqdm=True)
        lines = []
        for line in path.read_text().splitlines():
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)      # the predecessor does not strip colour codes
            if re.search(r"\brollout \d+: \{", line):
                resp = float(re.search(r"'rollout/response_lengths': ([0-9.e+-]+)", line).group(1))
                line = line.replace("{", f"{{'rollout/total_lengths': {resp + 512.0!r}, ", 1)
            elif re.search(r"\bperf \d+: \{'perf/step_time'", line):
                train = float(re.search(r"'perf/train_time': ([0-9.e+-]+)", line).group(1))
                line = line.replace("{", f"{{'perf/actor_train_time': {0.8 * train!r}, "
                                         "'perf/data_preprocess_time': 0.05, ", 1)
            lines.append(line)
        path.write_text("\n".join(lines) + "\n")
        out[group] = path
    return out


def side_by_side(predecessor: Path, root: Path, pairs: int) -> list[str]:
    """Interleaved pairs: the predecessor's script, then kit with figures, then kit without."""
    logs = predecessor_ready_logs(root / "logs")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")

    def timed(cmd) -> float:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
        return time.perf_counter() - t0

    old, new, bare = [], [], []
    for i in range(pairs + 1):     # pair 0 warms the file cache and byte-code; not counted
        o = timed([sys.executable, str(predecessor), "--g10-log", logs["G10"], "--g11-log", logs["G11"],
                   "--output-dir", root / f"old{i}"])
        n = timed([sys.executable, "-m", "kit", "analyze", "perf", logs["G10"], logs["G11"], "--out", root / f"new{i}"])
        b = timed([sys.executable, "-m", "kit", "analyze", "perf", logs["G10"], logs["G11"], "--out", root / f"bare{i}",
                   "--no-figures"])
        if i:
            old.append(o), new.append(n), bare.append(b)
    figures = sorted(p.name for p in (root / "new1").iterdir() if p.suffix in (".png", ".pdf"))
    old_figures = sorted(p.name for p in (root / "old1").iterdir() if p.suffix in (".png", ".pdf"))
    ratios = [o / n for o, n in zip(old, new)]
    med = statistics.median
    digest = hashlib.sha256(predecessor.read_bytes()).hexdigest()
    return [
        f"side by side with the predecessor's analyzer, {pairs} interleaved pairs, fresh interpreters, same 2 logs:",
        f"  predecessor: {predecessor.name} sha256 {digest[:16]}…, {len(old_figures)} figure files (PNG + PDF)",
        f"  {'':<46}{'median s':>9}{'min s':>8}",
        f"  {'predecessor analyze_performance.py (figures)':<46}{med(old):>9.3f}{min(old):>8.3f}",
        f"  {'kit analyze perf, all figures (' + str(len(figures)) + ' files)':<46}{med(new):>9.3f}{min(new):>8.3f}",
        f"  {'kit analyze perf --no-figures':<46}{med(bare):>9.3f}{min(bare):>8.3f}",
        f"  per-pair ratio predecessor / kit with figures: median {med(ratios):.2f}x "
        f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x) -> goal >= 2x {'met' if med(ratios) >= 2 else 'NOT met'}",
        f"  ratio predecessor / kit --no-figures (medians): {med(old) / med(bare):.2f}x",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--predecessor", type=Path, help="the predecessor's analyze_performance.py")
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    from fixtures_vime_logs import write_published_logs
    from kit.analysis.convergence import analyze_convergence
    from kit.analysis.perf import COMPARED, analyze_perf, step_rows
    from kit.analysis.plots import convergence_figures, perf_figures
    from kit.analysis.stats import Resampler
    from kit.analysis.table import load_arms

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        logs = write_published_logs(tmp / "logs")
        paths = [logs["G10"], logs["G11"]]
        read_best, read_med = best_of(lambda: load_arms(paths))
        arms = load_arms(paths)
        analyze_perf(arms)  # warm imports
        perf_best, perf_med = best_of(lambda: analyze_perf(arms))
        unp_best, unp_med = best_of(lambda: analyze_perf(arms, pairing="unpaired"))
        conv_best, conv_med = best_of(lambda: analyze_convergence(arms))
        report, conv = analyze_perf(arms), analyze_convergence(arms)

        rows = {a.name: step_rows(a) for a in arms}
        metrics = {c: ([r[c] for r in rows["G10"]], [r[c] for r in rows["G11"]]) for c in COMPARED
                   if all(r[c] is not None for rs in rows.values() for r in rs)}

        def kit_style():
            r = Resampler()
            for a, b in metrics.values():
                r.unpaired(a, b)

        seed_best, _ = best_of(lambda: seed_style_bootstrap(metrics))
        kit_best, _ = best_of(kit_style)

        def render(n=[0]):
            n[0] += 1
            out = tmp / f"fig{n[0]}"
            out.mkdir()
            return perf_figures(report, out) + convergence_figures(conv, out)

        render()  # warm matplotlib
        fig_best, fig_med = best_of(render, repeat=3)

        cli_perf(logs, tmp / "cli-warm", "--no-figures")  # warm the OS file cache and byte-code
        cli_bare_best, cli_bare_med = best_of_cli(logs, tmp / "cli-no-figures", 5, "--no-figures")
        cli_fig_best, cli_fig_med = best_of_cli(logs, tmp / "cli-figures", 3)
        versus = side_by_side(args.predecessor.resolve(), tmp / "versus", args.pairs) if args.predecessor else \
            ["side by side with the predecessor: not run (give --predecessor PATH)"]

    goal = 1.0
    verdict = lambda t: "met" if t < goal else "NOT met"

    lines = [
        "kit analyze speed: 2 arms x 200 steps (published G10/G11 as VIME logs), 20,000 bootstrap draws",
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "",
        f"{'stage':<52}{'best s':>9}{'median s':>10}",
        f"{'read + parse 2 logs (4 records per step)':<52}{read_best:>9.3f}{read_med:>10.3f}",
        f"{'perf statistics, paired bootstrap (auto)':<52}{perf_best:>9.3f}{perf_med:>10.3f}",
        f"{'perf statistics, unpaired bootstrap':<52}{unp_best:>9.3f}{unp_med:>10.3f}",
        f"{'convergence tables and summaries':<52}{conv_best:>9.3f}{conv_med:>10.3f}",
        f"{'statistics total (read + perf paired + convergence)':<52}"
        f"{read_best + perf_best + conv_best:>9.3f}{read_med + perf_med + conv_med:>10.3f}",
        f"{'figures: 8 figures x (PNG + PDF)':<52}{fig_best:>9.3f}{fig_med:>10.3f}",
        "",
        "end to end, `kit analyze perf G10.log G11.log --out DIR` in a fresh interpreter:",
        f"{'  --no-figures (5 runs)':<52}{cli_bare_best:>9.3f}{cli_bare_med:>10.3f}",
        f"{'  with figures: 4 figures x (PNG + PDF) (3 runs)':<52}{cli_fig_best:>9.3f}{cli_fig_med:>10.3f}",
        "",
        f"bootstrap of {len(metrics)} metrics, unpaired, 20,000 draws each, side by side:",
        f"  seed style (new index draw per metric and arm)   {seed_best:.3f} s",
        f"  kit (one index matrix per sample size, reused)   {kit_best:.3f} s",
        f"  ratio seed/kit                                   {seed_best / kit_best:.2f}x",
        "",
        f"goal (issue 6): 2 arms x 200 steps, 20,000 draws, < {goal:g} s on 2 cores",
        f"  statistics in-process, read + perf + convergence (best)   {read_best + perf_best + conv_best:.3f} s -> "
        f"{verdict(read_best + perf_best + conv_best)}",
        f"  kit analyze perf --no-figures, end to end (median)        {cli_bare_med:.3f} s -> {verdict(cli_bare_med)}",
        f"  kit analyze perf with figures, end to end (median)        {cli_fig_med:.3f} s -> {verdict(cli_fig_med)}"
        + ("" if cli_fig_med < goal else f" (rendering the figures takes {cli_fig_med - cli_bare_med:.1f} s of it)"),
    ]
    print("\n".join(lines + [""] + versus))


if __name__ == "__main__":
    main()
