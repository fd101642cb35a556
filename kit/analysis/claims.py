"""Evaluating a sealed claim: exactly the analysis it declared, over exactly the runs it declared.

Every given run is re-verified (``kit verify``) and held to the claim (bound to its sha256, one of its
declared run ids, the declared arm, seed and rollouts); a run that is not is named and refused. A
declared run that is missing, failed or refused makes the verdict ``incomplete``: never dropped
silently. With every run counted, each criterion's metric is read per step (steps from ``steady_from``,
count metrics in tokens: the engine's per-sample mean x the global batch size, optionally per 1k
response tokens), each run's mean taken, and the two arms compared with the two-level bootstrap of
``kit analyze replicates`` (seeds, then steps) at the criterion's draws and seed; its rule gives its
sub-verdict, and ``claim_verdict`` combines them. The identity of the pair (the first seed of each arm)
is ``kit compare``'s: controlled or not, pinned or same-host. Example::

    doc = evaluate_claim(read_sealed_claim(Path("c.sealed.json")), [Path("ws/runs/c-reference-s1"), ...], Path("ws"))
    doc["verdict"]          # 'supported'
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from kit.analysis.replicates import two_level_resamples
from kit.analysis.table import load_arm
from kit.engines.vime import keys
from kit.evidence import bundle as E
from kit.evidence.audit import verify_run_dir
from kit.evidence.claims import (DOES_NOT_PROVE, INCOMPLETE, INCONCLUSIVE, ROLES, VERDICT_SCHEMA, Claim, Criterion,
                                 binding_problems, claim_verdict, decide, rule_text)
from kit.evidence.compare import compare_run_dirs, run_standing
from kit.model.documents import read_json_file, sha256_of_document
from kit.model.errors import KitError

# metric -> (log key, multiplied by the global batch size: a per-sample mean made a count of tokens)
METRICS = {
    "mismatch_count": (keys.MISMATCH_COUNT, True), "mean_abs_dlogp": (keys.MEAN_ABS_DIFF, False),
    "max_abs_dlogp": (keys.MAX_ABS_DIFF, False), "step_time_s": (keys.STEP_TIME, False),
    "rollout_time_s": (keys.ROLLOUT_TIME, False), "reward": (keys.REWARDS, False),
    "raw_reward": (keys.RAW_REWARD, False), "response_length": (keys.RESPONSE_LENGTHS, False),
}
UNITS = {"mismatch_count": "tokens per step", "mean_abs_dlogp": "nats", "max_abs_dlogp": "nats", "step_time_s": "s",
         "rollout_time_s": "s", "reward": "reward", "raw_reward": "reward", "response_length": "tokens"}


def metric_values(arm, metric: dict) -> list[float]:
    """The claim's metric at each step of one run, steps ≥ ``steady_from``, missing values left out."""
    key, count = METRICS[metric["name"]]
    gbs = arm.global_batch_size
    values = arm.values(key)
    resp = arm.values(keys.RESPONSE_LENGTHS)
    out = []
    for step, v, r in zip(arm.step_indices, values, resp):
        if step < metric["steady_from"] or v is None:
            continue
        v = v * gbs if count else v
        if metric["length_control"] == "per-1k-response-tokens":
            if not r:
                continue
            v = v / (gbs * r / 1000.0)
        out.append(v)
    return out


def _token_totals(arms: dict, steady_from: int) -> dict:
    """Mismatched and compared tokens of each arm over its runs' steps ≥ ``steady_from``: the engine's
    per-sample mean of each (``train_current_rollout_logprob_mismatch_count`` and ``…_numel``) x the
    global batch size, per step; for the gpu engine that is exactly its own count of compared tokens
    (samples x response tokens)."""
    def total(runs, key):
        return math.fsum(v * a.global_batch_size for a in runs for step, v in zip(a.step_indices, a.values(key))
                         if v is not None and step >= steady_from)

    return {"treatment_mismatches": total(arms["treatment"], keys.MISMATCH_COUNT),
            "reference_mismatches": total(arms["reference"], keys.MISMATCH_COUNT),
            "treatment_tokens": total(arms["treatment"], keys.NUMEL),
            "reference_tokens": total(arms["reference"], keys.NUMEL)}


