"""Performance decomposition of VIME steps, and the statistics that compare arms.

Per step (formulas in docs/analysis.md)::

    rollout generation     = perf/rollout_time
    weight update          = perf/update_weights_time
    wake/offload residual  = perf/train_wait_time - perf/rollout_time - perf/update_weights_time
    actor training         = perf/actor_train_time
    train residual         = perf/train_time - perf/actor_train_time
    unattributed           = perf/step_time - perf/train_wait_time - perf/train_time

Example::

    report = analyze_perf(load_arms([Path("G10.log"), Path("G11.log")]), steady_from=1)
    report.summary["subsets"]["all"]["comparisons"][0]["metrics"]["step_time_s"]["bootstrap"]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kit.analysis import length_control
from kit.analysis.alignment import alignment, incomplete_steps, step_ranges
from kit.analysis.comparability import CONTROLLED_LABEL, DESCRIPTIVE_LABEL, Comparability, assess
from kit.analysis.stats import BOOTSTRAP_DRAWS, BOOTSTRAP_SEED, DESCRIPTIVES, SCHEMES, Resampler, describe
from kit.analysis.table import manifest_arm
from kit.model.errors import BadInput
from kit import __version__
from kit.engines.vime import keys

STAGES = (
    # (id, label, step-metrics column, formula)
    ("rollout_generation", "rollout generation", "rollout_time_s", keys.ROLLOUT_TIME),
    ("weight_update", "weight update", "update_weights_time_s", keys.UPDATE_WEIGHTS_TIME),
    ("wake_offload_residual", "wake/offload residual", "wait_residual_time_s",
     f"{keys.TRAIN_WAIT_TIME} - {keys.ROLLOUT_TIME} - {keys.UPDATE_WEIGHTS_TIME}"),
    ("actor_training", "actor training", "actor_train_time_s", keys.ACTOR_TRAIN_TIME),
    ("train_residual", "train residual", "train_residual_time_s", f"{keys.TRAIN_TIME} - {keys.ACTOR_TRAIN_TIME}"),
    ("unattributed", "unattributed", "unattributed_time_s",
     f"{keys.STEP_TIME} - {keys.TRAIN_WAIT_TIME} - {keys.TRAIN_TIME}"),
)

# step-metrics.csv columns, in order
COLUMNS = (
    "arm", "step", "response_length_mean", "prompt_length_mean", "total_length_mean",
    "response_tokens_total", "total_tokens_total", "rollout_time_s", "rollout_progress_time_s_rounded",
    "rollout_tok_per_gpu_s", "rollout_aggregate_tok_s", "rollout_s_per_1k_response_tokens",
    "rollout_truncated_ratio", "update_weights_time_s", "wait_residual_time_s", "train_wait_time_s",
    "actor_train_time_s", "train_residual_time_s", "train_time_s", "data_preprocess_time_s",
    "unattributed_time_s", "step_time_s", "step_s_per_1k_response_tokens", "actor_train_tok_s",
    "actor_train_tflops", "log_probs_time_s", "ref_log_probs_time_s", "actor_train_tok_per_gpu_s",
    "step_response_tok_per_gpu_s", "fully_truncated", "joint_fully_truncated", "steady", "comparison",
)
# comparison: as in summary.csv — "reference" or "single arm" for the first arm, else whether that arm
# against the reference is a "controlled comparison" or "descriptive, not causal"
FLAGS = ("arm", "step", "fully_truncated", "joint_fully_truncated", "steady", "comparison")
NUMERIC = tuple(c for c in COLUMNS if c not in FLAGS)
# metrics whose arm differences get a bootstrap CI
COMPARED = (
    "step_time_s", "rollout_time_s", "update_weights_time_s", "wait_residual_time_s", "actor_train_time_s",
    "train_residual_time_s", "train_time_s", "rollout_tok_per_gpu_s", "rollout_aggregate_tok_s",
    "actor_train_tok_s", "response_length_mean", "unattributed_time_s", "log_probs_time_s",
    "ref_log_probs_time_s", "actor_train_tok_per_gpu_s", "step_response_tok_per_gpu_s",
)
# the log keys behind the raw columns, to name what a log lacks
SOURCE_KEYS = {
    "rollout_time_s": keys.ROLLOUT_TIME, "update_weights_time_s": keys.UPDATE_WEIGHTS_TIME,
    "train_wait_time_s": keys.TRAIN_WAIT_TIME, "actor_train_time_s": keys.ACTOR_TRAIN_TIME,
    "train_time_s": keys.TRAIN_TIME, "data_preprocess_time_s": keys.DATA_PREPROCESS_TIME,
    "step_time_s": keys.STEP_TIME, "rollout_tok_per_gpu_s": keys.TOKENS_PER_GPU_PER_SEC,
    "actor_train_tok_s": keys.ACTOR_TRAIN_TOK_PER_S, "actor_train_tflops": keys.ACTOR_TRAIN_TFLOPS,
    "total_length_mean": keys.TOTAL_LENGTHS, "response_length_mean": keys.RESPONSE_LENGTHS,
    "rollout_truncated_ratio": keys.TRUNCATED_RATIO, "log_probs_time_s": keys.LOG_PROBS_TIME,
    "ref_log_probs_time_s": keys.REF_LOG_PROBS_TIME,
}


def _sub(a, b):
    return None if a is None or b is None else a - b


def _div(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _mul(a, k):
    return None if a is None or k is None else a * k


def arm_gpus(arm, override: int | None = None) -> int | None:
    """GPUs the arm ran on: ``--gpus``, else the manifest arm's topology.gpus, else unknown (None)."""
    if override is not None:
        return override
    topology = manifest_arm(arm.manifest).get("topology") if arm.manifest else None
    gpus = topology.get("gpus") if isinstance(topology, dict) else None
    return gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else None


