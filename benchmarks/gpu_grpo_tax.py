"""The end-to-end consistency tax of the GPU arm pair: mean step time R/R ÷ P/P with a paired bootstrap CI.

Reads two sealed run dirs (default: the committed H200 pair under tests/data/gpu-pair, which
benchmarks/gpu_grpo_pair.sh made) and prints, side by side, each stage's steady-state mean (steps >= 1:
step 0 holds Triton's and cuBLAS's first-call work) for P/P and R/R and their ratio, with a 95 % CI from
resampling the step indices jointly in both arms. Example::

    python benchmarks/gpu_grpo_tax.py                                  # the committed pair
    python benchmarks/gpu_grpo_tax.py RUNS/gpu-native-… RUNS/gpu-consistency-… --json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PAIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu-pair"
STAGES = (("step", "perf/step_time"), ("rollout", "perf/rollout_time"), ("log-prob recompute", "perf/log_probs_time"),
          ("reference log-probs", "perf/ref_log_probs_time"), ("actor fwd+bwd+AdamW", "perf/actor_train_time"),
          ("weight sync", "perf/update_weights_time"))
DRAWS = 20_000


def per_step(run_dir: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "perf":
            out.setdefault(record["step"], {}).update(record["payload"])
    return out


def ratio_ci(native: list[float], strict: list[float], draws: int = DRAWS, seed: int = 1234) -> tuple[float, float, float]:
    """mean(strict) / mean(native) and the 2.5/97.5 percentiles of that ratio over paired resamples of the steps."""
    rng = random.Random(seed)
    n = len(native)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(strict[i] for i in idx) / sum(native[i] for i in idx))
    ratios.sort()
    return sum(strict) / sum(native), ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("native", nargs="?", type=Path, help="the P/P run dir")
    parser.add_argument("consistency", nargs="?", type=Path, help="the R/R run dir")
    parser.add_argument("--steady-from", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    native_dir = args.native or next(PAIR.glob("gpu-native-*"))
    strict_dir = args.consistency or next(PAIR.glob("gpu-consistency-*"))
    native, strict = per_step(native_dir), per_step(strict_dir)
    steps = sorted(s for s in native if s >= args.steady_from and s in strict)
    rows = []
    for label, key in STAGES:
        a = [native[s][key] for s in steps if key in native[s] and key in strict[s]]
        b = [strict[s][key] for s in steps if key in native[s] and key in strict[s]]
        if a:
            ratio, low, high = ratio_ci(a, b)
            rows.append({"stage": label, "key": key, "steps": len(a), "native_mean_s": sum(a) / len(a),
                         "consistency_mean_s": sum(b) / len(b), "ratio": ratio, "ci95": [low, high]})
    if args.json:
        print(json.dumps({"native": native_dir.name, "consistency": strict_dir.name, "steady_from": args.steady_from,
                          "draws": DRAWS, "stages": rows}, indent=2))
        return 0
    print(f"P/P {native_dir.name}  vs  R/R {strict_dir.name}; steps >= {args.steady_from}, paired bootstrap, {DRAWS} draws")
    print(f"{'stage':<24}{'P/P s':>9}{'R/R s':>9}{'R/R ÷ P/P':>11}   95% CI")
    for r in rows:
        print(f"{r['stage']:<24}{r['native_mean_s']:>9.4f}{r['consistency_mean_s']:>9.4f}{r['ratio']:>11.3f}"
              f"   [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
