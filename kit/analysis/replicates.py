"""Replicates: the noise floor of each metric (how far identical runs at other seeds land apart), and
whether the difference between two arms exceeds it.

Per run, the mean of each metric over its steps. Per arm (all runs with one arm name):
- the **noise floor**: the spread of its seed means, as the range (max − min: the largest gap
  between two identical runs) and the sample standard deviation;
- against the reference arm (the first), the difference of the arms' mean seed means with a
  **two-level bootstrap** CI: seeds are resampled with replacement, then each drawn seed's steps;
- in words: the difference **exceeds the noise floor** when its CI excludes 0 and it is larger than
  both arms' ranges; otherwise it does not (or there is no noise floor: an arm has one seed).

Example::

    doc = analyze_replicates(load_arms(paths))
    doc["differences"][0]["metrics"]["mismatch_count"]["verdict"]
"""

from __future__ import annotations

import math
import statistics

from kit.analysis.table import manifest_workload
from kit.model.errors import BadInput
from kit.engines.vime import keys

SCHEMA = "rlk-kit/analysis-replicates/v1"
METRICS = {
    "raw_reward": keys.RAW_REWARD, "reward": keys.REWARDS,
    "mismatch_count": keys.MISMATCH_COUNT,
    "mean_abs_dlogp": keys.MEAN_ABS_DIFF,
    "max_abs_dlogp": keys.MAX_ABS_DIFF,
    "response_length": keys.RESPONSE_LENGTHS, "step_time_s": keys.STEP_TIME,
    "rollout_time_s": keys.ROLLOUT_TIME,
}
DRAWS, SEED = 2000, 1234


def _finite(values):
    return [v for v in values if v is not None and math.isfinite(v)]


# The engine logs these as per-sample means; as every other report of the kit, they are counted in tokens
# per step (x the global batch size), not as the engine's mean (3.5 where the step had 56 mismatched tokens).
TOKEN_COUNTS = ("mismatch_count",)


def _run_values(run, metric: str, key: str) -> list[float]:
    scale = run.global_batch_size if metric in TOKEN_COUNTS else 1
    return [v * scale for v in _finite(run.values(key))]


def _seed_of(arm) -> int | None:
    seed = manifest_workload(arm.manifest).get("seed") if arm.manifest else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None   # JSON true is no seed


def _groups(arms) -> dict[str, list]:
    groups: dict[str, list] = {}
    for arm in arms:
        groups.setdefault(arm.name, []).append(arm)
    for name, runs in groups.items():
        seeds = [_seed_of(r) for r in runs]
        known = [s for s in seeds if s is not None]
        if len(set(known)) != len(known):
            raise BadInput(f"arm {name}: two runs have the same seed ({', '.join(str(r.run_dir or r.log_path) for r in runs)}); "
                           "replicates need distinct seeds")
    return groups


def two_level_bootstrap(ref_runs, other_runs, draws: int = DRAWS, seed: int = SEED):
    """2.5/97.5 percentiles of mean(other) − mean(reference), resampling seeds then steps."""
    import numpy as np

    ref_means, other_means = two_level_resamples(ref_runs, other_runs, draws, seed)
    lo, hi = np.percentile(other_means - ref_means, [2.5, 97.5])
    return float(lo), float(hi)


def two_level_resamples(ref_runs, other_runs, draws: int = DRAWS, seed: int = SEED):
    """``(reference, other)``: each arm's mean at every draw, resampling seeds then steps (one rng, the
    reference drawn after the other, as the noise floor's CI always drew them)."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def arm_means(runs):
        per_seed = np.empty((draws, len(runs)))
        for s, values in enumerate(runs):
            v = np.asarray(values, dtype=float)
            per_seed[:, s] = v[rng.integers(0, len(v), size=(draws, len(v)))].mean(axis=1)
        pick = rng.integers(0, len(runs), size=(draws, len(runs)))
        return np.take_along_axis(per_seed, pick, axis=1).mean(axis=1)

    other_means = arm_means(other_runs)
    return arm_means(ref_runs), other_means


def _floor(means) -> dict:
    if len(means) < 2:
        return {"seeds": len(means), "range": None, "std": None}
    return {"seeds": len(means), "range": max(means) - min(means), "std": statistics.stdev(means)}


def analyze_replicates(arms, draws: int = DRAWS, seed: int = SEED) -> dict:
    """The analysis-replicates/v1 document (module doc)."""
    groups = _groups(arms)
    names = list(groups)
    values = {n: {m: [_run_values(r, m, key) for r in runs] for m, key in METRICS.items()} for n, runs in groups.items()}
    arms_doc = []
    for name, runs in groups.items():
        metrics = {}
        for m in METRICS:
            per_run = [statistics.fmean(v) if v else None for v in values[name][m]]
            if any(p is None for p in per_run):
                continue
            metrics[m] = {"seed_means": per_run, "mean": statistics.fmean(per_run), "noise_floor": _floor(per_run)}
        arms_doc.append({"arm": name, "runs": [{"source": str(r.run_dir or r.log_path), "seed": _seed_of(r),
                                               "steps": len(r.steps)} for r in runs], "metrics": metrics})
    by_name = {a["arm"]: a for a in arms_doc}
    diffs = []
    for other in names[1:]:
        ref = names[0]
        out = {}
        for m in METRICS:
            a, b = by_name[ref]["metrics"].get(m), by_name[other]["metrics"].get(m)
            if a is None or b is None:
                continue
            diff = b["mean"] - a["mean"]
            lo, hi = two_level_bootstrap(values[ref][m], values[other][m], draws, seed)
            floors = [x["noise_floor"]["range"] for x in (a, b)]
            out[m] = {"difference": diff, "ci95_low": lo, "ci95_high": hi,
                      "noise_floor": None if None in floors else max(floors), **_verdict(m, ref, other, diff, lo, hi, floors)}
        diffs.append({"reference": ref, "other": other, "metrics": out})
    return {"schema": SCHEMA, "bootstrap": {"draws": draws, "seed": seed, "method": "two-level: seeds, then steps"},
            "noise_floor_definition": "range (max - min) of the per-seed means of one arm: the largest gap between two runs that differ only in seed",
            "arms": arms_doc, "differences": diffs}


def _verdict(metric, ref, other, diff, lo, hi, floors) -> dict:
    if None in floors:
        short = [n for n, f in zip((ref, other), floors) if f is None]
        return {"exceeds_noise_floor": None,
                "verdict": f"{metric}: {other} - {ref} = {diff:+.6g}; no noise floor: {', '.join(short)} has one seed"}
    floor = max(floors)
    exceeds = abs(diff) > floor and not lo <= 0.0 <= hi
    words = "exceeds" if exceeds else "does not exceed"
    return {"exceeds_noise_floor": exceeds,
            "verdict": f"{metric}: {other} - {ref} = {diff:+.6g} [95% CI {lo:+.6g}, {hi:+.6g}] {words} the noise floor "
                       f"{floor:.6g} (largest gap between seeds of one arm)"}