def step_rows(arm, steady_from: int = 1, gpus: int | None = None) -> list[dict]:
    """One row per step of the arm with the columns of step-metrics.csv (None where unknown).

    Per-GPU throughputs divide by ``gpus`` (all GPUs of the run, trainer and rollout colocated).
    """
    v = {key: arm.values(key) for key in (
        keys.RESPONSE_LENGTHS, keys.RESPONSE_LEN_MEAN, keys.TOTAL_LENGTHS,
        keys.TRUNCATED_RATIO, keys.TRUNCATED, keys.ROLLOUT_TIME, keys.TOKENS_PER_GPU_PER_SEC,
        keys.UPDATE_WEIGHTS_TIME, keys.TRAIN_WAIT_TIME, keys.ACTOR_TRAIN_TIME, keys.TRAIN_TIME,
        keys.DATA_PREPROCESS_TIME, keys.STEP_TIME, keys.ACTOR_TRAIN_TOK_PER_S, keys.ACTOR_TRAIN_TFLOPS,
        keys.LOG_PROBS_TIME, keys.REF_LOG_PROBS_TIME)}
    gbs = arm.global_batch_size
    rows = []
    for i, step in enumerate(arm.step_indices):
        resp = v[keys.RESPONSE_LENGTHS][i]
        resp = resp if resp is not None else v[keys.RESPONSE_LEN_MEAN][i]
        total = v[keys.TOTAL_LENGTHS][i]
        trunc = v[keys.TRUNCATED_RATIO][i]
        trunc = trunc if trunc is not None else v[keys.TRUNCATED][i]
        rollout, update = v[keys.ROLLOUT_TIME][i], v[keys.UPDATE_WEIGHTS_TIME][i]
        wait, actor, train = v[keys.TRAIN_WAIT_TIME][i], v[keys.ACTOR_TRAIN_TIME][i], v[keys.TRAIN_TIME][i]
        step_time = v[keys.STEP_TIME][i]
        resp_tokens = _mul(resp, gbs)
        progress = arm.progress_seconds[i] if arm.progress_seconds else None
        rows.append({
            "arm": arm.name, "step": step,
            "response_length_mean": resp, "prompt_length_mean": _sub(total, resp), "total_length_mean": total,
            "response_tokens_total": resp_tokens, "total_tokens_total": _mul(total, gbs),
            "rollout_time_s": rollout, "rollout_progress_time_s_rounded": progress,
            "rollout_tok_per_gpu_s": v[keys.TOKENS_PER_GPU_PER_SEC][i],
            "rollout_aggregate_tok_s": _div(resp_tokens, rollout),
            "rollout_s_per_1k_response_tokens": _div(rollout, _mul(resp_tokens, 1e-3)),
            "rollout_truncated_ratio": trunc,
            "update_weights_time_s": update,
            "wait_residual_time_s": _sub(_sub(wait, rollout), update),
            "train_wait_time_s": wait, "actor_train_time_s": actor,
            "train_residual_time_s": _sub(train, actor), "train_time_s": train,
            "data_preprocess_time_s": v[keys.DATA_PREPROCESS_TIME][i],
            "unattributed_time_s": _sub(_sub(step_time, wait), train),
            "step_time_s": step_time,
            "step_s_per_1k_response_tokens": _div(step_time, _mul(resp_tokens, 1e-3)),
            "actor_train_tok_s": v[keys.ACTOR_TRAIN_TOK_PER_S][i],
            "actor_train_tflops": v[keys.ACTOR_TRAIN_TFLOPS][i],
            "log_probs_time_s": v[keys.LOG_PROBS_TIME][i], "ref_log_probs_time_s": v[keys.REF_LOG_PROBS_TIME][i],
            "actor_train_tok_per_gpu_s": _div(_mul(total, gbs), _mul(actor, gpus)),
            "step_response_tok_per_gpu_s": _div(resp_tokens, _mul(step_time, gpus)),
            "fully_truncated": None, "joint_fully_truncated": False, "steady": step >= steady_from,
        })
    _mark_fully_truncated(arm, rows)
    return rows