def statistics_of(criterion: Criterion, names: dict, arms: dict) -> dict:
    """One criterion's per-arm seed means and the difference and ratio (treatment vs reference) with two-level
    bootstrap CIs, and the token totals for the zero-and-positive rule. ``names``: role -> arm name."""
    import numpy as np

    metric = criterion.metric
    per_run = {role: [metric_values(a, metric) for a in arms[role]] for role in ROLES}
    empty = [f"{role} seed {i + 1}" for role in ROLES for i, v in enumerate(per_run[role]) if not v]
    if empty:
        return {"error": f"no value of {metric['name']} at steps ≥ {metric['steady_from']} in {', '.join(empty)}"}
    boot = metric["bootstrap"]
    ref_draws, trt_draws = two_level_resamples(per_run["reference"], per_run["treatment"], boot["draws"], boot["seed"])
    means = {role: [statistics.fmean(v) for v in per_run[role]] for role in ROLES}
    ref, trt = statistics.fmean(means["reference"]), statistics.fmean(means["treatment"])
    diff = trt_draws - ref_draws
    lo, hi = np.percentile(diff, [2.5, 97.5])
    out = {"metric": metric["name"], "unit": UNITS[metric["name"]]
           + (" per 1k response tokens" if metric["length_control"] != "none" else ""),
           "arms": {role: {"name": names[role], "seed_means": means[role],
                           "mean": statistics.fmean(means[role]),
                           "noise_floor": max(means[role]) - min(means[role]) if len(means[role]) > 1 else None,
                           "steps": [len(v) for v in per_run[role]]} for role in ROLES},
           "difference": {"estimate": trt - ref, "ci95_low": float(lo), "ci95_high": float(hi)},
           "ratio": None, "bootstrap": dict(boot, method="two-level: seeds, then steps")}
    if ref != 0 and bool(np.all(ref_draws != 0)):
        rlo, rhi = np.percentile(trt_draws / ref_draws, [2.5, 97.5])
        out["ratio"] = {"estimate": trt / ref, "ci95_low": float(rlo), "ci95_high": float(rhi)}
    if criterion.rule["kind"] == "zero-and-positive":
        out["totals"] = _token_totals(arms, metric["steady_from"])
    return out


def _given_runs(claim: Claim, run_dirs: list[Path]) -> tuple[dict, list[dict]]:
    """``({run_id: run_dir}, refused)``: the given runs held to the claim."""
    accepted, refused = {}, []
    for run_dir in run_dirs:
        try:
            manifest = E.read_manifest(run_dir)
        except KitError as exc:
            refused.append({"run": str(run_dir), "reason": str(exc)})
            continue
        problems = binding_problems(claim, manifest)
        if problems:
            refused.append({"run": str(run_dir), "reason": "; ".join(problems)})
        elif manifest["run_id"] in accepted:
            refused.append({"run": str(run_dir), "reason": f"run id {manifest['run_id']} given twice"})
        else:
            accepted[manifest["run_id"]] = run_dir
    return accepted, refused


def bound_in_workspace(claim: Claim, workspace: Path) -> list[Path]:
    """Every run dir under ``<workspace>/runs`` whose manifest is bound to this claim."""
    found = []
    runs = Path(workspace) / E.RUNS_DIR
    for manifest in sorted(runs.glob(f"*/{E.MANIFEST}")) if runs.is_dir() else []:
        try:
            doc = read_json_file(manifest)
        except KitError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("claim"), dict) and doc["claim"].get("sha256") == claim.sha256:
            found.append(manifest.parent.resolve())
    return found


