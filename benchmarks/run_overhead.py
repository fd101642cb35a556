"""The kit's overhead on the smoke arm: `kit run` (plan, probe, manifest, log capture, gates, seal)
against the workload alone (`python -m rlk_kernels.smoke`), measured side by side in one run.

    python benchmarks/run_overhead.py [--rollouts 5] [--repeats 3]

Reports wall times of both, the difference, the ratio, and the kit's own split from status.json
(kit_s = total - workload_s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workload, kit, kit_split = [], [], []
    with tempfile.TemporaryDirectory() as ws:
        env = dict(os.environ, KIT_WORKSPACE=ws)
        for i in range(args.repeats):   # interleaved, so drift hits both sides alike
            workload.append(wall([sys.executable, "-m", "rlk_kernels.smoke", "--arm-file", str(REPO / "manifests" / "smoke.json"),
                                  "--rollouts", str(args.rollouts)], env))
            kit.append(wall([sys.executable, "-m", "kit", "run", "--arm", "smoke", "--rollouts", str(args.rollouts),
                             "--run-id", f"bench-{i}", "--allow-dirty", "--json"], env))
            status = json.loads((Path(ws) / "runs" / f"bench-{i}" / "status.json").read_text())
            kit_split.append(status["timing"])
    w, k = statistics.median(workload), statistics.median(kit)
    result = {
        "rollouts": args.rollouts, "repeats": args.repeats, "cpus": os.cpu_count(),
        "workload_alone_s": [round(x, 3) for x in workload], "kit_run_s": [round(x, 3) for x in kit],
        "median_workload_alone_s": round(w, 3), "median_kit_run_s": round(k, 3),
        "overhead_s": round(k - w, 3), "kit_over_workload_ratio": round(k / w, 3),
        "in_process_split": kit_split,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
