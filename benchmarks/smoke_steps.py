"""Smoke steps per second on CPU for all-production (P/P) and all-strict (R/R), measured side by side.

The two arms differ only in their operator cases (same model, seeds, topology TP2/CP4 against
rollout TP4, workload); runs alternate P, R, P, R ... so machine drift hits both alike.

    python benchmarks/smoke_steps.py [--rollouts 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    import torch

    from rlk_kernels.smoke import SmokeConfig, run_smoke

    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    arm = json.loads((ROOT / "manifests" / "smoke.json").read_text())
    configs = {}
    for case in ("P/P", "R/R"):
        doc = copy.deepcopy(arm)
        doc["operators"] = {m: case for m in ("attention", "ffn", "logp")}
        configs[case] = SmokeConfig.from_arm(doc).with_rollouts(args.rollouts)
    rates = {case: [] for case in configs}
    run_smoke(configs["R/R"].with_rollouts(1), emit=lambda line: None)  # warm-up
    for _ in range(args.repeats):
        for case, config in configs.items():
            started = time.perf_counter()
            steps = run_smoke(config, emit=lambda line: None)
            rates[case].append(steps / (time.perf_counter() - started))
    p, r = statistics.median(rates["P/P"]), statistics.median(rates["R/R"])
    print(f"smoke steps/s on CPU ({platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; TP2/CP4 vs rollout TP4, {args.rollouts} rollouts x {args.repeats} repeats, median)")
    print(f"  P/P (production): {p:.3f} steps/s   runs: {', '.join(f'{x:.3f}' for x in rates['P/P'])}")
    print(f"  R/R (strict):     {r:.3f} steps/s   runs: {', '.join(f'{x:.3f}' for x in rates['R/R'])}")
    print(f"  ratio R/R / P/P:  {r / p:.3f}  (strict runs at {100 * r / p:.0f}% of production speed)")


if __name__ == "__main__":
    main()
