"""Convergence tables: runs.csv, rounds.csv (the 29 columns of the published bundle) and per-arm summaries.

VIME prints the train/rollout mismatch count and the compared-token count as per-sample means, so
the totals of a step are those means × the global batch size. Runs that share an arm name are
pooled into one group only when their manifests agree on everything but the seeds. Example::

    report = analyze_convergence(load_arms([Path("runs/g10"), Path("runs/g11")]))
    report.summary["summaries"][0]["bitwise_mismatch_rate"]
"""

from __future__ import annotations

from dataclasses import dataclass

from kit import __version__
from kit.analysis.comparability import assess
from kit.analysis.stats import exact_mean
from kit.analysis.table import manifest_arm, manifest_workload
from kit.engines.vime import keys
from kit.engines.vime.records import is_finite_number
from kit.evidence.compare import ARM_FIELDS_NOT_COMPARED, classify, compare_run_manifests, flatten
from kit.model.documents import read_json_file
from kit.model.errors import BadInput

RUNS_COLUMNS = (
    "phase", "run_id", "group", "seed", "rollout_seed", "num_rollout", "rl_kernel_revision", "vime_revision",
    "prompt_data_sha256", "cudagraph_passed", "validation_passed", "offline_tensor_comparison", "rounds_observed",
)
ROUNDS_COLUMNS = (
    "phase", "run_id", "group", "seed", "rollout_seed", "step", "framework_consistency", "operator_case",
    "reward", "raw_reward", "response_length", "truncated_ratio", "rollout_kl", "train_loss", "pg_loss",
    "pg_clipfrac", "entropy", "ppo_kl", "grad_norm", "mean_abs_dlogp", "max_abs_dlogp", "mismatch_count",
    "active_token_count", "rollout_time", "train_time", "step_time", "update_weights_time",
    "actor_tokens_per_second", "actor_train_tflops",
)
# rounds.csv column -> log keys tried in order
ROUND_KEYS = {
    "reward": (keys.REWARDS,),
    "raw_reward": (keys.RAW_REWARD,),
    "response_length": (keys.RESPONSE_LENGTHS, keys.RESPONSE_LEN_MEAN),
    "truncated_ratio": (keys.TRUNCATED, keys.TRUNCATED_RATIO),
    "rollout_kl": (keys.ROLLOUT_KL,),
    "train_loss": (keys.LOSS,),
    "pg_loss": (keys.PG_LOSS,),
    "pg_clipfrac": (keys.PG_CLIPFRAC,),
    "entropy": (keys.ENTROPY_LOSS,),
    "ppo_kl": (keys.PPO_KL,),
    "grad_norm": (keys.GRAD_NORM,),
    "mean_abs_dlogp": (keys.MEAN_ABS_DIFF,),
    "max_abs_dlogp": (keys.MAX_ABS_DIFF,),
    "mismatch_count": (keys.MISMATCH_COUNT,),
    "active_token_count": (keys.NUMEL,),
    "rollout_time": (keys.ROLLOUT_TIME,),
    "train_time": (keys.TRAIN_TIME,),
    "step_time": (keys.STEP_TIME,),
    "update_weights_time": (keys.UPDATE_WEIGHTS_TIME,),
    "actor_tokens_per_second": (keys.ACTOR_TRAIN_TOK_PER_S,),
    "actor_train_tflops": (keys.ACTOR_TRAIN_TFLOPS,),
}
PER_SAMPLE_MEANS = ("mismatch_count", "active_token_count")  # × global batch size
# what may differ between runs pooled under one name (kit compare paths)
POOLED_MAY_DIFFER = ("workload.seed", "workload.rollout_seed")
# the kit's validation.json gate for CUDA graphs; older reports carried {"cudagraph": {"passed": bool}}
CUDA_GRAPH_GATE = "cuda-graph-engine"
GATE_PASSED = {"passed": True, "failed": False}  # not_applicable and anything else: unknown
SUMMARY_FIELDS = (
    "phase", "group", "run_count", "round_count", "active_token_exposure", "bitwise_mismatch_count",
    "bitwise_mismatch_rate", "mean_abs_dlogp_token_weighted", "max_abs_dlogp", "reward_mean", "raw_reward_mean",
    "truncated_ratio_mean", "step_time_mean", "actor_tokens_per_second_mean", "unweighted_mean_abs_dlogp",
)


