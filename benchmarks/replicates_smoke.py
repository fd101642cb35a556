"""The smoke arm's noise floor and reproduction: 3 seeds x 2 modes, kit analyze replicates, kit reproduce.

Runs `kit run --arm smoke --mode native|consistency --seeds 1,2,3 --rollouts N` into a fresh
workspace, then `kit analyze replicates` over the two groups (does the native vs consistency
mismatch difference exceed the noise floor?) and `kit reproduce` on the first consistency run
(bitwise?). Prints the verdicts and the wall time of each step.

    python benchmarks/replicates_smoke.py [--rollouts 3] [--figures docs/analysis]   # results/replicates_smoke.txt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kit(ws: Path, *args) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, KIT_WORKSPACE=str(ws), PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, cwd=ROOT, env=env)
    return proc, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--figures", type=Path, help="copy noise-floor.png of the run here")
    args = parser.parse_args()
    lines = [f"smoke arm, 3 seeds x 2 modes, {args.rollouts} rollouts each "
             f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})", ""]
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        groups = {}
        for mode in ("native", "consistency"):
            proc, secs = kit(ws, "run", "--arm", "smoke", "--mode", mode, "--seeds", "1,2,3",
                             "--rollouts", str(args.rollouts), "--allow-dirty", "--json")
            if proc.returncode != 0:
                raise SystemExit(f"kit run --mode {mode} --seeds 1,2,3 exited {proc.returncode}: {proc.stderr[-800:]}")
            groups[mode] = json.loads(proc.stdout)
            lines.append(f"kit run --mode {mode} --seeds 1,2,3: {secs:.1f} s, arm {groups[mode]['arm']}, "
                         f"{sum(r['sealed'] for r in groups[mode]['runs'])} sealed runs")
        docs = [str(ws / "groups" / f"{groups[m]['group']}.json") for m in ("native", "consistency")]
        proc, secs = kit(ws, "analyze", "replicates", *docs, "--out", str(ws / "noise"))
        if proc.returncode != 0:
            raise SystemExit(f"kit analyze replicates exited {proc.returncode}: {proc.stderr[-800:]}")
        doc = json.loads((ws / "noise" / "replicates.json").read_text())
        if args.figures:
            args.figures.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ws / "noise" / "noise-floor.png", args.figures / "noise-floor.png")
        lines += ["", f"kit analyze replicates ({secs:.1f} s): noise floor = range of the 3 seed means per arm"]
        for arm in doc["arms"]:
            m = arm["metrics"].get("mismatch_count")
            if m:
                lines.append(f"  {arm['arm']:<18} mismatch_count seed means {[round(x, 3) for x in m['seed_means']]}, "
                             f"noise floor {m['noise_floor']['range']:.4g}")
        lines += [f"  {m['verdict']}" for d in doc["differences"] for m in d["metrics"].values()]
        original = groups["consistency"]["runs"][0]["run_dir"]
        proc, secs = kit(ws, "reproduce", original, "--allow-dirty", "--json")
        report = json.loads(proc.stdout)
        lines += ["", f"kit reproduce {Path(original).name} ({secs:.1f} s, exit {proc.returncode}): {report['verdict']} "
                      f"({report['compared_values']} values compared, perf/* excluded)"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