def _mark_fully_truncated(arm, rows) -> None:
    # Every sample hit the cap: truncated ratio 1 and mean response length == max_response_len.
    # Without a manifest the cap is read off the data: the response length of ratio-1 steps.
    cap = arm.max_response_len
    if cap is None:
        caps = {r["response_length_mean"] for r in rows if r["rollout_truncated_ratio"] == 1.0}
        cap = max(caps) if caps else None
    for r in rows:
        if r["rollout_truncated_ratio"] is None or r["response_length_mean"] is None:
            continue
        r["fully_truncated"] = r["rollout_truncated_ratio"] == 1.0 and cap is not None \
            and r["response_length_mean"] == cap


def missing_keys(rows) -> list[str]:
    """Log keys no step of the arm carries (their columns are empty)."""
    return sorted(key for col, key in SOURCE_KEYS.items() if all(r[col] is None for r in rows))


SCHEMA = "rlk-kit/analysis-perf/v3"

SUBSETS = {
    "all": (lambda r: True, "every step"),
    "steady": (lambda r: r["steady"], "steps >= steady_from (warm-up excluded)"),
    "fully_truncated": (lambda r: r["fully_truncated"] is True,
                        "steps whose every sample hit max_response_len (truncated ratio 1)"),
    "joint_fully_truncated": (lambda r: r["joint_fully_truncated"],
                              "steps at which every arm is fully truncated (the same steps in each arm)"),
}


@dataclass(frozen=True)
class PerfReport:
    rows: tuple[dict, ...]          # step-metrics.csv rows, arms stacked in the order given
    summary: dict                   # summary.json (schema SCHEMA)
    summary_rows: tuple[dict, ...]  # summary.csv rows
    comparability: Comparability
    arm_names: tuple[str, ...]


SUMMARY_CSV_COLUMNS = (
    "subset", "metric", "arm", *DESCRIPTIVES,
    "reference_arm", "difference_vs_reference", "ci95_low", "ci95_high", "bootstrap_method",
    "percent_vs_reference", "percent_ci95_low", "percent_ci95_high", "reference_over_arm", "comparison",
)