def _lookup(doc, *path):
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def _source_commit(manifest: dict, wanted: str) -> str | None:
    # the historical manifest keeps revisions.{rl_kernel,vime}; a kit manifest keeps stack sources
    for holder in (manifest.get("revisions"), _lookup(manifest, "observed", "revisions")):
        if isinstance(holder, dict):
            for key, value in holder.items():
                if _norm(key) == wanted and isinstance(value, str):
                    return value
    stacks = (_lookup(manifest, "stack", "document"), manifest.get("stack"), _lookup(manifest, "arm", "stack"))
    for stack in stacks:
        sources = _lookup(stack, "sources") if isinstance(stack, dict) else None
        for src in sources if isinstance(sources, list) else []:
            if isinstance(src, dict) and _norm(str(src.get("name", ""))) == wanted:
                commit = src.get("commit") or src.get("revision")
                if isinstance(commit, str):
                    return commit
    return None


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _validation(arm) -> dict | None:
    if arm.run_dir is None:
        return None
    for name in ("run-validation.json", "validation.json"):
        path = arm.run_dir / name
        if path.is_file():

            doc = read_json_file(path)
            return doc if isinstance(doc, dict) else None
    return None


def _cudagraph_passed(validation: dict) -> bool | None:
    gates = validation.get("gates")
    if isinstance(gates, list):
        for gate in gates:
            if isinstance(gate, dict) and gate.get("id") == CUDA_GRAPH_GATE:
                return GATE_PASSED.get(gate.get("status"))
    return _lookup(validation, "cudagraph", "passed")


@dataclass(frozen=True)
class ConvergenceReport:
    runs: tuple[dict, ...]
    rounds: tuple[dict, ...]
    summary: dict


def run_identity(arm, phase: str | None = None) -> dict:
    """The runs.csv row of one run; fields the run does not record are empty."""
    manifest = arm.manifest or {}
    workload = manifest_workload(manifest) if manifest else {}
    base = arm.run_dir if arm.run_dir else arm.log_path
    validation = _validation(arm) or {}
    cudagraph = _cudagraph_passed(validation)
    return {
        "phase": phase if phase is not None else base.resolve().parent.name,
        "run_id": manifest.get("run_id") or (arm.run_dir.name if arm.run_dir else arm.log_path.stem),
        "group": arm.name,
        "seed": workload.get("seed", manifest.get("seed")),
        "rollout_seed": workload.get("rollout_seed", manifest.get("rollout_seed")),
        "num_rollout": workload.get("rollouts", manifest.get("num_rollout")),
        "rl_kernel_revision": _source_commit(manifest, "rlkernel"),
        "vime_revision": _source_commit(manifest, "vime"),
        "prompt_data_sha256": manifest.get("prompt_data_sha256") or _lookup(manifest, "inputs", "prompt_data", "sha256"),
        "cudagraph_passed": cudagraph if isinstance(cudagraph, bool) else None,
        "validation_passed": validation.get("passed") if isinstance(validation.get("passed"), bool) else None,
        "offline_tensor_comparison": validation.get("offline_tensor_comparison") or "unavailable",
        "rounds_observed": len(arm.steps),
    }


def round_rows(arm, identity: dict) -> list[dict]:
    arm_doc = manifest_arm(arm.manifest) if arm.manifest else {}
    reuse = arm_doc.get("use_rollout_logprobs", arm_doc.get("framework_use_rollout_logprobs"))
    case = _lookup(arm_doc, "operators", "logp") or arm_doc.get("logp_case")
    rows = []
    for step, rec in arm.steps.items():
        row = {k: identity[k] for k in ("phase", "run_id", "group", "seed", "rollout_seed")}
        row.update({"step": step, "framework_consistency": reuse if isinstance(reuse, bool) else None,
                    "operator_case": case})
        for col, candidates in ROUND_KEYS.items():
            value = next((rec.value(k) for k in candidates if rec.value(k) is not None), None)
            if not is_finite_number(value):      # junk types, nan and inf are missing values
                value = None
            elif col in PER_SAMPLE_MEANS:
                value = float(value) * arm.global_batch_size
            else:
                value = float(value)
            row[col] = value
        rows.append({c: row[c] for c in ROUNDS_COLUMNS})
    return rows


def _mean(rows, col):
    values = [r[col] for r in rows if r[col] is not None]
    return exact_mean(values) if values else None