def evaluate_claim(claim: Claim, run_dirs: list[Path], workspace: Path) -> dict:
    """The claim-verdict/v2 document, unsealed (kit.evidence.claims.seal_verdict seals it)."""
    run_dirs = [Path(p).resolve() for p in run_dirs] or bound_in_workspace(claim, workspace)
    accepted, refused = _given_runs(claim, run_dirs)
    given = {str(p) for p in run_dirs}
    for other in bound_in_workspace(claim, workspace):
        if str(other.resolve()) not in given:
            refused.append({"run": str(other), "reason": f"bound to claim {claim.name} in the workspace but not given"})
    runs, reasons = [], []
    for declared in claim.runs:
        run_dir = accepted.get(declared.run_id)
        entry = {"run_id": declared.run_id, "role": declared.role, "seed": declared.seed, "status": "missing",
                 "run_dir": str(run_dir) if run_dir else None, "seal_sha256": None, "problems": []}
        if run_dir is not None:
            checked = verify_run_dir(run_dir)
            standing = run_standing(run_dir)
            entry["problems"] = [f"{p or '/'}: {m}" for p, m in checked.problems] + ([standing["reason"]] if standing else [])
            entry["status"] = "failed" if entry["problems"] else "counted"
            if entry["status"] == "counted":
                entry["seal_sha256"] = sha256_of_document(read_json_file(run_dir / E.SEAL))
        if entry["status"] != "counted":
            reasons.append(f"declared run {declared.run_id} ({declared.role}, seed {declared.seed}) is {entry['status']}"
                           + (f": {entry['problems'][0]}" if entry["problems"] else ""))
        runs.append(entry)
    reasons += [f"refused {r['run']}: {r['reason']}" for r in refused]
    criteria = [{"name": c.name, "metric": c.metric, "rule": c.rule, "rule_text": rule_text(c.rule, c.metric),
                 "statistics": None, "verdict": INCOMPLETE, "reasons": ["not evaluated: the claim's runs are incomplete"]}
                for c in claim.criteria]
    doc = {"schema": VERDICT_SCHEMA,
           "claim": {"name": claim.name, "sha256": claim.sha256, "path": str(Path(claim.path).resolve()),
                     "hypothesis": claim.hypothesis, "schema": claim.document["schema"]},
           "verdict": INCOMPLETE, "reasons": reasons, "criteria": criteria, "runs": runs, "refused": refused,
           "identity": {"provenance": None, "scope": None, "controlled": None, "differences": []},
           "does_not_prove": list(DOES_NOT_PROVE), "evaluated_at": E.utc_now()}
    if any(r["status"] != "counted" for r in runs):
        return doc
    by_role = {role: [load_arm(Path(r["run_dir"])) for r in runs if r["role"] == role] for role in ROLES}
    first = {role: next(r["run_dir"] for r in runs if r["role"] == role) for role in ROLES}
    pair = compare_run_dirs(Path(first["reference"]), Path(first["treatment"]))
    doc["identity"] = {"provenance": pair.provenance, "scope": pair.scope() or None, "controlled": pair.controlled,
                       "differences": [d.to_json() for d in pair.differences]}
    names = {role: claim.arms[role]["name"] for role in ROLES}
    for criterion, entry in zip(claim.criteria, criteria):
        stats = statistics_of(criterion, names, by_role)
        verdict, why = (INCONCLUSIVE, stats["error"]) if "error" in stats else decide(criterion.rule, stats)
        entry.update(statistics=stats, verdict=verdict, reasons=[why])
    said = [f"{c['name']}: {c['verdict']}: {c['reasons'][0]}" for c in criteria]
    doc["verdict"] = claim_verdict([c["verdict"] for c in criteria], controlled=pair.controlled)
    if not pair.controlled:
        said = ["the pair is not a controlled comparison (uncontrolled: " + ", ".join(d.path for d in pair.uncontrolled[:5])
                + "); the criteria alone said: " + "; ".join(said)]
    doc["reasons"] = said
    return doc