def analyze_perf(arms, *, steady_from: int = 1, pairing: str = "auto", draws: int = BOOTSTRAP_DRAWS,
                 seed: int = BOOTSTRAP_SEED, scheme: str = "kit", length_lines: str = length_control.DEFAULT,
                 gpus: int | None = None, compare=None, accept_gate_sets: bool = False,
                 on_descriptives: Callable[[PerfReport], None] | None = None) -> PerfReport:
    """Everything ``kit analyze perf`` reports, as data. ``pairing`` is auto, paired or unpaired;
    ``scheme`` the bootstrap's (stats.SCHEMES); ``length_lines`` which length control leads (shared,
    per-arm; both are reported); ``gpus`` overrides each manifest's topology.gpus.

    ``on_descriptives`` is called with a partial report (rows, comparability, the all-steps subset's
    descriptive statistics; no comparison yet) before the bootstrap, so that figures which need no more
    can be drawn while it runs.

    Pairing is decided per subset and pair of arms: paired only when both arms have the subset's
    steps at the same indices (a subset such as fully_truncated can hold different steps per arm even
    when the runs share every step index); ``--paired`` additionally requires the runs to share them.
    """
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadInput(f"arm name(s) {', '.join(dupes)} given twice; rename with --name (one per run, in order)")
    if pairing not in ("auto", "paired", "unpaired"):
        raise BadInput(f"pairing {pairing!r}: expected auto, paired or unpaired")
    if scheme not in SCHEMES:
        raise BadInput(f"bootstrap scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    if length_lines not in ("shared", "per-arm"):
        raise BadInput(f"length lines {length_lines!r}: expected shared or per-arm")
    per_arm = {a.name: step_rows(a, steady_from, arm_gpus(a, gpus)) for a in arms}
    _mark_joint_fully_truncated(per_arm)
    shared = len({a.step_indices for a in arms}) == 1
    if pairing == "paired" and not shared:
        steps = "; ".join(f"{a.name}: {len(a.step_indices)} steps {a.step_indices[0]}..{a.step_indices[-1]}"
                          for a in arms)
        raise BadInput(f"--paired needs every arm to have the same step indices ({steps}); use --unpaired")
    verdict = assess(arms, compare, accept_gate_sets=accept_gate_sets)
    resampler = Resampler(draws, seed, scheme)

    subsets, chosen_of, stats_of = {}, {}, {}
    for subset, (keep, definition) in SUBSETS.items():
        chosen_of[subset] = chosen = {n: [r for r in rows if keep(r)] for n, rows in per_arm.items()}
        stats_of[subset] = {n: {col: describe([r[col] for r in rows]) for col in NUMERIC} for n, rows in chosen.items()}
        subsets[subset] = {"definition": definition,
                           "arms": {n: {"steps": len(rows), "metrics": stats_of[subset][n]} for n, rows in chosen.items()},
                           "comparisons": []}
    if on_descriptives is not None:
        # copies: the rows get their comparison label below, while a drawing process may still be reading these
        early = {"subsets": {"all": {**subsets["all"], "comparisons": []}},     # arms: the figures' labels and colours
                 "arms": [{"name": a.name, "run_dir": str(a.run_dir) if a.run_dir else None} for a in arms]}
        on_descriptives(PerfReport(tuple(dict(r) for n in names for r in per_arm[n]), early, (), verdict,
                                   tuple(names)))
    summary_rows = []
    for subset in SUBSETS:
        chosen, stats, block = chosen_of[subset], stats_of[subset], subsets[subset]
        ref = names[0]
        for other in names[1:]:
            block["comparisons"].append(_compare(ref, other, chosen, stats, pairing, resampler, verdict))
        comparisons = {c["other"]: c for c in block["comparisons"]}
        for name in names:
            for col in NUMERIC:
                d = stats[name][col]
                if d["n"] == 0:
                    continue
                row = {"subset": subset, "metric": col, "arm": name, **{k: d[k] for k in DESCRIPTIVES}}
                c = comparisons.get(name)
                m = c["metrics"].get(col) if c else None
                pct = ((m["bootstrap"] or {}).get("percent") or {}) if m else {}
                row.update({
                    "reference_arm": ref if c else "",
                    "difference_vs_reference": m["difference"] if m else None,
                    "ci95_low": (m["bootstrap"] or {}).get("ci95_low") if m else None,
                    "ci95_high": (m["bootstrap"] or {}).get("ci95_high") if m else None,
                    "bootstrap_method": (m["bootstrap"] or {}).get("method", "") if m else "",
                    "percent_vs_reference": pct.get("estimate"), "percent_ci95_low": pct.get("ci95_low"),
                    "percent_ci95_high": pct.get("ci95_high"),
                    "reference_over_arm": m["reference_over_other"] if m else None,
                    "comparison": _row_label(verdict, name, names),
                })
                summary_rows.append(row)

    for name in names:
        label = _row_label(verdict, name, names)
        for r in per_arm[name]:
            r["comparison"] = label
    all_rows = [r for n in names for r in per_arm[n]]
    methods = {c["bootstrap_method"] for c in subsets["all"]["comparisons"]} or \
        {"unpaired" if pairing == "unpaired" else "paired"}  # one arm: what its steps would allow
    label_of = _label_of(verdict)
    per_arm_lines = length_control.per_arm_fits(names, all_rows, label_of)
    summary = {
        "schema": SCHEMA,
        "kit_version": _kit_version(),
        "arms": [_arm_json(a, per_arm[a.name], arm_gpus(a, gpus)) for a in arms],
        "comparison": verdict.to_json(),
        "settings": {"steady_from": steady_from, "pairing_requested": pairing,
                     # the all-steps subset's; each subset's comparisons[] say their own
                     "pairing_used": "paired" if methods == {"paired"} else "unpaired",
                     "bootstrap": {"draws": draws, "seed": seed, "scheme": scheme, "scheme_definition": SCHEMES[scheme],
                                   "statistic": "mean(arm) - mean(reference); percent: 100*(mean(arm)/mean(reference) - 1)",
                                   "interval": "percentile 2.5/97.5"},
                     "length_lines": length_lines, "gpus_override": gpus},
        "alignment": alignment(arms, per_arm, COMPARED),
        "stages": [{"id": s, "label": lbl, "column": col, "formula": f} for s, lbl, col, f in STAGES],
        "subsets": subsets,
        "stage_contributions": _stage_contributions(names, subsets["all"], verdict),
        "throughput": _pooled_throughput(names, per_arm),
        "speedups": _speedups(names, subsets["all"], verdict),
        "regressions": length_control.shared_fits(names, all_rows, label_of),
        "length_control": {"default": length_control.DEFAULT, "leading": length_lines,
                           "why_default": length_control.WHY_DEFAULT, "per_arm": per_arm_lines,
                           "notes": [f"{d['response']}: the slope of {', '.join(d['slopes_differ'])} differs from "
                                     f"{names[0]}'s (interaction CI excludes 0); the gap depends on length"
                                     for d in per_arm_lines if d["slopes_differ"]]},
    }
    return PerfReport(tuple(all_rows), summary, tuple(summary_rows), verdict, tuple(names))


def _kit_version() -> str:

    return __version__


def _arm_json(arm, rows, gpus) -> dict:
    return {"gpus": gpus,
        "name": arm.name, "log": str(arm.log_path), "run_dir": str(arm.run_dir) if arm.run_dir else None,
        "bare_log": arm.is_bare_log, "steps": len(rows), "first_step": rows[0]["step"], "last_step": rows[-1]["step"],
        "global_batch_size": arm.global_batch_size, "global_batch_size_origin": arm.global_batch_size_origin,
        "max_response_len": arm.max_response_len,
        "fully_truncated_steps": sum(1 for r in rows if r["fully_truncated"] is True),
        "missing_log_keys": missing_keys(rows), "notes": list(arm.notes),
        "verification": _verification(arm),
    }


def _verification(arm) -> dict:
    # a bare log has nothing to verify; a run dir is verified as kit verify does (table._evidence_problems)
    if arm.manifest is None:
        return {"status": "bare log", "problems": []}
    problems = list(arm.evidence_problems)
    return {"status": "failed" if problems else "verified", "problems": problems}


def _compare(ref, other, chosen, stats, pairing, resampler, verdict) -> dict:
    label = _label(verdict, other)
    ref_rows, other_rows = chosen[ref], chosen[other]
    ref_steps, other_steps = [r["step"] for r in ref_rows], [r["step"] for r in other_rows]
    # Pair only when this subset holds the same steps in both arms: pairing over the common steps
    # would estimate the difference on a sample other than the one the means describe.
    if pairing == "unpaired":
        paired, why = False, "unpaired requested"
    elif ref_steps == other_steps:
        paired, why = True, f"both arms have the same {len(ref_steps)} step indices in this subset"
    else:
        common = len(set(ref_steps) & set(other_steps))
        paired, why = False, (f"the arms' steps in this subset differ ({len(ref_steps)} and {len(other_steps)} "
                              f"steps, {common} in common)")
    metrics, jobs, gaps_of = {}, [], {}
    for col in COMPARED:
        if stats[ref][col]["mean"] is None or stats[other][col]["mean"] is None:
            continue
        gaps_of[col] = sorted(set(incomplete_steps(ref_rows, col)) | set(incomplete_steps(other_rows, col)))
        # A step without a value on one side cannot be paired; pairing the rest would put a CI on a
        # different number than the difference of means printed beside it, so this metric goes unpaired.
        jobs.append(([r[col] for r in ref_rows], [r[col] for r in other_rows], paired and not gaps_of[col]))
    for (col, gaps), boot in zip(gaps_of.items(), resampler.many(jobs)):    # all metrics resampled at once
        a_mean, b_mean = stats[ref][col]["mean"], stats[other][col]["mean"]
        metrics[col] = {"reference_mean": a_mean, "other_mean": b_mean, "difference": b_mean - a_mean,
                        "reference_over_other": _div(a_mean, b_mean), "bootstrap": boot,
                        "n_reference": stats[ref][col]["n"], "n_other": stats[other][col]["n"],
                        "incomplete_steps": gaps,
                        "note": (f"unpaired: step(s) {step_ranges(gaps)} lack a value in one arm" if paired and gaps
                                 else None)}
    return {"reference": ref, "other": other, "label": label, "bootstrap_method": "paired" if paired else "unpaired",
            "paired_steps": len(ref_steps) if paired else None, "pairing_reason": why, "metrics": metrics}


def _row_label(verdict, name, names) -> str:
    """The comparison column of step-metrics.csv and summary.csv for one arm's rows."""
    if len(names) < 2:
        return "single arm"
    return "reference" if name == names[0] else _label(verdict, name)


def _label(verdict, other) -> str:
    pair = verdict.pair(other)
    return CONTROLLED_LABEL if pair is not None and pair.controlled else DESCRIPTIVE_LABEL


def _stage_contributions(names, block, verdict) -> list[dict]:
    out = []
    ref = names[0]
    for other in names[1:]:
        a, b = block["arms"][ref]["metrics"], block["arms"][other]["metrics"]
        gap = _sub(b["step_time_s"]["mean"], a["step_time_s"]["mean"])
        stages = {}
        for sid, _, col, _ in STAGES:
            d = _sub(b[col]["mean"], a[col]["mean"])
            stages[sid] = {"difference_s": d, "share_of_step_difference": _div(d, gap)}
        out.append({"reference": ref, "other": other, "step_time_difference_s": gap,
                    "label": _label(verdict, other), "stages": stages})
    return out


def _pooled_throughput(names, per_arm) -> dict:
    # pooled rates weight each step by its size: Σ tokens / Σ seconds
    out = {}
    for n in names:
        rows = per_arm[n]
        pairs_r = [(r["response_tokens_total"], r["rollout_time_s"]) for r in rows
                   if r["response_tokens_total"] is not None and r["rollout_time_s"] is not None]
        pairs_s = [(r["response_tokens_total"], r["step_time_s"]) for r in rows
                   if r["response_tokens_total"] is not None and r["step_time_s"] is not None]
        out[n] = {
            "rollout_response_tok_s_pooled": _div(sum(t for t, _ in pairs_r), sum(s for _, s in pairs_r)) if pairs_r else None,
            "end_to_end_response_tok_s_pooled": _div(sum(t for t, _ in pairs_s), sum(s for _, s in pairs_s)) if pairs_s else None,
            "response_tokens_total": sum(t for t, _ in pairs_s) if pairs_s else None,
            "step_time_total_hours": sum(s for _, s in pairs_s) / 3600.0 if pairs_s else None,
        }
    return out


def _speedups(names, block, verdict) -> list[dict]:
    out = []
    ref = names[0]
    a = block["arms"][ref]["metrics"]
    for other in names[1:]:
        b = block["arms"][other]["metrics"]
        pair = verdict.pair(other)
        out.append({
            "reference": ref, "other": other,
            "label": _label(verdict, other), "controlled": pair.controlled,
            "end_to_end_other_over_reference": _div(b["step_time_s"]["mean"], a["step_time_s"]["mean"]),
            "step_time_reduction_fraction_of_reference": (None if _div(a["step_time_s"]["mean"], b["step_time_s"]["mean"]) is None
                                                          else 1.0 - a["step_time_s"]["mean"] / b["step_time_s"]["mean"]),
            "rollout_throughput_reference_over_other": _div(a["rollout_tok_per_gpu_s"]["mean"], b["rollout_tok_per_gpu_s"]["mean"]),
            "actor_throughput_reference_over_other": _div(a["actor_train_tok_s"]["mean"], b["actor_train_tok_s"]["mean"]),
        })
    return out


def _label_of(verdict):
    def label_of(other):
        pair = verdict.pair(other)
        return _label(verdict, other), pair is not None and pair.controlled
    return label_of


def _mark_joint_fully_truncated(per_arm) -> None:
    # the joint length-cap subset: steps at which every arm hit the cap, so the arms are paired there
    sets = [{r["step"] for r in rows if r["fully_truncated"] is True} for rows in per_arm.values()]
    joint = set.intersection(*sets) if sets else set()
    for rows in per_arm.values():
        for r in rows:
            r["joint_fully_truncated"] = r["step"] in joint