def summarize(rows: list[dict], phase: str, group: str, run_count: int) -> dict:
    """One (phase, group) summary, formulas of the published collector (docs/analysis.md)."""
    tokens = [r["active_token_count"] for r in rows if r["active_token_count"] is not None]
    mism = [r["mismatch_count"] for r in rows if r["mismatch_count"] is not None]
    weighted = [(r["mean_abs_dlogp"], r["active_token_count"]) for r in rows
                if r["mean_abs_dlogp"] is not None and r["active_token_count"] is not None]
    total_tokens = sum(tokens) if tokens else None
    max_abs = [r["max_abs_dlogp"] for r in rows if r["max_abs_dlogp"] is not None]
    return {
        "phase": phase, "group": group, "run_count": run_count, "round_count": len(rows),
        "active_token_exposure": float(total_tokens) if tokens else None,
        "bitwise_mismatch_count": float(sum(mism)) if mism else None,
        "bitwise_mismatch_rate": (sum(mism) / total_tokens) if mism and total_tokens else None,
        "mean_abs_dlogp_token_weighted": (sum(a * t for a, t in weighted) / sum(t for _, t in weighted))
        if weighted and sum(t for _, t in weighted) else None,
        "max_abs_dlogp": max(max_abs) if max_abs else None,
        "reward_mean": _mean(rows, "reward"),
        "raw_reward_mean": _mean(rows, "raw_reward"),
        "truncated_ratio_mean": _mean(rows, "truncated_ratio"),
        "step_time_mean": _mean(rows, "step_time"),
        "actor_tokens_per_second_mean": _mean(rows, "actor_tokens_per_second"),
        "unweighted_mean_abs_dlogp": _mean(rows, "mean_abs_dlogp"),
    }


def analyze_convergence(arms, phase: str | None = None, compare=None, *, accept_gate_sets: bool = False) -> ConvergenceReport:

    runs, rounds = [], []
    for arm in arms:
        identity = run_identity(arm, phase)
        runs.append(identity)
        rounds.extend(round_rows(arm, identity))
    seen = {}
    for r in runs:
        key = (r["phase"], r["run_id"])
        if key in seen:
            raise BadInput(f"run id {r['run_id']!r} appears twice in phase {r['phase']!r}; each run is read once")
        seen[key] = True
    groups: dict = {}
    for r, arm in zip(runs, arms):
        groups.setdefault((r["phase"], r["group"]), []).append(arm)
    for (_, group), members in groups.items():
        for other in members[1:]:
            _refuse_unlike_pool(group, members[0], other)
    summaries = []
    for (ph, group), members in groups.items():
        rows = [r for r in rounds if r["phase"] == ph and r["group"] == group]
        summaries.append(summarize(rows, ph, group, len(members)))
    firsts = _one_per_group(arms)
    pooled: dict = {}
    for a in arms:
        if not any(a is f for f in firsts):
            pooled.setdefault(a.name, []).append(a)
    verdict = assess(firsts, compare, pooled, accept_gate_sets=accept_gate_sets)

    summary = {
        "schema": "rlk-kit/analysis-convergence/v1",
        "kit_version": __version__,
        "run_count": len(runs),
        "round_count": len(rounds),
        "runs": [{"run_id": a["run_id"], "group": a["group"], "phase": a["phase"],
                  "source": str(arm.run_dir or arm.log_path), "global_batch_size": arm.global_batch_size,
                  "global_batch_size_origin": arm.global_batch_size_origin}
                 for a, arm in zip(runs, arms)],
        "comparison": verdict.to_json(),
        "summaries": summaries,
    }
    return ConvergenceReport(tuple(runs), tuple(rounds), summary)


def pooled_differences(first, other) -> list[tuple[str, object, object]]:
    """(path, first's value, other's value) wherever two runs of one group differ, seeds aside.

    kit compare's run view is used (arm, stack content, image, observed identity, volatile fields
    removed); a manifest it cannot read (no stack) is compared by its arm document alone."""

    try:
        diffs = compare_run_manifests(first.manifest, other.manifest).differences
    except Exception:  # not a kit run manifest: what it says of the arm is all there is to compare
        def view(m):
            return flatten({k: v for k, v in manifest_arm(m).items() if k not in ARM_FIELDS_NOT_COMPARED})
        diffs = classify(view(first.manifest), view(other.manifest), ())
    return [(d.path, d.a, d.b) for d in diffs if d.path not in POOLED_MAY_DIFFER]


def _refuse_unlike_pool(group: str, first, other) -> None:
    # Runs of one name are summarised as one arm: an R/R run pooled with a P/P run would make a
    # group that is neither. Bare logs cannot be checked; the verdict names them instead.

    if first.manifest is None or other.manifest is None:
        return
    diffs = pooled_differences(first, other)
    if not diffs:
        return
    shown = ", ".join(f"{p} ({_short(a)} vs {_short(b)})" for p, a, b in diffs[:6]) + \
        (f" and {len(diffs) - 6} more" if len(diffs) > 6 else "")
    raise BadInput(f"group {group!r} pools {first.run_dir or first.log_path} and {other.run_dir or other.log_path}, "
                   f"which differ in {shown}; runs under one name must be the same arm apart from "
                   f"{' and '.join(POOLED_MAY_DIFFER)} (give them different --name values)")


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _one_per_group(arms):
    out, names = [], set()
    for a in arms:
        if a.name not in names:
            names.add(a.name)
            out.append(a)
    return out


